"""The model registry on a real git + DVC repository: packages pushed to a DVC remote, versions and the prod
stage as GTO tags, the promotion gate on validation metrics, and a fresh clone that predicts after
`dvc pull` without training."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.pipeline_repo import (PACKAGES, SEMCOR, assert_packages_predict_like_the_pipeline, env, make_repo, run, set_param,
                                 stages_run)
from tests.test_cli_serve import XMC
from xmc.package.registry import gate

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

BASELINES = ["label_prior", "tfidf_zeroshot", "tfidf_knn"]


def xmc_in(repo, *args, cache=None):
    e = {**env(), "XMC_REPO_DIR": "", "XMC_CACHE_DIR": str(cache or repo.parent / "xmc-cache")}
    return subprocess.run([*XMC, *args], cwd=repo, env=e, capture_output=True, text=True, timeout=300)


def commit(repo, msg):
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", msg], repo)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("registry")
    r = make_repo(base / "repo", extra_params={"methods": BASELINES})
    run(["dvc", "remote", "add", "-d", "local", str(base / "remote")], r)
    return r


def test_gate_decisions():
    def m(p1, p5, psp5, data="d", labels="l"):
        return {"metrics": {"val": {"P@1": p1, "P@5": p5, "PSP@5": psp5}}, "dataset": {"sha256": data},
                "labels": {"sha256": labels}}

    cfg = {"max_drop": {"P@1": 0.5, "P@5": 0.5, "PSP@5": 0.5}}
    assert gate(m(50, 30, 20), None, cfg).promote
    assert gate(m(49.6, 30, 20), m(50, 30, 20), cfg).promote           # within the margin
    d = gate(m(49.4, 31, 21), m(50, 30, 20), cfg)
    assert not d.promote and "P@1 49.40 is more than 0.5 below the current 50.00" in " ".join(d.reasons)
    assert not gate(m(60, 40, 30, data="other"), m(50, 30, 20), cfg).promote   # different data: not comparable
    assert gate(m(60, 40, 30, data="other"), m(50, 30, 20), {**cfg, "allow_dataset_change": True}).promote
    assert not gate(m(60, 40, 30, labels="x"), m(50, 30, 20), cfg).promote
    assert not gate({"metrics": {}}, None, cfg).promote                  # no validation metrics: refused


def test_push_promote_gate_and_predict_from_a_fresh_clone(repo, tmp_path):
    ran = set(stages_run(run(["dvc", "repro", PACKAGES], repo, timeout=900).stdout))
    assert {f"package@{m}" for m in BASELINES} <= ran
    assert_packages_predict_like_the_pipeline(repo, BASELINES)
    run(["dvc", "push", PACKAGES], repo)
    commit(repo, "first packages")
    p = xmc_in(repo, "promote", "tfidf_knn")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["promote"] and res["assigned"] == "v0.1.0" and res["current_version"] is None
    first_val = json.loads((repo / "packages/tfidf_knn/manifest.json").read_text())["metrics"]["val"]
    # a worse candidate (one neighbour votes): the gate keeps the current prod
    set_param(repo, "tfidf_knn.n_neighbors", 1)
    assert "package@tfidf_knn" in stages_run(run(["dvc", "repro", PACKAGES], repo, timeout=900).stdout)
    run(["dvc", "push", PACKAGES], repo)
    commit(repo, "one neighbour")
    p = xmc_in(repo, "promote", "tfidf_knn")
    res = json.loads(p.stdout)
    assert p.returncode == 4 and not res["promote"] and res["current_version"] == "v0.1.0", p.stdout + p.stderr
    assert any("below the current" in r for r in res["reasons"])
    p = xmc_in(repo, "registry")
    assert p.returncode == 0 and "tfidf_knn" in p.stdout and "v0.1.0" in p.stdout, p.stdout + p.stderr
    # prod still serves the first version: fetched from the DVC cache into the package cache
    p = xmc_in(repo, "info", "tfidf_knn#prod", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"]["val"]["P@1"] == first_val["P@1"]
    assert json.loads(p.stdout)["params"]["tfidf_knn"]["n_neighbors"] != 1

    # a fresh clone predicts after `dvc pull`, without training
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    p = xmc_in(clone, "predict", "tfidf_knn", "--input", "-")
    assert p.returncode == 2 and "dvc pull packages/tfidf_knn" in p.stderr
    run(["dvc", "pull", "packages/tfidf_knn"], clone)
    (clone / "in.txt").write_text("he went to the bank to deposit his money\n")
    p = xmc_in(clone, "predict", "tfidf_knn", "-k", "3", "--input", "in.txt", cache=tmp_path / "c2")
    assert p.returncode == 0 and len(json.loads(p.stdout)["labels"]) == 3, p.stderr
    assert not (clone / "models").exists() and not (clone / "data").exists()  # nothing trained
    p = xmc_in(clone, "predict", "#prod", "-k", "3", "--input", "in.txt", cache=tmp_path / "c2")
    assert p.returncode == 0 and len(json.loads(p.stdout)["labels"]) == 3, p.stderr
