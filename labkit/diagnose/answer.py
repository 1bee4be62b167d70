"""``labkit diagnose``'s answer: what the log says (config, failure, phase, metrics) and what labkit makes of it.

Kinds, most telling first: an allocation failure (``oom``) outranks verl's own message (``verl_error``), which
outranks Ray's host-memory kill (``host_oom``) and NCCL timeouts (``hang``, often the echo of another rank's
failure); a dead worker without a cause is ``unknown``. Exit 0 when labkit explains the failure, 1 when it reads it
but has no explanation, 2 when it reads nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.config.verl_config import ConfigError, VerlConfig
from labkit.diagnose import oom_answer, run_failures
from labkit.diagnose.log_config import RecoveredConfig, build_config, recover_config
from labkit.diagnose.log_failures import (
    AllocationFailure,
    allocation_failure,
    host_oom,
    lab_ranks,
    nccl_timeouts,
    verl_messages,
    worker_died,
)
from labkit.diagnose.log_lines import LogLine, log_lines
from labkit.diagnose.log_metrics import SHOWN, last_metrics
from labkit.diagnose.log_phase import failing_frame, phase_near
from labkit.diagnose.oom_match import phase_tensors
from labkit.memory.choice import settings_for
from labkit.memory.verdict import memory_report
from labkit.rules.catalogue import entry, message_fields


@dataclass
class Diagnosis:
    """The answer: ``kind`` oom | hang | verl_error | host_oom | unknown | unreadable, labkit's ``phase`` name,
    the catalogue ``code``, the ``overrides`` recovered, the ``model`` priced, the answer's ``lines`` and whether
    labkit ``explained`` the failure."""

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
        head = f"{self.kind}" + (f" in {self.phase}" if self.phase else "") + (f" ({self.code})" if self.code else "")
        return "\n".join([f"diagnosis: {head}", *self.lines])


def _config_lines(rec: RecoveredConfig, profile: str, skipped: list[str]) -> list[str]:
    if not rec.source:
        return [
            "config: not in the log (verl prints it at start; Hydra lists the overrides when a job fails): "
            "paste the log from its start, or pass the launch script with --config",
            *rec.notes,
        ]
    how = "its frames" if rec.profile else "assumed (the frames do not say; --profile sets it)"
    lines = [f"config: {len(rec.overrides)} override(s) from {rec.source}; profile {profile}, {how}"]
    if skipped:
        lines.append(f"  {len(skipped)} override(s) labkit cannot apply, left out: " + "; ".join(skipped[:3]))
    return lines + rec.notes


def _report(cfg: VerlConfig | None, model: str | None, capacity: int | None) -> tuple[Any, str | None, str]:
    """labkit's memory report for the recovered config (None and why not, when it cannot be made)."""
    if cfg is None:
        return None, None, "no config recovered"
    try:
        s = settings_for(cfg, model, capacity=capacity)
    except ConfigError as exc:
        return None, None, str(exc)
    return memory_report(cfg, s), s.model.name, ""


def _oom(d: Diagnosis, a: AllocationFailure, cfg: VerlConfig | None, model: str | None) -> None:
    d.kind = "oom"
    d.facts["allocation"] = {k: v for k, v in vars(a).items() if v is not None}
    d.lines += oom_answer.figures(a)
    frag = oom_answer.fragmentation(a)
    rep, d.model, why = _report(cfg, model, a.capacity) if a.device == "cuda" else (None, None, "")
    phase = d.phase
    if rep is not None and phase in rep.phases:
        tensors = phase_tensors(rep.settings, phase, rep.phases[phase])
        found, matched = oom_answer.tensor_lines(
            a, tensors, rep.settings.model.vocab_size, d.facts.get("failed_in", "")
        )
        lines, fixes, predicted = oom_answer.prediction(cfg, rep, phase, a)
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
    if frag:
        d.lines.append(frag)
    if a.device == "kv-cache":
        d.phase = d.phase or "generate"
        d.lines.append(
            "the engine's share u·C (gpu_memory_utilization × capacity) did not cover its weights and activations: "
            "raise rollout.gpu_memory_utilization or rollout.tensor_model_parallel_size (labkit memory prices it)"
        )
        d.explained = True


