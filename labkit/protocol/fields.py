"""The batch fields verl's stages hand each other, by name: what generation returns (the rollout's output keys).

Kept apart from ``data_proto`` so that code which only needs the names does not import torch and TensorDict.
Mirrors verl/experimental/agent_loop/agent_loop.py: AgentLoopWorker.generate_sequences (the batch it returns).
"""

from __future__ import annotations

ROLLOUT_OUTPUT_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_length",
)
"""verl's generation output fields, plus ``response_length`` (labkit's HF engine reports each row's length)."""
