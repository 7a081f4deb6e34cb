"""MACLR as methods: zero-shot pre-training (Stage I + Stage II) from raw text, and few-shot fine-tuning.

Both save a plain encoder folder that the ``dense`` predictor serves. The zero-shot method reads only the
pseudo-pairs folder (texts, ICT pairs, TF-IDF top-k, label-name matches; ``data/maclr_pairs``): no ground-truth pair can reach it.
"""

from __future__ import annotations

import time
from typing import Any

from xmc.encoders.build import build_encoder, load_encoder
from xmc.maclr.pseudo import PseudoPairs
from xmc.maclr.train import fewshot_labels, restrict_columns, stage2_pseudo_matrix, train_pairs, train_stage1
from xmc.methods.base import RunContext
from xmc.methods.trainer_method import DataParallelMethod


class MACLRMethod(DataParallelMethod):
    """Stage I (ICT + multi-scale adaptive clustering + label regularisation), then Stage II self-training
    on agreed TF-IDF/dense pseudo pairs; ``epochs: 0`` skips a stage (the paper's ablations)."""

    name = "maclr"
    train_splits = ()   # the pseudo pairs only
    features = ("maclr_pairs",)

    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        cfg = ctx.config
        pairs = PseudoPairs.load(ctx.ws.maclr_pairs)
        encoder = build_encoder(cfg["encoder"])
        bs = ctx.params["index"]["encode_batch_size"]
        summary: dict[str, Any] = {"pairs": pairs.meta.get("counts")}
        t_all = time.perf_counter()
        s1 = cfg["stage1"]
        if s1["train"]["epochs"] > 0:
            # each stage's checkpoint stays until the encoder is saved: a kill during Stage II resumes Stage I
            # where its checkpoint is, not from the start
            res = train_stage1(encoder, pairs, s1, ctx.work_dir / "stage1", encode_batch_size=bs, live=ctx.live,
                               complete=False)
            ctx.after_saved.append(res.pop("trainer").complete)
            summary["stage1"] = res
        s2 = cfg["stage2"]
        if s2["train"]["epochs"] > 0:
            Y, info = stage2_pseudo_matrix(encoder, pairs, s2, encode_batch_size=bs)
            trainer, secs = train_pairs(encoder, pairs.texts, pairs.label_texts, Y, s2, ctx.work_dir / "stage2",
                                        {"maclr_stage2": s2, "stage1": cfg["stage1"], "encoder": cfg["encoder"]},
                                        live=ctx.live, live_prefix="stage2", complete=False)
            ctx.after_saved.append(trainer.complete)
            summary["stage2"] = {**info, "seconds": round(secs, 2), "steps": trainer.global_step}
        summary["train_seconds"] = round(time.perf_counter() - t_all, 2)
        encoder.save(ctx.model_dir)
        return summary


class MACLRFewShotMethod(DataParallelMethod):
    """FS-XMC by label: fine-tune an encoder folder (``init``: a MACLR run or the off-the-shelf encoder) on
    the ground-truth pairs of a random ``ratio`` of the labels; evaluated on all labels."""

    name = "maclr_fewshot"

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        cfg = ctx.config
        labels = fewshot_labels(ds.trn.Y, float(cfg["ratio"]), int(cfg["seed"]))
        Y = restrict_columns(ds.trn.Y, labels)
        encoder = load_encoder(cfg["init"], trainable=True)  # a missing folder is a one-line error naming it
        if cfg["freeze_embeddings"] and hasattr(encoder, "query_model"):
            # a saved folder does not record the freeze: apply it so both inits train the same parameters
            for m in {id(encoder.query_model): encoder.query_model, id(encoder.label_model): encoder.label_model}.values():
                m.get_input_embeddings().weight.requires_grad_(False)
        trainer, secs = train_pairs(encoder, ds.trn.texts, ds.label_texts, Y, cfg, ctx.work_dir,
                                    {"fewshot": cfg, "data": ds.meta.get("content_sha256")}, live=ctx.live,
                                    complete=False)
        ctx.after_saved.append(trainer.complete)
        encoder.save(ctx.model_dir)
        return {"init": cfg["init"], "ratio": cfg["ratio"], "labels": int(len(labels)), "pairs": int(Y.nnz),
                "instances": int((Y.getnnz(1) > 0).sum()), "steps": trainer.global_step,
                "train_seconds": round(secs, 2)}
