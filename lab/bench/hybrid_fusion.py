"""Which fusion re-scores the hybrid candidates: logistic against boosted trees, on the validation split only.

For every run of ``hybrid.runs`` and the ensemble (``hybrid.ensemble``), the candidate table of the validation texts
(the run's top-k ∪ label-name matches, the features of :mod:`xmc.lexical.hybrid`) is scored by each fusion
cross-fitted by document as the fuse stage does it (fit on the other folds), and the two rankings are compared on
the same validation instances with the paired bootstrap of the reports (``evaluate.bootstrap``). P@5 is the
primary metric of every choice (docs/selection.md). The test split is not read.

    python -m bench.hybrid_fusion [--runs astra,...] [--out bench/hybrid_fusion.json]

Reads ``predictions/<run>/val_topk.npz`` of a workspace where the pipeline ran (``make run``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("logistic", "boosted_trees")   # reference first: differences are boosted_trees - logistic
METRICS = ("P@1", "P@5", "PSP@5", "R@100")


def compare(params: dict[str, Any], bases: list[str], ensemble: bool, ds: Any, counts: np.ndarray,
            root: Path) -> dict[str, Any]:
    from xmc.lexical.fuse import cross_fitted_scores, fit_supervised_fusion, validation_folds
    from xmc.lexical.hybrid import HybridRanker, top_k
    from xmc.metrics.bootstrap import instance_contributions, paired_bootstrap, verdict
    from xmc.predictions import TopK

    cfg, names_cfg, ev = params["hybrid"], params["label_names"], params["evaluate"]
    tops = [TopK.load(root / "predictions" / b / "val_topk.npz") for b in bases]
    ranker = HybridRanker(ds.label_texts, names_cfg["mode"], counts, max_words=names_cfg["max_words"],
                          cased_names=names_cfg["cased_names"], members=bases if ensemble else None)
    table = ranker.table_many(ds.val.texts, [(t.scores, t.indices) for t in tops])
    folds = validation_folds(ds.val.groups, len(ds.val), cfg["cross_fit_folds"])
    contrib, seconds = {}, {}
    for kind in KINDS:
        t0 = time.perf_counter()
        cross, _ = cross_fitted_scores(
            table, folds, lambda rows: (fit_supervised_fusion(cfg, table, ds.val.Y, rows, ranker.features, kind), {}))
        seconds[kind] = round(time.perf_counter() - t0, 2)
        D, I = top_k(table, cross, len(ds.val), ev["top_k"])
        contrib[kind] = instance_contributions(TopK(I.astype(np.int32), D), ds.val.Y, counts, len(ds.trn),
                                               tuple(ev["ks"]), tuple(ev["recall_ks"]), ev["propensity_a"],
                                               ev["propensity_b"])
    bs = params["evaluate"]["bootstrap"]
    out: dict[str, Any] = {"candidates_per_text": round(len(table.rows) / max(1, len(ds.val)), 1),
                           "fit_seconds_two_folds": seconds}
    for kind in KINDS:
        vals = contrib[kind].values()
        out[kind] = {m: round(vals[m], 2) for m in METRICS}
    for m in METRICS:
        r = paired_bootstrap(contrib["boosted_trees"], contrib["logistic"], m, bs["n_resamples"], bs["seed"])
        out[f"diff_{m}"] = {"diff": round(r["diff"], 2), "ci95": r["ci95"],
                            "p_value": round(r["p_value"], 4), "verdict": verdict(r["p_value"], r["diff"])}
    return out


def main() -> None:
    from xmc.config import load_params, set_offline_env
    from xmc.data import load_processed

    set_offline_env()
    params = load_params()
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default=",".join(params["hybrid"]["runs"]))
    ap.add_argument("--no-ensemble", action="store_true")
    ap.add_argument("--out", default="bench/hybrid_fusion.json")
    a = ap.parse_args()
    root = Path(".")
    ds = load_processed(root / params["data"]["processed_dir"], splits=("trn", "val"))
    counts = np.asarray(ds.trn.Y.sum(0)).ravel()
    from xmc.lexical.fuse import hybrid_base

    jobs = [(r, [hybrid_base(params, r)], False) for r in a.runs.split(",") if r]   # each hybrid's base run
    ens = params["hybrid"]["ensemble"]
    if not a.no_ensemble and ens["members"]:
        jobs.append((ens["name"], list(ens["members"]), True))
    res: dict[str, Any] = {}
    for name, bases, ensemble in jobs:
        res[name] = compare(params, bases, ensemble, ds, counts, root)
        r = res[name]
        print(f"{name}: logistic P@1/P@5 {r['logistic']['P@1']}/{r['logistic']['P@5']}, trees "
              f"{r['boosted_trees']['P@1']}/{r['boosted_trees']['P@5']}; P@5 {r['diff_P@5']}", flush=True)
    out = {"split": "val", "primary_metric": "P@5", "reference": "logistic", "candidate": "boosted_trees",
           "boosted_trees": params["hybrid"]["boosted_trees"], "C": params["hybrid"]["C"],
           "cross_fit_folds": params["hybrid"]["cross_fit_folds"], "runs": res}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print("| run | logistic P@1 / P@5 | boosted trees P@1 / P@5 | P@1 diff | P@5 diff [95 % CI], p | verdict |")
    print("|---|---|---|---|---|---|")
    for name, r in res.items():
        d1, d5 = r["diff_P@1"], r["diff_P@5"]
        print(f"| {name} | {r['logistic']['P@1']:.2f} / {r['logistic']['P@5']:.2f} | {r['boosted_trees']['P@1']:.2f} / "
              f"{r['boosted_trees']['P@5']:.2f} | {d1['diff']:+.2f} | {d5['diff']:+.2f} [{d5['ci95'][0]:+.2f}, "
              f"{d5['ci95'][1]:+.2f}], p = {d5['p_value']:.3f} | {d5['verdict']} |")


if __name__ == "__main__":
    main()
