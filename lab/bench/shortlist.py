"""The TF-IDF shortlist's knobs on a kept workspace's validation split: ``index.shortlist_k`` and
``index.shortlist_max_postings_per_term`` against exact search over every label, on one trained run.

Per setting: seconds per 1,000 validation texts (shortlist and re-rank), recall@100 against exact search, P@1 /
P@5 / PSP@5 / R@100, and the paired bootstrap of P@5 against exact search and against the first setting listed.
Validation texts only; the library's own code (:class:`xmc.package.shortlist_predictor.ShortlistPredictor`'s parts).

    python -m lab.bench.shortlist --workspace lab/bench/.scale/repo_100000 --run dexml_bow \\
        --out lab/bench/shortlist_1e5_dexml_bow.json

Any workspace with a dense package in ``packages/<run>`` and the tfidf stage's ``data/tfidf`` works.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workspace", default="lab/bench/.scale/repo_100000")
    ap.add_argument("--run", default="dexml_bow")
    ap.add_argument("--settings", default="200:1000,100:1000,500:1000,1000:1000,200:0",
                    help="shortlist_k:max_postings_per_term pairs; the first is the reference of the paired tests")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from lab.bench.workspace import load_dense_run

    ws, _, ds, predictor = load_dense_run(args.workspace, args.run, args.threads)
    import faiss
    import scipy.sparse as sp
    import torch

    from xmc.ann.index import recall_of
    from xmc.ann.shortlist import rerank, shortlist_candidates
    from xmc.metrics.bootstrap import instance_contributions, paired_bootstrap, verdict
    from xmc.package.lexical_predictors import _load_vectorizer
    from xmc.predictions import TopK
    from xmc.sparse_topk import prune_postings

    V = np.ascontiguousarray(predictor.index.vectors(), dtype=np.float32)
    texts = ds.val.texts
    with torch.inference_mode():
        Q = predictor.query_vectors(texts)
    vec = _load_vectorizer(ws / "data" / "tfidf")
    X_lbl = sp.load_npz(ws / "data" / "tfidf" / "X_lbl.npz").tocsr()
    Y, freq, n_train = ds.val.Y.tocsr(), np.asarray(ds.trn.Y.sum(axis=0)).ravel(), ds.trn.Y.shape[0]

    def contributions(ids: np.ndarray, scores: np.ndarray) -> Any:
        return instance_contributions(TopK(ids.astype(np.int32), scores.astype(np.float32)), Y, freq, n_train)

    def shown(c: Any) -> dict[str, float]:
        return {m: round(v, 2) for m, v in c.values().items() if m in ("P@1", "P@5", "PSP@5", "R@100")}

    flat = faiss.IndexFlatIP(V.shape[1])
    flat.add(V)
    t0 = time.perf_counter()
    D_e, I_e = flat.search(Q, 100)
    exact_s = time.perf_counter() - t0
    c_exact = contributions(I_e, D_e)
    out: dict[str, Any] = {"workspace": str(ws), "run": args.run, "labels": len(V), "dim": int(V.shape[1]),
                           "validation_texts": len(texts), "threads": args.threads,
                           "exact": {"s_per_1000": round(1000 * exact_s / len(texts), 3), **shown(c_exact)},
                           "settings": {}}
    print(f"{args.run}: {len(V)} labels, {len(texts)} validation texts; exact {out['exact']}", flush=True)
    t0 = time.perf_counter()
    X_q = vec.transform(texts).tocsr()
    transform_s = time.perf_counter() - t0
    first = None
    for item in args.settings.split(","):
        k_s, cap = (int(x) for x in item.split(":"))
        t0 = time.perf_counter()
        X_c = prune_postings(X_lbl, cap)
        prune_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        C = shortlist_candidates(X_q, X_c, k_s)
        cand_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        D, I = rerank(Q, V, C, 100)
        rerank_s = time.perf_counter() - t0
        short = np.flatnonzero((C >= 0).sum(1) < 100)
        t0 = time.perf_counter()
        if short.size:   # as the predictor: a text with fewer than k shortlisted labels is searched over every label
            D[short], I[short] = flat.search(Q[short], 100)
        full_s = time.perf_counter() - t0
        c = contributions(I, D)
        vs_exact = paired_bootstrap(c, c_exact, "P@5")
        row = {"shortlist_k": k_s, "max_postings_per_term": cap,
               "s_per_1000": {"tfidf_transform": round(1000 * transform_s / len(texts), 3),
                              "shortlist": round(1000 * cand_s / len(texts), 3),
                              "rerank": round(1000 * rerank_s / len(texts), 3),
                              "full_searches": round(1000 * full_s / len(texts), 3)},
               "prune_seconds": round(prune_s, 2), "postings_kept": int(X_c.nnz), "postings": int(X_lbl.nnz),
               "full_searches": int(short.size), "mean_candidates": round(float((C >= 0).sum(1).mean()), 1),
               "recall_at_100_vs_exact": round(recall_of(I, I_e), 4), **shown(c),
               "P@5_vs_exact": {**{k: vs_exact[k] for k in ("diff", "ci95", "p_value")},
                                "verdict": verdict(vs_exact["p_value"], vs_exact["diff"])}}
        if first is None:
            first = (item, c)
        else:
            vs_first = paired_bootstrap(c, first[1], "P@5")
            row[f"P@5_vs_{first[0]}"] = {**{k: vs_first[k] for k in ("diff", "ci95", "p_value")},
                                         "verdict": verdict(vs_first["p_value"], vs_first["diff"])}
        out["settings"][item] = row
        print(f"  {item}: {row}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
