"""Megatron's custom pipeline layout, ``override_transformer_config.pipeline_model_parallel_layout`` (megatron-core's
``PipelineParallelLayerLayout``): a string such as ``"Et*6|t*6|t*5L"`` that places the embedding (``E``), the
decoder layers (``t``), MTP layers (``m``) and the loss (``L``) on each virtual pipeline stage, ``|`` between
stages, ``x*n`` and ``(..)*n`` repeating, commas ignored. Stage ``c·PP + r`` of the list is model chunk ``c`` of
pipeline rank ``r``, and the layers are numbered in that order. It replaces the even split (M17/M18), so a model
whose layers do not divide over the stages (DeepSeek-V4-Flash's 43 over 8) can still be pipelined.
"""

from __future__ import annotations

import re
from functools import lru_cache

from labkit.rules.megatron_rules import Verdict

KINDS = "ELtm"
"""Embedding, loss, decoder ("transformer") and MTP layers: the characters megatron-core reads."""


@lru_cache(maxsize=64)
def parse_layout(text: str) -> tuple[str, ...]:
    """The virtual stages of ``text``, each a string of layer characters (``parse_str_to_list``'s unrolling).
    ValueError names a character megatron-core does not know, in its words."""
    flat = text.replace(",", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    for stage in stages:
        for char in stage:
            if char not in KINDS:
                raise ValueError(
                    f"Invalid layer character: {char} (stage={stage!r}, layout_str={flat!r}), known layer characters:"
                    f" {list(KINDS)}"
                )
    return tuple(stages)


def layout_vpp(text: str, pp: int) -> int | None:
    """The virtual pipeline size a layout implies (its stages / PP, as ``TransformerConfig`` sets it when the config
    leaves it unset and it is over 1), None when the layout does not parse or divide."""
    try:
        stages = len(parse_layout(text))
    except ValueError:
        return None
    return stages // pp if stages % pp == 0 and stages // pp > 1 else None


@lru_cache(maxsize=64)
def layout_error(text: str, pp: int, vpp: int | None, num_layers: int) -> str | None:
    """megatron-core's message for the first check ``text`` fails (``layout_verdicts``), None when it builds."""
    return next((v.message for v in layout_verdicts(text, pp, vpp, num_layers) if v.fired), None)


def layout_verdicts(text: str, pp: int, vpp: int | None, num_layers: int | None, mtp: int = 0) -> list[Verdict]:
    """megatron-core's checks of a layout (M26), in its order: the stage count over PP
    (``PipelineParallelLayerLayout.__init__``), the VPP it implies against a configured one (``TransformerConfig``),
    then ``validate_layer_layout``: the embedding first, the loss last, each once, the decoder layers equal to
    ``num_layers`` and the MTP layers to ``mtp``; first of all, a character it does not know."""
    try:
        stages = parse_layout(text)
    except ValueError as exc:
        return [Verdict("M26", True, "AssertionError", str(exc), (f"layout: {text}",))]
    out = [
        Verdict(
            "M26",
            len(stages) % pp != 0,
            "AssertionError",
            "pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size"
            f" (len(layout)={len(stages)}, pipeline_model_parallel_size={pp})",
            (f"{len(stages)} stages in the layout, {len(stages)} % {pp}",),
        )
    ]
    if out[0].fired:
        return out
    detected = len(stages) // pp
    if vpp is not None:
        out.append(
            Verdict(
                "M26",
                vpp != detected,
                "AssertionError",
                "virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout, "
                f"(self.virtual_pipeline_model_parallel_size={vpp},  detected_vpp_size={detected})",
                (f"the layout's {len(stages)} stages / PP {pp} = {detected} virtual stages",),
            )
        )
    flat = "".join(stages)
    checks = [
        (flat[:1] != "E", f"The first layer must be embedding, but got {_name(flat[:1])}"),
        (flat[-1:] != "L", f"The last layer must be loss, but got {_name(flat[-1:])}"),
        (flat.count("E") != 1, "Embedding must be specified exactly once"),
        (flat.count("L") != 1, "Loss must be specified exactly once"),
    ]
    if num_layers is not None:
        decoders = flat.count("t")
        checks.append(
            (decoders != num_layers, f"Number of decoder layers {decoders}must match num_layers {num_layers}")
        )
    checks.append((flat.count("m") != mtp, "Number of mtp layers in layout must match mtp_num_layers"))
    arithmetic = (f"layout: {' | '.join(s or '-' for s in stages)}",)
    out += [Verdict("M26", fired, "AssertionError", message, arithmetic) for fired, message in checks]
    return out


def _name(char: str) -> str:
    return {"E": "LayerType.embedding", "L": "LayerType.loss", "t": "LayerType.decoder", "m": "LayerType.mtp"}.get(
        char, "nothing"
    )


@lru_cache(maxsize=256)
def layout_layers(text: str, pp: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """The decoder layers pipeline rank ``rank`` builds, one tuple per model chunk, numbered as megatron-core
    numbers them (virtual stage c·PP + r in list order)."""
    stages = parse_layout(text)
    counts = [stage.count("t") for stage in stages]
    chunks = []
    for index in range(rank, len(stages), pp):
        start = sum(counts[:index])
        chunks.append(tuple(range(start, start + counts[index])))
    return tuple(chunks)
