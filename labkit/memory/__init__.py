"""Arithmetic layer: memory (pure arithmetic, no tensors).

Holds the shapes of real models and GPUs as data (``shapes``, from ``data/model_shapes.json`` and ``data/gpus.json``:
parameter counts per layer, embedding and LM head) and the predicted bytes of the log-prob pass's logits
(``logprob``). May import: ``labkit.plan`` and everything below it.
"""
