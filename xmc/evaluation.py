"""Score one prediction on one split and write its records: the one evaluation of every stage.

A prediction's top-k on the validation or test split -> P@k, nDCG@k, PSP@k, R@k, unseen-label recall and recall by
label frequency with bootstrap intervals (:mod:`xmc.metrics`), written as

* ``metrics/<name>.json`` (test) or ``metrics_val/<name>.json`` (validation): the figures and their ``ci95``;
* ``evaluation/<split>/<name>.npz``: the per-instance terms the paired tests resample;
* ``plots/eval/<name>/{at_k,recall_by_frequency}.json`` (test): the curves of the report's figures.

Only the split's labels, the training label counts and the split's scoring filter (if any) are read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from xmc.data.dataset import XMCDataset
from xmc.io import write_json
from xmc.metrics import evaluate_topk
from xmc.metrics.bootstrap import bootstrap_intervals, bootstrap_settings, document_codes
from xmc.predictions import TopK
from xmc.workspace import Workspace


def evaluate_split(pred: TopK, ds: XMCDataset, split: str, params: dict[str, Any]) -> dict[str, Any]:
    """{"metrics" (with ``ci95``), "contributions", "curves", "recall_by_frequency"} of ``pred`` on ``split``."""
    ev = params["evaluate"]
    part = ds.split(split)
    filt = ds.scoring_filter(split)
    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    res = evaluate_topk(pred, part.Y.tocsr(), freq, ds.trn.Y.shape[0], ks=tuple(ev["ks"]),
                        recall_ks=tuple(ev["recall_ks"]), a=float(ev["propensity_a"]), b=float(ev["propensity_b"]),
                        filt=filt)
    contrib = replace(res["contributions"], groups=document_codes(part.groups, len(part)))
    boot = bootstrap_settings(params)
    m: dict[str, Any] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res["metrics"].items()}
    m["ci95"] = bootstrap_intervals(contrib, **boot)
    units, _, unit = contrib.resampling_units(boot["unit"])
    m["ci95_unit"] = unit
    m["n_test_documents"] = int(units.shape[1]) if unit == "documents" else None
    return {"metrics": m, "contributions": contrib, "curves": res["curves"],
            "recall_by_frequency": res["recall_by_frequency"]}


def write_evaluation(ws: Workspace, name: str, split: str, result: dict[str, Any], params: dict[str, Any],
                     timing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The records of :func:`evaluate_split` for prediction ``name``; returns the metrics written."""
    m = dict(result["metrics"])
    if split == "tst" and timing:
        m.update({k: timing[k] for k in ("train_seconds", "predict_seconds") if k in timing})
    result["contributions"].save(ws.contributions(name, split))
    write_json(ws.metrics(name, split), m)
    if split == "tst":
        c = result["curves"]
        ks = params["evaluate"]["recall_ks"]
        write_json(ws.curves(name) / "at_k.json", [{"k": k, "precision": p, "recall": r}
                                                   for k, p, r in zip(c["k"], c["precision"], c["recall"])])
        write_json(ws.curves(name) / "recall_by_frequency.json", [
            {"bucket": b["bucket"], "recall": round(b[f"recall@{max(ks)}"] or 0.0, 4), "test_pairs": b["test_pairs"]}
            for b in result["recall_by_frequency"]])
    return m


def evaluate_and_write(ws: Workspace, name: str, ds: XMCDataset, splits: tuple[str, ...], params: dict[str, Any],
                       timing: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Evaluate ``predictions/<name>/<split>_topk.npz`` of each split and write the records: {split: metrics}."""
    out = {}
    for split in splits:
        pred = TopK.load(ws.predictions(name) / f"{split}_topk.npz")
        out[split] = write_evaluation(ws, name, split, evaluate_split(pred, ds, split, params), params, timing)
    return out


__all__ = ["evaluate_and_write", "evaluate_split", "write_evaluation"]
