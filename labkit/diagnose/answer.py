"""``labkit diagnose``'s answer: what the log says (config, failure, phase, metrics) and what labkit makes of it.

Every answer opens with the three lines verl's issue triage asks for (``labkit.diagnose.opening``): GPU or host
memory, the phase, the config, each citing its line. Kinds, most telling first: an allocation failure (``oom``)
outranks verl's own message (``verl_error``), which outranks Ray's host-memory kill (``host_oom``) and NCCL timeouts
(``hang``, often the echo of another rank's failure); a dead worker without a cause is ``unknown``. Exit 0 when
labkit explains the failure, 1 when it reads it but has no explanation, 2 when it reads nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from labkit.diagnose import gpu_share, oom_answer, run_failures
from labkit.diagnose.answer_parts import config_notes, offload, predict, report_for, verl_error
from labkit.diagnose.log_config import RecoveredConfig, build_config, recover_config
from labkit.diagnose.log_failures import (
    AllocationFailure,
    allocation_failures,
    host_oom,
    lab_ranks,
    nccl_timeouts,
    verl_messages,
    worker_died,
)
from labkit.diagnose.log_lines import LogLine, log_lines
from labkit.diagnose.log_memory import measurement_lines, memory_measurements
from labkit.diagnose.log_metrics import SHOWN, last_metrics
from labkit.diagnose.log_phase import PhaseReading, failing_frame, phase_near
from labkit.diagnose.log_startup import STAGES, StartupStage, startup_stage
from labkit.diagnose.oom_match import phase_tensors
from labkit.diagnose.opening import config_line, memory_line, phase_line
from labkit.rules.run import Run, as_run

OTHER_ERROR = re.compile(r"(?:^|[\s(])(?:[\w.]+\.)?(?P<exc>\w+(?:Error|Exception))(?:\)|: |$)")
"""An exception that is neither an allocation failure, verl's own message nor a dead worker (a RuntimeError raised
in megatron-core, SGLang's scheduler, ...): named in the answer, never taken for one of labkit's kinds."""
NOT_OTHER = {"OutOfMemoryError", "ActorDiedError", "RayActorError", "RayTaskError", "Exception"}
WRAPPED = re.compile(r"RayTaskError\(OutOfMemoryError\)|^(?:torch\.(?:cuda\.)?)?OutOfMemoryError\s*$")
MEGATRON = {
    "pipeline_parallel/schedules.py": "megatron-core's pipeline schedule (the micro-batches' forward and backward)",
    "optimizer/": "megatron-core's optimizer step",
    "distributed/": "megatron-core's gradient buffers and their reduce-scatter",
    "tensor_parallel/": "megatron-core's tensor-parallel layers",
    "dist_checkpointing/": "megatron-core's distributed checkpointing",
}


@dataclass
class Diagnosis:
    """The answer: ``kind`` oom | hang | verl_error | host_oom | unknown | unreadable, labkit's ``phase`` name
    (``init`` for start-up, with ``facts["startup"]`` its step), the catalogue ``code``, the ``overrides``
    recovered, the ``model`` priced, the answer's ``lines`` (the first three: memory kind, phase, config) and
    whether labkit ``explained`` the failure."""

    kind: str
    phase: str | None = None
    code: str | None = None
    overrides: list[str] = field(default_factory=list)
    model: str | None = None
    profile: str = "engine"
    lines: list[str] = field(default_factory=list)
    explained: bool = False
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 2 if self.kind == "unreadable" else 0 if self.explained else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "phase": self.phase,
            "code": self.code,
            "overrides": self.overrides,
            "model": self.model,
            "profile": self.profile,
            "explained": self.explained,
            "answer": self.lines,
            **self.facts,
        }

    def text(self) -> str:
        """The answer as printed: the three opening lines (memory, phase, config), the verdict, the rest."""
        head = f"{self.kind}" + (f" in {self.phase}" if self.phase else "") + (f" ({self.code})" if self.code else "")
        return "\n".join([*self.lines[:3], f"diagnosis: {head}", *self.lines[3:]])


def _oom(d: Diagnosis, a: AllocationFailure, cfg: Run | None, model: str | None) -> None:
    d.kind = "oom"
    d.facts["allocation"] = {k: v for k, v in vars(a).items() if v is not None and v != []}
    d.lines += oom_answer.figures(a)
    held, why_lines = gpu_share.verdict(a)
    if held:
        d.facts["held_by"] = held
        h = gpu_share.holders(a)
        d.facts["other_processes"] = [{"pid": p, "bytes": b} for p, b in h.others]
    if a.device in ("engine-start", "kv-cache"):  # the rollout engine's own start-up checks: generate's share
        d.phase = "generate"
    priced = a.device in ("cuda", "engine-start", "kv-cache")
    rep, d.model, why = report_for(cfg, model, a.capacity) if priced else (None, None, "")
    phase = d.phase
    if rep is not None and a.device == "kv-cache" and not rep.phases["generate"].info.get("engine_error"):
        d.lines.append(oom_answer.pool_not_explained(rep, a))
        rep = None  # labkit's engine has a pool here: its fixes for another failure would mislead
    elif rep is not None and a.capacity is None:
        d.lines.append(f"priced on {rep.settings.gpu_bytes / 2**30:,.2f} GiB GPUs: the log names no capacity (assumed)")
    if rep is not None and phase in rep.phases:
        tensors = phase_tensors(rep.settings, phase, rep.phases[phase])
        found, matched = oom_answer.tensor_lines(
            a, tensors, rep.settings.model.vocab_size, d.facts.get("failed_in", "")
        )
        lines, fixes, predicted = oom_answer.prediction(rep, phase, a)
        d.lines += found + lines
        d.facts["predicted_peak_bytes"] = rep.phases[phase].peak_bytes
        d.facts["fixes"] = fixes
        d.explained = matched or predicted
    else:
        found, _ = oom_answer.tensor_lines(a, [], None, d.facts.get("failed_in", ""))
        d.lines += found
        if why and cfg is not None:
            d.lines.append(f"labkit cannot price this config: {why}")
        elif phase is None:
            d.lines.append("the traceback names no phase labkit knows, so labkit does not price one")
    d.lines += why_lines
    if held == "shared":
        d.explained = True
    if a.device == "kv-cache":
        d.lines.append(
            "the engine's share u·C (gpu_memory_utilization × capacity) did not cover its weights and activations "
            "(SGLang: and what the GPU already held): raise rollout.gpu_memory_utilization or "
            "rollout.tensor_model_parallel_size, or offload the training side (labkit memory prices each)"
        )
        d.explained = True


def _phase(d: Diagnosis, lines: list[LogLine], at: int | None, hangs: list) -> tuple[PhaseReading, StartupStage | None]:
    """The phase reading around the failure, start-up's step when the failure came at the start."""
    if at is None:
        return PhaseReading(None, []), None
    reading = phase_near(lines, at)
    stage = startup_stage(lines, at, hangs) if reading.phase in (None, "init") else None
    if reading.phase == "init" and stage is None:
        build = {"_build_rollout", "_init_model_runner", "init_model_worker"} & set(reading.names)
        step = "rollout engine build" if build else "model init"
        stage = StartupStage(step, reading.line, "")
    if stage is not None:
        reading = PhaseReading("init", reading.names, stage.line or reading.line, how=f"start-up: {stage.stage}")
        d.facts["startup"] = stage.stage
    inner = failing_frame(lines, at)
    if inner:
        d.facts["failed_in"] = inner[0]
        d.facts["raised_in"] = inner[1]
    d.phase = reading.phase
    return reading, stage


