"""verl's rollout output layout, shared by both rollout engines: the prompt left-padded to ``prompt_length``, the
response right-padded to ``response_length``, masks, position ids and, from vLLM, the sampled tokens' log-probs.

Mirrors verl/utils/torch_functional.py: get_response_mask and the agent loop's output assembly
(verl/experimental/agent_loop/agent_loop.py: AgentLoopWorker._agent_loop_postprocess: responses padded with pad,
rollout_log_probs padded with 0.0 to response_length).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from labkit.protocol.fields import ROLLOUT_OUTPUT_KEYS

OUTPUT_KEYS = ROLLOUT_OUTPUT_KEYS  # the names live in labkit.protocol.fields (no torch needed to read them)


def response_mask_from_eos(responses: torch.Tensor, eos_token_id: int | list[int]) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after. Mirrors verl/utils/torch_functional.py: get_response_mask."""
    eos = torch.isin(responses, torch.as_tensor(eos_token_id, device=responses.device)).long()
    return ((eos.cumsum(dim=1) - eos) == 0).long()


def postprocess(
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_position_ids: torch.Tensor,
    sequences: torch.Tensor,
    eos_token_id: int | list[int],
    pad_token_id: int,
    response_length: int,
    generated_lengths: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Generated sequences (prompt + new tokens) -> verl's rollout tensors: response cut/right-padded to
    ``response_length``, tokens after the first EOS set to pad, masks and position ids concatenated (response positions
    continue from the prompt's last). ``generated_lengths``: each row's own number of new tokens (ragged rows padded
    into ``sequences``: the padding is never a response token, even when pad != EOS).
    Mirrors verl/workers/rollout/vllm_rollout (v0.6) output assembly and agent_loop._agent_loop_postprocess widths."""
    resp = sequences[:, prompts.shape[1] :][:, :response_length]
    generated = resp.shape[1]
    if generated < response_length:
        fill = resp.new_full((resp.shape[0], response_length - generated), pad_token_id)
        resp = torch.cat([resp, fill], dim=1)
    resp_mask = response_mask_from_eos(resp, eos_token_id)
    resp_mask[:, generated:] = 0  # right padding added here is never a response token, even when pad != EOS
    if generated_lengths is not None:
        resp_mask &= (torch.arange(response_length)[None] < generated_lengths[:, None]).long()
    resp = resp.masked_fill(resp_mask == 0, pad_token_id)
    delta = torch.arange(1, response_length + 1, dtype=prompt_position_ids.dtype).unsqueeze(0)
    return {
        "prompts": prompts,
        "responses": resp,
        "response_mask": resp_mask,
        "input_ids": torch.cat([prompts, resp], dim=1),
        "attention_mask": torch.cat([prompt_mask.long(), resp_mask], dim=1),
        "position_ids": torch.cat([prompt_position_ids, prompt_position_ids[:, -1:] + delta], dim=1),
        "response_length": resp_mask.sum(dim=1),
    }


def pad_rows(rows: Sequence[Sequence[float | int]], width: int, value: float | int, dtype: torch.dtype) -> torch.Tensor:
    """Ragged rows cut/right-padded with ``value`` to ``width`` columns."""
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        row = list(row)[:width]
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def from_token_lists(
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_position_ids: torch.Tensor,
    token_ids: Sequence[Sequence[int]],
    eos_token_id: int | list[int],
    pad_token_id: int,
    response_length: int,
    log_probs: Sequence[Sequence[float]] | None = None,
) -> dict[str, torch.Tensor]:
    """An engine's ragged outputs (new token ids per row, their log-probs) -> verl's tensors, plus
    ``rollout_log_probs`` (float32, 0.0 outside the response mask) when ``log_probs`` are given."""
    width = max([response_length, *(len(t) for t in token_ids)])
    new = pad_rows(token_ids, width, pad_token_id, prompts.dtype)
    lengths = torch.tensor([min(len(t), response_length) for t in token_ids], dtype=torch.long)
    out = postprocess(
        prompts,
        prompt_mask,
        prompt_position_ids,
        torch.cat([prompts, new], dim=1),
        eos_token_id,
        pad_token_id,
        response_length,
        generated_lengths=lengths,
    )
    if log_probs is not None:
        lp = pad_rows(log_probs, response_length, 0.0, torch.float32)
        out["rollout_log_probs"] = lp.masked_fill(out["response_mask"] == 0, 0.0)
    return out
