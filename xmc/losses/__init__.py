"""Losses over a (queries x candidate labels) score block.

Every loss is ``forward(scores, positives, valid=None, weights=None) -> scalar``:
``scores`` (B, C) similarities, ``positives`` (B, C) bool, ``valid`` (B, C) bool marking
real candidates (padding excluded), ``weights`` (B, C) optional per-entry weights.
The trainer knows nothing else about a loss.
"""

from typing import Any

from xmc.errors import ConfigError
from xmc.losses.bce import OneVsAllBCELoss
from xmc.losses.decoupled_softmax import DecoupledSoftmaxLoss
from xmc.losses.softmax import SoftmaxLoss
from xmc.losses.softtopk import SoftTopKLoss, log_soft_topk, soft_topk

LOSSES = {
    "decoupled_softmax": DecoupledSoftmaxLoss,
    "softmax": SoftmaxLoss,
    "softtopk": SoftTopKLoss,
    "bce": OneVsAllBCELoss,
}


def build_loss(name: str, **kwargs: Any) -> Any:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}")
    return LOSSES[name](**kwargs)


__all__ = ["LOSSES", "DecoupledSoftmaxLoss", "OneVsAllBCELoss", "SoftTopKLoss", "SoftmaxLoss", "build_loss",
           "log_soft_topk", "soft_topk"]