def _verl_error(d: Diagnosis, code: str, text: str, cfg: VerlConfig | None) -> None:
    d.kind, d.code = "verl_error", code
    e = entry(code)
    d.lines.append(f"verl's {e.exc_type or 'error'} {code}: {e.title} ({e.where}, {e.when})")
    fields = message_fields(code, text)
    if fields:
        d.lines.append("  values in the message: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    d.lines.append(f"  why: {e.why}")
    d.explained = True
    if cfg is None:
        d.lines.append(
            f"  labkit explain {code} prints the entry; labkit check on the launch script shows the arithmetic"
        )
        return
    from labkit.validate.report import check

    first = check(cfg).first_error
    if first is not None and first.code == code:
        d.lines.append("  labkit's check of the recovered config raises the same: " + "; ".join(first.arithmetic))
        if first.fixes:
            d.lines.append("  fix: " + "  OR  ".join(first.fixes))
    else:
        got = f"{first.code} first" if first is not None else "no error"
        d.lines.append(f"  labkit's check of the recovered config finds {got}: the log's config may be incomplete")


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
    d = Diagnosis("unknown", overrides=rec.overrides, profile=use)
    d.lines += _config_lines(rec, use, skipped)
    metrics = last_metrics(lines)
    if metrics:
        shown = {k: v for k, v in metrics.items() if k in SHOWN}
        d.facts["metrics"] = shown
        d.lines.append(
            f"last metrics (step {int(metrics.get('step', 0))}): "
            + (", ".join(f"{k} {v:g}" for k, v in shown.items()) or "none of the memory or length ones")
        )
    failures = [f for f in (allocation_failure(line) for line in lines) if f is not None]
    messages = verl_messages(lines)
    host, hangs, died, lab = host_oom(lines), nccl_timeouts(lines), worker_died(lines), lab_ranks(lines)
    at = failures[0].line if failures else messages[0].line if messages else host.line if host else None
    at = at if at is not None else hangs[0].line if hangs else died
    frames = [line.number for line in lines if 'File "' in line.text and ", line " in line.text]
    if at is None and frames:  # a traceback whose error line is not in the paste: its frames still name the phase
        at = frames[-1]
    if at is not None:
        d.phase, names = phase_near(lines, at)
        inner = failing_frame(lines, at)
        if inner:
            d.facts["failed_in"] = inner[0]
        if names or inner:
            where = f"; raised in {inner[0]} ({inner[1]})" if inner else ""
            named = ", ".join(names) or "none of verl's phase methods"
            d.lines.append(f"phase: {d.phase or 'not named'} (frames: {named}{where})")
    if failures:
        _oom(d, failures[0], cfg, model)
    elif messages:
        _verl_error(d, messages[0].code, messages[0].text, cfg)
    elif host is not None:
        d.kind = "host_oom"
        d.lines += run_failures.host_lines(host, _offload(cfg, model))
        d.explained = True
    elif hangs:
        d.kind = "hang"
        d.facts["nccl"] = [vars(t) for t in hangs]
        d.lines += run_failures.hang_lines(hangs, cfg.n_gpus if cfg is not None else None)
        d.explained = len({(t.group, t.seq) for t in hangs}) > 1
    elif lab:
        d.kind, d.phase = "hang", next((r.stage for r in lab if r.outcome == "waited"), lab[0].stage)
        more, d.explained = run_failures.lab_lines(lab)
        d.lines += ["labkit's own hang report (a live group's collective timeout):", *more]
    elif died is not None:
        d.lines += run_failures.died_lines()
    elif frames:
        d.lines.append("a traceback whose last line (the error itself) is not in the paste: paste the end of it")
    elif not rec.source and not metrics:
        d.kind = "unreadable"
        d.lines.append("labkit found no failure it reads (CUDA OOM, NCCL timeout, verl's messages, Ray's kills)")
    else:
        d.lines.append("labkit found no failure in this log (it reads CUDA OOM, NCCL timeouts, verl's messages, Ray)")
    if d.kind in ("unknown", "hang") and cfg is not None:
        _predict(d, cfg)
    return d


def _predict(d: Diagnosis, cfg: VerlConfig) -> None:
    """A log without verl's message but with a config: what labkit's check says verl raises for it."""
    from labkit.validate.report import check

    first = check(cfg).first_error
    if first is None:
        d.lines.append("labkit's check of the recovered config: verl accepts it")
        return
    d.facts["predicted_code"] = first.code
    d.lines.append(
        f"labkit's check of the recovered config: verl raises {first.code} at {first.when}: "
        f"{first.exc_type}: {first.message}" + (f" ({'; '.join(first.arithmetic)})" if first.arithmetic else "")
    )


def _offload(cfg: VerlConfig | None, model: str | None) -> dict[str, Any] | None:
    """Host bytes each training process keeps with FSDP's CPU offload, for the config's model."""
    if cfg is None:
        return None
    try:
        s = settings_for(cfg, model)
    except ConfigError:
        return None
    p, f = s.model.param_count(), s.fsdp_world
    host = (4 * p // f if s.param_offload else 0) + (8 * p // f if s.optimizer_offload else 0)
    if not host:
        return None
    what = " and ".join(w for w, on in (("parameters", s.param_offload), ("Adam states", s.optimizer_offload)) if on)
    return {"gib": host / 2**30, "what": what, "processes": int(cfg.get("trainer.n_gpus_per_node"))}
