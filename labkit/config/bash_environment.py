"""What a launch script can read of its environment statically: the names ``env | awk -F= '/PATTERN/{print $1}'``
prints, known only when the caller vouches for the whole environment (``labkit.config.bash_reader`` asks for them
inside ``$(...)``).
"""

from __future__ import annotations

import re

from labkit.config.bash_expand import Shell, Val

ENV_NAMES = re.compile(
    r"""^\s*env\s*\|\s*awk\s+-F\s*['"]?=['"]?\s+'/(?P<pattern>[^/']+)/\s*\{\s*print\s+\$1;?\s*\}'\s*$"""
)
"""The idiom verl's TensorRT-LLM scripts clean the environment with: the names of the variables a pattern matches."""
BASH_EXPORTS = ("SHLVL", "_", "PWD", "OLDPWD")
"""What bash itself exports into ``env``'s output."""


def environment_names(sh: Shell, pattern: str) -> Val | None:
    """``env | awk -F= '/PATTERN/{print $1}'``: the names of the exported variables PATTERN matches, known only in
    an environment the caller vouches for whole, and when no variable the script set could be among them."""
    try:
        rx = re.compile(pattern)
    except re.error:
        return None
    set_here = {*sh.scalars, *sh.arrays, *BASH_EXPORTS}
    if not sh.env_complete or any(rx.search(name) for name in set_here):
        return None
    return Val("\n".join(sorted(name for name in {*sh.env, *sh.login} if rx.search(name))))
