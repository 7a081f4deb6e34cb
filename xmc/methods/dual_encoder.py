"""DEXML (and its ablations): a pure dual encoder trained with a pluggable loss and sampler.

DEXML = shared encoder + DecoupledSoftmax + many negatives (ANN-refreshed hard negatives on
CPU; all labels with gradient caching where memory and time allow).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from xmc.data.dataset import XMCDataset
from xmc.encoders import build_encoder
from xmc.io import atomic_dir
from xmc.losses import build_loss
from xmc.models import DualEncoderModel
from xmc.negatives import build_sampler
from xmc.train import RetrievalEvaluator, Trainer, TrainConfig

log = logging.getLogger(__name__)


def deep_merge(base: dict[str, Any], override: dict[str, Any] | None) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def run_config(params: dict[str, Any], name: str) -> dict[str, Any]:
    """``dual_encoder`` defaults with ``runs.<name>`` overrides applied."""
    from xmc.errors import ConfigError

    runs = params.get("runs") or {}
    if name not in runs:
        raise ConfigError(f"params.yaml: no run {name!r} under 'runs' (have: {sorted(runs)})")
    return deep_merge(params["dual_encoder"], runs[name])


def set_threads() -> None:
    n = int(os.environ.get("XMC_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(n)


def train_dual_encoder(ds: XMCDataset, cfg: dict[str, Any], model_dir: str | Path, work_dir: str | Path,
                       plots_dir: str | Path, eval_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train, save the encoder to ``model_dir`` (atomically) and return a summary.

    ``work_dir`` keeps the resumable checkpoint; a rerun with the same settings resumes there.
    """
    set_threads()
    torch.manual_seed(int(cfg["train"].get("seed", 0)))
    encoder = build_encoder(cfg["encoder"])
    model = DualEncoderModel(encoder, ds.label_texts)
    sampler = build_sampler(ds.trn.Y, cfg["negatives"])
    loss = build_loss(cfg["loss"]["name"], **{k: v for k, v in cfg["loss"].items() if k != "name"})
    tcfg = TrainConfig.from_params(cfg["train"])
    evaluator, every = RetrievalEvaluator.monitoring(ds, cfg["train"], eval_params)
    trainer = Trainer(model, sampler, loss, tcfg, ds.trn.texts, work_dir, evaluator=evaluator, eval_every_epochs=every,
                      fingerprint_extra={k: cfg[k] for k in ("encoder", "loss", "negatives")} | {"data": ds.meta.get("content_sha256")})
    t0 = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - t0
    trainer.write_curves(plots_dir)
    with atomic_dir(model_dir) as tmp:
        encoder.save(tmp)
    epochs = result["history"]["epochs"]
    summary = {
        "train_seconds": round(sum(e["seconds"] for e in epochs), 2),  # epochs include their ANN refreshes
        "wall_seconds_this_run": round(wall, 2),
        "epochs": len(epochs),
        "steps": trainer.global_step,
        "final_loss": result["history"]["loss"][-1]["loss"] if result["history"]["loss"] else None,
        "refresh_seconds": [round(s, 2) for s in getattr(sampler, "refresh_seconds", [])],
        "refreshed_at_epochs": list(getattr(sampler, "refreshed_at", [])),
        "device": str(trainer.device),
        "last_validation": result["history"]["val"][-1] if result["history"]["val"] else None,
    }
    (Path(model_dir) / "train_summary.json").write_text(json.dumps(summary, indent=2))
    return summary
