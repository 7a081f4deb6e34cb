"""Evaluate one method's predictions -> metrics/<method>.json and plots/eval/<method>/*.json.

Usage: ``python -m stages.evaluate <method> [--ablation]``; with ``--ablation`` the outputs go to
``ablations/metrics/<method>.json`` and ``ablations/plots/<method>/`` (the ablation report, outside ``make run``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.io import read_json, write_json
from xmc.metrics import evaluate_topk
from xmc.predictions import TopK


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--ablation"]
    if len(args) != 1:
        raise ConfigError("usage: python -m stages.evaluate <method> [--ablation]")
    method = args[0]
    metrics_dir, plots_root = ((Path("ablations") / "metrics", Path("ablations") / "plots") if "--ablation" in sys.argv
                               else (Path("metrics"), Path("plots") / "eval"))
    params = load_params()
    ev = params["evaluate"]
    pred_dir = Path("predictions") / method
    if not (pred_dir / "tst_topk.npz").exists():
        raise ConfigError(f"{pred_dir / 'tst_topk.npz'}: no predictions for method {method!r}")
    ds = load_processed(params["data"].get("processed_dir", "data/processed"))
    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    res = evaluate_topk(TopK.load(pred_dir / "tst_topk.npz"), ds.tst.Y, freq, len(ds.trn),
                        ks=tuple(ev["ks"]), recall_ks=tuple(ev["recall_ks"]),
                        a=float(ev["propensity_a"]), b=float(ev["propensity_b"]), filt=ds.tst_filter)
    m = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res["metrics"].items()}
    timing = read_json(pred_dir / "timing.json") if (pred_dir / "timing.json").exists() else {}
    m.update({k: timing[k] for k in ("train_seconds", "predict_seconds") if k in timing})
    write_json(metrics_dir / f"{method}.json", m)
    plots = plots_root / method
    write_json(plots / "at_k.json", [{"k": k, "precision": m[f"P@{k}"], "ndcg": m[f"nDCG@{k}"], "psp": m[f"PSP@{k}"]} for k in ev["ks"]])
    write_json(plots / "recall_by_frequency.json", [
        {"bucket": b["bucket"], "recall": round(b[f"recall@{max(ev['recall_ks'])}"] or 0.0, 4), "test_pairs": b["test_pairs"]}
        for b in res["recall_by_frequency"]])


if __name__ == "__main__":
    run_entry_point(main)
