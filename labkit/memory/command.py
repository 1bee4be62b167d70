"""``labkit memory``: per phase the peak and its largest terms, the first phase over the GPU, and the fixes.

``labkit.cli`` adds the sub-command with ``add_arguments`` and calls ``run(cfg, ns)``; bad --model / --gpu-memory
raise ``ConfigError`` (exit 2). Exit 0 when every phase fits (or is tight: under the margin, not over the GPU),
1 when one OOMs or verl rejects the config (said first).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any

from labkit.config.messages import ConfigError
from labkit.config.verl_config import VerlConfig
from labkit.memory.answer_text import render_text
from labkit.memory.choice import model_note, settings_for
from labkit.memory.gpus import gpu, gpu_names
from labkit.memory.headroom import DEFAULT_GPU
from labkit.memory.model_catalogue import model_names
from labkit.memory.settings import MemorySettings
from labkit.memory.step_memory import fill_bytes_predicted
from labkit.memory.trace_compare import trace_lines, trace_spec
from labkit.memory.verdict import MemoryReport, memory_report
from labkit.rules.run import Run, as_run
from labkit.trace import StepTrace

UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
Tracer = Callable[..., dict[str, Any]]
DOC = "predicted GPU memory per phase of one step, the first phase that OOMs, and the knobs that fix it"


def add_arguments(s: argparse.ArgumentParser) -> None:
    """The options of ``labkit memory`` (the config args and --profile come from labkit.cli)."""
    s.add_argument(
        "--model",
        default=None,
        help=f"model shape (default: the one actor_rollout_ref.model.path names): {', '.join(model_names())}",
    )
    s.add_argument("--gpu-memory", default=None, help="capacity of one GPU, e.g. 80GiB, 141GB (GB = 10^9 bytes)")
    s.add_argument(
        "--gpu", default=None, help=f"a GPU preset (capacity as nvidia-smi reports it): {', '.join(gpu_names())}"
    )
    s.add_argument("--margin", type=float, default=None, help="GiB a phase must keep free to 'fit' (default 2)")
    s.add_argument(
        "--trace",
        nargs="?",
        const="auto",
        default=None,
        metavar="PHASE",
        help="also trace the failing (or this) phase's largest micro-batch on fake CUDA tensors (seconds)",
    )
    s.add_argument(
        "--head",
        choices=("flash_attn", "torch"),
        default=None,
        help="verl's log-prob head: flash_attn (default: flash-attn installed, as in verl's GPU images) or torch "
        "(verl's fallback without it: a log-softmax per token row, 4 bytes a logit saved under grad)",
    )
    s.add_argument(
        "--image-tokens",
        type=int,
        default=None,
        metavar="N",
        help="vision-language models: image tokens in each sample's prompt (default 256, an assumption the answer states)",
    )
    s.add_argument("--json", action="store_true", help='{"phases": {...}, "first_oom": ..., "fixes": [...]}')


def parse_bytes(text: str) -> int:
    """``80GiB`` / ``141GB`` / ``85899345920`` as bytes, exact (ConfigError for anything else; the range is
    ``labkit.memory.choice.settings_for``'s)."""
    m = re.fullmatch(r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([A-Za-z]*)\s*", str(text)[:200])
    if not m or m.group(2).lower() not in UNITS:
        raise ConfigError(f"--gpu-memory: cannot read {text!r}; use e.g. 80GiB, 141GB or a byte count.")
    return int(Decimal(m.group(1)) * UNITS[m.group(2).lower()])


def settings_of(cfg: VerlConfig | Run, ns: argparse.Namespace) -> MemorySettings:
    """The settings for parsed CLI options (``labkit.memory.choice.settings_for``, as the dashboard decides)."""
    capacity = parse_bytes(ns.gpu_memory) if ns.gpu_memory is not None else None
    s = settings_for(cfg, ns.model, ns.gpu, capacity, getattr(ns, "margin", None))
    images = getattr(ns, "image_tokens", None)
    if images is not None and not 0 <= images <= 10**6:
        raise ConfigError(f"--image-tokens must be 0 to 1,000,000 image tokens a sample, got {images}")
    if images is not None and images > s.prompt_length:
        raise ConfigError(
            f"--image-tokens {images:,} is more than the prompt's {s.prompt_length:,} tokens (data.max_prompt_length): verl "
            "counts a sample's image tokens in its prompt"
        )
    return replace(
        s,
        logprob_kernel=getattr(ns, "head", None) or s.logprob_kernel,
        image_tokens_per_sample=s.image_tokens_per_sample if images is None else images,
    )


def report(cfg: VerlConfig | Run, ns: argparse.Namespace) -> MemoryReport:
    """The report for parsed CLI options (ConfigError for an unknown model or GPU); a config is resolved once."""
    resolved = as_run(cfg)
    return memory_report(resolved, settings_of(resolved, ns), ns.lengths)


def run(cfg: VerlConfig, ns: argparse.Namespace, tracer: Tracer | None = None) -> int:
    """Print the report (text or --json); 0 when the step fits, 1 when a phase OOMs. With --trace, ``tracer``
    (``labkit.model.trace_runner.run_trace``, passed in by ``labkit.cli``) traces one phase beside the formula."""
    resolved = as_run(cfg)  # read once; the settings, the report and the note all ask it
    rep = report(resolved, ns)
    note = model_note(resolved, ns.model)
    traced = None
    if getattr(ns, "trace", None) is not None and tracer is not None:
        traced = _trace(rep, ns.trace, tracer)
    if ns.json:
        doc = rep.to_dict()
        if note:
            print(note, file=sys.stderr)
        if traced is not None:
            spec = {k: v for k, v in traced[1].items() if k != "model"}
            doc["trace"] = {"phase": traced[0], "spec": spec, **traced[2]}
        print(json.dumps(doc, default=str))
    else:
        if note:
            print(note)
        print(render_text(rep, resolved.layout))
        if traced is not None:
            print("\n".join(trace_lines(rep.settings, traced[0], rep.phases[traced[0]], traced[1], traced[2])))
    return 0 if rep.first_oom is None and rep.verl_error is None else 1


def _trace(rep: MemoryReport, phase: str, tracer: Tracer) -> tuple[str, dict, dict]:
    passes = [n for n in rep.phases if n != "generate"]
    if phase == "auto":
        phase = next((n for n in passes if rep.state(n)[0] != "fits"), "update_actor")
    if phase not in passes:
        raise ConfigError(f"--trace: {phase!r} is not a traced phase of this step; use one of {', '.join(passes)}")
    spec = trace_spec(rep.settings, phase, rep.phases[phase])
    model = spec.pop("model")
    return phase, {**spec, "model": model}, tracer(model, **spec)


def fill_trace(tr: StepTrace, cfg: VerlConfig, model: str, gpu_bytes: int | None = None) -> StepTrace:
    """``labkit plan``: every rank record's ``bytes_predicted`` for ``model`` (an H100 80 GB unless told)."""
    try:
        s = MemorySettings.from_config(cfg, model, gpu_bytes or gpu(DEFAULT_GPU).memory_bytes)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    try:
        return fill_bytes_predicted(tr, cfg, s)
    except ConfigError as exc:  # a shape the Megatron memory model does not price: bytes stay unknown, said so
        tr.summary["memory_not_priced"] = str(exc)
        return tr
