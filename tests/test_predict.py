"""Prediction through a model package: texts -> top-k labels with scores, and the prediction stage's harness
writing the same top-k as the package API."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmc.encoders import HashedBagOfWordsEncoder
from xmc.errors import DataFormatError
from xmc.package import build_package, load
from xmc.package.inputs import iter_input

LABELS = [("L0", "river bank water"), ("L1", "money bank account"), ("L2", "green tree leaf")]


@pytest.fixture
def package(tmp_path):
    enc = HashedBagOfWordsEncoder(dim=64, n_buckets=8192)
    enc.save(tmp_path / "model")
    build_package(tmp_path / "pkg", name="tiny", method="dexml", source=tmp_path / "model",
                  label_uids=[u for u, _ in LABELS], label_texts=[t for _, t in LABELS], options={"index": {"kind": "exact"}})
    return tmp_path / "pkg"


def test_package_predicts_ranked_labels_with_scores(package):
    pkg = load(package)
    rows = pkg.predict(["green leaf on a tree", "open a bank account with money"], k=2)
    assert rows[0][0].uid == "L2" and rows[1][0].uid == "L1"
    assert len(rows[0]) == 2 and rows[0][0].score >= rows[0][1].score
    assert rows[0][0].text == "green tree leaf"


def test_stream_equals_batch_and_bad_input_is_one_line(package, tmp_path):
    pkg = load(package)
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "q1", "text": "green leaf on a tree"}) + "\n"
                                       + json.dumps({"text": "open a bank account with money"}) + "\n")
    streamed = list(pkg.predict_stream(iter_input(tmp_path / "in.jsonl"), k=3, batch_size=1))
    assert streamed[0][0] == "q1" and len(streamed) == 2
    D, I = pkg.topk([t for _, t, _ in streamed], 3)
    assert [[p.label for p in preds] for _, _, preds in streamed] == I.tolist()
    assert np.all(np.diff(D, axis=1) <= 0)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2"):
        list(iter_input(tmp_path / "bad.jsonl"))
