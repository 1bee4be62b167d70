"""YAML that labkit reads, bounded: a config file or an override value never hangs, exhausts memory or crashes.

Duplicate keys are rejected with the error OmegaConf (which verl uses) raises for them; aliases are allowed but the
document they expand to is capped (an alias "bomb" of a few hundred bytes otherwise expands to gigabytes); recursive
aliases, deep nesting, files that are not UTF-8 text, directories, FIFOs and oversized files get a clear message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_FILE_BYTES = 4 * 2**20  # a verl config is a few tens of KB
MAX_NODES = 100_000  # YAML nodes after alias expansion
MAX_DEPTH = 64  # nesting levels (verl's own config is under 10 deep)
MAX_LINES = 5_000  # lines, or ':' / ',' separators (verl's whole generated ppo_trainer.yaml is under 1,000 lines)


class YamlInputError(ValueError):
    """Input labkit refuses to read; the message says why (the caller prefixes the file or override)."""


_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: linear time up to the size cap


class _Loader(_BASE):  # type: ignore[misc, valid-type]
    """SafeLoader (libyaml's when built) that rejects a key repeated in one mapping, as OmegaConf's loader does."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        keys: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                continue
            if key_node.value in keys:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key_node.value}",
                    key_node.start_mark,
                )
            keys.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: Node, depth: int = 0, sizes: dict[int, int] | None = None, open_: set | None = None) -> int:
    """Nodes of the document once every alias is expanded (shared nodes counted each time they are used)."""
    sizes, open_ = ({} if sizes is None else sizes), (set() if open_ is None else open_)
    if depth > MAX_DEPTH:
        raise YamlInputError(f"nested deeper than {MAX_DEPTH} levels")
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise YamlInputError("an alias refers to a node that contains it (a recursive alias)")
    open_.add(key)
    if isinstance(node, SequenceNode):
        children = node.value
    elif isinstance(node, MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    total = 1
    for child in children:
        total += _expanded_size(child, depth + 1, sizes, open_)
        if total > MAX_NODES:
            raise YamlInputError(f"has more than {MAX_NODES:,} nodes (each alias counted as often as it is used)")
    open_.discard(key)
    sizes[key] = total
    return total


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with duplicate keys rejected and the document's expanded size and depth bounded.
    Raises YamlInputError (bounds) or yaml.YAMLError (syntax, duplicate keys)."""
    lines, separators = text.count("\n"), max(text.count(":"), text.count(","))
    if max(lines, separators) > MAX_LINES:  # linear: refused before the parser builds a node
        raise YamlInputError(
            f"has {max(lines, separators):,} lines or ':' / ',' separators; labkit reads up to {MAX_LINES:,} (verl's "
            "whole config has under 1,000 lines)"
        )
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    except RecursionError:
        raise YamlInputError("nested too deeply to parse") from None
    except YamlInputError:
        raise
    except yaml.YAMLError as exc:  # libyaml's own depth limit says so in its words; labkit says it in its own
        if "maximum nesting depth" in str(exc):
            raise YamlInputError("nested too deeply to parse") from None
        raise
    except (ValueError, OverflowError, IndexError, TypeError, KeyError, AttributeError) as exc:  # a scalar its tag
        # cannot convert: !!int abc, !!int "", 5,000 digits
        raise YamlInputError(f"a value YAML cannot convert ({str(exc)[:160]})") from None
    finally:
        loader.dispose()


def describe(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what, and where (``found duplicate key x (line 3, column 3)``)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc)
    where = exc.problem_mark or exc.context_mark
    at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
    return f"{exc.context + ': ' if exc.context else ''}{exc.problem or ''}{at}"


def read_config_text(path: str | Path) -> str:
    """The text of a config file: a regular file of at most MAX_FILE_BYTES, UTF-8 (a BOM is allowed)."""
    p = Path(path)
    if p.is_dir():
        raise YamlInputError("is a directory, not a config file")
    if p.exists() and not p.is_file():
        raise YamlInputError("is not a regular file (a FIFO, socket or device); labkit reads YAML files")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise YamlInputError(f"is {size:,} bytes; labkit reads configs of at most {MAX_FILE_BYTES:,} bytes")
    raw = p.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise YamlInputError("is UTF-16 text; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlInputError(f"is not UTF-8 text (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})") from None
