"""Arithmetic layer, bottom: a verl configuration as labkit reads it, before it is resolved into a run
(``labkit.rules.run``).

- The modelled keys with their per-profile defaults (``keys``); what any verl key accepts (``key_values``: every
  release's keys, the closest key to a typo, a value coerced to its type); each key's memory effect
  (``key_effects``, over ``data/key_effects.yaml``); the keys a release, loop and engine never read
  (``unread_keys``, over ``data/unread_keys.yaml``); the releases labkit answers for (``versions``).
- A config: verl-style YAML plus Hydra overrides (``verl_config``: ``VerlConfig`` reads values; ``config_overrides``
  sets them; ``hydra_overrides`` parses ``+key``, ``++key``, ``~key``; ``yaml_input`` reads YAML within limits).
- A launch script read as bash reads it and never run (``launch_script`` over the static bash reader: the tokens
  ``bash_tokens``, words ``bash_lex``, operators ``bash_tokenize``, commands ``bash_parse`` and ``bash_compound``,
  expansions ``bash_expand`` with ``bash_values``, ``bash_arith`` and ``bash_test``, the builtins ``bash_builtins``,
  the walk ``bash_reader`` with its branches ``bash_branches`` and environment ``bash_environment``).
- A config given as YAML or as a script (``text_input``, the one reader of the CLI and the dashboard),
  sequence-length profiles (``lengths``), and every input error's clipped one-line message and ``ConfigError``
  (``messages``).

May import: ``labkit.trace`` only.
"""
