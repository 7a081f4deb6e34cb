"""The linear peer's settings on the validation split: a grid over XR-Linear's cost and tree width, then the best
cell against PECOS's own defaults over several tree seeds.

The peer the methods are compared with should be as good as its own knobs allow on this data, chosen without the
test split. This trains PECOS XR-Linear (``xmc.peers.xr_linear``, the functions the ``xr_linear@<run>`` stage
calls) on the training split's TF-IDF rows for every (C, nr_splits) of the grid, with ``Cp = Cn = C`` and every other
setting from the product's run (``params.yaml: xr_linear.xr_linear``, ``--run``), and ranks the validation split.

1. The grid, tree seed 0: each cell's P@1 / P@5 / PSP@5 / R@100 and its paired bootstrap against the reference
   cell (PECOS's defaults, C = 1 and 16 children per node) on the selection metric (``lab/params.yaml:
   selection``).
2. The best cell on the selection metric and the reference, each trained from tree seeds 0..``--seeds``-1 (the
   k-means label tree is what a seed changes): per metric the mean of the per-seed differences, its 95 %
   t-interval and the paired t-test's p (``xmc.metrics.bootstrap.paired_over_seeds``).

Run it in the PECOS environment from a workspace with the ``tfidf`` stage's outputs; the test split is not read::

    .venv-pecos/bin/python -m lab.bench.xr_linear_grid [--costs 1,2,4,8,16] [--splits 16,64,256] [--seeds 5] \\
        [--out lab/bench/xr_linear_grid.json]

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

METRICS = ("P@1", "P@5", "PSP@5", "R@100")


def linear_settings(params: dict[str, Any], run: str = "xr_linear") -> dict[str, Any]:
    """The settings of the product's linear-peer run ``run`` (``params.yaml: xr_linear.<run>``), every knob filled."""
    from xmc.config.schema import XrLinearRunConfig, filled

    runs = params.get("xr_linear") or {}
    if run not in runs:
        raise SystemExit(f"params.yaml: {run!r} is not under xr_linear (have: {', '.join(runs) or 'none'})")
    return filled(XrLinearRunConfig, runs[run], f"xr_linear.{run}")


def selection_rule() -> dict[str, Any]:
    """The selection's metric and alpha (``lab/params.yaml: selection``)."""
    from lab.config import load_lab

    sel = load_lab()["lab"]["selection"]
    return {"metric": sel["metric"], "alpha": sel["alpha"]}


def validation_data(params: dict[str, Any], ws: Any = None) -> dict[str, Any]:
    """The training split's TF-IDF rows and labels, and the validation split's (the ``tfidf`` stage's vectoriser),
    of the workspace ``ws`` (default: the product's, the working directory)."""
    import numpy as np
    import scipy.sparse as sp

    from xmc.baselines import TfidfFeatures
    from xmc.data import load_processed
    from xmc.workspace import Workspace

    ws = ws or Workspace()
    ds = load_processed(ws.processed, splits=("trn", "val"))
    X = sp.load_npz(ws.tfidf / "X_trn.npz").tocsr().astype(np.float32)
    Xv = TfidfFeatures.load(ws.tfidf).transform(ds.val.texts).tocsr().astype(np.float32)
    Ytrn = ds.trn.Y.tocsr()
    return {"X": X, "Y": Ytrn, "Xv": Xv, "Yv": ds.val.Y.tocsr(), "freq": np.asarray(Ytrn.sum(0)).ravel(),
            "n_train": Ytrn.shape[0]}


def parse_seed_args(ap: argparse.ArgumentParser, seeds_help: str, default_out: str) -> argparse.Namespace:
    """``ap``'s arguments plus ``--seeds`` (at least 2: a paired t-test over seeds) and ``--out``, parsed."""
    ap.add_argument("--seeds", type=int, default=5, help=seeds_help)
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()
    if args.seeds < 2:
        raise SystemExit("error: --seeds must be at least 2 (a paired t-test over seeds)")
    return args


def ranking_settings(params: dict[str, Any]) -> dict[str, Any]:
    """How many labels a validation ranking keeps and the propensity model of PSP@k (``params.yaml: evaluate``)."""
    ev = params["evaluate"]
    return {"top_k": ev["top_k"], "psp_a": ev["propensity_a"], "psp_b": ev["propensity_b"]}


