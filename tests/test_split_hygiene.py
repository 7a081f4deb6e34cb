"""The test split is read only to report: no training, selection or feature stage may depend on it, and the
zero-shot methods read no training label.

Checks the real dvc.yaml, lab/dvc.yaml and params files of this repository through DVC's own stage index (foreach
expanded), so a stage added later with a test-split dependency fails here; the training plans (the only dependency
of a train@ stage) through the code that writes them; and what a stage opens by running it on a small real slice
under an audit hook, where a stage's declared dependency is a whole folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import yaml

from tests.pipeline_repo import ROOT, SEMCOR, env

REPO = ROOT

# stages allowed to read test files: data preparation (ingest writes the splits, validate checks them), packaging
# (predicts the validation and test texts with the package and evaluates both), the hybrids (the same for the
# fused run), the linear peer (predicts and evaluates), and the reports
TEST_READERS = {
    "dvc.yaml": {"ingest", "validate", "package", "fuse", "xr_linear", "report"},
    "lab/dvc.yaml": {"fuse", "ensemble", "xr_linear", "report_ablations", "report_seeds"},
}
# a stage that depends on a whole folder holding test material but reads only named files of it: the plans hash
# the files their runs' training reads (test_no_training_plan_names_a_test_file), the selection reads validation
# results only (test_the_selection_opens_no_test_file)
FOLDER_DEPS = {("dvc.yaml", "plan"): {"data/processed"}, ("lab/dvc.yaml", "plan"): {"data/processed"},
               ("lab/dvc.yaml", "selection"): {"lab/runs"}}
# outputs that hold test material: any dependency on them (or on a folder holding them) reads the test split;
# a package's manifest carries its test metrics, a lab run's folder its test predictions and metrics
TEST_MATERIAL = ("data/processed", "metrics", "plots/eval", "evaluation/tst", "packages", "lab/runs",
                 "reports/validation/summary.json", "reports/validation/report.html", "reports/comparison.md",
                 "reports/paired.json", "lab/reports/ablations.md", "lab/reports/paired_ablations.json")


def _file(stage) -> str:
    return Path(stage.dvcfile.path).resolve().relative_to(REPO).as_posix()


def _base(stage) -> str:
    return stage.name.split("@")[0]


def _reads_test(rel: str, dataset_dir: str) -> bool:
    parts = Path(rel).parts
    if any(p.startswith("tst") for p in parts) or rel == "data/processed/meta.json":
        return True
    if rel in TEST_MATERIAL or any(rel.startswith(m + "/") and not rel.startswith("data/processed/")
                                   for m in TEST_MATERIAL):
        return True
    if rel == "predictions" or (len(parts) == 2 and parts[0] == "predictions"):  # a whole predictions folder
        return True
    return rel == dataset_dir or rel in ("evaluation",)


@pytest.fixture(scope="module")
def dvc_index():
    from dvc.repo import Repo

    repo = Repo(str(REPO))
    try:
        yield repo.index
    finally:
        repo.close()


NAME = yaml.safe_load((REPO / "params.yaml").read_text())["data"]["name"]
# the namespace every output of a dataset lies in, dropped: the rules below name paths within it
NAMESPACES = ((f"results/{NAME}/", ""), (f"lab/results/{NAME}/", "lab/"), ("results/${data.name}/", ""),
              ("lab/results/${data.name}/", "lab/"))


def _in_namespace(rel: str) -> str:
    for prefix, to in NAMESPACES:
        if rel.startswith(prefix):
            return to + rel[len(prefix):]
    return rel


def _rel(path: str) -> str:
    return _in_namespace(os.path.relpath(os.path.realpath(path), os.path.realpath(REPO)))


def test_only_prediction_and_evaluation_stages_depend_on_test_files(dvc_index) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    dataset_dir = _rel(str(REPO / params["data"]["dataset_dir"]))
    files = {_file(s) for s in dvc_index.stages}
    assert files == set(TEST_READERS), files   # the product's pipeline and the lab's, nothing else
    offenders, folders = [], set()
    for stage in dvc_index.stages:
        where = (_file(stage), _base(stage))
        if where[1] in TEST_READERS[where[0]]:
            continue
        for dep in stage.deps:
            rel = _rel(dep.fs_path)
            if rel in FOLDER_DEPS.get(where, ()):
                folders.add((*where, rel))
            elif _reads_test(rel, dataset_dir):
                offenders.append(f"{where[0]}:{stage.name} depends on {rel}")
    assert not offenders, "stages that must not read the test split depend on it:\n" + "\n".join(offenders)
    assert folders == {(f, s, d) for (f, s), ds in FOLDER_DEPS.items() for d in ds}, folders   # none stale


def test_train_stages_depend_on_their_plan_only(dvc_index) -> None:
    trains = [s for s in dvc_index.stages if _base(s) in ("train", "run")]
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    assert {s.name for s in trains if _file(s) == "dvc.yaml"} == {f"train@{r}" for r in p["runs"]}
    for stage in trains:
        plan = "plans" if _file(stage) == "dvc.yaml" else "lab/plans"
        assert [_rel(d.fs_path) for d in stage.deps] == [f"{plan}/{stage.name.split('@')[1]}.json"], stage.name


def test_no_training_stage_is_downstream_of_a_test_reader(dvc_index) -> None:
    """Transitively too: nothing upstream of a training, plan or feature stage reads the test split, apart from the
    data preparation (ingest, validate) that writes and checks every split. (The selection sits downstream of the
    lab runs, which also predict test rows; test_the_selection_opens_no_test_file shows it reads only validation
    results.)"""
    graph = dvc_index.graph  # DVC: an edge stage -> the stage that produces one of its dependencies
    by_name = {(_file(s), s.name): s for s in dvc_index.stages}
    assert any(n.name == "ingest" for n in nx.descendants(graph, by_name[("dvc.yaml", "train@dexml_bow")])), \
        "graph direction changed: train@dexml_bow should reach ingest"
    prep = {("dvc.yaml", "ingest"), ("dvc.yaml", "validate")}
    readers = {(f, n) for f, names in TEST_READERS.items() for n in names} - prep
    offenders = []
    trains = [s for s in dvc_index.stages if _base(s) != "run" and any(
        _rel(o.fs_path).split("/")[0] in ("models", "checkpoints", "data", "plans") or
        _rel(o.fs_path).startswith("lab/plans") for o in s.outs)]
    assert len(trains) > 15
    for stage in trains:
        upstream = {(_file(s), _base(s)) for s in nx.descendants(graph, stage)}
        bad = sorted(upstream & readers)
        if bad:
            offenders.append(f"{stage.name} is downstream of {bad}")
    assert not offenders, "\n".join(offenders)


def test_the_checker_flags_a_test_dependency() -> None:
    """The rule itself: these paths read the test split, these do not."""
    ds = "../shared/datasets/semcor-wn30"
    for rel in ("data/processed", "data/processed/tst.jsonl", "data/processed/tst_Y.npz", "data/processed/meta.json",
                "metrics", "evaluation/tst", "predictions/dexml", "predictions/dexml/tst_topk.npz", ds,
                "reports/validation/summary.json", "packages/astra", "lab/runs", "lab/runs/astra_sgd"):
        assert _reads_test(rel, ds), rel
    for rel in ("data/processed/trn.jsonl", "data/processed/val_Y.npz", "data/processed/lbl.jsonl",
                "metrics_val", "evaluation/val", "predictions/dexml/val_topk.npz", "models/dexml",
                "reports/validation/gate.json", "data/maclr_pairs", "plans/astra.json", "lab/plans/astra_sgd.json"):
        assert not _reads_test(rel, ds), rel


def _all_runs():
    from lab.config import load_lab

    cfg = load_lab(REPO / "lab" / "params.yaml", REPO / "params.yaml")
    return {**cfg["product_specs"], **cfg["specs"]}, cfg


def test_no_training_plan_names_a_test_file(tmp_path) -> None:
    """A train@ stage reads what its plan names (xmc.methods.harness.training_inputs, hashed into the plan): for
    every product and lab run, never a test file; MACLR's zero-shot runs no label matrix and no processed split
    at all (their pseudo pairs only); the zero-shot name matcher, the off-the-shelf encoder and TF-IDF zero-shot
    no training split."""
    from xmc.methods import get_method
    from xmc.methods.harness import training_inputs
    from xmc.methods.plan import run_plan
    from xmc.workspace import Workspace

    ws = Workspace(tmp_path)
    runs, cfg = _all_runs()
    assert len(runs) > 60
    for name, run in runs.items():
        inputs = training_inputs(get_method(run.method), run.config, ws)
        rel = [p.relative_to(tmp_path).as_posix() for p in inputs]
        assert not any(Path(r).name.startswith("tst") for r in rel), (name, rel)
        assert all(r.startswith("data/") for r in rel), (name, rel)
        if run.method == "maclr":
            assert rel == ["data/maclr_pairs"], (name, rel)
        if run.method in ("pretrained", "tfidf_zeroshot") or (run.method == "name_match"
                                                               and run.config["ranking"] == "zero_shot"):
            assert not any(r.startswith("data/processed") for r in rel), (name, rel)
        if run.method in ("dexml", "astra", "unidec", "ramen"):   # supervised: trn, val (monitoring) and labels
            assert "data/processed/trn_Y.npz" in rel and "data/processed/val_Y.npz" in rel, name
    # the plan file holds exactly these inputs (with their hashes: a missing one is null)
    p = cfg["product_specs"]
    plan = run_plan(cfg["product"], p["maclr"], ws)
    assert plan["inputs"] == {(tmp_path / "data/maclr_pairs").as_posix(): None}
    assert not any("Y.npz" in k for k in run_plan(cfg["product"], p["name_match"], ws)["inputs"])
    assert set(run_plan(cfg["product"], p["name_match_prior"], ws)["inputs"]) == {
        (tmp_path / "data/processed" / f).as_posix() for f in ("lbl.jsonl", "trn.jsonl", "trn_Y.npz")}


def test_the_pseudo_pairs_stage_declares_no_label_matrix() -> None:
    """MACLR's zero-shot inputs: instance and label texts only (the stage's deps; what it opens is
    test_zero_shot_stages_open_no_label_matrix)."""
    st = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["maclr_pseudo_pairs"]
    data = [_in_namespace(d) for d in st["deps"] if _in_namespace(d).startswith("data/")]
    assert data and not any(d.endswith("_Y.npz") or "val" in d or "tst" in d or d == "data/processed" for d in data), data
    assert set(data) == {"data/processed/trn.jsonl", "data/processed/lbl.jsonl", "data/processed/source.json"}


# ------------------------------------------------------------------------------------------------
# what a stage opens, on a small real slice (an audit hook records every file opened)
AUDIT = r"""
import json, os, sys
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.path.realpath(os.fsdecode(args[0])))
code, record = sys.argv[1], sys.argv[2]
sys.addaudithook(hook)
try:
    exec(compile(code, "<stage>", "exec"), {"__name__": "__stage__"})
