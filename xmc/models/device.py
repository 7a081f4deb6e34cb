"""Where a model computes: the one device policy of training and prediction."""

from __future__ import annotations

from typing import Any

import torch


def resolve_device(name: str) -> torch.device:
    """``auto``: the GPU when one is visible (``CUDA_VISIBLE_DEVICES=""`` hides it), else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def on_inference_device(module: Any) -> Any:
    """The encoder (or model) on the inference device: label and query encoding is most of a predictor's time."""
    return module.to(resolve_device("auto"))
