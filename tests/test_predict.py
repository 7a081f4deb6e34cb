"""Batch prediction: texts -> top-k labels with scores, through a saved encoder and index."""

from __future__ import annotations

import json

import pytest

from xmc.ann import ANNIndex
from xmc.encoders import HashedBagOfWordsEncoder
from xmc.errors import DataFormatError
from xmc.predict import predict_file, read_input_texts


@pytest.fixture
def model_and_index(tmp_path):
    labels = [{"uid": f"L{i}", "text": t} for i, t in enumerate(["river bank water", "money bank account", "green tree leaf"])]
    (tmp_path / "lbl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labels))
    enc = HashedBagOfWordsEncoder(dim=64, n_buckets=8192)
    enc.save(tmp_path / "model")
    ANNIndex().build(enc.encode([r["text"] for r in labels], "label")).save(tmp_path / "index" / "ann")
    return tmp_path


def test_predict_file_writes_ranked_labels_with_scores(model_and_index):
    d = model_and_index
    (d / "in.jsonl").write_text(json.dumps({"id": "q1", "text": "green leaf on a tree"}) + "\n"
                                + json.dumps({"text": "open a bank account with money"}) + "\n")
    n = predict_file(d / "model", d / "index", d / "lbl.jsonl", d / "in.jsonl", d / "out.jsonl", k=2)
    rows = [json.loads(x) for x in (d / "out.jsonl").read_text().splitlines()]
    assert n == 2 and [r["id"] for r in rows] == ["q1", "1"]
    assert rows[0]["labels"][0]["uid"] == "L2" and rows[1]["labels"][0]["uid"] == "L1"
    assert len(rows[0]["labels"]) == 2 and rows[0]["labels"][0]["score"] >= rows[0]["labels"][1]["score"]


def test_bad_input_file_is_one_clear_error_and_no_output(model_and_index):
    d = model_and_index
    (d / "bad.txt").write_text("fine text\n\nmore\n")
    with pytest.raises(DataFormatError, match=r"bad\.txt:2: empty text"):
        predict_file(d / "model", d / "index", d / "lbl.jsonl", d / "bad.txt", d / "out2.jsonl")
    assert not (d / "out2.jsonl").exists()
    (d / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2: invalid JSON"):
        read_input_texts(d / "bad.jsonl")