def _phase_detail(reading: PhaseReading, d: Diagnosis) -> str:
    parts = []
    if reading.how != "frames":
        parts.append(reading.how)
    if reading.names:
        parts.append("names: " + ", ".join(reading.names))
    where = d.facts.get("raised_in", "")
    if d.facts.get("failed_in"):
        meaning = next((v for k, v in MEGATRON.items() if "megatron/core/" + k in where), "")
        parts.append(f"raised in {d.facts['failed_in']} ({where})" + (f": {meaning}" if meaning else ""))
    return "; ".join(parts)


def _other_error(lines: list[LogLine]) -> tuple[int, str] | None:
    """The first exception of another kind in the log (its line, its name), or None."""
    for line in lines:
        m = OTHER_ERROR.search(line.text)
        if m and m.group("exc") not in NOT_OTHER and not line.text.lstrip().startswith(("File ", "raise ")):
            return line.number, m.group("exc")
    return None


def _startup_seen(lines: list[LogLine]) -> bool:
    return any(p.search(line.text) for _, p, _ in STAGES for line in lines)


def diagnose_text(
    text: str, model: str | None = None, profile: str | None = None, overrides: list[str] | None = None
) -> Diagnosis:
    """Read a verl log and answer it; ``model`` replaces the model the config names, ``profile`` the one the
    frames show (engine when neither says), ``overrides`` (a launch script's) the config when the log has none."""
    lines: list[LogLine] = log_lines(text)
    rec = recover_config(lines)
    if not rec.source and overrides is not None:
        rec = RecoveredConfig("the launch script (--config)", list(overrides), rec.profile, rec.notes)
    use = profile or rec.profile or "engine"
    cfg, skipped = build_config(rec.overrides, use) if rec.source else (None, [])
    run = as_run(cfg) if cfg is not None else None  # the recovered config, resolved once for every part below
    d = Diagnosis("unknown", overrides=rec.overrides, profile=use)
    failures = allocation_failures(lines)
    if not failures:
        failures = [AllocationFailure("wrapped", x.number) for x in lines if WRAPPED.search(x.text.strip())][:1]
    messages = verl_messages(lines)
    host, hangs, died, lab = host_oom(lines), nccl_timeouts(lines), worker_died(lines), lab_ranks(lines)
    at = failures[0].line if failures else messages[0].line if messages else host.line if host else None
    at = at if at is not None else hangs[0].line if hangs else died
    frames = [line.number for line in lines if 'File "' in line.text and ", line " in line.text]
    other = _other_error(lines) if at is None else None
    if at is None and other is not None:
        at = other[0]
    if at is None and frames:  # a traceback whose error line is not in the paste: its frames still name the phase
        at = frames[-1]
    measured = memory_measurements(lines)
    if at is None and measured:  # only verl's memory log: the call it saw begin and not end
        reading, stage = phase_near(lines, measured[-1].line + 10**6), None
        d.phase = reading.phase
    else:
        reading, stage = _phase(d, lines, at, hangs)
    body: list[str] = []
    d.lines = body
    if failures:
        _oom(d, failures[0], run, model)
    elif messages:
        verl_error(d, messages[0].code, messages[0].text, run)
    elif host is not None:
        d.kind = "host_oom"
        body += run_failures.host_lines(host, offload(run, model))
        d.explained = True
    elif hangs:
        d.kind = "hang"
        d.facts["nccl"] = [vars(t) for t in hangs]
        body += run_failures.hang_lines(hangs, run.n_gpus if run is not None else None)
        d.explained = len({(t.group, t.seq) for t in hangs}) > 1
    elif lab:
        d.kind, d.phase = "hang", next((r.stage for r in lab if r.outcome == "waited"), lab[0].stage)
        reading = PhaseReading(d.phase, [], None, how="labkit's own hang report")
        more, d.explained = run_failures.lab_lines(lab)
        body += ["labkit's own hang report (a live group's collective timeout):", *more]
    elif died is not None:
        body += run_failures.died_lines()
    elif other is not None:
        body.append(
            f"the failure: a {other[1]} (line {other[0]}), not an allocation failure, not a dead worker, and no "
            "message of verl's that labkit's catalogue knows: its text (the lines after it) says what failed"
        )
    elif frames:
        body.append("a traceback whose last line (the error itself) is not in the paste: paste the end of it")
    elif not rec.source and not last_metrics(lines) and not measured and not _startup_seen(lines):
        d.kind = "unreadable"
        body.append("labkit found no failure it reads (CUDA OOM, NCCL timeout, verl's messages, Ray's kills)")
    else:
        body.append("labkit found no failure in this log (it reads CUDA OOM, NCCL timeout, verl's messages, Ray)")
    if stage is not None and stage.cause:
        body.append(f"start-up, {stage.stage}: what usually fails here: {stage.cause}")
    if d.kind in ("unknown", "hang") and run is not None:
        predict(d, run)
    metrics = last_metrics(lines)
    if metrics:
        shown = {k: v for k, v in metrics.items() if k in SHOWN}
        d.facts["metrics"] = shown
        body.append(
            f"last metrics (step {int(metrics.get('step', 0))}): "
            + (", ".join(f"{k} {v:g}" for k, v in shown.items()) or "none of the memory or length ones")
        )
    if measured:
        d.facts["memory_log"] = [vars(m) for m in measured]
        peak = d.facts.get("predicted_peak_bytes")
        body += measurement_lines(measured, peak / 2**30 if peak else None, d.phase)
    device = failures[0].device if failures else None
    config_at = re.search(r"line (\d+)", rec.source)
    what = ""
    if d.kind == "unknown" and died is None:
        what = f"a {other[1]}, no memory failure" if other else "the paste ends before the error line" if frames else ""
    d.lines = [
        memory_line(d.kind, device, at, lines, what),
        phase_line(d.phase, _phase_detail(reading, d), reading.line, lines),
        config_line(rec.source, len(rec.overrides), int(config_at.group(1)) if config_at else None, lines),
        *config_notes(rec, use, skipped),
        *body,
    ]
    return d
