"""A content-addressed cache of large encodings, so one encoder never embeds the same texts twice.

The pipeline encodes the 25,819 semcor label texts with the untrained MiniLM twice per ``make run`` (DEXML's
first hard-negative refresh and the MiniLM zero-shot prediction), and again on every ``dvc exp run`` of a DEXML
setting: about 4 minutes each on a 2-core box. The key is everything the vectors depend on: the encoder's kind,
pooling, the side's maximum length and label view, its tokenizer (the backend's full definition, without the
per-call truncation and padding state), every weight of the side's model, the torch and transformers versions,
the way batches are formed, and the texts in order. A hit returns the stored array, which is the one encoding
these texts with these weights in this order computed, bit for bit; a changed weight or text is a different key.
Outputs therefore do not depend on whether the cache was warm, which is why it is not a DVC dependency.

Off unless configured (``params.yaml: encode_cache``, applied by the train and predict stages, or
:func:`configure`); entries are ``<sha256>.npy`` files written atomically, the least recently used removed past
``max_mb`` megabytes in all (a ``make run`` on semcor stores a few hundred MB: the entries of one run stay,
whatever order DVC runs the stages in).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def _tokenizer_definition(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:   # a slow tokenizer: its class and vocabulary stand for it
        return f"{type(tokenizer).__name__}:{sorted(tokenizer.get_vocab().items())}"
    spec = json.loads(backend.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    return json.dumps(spec, sort_keys=True)


def encoding_key(encoder: Any, texts: list[str], side: str) -> str | None:
    """The cache key of ``encoder`` embedding ``texts`` on ``side``, or None for an encoder the cache does not
    describe (only the transformer encoder is cached: a bag-of-words encoding costs less than hashing its table)."""
    if getattr(encoder, "kind", "") != "transformer":
        return None
    import transformers   # imported here: about 1 s, and only a transformer encoder's key needs its version

    h = hashlib.sha256()
    model = encoder.query_model if side == "query" else encoder.label_model
    head = {"kind": encoder.kind, "pooling": encoder.pooling, "side": side, "max_len": encoder.max_len[side],
            "label_text": encoder.label_text if side == "label" else "", "torch": torch.__version__,
            "transformers": transformers.__version__, "n": len(texts),
            # how batches are formed changes the vectors in their last bits (other matrix shapes)
            "batching": "token-sorted, length groups"}
    h.update(json.dumps(head, sort_keys=True).encode())
    h.update(_tokenizer_definition(encoder.tokenizer).encode())
    with torch.no_grad():
        for name, t in model.state_dict().items():
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(np.ascontiguousarray(t.detach().cpu().reshape(-1).view(torch.uint8).numpy()).tobytes())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()
