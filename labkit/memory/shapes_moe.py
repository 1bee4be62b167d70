"""A ``ModelShape``'s mixture-of-experts MLP: routed experts, their router and the always-on shared experts.

It counts its parameters the way the Hugging Face modules hold them (transformers 5.x: ``Qwen2MoeSparseMoeBlock``,
``Qwen3MoeSparseMoeBlock``, ``DeepseekV3MoE``, ``GptOssMLP``, ``MixtralSparseMoeBlock``); tests/test_shapes.py checks
every count against those modules built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    """A sparse MLP: ``num_experts`` routed experts of width ``moe_intermediate_size`` (each a gated MLP, 3·H·I), a
    router picking ``num_experts_per_tok`` of them per token, and optional always-on shared experts."""

    num_experts: int
    """Routed experts per MoE layer (config ``num_experts`` / ``n_routed_experts`` / ``num_local_experts``)."""
    num_experts_per_tok: int
    """Top-k: routed experts each token runs through."""
    moe_intermediate_size: int
    """One routed expert's gated-MLP width (config ``moe_intermediate_size``; Mixtral/gpt-oss ``intermediate_size``)."""
    shared_expert_intermediate_size: int = 0
    """Total width of the shared expert(s), every token runs them: Qwen2-MoE/Qwen3-Next ``shared_expert_intermediate_size``;
    DeepSeek/GLM/Moonlight ``n_shared_experts * moe_intermediate_size`` (one fused gated MLP of that width). 0: none."""
    shared_expert_gate: bool = False
    """Qwen2-MoE / Qwen3-Next / Qwen3.5: a sigmoid gate ``Linear(H, 1)`` scales the shared expert (H params)."""
    router_bias: bool = False
    """The router ``Linear(H, E)`` has a bias (gpt-oss): E more parameters."""
    router_score_bias: bool = False
    """DeepSeek-V3 / GLM-4.5 / Moonlight ``e_score_correction_bias`` (E values, a checkpoint tensor, a buffer in HF)."""
    expert_bias: bool = False
    """Each expert's projections carry biases (gpt-oss: 2·I on gate_up, H on down)."""
    first_k_dense_replace: int = 0
    """The first k layers keep the dense MLP (DeepSeek, GLM-4.5, Moonlight; Qwen3-Next-style configs say 0)."""
    decoder_sparse_step: int = 1
    """Qwen2/3-MoE: layer i is MoE when (i + 1) % step == 0."""
    mlp_only_layers: tuple[int, ...] = ()
    """Qwen2/3-MoE: layer indices forced dense (Hy3: its ``dense`` layers; Nemotron-H: every block but its MoE ones)."""
    hash_layers: int = 0
    """DeepSeek-V4: the first layers route each token by a frozen token → expert table (no score-correction bias)."""
    gated: bool = True
    """Experts and shared expert are gated MLPs (gate, up, down); Nemotron-H's are up and down only (squared ReLU)."""

    @property
    def projections(self) -> int:
        """Weight matrices per expert: 3 gated, 2 not."""
        return 3 if self.gated else 2

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) holds this sparse MLP (else the dense one, ``intermediate_size``):
        the HF rule ``index >= first_k_dense_replace and (index + 1) % decoder_sparse_step == 0 and index not in
        mlp_only_layers``."""
        return (
            index >= self.first_k_dense_replace
            and (index + 1) % self.decoder_sparse_step == 0
            and index not in self.mlp_only_layers
        )

    def expert_param_count(self, hidden: int) -> int:
        """One routed expert: gate, up and down projections 3·H·I (+ 2·I + H biases for gpt-oss)."""
        i = self.moe_intermediate_size
        return self.projections * hidden * i + ((2 * i + hidden) if self.expert_bias else 0)

    def router_param_count(self, hidden: int) -> int:
        """The router (gate) ``Linear(H, E)``, its bias (gpt-oss) and DeepSeek-V3's score-correction bias."""
        e = self.num_experts
        return hidden * e + (e if self.router_bias else 0) + (e if self.router_score_bias else 0)

    def shared_param_count(self, hidden: int) -> int:
        """The shared expert(s): a gated MLP of the total shared width, plus Qwen's ``Linear(H, 1)`` gate."""
        shared = self.projections * hidden * self.shared_expert_intermediate_size
        return shared + (hidden if self.shared_expert_gate else 0)

    def block_param_count(self, hidden: int) -> int:
        """The whole sparse MLP of one layer: router + all routed experts + shared expert(s)."""
        return (
            self.router_param_count(hidden)
            + self.num_experts * self.expert_param_count(hidden)
            + self.shared_param_count(hidden)
        )

    def active_block_param_count(self, hidden: int) -> int:
        """What one token runs in one layer: router + top-k routed experts + shared expert(s)."""
        return (
            self.router_param_count(hidden)
            + self.num_experts_per_tok * self.expert_param_count(hidden)
            + self.shared_param_count(hidden)
        )
