"""Arithmetic layer: memory (pure arithmetic, no tensors).

The memory of one RL step per phase and per GPU, priced from the resolved run (``labkit.rules.run``).

- Shapes as data: the model (``shapes``: ``ModelShape``; its parts ``shapes_moe``, ``shapes_mixers``,
  ``shapes_vision``; the catalogue ``model_catalogue`` over ``data_tables``; ``shapes_hf`` reads a Hugging Face
  config; ``catalogue_doc`` writes docs/models.md) and the GPU (``gpus``).
- The run's memory knobs (``settings``, with the keys it reads outside the schema in ``settings_keys``).
- Every term with its formula and keys (``terms``, the bytes in ``term_bytes``), what a phase is (``phase_records``),
  the phases (``phases``, the log-prob head's and entropy's terms in ``head_terms``, the head's measured bytes in
  ``logprob``), MoE/VL/KV pricing (``vision``, ``kv_cache``, ``phase_info``), LoRA's adapters (``lora``).
- Megatron's memory per pipeline stage (``megatron_memory``: ``megatron_stages``, ``megatron_params``,
  ``megatron_activations``, ``megatron_terms``, ``megatron_lora``, ``megatron_step``).
- A step from the run or a trace and ``fill_bytes_predicted`` (``step_memory``), a GPU's headroom and the fits /
  tight / OOM state (``headroom``), the model a config trains (``model_source``) and the one model-and-GPU decision
  the CLI and the dashboard share (``choice``).
- The OOM verdict (``verdict``), a phase's break-even length (``break_even``), the fixes (``fix_search`` over the
  knobs of ``fix_knobs``, ``fix_candidates``, ``fix_scale``), their cheapest set (``fix_combine``), the way out
  (``way_out``), the answer in words (``answer_text``), the formula beside a trace (``trace_compare``), the
  key-effects page (``key_effects_doc``) and the ``labkit memory`` command (``command``).

docs/memory.md and docs/megatron.md explain it. May import: ``labkit.plan`` and everything below it.
"""
