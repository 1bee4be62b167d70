"""Arithmetic layer, bottom: a verl configuration as labkit reads it.

Holds the modelled keys with their per-profile defaults (``keys``), verl-style YAML plus Hydra overrides
(``verl_config``, ``hydra_overrides``: ``+key``, ``++key``, ``~key``, the base YAML), a launch script read as bash
reads it and never run (``launch_script`` over the static bash reader: ``bash_lex``, ``bash_parse``,
``bash_values``, ``bash_expand``, ``bash_arith``, ``bash_test``, ``bash_builtins``, ``bash_reader``), a config given
as YAML or as a script (``text_input``, the one reader of the CLI and the dashboard) and sequence-length profiles
(``lengths``), and the clipped one-line messages of every input error (``messages``). May import: ``labkit.trace`` only.
"""
