"""The :mod:`xmc.encoders.cache` key of one encoder embedding a list of texts (what the cached vectors depend on)."""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from typing import Any

import numpy as np
import torch


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
    h = hashlib.sha256()
    model = encoder.query_model if side == "query" else encoder.label_model
    head = {"kind": encoder.kind, "pooling": encoder.pooling, "side": side, "max_len": encoder.max_len[side],
            "label_text": encoder.label_text if side == "label" else "", "torch": torch.__version__,
            # the installed version, read without importing transformers (a bag-of-words process never loads it)
            "transformers": version("transformers"), "n": len(texts),
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
