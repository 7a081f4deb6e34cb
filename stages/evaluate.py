"""Evaluate one method's predictions on one split, with bootstrap intervals.

Usage: ``python -m stages.evaluate <method> [--split {tst,val}] [--ablation | --seed-run]``

* ``--split tst`` (default): ``metrics/<method>.json`` (metrics, timing, ``ci95``),
  ``evaluation/tst/<method>.npz`` (per-instance terms for paired tests) and
  ``plots/eval/<method>/{at_k,recall_by_frequency}.json``.
* ``--split val``: ``metrics_val/<method>.json`` and ``evaluation/val/<method>.npz``; no plots.
  Every choice of the pipeline is made on these (``stages.selection``); they sit outside ``metrics/``
  and ``evaluation/tst/`` so that validation-only stages depend on no test material.
* ``--ablation`` (test split only): ``ablations/metrics/<method>.json``, ``ablations/plots/<method>/`` and
  ``evaluation/ablations/<method>.npz`` (the ablation report, outside ``make run``).
* ``--seed-run`` (test split only): an extra-seed run, ``seeds/metrics/<run>.json`` and
  ``evaluation/seeds/<run>.npz`` (the seed-variation report ``reports/seeds.md``, outside ``make run``).

Only the files needed are read: ``<split>_Y.npz``, ``trn_Y.npz`` (label frequencies) and, on the
test split, ``tst_filter.npz``; predictions from ``predictions/<method>/<split>_topk.npz``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError
from xmc.io import read_json, write_json
from xmc.metrics import evaluate_topk
from xmc.metrics.bootstrap import (
    VAL_METRICS_DIR,
    bootstrap_intervals,
    bootstrap_settings,
    contrib_path,
)
from xmc.predictions import TopK

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one-line error through run_entry_point, not argparse's exit 2
        raise ConfigError(f"{message} (usage: python -m stages.evaluate <method> [--split tst|val] [--ablation | --seed-run])")


def _load_csr(path: Path) -> sp.csr_matrix:
    if not path.exists():
        raise ConfigError(f"{path}: not found (run the ingest stage)")
    return sp.load_npz(path).tocsr()


def main(argv: list[str] | None = None) -> None:
    ap = _Parser(prog="python -m stages.evaluate")
    ap.add_argument("method")
    ap.add_argument("--split", choices=("tst", "val"), default="tst")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--seed-run", action="store_true")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    method, split = args.method, args.split
    if args.ablation and split != "tst":
        raise ConfigError("--ablation evaluates the test split only (drop --split val)")
    if args.seed_run and (split != "tst" or args.ablation):
        raise ConfigError("--seed-run evaluates the test split only, and not with --ablation")
    group = "ablations" if args.ablation else "seeds" if args.seed_run else None

    params = load_params()
    ev = params["evaluate"]
    boot = bootstrap_settings(params)
    pred_dir = Path("predictions") / method
    pred_path = pred_dir / f"{split}_topk.npz"
    if not pred_path.exists():
        raise ConfigError(f"{pred_path}: no predictions for method {method!r}")
    data = Path(params["data"]["processed_dir"])
    trn_Y = _load_csr(data / "trn_Y.npz")
    Y = _load_csr(data / f"{split}_Y.npz")
    filt = _load_csr(data / "tst_filter.npz") if split == "tst" and (data / "tst_filter.npz").exists() else None
    freq = np.asarray(trn_Y.sum(0)).ravel()
    pred = TopK.load(pred_path)
    kw: dict[str, Any] = dict(ks=tuple(ev["ks"]), recall_ks=tuple(ev["recall_ks"]),
                              a=float(ev["propensity_a"]), b=float(ev["propensity_b"]), filt=filt)
    res = evaluate_topk(pred, Y, freq, trn_Y.shape[0], **kw)
    contrib = res["contributions"]

    m: dict[str, Any] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res["metrics"].items()}
    if split == "tst":
        timing = read_json(pred_dir / "timing.json") if (pred_dir / "timing.json").exists() else {}
        m.update({k: timing[k] for k in ("train_seconds", "predict_seconds") if k in timing})
    m["ci95"] = bootstrap_intervals(contrib, **boot)

    if split == "val":
        metrics_path, plots = VAL_METRICS_DIR / f"{method}.json", None
    elif args.ablation:
        metrics_path, plots = Path("ablations") / "metrics" / f"{method}.json", Path("ablations") / "plots" / method
    elif args.seed_run:
        metrics_path, plots = Path("seeds") / "metrics" / f"{method}.json", None
    else:
        metrics_path, plots = Path("metrics") / f"{method}.json", Path("plots") / "eval" / method
    contrib.save(contrib_path(method, split, group=group))
    write_json(metrics_path, m)
    if plots is not None:
        c = res["curves"]
        write_json(plots / "at_k.json", [{"k": k, "precision": p, "recall": r}
                                         for k, p, r in zip(c["k"], c["precision"], c["recall"])])
        write_json(plots / "recall_by_frequency.json", [
            {"bucket": b["bucket"], "recall": round(b[f"recall@{max(ev['recall_ks'])}"] or 0.0, 4),
             "test_pairs": b["test_pairs"]}
            for b in res["recall_by_frequency"]])


if __name__ == "__main__":
    run_entry_point(main)
