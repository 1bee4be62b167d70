"""The parts of ``labkit diagnose``'s answer that are not an allocation failure's: the config's notes, labkit's memory
report for the recovered config, verl's own message with labkit's check of it, labkit's prediction for a log
without verl's message, and the host bytes FSDP's CPU offload keeps."""

from __future__ import annotations

from typing import Any

from labkit.config.messages import ConfigError
from labkit.diagnose.log_config import RecoveredConfig
from labkit.memory.choice import settings_for
from labkit.memory.verdict import memory_report
from labkit.rules.catalogue import entry, message_fields
from labkit.rules.run import Run


def config_notes(rec: RecoveredConfig, profile: str, skipped: list[str]) -> list[str]:
    """What the opening's config line leaves out: the profile (from the frames, or assumed), the overrides labkit
    cannot apply, the reader's notes (a cut-off list, an unreadable command)."""
    if not rec.source:
        return list(rec.notes)
    how = "its frames" if rec.profile else "assumed (the frames do not say; --profile sets it)"
    lines = [f"  profile {profile}, {how}"]
    if skipped:
        lines.append(f"  {len(skipped)} override(s) labkit cannot apply, left out: " + "; ".join(skipped[:3]))
    return lines + rec.notes


def report_for(cfg: Run | None, model: str | None, capacity: int | None) -> tuple[Any, str | None, str]:
    """labkit's memory report for the recovered config's run (None and why not, when it cannot be made)."""
    if cfg is None:
        return None, None, "no config recovered"
    try:
        s = settings_for(cfg, model, capacity=capacity)
    except ConfigError as exc:
        return None, None, str(exc)
    return memory_report(cfg, s), s.model.name, ""


def verl_error(d: Any, code: str, text: str, cfg: Run | None) -> None:
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


def predict(d: Any, cfg: Run) -> None:
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


def offload(cfg: Run | None, model: str | None) -> dict[str, Any] | None:
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
