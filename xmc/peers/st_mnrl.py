"""sentence-transformers' own trainer with MultipleNegativesRankingLoss on (instance, positive label) pairs.

Same encoder, batch size, learning rate and step budget as our trainer: one epoch = every
training instance once, paired with one of its labels drawn at random (resampled per epoch),
so both trainers take the same number of steps on the same queries.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.config.schema import EncoderConfig, LossConfig, TrainSection, filled
from xmc.encoders.transformer import default_model_dir

log = logging.getLogger(__name__)


def mnrl_pairs(texts: list[str], Y: sp.csr_matrix, label_texts: list[str], epochs: int, seed: int,
               max_per_epoch: int = 0, batch_size: int = 64) -> tuple[list[str], list[str]]:
    """Epoch-by-epoch (query, one random positive label) pairs, in the order the trainer consumes them."""
    Y = Y.tocsr()
    has = np.flatnonzero(np.diff(Y.indptr) > 0)
    anchors, positives = [], []
    for e in range(epochs):
        rng = np.random.default_rng([seed, e])
        order = rng.permutation(has)
        if max_per_epoch:
            order = order[: max_per_epoch * batch_size]
        for q in order:
            pos = Y.indices[Y.indptr[q] : Y.indptr[q + 1]]
            anchors.append(texts[q])
            positives.append(label_texts[int(rng.choice(pos))])
    return anchors, positives


def train_st_mnrl(texts: list[str], Y: sp.csr_matrix, label_texts: list[str], cfg: dict[str, Any],
                  out_dir: str | Path, work_dir: str | Path) -> dict[str, Any]:
    # imported here: sentence-transformers' trainer and datasets take about 4 s to import; only this (lab) peer uses them
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers

    # the run's sections (partial: the schema's defaults fill the rest)
    enc, tr = filled(EncoderConfig, cfg["encoder"], "encoder"), filled(TrainSection, cfg["train"], "train")
    loss_cfg = filled(LossConfig, cfg["loss"], "loss")
    model = SentenceTransformer(enc["model_dir"] or default_model_dir(), device="cpu", local_files_only=True)
    model.max_seq_length = enc["max_len_query"]
    if enc["freeze_embeddings"]:
        model[0].auto_model.get_input_embeddings().weight.requires_grad_(False)
    bs, epochs = tr["batch_size"], tr["epochs"]
    anchors, positives = mnrl_pairs(texts, Y, label_texts, epochs, tr["seed"], tr["max_steps_per_epoch"], bs)
    data = Dataset.from_dict({"anchor": anchors, "positive": positives})
    # the loss's temperature is optional in the schema: unset, MNRL keeps its own default scale (20 = 1 / 0.05)
    scale = {"scale": 1.0 / loss_cfg["temperature"]} if "temperature" in loss_cfg else {}
    loss = MultipleNegativesRankingLoss(model, **scale)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(work_dir), num_train_epochs=1, per_device_train_batch_size=bs,
        learning_rate=tr["lr"], warmup_ratio=tr["warmup_ratio"], weight_decay=tr["weight_decay"],
        max_grad_norm=tr["grad_clip"], lr_scheduler_type="linear",
        batch_sampler=BatchSamplers.NO_DUPLICATES, report_to=[], save_strategy="no", logging_steps=10,
        seed=tr["seed"], dataloader_drop_last=False, disable_tqdm=False,
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    out_dir = Path(out_dir)
    model.save(str(out_dir))
    (out_dir / "xmc_encoder.json").write_text(json.dumps({
        "kind": "transformer", "pooling": "mean", "max_len_query": enc["max_len_query"],
        "max_len_label": enc["max_len_label"], "tied": True, "dim": model.get_sentence_embedding_dimension()}, indent=2))
    summary = {"train_seconds": round(seconds, 2), "pairs": len(anchors), "steps": int(trainer.state.global_step)}
    (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
