"""verl's own checks of the Megatron sizes at start-up, as pure arithmetic: ``verl/utils/config.py:
validate_config``'s Megatron branch (E2, M1, E1) and ``verl/workers/config/engine.py: McoreEngineConfig.__post_init__``
(M2, M3). Each returns ``Verdict``s (``labkit.rules.megatron_rules``) in the order verl runs them, with its exact
message; megatron-core's own checks, made when the workers build the model, stay in ``megatron_rules``.
"""

from __future__ import annotations

from labkit.rules.megatron_rules import Verdict, mod_text


def megatron_dp(world: int, tp: int, pp: int, cp: int) -> int:
    """megatron-core's DP = W // (TP·PP·CP) (0 when that does not divide W)."""
    d = tp * pp * cp
    return world // d if world % d == 0 else 0


def validate_config_megatron(
    world: int, tp: int, pp: int, cp: int, micro_per_gpu: int | None, train_batch_size: int, n: int
) -> list[Verdict]:
    """``validate_config``'s Megatron branch (run only without ``use_dynamic_bsz``): E2, then minimal_bsz = DP·m (a
    TypeError, M1, when m is null), then E1 against B·n."""
    mp = tp * pp
    e2 = Verdict(
        "E2",
        world % (mp * cp) != 0,
        "AssertionError",
        f"n_gpus ({world}) must be divisible by model_parallel_size ({mp}) times context_parallel_size ({cp})",
        (f"model_parallel_size = TP x PP = {tp} x {pp} = {mp}", mod_text(world, mp * cp)),
    )
    if e2.fired:
        return [e2]
    dp = world // (mp * cp)
    m1 = Verdict(
        "M1",
        micro_per_gpu is None,
        "TypeError",
        "unsupported operand type(s) for *: 'int' and 'NoneType'",
        (f"megatron_dp = {world} // ({mp} x {cp}) = {dp}", f"minimal_bsz = {dp} x actor.ppo_micro_batch_size_per_gpu"),
    )
    if m1.fired:
        return [e2, m1]
    minimal = dp * micro_per_gpu
    real = train_batch_size * n
    e1 = Verdict(
        "E1",
        real % minimal != 0,
        "AssertionError",
        f"real_train_batch_size ({real}) must be divisible by minimal possible batch size ({minimal})",
        (
            f"real_train_batch_size = B x n = {train_batch_size} x {n} = {real}",
            f"minimal_bsz = DP x m = {world} // ({mp} x {cp}) x {micro_per_gpu} = {minimal}",
            mod_text(real, minimal),
        ),
    )
    return [e2, m1, e1]


def engine_config_checks(tp: int, sequence_parallel: bool, dynamic_cp: bool, max_seqlen: int | None) -> list[Verdict]:
    """``McoreEngineConfig.__post_init__``: the dynamic-CP ``max_seqlen_per_dp_cp_rank`` ValueError (M2, 0.9.1), then
    the warning that sets sequence parallel to false at TP = 1 (M3; printed even when it already is false)."""
    bad = dynamic_cp and (not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen <= 0)
    m2 = Verdict(
        "M2",
        bad,
        "ValueError",
        "max_seqlen_per_dp_cp_rank must be a positive integer when dynamic_context_parallel is enabled",
        (f"dynamic_context_parallel = {dynamic_cp}", f"max_seqlen_per_dp_cp_rank = {max_seqlen}"),
    )
    if m2.fired:
        return [m2]
    m3 = Verdict(
        "M3",
        tp == 1,  # verl warns at TP = 1 whatever sequence_parallel says
        None,
        "set sequence parallel to false as TP size is 1",
        (f"tensor_model_parallel_size = {tp}", f"sequence_parallel = {sequence_parallel} -> False"),
    )
    return [m2, m3]
