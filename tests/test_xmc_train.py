"""`xmc train` and `xmc.train`: a dataset folder in, a model package out, with no DVC and no git; bad input is one
`error:` line with exit code 2 and nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_repo import SEMCOR, write_semcor_slice

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

SMALL = ["--set", "encoder.dim=32", "--set", "encoder.n_buckets=4096", "--set", "train.epochs=2"]


def xmc(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GX_ANALYTICS_ENABLED": "False",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "xmc.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_semcor_slice(tmp_path_factory.mktemp("user") / "my_data")


def test_train_then_predict_with_no_dvc_and_no_git(data, tmp_path):
    # a folder outside any repository: nothing here is a DVC or git project
    p = xmc(["train", str(data), "--method", "astra", "--out", "m", *SMALL, "--set", "negatives.hard_negatives=8",
             "--set", "negatives.start_epoch=1"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "validation" in p.stderr and "test" in p.stderr
    manifest = json.loads((tmp_path / "m/manifest.json").read_text())
    assert manifest["method"] == "astra" and set(manifest["metrics"]) == {"val", "tst"}
    assert manifest["params"]["train"]["epochs"] == 2 and manifest["params"]["encoder"]["dim"] == 32
    assert manifest["labels"]["count"] == 25819
    # only the package is left beside it: the scratch workspace is removed
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m"]
    (tmp_path / "x.txt").write_text("He went to the bank to deposit his pay.\nThe dog ran home.\n")
    out = xmc(["predict", "m", "--input", "x.txt", "-k", "3"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2 and len(lines[0]["labels"]) == 3


def test_python_api_trains_the_same_method_with_overrides(data, tmp_path):
    import xmc

    pkg = xmc.train(str(data), method="dexml", out=str(tmp_path / "dexml"),
                    encoder={"dim": 32, "n_buckets": 4096}, train={"epochs": 1})
    assert pkg.method == "dexml" and pkg.manifest["params"]["train"]["epochs"] == 1
    assert len(pkg.predict(["a sentence about a river bank"], k=5)[0]) == 5


def test_a_folder_without_test_split_is_evaluated_on_validation_only(tmp_path):
    data = write_semcor_slice(tmp_path / "no_test", n_trn=300, test_split=False)
    p = xmc(["train", str(data), "--method", "tfidf_knn", "--out", "knn", "--no-validate"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert set(json.loads((tmp_path / "knn/manifest.json").read_text())["metrics"]) == {"val"}


def test_help_lists_the_methods_and_their_knobs(tmp_path):
    p = xmc(["train", "--help"], tmp_path)
    assert p.returncode == 0
    for method in ("dexml", "maclr", "ramen", "unidec", "astra"):
        assert f"  {method} " in p.stdout
    assert "negatives.hard_negatives" in p.stdout and "train.epochs" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["train", "no_such_folder"], "no_such_folder: dataset folder not found"),
    (["train", "{data}", "--method", "astar"], "unknown method 'astar' (did you mean 'astra'?)"),
    (["train", "{data}", "--set", "train.epochz=3"], "train.epochz: unknown key (did you mean 'epochs'?)"),
    (["train", "{data}", "--set", "train.epochs=-1"], "train.epochs: Input should be greater than 0 (got -1)"),
    (["train", "{unlabelled}"], "trn_X_Y.txt: missing: the training labels"),
    (["train", "{data}", "--config", "no_such.yaml"], "no_such.yaml: params file not found"),
])
def test_bad_input_is_one_error_line_and_nothing_written(data, tmp_path, args, message):
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    (unlabelled / "trn.raw.txt").write_text("a text\n")
    (unlabelled / "lbl.raw.txt").write_text("a label\n")
    work = tmp_path / "work"
    work.mkdir()
    p = xmc([a.format(data=data, unlabelled=unlabelled) for a in args] + ["--out", "out"], work)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert list(work.iterdir()) == []   # no package, no scratch folder
