"""The memory model against measurement: the tiny model's real log-prob, update and rollout passes on one process,
each measured by ``AllocationMeter`` (allocator events) and predicted by ``labkit.memory`` for the same shape.

The passes are verl's: ``forward_micro_batch`` with the naive fp32 log-softmax and the entropy (old_log_prob), the
same forward with grads, a loss and ``backward`` then an AdamW step (update_actor, Adam states warm), and HF
``generate`` with a KV cache (labkit's HF rollout engine). Measured and predicted count the bytes a pass allocates
above what already lives (the parameters, the Adam states): the phase's transient terms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from labkit.memory.model_catalogue import model_shape
from labkit.memory.phase_records import PassShape, Phase
from labkit.memory.phases import forward_pass, hf_generate, update_pass
from labkit.memory.settings import MemorySettings
from labkit.memory.shapes import ModelShape
from labkit.model.allocation_meter import AllocationMeter
from labkit.model.logprob import forward_micro_batch

RESIDENT = ("params", "optimizer", "ref_params", "critic_params", "critic_optimizer", "rollout_share")


@dataclass
class PassCheck:
    """One pass: measured and predicted bytes above the live state, and their ratio."""

    phase: str
    tokens: int
    measured_bytes: int
    predicted_bytes: int

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes


def transient_bytes(p: Phase) -> int:
    """A phase's peak minus what lives before it starts (params, Adam states, other models)."""
    return sum(v for k, v in p.instants[p.peak_instant].items() if k not in RESIDENT)


def tiny_settings(shape: ModelShape, **over: Any) -> MemorySettings:
    """One fp32 process, a plain module (no FSDP: no gathered copies), sdpa, the PyTorch log-softmax, no autocast,
    an eager entropy."""
    base = dict(
        model=shape,
        gpu_bytes=2**40,
        profile="engine",
        world_size=1,
        fsdp_size=-1,
        actor_sp=1,
        critic_sp=1,
        rollout_tp=1,
        compute_bytes=4,
        master_bytes=4,
        rollout_bytes=4,
        attention="sdpa",
        logprob_kernel="full_log_softmax",
        fsdp=False,
        autocast=False,
        entropy_compiled=False,
    )
    return MemorySettings(**{**base, **over})


def _model(shape: ModelShape, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=max(shape.max_position_embeddings, 4096),
        tie_word_embeddings=shape.tie_word_embeddings,
        attn_implementation="sdpa",
        use_cache=False,
    )
    return Qwen2ForCausalLM(cfg).float()


def _micro(shape: ModelShape, rows: int, prompt: int, response: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, shape.vocab_size, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    pos = torch.arange(prompt + response).expand(rows, -1).contiguous()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, prompt:]}


def check_passes(
    model: str = "tiny-qwen2",
    rows: int = 8,
    prompt: int = 24,
    response: int = 32,
    *,
    seed: int = 0,
    checkpointing: bool = True,
    entropy_chunking: bool = False,
    new_tokens: int = 8,
) -> dict[str, PassCheck]:
    """Run the three passes once each on the CPU (``generate`` samples ``new_tokens`` after the prompt) and return
    measured vs predicted bytes per phase."""
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    shape = model_shape(model)
    s = tiny_settings(shape, gradient_checkpointing=checkpointing, entropy_chunking=entropy_chunking)
    net = _model(shape, seed)
    micro = _micro(shape, rows, prompt, response, seed)
    tokens = rows * (prompt + response)
    out: dict[str, PassCheck] = {}
    kw = dict(use_remove_padding=True, chunked=entropy_chunking, calculate_entropy=True)
    net.eval()
    with torch.no_grad(), AllocationMeter() as meter:
        forward_micro_batch(net, micro, **kw)
    pred = transient_bytes(forward_pass(s, "old_log_prob", PassShape(rows, tokens)))
    out["old_log_prob"] = PassCheck("old_log_prob", tokens, meter.peak_bytes, pred)

    net.train()
    if checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(net.parameters(), lr=1e-6)

    def step() -> None:
        lp, _ = forward_micro_batch(net, micro, use_remove_padding=True, chunked=False)
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # Adam states exist from the second step on, as in every step of a run but the first
    with AllocationMeter() as meter:
        step()
    pred = transient_bytes(update_pass(replace(s, update_entropy=False), "update_actor", PassShape(rows, tokens)))
    out["update_actor"] = PassCheck("update_actor", tokens, meter.peak_bytes, pred)

    net.eval()
    net.config.use_cache = True
    prompts = micro["input_ids"][:, :prompt]
    with torch.no_grad(), AllocationMeter() as meter:
        net.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    pred = transient_bytes(hf_generate(shape, rows, prompt, new_tokens, 4))
    out["generate"] = PassCheck("generate", rows * (prompt + new_tokens), meter.peak_bytes, pred)
    return out
