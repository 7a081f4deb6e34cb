"""The neural peers as methods: the off-the-shelf encoder (zero-shot) and sentence-transformers' MNRL fine-tune.
The baselines that train no network (label prior, TF-IDF, label names) are :mod:`xmc.methods.baselines`."""

from __future__ import annotations

from typing import Any

from xmc.encoders.build import build_encoder
from xmc.methods.base import Method, RunContext
from xmc.peers.st_mnrl import train_st_mnrl


class PretrainedMethod(Method):
    """A local encoder folder used as it is: no training data read."""

    name = "pretrained"
    train_splits = ()

    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        build_encoder(ctx.config["encoder"]).save(ctx.model_dir)
        return {"train_seconds": 0.0}


class STMNRLMethod(Method):
    """sentence-transformers' own trainer with MultipleNegativesRankingLoss on the budget of the run named by
    ``budget_of`` (same encoder, batch, learning rate, epochs and step cap)."""

    name = "st_mnrl"

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        return train_st_mnrl(ds.trn.texts, ds.trn.Y, ds.label_texts, ctx.config, ctx.model_dir, ctx.work_dir)
