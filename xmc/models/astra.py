"""A trained ASTRA model as a package serves it: the encoder Φ and the classifier table W = [w_l, b_l].

The score of label l for text x is <[Φ(x), 1], [w_l, b_l]>: the predictor indexes the rows of W and appends a
constant 1 to each query vector. Training (:mod:`xmc.methods.astra`) writes this layout; nothing here trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from xmc.encoders.base import TextEncoder
from xmc.encoders.build import load_encoder
from xmc.errors import ConfigError, DataFormatError
from xmc.io import load_tensors
from xmc.models.layout import ASTRA_DESCRIPTION, is_astra_model

DESCRIPTION = ASTRA_DESCRIPTION
CLASSIFIERS = "astra_classifiers.pt"  # {"W": n_labels x (dim + 1)}: weight rows with the bias in the last column
ENCODER = "encoder"


def load_astra(path: str | Path, n_labels: int, untouched: str = "zero") -> tuple[TextEncoder, np.ndarray]:
    """(the encoder, W as float32 numpy) of the ASTRA model folder ``path`` trained for ``n_labels`` labels
    (``untouched``: a bag-of-words encoder's untouched buckets, :func:`~xmc.encoders.build.load_encoder`)."""
    path = Path(path)
    if not is_astra_model(path):
        raise ConfigError(f"{path / DESCRIPTION}: not a saved ASTRA model")
    try:
        cfg = json.loads((path / DESCRIPTION).read_text(encoding="utf-8"))
        dim, saved = int(cfg["dim"]), int(cfg["n_labels"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFormatError(path / DESCRIPTION, None, f"not an ASTRA model description ({str(e)[:120]})") from None
    if saved != n_labels:
        raise ConfigError(f"{path}: model has {saved} labels, the data {n_labels}")
    W = load_tensors(path / CLASSIFIERS).get("W")
    if W is None or tuple(W.shape) != (saved, dim + 1):
        raise DataFormatError(path / CLASSIFIERS, None, f"expected W of shape ({saved}, {dim + 1})")
    return load_encoder(path / ENCODER, untouched=untouched), np.ascontiguousarray(W.float().numpy())


__all__ = ["CLASSIFIERS", "DESCRIPTION", "ENCODER", "is_astra_model", "load_astra"]
