"""The method interface: one run lookup, one harness, one train and one package stage for every method.

Every run the shipped params.yaml and lab/params.yaml define resolves to a method implementing
:class:`xmc.methods.base.Method`; a run name defined twice is refused; the harness trains and packages a small
bag-of-words run in-process and what the package serves is what was evaluated; a run's plan lists exactly what its
training reads; and the structure the issue asked for holds (the shared trainer is constructed in one place per
method family, stages are thin)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from lab.config import load_lab, prediction_names
from tests.pipeline_repo import ROOT
from xmc.config import load_params
from xmc.config.runs import RUN_SCHEMAS, RunSpec, method_defaults, resolve_run, single_run
from xmc.errors import ConfigError
from xmc.io import pipeline_files
from xmc.methods import METHODS, get_method
from xmc.methods.base import Method, ranks_of
from xmc.methods.trainer_method import TrainerMethod


def _lab():
    return load_lab(ROOT / "lab" / "params.yaml", ROOT / "params.yaml")


def test_every_shipped_run_resolves_to_a_method_with_its_merged_settings():
    cfg = _lab()
    p, product, lab = cfg["product"], cfg["product_specs"], cfg["specs"]
    assert set(product) == set(p["runs"])
    assert {"dexml_bow", "minilm_zeroshot", "maclr", "ramen", "unidec", "astra", "label_prior", "tfidf_zeroshot",
            "tfidf_knn", "name_match"} <= set(product)
    assert {"dexml", "st_mnrl", "maclr_fs1", "astra_seed1", "dexml_bow_narrow"} <= set(lab)
    assert set(METHODS) == set(RUN_SCHEMAS)   # every method a run may name has a class, and no class lacks a schema
    for name, run in {**product, **lab}.items():
        assert isinstance(get_method(run.method), Method), name
        assert ranks_of(run) == 1, name   # the shipped runs train on one rank
    # overrides on top of the method's defaults
    assert lab["astra_seed1"].config["train"]["seed"] == 1
    assert lab["astra_seed1"].config["negatives"] == product["astra"].config["negatives"]
    assert product["dexml_bow"].config["encoder"]["kind"] == "bow"
    assert product["ramen"].config["regulariser"]["sets"] == method_defaults("ramen")["regulariser"]["sets"]
    # a lab run based on another lab run: the base's settings with its own overrides
    assert lab["dexml_bow_softmax"].config["encoder"] == lab["dexml_bow_narrow"].config["encoder"]
    assert lab["dexml_bow_softmax"].config["loss"]["name"] == "softmax"
    # the MNRL peer trains on the budget of the run it names
    assert lab["st_mnrl"].config["budget_of"] == "dexml"
    assert lab["st_mnrl"].config["train"] == lab["dexml"].config["train"]
    # every hybrid is a prediction of a product run; the hybrid's base may be another run than its name says
    for name, h in p["hybrids"].items():
        assert h["base"] in product, name
    assert p["hybrids"]["dexml_bow_hybrid"]["base"] == "dexml_bow_epochs10"
    assert product["dexml_bow_epochs10"].config["train"]["epochs"] == 10
    assert p["hybrids"]["maclr_valtuned_hybrid"]["fusion"] == "valtuned" and p["hybrids"]["maclr_hybrid"]["fusion"] == "trained"
    # UniDEC's spaces are predictions of one trained model
    assert prediction_names("unidec_spaces", cfg["entries"]["unidec_spaces"]) == ["unidec_de_only", "unidec_clf_only"]
    assert cfg["entries"]["unidec_spaces"]["from_model"] == "unidec" and "unidec_spaces" not in lab
    assert prediction_names("unidec_no_hard", cfg["entries"]["unidec_no_hard"]) == [
        "unidec_no_hard", "unidec_no_hard_de_only", "unidec_no_hard_clf_only"]


def test_each_method_says_what_serves_it_and_what_its_training_reads():
    kinds = {m: get_method(m).predictor_kind for m in METHODS}
    assert kinds["unidec"] == "unidec" and kinds["dexml"] == kinds["astra"] == kinds["maclr"] == "dense"
    assert kinds["tfidf_knn"] == "tfidf_knn" and kinds["name_match"] == "label_names"
    from xmc.package.predictor import PREDICTOR_KINDS

    assert set(kinds.values()) <= set(PREDICTOR_KINDS)
    assert get_method("maclr").features == ("maclr_pairs",) and get_method("ramen").features == ("graph",)
    assert get_method("maclr").splits_read(method_defaults("maclr")) == ()   # zero-shot: no processed split


def test_an_unknown_run_is_one_line_with_a_did_you_mean():
    p = load_params(ROOT / "params.yaml")
    with pytest.raises(ConfigError, match=r"no run 'dexml_bow_epoch10'.*did you mean 'dexml_bow_epochs10'"):
        resolve_run(p, "dexml_bow_epoch10")


def test_a_run_name_defined_twice_is_refused(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    twice = text.replace("  astra: {method: astra}\n", "  astra: {method: astra}\n  dexml_bow: {method: astra}\n", 1)
    assert twice != text
    (tmp_path / "params.yaml").write_text(twice)
    first = 1 + twice[: twice.index("  dexml_bow: {method: dexml}")].count("\n")
    again = 1 + twice[: twice.index("  dexml_bow: {method: astra}")].count("\n")
    with pytest.raises(ConfigError, match=rf"params.yaml:{again}: runs.dexml_bow: duplicate key \(first at line {first}\)"):
        load_params(tmp_path / "params.yaml")
    # a lab run may not take a product run's name (the lab's results of it would shadow the product's)
    lab = yaml.safe_load((ROOT / "lab" / "params.yaml").read_text())
    lab["runs"]["astra"] = {"method": "astra", "train": {"epochs": 1}}
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab, sort_keys=False))
    with pytest.raises(ConfigError, match=r"runs.astra: 'astra' is a product run \(lab runs need names of their own\)"):
        load_lab(tmp_path / "lab.yaml", ROOT / "params.yaml")


def test_a_run_from_a_product_model_names_a_product_run(tmp_path):
    """from_product runs start from (or predict with) a product run's model; the plain lab runs do not."""
    base = yaml.safe_load((ROOT / "lab" / "params.yaml").read_text())
    cases = (("from_product", "maclr_fs1", {"from_run": "maclr_fs5", "method": "maclr_fewshot"},
              r"from_product.maclr_fs1.from_run: 'maclr_fs5' is not a product run"),
             ("from_product", "maclr_fs1", {"method": "maclr_fewshot"},
              r"from_product.maclr_fs1: a run of from_product names its product run"),
             ("runs", "dexml_bow_fast", {"from_run": "dexml_bow", "method": "dexml"},
              r"runs.dexml_bow_fast: from_run: is for the runs of from_product"),
             ("from_product", "unidec_spaces", {"from_run": "unidec", "spaces": ["de"], "train": {"epochs": 1}},
              r"from_product.unidec_spaces: a run predicting with a product model takes no method settings"))
    for section, name, entry, error in cases:
        lab = yaml.safe_load(yaml.safe_dump(base))
        lab[section][name] = entry
        (tmp_path / "lab.yaml").write_text(yaml.safe_dump(lab, sort_keys=False))
        with pytest.raises(ConfigError, match=error):
            load_lab(tmp_path / "lab.yaml", ROOT / "params.yaml")
    cfg = load_lab(ROOT / "lab" / "params.yaml", ROOT / "params.yaml")
    assert cfg["specs"]["maclr_fs1"].config["init"] == "models/maclr"   # few-shot starts from the product's MACLR


