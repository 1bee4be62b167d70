"""Arithmetic layer: memory (pure arithmetic, no tensors).

The memory of one RL step per phase and per GPU: model and GPU shapes as data (``shapes``, ``gpus``), the config's memory knobs
(``settings``), every term with its formula and keys (``terms``), the phases (``phases``), a step from the config
or a trace and ``fill_bytes_predicted`` (``step_memory``), the OOM verdict (``verdict``), its fixes (``fix_search``
over the knobs of ``fix_knobs``), their cheapest set (``fix_combine``) and the way out (``way_out``), the answer in
words (``answer_text``), the ``labkit memory`` command (``command``), the log-prob head's bytes (``logprob``), the model a config trains
(``model_source``), a GPU's reported capacity and headroom with the fits / tight / OOM verdict (``headroom``), and
the one model-and-GPU decision the CLI and the dashboard share (``choice``); the model catalogue's parts
(``shapes_parts``, ``shapes_hf``, ``catalogue_doc``), MoE/VL/KV pricing (``vision``, ``kv_cache``, ``phase_info``), the
fix candidates (``fix_candidates``) and Megatron's memory per pipeline stage (``megatron_memory``,
``megatron_params``, ``megatron_activations``, ``megatron_terms``, ``megatron_step``), LoRA's adapters (``lora``) and
a phase's break-even length (``break_even``). docs/memory.md and
docs/megatron.md explain it.
May import: ``labkit.plan`` and everything below it.
"""
