"""YAML as the pipeline reads it: YAML 1.2 booleans (as DVC), the line of every key, duplicate keys refused."""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml


# ------------------------------------------------------------------------------------------------
# where a key path is in the YAML file (for ``params.yaml:<line>:`` in the error)
@functools.lru_cache(maxsize=1)
def fast_yaml_loader() -> type:
    """PyYAML's libyaml-backed safe loader where the wheel has it (about 10x faster: every stage reads params.yaml
    and the pipeline files at start-up), else the pure-Python one; both build the same documents and nodes.

    Booleans are YAML 1.2's (true/false), as DVC reads params.yaml: PyYAML's YAML 1.1 also takes on/off/yes/no,
    and ``dvc exp run -S`` rewrites the whole file with those strings unquoted (``reference: on``), which would then
    come back as booleans here and fail the schema (a selection choice's "on"/"off")."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    bool_tag = "tag:yaml.org,2002:bool"
    loader = type("Yaml12BoolLoader", (base,), {"yaml_implicit_resolvers": {
        first: [(tag, rx) for tag, rx in resolvers if tag != bool_tag]
        for first, resolvers in base.yaml_implicit_resolvers.items()}})
    loader.add_implicit_resolver(bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    return loader


def yaml_key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Key path -> 1-based line of its key, following ``<<: *anchor`` merges; raises on duplicate keys."""
    root = yaml.compose(text, Loader=fast_yaml_loader())
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, path: tuple[str, ...], depth: int = 0) -> None:
        if depth > 64:
            return
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            merged: list[Any] = []
            for k, v in node.value:
                key = str(k.value)
                if key == "<<":
                    merged.extend(v.value if isinstance(v, yaml.SequenceNode) else [v])
                    continue
                if key in seen:
                    raise DuplicateKey(path + (key,), k.start_mark.line + 1, seen[key])
                seen[key] = k.start_mark.line + 1
                lines.setdefault(path + (key,), k.start_mark.line + 1)
                walk(v, path + (key,), depth + 1)
            for m in merged:   # keys that come from an anchor point at the anchor's lines
                walk(m, path, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines.setdefault(path + (str(i),), v.start_mark.line + 1)
                walk(v, path + (str(i),), depth + 1)

    walk(root, ())
    return lines


class DuplicateKey(Exception):
    def __init__(self, path: tuple[str, ...], line: int, first: int) -> None:
        self.path, self.line, self.first = path, line, first
        super().__init__(f"{'.'.join(path)}: duplicate key (first at line {first})")


def line_of(lines: dict[tuple[str, ...], int], path: tuple[Any, ...]) -> int | None:
    """The line of the longest prefix of ``path`` found in the file (a missing key: its parent's line)."""
    parts = tuple(str(p) for p in path)
    for n in range(len(parts), 0, -1):
        if parts[:n] in lines:
            return lines[parts[:n]]
    return None