def test_an_ensemble_member_must_be_a_product_run(tmp_path):
    raw = yaml.safe_load((ROOT / "lab" / "params.yaml").read_text())
    for members, error in ((["astra", "dexml_bow_ivf_mining_kmeans3"], "'dexml_bow_ivf_mining_kmeans3' is not a "
                                                                        "product run"),   # a val-only lab candidate
                           (["astra", "xr_linear"], "'xr_linear' is not a product run"),   # no predictor to fuse
                           (["astra", "astra_sead1"], "'astra_sead1' is not a product run")):
        raw["ensemble"]["members"] = members
        (tmp_path / "lab.yaml").write_text(yaml.safe_dump(raw))
        with pytest.raises(ConfigError, match=rf"ensemble.members.1: {error}"):
            load_lab(tmp_path / "lab.yaml", ROOT / "params.yaml")
    raw["ensemble"]["members"] = ["astra", "tfidf_knn"]   # any product run (each predicts val and tst)
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(raw))
    load_lab(tmp_path / "lab.yaml", ROOT / "params.yaml")


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


def test_only_the_data_parallel_methods_join_a_torchrun_launch():
    """A method that splits its training over ranks joins the process group; a one-process method launched by
    torchrun (a baseline, the MNRL peer) refuses with one line instead of training once per rank."""
    from xmc.methods.trainer_method import DataParallelMethod
    from xmc.ranks import DistContext

    parallel = {m for m in METHODS if isinstance(get_method(m), DataParallelMethod)}
    assert parallel == {"dexml", "ramen", "unidec", "astra", "maclr", "maclr_fewshot"}, parallel
    for name in ("label_prior", "name_match", "st_mnrl", "pretrained"):
        run = RunSpec(name, name)
        with pytest.raises(ConfigError, match=f"method '{name}' trains in one process.*rank 1 of 2"):
            get_method(name).join_ranks(run, DistContext(rank=1, world=2))


