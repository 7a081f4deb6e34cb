"""Does an IVF partition keep what the task needs, on a kept scale workspace's trained bag-of-words vectors?

The prediction index calibrates to recall@100 against exact search (``index.recall_target``). On the synthetic
data's one-epoch vectors IVF reaches 0.9 only near every list, so the index falls back to a PQ scan of every
label (lab/docs/scale.md). This asks two further questions on the same vectors:

* is what IVF misses only the exact top-100's tail, or also the relevant labels? Per ``nprobe``: recall@100
  against exact search, the share of exact search's relevant hits (relevant labels in its top 100) that IVF
  keeps, and P@1 / P@5 / R@100 on the validation queries against exact search's;
* does a partition trained on the *queries* do better? The inverted lists' centroids are the spherical k-means of
  training query vectors (labels assigned to their best centroid by inner product) instead of label vectors'.

    python -m lab.bench.ivf_partition --workspace lab/bench/.scale/repo_100000 --run dexml_bow \
        --out lab/bench/ivf_partition_1e5.json

Any workspace with a dense package works, the product's too: ``--workspace . --run dexml_bow`` (the
bag-of-words vectors of real text, ``lab/bench/ivf_partition_semcor.json``); ``lab/bench/ivf_partition_semcor_dexml.json``
was MiniLM's (the lab's ``dexml`` run, which keeps no package now: ``--run minilm_zeroshot`` is the product's MiniLM).

The workspace's own code and params load its data and predictor (``packages/<run>``). Validation queries only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def _metrics(ids: np.ndarray, scores: np.ndarray, Y: Any, train_freq: np.ndarray, n_train: int) -> dict[str, float]:
    """P@1, P@5 and R@100 (in %) as the pipeline's evaluation computes them."""
    from xmc.metrics import evaluate_topk
    from xmc.predictions import TopK

    m = evaluate_topk(TopK(ids.astype(np.int32), scores.astype(np.float32)), Y, train_freq, n_train)
    return {k: round(float(m["metrics"][k]), 2) for k in ("P@1", "P@5", "R@100")}


def _hit_retention(ids: np.ndarray, exact: np.ndarray, Y: Any) -> float:
    """Of the relevant labels in exact search's top 100 (all queries), the share also in ``ids``."""
    kept = total = 0
    for r in range(len(ids)):
        rel = set(Y.indices[Y.indptr[r]:Y.indptr[r + 1]].tolist())
        hits = rel & set(exact[r].tolist())
        total += len(hits)
        kept += len(hits & set(ids[r].tolist()))
    return kept / max(total, 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workspace", default="lab/bench/.scale/repo_100000")
    ap.add_argument("--run", default="dexml_bow")
    ap.add_argument("--nlist", type=int, default=0, help="inverted lists (default: 4·sqrt(labels), as ANNIndex)")
    ap.add_argument("--nprobes", default="8,32,128,512")
    ap.add_argument("--train-queries", type=int, default=100_000, help="training queries the query k-means sees")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from lab.bench.workspace import load_dense_run

    ws, _, ds, predictor = load_dense_run(args.workspace, args.run, args.threads)
    import faiss
    import torch

    from xmc.ann.index import ANNIndex, recall_of

    V = np.ascontiguousarray(predictor.index.vectors(), dtype=np.float32)
    d, L = V.shape[1], len(V)
    nlist = args.nlist or ANNIndex().nlist_for(L)   # the library's IVF sizing
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(len(ds.trn.texts), min(args.train_queries, len(ds.trn.texts)), replace=False))
    with torch.inference_mode():
        Qv = predictor.query_vectors(ds.val.texts)
        Qtrn = predictor.query_vectors([ds.trn.texts[i] for i in sample])
    Yv = ds.val.Y.tocsr()
    train_freq = np.asarray(ds.trn.Y.sum(axis=0)).ravel()
    n_train = ds.trn.Y.shape[0]

    flat = faiss.IndexFlatIP(d)
    flat.add(V)
    t0 = time.perf_counter()
    exact_scores, exact = flat.search(Qv, 100)
    exact_s = time.perf_counter() - t0
    out: dict[str, Any] = {
        "workspace": str(ws), "run": args.run, "labels": L, "dim": d, "nlist": nlist,
        "validation_queries": len(Qv), "threads": args.threads,
        "exact": {"s_per_1000": round(1000 * exact_s / len(Qv), 3),
                  **_metrics(exact, exact_scores, Yv, train_freq, n_train)}, "partitions": {}}
    print(f"{args.run}: {L} labels, {len(Qv)} validation queries; exact {out['exact']}", flush=True)

    def kmeans(X: np.ndarray) -> tuple[np.ndarray, float]:
        t = time.perf_counter()
        km = faiss.Kmeans(d, nlist, niter=10, spherical=True, seed=1, max_points_per_centroid=256)
        km.train(np.ascontiguousarray(X))
        return km.centroids, time.perf_counter() - t

    for name, X in (("label_centroids", V), ("query_centroids", Qtrn)):
        C, kmeans_s = kmeans(X)
        quantizer = faiss.IndexFlatIP(d)
        quantizer.add(C)
        ivf = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.is_trained = True   # the centroids are given; each label goes to its best one by inner product
        ivf.add(V)
        rows = {}
        for nprobe in (int(x) for x in args.nprobes.split(",")):
            ivf.nprobe = nprobe
            t = time.perf_counter()
            scores, ids = ivf.search(Qv, 100)
            s = time.perf_counter() - t
            rows[str(nprobe)] = {"s_per_1000": round(1000 * s / len(Qv), 3),
                                 "recall_at_100_vs_exact": round(recall_of(ids, exact), 4),
                                 "relevant_hits_kept": round(_hit_retention(ids, exact, Yv), 4),
                                 **_metrics(ids, scores, Yv, train_freq, n_train)}
            print(f"  {name} nprobe {nprobe}: {rows[str(nprobe)]}", flush=True)
        out["partitions"][name] = {"kmeans_s": round(kmeans_s, 1), "kmeans_points": len(X), "nprobe": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
