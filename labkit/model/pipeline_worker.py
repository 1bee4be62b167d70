"""One rank of a live Megatron-style pipeline on CPU: its model chunks, megatron-core's order, real gloo P2P.

Each rank holds the chunks of its pipeline stage (``labkit.model.pipeline_model``) and runs one training
``forward_backward`` over its DP rank's micro-batches in the order megatron-core's schedule gives its stage
(``labkit.plan.pipeline_schedule``: 1F1B, or interleaved 1F1B when VPP > 1), as
``megatron/core/pipeline_parallel/schedules.py: forward_backward_pipelining_without_interleaving`` /
``..._with_interleaving`` would on GPUs: a forward receives its input activation from the previous virtual stage and
sends its output to the next; a backward receives the output's gradient and sends its input's gradient back; the
last virtual stage computes the loss (divided by the micro-batch count). Sends are non-blocking (``isend``, waited at
the end: gloo's send waits for its receive, as NCCL's does, so blocking sends in schedule order would deadlock where
megatron-core pairs them); receives wait at most the collective timeout. Then the gradients are averaged over the
DP group and the grad norm summed over the pipeline group (``megatron/core/distributed``,
``megatron/core/optimizer/clip_grads.py``). With ``ep`` > 1 each micro-batch's forward and backward also join a
stand-in of the MoE token all-to-all in the expert group (which spans DP ranks), the collective a DP rank with one
micro-batch more hangs in.

The rank records every action (kind, micro-batch, chunk, start, end, time waiting for its input, saved activation
bytes and micro-batches alive after it) and never raises: a timeout or a verl assert comes back as its record.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as tdist

from labkit.model.pipeline_model import SavedActivations, pipeline_chunks
from labkit.model.tiny_model import TINY_CONFIG
from labkit.plan.micro_batches import vpp_message
from labkit.plan.pipeline_schedule import pipeline_schedule
from labkit.rules.megatron_ranks import megatron_ranks
from labkit.rules.parallel_layout import MEGATRON, ParallelLayout
from labkit.runtime import dist, process_group
from labkit.runtime.worker import Dispatch, Worker, register

STAGE = "update_actor"
EP_NAME = "all_to_all(ep):tokens"


def pipeline_layout(pp: int, vpp: int | None = None, dp: int = 1, ep: int = 1) -> ParallelLayout:
    """The Megatron layout of a live pipeline on W = PP·DP CPU ranks (TP = CP = 1)."""
    return ParallelLayout(MEGATRON, pp * dp, pp=pp, vpp=vpp, ep=ep)


def micro_batch_ids(seed: int, dp_rank: int, mb: int, rows: int, seq_len: int) -> torch.Tensor:
    """The token ids of DP rank ``dp_rank``'s micro-batch ``mb`` (the first and the last stage draw the same)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + dp_rank * 1009 + mb)
    return torch.randint(0, TINY_CONFIG["vocab_size"], (rows, seq_len), generator=gen)


def _tag(kind: int, mb: int, chunk: int) -> int:
    return (kind * 100_000 + mb) * 100 + chunk


