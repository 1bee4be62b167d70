"""Arithmetic layer: predicted bytes of an RL step's phases (pure arithmetic, no tensors).

Holds the log-prob pass's logits bytes (``logprob``). May import: ``labkit.plan`` and everything below it.
"""
