"""Text encoders behind one interface (:class:`TextEncoder`).

The names below load on first use (PEP 562), so importing a submodule that needs no torch, such as
:mod:`xmc.encoders.cache` (which every predict stage configures), does not import torch: about 1.7 s of each
stage process that predicts without an encoder (the baselines, name matching)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {"TextEncoder": "base", "build_encoder": "base", "load_encoder": "base",
          "HashedBagOfWordsEncoder": "bow", "TransformerEncoder": "transformer", "default_model_dir": "transformer"}

__all__ = ["HashedBagOfWordsEncoder", "TextEncoder", "TransformerEncoder", "build_encoder", "default_model_dir", "load_encoder"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(import_module(f"xmc.encoders.{_WHERE[name]}"), name)
        globals()[name] = value   # later lookups skip this function
        return value
    raise AttributeError(f"module 'xmc.encoders' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
