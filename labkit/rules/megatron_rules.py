"""The checks verl and megatron-core make on the Megatron sizes, as pure arithmetic: each returns ``Verdict``s in the
order the real code runs them, with the exact message it would raise (or print) and the arithmetic behind it.

Mirrors ``verl/workers/engine/megatron/transformer_impl.py: MegatronEngine.__init__ /
_init_device_mesh / forward_backward_batch``, ``megatron/core/parallel_state.py: initialize_model_parallel``,
``megatron/core/model_parallel_config.py: ModelParallelConfig.__post_init__``,
``megatron/core/transformer/transformer_config.py: TransformerConfig.__post_init__``,
``megatron/core/transformer/transformer_block.py: get_num_layers_to_build``,
``megatron/core/tensor_parallel/utils.py: VocabUtility`` (via ``megatron/core/utils.py: divide``),
``megatron/core/transformer/moe/moe_layer.py: MoELayer.__init__`` (megatron-core 0.16.1). The step-1 checks on
micro-batch counts (VPP, the interleaved schedule) are in ``labkit.rules.megatron_schedule``; verl's start-up checks
of the sizes (``validate_config``'s Megatron branch, ``McoreEngineConfig``) in ``labkit.rules.megatron_config_rules``.

The model's shape (heads, KV heads, layers, experts, vocab) enters as plain ints: this layer does not read model
files; a None skips the checks that need it (experts: 0 = a dense model, None = unknown). Only verdicts up to the first one that raises are returned, because the
real code stops there (notices do not stop it).
"""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""megatron-core 0.16.1's allowed ``recompute_modules`` (``TransformerConfig.__post_init__``)."""


@dataclass(frozen=True)
class Verdict:
    """One check as the real code makes it: fired or not, the exception type (None: a printed warning), the message
    (verbatim, with its values formatted in) and the arithmetic lines that decide it."""

    code: str
    fired: bool
    exc_type: str | None
    message: str
    arithmetic: tuple[str, ...]


def mod_text(a: int, b: int) -> str:
    """'a % b = 0' or 'a % b != 0', as the reports write it."""
    return f"{a} % {b} = 0" if b and a % b == 0 else f"{a} % {b} != 0"


