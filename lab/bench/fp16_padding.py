"""float16 index storage with and without the zero-column padding of ``ANNIndex`` (d a multiple of 16).

faiss' fp16 scalar quantizer has vectorised distance code only where d is a multiple of its SIMD width and decodes
one component at a time otherwise. Each case builds the same IVF index (``ANNIndex``, float16 storage) over the
same random vectors twice, once as the library builds it (padded) and once with the padding switched off, and
times the same queries on both, alternating, in this process. Also reported: how many queries' top-k ids differ
(fp16 scores summed in another order can swap near-ties).

    python -m lab.bench.fp16_padding [--n 200000] [--queries 2000] [--dims 769,257,256] \\
        [--out lab/bench/fp16_padding.json]

Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent


def build(X: np.ndarray, nlist: int, padded: bool) -> Any:
    from xmc.ann import ANNIndex
    from xmc.ann import index as index_module

    keep = index_module.FP16_D_MULTIPLE
    index_module.FP16_D_MULTIPLE = keep if padded else 1   # d % 1 == 0: no padding
    try:
        return ANNIndex(kind="ivf", storage="float16", nlist=nlist, nprobe=32, use_gpu=False, kmeans_iters=3).build(X)
    finally:
        index_module.FP16_D_MULTIPLE = keep


def measure(d: int, n: int, m: int, k: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    Q = rng.standard_normal((m, d)).astype(np.float32)
    nlist = max(1, int(4 * np.sqrt(n)))
    idx = {"padded": build(X, nlist, True), "unpadded": build(X, nlist, False)}
    times: dict[str, list[float]] = {name: [] for name in idx}
    ids: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name, ix in idx.items():
            t = time.perf_counter()
            ids[name] = ix.search(Q, k)[1]
            times[name].append(time.perf_counter() - t)
    best = {name: min(ts) for name, ts in times.items()}
    row = {"d": d, "stored_d": {name: int(ix.index.d) for name, ix in idx.items()}, "n": n, "queries": m, "k": k,
           "nlist": nlist, "nprobe": 32, "seconds": {name: [round(t, 3) for t in ts] for name, ts in times.items()},
           "unpadded_over_padded": round(best["unpadded"] / best["padded"], 2),
           "queries_with_other_ids": int((ids["padded"] != ids["unpadded"]).any(1).sum())}
    print(f"d {d:4d}: stored d {row['stored_d']['padded']} vs {row['stored_d']['unpadded']}: "
          f"{best['padded']:.3f} s vs {best['unpadded']:.3f} s per {m} queries -> unpadded / padded "
          f"{row['unpadded_over_padded']}x; {row['queries_with_other_ids']} queries with other top-{k} ids", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=2_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--dims", default="769,257,256")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(BENCH / "fp16_padding.json"))
    a = ap.parse_args(argv)
    from xmc.machine import set_threads

    set_threads()
    rows = [measure(int(d), a.n, a.queries, a.k, a.rounds) for d in a.dims.split(",")]
    import faiss

    out = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "faiss": faiss.__version__}, "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
