"""An encoder from its params ``encoder`` section (:func:`build_encoder`) or from its saved folder
(:func:`load_encoder`): above :mod:`xmc.encoders.base` and the encoder kinds, which import the base class.

The kinds are read off their modules when called (``bow.HashedBagOfWordsEncoder``), so a test that replaces a
kind's class in its module reaches these builders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xmc.encoders.bow as bow
import xmc.encoders.transformer as transformer
from xmc.config.schema import EncoderConfig, filled
from xmc.encoders.base import TextEncoder
from xmc.errors import ConfigError
from xmc.io import read_json_file


def build_encoder(cfg: dict[str, Any] | None) -> TextEncoder:
    """Encoder from a params.yaml ``encoder`` section (partial: the schema's defaults fill the rest)."""
    cfg = filled(EncoderConfig, cfg, "encoder")
    if cfg["kind"] == "transformer":
        enc: TextEncoder = transformer.TransformerEncoder(
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
    enc = bow.HashedBagOfWordsEncoder(   # kind is "transformer" or "bow" (the schema refuses any other)
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
    path = Path(path)
    cfg_path = path / "xmc_encoder.json"
    if not cfg_path.exists():
        raise ConfigError(f"{cfg_path}: not a saved encoder folder (missing xmc_encoder.json)")
    cfg = read_json_file(cfg_path, "an encoder description")
    kind = cfg.get("kind") if isinstance(cfg, dict) else None
    if kind not in ("transformer", "bow"):
        raise ConfigError(f"{cfg_path}: unknown encoder kind {kind!r} (expected transformer or bow)")
    enc = transformer.TransformerEncoder.load(path) if kind == "transformer" else bow.HashedBagOfWordsEncoder.load(
        path, untouched=untouched, trainable=trainable)
    view = cfg["label_text"] if "label_text" in cfg else "full"   # folders saved before the knob: the full text
    try:
        return enc.set_label_text(view)
    except ConfigError:
        raise ConfigError(f"{cfg_path}: label_text must be one of full, names, description (got {view!r})") from None


__all__ = ["build_encoder", "load_encoder"]
