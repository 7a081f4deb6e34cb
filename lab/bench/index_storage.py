"""float16 against float32 index storage: recall@k against exact float32 search, bytes, build and search time.

The label vectors are a trained encoder's (``--encoder``, a saved bag-of-words or transformer encoder) over the
label texts of a processed dataset (``--processed``); the queries are its validation texts. Every index is scored
against the exact float32 top-k of the same queries (the truth), so the float16 rows show what the quantisation
costs and the HNSW rows what the graph search costs, alone and together.

    python -m lab.bench.index_storage --encoder models/dexml_bow --processed data/processed [--queries 1000] \\
        [--k 100] [--labels 0] [--out lab/bench/index_storage.json]

``--labels N`` (N > number of labels) tiles the label vectors with small noise up to N rows, to see the
approximate indexes at a size where ``index.kind: auto`` picks them. Not a test.
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
STORAGES = ("float32", "float16")


def index_bytes(index: Any) -> int:
    import faiss

    return int(faiss.serialize_index(index.index).nbytes)


def measure(vectors: np.ndarray, queries: np.ndarray, k: int, truth: np.ndarray, kind: str, storage: str,
            hnsw_m: int, ef_searches: list[int]) -> list[dict[str, Any]]:
    """One index built, searched at each efSearch (HNSW) or once (exact)."""
    from xmc.ann import ANNIndex

    t0 = time.perf_counter()
    index = ANNIndex(kind=kind, storage=storage, hnsw_m=hnsw_m, use_gpu=False).build(vectors)
    build = time.perf_counter() - t0
    rows = []
    for ef in (ef_searches if kind == "hnsw" else [0]):
        index.ef_search = ef or index.ef_search
        t0 = time.perf_counter()
        _, ids = index.search(queries, k)
        search = time.perf_counter() - t0
        recall = float(np.mean([len(set(a[a >= 0]) & set(t[t >= 0])) / max(1, int((t >= 0).sum()))
                                for a, t in zip(ids, truth)]))
        rows.append({"kind": kind, "storage": storage, **({"ef_search": ef} if kind == "hnsw" else {}),
                     "recall_at_k": round(recall, 4), "index_mib": round(index_bytes(index) / 2**20, 1),
                     "build_seconds": round(build, 2), "search_ms_per_query": round(1000 * search / len(queries), 3)})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--processed", required=True)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--labels", type=int, default=0)
    ap.add_argument("--hnsw-m", type=int, default=32)
    ap.add_argument("--ef-search", default="128,512", help="HNSW efSearch values, comma-separated")
    ap.add_argument("--out", default=str(BENCH / "index_storage.json"))
    a = ap.parse_args(argv)

    from xmc.ann import ANNIndex
    from xmc.data import load_processed
    from xmc.encoders.build import load_encoder

    ds = load_processed(a.processed, splits=("val",), without_training=True)
    enc = load_encoder(a.encoder)
    t0 = time.perf_counter()
    vectors = enc.encode(ds.label_texts, "label", 1024, True)
    encode_seconds = time.perf_counter() - t0
    if a.labels > len(vectors):   # tiled with noise: the real vectors' geometry at a larger size
        rng = np.random.default_rng(0)
        reps = -(-a.labels // len(vectors))
        scale = 0.05 * float(np.std(vectors))
        vectors = np.concatenate([vectors + (r > 0) * scale * rng.standard_normal(vectors.shape).astype(np.float32)
                                  for r in range(reps)])[: a.labels]
    queries = enc.encode(list(ds.val.texts[: a.queries]), "query", 1024, False)
    _, truth = ANNIndex(kind="exact", storage="float32", use_gpu=False).build(vectors).search(queries, a.k)
    rows = []
    efs = [int(e) for e in a.ef_search.split(",")]
    rows = []
    for kind in ("exact", "hnsw"):
        for storage in STORAGES:
            for row in measure(vectors, queries, a.k, truth, kind, storage, a.hnsw_m, efs):
                rows.append(row)
                print(f"  {kind:6s} {storage:8s} ef {row.get('ef_search', 0):4d} recall@{a.k} {row['recall_at_k']:.4f}  "
                      f"{row['index_mib']:8.1f} MiB  build {row['build_seconds']:7.1f} s  "
                      f"search {row['search_ms_per_query']:.3f} ms/query", flush=True)
    out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "encoder": str(a.encoder),
           "processed": str(a.processed), "n_labels": int(len(vectors)), "dim": int(vectors.shape[1]),
           "queries": int(len(queries)), "k": a.k, "hnsw_m": a.hnsw_m,
           "encode_seconds": round(encode_seconds, 1), "truth": "exact float32 top-k", "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
