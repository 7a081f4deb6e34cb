"""MACLR few-shot (FS-XMC by label): fine-tune on the ground-truth pairs of a random subset of labels.

``python -m stages.maclr_fewshot <run>``; settings ``maclr.fewshot.defaults`` + ``maclr.fewshot.runs.<run>``:
``init`` is the encoder folder it starts from (``models/<maclr run>``, or ``models/minilm_zeroshot`` for the
off-the-shelf encoder: the comparison MACLR's few-shot claim is about), ``ratio`` the label share.
Evaluated on the full test set over all labels by stages.index / stages.evaluate.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.encoders import load_encoder
from xmc.errors import ConfigError
from xmc.io import atomic_dir
from xmc.maclr.train import fewshot_labels, restrict_columns, train_pairs
from xmc.methods.dual_encoder import deep_merge, set_threads

log = logging.getLogger("stages.maclr_fewshot")


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.maclr_fewshot <run>")
    name = sys.argv[1]
    params = load_params()
    fs = params["maclr"]["fewshot"]
    runs = fs.get("runs") or {}
    if name not in runs:
        raise ConfigError(f"params.yaml: no run {name!r} under 'maclr.fewshot.runs' (have: {sorted(runs)})")
    cfg = deep_merge(fs["defaults"], runs[name])
    if not cfg.get("init"):
        raise ConfigError(f"params.yaml: maclr.fewshot.runs.{name}.init: the encoder folder to start from is missing")
    set_threads()
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val"))
    labels = fewshot_labels(ds.trn.Y, float(cfg["ratio"]), int(cfg.get("seed", 0)))
    Y = restrict_columns(ds.trn.Y, labels)
    encoder = load_encoder(cfg["init"])  # a missing folder is a one-line error naming it
    if cfg.get("freeze_embeddings") and hasattr(encoder, "query_model"):
        # a saved folder does not record the freeze: apply it so both inits train the same parameters
        for m in {id(encoder.query_model): encoder.query_model, id(encoder.label_model): encoder.label_model}.values():
            m.get_input_embeddings().weight.requires_grad_(False)
    trainer, secs = train_pairs(encoder, ds.trn.texts, ds.label_texts, Y, cfg, Path("checkpoints") / name,
                                {"fewshot": cfg, "data": ds.meta.get("content_sha256")})
    trainer.write_curves(Path("plots") / "train" / name)
    summary = {"run": name, "init": cfg["init"], "ratio": cfg["ratio"], "labels": int(len(labels)),
               "pairs": int(Y.nnz), "instances": int((Y.getnnz(1) > 0).sum()), "steps": trainer.global_step,
               "train_seconds": round(secs, 2)}
    with atomic_dir(Path("models") / name) as tmp:
        encoder.save(tmp)
        (tmp / "train_summary.json").write_text(json.dumps(summary, indent=2))
    log.info("few-shot %s: %s", name, summary)


if __name__ == "__main__":
    run_entry_point(main)