def train_and_rank(data: dict[str, Any], cfg: dict[str, Any], ev: dict[str, Any]) -> dict[str, Any]:
    """One XR-Linear trained with settings ``cfg`` and its validation figures, seconds and per-instance
    contributions (for paired tests)."""
    from xmc.metrics.bootstrap import instance_contributions
    from xmc.peers.xr_linear import fit_xr_linear, rank_xr_linear

    t0 = time.perf_counter()
    model = fit_xr_linear(data["X"], data["Y"], cfg)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    top = rank_xr_linear(model, data["Xv"], cfg, ev["top_k"])
    predict_s = time.perf_counter() - t0
    contrib = instance_contributions(top, data["Yv"], data["freq"], data["n_train"], a=ev["psp_a"], b=ev["psp_b"])
    values = contrib.values()
    return {"metrics": {m: round(float(values[m]), 4) for m in METRICS}, "train_seconds": round(train_s, 2),
            "predict_seconds": round(predict_s, 2), "contributions": contrib}


def main() -> None:
    from xmc.config import load_params
    from xmc.metrics.bootstrap import paired_bootstrap, paired_over_seeds, verdict

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--costs", default="1,2,4,8,16", help="values of C (Cp = Cn = C)")
    ap.add_argument("--splits", default="16,64,256", help="values of nr_splits (children per tree node)")
    ap.add_argument("--reference", default="1,16", help="C,nr_splits of the reference cell (PECOS's defaults)")
    ap.add_argument("--run", default="xr_linear", help="the product's linear-peer run whose settings the grid varies")
    args = parse_seed_args(ap, "tree seeds for the best cell against the reference", "lab/bench/xr_linear_grid.json")

    params = load_params()
    base = linear_settings(params, args.run)
    sel = selection_rule()
    ev = ranking_settings(params)
    boot = params["evaluate"]["bootstrap"]
    costs = [float(c) for c in args.costs.split(",")]
    widths = [int(s) for s in args.splits.split(",")]
    ref_c, ref_s = (float(args.reference.split(",")[0]), int(args.reference.split(",")[1]))
    data = validation_data(params)

    def cfg_of(c: float, s: int, seed: int = 0) -> dict[str, Any]:
        return {**base, "Cp": c, "Cn": c, "nr_splits": s, "seed": seed}

    cells: dict[tuple[float, int], dict[str, Any]] = {}
    for c in sorted(set(costs) | {ref_c}):
        for s in sorted(set(widths) | {ref_s}):
            cells[(c, s)] = train_and_rank(data, cfg_of(c, s), ev)
            print(f"C={c:g} nr_splits={s}: {cells[(c, s)]['metrics']} train {cells[(c, s)]['train_seconds']} s",
                  flush=True)
    ref = cells[(ref_c, ref_s)]
    metric = sel["metric"]
    grid = []
    for (c, s), cell in cells.items():
        cmp = paired_bootstrap(cell["contributions"], ref["contributions"], metric, boot["n_resamples"], boot["seed"])
        grid.append({"C": c, "nr_splits": s, **{k: v for k, v in cell.items() if k != "contributions"},
                     f"{metric}_minus_reference": cmp, "verdict": verdict(cmp["p_value"], cmp["diff"], sel["alpha"])})
    best_c, best_s = max(cells, key=lambda k: cells[k]["metrics"][metric])

    per_seed: dict[str, list[dict[str, float]]] = {"best": [], "reference": []}
    for seed in range(args.seeds):
        for side, (c, s) in (("best", (best_c, best_s)), ("reference", (ref_c, ref_s))):
            cell = cells[(c, s)] if seed == 0 else train_and_rank(data, cfg_of(c, s, seed), ev)
            per_seed[side].append({**cell["metrics"], "train_seconds": cell["train_seconds"]})
        print(f"seed {seed}: best {per_seed['best'][-1]} reference {per_seed['reference'][-1]}", flush=True)
    over_seeds = {m: paired_over_seeds([r[m] for r in per_seed["best"]], [r[m] for r in per_seed["reference"]])
                  for m in (*METRICS, "train_seconds")}

    out = {"what": "XR-Linear on the validation split: a grid over C (Cp = Cn) and nr_splits on tree seed 0, then "
                   "the best cell on the selection metric against the reference over tree seeds",
           "command": "python -m lab.bench.xr_linear_grid " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                   vars(args).items()),
           "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "python": platform.python_version()},
           "settings": base, "selection_metric": metric, "alpha": sel["alpha"], "bootstrap": boot,
           "reference": {"C": ref_c, "nr_splits": ref_s}, "best": {"C": best_c, "nr_splits": best_s},
           "grid": grid, "over_seeds": {"seeds": args.seeds, "per_seed": per_seed, "best_minus_reference": over_seeds},
           "validation_instances": int(data["Yv"].shape[0])}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    d = over_seeds[metric]
    print(f"best C={best_c:g} nr_splits={best_s}; over {args.seeds} tree seeds best − reference {metric} "
          f"{d['diff']:+.2f} [{d['ci95'][0]:.2f}, {d['ci95'][1]:.2f}], p {d['p_value']:.4f} -> {args.out}")


if __name__ == "__main__":
    main()
