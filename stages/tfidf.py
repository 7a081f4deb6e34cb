"""TF-IDF: one vectoriser fit on training and label texts -> data/tfidf (features of trn/val/lbl + vectoriser).

The test split is not read here: the baselines' prediction stages transform it with the saved vectoriser.
"""

from __future__ import annotations

import time
from pathlib import Path

from xmc.baselines import fit_tfidf
from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.io import write_json


def main() -> None:
    params = load_params()
    ds = load_processed(params["data"]["processed_dir"], splits=("trn", "val"))
    t0 = time.perf_counter()
    feats = fit_tfidf(ds.trn.texts, ds.val.texts, ds.label_texts, params["tfidf"])
    fit_seconds = time.perf_counter() - t0
    out = Path("data/tfidf")
    feats.save(out)
    write_json(out.parent / "tfidf_timing.json", {"fit_seconds": round(fit_seconds, 3), "vocabulary": len(feats.vectorizer.vocabulary_)})


if __name__ == "__main__":
    run_entry_point(main)
