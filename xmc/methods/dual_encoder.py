"""DEXML (and its ablations): a pure dual encoder trained with a pluggable loss and sampler.

DEXML = shared encoder + DecoupledSoftmax + many negatives (ANN-refreshed hard negatives on
CPU; all labels with gradient caching where memory and time allow). Runs: params ``runs.<name>``
over the ``dual_encoder`` defaults.
"""

from __future__ import annotations

from typing import Any

from xmc.encoders.build import build_encoder
from xmc.losses import build_loss
from xmc.methods.base import RunContext
from xmc.methods.trainer_method import TrainerMethod, TrainingParts
from xmc.models.dual_encoder import DualEncoderModel
from xmc.negatives import build_sampler


class DEXMLMethod(TrainerMethod):
    """Encoder + loss + negative sampler on the one trainer; the saved model is a plain encoder folder."""

    name = "dexml"

    def build(self, ctx: RunContext, ds: Any) -> TrainingParts:
        cfg = ctx.config
        encoder = build_encoder(cfg["encoder"])
        model = DualEncoderModel(encoder, ds.label_texts)
        sampler = build_sampler(ds.trn.Y, cfg["negatives"], ds.trn.texts, ds.label_texts, ctx.params["label_names"])
        loss = build_loss(cfg["loss"]["name"], **{k: v for k, v in cfg["loss"].items() if k != "name"})
        return TrainingParts(model, sampler, loss,
                             fingerprint={k: cfg[k] for k in ("encoder", "loss", "negatives")}
                             | {"data": ds.meta.get("content_sha256")},
                             save=encoder.save)
