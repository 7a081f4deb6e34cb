"""Build a throw-away git + DVC repository holding this project on a small real slice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from xmc.io import stage_from_address

ROOT = Path(__file__).resolve().parents[1]
SEMCOR = (ROOT / ".." / "shared" / "datasets" / "semcor-wn30").resolve()
PROJECT_FILES = ["xmc", "stages", "flows", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".gto"]
LAB_FILES = ["lab"]   # copied with lab=True: the lab reads the product, so a lab test needs both


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = ""  # the copy's own xmc/ must be the one imported (cwd is on sys.path with -m)
    e.update({"DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
              "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "GX_ANALYTICS_ENABLED": "False",
              "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
              "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"})
    return e


def run(cmd: list[str], cwd: Path, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def set_param(repo: Path, dotted: str, value: Any) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    node = params
    *parents, last = dotted.split(".")
    for k in parents:
        node = node[k]
    node[last] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def make_repo(dest: Path, dataset_dir: Path = SEMCOR, trn_docs: int = 3, tst_docs: int = 1,
              labels: str = "all", extra_params: dict[str, Any] | None = None, lab: bool = False) -> Path:
    """A copy of the project (the lab too with ``lab``) on the first ``trn_docs`` / ``tst_docs`` documents of
    ``dataset_dir``. ``extra_params``: dotted keys of params.yaml set after the copy (``runs``, ``hybrids`` and
    ``xr_linear`` narrow the pipeline to what a test needs)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES + (LAB_FILES if lab else []):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns(
                "__pycache__", "dvc.lock", "runs", "plans", "checkpoints", ".scale", ".sparse_dense"))
        else:
            shutil.copy2(src, dest / name)
    if (ROOT / ".venv-pecos").is_dir():  # the linear peer's environment (make setup), shared with the checkout
        (dest / ".venv-pecos").symlink_to(ROOT / ".venv-pecos")
    set_param(dest, "data.dataset_dir", str(dataset_dir))
    set_param(dest, "data.name", Path(dataset_dir).name)   # its outputs: results/<folder name>/
    set_param(dest, "graph.wordnet_dir", str(SEMCOR.parent / "wordnet30"))   # the project's relative path, made absolute
    set_param(dest, "data.subsample", {"trn": trn_docs, "tst": tst_docs, "unit": "documents", "labels": labels})
    # a small slice's label graph: one short walk per node (the walk's code path; 8 x 400 is the product's)
    extra = {"graph.walk.walks": 1, "graph.walk.hops": 50, **(extra_params or {})}
    if "runs" in extra:
        # a narrowed pipeline: the hybrids, paired tests, figures and promoted packages of runs it keeps
        runs = set(extra["runs"])
        defaults = yaml.safe_load((ROOT / "params.yaml").read_text())
        extra.setdefault("hybrids", {h: e for h, e in defaults["hybrids"].items() if e["base"] in runs})
        names = runs | set(extra["hybrids"]) | set(extra.get("xr_linear", defaults["xr_linear"]))
        extra.setdefault("report.paired", [p for p in defaults["report"]["paired"] if set(p) <= names])
        extra.setdefault("report.training_families", {})
        extra.setdefault("registry.promote", [r for r in defaults["registry"]["promote"] if r in names])
    for k, v in extra.items():
        set_param(dest, k, v)
    run(["git", "init", "-q"], dest)
    run(["dvc", "init", "-q"], dest)
    run(["dvc", "config", "core.analytics", "false"], dest)
    run(["dvc", "config", "--local", "cache.type", "hardlink,symlink,copy"], dest)   # as the Makefile sets it
    run(["git", "add", "-A"], dest)
    run(["git", "commit", "-qm", "init"], dest)
    return dest


def results_of(repo: Path) -> Path:
    """The product's outputs of the dataset ``repo``'s params.yaml names: results/<data.name>/."""
    from xmc.workspace import results_dir

    return results_dir(repo / "params.yaml")


def lab_results_of(repo: Path) -> Path:
    """The lab's outputs of that dataset: lab/results/<data.name>/."""
    return repo / "lab" / results_of(repo).relative_to(repo)


def stages_run(output: str) -> list[str]:
    """The stages a ``dvc repro`` ran, by name (``lab/dvc.yaml:run@m`` -> ``run@m``)."""
    return [stage_from_address(line.split("'")[1]) for line in output.splitlines()
            if line.startswith("Running stage '")]


def write_xc_dataset(d: Path, labels: list[str], trn: list[str], tst: list[str], trn_rows: list[str],
                     tst_rows: list[str]) -> Path:
    """A small dataset in the XC raw layout (rows are ``lid:val ...`` strings, empty = no label)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "lbl.raw.txt").write_text("".join(t + "\n" for t in labels))
    (d / "trn.raw.txt").write_text("".join(t + "\n" for t in trn))
    (d / "tst.raw.txt").write_text("".join(t + "\n" for t in tst))
    (d / "trn_X_Y.txt").write_text(f"{len(trn_rows)} {len(labels)}\n" + "".join(r + "\n" for r in trn_rows))
    (d / "tst_X_Y.txt").write_text(f"{len(tst_rows)} {len(labels)}\n" + "".join(r + "\n" for r in tst_rows))
    return d


def assert_packages_predict_like_the_pipeline(repo: Path, names: list[str], n: int = 200) -> None:
    """Each package, loaded through the public API, ranks the first ``n`` test texts as the pipeline's
    prediction stage did (positions may swap only between labels of equal score)."""
    import json

    import numpy as np

    import xmc
    from xmc.predictions import TopK

    res = results_of(repo)
    with open(res / "data/processed/tst.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh][:n]
    for name in names:
        pkg = xmc.load(str(res / "packages" / name))
        ref = TopK.load(res / "predictions" / name / "tst_topk.npz")
        k = min(ref.k, pkg.n_labels)
        D, I = pkg.topk(texts, k)
        R, S = ref.indices[: len(texts), :k], ref.scores[: len(texts), :k]
        finite = np.isfinite(S)
        assert (np.isfinite(D) == finite).all(), name
        assert np.allclose(D[finite], S[finite], atol=1e-4), f"{name}: scores differ"
        moved = (I != R) & finite
        assert (np.abs(np.where(finite, D, 0) - np.where(finite, S, 0))[moved] <= 1e-4).all(), name
        # a label moved only among equal scores: the same set at every cut that does not split a tie
        assert (np.sort(np.where(finite, I, -1), 1) == np.sort(np.where(finite, R, -1), 1)).mean() > 0.97, name


def write_semcor_slice(d: Path, n_trn: int = 400, n_tst: int = 100, test_split: bool = True) -> Path:
    """The first ``n_trn`` training and ``n_tst`` test sentences of semcor-wn30 in the XC raw layout (every label
    text), without the dataset's sidecars: a folder a user could bring."""
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SEMCOR / "lbl.raw.txt", d / "lbl.raw.txt")
    for split, n in (("trn", n_trn), ("tst", n_tst)) if test_split else (("trn", n_trn),):
        texts = (SEMCOR / f"{split}.raw.txt").read_text(encoding="utf-8").splitlines()[:n]
        rows = (SEMCOR / f"{split}_X_Y.txt").read_text(encoding="utf-8").splitlines()
        header = rows[0].split()
        (d / f"{split}.raw.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        (d / f"{split}_X_Y.txt").write_text(f"{len(texts)} {header[1]}\n" + "".join(r + "\n" for r in rows[1: n + 1]),
                                            encoding="utf-8")
    return d
