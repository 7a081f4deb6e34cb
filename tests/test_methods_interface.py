"""The method interface: one run lookup, one harness, one train and one predict stage for every method.

Every run the shipped params.yaml defines resolves to a method implementing :class:`xmc.methods.base.Method`;
a run name defined twice is refused; the harness trains and predicts a small bag-of-words run in-process and
what it writes is what the model package serves; and the structure the issue asked for holds (the shared
trainer is constructed in one place per method family, stages are thin)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.pipeline_repo import ROOT
from xmc.config import load_params
from xmc.errors import ConfigError
from xmc.io import pipeline_files
from xmc.methods import METHODS, get_method
from xmc.methods.base import Method, TrainerMethod, find_prediction
from xmc.methods.runs import all_runs, find_run


def test_every_shipped_run_resolves_to_a_method_with_its_merged_settings():
    p = load_params(ROOT / "params.yaml")
    runs = all_runs(p)
    assert {"dexml", "dexml_bow", "st_mnrl", "minilm_zeroshot", "maclr", "maclr_fs1", "ramen", "unidec", "astra",
            "label_prior", "tfidf_zeroshot", "tfidf_knn"} <= set(runs)
    for name, method in runs.items():
        run = find_run(p, name)
        assert run.method == method and isinstance(get_method(method), Method), name
    # overrides on top of the method's defaults
    assert find_run(p, "astra_seed1").config["train"]["seed"] == 1
    assert find_run(p, "astra_seed1").config["negatives"] == find_run(p, "astra").config["negatives"]
    assert find_run(p, "dexml_bow").config["encoder"]["kind"] == "bow"
    assert find_run(p, "ramen").config["regulariser"]["sets"] == p["ramen"]["defaults"]["regulariser"]["sets"]
    # the MNRL peer trains on the budget of the run it names
    assert find_run(p, "st_mnrl").config["train"] == find_run(p, p["st_mnrl"]["budget_of"]).config["train"]
    # every package is a prediction of some run; UniDEC's spaces are variants of one run
    ens = p["hybrid"]["ensemble"]
    for name in p["packages"]:
        if name == ens["name"]:   # the ensemble hybrid: its package describes every member run (stages/package.py)
            assert len(ens["members"]) >= 2 and set(ens["members"]) <= set(p["hybrid"]["runs"])
            continue
        run, method, options = find_prediction(p, name)
        stem = name.removesuffix("_hybrid").removesuffix("_zs") if "hybrid" in options else name
        # a hybrid is a prediction of its base run (hybrid.runs), the run itself unless the hybrid chose another
        base = p["hybrid"]["runs"][stem] if name.endswith("_hybrid") and not name.endswith("_zs_hybrid") else stem
        assert base in method.prediction_variants(run), name
    assert "hybrid" in find_prediction(p, "astra_hybrid")[2] and "hybrid" not in find_prediction(p, "astra")[2]
    assert find_prediction(p, "dexml_bow_hybrid")[0].name == p["hybrid"]["runs"]["dexml_bow"] == "dexml_bow_epochs10"
    assert find_prediction(p, "dexml_bow_hybrid")[0].config["train"]["epochs"] == 10
    assert find_prediction(p, "maclr_zs_hybrid")[2]["hybrid"]["zero_shot"] is True
    assert find_prediction(p, "maclr_hybrid")[2]["hybrid"]["zero_shot"] is False
    assert find_prediction(p, "unidec_de_only")[2] == {"space": "de"}


def test_an_unknown_run_is_one_line_with_a_did_you_mean():
    p = load_params(ROOT / "params.yaml")
    with pytest.raises(ConfigError, match=r"no run 'astra_sed1'.*did you mean 'astra_seed1'"):
        find_run(p, "astra_sed1")


def test_a_run_name_defined_twice_is_refused(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["astra"]["runs"]["dexml_bow"] = {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"run 'dexml_bow' is defined more than once \(runs.dexml_bow, astra.runs.dexml_bow\)"):
        load_params(tmp_path / "params.yaml")


def test_an_ensemble_member_must_be_a_run_predicting_both_splits(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for members, error in ((["astra", "dexml_bow_ivf_mining_kmeans3"], "'dexml_bow_ivf_mining_kmeans3' must predict "
                                                                        r"both val and tst"),   # a val-only candidate
                           (["astra", "xr_linear"], "'xr_linear' has no predictor"),
                           (["astra", "astra_sead1"], r"'astra_sead1' is not a run of any method \(did you mean "
                                                      r"'astra_seed1'\?\)")):
        raw["hybrid"]["ensemble"]["members"] = members
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        with pytest.raises(ConfigError, match=rf"hybrid.ensemble.members.1: {error}"):
            load_params(tmp_path / "params.yaml")
    raw["hybrid"]["ensemble"]["members"] = ["astra", "dexml_bow_seed1"]   # any run predicting val and tst
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    load_params(tmp_path / "params.yaml")


def test_the_registry_lists_every_method_once_and_trainer_methods_only_build():
    classes = {type(get_method(m)) for m in METHODS}
    assert len(classes) == len(METHODS)
    for cls in classes:
        if issubclass(cls, TrainerMethod):
            assert "train" not in cls.__dict__, f"{cls.__name__} re-implements the shared harness"


def _calls(path: Path, name: str) -> int:
    tree = ast.parse(path.read_text())
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call)
               and getattr(n.func, "id", getattr(n.func, "attr", None)) == name)


def test_one_harness_builds_the_trainer_and_stages_stay_thin():
    users = {str(p.relative_to(ROOT)) for p in (ROOT / "xmc").rglob("*.py") if _calls(p, "Trainer")}
    # the harness for every TrainerMethod, and MACLR's two stage trainers (Stage I on ICT pairs, pairs for
    # Stage II / few-shot) which the MACLR method composes
    assert users == {"xmc/methods/base.py", "xmc/maclr/train.py"}, users
    for p in (ROOT / "stages").glob("*.py"):
        assert _calls(p, "Trainer") == 0 and _calls(p, "ANNIndex") == 0, p.name
    for old in ("train_astra", "train_unidec", "train_ramen", "predict_unidec", "index", "maclr", "maclr_fewshot"):
        assert not (ROOT / "stages" / f"{old}.py").exists(), old
    stages = {name: st for f in pipeline_files(ROOT) for name, st in yaml.safe_load(f.read_text())["stages"].items()}
    assert {"train", "predict", "predict_unidec", "label_prior", "tfidf_knn"} <= set(stages)
    for name, st in stages.items():
        cmd = (st.get("do") or st)["cmd"]
        if name in ("train_xr_linear", "predict_xr_linear"):   # the linear peer runs in its own environment
            assert cmd.startswith(".venv-pecos/bin/python -m stages.xr_linear "), name
            continue
        if name.startswith("train"):
            assert cmd.startswith("python -m stages.train "), name
        if name.startswith("predict") or name in (
                "label_prior", "tfidf_zeroshot", "tfidf_knn", "name_match", "name_match_prior"):
            assert cmd.startswith("python -m stages.predict "), name


def test_harness_trains_predicts_and_the_package_serves_the_same(tmp_path, monkeypatch):
    """A bag-of-words DEXML run on a tiny dataset: train_run -> models/, predict_run -> indexes/ + predictions/,
    the package around indexes/ ranks like the predictions."""
    import scipy.sparse as sp

    import xmc
    from xmc.data import Split, XMCDataset, save_processed
    from xmc.methods.base import predict_run, train_run
    from xmc.package import package_from_predictor
    from xmc.predictions import TopK

    labels = ["river bank water", "money bank account", "green tree leaf", "red apple fruit"]
    texts = ["the river bank was full of water", "a bank account for money", "a leaf of a green tree",
             "an apple is a red fruit", "water in the river", "money in the account"] * 3
    rows = [0, 1, 2, 3, 0, 1] * 3
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (np.arange(len(rows)), rows)), shape=(len(rows), 4))

    def split(n: int) -> Split:
        return Split([f"u{i}" for i in range(n)], texts[:n], Y[:n])

    ds = XMCDataset(trn=split(12), val=split(6), tst=split(6), label_uids=[f"L{i}" for i in range(4)],
                    label_texts=labels, meta={"content_sha256": "x"})
    monkeypatch.chdir(tmp_path)
    save_processed(ds, tmp_path / "data/processed")
    params = load_params(ROOT / "params.yaml")
    params["data"]["processed_dir"] = "data/processed"
    params["runs"]["tiny"] = {"encoder": {"kind": "bow", "dim": 8, "n_buckets": 1024, "ngram_max": 1},
                              "negatives": {"kind": "in_batch"},
                              "train": {"epochs": 2, "batch_size": 4, "lr": 0.05, "eval_every_epochs": 0}}
    summary = train_run(params, "tiny", tmp_path)
    assert summary["method"] == "dexml" and summary["epochs"] == 2 and summary["steps"] == 6
    assert json.loads((tmp_path / "models/tiny/train_summary.json").read_text())["steps"] == 6
    timing = predict_run(params, "tiny", ("val", "tst"), tmp_path)["tiny"]
    assert timing["predictor"] == "dense" and set(timing["predict_seconds_by_split"]) == {"val", "tst"}
    ref = TopK.load(tmp_path / "predictions/tiny/tst_topk.npz")
    assert ref.indices.shape[0] == 6 and (ref.indices[:, :4] >= 0).all()
    package_from_predictor(tmp_path / "packages/tiny", tmp_path / "indexes/tiny", name="tiny", method="dexml",
                           label_uids=ds.label_uids, label_texts=labels, repo=tmp_path)
    D, I = xmc.load(str(tmp_path / "packages/tiny")).topk(ds.tst.texts, 4)
    assert np.array_equal(I, ref.indices[:, :4].astype(I.dtype)) and np.allclose(D, ref.scores[:, :4], atol=1e-6)


def test_set_threads_does_not_import_torch_and_applies_when_torch_loads():
    """A stage without an encoder sets the thread count without importing torch (~2 s); torch gets the count
    when something imports it later, and at once when it is already loaded."""
    import os
    import subprocess
    import sys

    code = ("import sys\n"
            "from xmc.methods.base import set_threads\n"
            "set_threads()\n"
            "assert 'torch' not in sys.modules\n"
            "import torch\n"
            "assert torch.get_num_threads() == 1, torch.get_num_threads()\n"
            "assert not any(type(f).__name__ == '_ThreadsWhenTorchLoads' for f in sys.meta_path)\n"
            "import os; os.environ['XMC_THREADS'] = '2'\n"
            "set_threads()\n"
            "assert torch.get_num_threads() == 2, torch.get_num_threads()\n")
    env = {**os.environ, "XMC_THREADS": "1", "OMP_NUM_THREADS": "2"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_set_threads_shortens_the_openmp_spin_unless_the_user_set_one():
    """Stages set GOMP_SPINCOUNT before torch loads (libgomp reads it then), for their child processes too; a
    GOMP_SPINCOUNT or OMP_WAIT_POLICY of the user's is left as it is."""
    import os
    import subprocess
    import sys

    from xmc.machine import OPENMP_SPIN_COUNT

    code = ("import os, subprocess, sys\n"
            "from xmc.methods.base import set_threads\n"
            "set_threads()\n"
            "assert 'torch' not in sys.modules\n"
            "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))\n"
            "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"GOMP_SPINCOUNT\"))'],\n"
            "                       capture_output=True, text=True, check=True)\n"
            "print(child.stdout.strip())\n")
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    seen = {}
    for case, extra in {"unset": {}, "spin": {"GOMP_SPINCOUNT": "7"}, "policy": {"OMP_WAIT_POLICY": "ACTIVE"}}.items():
        p = subprocess.run([sys.executable, "-c", code], env={**base, **extra}, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        seen[case] = p.stdout.split()
    assert seen["unset"] == [str(OPENMP_SPIN_COUNT), "None", str(OPENMP_SPIN_COUNT)]
    assert seen["spin"] == ["7", "None", "7"]
    assert seen["policy"] == ["None", "ACTIVE", "None"]
