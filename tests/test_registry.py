"""The model registry on a real git + DVC repository: packages pushed to a DVC remote, versions and the prod
stage as GTO tags on the artifacts of dvc.yaml, the promotion gate on validation metrics, bare names that
resolve to the workspace's packages/<name>/ (artifact or not), and a fresh clone that predicts after
`dvc pull` without training."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gto.api
import pytest
import yaml

from tests.pipeline_repo import (results_of, ROOT, SEMCOR, assert_packages_predict_like_the_pipeline, env, make_repo, run,
                                 set_param, stages_run)
from tests.test_cli_serve import XMC
from xmc.config import load_params
from xmc.errors import ConfigError, DataFormatError
from xmc.package.registry import format_listing, gate, listing, promote, resolve

WORDNET = (ROOT / ".." / "shared" / "datasets" / "wordnet30").resolve()
needs_data = pytest.mark.skipif(not SEMCOR.exists() or not WORDNET.exists(),
                                reason="../shared/datasets/semcor-wn30 or wordnet30 not present")

BASELINES = ["label_prior", "tfidf_knn"]


def xmc_in(repo, *args, cache=None):
    e = {**env(), "XMC_REPO_DIR": "", "XMC_CACHE_DIR": str(cache or repo.parent / "xmc-cache")}
    return subprocess.run([*XMC, *args], cwd=repo, env=e, capture_output=True, text=True, timeout=300)


def commit(repo, msg):
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", msg], repo)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("registry")
    r = make_repo(base / "repo", extra_params={"runs": {m: {"method": m} for m in BASELINES}, "hybrids": {},
                                               "xr_linear": {}, "graph.wordnet_dir": str(WORDNET)})
    # the registry versions tfidf_knn: an artifact of dvc.yaml; label_prior is a package only
    dvc = yaml.safe_load((r / "dvc.yaml").read_text())
    dvc["artifacts"]["tfidf_knn"] = {"path": (results_of(r) / "packages/tfidf_knn").relative_to(r).as_posix(),
                                      "type": "model"}
    (r / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    run(["dvc", "remote", "add", "-d", "local", str(base / "remote")], r)
    commit(r, "tfidf_knn is an artifact")
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


P = "results/toy/packages"   # the workspace packages of the dataset the params below name


def _workspace(tmp_path: Path) -> Path:
    """A repository layout (dvc.yaml with artifacts, .dvc/, params.yaml, results/toy/packages/) without any DVC
    run: what resolve() reads to turn a bare name into a folder."""
    root = tmp_path / "ws"
    (root / ".dvc").mkdir(parents=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {}, "artifacts": {
        "astra": {"path": f"{P}/astra", "type": "model"},
        "elsewhere": {"path": "exported/elsewhere", "type": "model"}}}))
    (root / "params.yaml").write_text(yaml.safe_dump({"data": {"dataset_dir": "../datasets/toy"},
                                                      "runs": {"astra": {"method": "astra"},
                                                               "tfidf_knn": {"method": "tfidf_knn"}},
                                                      "hybrids": {"astra_hybrid": {"base": "astra"}}}))
    # another dataset's package of the same name: never what a bare name resolves to here
    for rel in (f"{P}/tfidf_knn", f"{P}/astra_hybrid", "exported/elsewhere", "tfidf_zeroshot",
                "results/other/packages/tfidf_knn"):
        (root / rel).mkdir(parents=True)
        (root / rel / "manifest.json").write_text("{}")
    return root


def test_bare_names_resolve_to_the_workspace_packages_artifact_or_not(tmp_path, monkeypatch):
    root = _workspace(tmp_path)
    monkeypatch.chdir(root)
    monkeypatch.delenv("XMC_REPO_DIR", raising=False)
    assert results_of(root) == root / "results/toy"
    assert resolve("tfidf_knn", root) == results_of(root) / "packages/tfidf_knn"          # not an artifact: still its package
    assert resolve("astra_hybrid", root) == results_of(root) / "packages/astra_hybrid"
    assert resolve("elsewhere", root) == root / "exported/elsewhere"          # an artifact's own path
    with pytest.raises(ConfigError, match=rf"'astra' is not in the workspace: `dvc pull {P}/astra` .*"
                                          r"`dvc repro package@astra` builds it"):
        resolve("astra", root)
    # a folder of the working directory: a path for the CLI, never for a registry-name-only lookup
    assert resolve("tfidf_zeroshot", root) == Path("tfidf_zeroshot")
    with pytest.raises(ConfigError, match=rf"no package {P}/tfidf_zeroshot/ .* no artifact 'tfidf_zeroshot'"):
        resolve("tfidf_zeroshot", root, paths=False)
    # versions and stages exist only for artifacts
    with pytest.raises(ConfigError, match="'tfidf_knn' is not an artifact of .*, so it has no stage 'prod' "
                                          rf"\(its workspace package is {P}/tfidf_knn/\)"):
        resolve("tfidf_knn#prod", root)
    with pytest.raises(ConfigError, match="so it has no version v1.2.3"):
        resolve("tfidf_knn@v1.2.3", root)
    rows = {r["name"]: r for r in listing(root)}
    assert set(rows) == {"astra", "elsewhere", "tfidf_knn", "astra_hybrid"}
    assert rows["tfidf_knn"]["workspace"] and not rows["tfidf_knn"]["artifact"]
    assert rows["astra"]["artifact"] and not rows["astra"]["workspace"] and rows["astra"]["stage"] == "package@astra"
    assert rows["astra_hybrid"]["stage"] == "fuse@astra_hybrid" and rows["elsewhere"]["path"] == "exported/elsewhere"
    text = format_listing(listing(root, "astra"))
    assert f"no (dvc pull {P}/astra, or dvc repro package@astra)" in text and "tfidf_knn" not in text
    with pytest.raises(ConfigError, match="'nope': no artifact of that name"):
        listing(root, "nope")


def test_an_artifact_of_one_dataset_is_not_promoted_from_a_checkout_of_another(tmp_path):
    root = _workspace(tmp_path)
    gate_cfg = {"max_drop": {"P@1": 1.0}, "allow_dataset_change": False, "allow_label_set_change": False}
    with pytest.raises(ConfigError, match=r"artifact 'astra' is the package of dataset 'toy' .* data\.name is "
                                          r"'other': promote it from a checkout of toy"):
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["data"]["name"] = "other"
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        promote(root, "astra", "prod", gate_cfg)
    # the other dataset's package, declared as an artifact of its own, passes the guard (to the package check:
    # here an empty manifest)
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())
    dvc["artifacts"]["tfidf_knn-other"] = {"path": "results/other/packages/tfidf_knn", "type": "model"}
    (root / "dvc.yaml").write_text(yaml.safe_dump(dvc))
    with pytest.raises(DataFormatError, match="results/other/packages/tfidf_knn/manifest.json: not an xmc-model"):
        promote(root, "tfidf_knn-other", "prod", gate_cfg)
    # an artifact kept outside results/<dataset>/packages is not namespaced: the guard lets it through to the
    # package check (here: an empty manifest)
    with pytest.raises(DataFormatError, match="exported/elsewhere/manifest.json: not an xmc-model-package manifest"):
        promote(root, "elsewhere", "prod", gate_cfg)


def test_the_batch_flow_loads_only_packages_under_packages(tmp_path, monkeypatch):
    """The batch-prediction flow's lookup: a name is results/<data.name>/packages/<name>/ or nothing; a folder
    must lie under some dataset's results/<name>/packages/; an artifact whose path lies elsewhere, a folder of the
    working directory or a symlink out of the packages is refused."""
    from flows.batch_predict import model_folder
    from flows.guard import ParameterRefused

    root = _workspace(tmp_path)
    monkeypatch.chdir(root)
    assert model_folder("tfidf_knn", root) == results_of(root) / "packages/tfidf_knn"
    assert model_folder(f"{P}/astra_hybrid", root) == (results_of(root) / "packages/astra_hybrid").resolve()
    other = root / "results/other/packages/tfidf_knn"
    assert model_folder("results/other/packages/tfidf_knn", root) == other.resolve()   # a folder: any dataset's
    with pytest.raises(ParameterRefused, match="outside"):
        model_folder("elsewhere", root)
    with pytest.raises(ConfigError, match=f"no package {P}/tfidf_zeroshot/"):
        model_folder("tfidf_zeroshot", root)
    (results_of(root) / "packages/linked").symlink_to(root / "tfidf_zeroshot")
    for spec in ("linked", f"{P}/linked", "exported/elsewhere", f"{P}/../../../tfidf_zeroshot", "results/toy"):
        with pytest.raises(ParameterRefused):
            model_folder(spec, root)


@needs_data
def test_push_promote_gate_and_predict_from_a_fresh_clone(repo, tmp_path, monkeypatch):
    ran = set(stages_run(run(["dvc", "repro", "package"], repo, timeout=900).stdout))
    assert {f"package@{m}" for m in BASELINES} <= ran
    assert_packages_predict_like_the_pipeline(repo, BASELINES)
    run(["dvc", "push", "package"], repo)
    commit(repo, "first packages")
    p = xmc_in(repo, "promote", "tfidf_knn")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["promote"] and res["assigned"] == "v0.1.0" and res["current_version"] is None
    first_val = json.loads((results_of(repo) / "packages/tfidf_knn/manifest.json").read_text())["metrics"]["val"]
    # a stage that is no stage name is refused before anything is registered (an empty one is not prod)
    tags = run(["git", "tag"], repo).stdout
    for bad in ("", "PROD", "..", "a#b"):
        p = xmc_in(repo, "promote", "tfidf_knn", "--stage", bad, "--force")
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "a stage is lower-case" in p.stderr, \
            (bad, p.stderr)
    assert run(["git", "tag"], repo).stdout == tags
    # a package that is no artifact is not versioned
    p = xmc_in(repo, "promote", "label_prior")
    assert p.returncode == 2 and "no artifact 'label_prior'" in p.stderr, p.stderr
    # ... but its name loads it from the dataset's packages
    (repo / "in.txt").write_text("he went to the bank to deposit his money\n")
    p = xmc_in(repo, "predict", "label_prior", "-k", "2", "--input", "in.txt")
    assert p.returncode == 0 and len(json.loads(p.stdout)["labels"]) == 2, p.stderr
    # a worse candidate (one neighbour votes): the gate keeps the current prod
    set_param(repo, "runs.tfidf_knn.n_neighbors", 1)
    assert "package@tfidf_knn" in stages_run(run(["dvc", "repro", "package"], repo, timeout=900).stdout)
    run(["dvc", "push", "package"], repo)
    commit(repo, "one neighbour")
    # a promote whose stage assignment fails removes the version it registered for it
    def refuse(*args, **kwargs):
        raise RuntimeError("assignment refused")

    monkeypatch.setattr(gto.api, "assign", refuse)
    tags = run(["git", "tag"], repo).stdout
    with pytest.raises(ConfigError, match="the version registered for it was removed"):
        promote(repo, "tfidf_knn", "prod", load_params(repo / "params.yaml")["registry"]["gate"], force=True)
    assert run(["git", "tag"], repo).stdout == tags
    monkeypatch.undo()
    p = xmc_in(repo, "promote", "tfidf_knn")
    res = json.loads(p.stdout)
    assert p.returncode == 4 and not res["promote"] and res["current_version"] == "v0.1.0", p.stdout + p.stderr
    assert any("below the current" in r for r in res["reasons"])
    p = xmc_in(repo, "registry")
    assert p.returncode == 0 and "tfidf_knn" in p.stdout and "v0.1.0" in p.stdout, p.stdout + p.stderr
    rows = {r["name"]: r for r in listing(repo)}
    assert rows["tfidf_knn"]["latest"] == "v0.1.0" and rows["tfidf_knn"]["stages"].get("prod") == "v0.1.0"
    assert rows["label_prior"]["workspace"] and not rows["label_prior"]["artifact"]
    # prod still serves the first version: fetched from the DVC cache into the package cache
    p = xmc_in(repo, "info", "tfidf_knn#prod", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"]["val"]["P@1"] == first_val["P@1"]
    assert json.loads(p.stdout)["params"]["n_neighbors"] != 1

    # a fresh clone predicts after `dvc pull`, without training
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    p = xmc_in(clone, "predict", "tfidf_knn", "--input", "-")
    pkg = (results_of(clone) / "packages/tfidf_knn").relative_to(clone).as_posix()
    assert p.returncode == 2 and f"dvc pull {pkg}" in p.stderr
    run(["dvc", "pull", pkg], clone)
    (clone / "in.txt").write_text("he went to the bank to deposit his money\n")
    p = xmc_in(clone, "predict", "tfidf_knn", "-k", "3", "--input", "in.txt", cache=tmp_path / "c2")
    assert p.returncode == 0 and len(json.loads(p.stdout)["labels"]) == 3, p.stderr
    assert not (results_of(clone) / "models").exists() and not (results_of(clone) / "data").exists()  # nothing trained
    p = xmc_in(clone, "predict", "#prod", "-k", "3", "--input", "in.txt", cache=tmp_path / "c2")
    assert p.returncode == 0 and len(json.loads(p.stdout)["labels"]) == 3, p.stderr
