"""Prediction through a model package: texts -> top-k labels with scores, streamed or in one batch alike."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.package_fixtures import trained_bow
from xmc.errors import DataFormatError
from xmc.package import build_package, load
from xmc.package.inputs import iter_input

LABELS = [("L0", "river bank water"), ("L1", "money bank account"), ("L2", "green tree leaf")]
QUERIES = ["green leaf on a tree", "open a bank account with money"]


@pytest.fixture
def package(tmp_path):
    # an encoder whose rows of these words moved (a saved encoder keeps only those: the others encode as zero)
    trained_bow([t for _, t in LABELS] + QUERIES, dim=64, n_buckets=8192).save(tmp_path / "model")
    build_package(tmp_path / "pkg", name="tiny", method="dexml", source=tmp_path / "model",
                  label_uids=[u for u, _ in LABELS], label_texts=[t for _, t in LABELS], options={"index": {"kind": "exact"}})
    return tmp_path / "pkg"


def test_package_predicts_ranked_labels_with_scores(package):
    pkg = load(package)
    rows = pkg.predict(QUERIES, k=2)
    assert rows[0][0].id == "L2" and rows[1][0].id == "L1"
    assert len(rows[0]) == 2 and rows[0][0].score >= rows[0][1].score
    assert rows[0][0].text == "green tree leaf"
    assert load(package).predict(["zebra quasar"], k=1)[0][0].score == 0.0   # no trained word: no evidence


def test_stream_equals_batch_and_bad_input_is_one_line(package, tmp_path):
    pkg = load(package)
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "q1", "text": "green leaf on a tree"}) + "\n"
                                       + json.dumps({"text": "open a bank account with money"}) + "\n")
    streamed = list(pkg.predict_stream(iter_input(tmp_path / "in.jsonl"), k=3, batch_size=1))
    assert streamed[0][0] == "q1" and len(streamed) == 2
    D, I = pkg.topk([t for _, t, _ in streamed], 3)
    assert [[p.index for p in preds] for _, _, preds in streamed] == I.tolist()
    assert np.all(np.diff(D, axis=1) <= 0)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2"):
        list(iter_input(tmp_path / "bad.jsonl"))


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "text": "one", "text": "two"}', "duplicate key 'text'"),
    ('{"text": "a\\u0000b"}', "not text"),
    ('{"text": "a\\ud800b"}', "not text"),
])
def test_prediction_input_is_as_strict_as_the_dataset_readers(tmp_path, line, message):
    (tmp_path / "in.jsonl").write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(DataFormatError) as e:
        list(iter_input(tmp_path / "in.jsonl"))
    assert str(e.value).startswith(f"{tmp_path / 'in.jsonl'}:2:") and message in str(e.value), str(e.value)
