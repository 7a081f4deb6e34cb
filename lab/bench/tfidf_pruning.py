"""Capped TF-IDF postings (``tfidf_zeroshot.max_postings_per_term``, ``tfidf_knn.max_postings_per_term``):
validation metrics and time against the exact sparse product, at several caps, in one run.

An exact TF-IDF zero-shot or kNN scores each query against every item sharing a term with it; with a fixed
vocabulary that work grows with the number of items, so the whole stage is quadratic in the data size (the scale
benchmark measured 13.6 s at 10^5 and 540 s at 10^6 for zero-shot). Capping each term's postings at its N
highest-weighted items (``xmc.sparse_topk.prune_postings``) bounds a query's work; this script shows what it costs
in P@1, P@5 and R@100 on the validation split (never the test split) of a DVC workspace whose ``tfidf`` stage ran.

    python -m lab.bench.tfidf_pruning --repo WORKSPACE [--caps 0,300,1000,3000,10000] [--queries 10000]
        [--out lab/bench/tfidf_pruning.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", required=True, help="a workspace whose ingest and tfidf stages ran")
    ap.add_argument("--caps", default="0,300,1000,3000,10000")
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--out", default=str(BENCH / "tfidf_pruning.json"))
    a = ap.parse_args(argv)

    from xmc.baselines.tfidf import knn_label_voting, tfidf_zero_shot
    from xmc.data import load_processed
    from xmc.metrics import evaluate_topk
    from xmc.package.lexical_predictors import _load_csr, _load_vectorizer
    from xmc.sparse_topk import prune_postings

    repo = Path(a.repo)
    ds = load_processed(repo / "data" / "processed", splits=("trn", "val"))
    feats = repo / "data" / "tfidf"
    vec = _load_vectorizer(feats)
    X_lbl, X_trn = _load_csr(feats / "X_lbl.npz"), _load_csr(feats / "X_trn.npz")
    n = min(a.queries, len(ds.val))
    Xq = vec.transform(list(ds.val.texts[:n])).tocsr()
    Yq = ds.val.Y[:n].tocsr()
    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    rows = []
    for method in ("tfidf_zeroshot", "tfidf_knn"):
        for cap in [int(c) for c in a.caps.split(",")]:
            side = X_lbl if method == "tfidf_zeroshot" else X_trn
            t0 = time.perf_counter()
            pruned = prune_postings(side, cap)
            prune_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            if method == "tfidf_zeroshot":
                top = tfidf_zero_shot(Xq, pruned, 100)
            else:
                top = knn_label_voting(Xq, pruned, ds.trn.Y, 10, 100)
            search_s = time.perf_counter() - t0
            m = evaluate_topk(top, Yq, freq, len(ds.trn), ks=(1, 5), recall_ks=(100,))["metrics"]
            row = {"method": method, "max_postings_per_term": cap, "kept_entries": round(pruned.nnz / max(side.nnz, 1), 4),
                   "P@1": round(m["P@1"], 2), "P@5": round(m["P@5"], 2), "R@100": round(m["R@100"], 2),
                   "prune_seconds": round(prune_s, 2), "search_seconds": round(search_s, 2)}
            rows.append(row)
            print(f"  {method:15s} cap {cap:>6}  kept {row['kept_entries']:.3f}  P@1 {row['P@1']:6.2f}  "
                  f"P@5 {row['P@5']:6.2f}  R@100 {row['R@100']:6.2f}  search {search_s:7.2f} s", flush=True)
    out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "repo": str(repo),
           "n_labels": int(X_lbl.shape[0]), "n_train": int(X_trn.shape[0]), "split": "val", "queries": n, "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
