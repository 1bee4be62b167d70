"""Compute layer, lower half: the model side of a rank.

Holds the tiny Qwen2 and its task (``tiny_model``, ``tiny_task``), rollout tensor parallelism: the sharding math
(``tp_parallel``) apart from its collectives (``tp_communications``), padding removal (``packing``), Ulysses
sequence parallelism: its math (``ulysses``) apart from its all-to-all (``ulysses_communications``), and its live
demo (``ulysses_demo``), log-probs from logits (``logits``), the
per-micro-batch log-prob forward (``logprob``) and the measured memory of the log-prob head (``logprob_memory``),
and the memory trace of a real pass at a real shape on fake CUDA tensors (``memory_trace``, the pass's body in
``trace_pass``, verl's heads mirrored in ``trace_heads`` and its attention and Ulysses all-to-alls in
``trace_attention``, a VL model's images in ``trace_vision``, PEFT-shaped LoRA adapters in ``trace_lora``;
megatron-core's own optimizer stepped on a traced stage in ``trace_megatron_optimizer``; ``fake_cuda`` makes
autograd run on them, ``trace_runner`` runs a trace in a fresh process through ``trace_main``).
May import: ``labkit.runtime``, ``labkit.protocol`` and the arithmetic layer.
"""