def test_one_harness_builds_the_trainer_and_stages_stay_thin():
    users = {str(p.relative_to(ROOT)) for p in (ROOT / "xmc").rglob("*.py") if _calls(p, "Trainer")}
    # the harness for every TrainerMethod, and MACLR's two stage trainers (Stage I on ICT pairs, pairs for
    # Stage II / few-shot) which the MACLR method composes
    assert users == {"xmc/methods/trainer_method.py", "xmc/maclr/train.py"}, users
    for p in [*(ROOT / "stages").glob("*.py"), *(ROOT / "lab" / "stages").glob("*.py")]:
        assert _calls(p, "Trainer") == 0 and _calls(p, "ANNIndex") == 0, p.name
    for old in ("train_astra", "train_unidec", "train_ramen", "predict_unidec", "predict", "index", "maclr",
                "maclr_fewshot", "selection", "label_prior"):
        assert not (ROOT / "stages" / f"{old}.py").exists(), old
    assert pipeline_files(ROOT) == [ROOT / "dvc.yaml"]
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert {"train", "package", "fuse", "plan", "xr_linear"} <= set(stages)
    for name, st in stages.items():
        cmd = (st.get("do") or st)["cmd"]
        if name == "xr_linear":   # the linear peer runs in its own environment, is evaluated in the main one
            assert cmd.startswith(".venv-pecos/bin/python -m stages.xr_linear train ${key}"), name
            continue
        assert cmd.split()[:3] == ["python", "-m", f"stages.{name}"], name   # one thin module per stage
        assert (ROOT / "stages" / f"{name}.py").is_file(), name
    assert stages["train"]["do"]["cmd"] == "python -m stages.train ${key}"
    assert stages["package"]["do"]["cmd"] == "python -m stages.package ${key}"
    for name, st in yaml.safe_load((ROOT / "lab" / "dvc.yaml").read_text())["stages"].items():
        module = (st.get("do") or st)["cmd"].split("-m ")[1].split()[0]
        assert module.startswith("lab.stages.") and (ROOT / (module.replace(".", "/") + ".py")).is_file(), name