class PipelineWorker(Worker):
    """A rank of the live pipeline lab; ``train_step`` builds its groups from the layout it is given."""

    def __init__(self) -> None:
        super().__init__()
        self._groups: dict[tuple, Any] = {}  # (kind, *ranks) -> process group

    def _group(self, kind: str, ranks: list[int]) -> Any:
        """The process group of ``kind`` over ``ranks`` (made once; every rank must ask for it, in the same order),
        with the short collective timeout where this rank belongs to it. Kinds never share a group, even over the
        same ranks (megatron-core builds one communicator per kind: DP and EP here pair collectives separately)."""
        key = (kind, *ranks)
        if key not in self._groups:
            self._groups[key] = tdist.new_group(list(ranks))
            if self.rank in ranks:
                state = process_group.state()
                timeout = state.timeout_s if state else process_group.DEFAULT_COLLECTIVE_TIMEOUT_S
                process_group.set_group_timeout(self._groups[key], timeout)
        return self._groups[key]

    def _build_groups(self, layout: ParallelLayout) -> dict[str, Any]:
        """Every rank creates every group of every kind in the same order (new_group is collective); keeps its own."""
        ranks = megatron_ranks(layout)
        mine: dict[str, Any] = {}
        kinds = [("pp", ranks.groups("pp")), ("dp", ranks.groups("dp"))]
        if layout.ep > 1:
            kinds.append(("ep", ranks.expert_groups("ep")))
        for kind, groups in kinds:
            for g in groups.tolist():
                group = self._group(kind, g) if len(g) > 1 else None
                if self.rank in g:
                    mine[kind] = (group, g)
        return mine

    @register(Dispatch.ONE_TO_ALL)
    def train_step(self, spec: dict[str, Any]) -> dict[str, Any]:
        """One training forward_backward of this rank's stage, then the DP gradient reduce. ``spec``: pp, vpp, dp,
        ep, num_layers, rows, seq_len, micro_batches (one count per DP rank), group_size (G), seed."""
        t0, since, before = time.time(), dist.log_length(), dist.collective_counts()
        pp, vpp, dp, ep = spec["pp"], spec.get("vpp"), spec.get("dp", 1), spec.get("ep", 1)
        layout = pipeline_layout(pp, vpp, dp, ep)
        coords = megatron_ranks(layout).rank_summary(self.rank)
        stage, dp_rank = int(coords["pp"]), int(coords["dp"])
        m = int(spec["micro_batches"][dp_rank])
        label = f"{STAGE} (pipeline stage {stage})"
        out: dict[str, Any] = {"rank": self.rank, "stage": label, "pp_stage": stage, "dp_rank": dp_rank}
        out |= {"micro_batches": m, "outcome": "ok", "error": None, "report": None, "actions": [], "loss": None}
        try:
            groups = self._build_groups(layout)
            with dist.where(label):
                self._run(spec, layout, stage, dp_rank, m, groups, out)
        except dist.CollectiveTimeout as exc:
            out.update(outcome="timeout", error=str(exc), report=exc.report)
        except (AssertionError, ValueError) as exc:
            out.update(outcome="raised", error=f"{type(exc).__name__}: {exc}")
            with dist.where(label):
                dist.note("raised", "raised", time.time())
        after = dist.collective_counts()
        out["counts"] = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        out["elapsed_s"], out["t0"] = time.time() - t0, t0
        out["log"] = dist.collective_log(since)
        return out

    def _run(
        self,
        spec: dict[str, Any],
        layout: ParallelLayout,
        stage: int,
        dp_rank: int,
        m: int,
        groups: dict[str, Any],
        out: dict[str, Any],
    ) -> None:
        g = spec.get("group_size") or layout.pp
        if layout.vpp and layout.vpp > 1 and m % g:  # verl's prepare_micro_batches, before megatron-core's schedule
            raise AssertionError(vpp_message(m, g))
        actions = pipeline_schedule(layout.pp, layout.vpp, m, spec.get("group_size")).stages[stage].actions
        run = _StageRun(spec, layout, stage, dp_rank, m, groups)
        for kind, mb, c in actions:
            t_start = time.time()
            with dist.where(None, mb):
                waited, t_compute = run.forward(mb, c) if kind == "F" else run.backward(mb, c)
            out["actions"].append(
                {"kind": kind, "mb": mb, "chunk": c, "t_start": t_start, "t_compute": t_compute, "t_end": time.time(),
                 "wait_s": waited, "live_bytes": run.meter.live, "in_flight": run.meter.in_flight}
            )  # fmt: skip
        with dist.where(None, None):
            out["grad_norm"] = run.finish()
        last = stage == (run.virtual_stages - 1) % layout.pp
        out.update(peak_bytes=run.meter.peak, end_bytes=run.meter.live, loss=run.loss if last else None)


