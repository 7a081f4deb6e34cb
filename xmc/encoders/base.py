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

import xmc.encoders.cache as encode_cache
from xmc.encoders.encoding_key import encoding_key
from xmc.errors import ConfigError
from xmc.lexical.names import LABEL_TEXT_VIEWS, label_text_view
from xmc.parallel import initialised_context

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
        return [label_text_view(t, self.label_text) for t in texts]

    def set_label_text(self, view: str) -> TextEncoder:
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
        store, key = encode_cache.active(), None
        # not under data parallelism: a rank that hits while another misses would skip the misser's gathers
        if out is None and store is not None and len(texts) >= store.min_texts and initialised_context() is None:
            key = encoding_key(self, list(texts), side)
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