def _tiny(tmp_path):
    import scipy.sparse as sp

    from xmc.data import Split, XMCDataset, save_processed
    from xmc.workspace import Workspace

    labels = ["river bank water", "money bank account", "green tree leaf", "red apple fruit"]
    texts = ["the river bank was full of water", "a bank account for money", "a leaf of a green tree",
             "an apple is a red fruit", "water in the river", "money in the account"] * 3
    rows = [0, 1, 2, 3, 0, 1] * 3
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (np.arange(len(rows)), rows)), shape=(len(rows), 4))

    def split(n: int) -> Split:
        return Split([f"u{i}" for i in range(n)], texts[:n], Y[:n])

    ds = XMCDataset(trn=split(12), val=split(6), tst=split(6), label_uids=[f"L{i}" for i in range(4)],
                    label_texts=labels, meta={"content_sha256": "x"})
    ws = Workspace(tmp_path)
    save_processed(ds, ws.processed)
    params = load_params(ROOT / "params.yaml")
    params["evaluate"]["bootstrap"]["n_resamples"] = 20
    run = single_run("dexml", {"encoder": {"kind": "bow", "dim": 8, "n_buckets": 1024, "ngram_max": 1},
                               "negatives": {"kind": "in_batch"},
                               "train": {"epochs": 2, "batch_size": 4, "lr": 0.05, "eval_every_epochs": 0,
                                         "checkpoint_interval_minutes": 0}}, params, name="tiny")
    return ds, ws, params, run


def test_harness_trains_packages_and_the_package_serves_the_same(tmp_path, monkeypatch):
    """A bag-of-words DEXML run on a tiny dataset: train_run -> models/tiny (summary, model.json), package_run ->
    packages/tiny + predictions/ + metrics; the package, loaded through the API, ranks like the predictions."""
    import xmc
    from xmc.methods.harness import MODEL_INFO, SUMMARY, train_run
    from xmc.package.build import package_run
    from xmc.predictions import TopK

    monkeypatch.chdir(tmp_path)
    ds, ws, params, run = _tiny(tmp_path)
    summary = train_run(params, run, ws)
    assert summary["method"] == "dexml" and summary["run"] == "tiny" and summary["epochs"] == 2 and summary["steps"] == 6
    assert json.loads((ws.model("tiny") / SUMMARY).read_text())["steps"] == 6
    info = json.loads((ws.model("tiny") / MODEL_INFO).read_text())
    assert {k: info[k] for k in ("run", "method", "predictor")} == {"run": "tiny", "method": "dexml",
                                                                    "predictor": "dense"}
    assert info["config"]["encoder"]["kind"] == "bow" and info["config"]["train"]["epochs"] == 2
    out = package_run(params, "tiny", ws, run_params=run.config)
    timing = out["timing"]
    assert timing["predictor"] == "dense" and set(timing["predict_seconds_by_split"]) == {"val", "tst"}
    assert set(out["metrics"]) == {"val", "tst"} and ws.metrics("tiny", "val").is_file() and ws.metrics("tiny", "tst").is_file()
    assert ws.contributions("tiny", "tst").is_file() and (ws.curves("tiny") / "at_k.json").is_file()
    ref = TopK.load(ws.predictions("tiny") / "tst_topk.npz")
    assert ref.indices.shape[0] == 6 and (ref.indices[:, :4] >= 0).all()
    pkg = xmc.load(str(ws.package("tiny")))
    assert pkg.method == "dexml" and pkg.info()["metrics"]["tst"]["P@1"] == out["metrics"]["tst"]["P@1"]
    D, I = pkg.topk(ds.tst.texts, 4)
    assert np.array_equal(I, ref.indices[:, :4].astype(I.dtype)) and np.allclose(D, ref.scores[:, :4], atol=1e-6)


