"""Megatron's custom pipeline layout (``labkit.rules.pipeline_layout``) against megatron-core 0.16.1's own
``PipelineParallelLayerLayout`` on random layouts: the layers each rank and virtual stage builds, and the first
check that stops a layout, message for message."""

import random

import pytest
from _oracle_mcore import mcore

from labkit.config.keys import ACTOR
from labkit.config.verl_config import load_config
from labkit.memory.megatron_stages import stage_layers
from labkit.memory.model_catalogue import model_shape
from labkit.rules.parallel_layout import ParallelLayout
from labkit.rules.pipeline_layout import layout_layers, layout_verdicts, layout_vpp, parse_layout

MEGATRON = f"{ACTOR}.megatron"
LAYOUT = "override_transformer_config.pipeline_model_parallel_layout"


def _oracle():
    mcore()
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    return PipelineParallelLayerLayout, LayerType


def _random_layout(rng: random.Random) -> tuple[str, int, int]:
    pp, vpp = rng.choice([1, 2, 4, 8]), rng.choice([1, 1, 2])
    stages = [rng.randint(0, 6) for _ in range(pp * vpp)]
    parts = ["t" * n if rng.random() < 0.5 or n < 2 else f"t*{n}" for n in stages]
    if rng.random() < 0.9:
        parts[0] = "E" + parts[0]
    if rng.random() < 0.9:
        parts[-1] += "L"
    text = "|".join(parts)
    if rng.random() < 0.1:  # a stage too many or too few for PP
        text += "|t"
    if rng.random() < 0.05:  # a character megatron-core does not know
        text = text.replace("t", "x", 1)
    layers = sum(stages) + (rng.choice([-1, 1]) if rng.random() < 0.2 else 0)
    return text, pp, layers


def test_the_layers_each_stage_builds_and_the_first_failed_check_are_megatron_cores():
    Layout, LayerType = _oracle()
    from megatron.core import parallel_state as state

    rng = random.Random(7)
    fired = 0
    for _ in range(400):
        text, pp, layers = _random_layout(rng)
        mine = next((v for v in layout_verdicts(text, pp, None, layers) if v.fired), None)
        try:
            theirs = Layout(text, pp)
            theirs.validate_layer_layout(num_layers=layers, mtp_num_layers=None)
        except AssertionError as exc:
            fired += 1
            assert mine is not None and mine.message == str(exc), (text, pp, layers)
            continue
        assert mine is None, (text, pp, layers, mine)
        for rank in range(pp):
            chunks = layout_layers(text, pp, rank)
            assert [len(c) for c in chunks] == [row.count(LayerType.decoder) for row in theirs.layout[rank]]
            for vp, chunk in enumerate(chunks):  # the layers' numbers, as get_layer_offset counts them
                state.set_virtual_pipeline_model_parallel_world_size(theirs.virtual_pipeline_model_parallel_size)
                try:
                    offset = theirs.get_layer_offset(LayerType.decoder, vp_stage=vp, pp_rank=rank)
                finally:
                    state.set_virtual_pipeline_model_parallel_world_size(None)
                assert chunk == tuple(range(offset, offset + len(chunk))), (text, rank, vp)
    assert 20 < fired < 380  # both sides of every check were drawn


def test_deepseek_v4_flash_layout_places_its_43_layers_on_8_stages():
    text = "Et*6|t*6|t*6|t*5|t*5|t*5|t*5|t*5L"
    assert not any(v.fired for v in layout_verdicts(text, 8, None, 43))
    assert [len(layout_layers(text, 8, r)[0]) for r in range(8)] == [6, 6, 6, 5, 5, 5, 5, 5]
    assert layout_layers(text, 8, 7) == (tuple(range(38, 43)),)
    assert parse_layout("E(tt|)*2,tL") == ("Ett", "tt", "tL")
    with pytest.raises(ValueError, match="Invalid layer character: x"):
        parse_layout("Etx|tL")
    assert layout_vpp("Et|t|t|tL", 2) == 2 and layout_vpp(text, 8) is None and layout_vpp("Etx|tL", 2) is None


def test_a_layout_megatron_core_refuses_is_refused_by_the_memory_model_too():
    """Memory is priced per stage only for a layout megatron-core builds; otherwise its message, as a ValueError the
    answer shows as "not priced". A layout of 2·PP stages is a virtual pipeline of 2, as TransformerConfig sets it."""
    m = model_shape("DeepSeek-V4-Flash")
    for text, message in (("Et*40|t*3L", "must be divisible by pipeline_model_parallel_size"), ("Etx|tL", "character")):
        layout = ParallelLayout("megatron", 8, pp=8, pipeline_layout=text)
        with pytest.raises(ValueError, match=message):
            stage_layers(m, layout, 0)
    sizes = [f"{MEGATRON}.pipeline_model_parallel_size=2", f"{MEGATRON}.{LAYOUT}='Et*10|t*11|t*11|t*11L'"]
    cfg = load_config(None, ["model_engine=megatron", *sizes])
    layout = ParallelLayout.from_config(cfg)
    assert layout.vpp == 2 and stage_layers(m, layout, 1) == (tuple(range(10, 21)), tuple(range(32, 43)))
