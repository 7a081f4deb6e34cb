"""Serving without training code: loading a model package and predicting with it, for every kind of package,
imports none of the training packages (the trainer, the methods, the negative samplers, the losses). And the
library has no import cycles among its modules' top-level imports."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_repo import SEMCOR, write_semcor_slice

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ("xmc.trainer", "xmc.methods", "xmc.negatives", "xmc.losses", "xmc.maclr.train", "xmc.api", "lab")
SMALL_BOW = {"kind": "bow", "dim": 32, "n_buckets": 4096, "ngram_max": 2, "tied": True, "dropout": 0.0}
RUNS = {
    "dexml_bow": {"method": "dexml", "encoder": SMALL_BOW, "train": {"epochs": 1}},
    "astra": {"method": "astra", "encoder": SMALL_BOW, "train": {"epochs": 1},
              "negatives": {"hard_negatives": 4, "uniform_negatives": 8, "start_epoch": 5}},
    "unidec": {"method": "unidec", "encoder": SMALL_BOW, "model": {"dim": 16}, "train": {"epochs": 1}},
    "minilm_zeroshot": {"method": "pretrained", "encoder": {"max_len_query": 16, "max_len_label": 16}},
    "tfidf_zeroshot": {"method": "tfidf_zeroshot"},
    "tfidf_knn": {"method": "tfidf_knn"},
    "label_prior": {"method": "label_prior"},
    "name_match_prior": {"method": "name_match", "ranking": "prior"},
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """Every kind of package on a small real slice: dense (bag of words, ASTRA, MiniLM), UniDEC, the TF-IDF
    baselines, the label prior, the label-name retriever, a TF-IDF shortlist, a hybrid and an ensemble."""
    if not SEMCOR.exists():
        pytest.skip("../shared/datasets/semcor-wn30 not present")
    from xmc.config.params import validate_params
    from xmc.config.runs import resolve_runs
    from xmc.features.ingest import ingest
    from xmc.features.tfidf import build_tfidf
    from xmc.methods.harness import train_run
    from xmc.package.build import package_run
    from xmc.package.fuse import fuse
    from xmc.workspace import Workspace

    tmp = tmp_path_factory.mktemp("serving")
    data = write_semcor_slice(tmp / "data", n_trn=300, n_tst=50)
    # the labels of the slice only (~2k of 25,819): the MiniLM package encodes every label text, and what this file
    # checks (the modules a package imports, its links) does not depend on how many labels there are
    params = validate_params({"data": {"dataset_dir": str(data), "subsample": {"labels": "used"}}, "runs": RUNS,
                              "graph": {"wordnet_dir": None, "wordnet": {"enabled": False}}})
    ws = Workspace(tmp / "ws")
    ingest(params["data"], ws)
    build_tfidf(params, ws)
    specs, problems = resolve_runs(RUNS, params)
    assert not problems
    for name, spec in specs.items():
        train_run(params, spec, ws)
        package_run(params, name, ws)
    # a dense run ranking a TF-IDF shortlist (what an index above index.auto_exact_max labels may do)
    shortlist = {**params, "index": {**params["index"], "kind": "ivf", "shortlist": "tfidf", "shortlist_k": 200}}
    package_run(shortlist, "dexml_bow_shortlist", ws, model_dir=ws.model("dexml_bow"), run_params=specs["dexml_bow"].config)
    fuse(params, "astra_hybrid", ["astra"], ws)
    fuse(params, "ensemble_hybrid", ["astra", "unidec", "tfidf_knn"], ws)
    kinds = {}
    for p in sorted((ws.root / "packages").iterdir()):
        kinds[p.name] = json.loads((p / "manifest.json").read_text())["predictor"]["kind"]
    return ws.root / "packages", kinds


def test_every_package_kind_is_built(packages):
    _, kinds = packages
    assert set(kinds.values()) == {"dense", "unidec", "tfidf_zeroshot", "tfidf_knn", "label_prior", "label_names",
                                   "shortlist", "hybrid"}


def test_loading_and_predicting_imports_no_training_code(packages):
    root, kinds = packages
    script = f"""
import json, sys
import xmc.package
from xmc.package import load
names = {sorted(kinds)!r}
for name in names:
    pkg = load({str(root)!r} + "/" + name)
    preds = pkg.predict(["He went to the bank to deposit his pay."], k=3)
    assert len(preds[0]) == 3, name