def until_first(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts up to and including the first one that raises (warnings do not stop the code)."""
    out = []
    for v in verdicts:
        out.append(v)
        if v.fired and v.exc_type is not None:
            break
    return out


def dynamic_cp_checks(dynamic_cp: bool, use_remove_padding: bool, vpp: int | None) -> list[Verdict]:
    """``_check_dcp_unsupported_features`` then ``_init_device_mesh`` (0.9.1) with megatron-core 0.16.1: padding
    removal (M4), no VPP (M5), then the Megatron-Core build check, which 0.16.1 always fails (M6)."""
    if not dynamic_cp:
        return []
    out = [
        Verdict(
            "M4",
            not use_remove_padding,
            "ValueError",
            "dynamic_context_parallel requires use_remove_padding=True",
            (f"actor_rollout_ref.model.use_remove_padding = {use_remove_padding}",),
        ),
        Verdict(
            "M5",
            vpp not in (None, 1),
            "NotImplementedError",
            "Dynamic CP does not support virtual pipeline parallelism",
            (f"virtual_pipeline_model_parallel_size = {vpp}",),
        ),
        Verdict(
            "M6",
            True,
            "RuntimeError",
            "Dynamic CP requires a Megatron-Core build containing NVIDIA/Megatron-LM#5154 (merge commit d2e7ec5b).",
            ("megatron-core 0.16.1 has no megatron.core.datasets.data_schedule.DefaultDynamicCPScheduler",),
        ),
    ]
    return until_first(out)


def model_parallel_init(
    world: int, tp: int, pp: int, vpp: int | None, cp: int, ep: int, etp: int | None
) -> list[Verdict]:
    """``initialize_model_parallel``: W % (TP·PP·CP) (M7), VPP needs PP > 1 (M8), W % (ETP·EP·PP) (M9)."""
    size = tp * pp * cp
    etp_ = tp if etp is None else etp
    esize = etp_ * ep * pp
    return until_first(
        [
            Verdict(
                "M7",
                world % size != 0,
                "RuntimeError",
                f"world_size ({world}) is not divisible by {size}",
                (f"TP x PP x CP = {tp} x {pp} x {cp} = {size}", mod_text(world, size)),
            ),
            Verdict(
                "M8",
                vpp is not None and not pp > 1,
                "RuntimeError",
                "pipeline-model-parallel size should be greater than 1 with interleaved schedule",
                (f"virtual_pipeline_model_parallel_size = {vpp}", f"pipeline_model_parallel_size = {pp}"),
            ),
            Verdict(
                "M9",
                world % esize != 0,
                "RuntimeError",
                f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size ({esize})",
                (f"ETP x EP x PP = {etp_} x {ep} x {pp} = {esize}", mod_text(world, esize)),
            ),
        ]
    )


def transformer_config_checks(
    tp: int,
    sequence_parallel: bool,
    ep: int,
    pp: int,
    heads: int | None,
    kv_heads: int | None,
    experts: int | None,
    layers: int | None,
    recompute_granularity: str | None = None,
    recompute_method: str | None = None,
    recompute_num_layers: int | None = None,
    recompute_modules: list[str] | None = None,
) -> list[Verdict]:
    """``TransformerConfig.__post_init__`` (after ``ModelParallelConfig.__post_init__``), in its order: the EP·TP
    without SP warning (M10), heads % TP (M11), num_query_groups vs TP (M12), EP without experts (M13), the recompute
    settings (M14, M15). ``sequence_parallel`` is the value verl passes (already False at TP = 1)."""
    out = [
        Verdict(
            "M10",
            ep > 1 and tp > 1 and not sequence_parallel,
            None,
            "When using expert parallelism and tensor parallelism for training, sequence parallelism must be used",
            (f"EP = {ep}, TP = {tp}", f"sequence_parallel = {sequence_parallel}"),
        )
    ]
    if heads is not None:
        out.append(
            Verdict(
                "M11",
                heads % tp != 0,
                "ValueError",
                f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp}).",
                (mod_text(heads, tp),),
            )
        )
        groups = heads if kv_heads is None else kv_heads
        out.append(
            Verdict(
                "M12",
                groups % tp != 0 and tp % groups != 0,
                "ValueError",
                f"num_query_groups ({groups}) must be a multiple or divisor of tensor_model_parallel_size ({tp}).",
                (mod_text(groups, tp), mod_text(tp, groups)),
            )
        )
    if experts is not None:  # 0: a dense model (megatron-core's num_moe_experts None)
        out.append(
            Verdict(
                "M13",
                ep > 1 and experts == 0,
                "ValueError",
                "num_moe_experts must be non None to use expert-parallel.",
                (f"expert_model_parallel_size = {ep}", f"num_moe_experts = {experts or None}"),
            )
        )
    out += _recompute(recompute_granularity, recompute_method, recompute_num_layers, recompute_modules, layers, pp)
    return until_first(out)


def _recompute(
    granularity: str | None, method: str | None, num_layers: int | None, modules: list[str] | None, layers: int | None,
    pp: int,
) -> list[Verdict]:  # fmt: skip
    """The recompute checks of ``TransformerConfig.__post_init__`` (M14 ValueError, M15 AssertionError)."""
    if granularity is None:
        return []
    per_stage = "?" if layers is None else layers // pp
    arith = (
        f"recompute_granularity = {granularity}",
        f"recompute_method = {method}",
        f"recompute_num_layers = {num_layers}",
    )
    msg = None
    if granularity not in ("full", "selective"):
        msg = f'When using recompute_granuarlity: {granularity} must be "full"or "selective".'
    elif method is not None and method not in ("block", "uniform"):
        msg = f'recompute_method: {method} must be "block" or "uniform".'
    elif method is None and granularity != "selective":
        msg = f'Using recompute_granularity: {granularity} so recompute_method must be "block" or "uniform"'
    elif granularity != "selective" and num_layers is None:
        msg = (
            f"When using recompute_granularity: {granularity} recompute_num_layers must be between 1 and "
            f"num_layers_per_pipeline_rank: {per_stage}"
        )
    elif granularity == "selective" and num_layers is not None:
        msg = f"When using recompute_granularity: {granularity} recompute_num_layers must be None."
    out = [Verdict("M14", msg is not None, "ValueError", msg or "", arith)]
    if msg is None and granularity == "selective":
        mods = ["core_attn"] if modules is None else list(modules)
        invalid = set(mods) - set(RECOMPUTE_MODULES)
        out.append(
            Verdict(
                "M15",
                bool(mods) and bool(invalid),
                "AssertionError",
                f"Invalid choices for recompute_modules: {invalid}. Allowed modules are: {set(RECOMPUTE_MODULES)}",
                (f"recompute_modules = {mods}",),
            )
        )
    return out


def model_build_checks(
    tp: int, pp: int, vpp: int | None, ep: int, layers: int | None, experts: int | None, vocab: int | None
) -> list[Verdict]:
    """Building the GPT model on a rank of the first stage: the vocab-parallel embedding (M16), the decoder's layers
    per stage (M17) and per virtual stage (M18), the MoE layers' experts per EP rank (M19, a bare assert)."""
    out = []
    if vocab is not None:
        out.append(
            Verdict(
                "M16", vocab % tp != 0, "AssertionError", f"{vocab} is not divisible by {tp}", (mod_text(vocab, tp),)
            )
        )
    if layers is not None:
        out.append(
            Verdict(
                "M17",
                layers % pp != 0,
                "AssertionError",
                "num_layers should be divisible by pipeline_model_parallel_size",
                (mod_text(layers, pp),),
            )
        )
        if vpp is not None and pp > 1 and layers % pp == 0:
            per = layers // pp
            out.append(
                Verdict(
                    "M18",
                    per % vpp != 0,
                    "AssertionError",
                    f"num_layers_per_pipeline_rank {per}             should be divisible by vp_size {vpp}",
                    (f"num_layers_per_pipeline_rank = {layers} // {pp} = {per}", mod_text(per, vpp)),
                )
            )
    if experts:
        out.append(Verdict("M19", experts % ep != 0, "AssertionError", "", (mod_text(experts, ep),)))
    return until_first(out)


def uneven_pipeline_layers(layers: int, pp: int, first: int | None, last: int | None) -> Verdict:
    """``get_num_layers_to_build`` with ``num_layers_in_first/last_pipeline_stage``: the layers left over must divide
    over the stages left over (M20)."""
    left, stages = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    return Verdict(
        "M20",
        stages > 0 and left % stages != 0,
        "AssertionError",
        "With uneven pipelineing the left over layers must be divisible by left over stages",
        (f"left over layers = {left}, stages = {stages}", mod_text(left, stages) if stages > 0 else "no stages left"),
    )
