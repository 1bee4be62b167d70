"""Arithmetic layer, bottom: a verl configuration as labkit reads it.

Holds the modelled keys with their per-profile defaults (``keys``), verl-style YAML plus Hydra-style overrides
(``verl_config``), a config pasted as YAML or as a command line of overrides (``text_input``) and
sequence-length profiles (``lengths``). May import: ``labkit.trace`` only.
"""