print(json.dumps(sorted(sys.modules)))
"""
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-3000:]
    loaded = json.loads(p.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith(TRAINING)] == []
    assert "xmc.package" in loaded and "xmc.models.unidec" in loaded


def test_every_package_loads_and_predicts_without_scikit_learn(packages):
    """No predictor imports scikit-learn (nor the scipy.stats and pandas it pulls in, 2.5 s of every cold start): a
    TF-IDF package embeds its texts with xmc.tfidf, a hybrid scores its fusion from plain arrays; the
    dense and UniDEC predictors import no TF-IDF or hybrid module at all."""
    root, kinds = packages
    script = """
import json, sys
from xmc.package import load
for path in sys.argv[1:]:
    load(path).predict(["He went to the bank to deposit his pay."], k=3)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("sklearn", "pandas")
                        or m in ("scipy.stats", "xmc.package.lexical_predictors", "xmc.lexical.fusion_fit"))))
"""
    names = sorted(kinds)
    assert {"tfidf_knn", "tfidf_zeroshot", "label_prior", "astra_hybrid", "ensemble_hybrid",
            "dexml_bow_shortlist"} <= set(names), names
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", script, *[str(root / n) for n in names]], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == ["xmc.package.lexical_predictors"], kinds
    for name in ("dexml_bow", "astra", "unidec"):
        p = subprocess.run([sys.executable, "-c", script, str(root / name)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads(p.stdout.strip().splitlines()[-1]) == [], (name, kinds[name])


def test_the_baselines_plan_train_package_and_predict_without_torch(packages):
    """A run that trains no network pays for no torch import (about 2 s of every process on a busy 2-core box): the
    plan, train, package, fuse and evaluate stages, the baselines' methods and their packages load without it."""
    root, kinds = packages
    lexical = sorted(n for n, kind in kinds.items() if kind in ("tfidf_zeroshot", "tfidf_knn", "label_prior", "label_names"))
    assert {"tfidf_knn", "tfidf_zeroshot", "label_prior", "name_match_prior"} <= set(lexical), kinds
    script = """
import json, sys
import stages.plan, stages.train, stages.package, stages.fuse, stages.evaluate, stages.report
import xmc.methods.harness, xmc.package.build
from xmc.methods import get_method
from xmc.package import load
for name in ("label_prior", "tfidf_zeroshot", "tfidf_knn", "name_match"):
    get_method(name)
for path in sys.argv[1:]:
    assert len(load(path).predict(["He went to the bank to deposit his pay."], k=3)[0]) == 3, path
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "torch")))
"""
    p = subprocess.run([sys.executable, "-c", script, *[str(root / n) for n in lexical]], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def _top_level_imports(path: Path, module: str) -> set[str]:
    """The xmc modules imported at module level (inside if/try blocks too, not in functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return {m for m in out if m.split(".")[0] == "xmc"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in (ROOT / "xmc").rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def test_no_import_cycles_in_the_library():
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for imp in _top_level_imports(path, name):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                deps.add(imp)
        graph[name] = deps
    # strongly connected components (Tarjan)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_a_hybrid_package_holds_its_bases_by_hard_links_and_a_copy_predicts_alone(packages, tmp_path):
    """One copy on disk: a hybrid's and an ensemble's packages hold their bases' files as hard links of the base
    packages' (and those of the trained models'). A copied package is self-contained (a package reads nothing outside its
    folder): it predicts the same from its new place."""
    import shutil

    from xmc.package import load

    root, _ = packages
    for name, base in (("astra_hybrid", "base/encoder/bow_encoder.pt"),
                       ("ensemble_hybrid", "bases/astra/encoder/bow_encoder.pt")):
        linked = root / name / base
        assert linked.stat().st_ino == (root / "astra/encoder/bow_encoder.pt").stat().st_ino, name
        assert linked.stat().st_nlink >= 3   # the trained model's file, the base package's and this one
        texts = ["He went to the bank to deposit his pay.", "The river bank was muddy."]
        before = load(root / name).topk(texts, k=5)
        copy = tmp_path / name
        shutil.copytree(root / name, copy)
        assert copy.joinpath(base).stat().st_ino != linked.stat().st_ino   # a real copy of the bytes
        after = load(copy).topk(texts, k=5)
        assert (before[1] == after[1]).all() and (before[0] == after[0]).all()
