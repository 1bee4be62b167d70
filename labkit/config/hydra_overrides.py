"""Hydra's command-line forms, as verl's entry points receive them: ``key=value``, ``+key=value`` (add a key),
``++key=value`` (add or override), ``~key`` / ``~key=value`` (delete), a config-group choice (``model_engine=dp``),
and Hydra's own flags (``--config-path``/``--config-name``, ``hydra.*`` keys, ``--multirun``).

``parse_override`` splits one override; ``split_hydra_args`` separates Hydra's flags from the overrides and says
which base YAML they select; ``check_base`` refuses a base labkit does not model (a recipe's own YAML).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
_FLAGS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name", "--config-dir": "dir",
          "-cd": "dir"}  # fmt: skip
_SWITCHES = ("--multirun", "-m", "--cfg", "-c", "--resolve", "--info", "-i", "--help", "-h", "--hydra-help")
MODELLED_BASES = ("ppo_trainer", "ppo_megatron_trainer")
"""verl's trainer YAMLs labkit models (``verl/trainer/config/ppo_trainer.yaml``, and ``ppo_megatron_trainer.yaml``:
0.9.1's shim for ``model_engine=megatron``, 0.7.1's Megatron base)."""
GROUPS = {"model_engine": ("dp", "megatron", "veomni")}
"""Config groups of ppo_trainer.yaml's defaults list, with the choices labkit models (dp = FSDP, megatron, veomni)."""


class HydraError(ValueError):
    """An override or flag Hydra would reject, or a base labkit does not model (one line)."""


@dataclass(frozen=True)
class Override:
    """One override: ``prefix`` "" | "+" | "++" | "~", the dotted ``key``, the value text (None: ``~key``)."""

    prefix: str
    key: str
    raw: str | None
    text: str

    @property
    def is_group(self) -> bool:
        return self.key in GROUPS


def parse_override(item: str) -> Override:
    """Split ``item`` as Hydra's override grammar does (HydraError for anything else)."""
    text = item.strip()
    if text.startswith("--"):
        raise HydraError(f"'{item}': verl's entry point takes 'key=value' (no '--' prefix, no '--config.')")
    if text.startswith("~"):
        key, eq, raw = text[1:].partition("=")
        prefix, raw = "~", (raw if eq else None)
    else:
        prefix = "++" if text.startswith("++") else "+" if text.startswith("+") else ""
        key, eq, raw = text[len(prefix) :].partition("=")
        if not eq:
            raise HydraError(f"Override '{item}' is not of the form key=value")
    key = key.strip()
    if "@" in key and _KEY.match(key.replace("@", ".")):
        raise HydraError(
            f"Override '{item}': '{key}' picks a config group into a package (Hydra's GROUP@PACKAGE=OPTION, e.g. a "
            "plugin's config found through hydra.searchpath); labkit reads verl's ppo_trainer.yaml and its "
            "model_engine group only"
        )
    if not _KEY.match(key):
        raise HydraError(f"Override '{item}': '{key}' is not a dotted key")
    return Override(prefix, key, raw, text)


@dataclass
class HydraArgs:
    """An argument list split: the overrides, the base YAML (``config_path``/``config_name``), Hydra's own
    settings (``hydra.*`` overrides and switches: not part of verl's config)."""

    overrides: list[str] = field(default_factory=list)
    config_path: str | None = None
    config_name: str | None = None
    hydra: list[str] = field(default_factory=list)

    def base(self) -> str:
        return (self.config_name or "ppo_trainer").removesuffix(".yaml")

    def base_overrides(self) -> list[str]:
        """The overrides the base YAML stands for (``ppo_megatron_trainer``: ``model_engine=megatron``), to be applied
        before the command line's own."""
        return ["model_engine=megatron"] if self.base() == "ppo_megatron_trainer" else []


