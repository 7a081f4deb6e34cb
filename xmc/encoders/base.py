"""The encoder interface every method trains.

An encoder maps texts to L2-normalised d-dimensional vectors. ``side`` is ``"query"`` or
``"label"``: sides may use different maximum lengths and, if untied, different weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from xmc.errors import ConfigError

SIDES = ("query", "label")


class TextEncoder(nn.Module):
    """Base class: subclasses implement ``forward(texts, side)``, ``save`` and ``load``."""

    kind: str = ""
    dim: int

    def forward(self, texts: list[str], side: str = "query") -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @torch.no_grad()
    def encode(self, texts: list[str], side: str = "query", batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """Embeddings as float32 numpy, in eval mode (no dropout), batched."""
        was_training = self.training
        self.eval()
        # batches of similar length waste little compute on padding; results are put back in order
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dim), np.float32)
        it = range(0, len(texts), batch_size)
        for s in tqdm(it, desc=f"encode {side} texts", unit="batch", disable=not progress, mininterval=10):
            idx = order[s : s + batch_size]
            out[idx] = self([texts[i] for i in idx], side).float().cpu().numpy()
        self.train(was_training)
        return out

    def save(self, path: str | Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def build_encoder(cfg: dict[str, Any]) -> TextEncoder:
    """Encoder from a params.yaml ``encoder`` section."""
    from xmc.encoders.bow import HashedBagOfWordsEncoder
    from xmc.encoders.transformer import TransformerEncoder

    kind = cfg.get("kind", "transformer")
    if kind == "transformer":
        return TransformerEncoder(
            model_dir=cfg.get("model_dir"),
            pooling=cfg.get("pooling", "mean"),
            max_len_query=int(cfg.get("max_len_query", 32)),
            max_len_label=int(cfg.get("max_len_label", 32)),
            tied=bool(cfg.get("tied", True)),
            dropout=float(cfg.get("dropout", 0.0)),
            freeze_embeddings=bool(cfg.get("freeze_embeddings", False)),
        )
    if kind == "bow":
        return HashedBagOfWordsEncoder(
            dim=int(cfg.get("dim", 256)),
            n_buckets=int(cfg.get("n_buckets", 1 << 18)),
            ngram_max=int(cfg.get("ngram_max", 2)),
            tied=bool(cfg.get("tied", True)),
            dropout=float(cfg.get("dropout", 0.0)),
            seed=int(cfg.get("seed", 0)),
        )
    raise ConfigError(f"unknown encoder kind {kind!r} (expected transformer or bow)")


def load_encoder(path: str | Path) -> TextEncoder:
    """Load an encoder saved by ``TextEncoder.save`` (reads ``xmc_encoder.json``)."""
    from xmc.encoders.bow import HashedBagOfWordsEncoder
    from xmc.encoders.transformer import TransformerEncoder

    path = Path(path)
    cfg_path = path / "xmc_encoder.json"
    if not cfg_path.exists():
        raise ConfigError(f"{cfg_path}: not a saved encoder folder (missing xmc_encoder.json)")
    from xmc.io import read_json_file

    cfg = read_json_file(cfg_path, "an encoder description")
    kind = cfg.get("kind") if isinstance(cfg, dict) else None
    if kind not in ("transformer", "bow"):
        raise ConfigError(f"{cfg_path}: unknown encoder kind {kind!r} (expected transformer or bow)")
    return {"transformer": TransformerEncoder, "bow": HashedBagOfWordsEncoder}[kind].load(path)
