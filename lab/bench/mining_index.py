"""The hard-negative mining index at scale: its lists, its search rate and its recall, float32 against float16.

Mining builds ``ANNIndex(kind=<negatives.index_kind>)`` over every label vector at each refresh and searches the
training queries (:func:`xmc.negatives.samplers.mine_shortlist`); above ``index.auto_exact_max`` labels ``auto`` is
IVF. This measures that index on a scale-benchmark workspace (``make scale-bench`` keeps them under
``lab/bench/.scale/repo_<L>``): the label texts and the first ``--queries`` training texts, under the untrained
bag-of-words encoder (what the scale profile's first refresh mines with) and the trained ``dexml_bow`` encoder when
the workspace has it. Per storage: build seconds, list-size statistics, codes scanned per query, queries/s of the
search and recall@100 against exact search on ``--recall-queries`` queries; then the float32/float16 ratio of
queries/s, measured in the same process.

    python -m lab.bench.mining_index [--workspace lab/bench/.scale/repo_1000000] [--queries 10000]
                                     [--out lab/bench/mining_index_1e6.json]

Not a test: run it on an idle machine (about 10 minutes at 10^6 labels on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def _texts(path: Path, n: int | None = None) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if n is not None and i >= n:
                break
            out.append(json.loads(line)["text"])
    return out


def measure_index(label_vecs: np.ndarray, query_vecs: np.ndarray, storage: str, exact_ids: np.ndarray,
                  k: int = 120) -> dict[str, Any]:
    import faiss

    from xmc.ann import ANNIndex

    t0 = time.perf_counter()
    index = ANNIndex(kind="ivf", storage=storage).build(label_vecs)
    build = time.perf_counter() - t0
    ivf = faiss.extract_index_ivf(index.index)
    sizes = np.array([ivf.invlists.list_size(i) for i in range(ivf.nlist)])
    index.search(query_vecs[:200], k)   # warm-up
    faiss.cvar.indexIVF_stats.reset()
    t0 = time.perf_counter()
    _, ids = index.search(query_vecs, k)
    search = time.perf_counter() - t0
    ndis = faiss.cvar.indexIVF_stats.ndis
    n_rec = len(exact_ids)
    recall = float(np.mean([len(set(a[:100]) & set(b)) / 100 for a, b in zip(ids[:n_rec], exact_ids)]))
    return {"storage": storage, "nlist": int(ivf.nlist), "nprobe": int(ivf.nprobe), "build_seconds": round(build, 1),
            "imbalance_factor": round(float(ivf.invlists.imbalance_factor()), 2),
            "list_size_mean": round(float(sizes.mean()), 1), "list_size_p99": int(np.quantile(sizes, 0.99)),
            "list_size_max": int(sizes.max()), "empty_lists": int((sizes == 0).sum()),
            "codes_scanned_per_query": round(ndis / len(query_vecs), 0),
            "equal_lists_codes_per_query": round(ivf.nprobe / ivf.nlist * len(label_vecs), 0),
            "queries_per_s": round(len(query_vecs) / search, 1), "recall_at_100": round(recall, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", default="lab/bench/.scale/repo_1000000")
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--recall-queries", type=int, default=1000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import faiss
    import torch

    from xmc.encoders.build import build_encoder, load_encoder
    from xmc.machine import describe_machine

    threads = int(os.environ.get("XMC_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    ws = Path(a.workspace)
    proc = ws / "data" / "processed"
    labels = _texts(proc / "lbl.jsonl")
    queries = _texts(proc / "trn.jsonl", a.queries)
    print(f"{len(labels):,} labels, {len(queries):,} queries", flush=True)
    from xmc.config import load_params
    from xmc.config.runs import resolve_run

    params = load_params(ws / "params.yaml")
    encoders: dict[str, Any] = {"untrained": build_encoder(resolve_run(params, "dexml_bow").config["encoder"])}
    if (ws / "models" / "dexml_bow").is_dir():
        encoders["trained_dexml_bow"] = load_encoder(ws / "models" / "dexml_bow")
    out: dict[str, Any] = {"machine": describe_machine(), "workspace": str(ws), "labels": len(labels),
                           "queries": len(queries), "encoders": {}}
    for name, enc in encoders.items():
        enc.eval()
        lv = enc.encode(labels, "label", 4096)
        qv = enc.encode(queries, "query", 4096)
        exact = faiss.IndexFlatIP(lv.shape[1])
        exact.add(lv)
        t0 = time.perf_counter()
        _, exact_ids = exact.search(qv[: a.recall_queries], 100)
        exact_qps = a.recall_queries / (time.perf_counter() - t0)
        rows = {s: measure_index(lv, qv, s, exact_ids) for s in ("float32", "float16")}
        rows["exact_queries_per_s"] = round(exact_qps, 1)
        rows["float32_over_float16_queries_per_s"] = round(rows["float32"]["queries_per_s"]
                                                           / rows["float16"]["queries_per_s"], 2)
        out["encoders"][name] = rows
        for s in ("float32", "float16"):
            print(name, json.dumps(rows[s]), flush=True)
        print(f"{name}: exact {exact_qps:.1f} queries/s; float32 / float16 queries/s = "
              f"{rows['float32_over_float16_queries_per_s']}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
