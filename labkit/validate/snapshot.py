"""What every validate check reads and writes: the snapshot of a config (``Snap``: each key's effective value, named
after the key, plus the batch geometry), the record of one check (``Finding``) and the recorder that keeps them in
execution order (``Recorder``), with the constants the checks share (severities, when, exception types, verl files).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.config.keys import KEYS
from labkit.config.verl_config import VerlConfig
from labkit.rules.run import Run as ResolvedRun
from labkit.rules.run import as_run

ERROR, SILENT, NOTICE, PASS = "error", "silent", "notice", "pass"
AE, VE = "AssertionError", "ValueError"
STARTUP, INIT, STEP1 = "start-up", "worker init", "step 1"

A, R, RF, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic"
CFG_PY, ACTOR_PY, CRITIC_PY = "verl/utils/config.py", "verl/workers/config/actor.py", "verl/workers/config/critic.py"
LEGACY_W, ENGINE_W = "verl/workers/fsdp_workers.py", "verl/workers/engine_workers.py"
LOSS_AGG = {
    "legacy": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "engine": ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
}


@dataclass
class Finding:
    """One check verl performs: what it raises (or silently does), when, where, and the arithmetic."""

    code: str
    exc_type: str | None
    message: str
    when: str
    where: str
    arithmetic: list[str] = field(default_factory=list)
    explanation: str = ""
    fixes: list[str] = field(default_factory=list)
    severity: str = ERROR
    _role: str = field(default="", repr=False, compare=False)


_SNAP_KEYS = {
    "train_batch_size": "data.train_batch_size",
    "gen_batch_size": "data.gen_batch_size",
    "val_batch_size": "data.val_batch_size",
    "n_gpus_per_node": "trainer.n_gpus_per_node",
    "nnodes": "trainer.nnodes",
    "balance_batch": "trainer.balance_batch",
    "critic_warmup": "trainer.critic_warmup",
    "use_legacy_worker_impl": "trainer.use_legacy_worker_impl",
    "use_v1": "trainer.use_v1",
    "ppo_mini_batch_size": f"{A}.ppo_mini_batch_size",
    "ppo_micro_batch_size": f"{A}.ppo_micro_batch_size",
    "ppo_micro_batch_size_per_gpu": f"{A}.ppo_micro_batch_size_per_gpu",
    "use_dynamic_bsz": f"{A}.use_dynamic_bsz",
    "ppo_max_token_len_per_gpu": f"{A}.ppo_max_token_len_per_gpu",
    "ulysses_sp": f"{A}.ulysses_sequence_parallel_size",
    "loss_agg_mode": f"{A}.loss_agg_mode",
    "use_remove_padding": "actor_rollout_ref.model.use_remove_padding",
    "lora_rank": "actor_rollout_ref.model.lora_rank",
    "use_kl_loss": f"{A}.use_kl_loss",
    "use_kl_in_reward": "algorithm.use_kl_in_reward",
    "rollout_n": f"{R}.n",
    "rollout_mode": f"{R}.mode",
    "temperature": f"{R}.temperature",
    "val_do_sample": f"{R}.val_kwargs.do_sample",
    "rollout_tp": f"{R}.tensor_model_parallel_size",
    "rollout_dp": f"{R}.data_parallel_size",
    "rollout_pp": f"{R}.pipeline_model_parallel_size",
    "log_prob_micro_batch_size": f"{R}.log_prob_micro_batch_size",
    "log_prob_micro_batch_size_per_gpu": f"{R}.log_prob_micro_batch_size_per_gpu",
    "log_prob_use_dynamic_bsz": f"{R}.log_prob_use_dynamic_bsz",
    "log_prob_max_token_len_per_gpu": f"{R}.log_prob_max_token_len_per_gpu",
    "agent_workers": f"{R}.agent.num_workers",
    "prompt_length": f"{R}.prompt_length",
    "response_length": f"{R}.response_length",
    "ref_log_prob_micro_batch_size": f"{RF}.log_prob_micro_batch_size",
    "ref_log_prob_micro_batch_size_per_gpu": f"{RF}.log_prob_micro_batch_size_per_gpu",
    "ref_log_prob_use_dynamic_bsz": f"{RF}.log_prob_use_dynamic_bsz",
    "ref_log_prob_max_token_len_per_gpu": f"{RF}.log_prob_max_token_len_per_gpu",
    "ref_ulysses_sp": f"{RF}.ulysses_sequence_parallel_size",
    "critic_ppo_mini_batch_size": f"{C}.ppo_mini_batch_size",
    "critic_ppo_micro_batch_size": f"{C}.ppo_micro_batch_size",
    "critic_ppo_micro_batch_size_per_gpu": f"{C}.ppo_micro_batch_size_per_gpu",
    "critic_forward_micro_batch_size": f"{C}.forward_micro_batch_size",
    "critic_forward_micro_batch_size_per_gpu": f"{C}.forward_micro_batch_size_per_gpu",
    "critic_use_dynamic_bsz": f"{C}.use_dynamic_bsz",
    "critic_ppo_max_token_len_per_gpu": f"{C}.ppo_max_token_len_per_gpu",
    "critic_forward_max_token_len_per_gpu": f"{C}.forward_max_token_len_per_gpu",
    "critic_ulysses_sp": f"{C}.ulysses_sequence_parallel_size",
    "critic_use_remove_padding": f"{C}.model.use_remove_padding",
}


def _chain(path: str) -> list[str]:
    out = [path]
    while KEYS[out[-1]].follows is not None:
        out.append(KEYS[out[-1]].follows)
    return out


_CHAINS = {path: _chain(path) for path in _SNAP_KEYS.values()}


class Snap:
    """The effective values every check reads (one ``cfg.get`` each, named after their keys in ``_SNAP_KEYS``),
    plus the run's batch geometry (``geo``) and its sizes the checks use most: world_size, prompts, samples, width.
    Built from the resolved run (``labkit.rules.run``); a config is resolved here once when given instead."""

    def __init__(
        self,
        cfg: VerlConfig | ResolvedRun,
        heads: int | None = None,
        kv_heads: int | None = None,
        max_seq_len: int | None = None,
        global_step: int | None = None,
        shape: dict | None = None,
    ) -> None:
        self.run = run = as_run(cfg, global_step)
        cfg = run.config
        values = cfg.values
        for name, path in _SNAP_KEYS.items():
            for p in _CHAINS[path]:  # the key, then the keys it follows (OmegaConf interpolations)
                if p in values:
                    v = values[p]
                    v = cfg.get(p) if isinstance(v, str) and v.startswith("${") else v
                    break
            else:
                v = KEYS[_CHAINS[path][-1]].default_for(cfg.profile)
            setattr(self, name, v)
        self.profile, self.heads, self.kv_heads, self.max_seq_len = cfg.profile, heads, kv_heads, max_seq_len
        shape = shape or {}  # the Megatron model checks' other shape numbers (None: not checked)
        self.num_layers, self.num_experts, self.vocab_size = (shape.get(k) for k in ("layers", "experts", "vocab"))
        self.model_type = shape.get("model_type")  # the HF model_type and its non-attention sequence mixers (S10)
        self.sequence_mixers = tuple(shape.get("mixers") or ())
        self.cfg = cfg
        self.geo = geo = run.geometry
        self.world_size, self.prompts, self.samples, self.width = geo.world_size, geo.prompts, geo.samples, geo.width
        self.need_ref = bool(self.use_kl_in_reward or self.use_kl_loss)
        self.need_critic = run.need_critic
        self.legacy = self.profile == "legacy"
        self.megatron = geo.parallel.is_megatron


class Recorder:
    """Collects checks in execution order; ``add`` records one (``fired`` False -> a "pass" record)."""

    def __init__(self, passes: bool = True) -> None:
        self.checks: list[Finding] = []
        self.passes = passes  # False: keep only checks that fire (the fix search needs no more)

    def add(
        self,
        fired: bool,
        code: str,
        exc: str | None,
        msg: str,
        when: str,
        where: str,
        arith: list[str],
        expl: str,
        sev: str = ERROR,
        role: str = "",
    ) -> bool:
        if fired or self.passes:
            self.checks.append(
                Finding(
                    code, exc, msg if fired else "", when, where, list(arith), expl, [], sev if fired else PASS, role
                )
            )
        return fired


def mod(a: int, b: int) -> str:
    """'a % b = 0' when divisible, else 'a % b != 0' (the form the reports use)."""
    return f"{a} % {b} = 0" if b and a % b == 0 else f"{a} % {b} != 0"
