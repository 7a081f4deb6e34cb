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
PROJECT_FILES = ["xmc", "stages", "flows", "dvc.yaml", "pipelines", "params.yaml", ".dvcignore", ".gitignore", ".gto",
                 "bench/seed_studies"]
PACKAGES = "pipelines/package/dvc.yaml"  # the package@<run> stages: `dvc repro PACKAGES` builds every package


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
              labels: str = "all", extra_params: dict[str, Any] | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "dvc.lock"))
        else:
            shutil.copy2(src, dest / name)
    if (ROOT / ".venv-pecos").is_dir():  # the linear peer's environment (make setup), shared with the checkout
        (dest / ".venv-pecos").symlink_to(ROOT / ".venv-pecos")
    set_param(dest, "data.dataset_dir", str(dataset_dir))
    set_param(dest, "data.subsample", {"trn": trn_docs, "tst": tst_docs, "unit": "documents", "labels": labels})
    extra = dict(extra_params or {})
    if "methods" in extra:
        # a narrowed main report evaluates (test and validation) just those methods
        extra.setdefault("reported", list(extra["methods"]))
        extra.setdefault("validated", list(extra["methods"]))
        # ... and packages just those of them that the default params package
        defaults = yaml.safe_load((ROOT / "params.yaml").read_text())
        extra.setdefault("packages", [k for k in defaults["packages"] if k in extra["methods"]])
        extra.setdefault("registry.promote", [k for k in defaults["registry"]["promote"] if k in extra["packages"]])
    for k, v in extra.items():
        set_param(dest, k, v)
    run(["git", "init", "-q"], dest)
    run(["dvc", "init", "-q"], dest)
    run(["dvc", "config", "core.analytics", "false"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "commit", "-qm", "init"], dest)
    return dest


def stages_run(output: str) -> list[str]:
    """The stages a ``dvc repro`` ran, by name (``pipelines/x/dvc.yaml:evaluate@m`` -> ``evaluate@m``)."""
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

    with open(repo / "data/processed/tst.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh][:n]
    for name in names:
        pkg = xmc.load(str(repo / "packages" / name))
        ref = TopK.load(repo / "predictions" / name / "tst_topk.npz")
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
