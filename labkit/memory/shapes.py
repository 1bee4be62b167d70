"""A model's shapes and parameter counts (``ModelShape``); the catalogue of real models that fills it from
``data/model_shapes.json`` is ``labkit.memory.model_catalogue`` (the GPUs' capacities: ``labkit.memory.gpus``).

A memory model needs the parameter count split the way FSDP holds it: the embedding, the LM head (absent when tied),
one decoder layer at a time, and (VL) the vision tower. The counts follow the Hugging Face modules of each
``architecture`` (``Qwen2DecoderLayer`` ... ``Qwen3MoeSparseMoeBlock``, ``DeepseekV3Attention``,
``Qwen3NextGatedDeltaNet``, ``GptOssAttention``, the Qwen-VL / SigLIP / GLM-4V vision towers); the optional parts live in
``labkit.memory.shapes_moe``, ``labkit.memory.shapes_mixers`` and ``labkit.memory.shapes_vision``, the config.json
reader in ``labkit.memory.shapes_hf``. RoPE has no parameters.
tests/test_shapes.py checks every count against transformers' own modules and the published figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from labkit.memory.shapes_mixers import LinearAttentionShape, MambaShape, MlaShape, V4AttentionShape
from labkit.memory.shapes_moe import MoeShape
from labkit.memory.shapes_vision import VisionShape


@dataclass(frozen=True)
class ModelShape:
    """One model's tensor shapes, as its ``config.json`` gives them (text decoder; ``vision`` for a VL tower).

    FSDP view: ``embedding_param_count`` + ``lm_head_param_count`` + the decoder layers (``layer_param_counts``; the
    largest, ``layer_param_count``, is what FSDP gathers at once) + the final norm + ``vision_param_count``. MTP heads
    (DeepSeek-V3 ``num_nextn_predict_layers``, Qwen3-Next/3.5 ``mtp_num_hidden_layers``) are never counted: HF
    transformers drops them on load and verl does not train them (``mtp_layers`` records how many the checkpoint has).
    """

    name: str
    """The key in ``data/model_shapes.json`` (e.g. ``Qwen2.5-7B``)."""
    architecture: str
    """The HF ``model_type`` whose modules the counts follow (``qwen2`` | ``qwen3`` | ``llama`` | ``qwen3_moe`` | ...)."""
    hidden_size: int
    """H, the residual width."""
    num_hidden_layers: int
    """L, the decoder layers (MTP layers excluded)."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """K/V heads (GQA groups); divides the query heads. MLA: equals the query heads (no KV grouping)."""
    head_dim: int
    """Per-head width: explicit in Qwen3/Gemma/gpt-oss configs, else H / heads. MLA: qk_nope + qk_rope."""
    intermediate_size: int
    """I, the dense gated MLP's width (used by dense layers; MoE layers use ``moe``)."""
    vocab_size: int
    """V, rows of the embedding (and of the LM head)."""
    tie_word_embeddings: bool
    """The LM head reuses the embedding matrix (no separate V·H)."""
    attention_bias: bool
    """q/k/v projections carry biases (Qwen2/2.5, DeepSeek-R1-Distill-Qwen, Seed-OSS, gpt-oss)."""
    qk_norm: bool
    """Per-head RMSNorm on q and k (Qwen3, Gemma 3, Qwen3-Next): head_dim weights each."""
    max_position_embeddings: int
    """The config's context limit."""
    published_params: int
    """The rounded total the model card / HF page publishes (``published_params_label``); 0 for a local config."""
    source: str
    """Hugging Face repo id the shapes were transcribed from (or the local folder)."""
    family: str = ""
    """Catalogue family (``Qwen3-MoE``, ``DeepSeek-V3`` ...), for docs/models.md."""
    published_active_params: int = 0
    """MoE: the published activated-per-token figure; 0 for dense models."""
    attention_out_bias: bool = False
    """``o_proj`` has a bias (gpt-oss, Llama-style ``attention_bias``): H more per attention layer."""
    attention_output_gate: bool = False
    """Qwen3-Next/3.5 full attention: ``q_proj`` also emits a per-head output gate (2·heads·head_dim outputs)."""
    attention_sinks: bool = False
    """gpt-oss: one learned sink logit per query head per layer."""
    norms_per_layer: int = 2
    """RMSNorms of H per decoder layer: 2 (input, post-attention); Gemma 2/3: 4 (pre/post attention and MLP)."""
    mlp_bias: bool = False
    """The dense MLP's projections carry biases."""
    gated_mlp: bool = True
    """The dense MLP is gated (gate, up, down: 3·H·I); Nemotron-H's is up and down only (2·H·I)."""
    layer_types: tuple[str, ...] = ()
    """Per layer ``full_attention`` | ``sliding_attention`` | ``linear_attention``; empty: all full attention.
    Sliding layers have the same parameters as full ones (only the KV they keep differs). Nemotron-H's blocks
    (``block_pattern``) are one of ``mamba`` | ``full_attention`` | ``moe`` | ``mlp`` each."""
    sliding_window: int = 0
    """Tokens a sliding-attention layer sees (0: none)."""
    moe: MoeShape | None = None
    """The sparse MLP of MoE layers (None: dense model)."""
    mla: MlaShape | None = None
    """DeepSeek multi-head latent attention (None: standard q/k/v/o attention)."""
    linear_attention: LinearAttentionShape | None = None
    """The gated delta-net of ``linear_attention`` layers (Qwen3-Next, Qwen3.5)."""
    mamba: MambaShape | None = None
    """The Mamba2 mixer of ``mamba`` blocks (Nemotron-H)."""
    compressed_attention: V4AttentionShape | None = None
    """DeepSeek-V4's attention (sliding window, CSA and HCA layers) and its hyper-connections."""
    vision: VisionShape | None = None
    """The vision tower + merger of a VL model (None: text only)."""
    mtp_layers: int = 0
    """Multi-token-prediction layers in the checkpoint (``num_nextn_predict_layers`` / ``mtp_num_hidden_layers``):
    left out of ``param_count``, priced alone by ``mtp_param_count``."""
    quantization: str = ""
    """The checkpoint's ``quantization_config`` (DeepSeek-V4-Flash: ``fp8 e4m3, experts fp4``); empty: unquantized.
    The memory model still prices the engine's weights in the rollout dtype, and says so."""
    mtp_stores_embedding: bool = False
    """DeepSeek-V3 / GLM-4.5 checkpoints store a copy of the embedding and LM head with each MTP layer."""

    def __hash__(self) -> int:
        """By name, width and depth only: equal shapes still hash equal, and a memory answer (whose fixes search
        looks shapes up in its caches thousands of times) does not hash every field and part each time."""
        return hash((self.name, self.hidden_size, self.num_hidden_layers))

    # ---- what each layer is -------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        """The model has routed experts."""
        return self.moe is not None

    def layer_type(self, index: int) -> str:
        """Layer ``index``'s token mixer: ``full_attention`` | ``sliding_attention`` | ``linear_attention``, or a
        Nemotron-H block's kind."""
        return self.layer_types[index] if self.layer_types else "full_attention"

    @property
    def block_pattern(self) -> bool:
        """Nemotron-H: each layer (block) holds one token mixer or one MLP, with one norm, not both."""
        return "moe" in self.layer_types or "mlp" in self.layer_types

    def has_mixer(self, index: int) -> bool:
        """Layer ``index`` has a token mixer (every layer, except a block-pattern model's MLP blocks)."""
        return not self.block_pattern or self.layer_type(index) in ("mamba", "full_attention")

    def has_mlp(self, index: int) -> bool:
        """Layer ``index`` has an MLP or a MoE block (every layer, except a block-pattern model's mixer blocks)."""
        return not self.block_pattern or self.layer_type(index) in ("moe", "mlp")

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) holds the sparse MLP (``MoeShape.is_moe_layer``); False for dense models."""
        return self.moe is not None and self.moe.is_moe_layer(index)

    @property
    def num_moe_layers(self) -> int:
        """How many decoder layers are MoE (e.g. DeepSeek-V3 58 of 61, Qwen3-30B-A3B 48 of 48); 0 when dense."""
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    # ---- parameter counts -------------------------------------------------------------------------------------
    def embedding_param_count(self) -> int:
        """``embed_tokens``: V·H."""
        return self.vocab_size * self.hidden_size

    def lm_head_param_count(self) -> int:
        """``lm_head``: V·H, or 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def attention_param_count(self, index: int = 0) -> int:
        """Layer ``index``'s token mixer: gated delta-net (linear layers), MLA, or q/k/v/o with their biases, q/k
        norms (head_dim each), the output gate's extra q rows and gpt-oss's sinks."""
        h = self.hidden_size
        if not self.has_mixer(index):
            return 0
        if self.layer_type(index) == "mamba" and self.mamba is not None:
            return self.mamba.param_count(h)
        if self.compressed_attention is not None:
            return self.compressed_attention.param_count(
                h, self.num_attention_heads, self.head_dim, self.layer_type(index)
            )
        if self.layer_type(index) == "linear_attention" and self.linear_attention is not None:
            return self.linear_attention.param_count(h)
        if self.mla is not None:
            return self.mla.param_count(h, self.num_attention_heads, self.attention_bias)
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        q_out = 2 * q if self.attention_output_gate else q
        n = h * q_out + 2 * h * kv + q * h
        n += (q_out + 2 * kv) if self.attention_bias else 0
        n += h if self.attention_out_bias else 0
        n += 2 * self.head_dim if self.qk_norm else 0
        return n + (self.num_attention_heads if self.attention_sinks else 0)

    def dense_mlp_param_count(self) -> int:
        """The dense MLP: 3·H·I gated, else 2·H·I (+ 2·I + H biases when ``mlp_bias``)."""
        h, i = self.hidden_size, self.intermediate_size
        return (3 if self.gated_mlp else 2) * h * i + ((2 * i + h) if self.mlp_bias else 0)

    def mlp_param_count(self, index: int) -> int:
        """Layer ``index``'s MLP: the whole sparse block (router + all experts + shared) on MoE layers, else dense."""
        if not self.has_mlp(index):
            return 0
        if self.moe is not None and self.moe.is_moe_layer(index):
            hashed = self.moe.router_score_bias and index < self.moe.hash_layers  # a table, not a bias, picks
            return self.moe.block_param_count(self.hidden_size) - (self.moe.num_experts if hashed else 0)
        return self.dense_mlp_param_count()

    def layer_param_counts(self) -> list[int]:
        """Every decoder layer's parameters: token mixer + MLP + ``norms_per_layer``·H."""
        return list(self._layer_counts)

    @cached_property
    def _layer_counts(self) -> tuple[int, ...]:
        """``layer_param_counts`` computed once per shape (a memory answer asks hundreds of times)."""
        norms = self.norms_per_layer * self.hidden_size
        return tuple(
            self.attention_param_count(i) + self.mlp_param_count(i) + norms for i in range(self.num_hidden_layers)
        )

    def layer_param_count(self) -> int:
        """The largest decoder layer (what FSDP gathers at once; for dense models every layer)."""
        return max(self.layer_param_counts())

    def dense_layer_param_count(self) -> int:
        """A decoder layer with the dense MLP (full attention): attention + 3·H·I + norms. For all-MoE models
        (Qwen3-MoE, Mixtral, gpt-oss) no layer has it; the figure is still the one the config's I would give."""
        return self.attention_param_count(self._first(False)) + self.dense_mlp_param_count() + self._norms()

    def moe_layer_param_count(self) -> int:
        """A MoE decoder layer with ALL its experts: attention + router + E routed + shared + norms (0 if dense)."""
        if self.moe is None:
            return 0
        i = self._first(True)
        return self.attention_param_count(i) + self.moe.block_param_count(self.hidden_size) + self._norms()

    def expert_param_count(self) -> int:
        """One routed expert: 3·H·moe_intermediate_size (+ gpt-oss biases); 0 if dense."""
        return self.moe.expert_param_count(self.hidden_size) if self.moe is not None else 0

    def router_param_count(self) -> int:
        """One MoE layer's router: E·H (+ biases); 0 if dense."""
        return self.moe.router_param_count(self.hidden_size) if self.moe is not None else 0

    def vision_param_count(self) -> int:
        """The vision tower + merger/projector, exact (0 for text-only models)."""
        return self.vision.param_count() if self.vision is not None else 0

    def text_param_count(self) -> int:
        """The language model alone: embedding + LM head (unless tied) + all decoder layers + the final norm H
        (+ DeepSeek-V4's hyper-connection head)."""
        v4 = self.compressed_attention.head_param_count(self.hidden_size) if self.compressed_attention else 0
        return (
            self.embedding_param_count()
            + self.lm_head_param_count()
            + sum(self.layer_param_counts())
            + self.hidden_size
            + v4
        )

    def param_count(self) -> int:
        """Unique parameters of the checkpoint (a tied head once, MTP layers excluded): ``text_param_count`` +
        ``vision_param_count``. For MoE models this is the TOTAL (every expert)."""
        return self.text_param_count() + self.vision_param_count()

    def mtp_param_count(self) -> int:
        """The checkpoint's MTP layers, which ``param_count`` leaves out (transformers drops them on load; Megatron
        can train them): per layer two RMSNorms (embedding, hidden), the 2H→H projection, one full-attention decoder
        layer with the model's MLP (the MoE block when the model is MoE), a final RMSNorm, and for DeepSeek-V3/GLM-4.5
        a stored copy of the embedding and LM head. 0 when the checkpoint has none."""
        if not self.mtp_layers:
            return 0
        h, i = self.hidden_size, self._first(self.is_moe)
        layer = self.attention_param_count(i) + self.mlp_param_count(i) + self._norms()
        copies = self.embedding_param_count() + self.vocab_size * h if self.mtp_stores_embedding else 0
        return self.mtp_layers * (3 * h + 2 * h * h + layer + copies)

    def active_param_count(self) -> int:
        """Parameters one token runs through: everything except the routed experts it is not sent to, i.e.
        ``param_count`` minus (E − top-k) experts in each MoE layer. Includes embedding, LM head, router, shared
        experts and the vision tower (the convention of Qwen/DeepSeek/OpenAI "activated" figures). Equals
        ``param_count`` for dense models."""
        if self.moe is None:
            return self.param_count()
        idle = (self.moe.num_experts - self.moe.num_experts_per_tok) * self.expert_param_count()
        return self.param_count() - self.num_moe_layers * idle

    def _norms(self) -> int:
        return self.norms_per_layer * self.hidden_size

    def _first(self, moe: bool) -> int:
        """The first full/sliding-attention layer that is (not) MoE, else layer 0."""
        for i in range(self.num_hidden_layers):
            if self.is_moe_layer(i) == moe and self.layer_type(i) not in ("linear_attention", "mamba"):
                return i
        return 0
