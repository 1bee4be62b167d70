"""Arithmetic layer, bottom: a verl configuration as labkit reads it.

Holds the modelled keys with their per-profile defaults (``keys``), verl-style YAML plus Hydra-style overrides
(``verl_config``) and sequence-length profiles (``lengths``). May import: ``labkit.trace`` only.
"""