class _StageRun:
    """One stage's chunks and P2P state during one ``forward_backward``: forwards and backwards in the order given,
    then the DP gradient average and the grad norm."""

    def __init__(
        self, spec: dict[str, Any], layout: ParallelLayout, stage: int, dp_rank: int, m: int, groups: dict[str, Any]
    ) -> None:
        self.spec, self.layout, self.stage, self.dp_rank, self.m = spec, layout, stage, dp_rank, m
        self.chunks = pipeline_chunks(spec["num_layers"], layout.pp, layout.vpp, stage)
        self.params = [p for c in self.chunks for p in c.parameters()]
        self.meter = SavedActivations(self.params)
        self.virtual_stages = layout.pp * (layout.vpp or 1)
        self.pp_group, ranks = groups["pp"]
        self.prev, self.next = ranks[(stage - 1) % layout.pp], ranks[(stage + 1) % layout.pp]
        self.dp_group, self.dp_ranks = groups["dp"]
        self.ep_group = groups.get("ep", (None, None))[0]
        state = process_group.state()
        self.wait = datetime.timedelta(seconds=state.timeout_s if state else process_group.DEFAULT_COLLECTIVE_TIMEOUT_S)
        self.pending: list[tuple[Any, torch.Tensor, str]] = []  # isend works, their tensors, their names
        self.saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}  # (mb, chunk) -> (in, out)
        self.loss = 0.0

    def _ids(self, mb: int) -> torch.Tensor:
        return micro_batch_ids(self.spec.get("seed", 0), self.dp_rank, mb, self.spec["rows"], self.spec["seq_len"])

    def _recv(self, name: str, src: int, tag: int) -> tuple[torch.Tensor, float]:
        buf = torch.empty(self.spec["rows"], self.spec["seq_len"], TINY_CONFIG["hidden_size"])
        t = time.time()
        with dist.guarded(name, self.pp_group):
            tdist.irecv(buf, src, tag=tag).wait(self.wait)
        return buf, time.time() - t

    def _expert_exchange(self, name: str) -> None:
        """The stand-in of a MoE layer's token all-to-all (one per pass of a micro-batch) in the expert group."""
        if self.ep_group is not None:
            n = self.layout.ep
            with dist.guarded(name, self.ep_group):
                tdist.all_to_all_single(torch.empty(n), torch.ones(n), group=self.ep_group, async_op=True).wait(
                    self.wait
                )

    def forward(self, mb: int, c: int) -> tuple[float, float]:
        """Chunk c's forward of micro-batch mb: receive (or embed), run under the meter, send on (or take the loss).
        Returns (seconds waited for the input, when the compute started)."""
        v, waited = c * self.layout.pp + self.stage, 0.0
        last = v == self.virtual_stages - 1
        if v == 0:
            x = self._ids(mb)
        else:
            x, waited = self._recv("recv(pp):activation", self.prev, _tag(0, mb, c))
            x.requires_grad_(True)
        t_compute = time.time()
        with self.meter.record((mb, c)):
            y = self.chunks[c](x, self._ids(mb) if last else None)
        self._expert_exchange(EP_NAME)
        if last:
            y = y / self.m  # megatron-core divides each micro-batch's loss by the count
            self.loss += float(y.detach())
        else:  # the next virtual stage: chunk c on the next stage, or chunk c + 1 on stage 0
            tag = _tag(0, mb, c + (self.stage == self.layout.pp - 1))
            self.pending.append((tdist.isend(y.detach(), self.next, tag=tag), y, "send(pp):activation"))
        self.saved[(mb, c)] = (x if v else None, y)
        return waited, t_compute

    def backward(self, mb: int, c: int) -> tuple[float, float]:
        """Chunk c's backward of micro-batch mb: receive the output's gradient (none after the loss), backward, send
        the input's gradient to the previous virtual stage. Returns (seconds waited, when the compute started)."""
        v, waited, grad = c * self.layout.pp + self.stage, 0.0, None
        x, y = self.saved.pop((mb, c))
        if v != self.virtual_stages - 1:
            grad, waited = self._recv("recv(pp):grad", self.next, _tag(1, mb, c))
        t_compute = time.time()
        torch.autograd.backward(y, grad)
        self._expert_exchange(EP_NAME + ":backward")
        if v:
            tag = _tag(1, mb, c - (self.stage == 0))
            self.pending.append((tdist.isend(x.grad, self.prev, tag=tag), x.grad, "send(pp):grad"))
        return waited, t_compute

    def finish(self) -> float:
        """Wait for every send, average the gradients over DP, sum the squared norm over the pipeline; the norm."""
        for work, _, name in self.pending:
            with dist.guarded(name, self.pp_group):
                work.wait(self.wait)
        self.pending.clear()
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        if len(self.dp_ranks) > 1:
            dist.all_reduce(flat, "avg", self.dp_group, name="all_reduce(dp_cp):grads")
        sq = flat.double().pow(2).sum().reshape(1)
        dist.all_reduce(sq, "sum", self.pp_group, name="all_reduce(sum):grad_norm")
        return float(sq.sqrt())
