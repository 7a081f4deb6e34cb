"""The baselines as methods: the training-label prior, the two TF-IDF baselines and the label-name retriever. Each
"trains" into a model folder like the papers' methods (what its predictor reads, the TF-IDF files as hard links), so
every row of the report goes through the same stages, predictors and model packages. None trains a network: this
module imports no torch, so a baseline's training process never loads it."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from xmc.errors import DataFormatError
from xmc.io import save_csr, save_npz_deterministic
from xmc.methods.base import Method, RunContext

TFIDF_VECTORISER = ("vocabulary.json", "settings.json", "idf.npz")


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link where the file system allows (the features are not rewritten in place), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        dest.hardlink_to(src)
    except OSError:
        shutil.copy2(src, dest)


def _tfidf_files(ctx: RunContext, names: tuple[str, ...]) -> float:
    """Link the TF-IDF stage's files ``names`` into the model folder; returns the stage's fit seconds."""
    for name in names:
        src = ctx.ws.tfidf / name
        if not src.is_file():
            raise DataFormatError(src, None, "missing from the TF-IDF features (run the tfidf stage first)")
        _link_or_copy(src, ctx.model_dir / name)
    timing = ctx.ws.tfidf.parent / "tfidf_timing.json"
    return float(json.loads(timing.read_text())["fit_seconds"]) if timing.is_file() else 0.0


class TfidfZeroShotMethod(Method):
    """Cosine of TF-IDF vectors of the text and each label text; no training labels."""

    name = "tfidf_zeroshot"
    predictor_kind = "tfidf_zeroshot"
    train_splits = ()
    features = ("tfidf",)

    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        return {"train_seconds": _tfidf_files(ctx, (*TFIDF_VECTORISER, "X_lbl.npz"))}


class TfidfKNNMethod(Method):
    """The nearest training instances (TF-IDF cosine) vote for their labels."""

    name = "tfidf_knn"
    predictor_kind = "tfidf_knn"
    train_splits = ("trn",)
    features = ("tfidf",)

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        seconds = _tfidf_files(ctx, (*TFIDF_VECTORISER, "X_trn.npz"))
        save_csr(ctx.model_dir / "Y_trn.npz", ds.trn.Y.tocsr())
        return {"train_seconds": seconds}


class LabelPriorMethod(Method):
    """The most frequent training labels, whatever the text."""

    name = "label_prior"
    predictor_kind = "label_prior"
    train_splits = ("trn",)

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        freq = np.asarray(ds.trn.Y.sum(0)).ravel().astype(np.float32)
        save_npz_deterministic(ctx.model_dir / "label_prior.npz", freq=freq)
        return {"train_seconds": round(time.perf_counter() - t0, 3)}


class NameMatchMethod(Method):
    """The sparse label-name retriever (:mod:`xmc.lexical`): labels whose names occur in the text, lemmatised.
    Ranking ``zero_shot``: longer, less ambiguous matches first, no training data read; ``prior``: by the label's
    training count (the most frequent sense). The matcher is built from the label texts when packaged."""

    name = "name_match"
    predictor_kind = "label_names"
    train_splits = ("trn",)

    def splits_read(self, config: dict[str, Any]) -> tuple[str, ...]:
        return ("trn",) if config["ranking"] == "prior" else ()

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        if ctx.config["ranking"] == "prior":   # only this ranking reads training labels
            counts = np.asarray(ds.trn.Y.sum(0)).ravel().astype(np.float32)
            save_npz_deterministic(ctx.model_dir / "train_counts.npz", counts=counts)
        ctx.model_dir.mkdir(parents=True, exist_ok=True)
        return {"train_seconds": 0.0}
