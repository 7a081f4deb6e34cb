"""A content-addressed cache of large encodings, so one encoder never embeds the same texts twice.

The pipeline encodes the 25,819 semcor label texts with the untrained MiniLM twice per ``make run`` (DEXML's
first hard-negative refresh and the MiniLM zero-shot prediction), and again on every ``dvc exp run`` of a DEXML
setting: about 4 minutes each on a 2-core box. The key is everything the vectors depend on: the encoder's kind,
pooling, the side's maximum length and label view, its tokenizer (the backend's full definition, without the
per-call truncation and padding state), every weight of the side's model, the torch and transformers versions,
the way batches are formed, and the texts in order. A hit returns the stored array, which is the one encoding
these texts with these weights in this order computed, bit for bit; a changed weight or text is a different key.
Outputs therefore do not depend on whether the cache was warm, which is why it is not a DVC dependency.

The key itself (:func:`xmc.encoders.encoding_key.encoding_key`) reads the model's weights, so it lives beside the
encoders; this module is only the store and its settings, which the stages apply without importing torch.

Off unless configured (``params.yaml: encode_cache``, applied by the train and predict stages, or
:func:`configure`); entries are ``<sha256>.npy`` files written atomically, the least recently used removed past
``max_mb`` megabytes in all (a ``make run`` on semcor stores a few hundred MB: the entries of one run stay,
whatever order DVC runs the stages in).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xmc.io import atomic_file


@dataclass
class EncodeCache:
    directory: Path
    min_texts: int = 2000      # smaller encodings are cheaper than hashing the weights
    max_mb: float = 1024.0

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.npy"

    def get(self, key: str) -> np.ndarray | None:
        p = self.path(key)
        try:
            arr = np.load(p)
        except (OSError, ValueError):
            return None
        os.utime(p)   # recently used
        return arr

    def put(self, key: str, arr: np.ndarray) -> None:
        with atomic_file(self.path(key), "wb", encoding=None) as f:
            np.save(f, arr)
        entries = sorted(self.directory.glob("*.npy"), key=lambda p: p.stat().st_mtime)   # oldest use first
        total = sum(p.stat().st_size for p in entries)
        for old in entries[:-1]:   # the entry just written stays
            if total <= self.max_mb * 2**20:
                break
            total -= old.stat().st_size
            old.unlink(missing_ok=True)


_CACHE: EncodeCache | None = None


def configure(directory: str | Path | None, min_texts: int = 2000, max_mb: float = 1024.0) -> None:
    """Turn the cache on in ``directory`` (None turns it off) for this process."""
    global _CACHE
    _CACHE = None if directory is None else EncodeCache(Path(directory), int(min_texts), float(max_mb))


def configure_from_params(params: dict[str, Any]) -> None:
    cfg = params.get("encode_cache") or {}
    configure(cfg.get("dir"), cfg.get("min_texts", 2000), cfg.get("max_mb", 1024.0))


def active() -> EncodeCache | None:
    return _CACHE
