"""The encoding cache: a hit is the miss's array bit for bit, any change to weights, texts or settings misses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xmc.encoders import cache
from xmc.encoders.transformer import TransformerEncoder
from xmc.encoders.encoding_key import encoding_key

TEXTS = ["the bank of the river", "a bank lends money", "she sat on the bench", "he ran to the store",
         "run the program again"]


@pytest.fixture(scope="module")
def enc():
    return TransformerEncoder(max_len_query=16, max_len_label=16)


@pytest.fixture
def on(tmp_path):
    cache.configure(tmp_path / "c", min_texts=1)
    yield tmp_path / "c"
    cache.configure(None)


def test_a_hit_is_the_computed_array_and_skips_the_encoder(enc, on, monkeypatch):
    first = enc.encode(TEXTS, "label")
    assert len(list(on.glob("*.npy"))) == 1
    with monkeypatch.context() as m:
        m.setattr(TransformerEncoder, "forward", lambda *a, **k: pytest.fail("encoded again"))
        again = enc.encode(TEXTS, "label")
    assert again.dtype == first.dtype and np.array_equal(again, first)
    cache.configure(None)
    assert np.array_equal(enc.encode(TEXTS, "label"), first)   # what the cache holds is what encoding gives


def test_weights_texts_side_and_length_are_in_the_key(enc):
    base = encoding_key(enc, TEXTS, "label")
    assert base == encoding_key(enc, list(TEXTS), "label")
    assert base != encoding_key(enc, TEXTS[::-1], "label")
    assert base != encoding_key(enc, TEXTS[:-1], "label")
    assert base != encoding_key(enc, TEXTS, "query")
    enc.max_len["label"] = 8
    try:
        assert base != encoding_key(enc, TEXTS, "label")
    finally:
        enc.max_len["label"] = 16
    enc.set_label_text("names")
    try:
        assert base != encoding_key(enc, TEXTS, "label")
    finally:
        enc.set_label_text("full")
    w = enc.label_model.get_input_embeddings().weight
    with torch.no_grad():
        w[3, 0] += 1e-3
        try:
            assert base != encoding_key(enc, TEXTS, "label")
        finally:
            w[3, 0] -= 1e-3
    assert base == encoding_key(enc, TEXTS, "label")


def test_off_by_default_below_min_texts_and_bounded(enc, tmp_path):
    assert cache.active() is None
    one = 5 * enc.dim * 4 + 128   # an entry of 5 float32 vectors (npy header included)
    cache.configure(tmp_path / "c", min_texts=4, max_mb=2.5 * one / 2**20)
    try:
        enc.encode(TEXTS[:3], "label")                  # fewer than min_texts: not stored
        assert not (tmp_path / "c").exists() or not list((tmp_path / "c").glob("*.npy"))
        for k in range(3):
            enc.encode(TEXTS[k:] + TEXTS[:k], "label")
        kept = {p.stem for p in (tmp_path / "c").glob("*.npy")}
        assert len(kept) == 2 and encoding_key(enc, TEXTS, "label") not in kept   # the least recently used went
        assert encoding_key(enc, TEXTS[2:] + TEXTS[:2], "label") in kept
    finally:
        cache.configure(None)
