"""A run's training plan: everything its training depends on, in one small file per run (``plans/<run>.json``).

The ``plan`` stage writes the plan of every run; each ``train@<run>`` stage depends on its plan alone. A plan
holds the run's resolved settings, the product settings training reads, the SHA-256 of the data and feature files
the method reads (:func:`xmc.methods.harness.training_inputs`) and of the library modules its training imports
(found by reading their import statements, so a module training never imports is not in it). A run is retrained
exactly when one of these changes: editing prediction code, another method or a parameter of another run leaves
its plan, and so its model, as it was.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from xmc.config import schema as params_schema
from xmc.config.runs import RunSpec
from xmc.io import sha256_files
from xmc.methods import METHODS, get_method
from xmc.methods.harness import training_inputs
from xmc.workspace import Workspace

# product settings a training run reads besides its own (monitoring metrics, name-match negatives, encoding batch)
CONTEXT_KEYS = ("evaluate", "label_names", "index")
# fields of those sections that no training reads: the intervals' resampling is evaluation's (the package and
# report stages); a new bootstrap seed or resample count re-evaluates every run and retrains none
CONTEXT_FIELDS_NO_TRAINING_READS = {"evaluate": ("bootstrap",)}
PACKAGE_ROOT = Path(__file__).resolve().parents[1]           # xmc/
REPO_ROOT = PACKAGE_ROOT.parent
# xmc/config/schema.py declares every section of params.yaml; a training reads its run's resolved settings and
# CONTEXT_KEYS, both in the plan. So the file stands in the plan as the JSON schemas of the sections a training can
# read (:func:`training_schema_hash`): a new field of the hybrids', the report's or the registry's section leaves
# every model as it was
SCHEMA_FILE = PACKAGE_ROOT / "config" / "schema.py"
SECTIONS_NO_TRAINING_READS = ("ParamsConfig", "HybridConfig", "HybridEntry", "BoostedTreesFusionConfig",
                              "ValTunedFusionConfig", "ReportConfig", "OrchestrationConfig", "GateConfig",
                              "RegistryConfig", "ServeConfig", "XrLinearRunConfig")


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` (``xmc.a.b`` -> xmc/a/b.py or xmc/a/b/__init__.py) under this repository."""
    parts = name.split(".")
    base = REPO_ROOT.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _import_nodes(tree: ast.Module, in_functions: bool) -> list[ast.AST]:
    """The import statements of a module: at module level (inside ``if`` / ``try`` blocks too) and, with
    ``in_functions``, inside its functions and classes."""
    if in_functions:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(path: Path, module: str) -> set[str]:
    """The ``xmc`` / ``stages`` / ``lab`` modules a source file imports: at module level, and inside functions too except in
    a package's ``__init__.py`` (whose functions import on demand what the package's users ask for: ``xmc.load``,
    ``xmc.train``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(tree, in_functions=path.name != "__init__.py"):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)   # a name may be a submodule
    return {m for m in out if m.split(".")[0] in ("xmc", "stages", "lab")}


@functools.lru_cache(maxsize=None)
def code_closure(*roots: str) -> tuple[Path, ...]:
    """The source files reachable from the modules ``roots`` by import statements (with every parent package's
    ``__init__.py``, and the C sources of :mod:`xmc.native`, which it compiles), sorted."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imports(path, name))
    files = set(seen.values())
    if "xmc.native" in seen:
        files.update((PACKAGE_ROOT / "native").glob("*.c"))
    return tuple(sorted(files))


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k not in ("description", "title")}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


@functools.lru_cache(maxsize=1)
def training_schema_hash() -> str:
    """SHA-256 of the JSON schemas (fields, types, defaults, bounds; not docstrings) of every section class of
    :mod:`xmc.config.schema` except :data:`SECTIONS_NO_TRAINING_READS`."""
    schemas = {name: _without_descriptions(cls.model_json_schema(mode="validation"))
               for name, cls in sorted(vars(params_schema).items())
               if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == params_schema.__name__
               and name not in SECTIONS_NO_TRAINING_READS}
    return hashlib.sha256(json.dumps(schemas, sort_keys=True, default=str).encode()).hexdigest()


def _sha256_tree(path: Path) -> str:
    """Of a file, or of every file under a folder (relative names and contents)."""
    if path.is_file():
        return sha256_files([path])
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode())
        h.update(b"\0")
        h.update(sha256_files([f]).encode())
    return h.hexdigest()


def _training_reads(section: str, value: Any) -> Any:
    """The part of params section ``section`` a training reads (without :data:`CONTEXT_FIELDS_NO_TRAINING_READS`)."""
    dropped = CONTEXT_FIELDS_NO_TRAINING_READS.get(section, ())
    if not isinstance(value, dict) or not dropped:
        return value
    return {k: v for k, v in value.items() if k not in dropped}


def run_plan(params: dict[str, Any], run: RunSpec, ws: Workspace, stage: str = "stages.train") -> dict[str, Any]:
    """The plan of ``run``: settings, input hashes and code hashes (``stage``: the entry point's module)."""
    method = get_method(run.method)
    module = METHODS[run.method].split(":")[0]
    code = code_closure(stage, "xmc.methods.harness", module)
    inputs = {}
    for p in training_inputs(method, run.config, ws):
        inputs[p.as_posix()] = _sha256_tree(p) if p.exists() else None
    return {"run": run.name, "method": run.method, "config": run.config,
            "settings": {k: _training_reads(k, params.get(k)) for k in CONTEXT_KEYS},
            "inputs": inputs,
            "code": {p.relative_to(REPO_ROOT).as_posix(): training_schema_hash() if p == SCHEMA_FILE
                     else sha256_files([p]) for p in code}}


__all__ = ["CONTEXT_FIELDS_NO_TRAINING_READS", "CONTEXT_KEYS", "SECTIONS_NO_TRAINING_READS", "code_closure", "run_plan",
           "training_schema_hash"]