finally:
    with open(record, "w") as fh:
        fh.write(json.dumps(opened))
"""


def _opened(code: str, cwd: Path, under: Path) -> list[str]:
    """The files under ``under`` that ``code`` opens, run in a fresh interpreter in ``cwd``."""
    record = cwd / "opened.json"
    e = {**env(), "PYTHONPATH": str(REPO), "XMC_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", AUDIT, code, str(record)], cwd=cwd, env=e, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    root = os.path.realpath(under)
    return sorted({os.path.relpath(f, root) for f in json.loads(record.read_text()) if f.startswith(root + os.sep)})


@pytest.fixture(scope="module")
def processed(tmp_path_factory):
    """A small real slice of semcor-wn30 ingested into <root>/data/processed, and the params that read it."""
    from xmc.config.params import validate_params
    from xmc.features.ingest import ingest
    from xmc.workspace import Workspace

    root = tmp_path_factory.mktemp("hygiene")
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["data"]["dataset_dir"] = str(SEMCOR)
    raw["data"]["subsample"] = {"trn": 3, "tst": 1, "unit": "documents", "labels": "all"}
    params = validate_params(raw)
    ingest(params["data"], Workspace(root))
    (root / "params.json").write_text(json.dumps(params))
    return root


def test_zero_shot_stages_open_no_label_matrix(processed) -> None:
    """The pseudo-pairs stage opens the instance and label texts only (no *_Y.npz, no validation or test file); the
    zero-shot name-match run's training opens no processed file at all, while its prior ranking reads the
    training labels (so the audit sees what a stage reads)."""
    prelude = ("import json\nfrom xmc.workspace import Workspace\nparams = json.load(open('params.json'))\n"
               "ws = Workspace('.')\n")
    opened = _opened(prelude + "from xmc.features.maclr_pairs import build_maclr_pairs\nbuild_maclr_pairs(params, ws)\n",
                     processed, processed / "data")
    assert "processed/trn.jsonl" in opened and "processed/lbl.jsonl" in opened, opened
    assert not [f for f in opened if f.endswith("_Y.npz") or "val" in f or "tst" in f], opened
    assert (processed / "data/maclr_pairs").is_dir()
    train = (prelude + "from xmc.config.runs import resolve_run\nfrom xmc.methods.harness import train_run\n"
             "train_run(params, resolve_run(params, {name!r}), ws)\n")
    opened = _opened(train.format(name="name_match"), processed, processed / "data")
    assert opened == [], opened
    assert (processed / "models/name_match/model.json").is_file()
    opened = _opened(train.format(name="name_match_prior"), processed, processed / "data")
    assert "processed/trn_Y.npz" in opened and not [f for f in opened if "tst" in f or "val" in f], opened


def test_the_selection_opens_no_test_file(tmp_path) -> None:
    """lab.stages.selection in a repository where one choice's candidates have validation and test results, one
    in the product's folders and one in its lab run's: it decides the choice and opens no test file (test metrics,
    test contributions, test labels), though they sit beside the validation ones."""
    import shutil

    from xmc.metrics.bootstrap import instance_contributions
    from xmc.predictions import TopK
    from xmc.workspace import Workspace

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "lab").mkdir()
    shutil.copy2(REPO / "lab/params.yaml", tmp_path / "lab/params.yaml")
    shutil.copytree(REPO / "lab/seed_studies", tmp_path / "lab/seed_studies")
    rng = np.random.default_rng(0)
    n, L = 40, 12
    Y = {s: sp.csr_matrix((rng.random((n, L)) < 0.2).astype(np.float32)) for s in ("val", "tst")}
    product = tmp_path / "results" / NAME
    proc = Workspace(product).processed
    proc.mkdir(parents=True)
    for s in ("val", "tst"):
        sp.save_npz(proc / f"{s}_Y.npz", Y[s])
    freq = np.ones(L)
    for run, ws in (("xr_linear", Workspace(product)),
                    ("xr_linear_c1", Workspace(tmp_path / "lab/results" / NAME / "runs/xr_linear_c1"))):
        for s in ("val", "tst"):
            top = TopK(np.argsort(-rng.random((n, L)), 1)[:, :10].astype(np.int32), np.ones((n, 10), np.float32))
            c = instance_contributions(top, Y[s], freq, 100, recall_ks=(10,))
            c.save(ws.contributions(run, s))
            ws.metrics(run, s).parent.mkdir(parents=True, exist_ok=True)
            ws.metrics(run, s).write_text(json.dumps({**c.values(), "n_test": n}))
    opened = _opened("import sys\nsys.argv = ['selection']\nfrom lab.stages.selection import main\nmain()\n",
                     tmp_path, tmp_path)
    opened = [_in_namespace(f) for f in opened]
    assert "metrics_val/xr_linear.json" in opened and "lab/runs/xr_linear_c1/metrics_val/xr_linear_c1.json" in opened
    assert "evaluation/val/xr_linear.npz" in opened and "data/processed/val_Y.npz" in opened
    test_files = [f for f in opened if f.startswith("metrics/") or "/metrics/" in f or "tst" in f]
    assert not test_files, test_files
    report = json.loads((tmp_path / "lab/results" / NAME / "reports/selection.json").read_text())
    choice = next(c for c in report["choices"] if c["knob"] == "xr_linear: Cp and Cn")
    assert choice["complete"] and choice["chosen"] in ("1", "16")
