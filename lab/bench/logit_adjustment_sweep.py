"""ASTRA's post-hoc logit adjustment swept over τ on the validation split, for trained models of the pipeline.

``astra.model.logit_adjustment`` folds b_l −= τ·log(1 + n_l) into the classifier bias at the end of training (n_l:
the label's training positives; Menon et al. 2021). The trained classifiers do not depend on τ, so one trained model
scores every τ: this script loads ``models/<run>`` for each ``--runs`` (e.g. the default and its ``*_seed*`` runs),
undoes the τ it was saved with (``train_summary.json``), and ranks the validation split once per τ of ``--taus``
(exact scores over all labels, the pipeline's top-k and evaluation settings). It reports, per τ, each model's
P@1 / P@5 / PSP@5 / R@100 and their mean over the models, and a split-half check of the choice: τ picked on the odd
sentences by mean P@5 and scored on the even ones against τ = 0, and the reverse. The test split is not read.

    python -m lab.bench.logit_adjustment_sweep --runs astra[,<more trained ASTRA runs>] \\
        [--taus 0,0.1,0.2,0.25,0.3,0.4,0.5] [--out lab/bench/logit_adjustment_sweep.json]

(``lab/bench/logit_adjustment_sweep.json`` was measured on ``astra,astra_seed1,astra_seed2`` when the seed runs kept
their models; the lab's ``*_seed*`` runs now keep only their predictions, so a seed's model is the product's run
trained with that seed, e.g. by ``python -m lab.bench.seed_study``'s calls, into a folder under ``--models``.)

Not a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from lab.bench.seed_study import METRICS


def main() -> None:
    from xmc.config import load_params, set_offline_env, setup_logging

    set_offline_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="astra")
    ap.add_argument("--taus", default="0,0.1,0.2,0.25,0.3,0.4,0.5")
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--models", default="models")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    setup_logging("WARNING")
    from xmc.data import load_processed
    from xmc.methods.astra import ASTRAModel
    from xmc.metrics.bootstrap import instance_contributions, split_fingerprint
    from xmc.predictions import topk_from_scores

    params = load_params()
    ev = params["evaluate"]
    k = int(max(max(ev["ks"]), max(ev["recall_ks"])))
    ds = load_processed(a.processed, splits=("trn", "val"))
    counts = np.asarray(ds.trn.Y.sum(axis=0)).ravel()
    log_counts = np.log1p(counts).astype(np.float32)
    taus = [float(t) for t in a.taus.split(",")]
    if 0.0 not in taus:
        taus = [0.0, *taus]
    n = ds.val.Y.shape[0]
    odd = np.arange(n) % 2 == 1
    out: dict[str, Any] = {"split": "val", "n_sentences": int(n), "val_fingerprint": split_fingerprint(ds.val.Y),
                           "runs": {}, "mean": {}, "split_half": {}}
    # per run and τ: each sentence's P@5 numerator and denominator (the split-half check sums them over a half)
    p5_parts: dict[str, dict[float, tuple[np.ndarray, np.ndarray]]] = {}
    for run in filter(None, a.runs.split(",")):
        folder = Path(a.models) / run
        summary = json.loads((folder / "train_summary.json").read_text()) if (folder / "train_summary.json").is_file() else {}
        trained_tau = float(summary.get("logit_adjustment") or 0.0)
        model = ASTRAModel.load(folder, ds.label_texts)
        S = model.query_vectors_np(list(ds.val.texts), progress=False) @ model.all_label_vectors().T
        S += trained_tau * log_counts   # back to the scores as trained (τ = 0)
        out["runs"][run] = {"trained_with_tau": trained_tau, "by_tau": {}}
        p5_parts[run] = {}
        for tau in taus:
            c = instance_contributions(topk_from_scores(S - tau * log_counts, k), ds.val.Y, counts, ds.trn.Y.shape[0],
                                       tuple(ev["ks"]), tuple(ev["recall_ks"]), float(ev["propensity_a"]),
                                       float(ev["propensity_b"]))
            vals = c.values()
            out["runs"][run]["by_tau"][str(tau)] = {m: round(float(vals[m]), 2) for m in METRICS}
            j = c.row("P@5")
            p5_parts[run][tau] = (c.num[j], c.den[j])
        print(run, json.dumps(out["runs"][run]["by_tau"]), flush=True)
    runs = list(out["runs"])
    for tau in taus:
        out["mean"][str(tau)] = {m: round(float(np.mean([out["runs"][r]["by_tau"][str(tau)][m] for r in runs])), 2)
                                 for m in METRICS}
    def p5(run: str, tau: float, rows: np.ndarray) -> float:
        num, den = p5_parts[run][tau]
        return 100.0 * float(num[rows].sum() / den[rows].sum())

    for name, fit in (("fit_odd_score_even", odd), ("fit_even_score_odd", ~odd)):
        best = max(taus, key=lambda t: float(np.mean([p5(r, t, fit) for r in runs])))
        gain = float(np.mean([p5(r, best, ~fit) - p5(r, 0.0, ~fit) for r in runs]))
        out["split_half"][name] = {"tau": best, "P@5_gain_on_other_half": round(gain, 2)}
    print("mean over models:", json.dumps(out["mean"]), "\nsplit half:", json.dumps(out["split_half"]), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