def split_hydra_args(args: Iterable[str]) -> HydraArgs:
    """Hydra's flags out of an argument list (``--config-name X`` and ``--config-name=X`` alike)."""
    out, items, k = HydraArgs(), list(args), 0
    while k < len(items):
        item = items[k]
        flag, eq, value = item.partition("=")
        if flag in _FLAGS:
            if not eq:
                if k + 1 >= len(items):
                    raise HydraError(f"{flag} needs a value")
                value, k = items[k + 1], k + 1
            kind = _FLAGS[flag]
            if kind == "path":
                out.config_path = value
            elif kind == "name":
                out.config_name = value
            else:
                out.hydra.append(f"{flag}={value}")
        elif item in _SWITCHES or flag in ("--cfg", "-c", "--package", "-p"):
            out.hydra.append(item)
        elif re.match(r"^\+{0,2}hydra\.", item):
            out.hydra.append(item)
        else:
            out.overrides.append(item)
        k += 1
    return out


def _verl_config_dir(path: str | None) -> bool:
    """True for no path, or verl's own ``verl/trainer/config`` (also relative ``config`` next to main_ppo)."""
    if path is None:
        return True
    p = path.rstrip("/")
    return p in ("config", "./config", "pkg://verl.trainer.config") or p.endswith("verl/trainer/config")


def check_base(args: HydraArgs, module: str | None = None, lenient: bool = False) -> list[str]:
    """HydraError when the base YAML, a config-group choice or the entry point is one labkit does not model;
    ``lenient`` (``labkit memory``): a recipe's base YAML or another entry point is named and read past, its
    overrides priced over verl's ppo_trainer defaults (the returned notes say so)."""
    notes = []
    if lenient and module is not None and "main_ppo" not in module and not module.startswith("verl.trainer.main_"):
        notes.append(f"the entry point {module}: its arguments are read as verl's main_ppo overrides")
        module = None
    if lenient and (args.base() not in MODELLED_BASES or not _verl_config_dir(args.config_path)):
        where = f" in {args.config_path}" if args.config_path and not _verl_config_dir(args.config_path) else ""
        notes.append(
            f"--config-name {args.base()}{where}: a base YAML labkit does not read; its own values are not priced "
            "(verl's ppo_trainer defaults are)"
        )
        args = HydraArgs(args.overrides, None, None, args.hydra)
    if module is not None and module not in ("verl.trainer.main_ppo",) and not module.endswith("main_ppo.py"):
        sync = module.removesuffix(".py").replace("/", ".").endswith("main_ppo_sync")
        why = (
            "it is verl 0.8.0's TransferQueue sync trainer (agent-loop outputs into TransferQueue, a ReplayBuffer, "
            "its own PPOTrainer; 0.9.0 and 0.9.1 have no such module: it became their v1 loop), whose 0.8.0 batch "
            "path labkit does not model; the v1 loop is main_ppo with trainer.use_v1=true; "
            if sync
            else ""
        )
        raise HydraError(
            f"the entry point {module} is not modelled: {why}labkit models the config of verl.trainer.main_ppo "
            "(`labkit read` prints its arguments)"
        )
    if args.base() not in MODELLED_BASES or not _verl_config_dir(args.config_path):
        where = f" in {args.config_path}" if args.config_path and not _verl_config_dir(args.config_path) else ""
        raise HydraError(
            f"--config-name {args.base()}{where}: labkit models verl's own {', '.join(MODELLED_BASES)}.yaml only "
            "(FSDP and Megatron workers); a recipe's own base YAML is not modelled"
        )
    for item in args.overrides:
        try:
            ov = parse_override(item)
        except HydraError:
            continue  # reported where the overrides are applied
        if ov.is_group and ov.raw is not None and ov.raw.strip() not in GROUPS[ov.key]:
            raise HydraError(
                f"'{item}': labkit models {ov.key}={'|'.join(GROUPS[ov.key])} only (FSDP, Megatron and VeOmni workers); "
                f"the {ov.raw.strip()} engine's config is not modelled"
            )
    return notes
