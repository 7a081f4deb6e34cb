"""The TF-IDF features: one vectoriser fit on training and label texts -> ``data/tfidf`` (the baselines, MACLR's
pseudo pairs, the linear peer and the shortlist of large label spaces read them)."""

from __future__ import annotations

import time
from typing import Any

from xmc.baselines.tfidf import fit_tfidf
from xmc.data import load_processed
from xmc.io import write_json
from xmc.workspace import Workspace


def build_tfidf(params: dict[str, Any], ws: Workspace) -> dict[str, Any]:
    """One vectoriser fit on training and label texts -> ``data/tfidf`` (the test split is never read here)."""
    ds = load_processed(ws.processed, splits=("trn", "val"))
    t0 = time.perf_counter()
    feats = fit_tfidf(ds.trn.texts, ds.val.texts, ds.label_texts, params["tfidf"])
    timing = {"fit_seconds": round(time.perf_counter() - t0, 3), "vocabulary": len(feats.vectorizer.vocabulary_)}
    feats.save(ws.tfidf)
    write_json(ws.tfidf.parent / "tfidf_timing.json", timing)
    return timing


__all__ = ["build_tfidf"]