def test_a_runs_plan_names_what_its_training_reads_and_the_code_it_imports(tmp_path):
    """plans/<run>.json: the run's settings, the hashes of the files its method reads and of the modules its
    training imports. A training run's code closure holds its method's module, not the package predictors (editing
    prediction code does not retrain), and the harness."""
    from xmc.methods.plan import REPO_ROOT, code_closure, run_plan

    ds, ws, params, run = _tiny(tmp_path)
    plan = run_plan(params, run, ws)
    assert plan["run"] == "tiny" and plan["method"] == "dexml" and plan["config"] == run.config
    assert set(plan["settings"]) == {"evaluate", "label_names", "index"}
    assert set(plan["inputs"]) == {(ws.processed / f).as_posix() for f in (
        "lbl.jsonl", "trn.jsonl", "trn_Y.npz", "val.jsonl", "val_Y.npz")}
    assert all(isinstance(h, str) and len(h) == 64 for h in plan["inputs"].values())
    code = set(plan["code"])
    assert {"xmc/methods/dual_encoder.py", "xmc/methods/harness.py", "stages/train.py", "xmc/trainer/trainer.py",
            "xmc/encoders/bow.py"} <= code
    assert "xmc/package/predictors.py" not in code and "xmc/package/build.py" not in code
    assert not any(f.startswith(("lab/", "xmc/report/")) for f in code)
    for method in ("dexml", "astra", "unidec", "ramen", "maclr"):
        module = METHODS[method].split(":")[0]
        files = {f.relative_to(REPO_ROOT).as_posix() for f in code_closure("stages.train", "xmc.methods.harness", module)}
        assert module.replace(".", "/") + ".py" in files, method
        assert "xmc/package/predictors.py" not in files, method
    # the plan is the same when nothing it names changes, and follows its inputs
    assert run_plan(params, run, ws) == plan
    # the intervals' resampling is evaluation's: a new bootstrap seed retrains nothing; a monitoring metric's
    # propensity (read by the per-epoch validation) does
    evaluate = dict(params.get("evaluate") or {})
    reseeded = {**params, "evaluate": {**evaluate, "bootstrap": {**evaluate.get("bootstrap", {}), "seed": 7}}}
    assert run_plan(reseeded, run, ws) == plan
    assert run_plan({**params, "evaluate": {**evaluate, "propensity_a": 0.6}}, run, ws)["settings"] != plan["settings"]
    (ws.processed / "val_Y.npz").write_bytes((ws.processed / "val_Y.npz").read_bytes() + b"\0")
    assert run_plan(params, run, ws)["inputs"] != plan["inputs"]


def test_a_new_field_of_a_section_no_training_reads_leaves_every_plan_as_it_was(monkeypatch):
    """xmc/config/schema.py stands in a plan as the schemas of the sections a training can read: a field added to
    the hybrids' section leaves the hash (and so every model) as it was; one added to the training section moves
    it. Every class of the module is either hashed or named as read by no training."""
    from pydantic import BaseModel, create_model

    import xmc.config.schema as S
    from xmc.methods import plan as P

    P.training_schema_hash.cache_clear()
    before = P.training_schema_hash()
    classes = {n for n, c in vars(S).items() if isinstance(c, type) and issubclass(c, BaseModel) and c.__module__ == S.__name__}
    assert set(P.SECTIONS_NO_TRAINING_READS) <= classes and {"TrainSection", "EncoderConfig", "IndexConfig"} <= classes
    for name, extra in (("HybridConfig", False), ("TrainSection", True)):
        grown = create_model(name, __base__=getattr(S, name), a_new_knob=(float, 1.0))
        grown.__module__ = S.__name__
        with monkeypatch.context() as m:
            m.setattr(S, name, grown)
            P.training_schema_hash.cache_clear()
            assert (P.training_schema_hash() != before) is extra, name
    P.training_schema_hash.cache_clear()
    assert P.training_schema_hash() == before


def test_set_threads_does_not_import_torch_and_applies_when_torch_loads():
    """A stage without an encoder sets the thread count without importing torch (~2 s); torch gets the count
    when something imports it later, and at once when it is already loaded."""
    import os
    import subprocess
    import sys

    code = ("import sys\n"
            "from xmc.machine import set_threads\n"
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
            "from xmc.machine import set_threads\n"
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
