"""A live rollout next to its prediction: config -> worker group of RolloutWorkers -> generate -> (output, trace).

``LiveRollout`` keeps one group open for several runs (a notebook); ``run_rollout`` is the one-shot form that always
closes the group. ``predict`` asks the planner (``labkit.plan.step``) for the same config; ``returned`` turns either trace
into "what reached the driver", so ``labkit.trace.compare`` checks both halves of a dispatch: received and returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from labkit.config.verl_config import VerlConfig
from labkit.plan.step import plan
from labkit.protocol.data_proto import DataProto
from labkit.rl import rollout
from labkit.runtime.worker_group import WorkerGroup
from labkit.trace import RankRecord, StageRecord, StepTrace
from labkit.trainer import engine_setup
from labkit.trainer.live_config import rollout_config, sizes
from labkit.trainer.step_metrics import _Progress

RETURNED = "generate:returned"


def predict(cfg: VerlConfig, batch: DataProto, dispatch: str = "mesh") -> StepTrace:
    """The planner's trace for ``cfg``, fed with the prompt tokens each repeated row carries (what generate
    receives: the live trace counts sum(attention_mask) of the rows a rank computes on)."""
    s = sizes(cfg)
    if len(batch) != s.geo.prompts:
        raise ValueError(f"batch has {len(batch)} prompts but the config's train batch size is {s.geo.prompts}")
    lengths = rollout.repeat_for_rollout(batch, s.geo.rollout_n).batch["attention_mask"].sum(dim=1).tolist()
    return plan(cfg, lengths=lengths, dispatch=dispatch)


def returned(trace: StepTrace, lengths: Sequence[int] | None = None, stage: str = "generate") -> StepTrace:
    """Per rank, the rows and tokens that reached the driver (0 for a rank whose output is not collected).

    Live trace: from each rank's recorded output. Plan: the rows the planner says come back (nd dispatch: the
    group's rows from tp_rank 0; all-gather: the rank's own rows), with tokens summed over ``lengths`` (B·n
    prompt+response lengths, e.g. the live output's attention_mask sums)."""
    out = StepTrace(profile=trace.profile, source=trace.source)
    for r in trace.at(stage):
        x = r.extra
        if trace.source == "plan":
            keep = bool(x.get("is_collect")) or "own_row_range" in x
            lo, hi = x["own_row_range"] if "own_row_range" in x else x["row_range"]
            rows = x["rows_out"] if keep else 0
            tokens = (sum(lengths[lo:hi]) if keep else 0) if lengths is not None else None
        else:
            keep = bool(x.get("collected"))
            rows, tokens = (x["out_rows"], x["out_tokens"]) if keep else (0, 0)
        out.ranks.append(RankRecord(RETURNED, r.rank, dp_rank=r.dp_rank, tp_rank=r.tp_rank, rows=rows, tokens=tokens))
    out.stages.append(StageRecord(RETURNED, "returned to the driver", sum(r.rows for r in out.ranks)))
    return out


def generate_stage_ok(pred: StepTrace, obs: StepTrace, out: DataProto) -> list[str]:
    """Every disagreement between prediction and observation, received and returned (empty list: they agree)."""
    from labkit.trace import compare

    fields = ("rows", "tokens", "dp_rank", "tp_rank")
    bad = [str(m) for m in compare(pred, obs, stages=["generate"], fields=fields)]
    full = out.batch["attention_mask"].sum(dim=1).tolist()
    bad += [str(m) for m in compare(returned(pred, full), returned(obs), stages=[RETURNED], fields=fields)]
    return bad


class LiveRollout:
    """A worker group of W RolloutWorkers for one config (one engine per rollout TP group), kept open for several runs."""

    def __init__(
        self,
        cfg: VerlConfig | Sequence[str] | None = None,
        *,
        launcher: str = "auto",
        model_path: str | None = None,
        timeout_s: float = 300.0,
        collective_timeout_s: float = 60.0,
        progress: bool = True,
        on_stage: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = rollout_config(cfg)
        self.sizes = s = sizes(self.cfg)
        self.timings: dict[str, float] = {}
        self._tokenizer: Any = None
        self.progress, self.on_stage = progress, on_stage
        bar = _Progress(2, "rollout start-up", progress, on_stage)
        bar.stage(f"starting {s.geo.world_size} ranks ({launcher})")
        t0 = time.perf_counter()
        try:
            self._start(launcher, model_path, timeout_s, collective_timeout_s, bar, t0)
        finally:
            bar.close()

    def _start(
        self, launcher: str, model_path: str | None, timeout_s: float, collective_timeout_s: float, bar: Any, t0: float
    ) -> None:
        s = self.sizes
        kwargs = engine_setup.rollout_kwargs(self.cfg, model_path)
        self.engine = kwargs["name"]  # the engine that runs (vllm falls back to hf where it is not installed)
        self.wg = WorkerGroup(
            rollout.RolloutWorker,
            s.geo.world_size,
            launcher=launcher,
            timeout_s=timeout_s,
            collective_timeout_s=collective_timeout_s,
            profile=self.cfg.profile,
            init_kwargs=kwargs,
            env=engine_setup.rank_env(self.engine),
        )
        self.timings["group_up_s"] = time.perf_counter() - t0
        bar.advance()
        bar.stage(f"init_model: load the model, shard it over TP {s.geo.rollout_tp}")
        try:
            t0 = time.perf_counter()
            self.info = self.wg.init_model()
            self.timings["init_model_s"] = time.perf_counter() - t0
        except BaseException:
            self.wg.close()
            raise
        bar.advance()
        self.wg.reset_trace()

    def __enter__(self) -> LiveRollout:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def tp_groups(self) -> list[list[int]]:
        """The TP groups the ranks really built (each rank's infer_tp group), in order."""
        return [list(g) for g in sorted({tuple(i["tp_group"]) for i in self.info})]

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = rollout.load_tokenizer()
        return self._tokenizer

    def batch(self, seed: int = 0) -> DataProto:
        """The dataloader batch of B prompts for this config (uid per prompt, left-padded to prompt_length)."""
        return rollout.make_gen_batch(self.sizes.geo.prompts, seed, self.sizes.geo.prompt_length, self.tokenizer)

    def predict(self, batch: DataProto, dispatch: str = "mesh") -> StepTrace:
        return predict(self.cfg, batch, dispatch)

    def run(
        self,
        batch: DataProto | None = None,
        *,
        dispatch: str = "mesh",
        seed: int = 0,
        do_sample: bool | None = None,
        temperature: float | None = None,
        ignore_eos: bool = False,
    ) -> tuple[DataProto, StepTrace]:
        """One rollout: repeat n (interleaved), dispatch, generate, collect; returns (output, the call's live trace)."""
        s = self.sizes
        batch = batch if batch is not None else self.batch(seed)
        self.wg.reset_trace()
        bar = _Progress(1, "rollout", self.progress, self.on_stage)
        bar.stage(f"dispatch ({dispatch}) and generate {len(batch)}·{s.geo.rollout_n} rows")
        t0 = time.perf_counter()
        try:
            out = self._generate(batch, dispatch, seed, do_sample, temperature, ignore_eos)
            bar.advance()
        finally:
            bar.close()
        elapsed = time.perf_counter() - t0
        trace = self.wg.reset_trace()
        trace.stages[:0] = [
            StageRecord("dataloader", "dataloader batch", len(batch), "prompts"),
            StageRecord(
                "repeat",
                "repeat for generation",
                len(batch) * s.geo.rollout_n,
                "samples",
                formula=f"B·n = {len(batch)}·{s.geo.rollout_n} (interleaved)",
            ),
        ]
        trace.summary.update(
            sizes=s.as_dict(),
            dispatch=dispatch,
            seed=seed,
            generate_s=elapsed,
            tp_groups=self.tp_groups,
            engine=self.engine,
            weights=self.info[0]["weights"],
            **self.timings,
        )
        return out, trace

    def _generate(
        self,
        batch: DataProto,
        dispatch: str,
        seed: int,
        do_sample: bool | None,
        temperature: float | None,
        ignore_eos: bool,
    ) -> DataProto:
        s = self.sizes
        return rollout.generate(
            self.wg,
            batch,
            s.geo.rollout_n,
            dispatch=dispatch,
            seed=seed,
            do_sample=s.do_sample if do_sample is None else do_sample,
            temperature=s.temperature if temperature is None else temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            response_length=s.geo.response_length,
            ignore_eos=ignore_eos,
        )

    def close(self) -> dict[str, Any]:
        """Close the group; reports the rank processes still alive (must be none) and each rank's teardown."""
        t0, was_open = time.perf_counter(), not self.wg.closed
        teardown = self.wg.close()
        if was_open:
            self.timings["close_s"] = time.perf_counter() - t0
        return {"left_pids": self.wg.alive_pids(), "teardown": teardown}


def run_rollout(
    cfg: VerlConfig | Sequence[str] | None = None,
    dispatch: str = "mesh",
    launcher: str = "auto",
    seed: int = 0,
    **run_kwargs: Any,
) -> tuple[DataProto, StepTrace]:
    """Start a group for ``cfg``, run one rollout, close the group (always); the trace's summary says what was left."""
    with LiveRollout(cfg, launcher=launcher) as live:
        out, trace = live.run(dispatch=dispatch, seed=seed, **run_kwargs)
        report = live.close()
    trace.summary.update(cleanup=report, **live.timings)
    return out, trace


def hold_ray(num_cpus: int = 4) -> bool:
    """Start Ray once for several groups (True when this call started it); no-op where Ray is not installed."""
    from labkit.runtime.ray_init import ray_available
    from labkit.runtime.ray_launcher import start_ray

    return start_ray(num_cpus) if ray_available() else False


def release_ray(owned: bool) -> bool:
    """Stop Ray if ``hold_ray`` started it; True when no Ray session that labkit started is left up."""
    from labkit.runtime.ray_init import import_ray
    from labkit.runtime.ray_launcher import stop_ray

    if not owned:
        return True
    stop_ray()
    return not import_ray().is_initialized()
