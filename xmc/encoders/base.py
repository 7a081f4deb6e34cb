"""The encoder interface every method trains.

An encoder maps texts to L2-normalised d-dimensional vectors. ``side`` is ``"query"`` or
``"label"``: sides may use different maximum lengths and, if untied, different weights.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from xmc.config.schema import EncoderConfig, filled
from xmc.errors import ConfigError

log = logging.getLogger(__name__)

SIDES = ("query", "label")


class TextEncoder(nn.Module):
    """Base class: subclasses implement ``forward(texts, side)``, ``save`` and ``load``."""

    kind: str = ""
    dim: int
    #: which part of a label text the label side reads (:data:`xmc.lexical.names.LABEL_TEXT_VIEWS`)
    label_text: str = "full"

    def side_texts(self, texts: list[str], side: str) -> list[str]:
        """``texts`` as the ``side`` reads them: label texts cut to :attr:`label_text`, queries as given."""
        if side != "label" or self.label_text == "full":
            return texts
        from xmc.lexical.names import label_text_view

        return [label_text_view(t, self.label_text) for t in texts]

    def set_label_text(self, view: str) -> TextEncoder:
        from xmc.lexical.names import LABEL_TEXT_VIEWS

        if view not in LABEL_TEXT_VIEWS:
            raise ConfigError(f"encoder.label_text must be one of {', '.join(LABEL_TEXT_VIEWS)} (got {view!r})")
        self.label_text = view
        return self

    def description(self) -> dict[str, Any]:
        """What every saved encoder records next to its kind's own settings."""
        return {"label_text": self.label_text}

    def forward(self, texts: list[str], side: str = "query") -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def encode_pair(self, query_texts: Sequence[str], label_texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and label vectors of one training step, with gradients. Encoders whose two sides share their
        weights override it to encode both sides in one pass."""
        return self(list(query_texts), "query"), self(list(label_texts), "label")

    def length_keys(self, texts: Sequence[str], side: str) -> np.ndarray:
        """What :meth:`encode` sorts texts by before batching them, so that a batch's texts cost alike: their
        length in characters here; a subword encoder gives its token counts."""
        return np.fromiter((len(t) for t in texts), np.int64, count=len(texts))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @torch.no_grad()
    def encode(self, texts: Sequence[str], side: str = "query", batch_size: int = 256, progress: bool = False,
               out: np.ndarray | None = None) -> np.ndarray:
        """Embeddings as float32 numpy, in eval mode (no dropout), batched; written into ``out`` when given (any
        float dtype, e.g. a float16 memory-mapped file for 10^6 labels: no whole float32 copy is made)."""
        from xmc.encoders import cache as encode_cache
        from xmc.parallel import initialised_context

        store, key = encode_cache.active(), None
        # not under data parallelism: a rank that hits while another misses would skip the misser's gathers
        if out is None and store is not None and len(texts) >= store.min_texts and initialised_context() is None:
            key = encode_cache.encoding_key(self, list(texts), side)
            hit = store.get(key) if key else None
            if hit is not None and hit.shape == (len(texts), self.dim):
                log.info("%s %s texts: %s", f"{len(texts):,}", side, f"from the encoding cache ({store.directory})")
                return hit
        was_training = self.training
        self.eval()
        # batches of similar length waste little compute on padding; results are put back in order
        order = np.argsort(self.length_keys(texts, side), kind="stable")
        if out is None:
            out = np.zeros((len(texts), self.dim), np.float32)
        elif out.shape != (len(texts), self.dim):
            raise ValueError(f"out has shape {out.shape}, expected {(len(texts), self.dim)}")
        it = range(0, len(texts), batch_size)
        for s in tqdm(it, desc=f"encode {side} texts", unit="batch", disable=not progress, mininterval=10):
            idx = order[s : s + batch_size]
            out[idx] = self([texts[i] for i in idx], side).float().cpu().numpy()
        self.train(was_training)
        if key:
            store.put(key, out)
        return out

    def save(self, path: str | Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def build_encoder(cfg: dict[str, Any] | None) -> TextEncoder:
    """Encoder from a params.yaml ``encoder`` section (partial: the schema's defaults fill the rest)."""
    from xmc.encoders.bow import HashedBagOfWordsEncoder
    from xmc.encoders.transformer import TransformerEncoder

    cfg = filled(EncoderConfig, cfg, "encoder")
    if cfg["kind"] == "transformer":
        enc: TextEncoder = TransformerEncoder(
            model_dir=cfg["model_dir"],
            pooling=cfg["pooling"],
            max_len_query=cfg["max_len_query"],
            max_len_label=cfg["max_len_label"],
            tied=cfg["tied"],
            dropout=cfg["dropout"],
            freeze_embeddings=cfg["freeze_embeddings"],
            label_text=cfg["label_text"],
        )
        return enc
    enc = HashedBagOfWordsEncoder(   # kind is "transformer" or "bow" (the schema refuses any other)
        dim=cfg["dim"],
        n_buckets=cfg["n_buckets"],
        ngram_max=cfg["ngram_max"],
        tied=cfg["tied"],
        dropout=cfg["dropout"],
        seed=cfg["seed"],
        label_text=cfg["label_text"],
    )
    return enc


def load_encoder(path: str | Path, trainable: bool = False, untouched: str = "zero") -> TextEncoder:
    """Load an encoder saved by ``TextEncoder.save`` (reads ``xmc_encoder.json``). ``trainable``: to train it further
    (a bag-of-words encoder is stored for prediction, its untouched rows rebuilt for training). ``untouched``: a
    bag-of-words encoder's buckets training never moved, ``zero`` or ``init`` (:meth:`HashedBagOfWordsEncoder.load`)."""
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
    enc = TransformerEncoder.load(path) if kind == "transformer" else HashedBagOfWordsEncoder.load(
        path, untouched=untouched, trainable=trainable)
    view = cfg["label_text"] if "label_text" in cfg else "full"   # folders saved before the knob: the full text
    try:
        return enc.set_label_text(view)
    except ConfigError:
        raise ConfigError(f"{cfg_path}: label_text must be one of full, names, description (got {view!r})") from None
