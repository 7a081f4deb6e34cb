"""The product and the lab are two: the lab may read the product, the product never reads the lab.

Checked statically over the product's code (xmc/, stages/, flows/) and its pipeline (dvc.yaml): no module imports
``lab`` or names a path under ``lab/``, and no stage depends on one. The product's params file holds the product's
knobs only (no selection candidates, ablations or seeds) and stays short."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_CODE = ("xmc", "stages", "flows")
LAB_PATH = re.compile(r"""(?:^|[\s"'(=,])(?:\./)?lab/""")


def product_modules() -> list[Path]:
    return sorted(p for d in PRODUCT_CODE for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_product_module_imports_the_lab():
    offenders = []
    for path in product_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if n == "lab" or n.startswith("lab.")]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                    and str(node.args[0].value).split(".")[0] == "lab":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.args[0].value}")
    assert offenders == []


def test_no_product_module_names_a_lab_path():
    """A path string under lab/ in product code (a file it would read or write) is the product reaching into the
    lab; docstrings and comments that mention the lab are allowed."""
    offenders = []
    for path in product_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and LAB_PATH.search(node.value):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert offenders == []


def _stage_paths(dvc: dict) -> list[tuple[str, str, str]]:
    out = []
    for name, st in (dvc.get("stages") or {}).items():
        body = st.get("do", st)
        for field in ("deps", "outs", "metrics", "plots"):
            for entry in body.get(field) or []:
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                out.append((name, field, str(path)))
        for entry in body.get("params") or []:
            if isinstance(entry, dict):
                out += [(name, "params", str(f)) for f in entry]
        out.append((name, "cmd", str(body.get("cmd", ""))))
    return out


def test_no_product_stage_depends_on_or_runs_the_lab():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    hits = [(s, f, p) for s, f, p in _stage_paths(dvc)
            if p == "lab" or LAB_PATH.search(p) or re.search(r"-m\s+lab\.", p)]
    assert hits == []


def test_the_lab_reads_the_product_outputs_it_needs():
    """The other direction is allowed, and real: the lab's stages depend on the product's data and features."""
    lab = yaml.safe_load((ROOT / "lab/dvc.yaml").read_text())
    deps = {p for _, f, p in _stage_paths(lab) if f == "deps"}
    # of the dataset the product's params.yaml names (lab/dvc.yaml reads data.name from it)
    assert {f"results/${{data.name}}/{p}" for p in ("data/processed", "data/tfidf", "metrics_val", "evaluation/val")} <= deps
    assert "../params.yaml:data" in lab["vars"]


def test_product_params_hold_product_knobs_only():
    text = (ROOT / "params.yaml").read_text()
    params = yaml.safe_load(text)
    assert len(text.splitlines()) <= 300
    assert not {"selection", "ablations", "seed_runs", "predictions", "reported", "validated", "methods",
                "packages"} & set(params)
    lab = yaml.safe_load((ROOT / "lab/params.yaml").read_text())
    # a run is registered once: every name of the lab's is its own, not a product run
    assert not set(lab["runs"]) & set(params["runs"])
