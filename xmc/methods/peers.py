"""The peers as methods: the off-the-shelf encoder (zero-shot), sentence-transformers' MNRL fine-tune, the
training-label prior and the two TF-IDF baselines. They go through the same stages, predictors and model
packages as the papers' methods, so every row of the report is measured the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xmc.methods.base import Method, RunContext
from xmc.methods.runs import RunSpec


class PretrainedMethod(Method):
    """A local encoder folder used as it is (``pretrained.<name>``): no training data read."""

    name = "pretrained"
    train_splits = ()

    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        from xmc.encoders import build_encoder

        build_encoder(ctx.config["encoder"]).save(ctx.model_dir)
        return {"train_seconds": 0.0}


class STMNRLMethod(Method):
    """sentence-transformers' own trainer with MultipleNegativesRankingLoss on the budget of the run named by
    ``st_mnrl.budget_of`` (same encoder, batch, learning rate, epochs and step cap)."""

    name = "st_mnrl"

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        from xmc.peers.st_mnrl import train_st_mnrl

        return train_st_mnrl(ds.trn.texts, ds.trn.Y, ds.label_texts, ctx.config, ctx.model_dir, ctx.work_dir)


class _TfidfPeer(Method):
    """Predicts from the ``tfidf`` stage's features (fit on training and label texts): no training stage."""

    trainable = False

    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:  # pragma: no cover - refused by train_run
        raise NotImplementedError(f"{self.name} is fit by the tfidf stage")

    def predictor_source(self, run: RunSpec, params: dict[str, Any]) -> Path:
        return Path("data/tfidf")

    def train_seconds(self, run: RunSpec, params: dict[str, Any]) -> float:
        path = Path("data/tfidf_timing.json")
        return float(json.loads(path.read_text())["fit_seconds"]) if path.is_file() else 0.0


class TfidfZeroShotMethod(_TfidfPeer):
    """Cosine of TF-IDF vectors of the text and each label text; no training labels."""

    name = "tfidf_zeroshot"
    predictor_kind = "tfidf_zeroshot"


class TfidfKNNMethod(_TfidfPeer):
    """The nearest training instances (TF-IDF cosine) vote for their labels (``tfidf_knn``)."""

    name = "tfidf_knn"
    predictor_kind = "tfidf_knn"


class LabelPriorMethod(_TfidfPeer):
    """The most frequent training labels, whatever the text (built from the training label matrix)."""

    name = "label_prior"
    predictor_kind = "label_prior"

    def predictor_source(self, run: RunSpec, params: dict[str, Any]) -> Path:
        return Path(params["data"]["processed_dir"]) / "trn_Y.npz"

    def train_seconds(self, run: RunSpec, params: dict[str, Any]) -> float:
        return 0.0


class LabelNameMethod(_TfidfPeer):
    """The sparse label-name retriever (:mod:`xmc.lexical`): labels whose names occur in the text, lemmatised.
    ``name_match`` ranks longer, less ambiguous matches first and reads no training data (zero-shot);
    ``name_match_prior`` ranks the matches by their training counts (the most frequent sense)."""

    name = "label_names"
    predictor_kind = "label_names"

    def prediction_variants(self, run: RunSpec) -> dict[str, dict[str, Any]]:
        return {run.name: {"ranking": run.config["ranking"], "label_names": run.config["label_names"]}}

    def predictor_source(self, run: RunSpec, params: dict[str, Any]) -> Path:
        return Path(params["data"]["processed_dir"]) / "lbl.jsonl"

    def train_seconds(self, run: RunSpec, params: dict[str, Any]) -> float:
        return 0.0
