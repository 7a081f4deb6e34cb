"""Which approximate index ``index.kind: auto`` builds above ``index.auto_exact_max``: HNSW against IVF.

Training re-mines its hard negatives with a new index at every refresh (build once, search every training query,
discard), and each prediction stage builds one, so build time counts as much as search time. On clustered unit
vectors (2,000 centres + noise, d = 256, like label embeddings) of size ``--n``, with 5,000 queries near the data:
build seconds, search seconds and recall@100 against exact search, for HNSW (M 32, efConstruction 40 and 200,
efSearch 128) and IVF-Flat (4·sqrt(n) lists, nprobe 16 and 32).

    python -m lab.bench.index_choice [--n 100000] [--out lab/bench/index_choice.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def clustered(n: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    centres = rng.standard_normal((2000, d)).astype(np.float32)
    x = centres[rng.integers(0, 2000, n)] + 0.6 * rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(n, 5000, replace=False)] + 0.1 * rng.standard_normal((5000, d)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x, q


def main() -> None:
    import faiss

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, default=1e5)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "index_choice.json"))
    a = ap.parse_args()
    n, d, k = int(a.n), a.dim, 100
    x, q = clustered(n, d, np.random.default_rng(0))
    t0 = time.perf_counter()
    exact = faiss.IndexFlatIP(d)
    exact.add(x)
    _, truth = exact.search(q, k)
    rows = [{"index": "exact", "build_s": 0.0, "search_s": round(time.perf_counter() - t0, 2), "recall_at_100": 1.0}]

    def recall(ids: np.ndarray) -> float:
        return round(float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, truth)])), 3)

    for efc in (40, 200):
        idx = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = efc
        t0 = time.perf_counter()
        idx.add(x)
        build = time.perf_counter() - t0
        idx.hnsw.efSearch = 128
        t0 = time.perf_counter()
        _, ids = idx.search(q, k)
        rows.append({"index": f"hnsw M32 efConstruction {efc} efSearch 128", "build_s": round(build, 1),
                     "search_s": round(time.perf_counter() - t0, 2), "recall_at_100": recall(ids)})
        print(rows[-1], flush=True)
    nlist = int(4 * np.sqrt(n))
    for nprobe in (16, 32):
        quantizer = faiss.IndexFlatIP(d)
        idx = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        idx.train(x[np.sort(rng.choice(n, min(n, 256 * 1024), replace=False))])
        idx.add(x)
        build = time.perf_counter() - t0
        idx.nprobe = nprobe
        t0 = time.perf_counter()
        _, ids = idx.search(q, k)
        rows.append({"index": f"ivf {nlist} lists nprobe {nprobe}", "build_s": round(build, 1),
                     "search_s": round(time.perf_counter() - t0, 2), "recall_at_100": recall(ids)})
        print(rows[-1], flush=True)
    out = {"n": n, "dim": d, "queries": len(q), "cpus": os.cpu_count(), "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
