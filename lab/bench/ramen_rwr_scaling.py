"""Scaling of the RAMEN graph stage's random walk with restart (vectorised numpy/scipy vs networkx).

Synthetic bipartite node->anchor graphs (power-law anchor popularity, ``--degree`` edges per node)
of growing size; times :func:`xmc.graph.rwr.augment_edges` (walks from every node and every anchor,
400 hops, restart 0.8) and, on a small sample of start nodes, a plain-Python walk over a networkx
graph (the per-step cost a networkx implementation pays), extrapolated to the same walker count.

    python -m lab.bench.ramen_rwr_scaling [--sizes 100000 300000 1000000] [--walks 1 8] [--out FILE]

Not a test: run it on an idle machine (1 thread: XMC_THREADS=1 OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import json
import time

import networkx as nx
import numpy as np
import scipy.sparse as sp

from xmc.graph.rwr import augment_edges


def synthetic(n_total: int, degree: int, seed: int = 0) -> sp.csr_matrix:
    """n_total/2 nodes and n_total/2 anchors; anchors drawn with Zipf-like popularity."""
    rng = np.random.default_rng(seed)
    n = m = n_total // 2
    p = 1.0 / np.arange(1, m + 1) ** 0.8
    p /= p.sum()
    rows = np.repeat(np.arange(n), degree)
    cols = rng.choice(m, n * degree, p=p)
    E = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, m))
    E.data[:] = 1.0
    return E


def networkx_walk_seconds_per_walker(E: sp.csr_matrix, hops: int, restart: float, sample: int = 200) -> float:
    """Seconds per walker of a Python random walk over a networkx graph (sampled)."""
    n = E.shape[0]
    G = nx.Graph()
    coo = E.tocoo()
    G.add_edges_from(zip(coo.row.tolist(), (coo.col + n).tolist()))
    rng = np.random.default_rng(0)
    starts = rng.choice(np.array(list(G.nodes)), sample)
    t = time.perf_counter()
    for s in starts:
        cur, visits = s, {}
        for _ in range(hops):
            nb = list(G.neighbors(cur))
            cur = s if (rng.random() < restart or not nb) else nb[rng.integers(len(nb))]
            visits[cur] = visits.get(cur, 0) + 1
    return (time.perf_counter() - t) / sample


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    ap.add_argument("--walks", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--degree", type=int, default=4)
    ap.add_argument("--hops", type=int, default=400)
    ap.add_argument("--restart", type=float, default=0.8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for size in a.sizes:
        E = synthetic(size, a.degree)
        starts = int((E.getnnz(1) > 0).sum() + (E.getnnz(0) > 0).sum())
        for w in a.walks:
            t = time.perf_counter()
            aug, info = augment_edges(E, walks=w, hops=a.hops, restart=a.restart, top_k=3, min_visits=2)
            sec = time.perf_counter() - t
            row = {"nodes_total": size, "edges": int(E.nnz), "start_nodes": starts, "walks": w,
                   "walker_hops": starts * w * a.hops, "seconds": round(sec, 2),
                   "million_walker_hops_per_s": round(starts * w * a.hops / sec / 1e6, 2), **info}
            rows.append(row)
            print(json.dumps(row), flush=True)
    nxs = networkx_walk_seconds_per_walker(synthetic(min(a.sizes), a.degree), a.hops, a.restart)
    out = {"runs": rows, "networkx_python_seconds_per_walker": round(nxs, 5),
           "networkx_extrapolated_seconds": {f"{r['nodes_total']}x{r['walks']}": round(nxs * r["start_nodes"] * r["walks"], 1)
                                             for r in rows}}
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=2))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
