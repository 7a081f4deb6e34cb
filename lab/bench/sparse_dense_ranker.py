"""Sparse + dense features for the linear peer: XR-Linear on TF-IDF ⊕ a trained encoder's query embedding.

The XR-Transformer recipe (PECOS): the final ranker is XR-Linear on the TF-IDF row concatenated with the fine-tuned
encoder's L2-normalised embedding. Here the encoder is one of our bag-of-words runs (``astra`` by default) and the
question is whether its embedding adds to what the linear model already reads in the TF-IDF, on the validation
split. Two ways to embed the training sentences:

* ``in_sample``: the run's trained encoder (``models/<run>``, the product's), as the recipe does. That encoder was fit on these
  very sentences, so their embeddings separate their labels better than a new sentence's will, and the linear model
  learns to lean on them;
* ``cross_fitted``: the training split cut into ``--folds`` folds by document group; each fold embedded by the
  run retrained (the ``train@`` stage's method, the run's own settings) on the other folds, so every training
  embedding comes from an encoder that did not see its sentence, as the validation sentences' do (those are
  embedded by ``models/<run>``).

For each way and each weight β of the dense block (β = 0 is the plain peer) XR-Linear is trained with the
product's linear-peer settings (``params.yaml: xr_linear.xr_linear``) and ranks the validation split; the JSON has
P@1 / P@5 / PSP@5 / R@100 and the paired bootstrap of each cell against β = 0 (the selection's metric and alpha,
``lab/params.yaml: selection``). The test split is not read.

Two steps in two environments (libpecos needs numpy < 2, the encoders torch)::

    python -m lab.bench.sparse_dense_ranker embed [--run astra] [--folds 5] [--work lab/bench/.sparse_dense]
    .venv-pecos/bin/python -m lab.bench.sparse_dense_ranker rank [--run astra] [--weights 0,0.25,0.5,1] \\
        [--work lab/bench/.sparse_dense] [--out lab/bench/sparse_dense_ranker.json]

Run from the repository root after ``make run`` (the run's model in ``models/<run>``, the ``tfidf`` stage's
outputs). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WAYS = ("in_sample", "cross_fitted")


def group_folds(groups: list[str | None], k: int, seed: int = 0) -> np.ndarray:
    """A fold in [0, k) per row: whole document groups to one fold (rows without a group are their own group),
    groups dealt to the folds in a seeded random order so the folds differ in size by at most one group."""
    if k < 2:
        raise ValueError(f"folds must be at least 2, got {k}")
    keys = [g if g is not None else f"\0row{i}" for i, g in enumerate(groups)]
    names = sorted(set(keys))
    if len(names) < k:
        raise ValueError(f"{len(names)} groups cannot fill {k} folds")
    order = np.random.default_rng(seed).permutation(len(names))
    fold_of = {names[j]: i % k for i, j in enumerate(order)}
    return np.fromiter((fold_of[g] for g in keys), np.int64, count=len(keys))


def _encoder_dir(model_dir: Path) -> Path:
    return model_dir / "encoder" if (model_dir / "encoder").is_dir() else model_dir


def embed(params: dict[str, Any], run: str, folds: int, work: Path) -> Path:
    """The run's query embeddings of the training split (in sample and cross-fitted) and of the validation split
    -> ``work/<run>.npz``."""
    from lab.bench.seed_study import all_runs
    from xmc.data import load_processed
    from xmc.data.dataset import Split, XMCDataset
    from xmc.encoders.build import load_encoder
    from xmc.io import atomic_file
    from xmc.machine import set_threads
    from xmc.methods import get_method
    from xmc.methods.base import RunContext
    from xmc.workspace import Workspace

    set_threads()
    ws = Workspace()
    ds = load_processed(ws.processed, splits=("trn", "val"))
    trn = ds.trn
    model_dir = ws.model(run)
    if not model_dir.is_dir():
        raise SystemExit(f"{model_dir}: model folder not found (dvc repro train@{run})")
    full = load_encoder(_encoder_dir(model_dir))
    in_sample = full.encode(list(trn.texts), "query")
    val = full.encode(list(ds.val.texts), "query")
    fold = group_folds(list(trn.groups) if trn.groups is not None else [None] * len(trn), folds)
    _, specs = all_runs()
    if run not in specs:
        raise SystemExit(f"--run {run}: not a run of params.yaml or lab/params.yaml")
    spec = specs[run]
    method = get_method(spec.method)
    cross = np.zeros_like(in_sample)
    fold_seconds = []
    for k in range(folds):
        keep = np.flatnonzero(fold != k)
        held = np.flatnonzero(fold == k)
        part = Split([trn.uids[i] for i in keep], [trn.texts[i] for i in keep], trn.Y[keep].tocsr(),
                     [trn.groups[i] for i in keep] if trn.groups is not None else None)
        fold_ds = XMCDataset(ds.label_uids, ds.label_texts, part, None, None, dict(ds.meta), val=ds.val)
        with tempfile.TemporaryDirectory(prefix="xmc-sparse-dense-") as tmp:
            root = Path(tmp)
            (root / "model").mkdir()
            ctx = RunContext(params, spec, root / "model", root / "checkpoints", root / "plots", None, ws)
            summary = method.train(ctx, fold_ds)
            cross[held] = load_encoder(_encoder_dir(root / "model")).encode([trn.texts[i] for i in held], "query")
        fold_seconds.append(summary["train_seconds"])
        print(f"fold {k + 1}/{folds}: trained on {len(keep):,} sentences in {summary['train_seconds']:.1f} s, "
              f"embedded {len(held):,}", flush=True)
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{run}.npz"
    with atomic_file(out, "wb", encoding=None) as fh:
        np.savez(fh, in_sample=in_sample, cross_fitted=cross, val=val, fold=fold,
                 fold_train_seconds=np.asarray(fold_seconds))
    return out


def rank(params: dict[str, Any], run: str, weights: list[float], work: Path) -> dict[str, Any]:
    """XR-Linear on [TF-IDF, β · embedding] for each way and weight; validation figures and paired tests against
    β = 0."""
    import scipy.sparse as sp

    from lab.bench.xr_linear_grid import (METRICS, linear_settings, ranking_settings, selection_rule, train_and_rank,
                                          validation_data)
    from xmc.metrics.bootstrap import paired_bootstrap, verdict

    E = np.load(work / f"{run}.npz")
    data = validation_data(params)
    if E["val"].shape[0] != data["Xv"].shape[0] or E["in_sample"].shape[0] != data["X"].shape[0]:
        raise SystemExit(f"{work / (run + '.npz')}: its rows do not match the processed splits (rerun embed)")
    cfg, ev = linear_settings(params), ranking_settings(params)
    boot, sel = params["evaluate"]["bootstrap"], selection_rule()

    def with_dense(X: Any, D: np.ndarray, beta: float) -> Any:
        return sp.hstack([X, sp.csr_matrix(beta * D.astype(np.float32))], format="csr")

    base = train_and_rank(data, cfg, ev)
    print(f"TF-IDF only: {base['metrics']} ({base['train_seconds']} s)", flush=True)
    cells = []
    for way in WAYS:
        for beta in (w for w in weights if w > 0):
            d = dict(data, X=with_dense(data["X"], E[way], beta), Xv=with_dense(data["Xv"], E["val"], beta))
            cell = train_and_rank(d, cfg, ev)
            cmp = {m: paired_bootstrap(cell["contributions"], base["contributions"], m, boot["n_resamples"],
                                       boot["seed"]) for m in METRICS}
            cells.append({"way": way, "weight": beta, "metrics": cell["metrics"],
                          "train_seconds": cell["train_seconds"], "minus_tfidf_only": cmp,
                          "verdict": verdict(cmp[sel["metric"]]["p_value"], cmp[sel["metric"]]["diff"], sel["alpha"])})
            print(f"{way} β={beta:g}: {cell['metrics']} ({cell['train_seconds']} s); {sel['metric']} "
                  f"{cmp[sel['metric']]['diff']:+.2f} p={cmp[sel['metric']]['p_value']:.3f}", flush=True)
    return {"tfidf_only": {k: v for k, v in base.items() if k != "contributions"}, "cells": cells,
            "selection_metric": sel["metric"], "alpha": sel["alpha"], "bootstrap": boot, "settings": cfg,
            "fold_train_seconds": [float(s) for s in E["fold_train_seconds"]], "folds": int(E["fold"].max()) + 1}


def main() -> None:
    from xmc.config import load_params

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("embed", "rank"))
    ap.add_argument("--run", default="astra", help="a trained bag-of-words run whose encoder gives the dense block")
    ap.add_argument("--folds", type=int, default=5, help="cross-fitting folds (embed)")
    ap.add_argument("--weights", default="0,0.25,0.5,1", help="weights β of the dense block (rank)")
    ap.add_argument("--work", default="lab/bench/.sparse_dense",
                    help="where embed writes and rank reads the embeddings")
    ap.add_argument("--out", default="lab/bench/sparse_dense_ranker.json")
    args = ap.parse_args()
    params = load_params()
    t0 = time.perf_counter()
    if args.step == "embed":
        print(f"wrote {embed(params, args.run, args.folds, Path(args.work))} in {time.perf_counter() - t0:.0f} s")
        return
    out = {"what": f"XR-Linear on TF-IDF ⊕ β · the {args.run} encoder's query embedding, validation split",
           "command": f"python -m lab.bench.sparse_dense_ranker embed --run {args.run}; .venv-pecos/bin/python -m "
                      f"lab.bench.sparse_dense_ranker rank --run {args.run} --weights {args.weights}",
           "run": args.run,
           "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "python": platform.python_version()},
           **rank(params, args.run, [float(w) for w in args.weights.split(",")], Path(args.work)),
           "seconds": round(time.perf_counter() - t0, 1)}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
