"""``python -m xmc.ann build VECTORS.npy INDEX_DIR [--kind exact|hnsw|ivf]`` and
``python -m xmc.ann search INDEX_DIR QUERIES.npy K OUT.npz``."""

from __future__ import annotations

import argparse

import numpy as np

from xmc.ann.index import ANNIndex


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m xmc.ann")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("vectors")
    b.add_argument("index_dir")
    b.add_argument("--kind", default="exact")
    s = sub.add_parser("search")
    s.add_argument("index_dir")
    s.add_argument("queries")
    s.add_argument("k", type=int)
    s.add_argument("out")
    a = ap.parse_args()
    if a.cmd == "build":
        ANNIndex(kind=a.kind).build(np.load(a.vectors)).save(a.index_dir)
    else:
        D, I = ANNIndex.load(a.index_dir).search(np.load(a.queries), a.k)
        np.savez(a.out, scores=D, ids=I)


if __name__ == "__main__":
    main()
