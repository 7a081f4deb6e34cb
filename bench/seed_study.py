"""A selection candidate against its run's default over several training seeds, on the validation split.

The selection rule (``docs/selection.md``) compares one trained model per candidate with a paired bootstrap over
the validation sentences. That bootstrap holds the trained models fixed, so a difference smaller than what
retraining from another seed moves can still come out "significant", and a real but small one can come out a
tie. This script trains the run's default and each candidate from seeds 0..``--seeds``-1 (the encoder's
initialisation and the batch order, as the ``*_seed1`` runs differ), ranks the validation split with each model
(exact inner-product search, as ``predict@`` does at this label count), and reports per metric each side's mean
and sd over the seeds and candidate − default as the mean of the per-seed differences, with a 95 % t-interval and
the paired t-test's p. The test split is not read.

    python -m bench.seed_study --run dexml_bow --seeds 9 \
        --candidates '{"refresh_every_epoch": {"negatives": {"refresh_every_epochs": 1}}}' \
        [--processed data/processed] [--out bench/seed_studies/dexml_bow_refresh.json]

Bag-of-words dual-encoder runs only (the models of ``bench.bow_training_speed``); not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any


from bench.bow_training_speed import VALIDATION_METRICS as METRICS
from bench.bow_training_speed import validation_contributions


def validation_metrics(topk_file: Path, ds: Any, ev: dict[str, Any]) -> dict[str, float]:
    c = validation_contributions(topk_file, ds, ev)
    return {m: round(float(c.values()[m]), 2) for m in METRICS}


def compare_over_seeds(default: list[dict[str, float]], candidate: list[dict[str, float]],
                       level: float = 0.95) -> dict[str, dict[str, Any]]:
    """Per metric: candidate − default over the seeds (:func:`xmc.metrics.bootstrap.paired_over_seeds`)."""
    from xmc.metrics.bootstrap import paired_over_seeds

    return {m: paired_over_seeds([r[m] for r in candidate], [r[m] for r in default], level) for m in METRICS}


def main() -> None:
    from xmc.config import set_offline_env

    set_offline_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="dexml_bow")
    ap.add_argument("--candidates", required=True, help="JSON: {name: overrides of the run's config}")
    ap.add_argument("--seeds", type=int, default=9)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from xmc.methods.base import short_openmp_spin

    short_openmp_spin()   # as the stages set it, before torch loads
    import torch

    from bench.bow_training_speed import VALIDATED_RUNS, run_variant
    from xmc.config import load_params
    from xmc.data import load_processed

    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))
    params = load_params()
    ev = params["evaluate"]
    ds = load_processed(a.processed, splits=("trn", "val"))
    if a.run not in VALIDATED_RUNS:
        raise SystemExit(f"--run {a.run}: only {', '.join(VALIDATED_RUNS)} (dual encoders ranked by label vectors)")
    sides = {"default": {}, **json.loads(a.candidates)}
    peaks = {"bandwidth_GBps": 1.0, "matmul_GFLOPs": 1.0}   # the roofline is not this script's subject
    per_seed: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            for name, overrides in sides.items():
                f = Path(tmp) / f"{name}_{seed}.npz"
                fig = run_variant(a.run, a.run, overrides, params, ds, 0, peaks, f, seed)
                row = {"seed": seed, **validation_metrics(f, ds, ev), "loop_seconds": fig["loop_seconds"],
                       "final_loss": fig["final_loss"], "refreshes": fig["refreshes"]}
                per_seed[name].append(row)
                print(name, row, flush=True)
    from xmc.metrics.bootstrap import split_fingerprint

    out: dict[str, Any] = {"run": a.run, "split": "val", "n_sentences": int(ds.val.Y.shape[0]),
                           "val_fingerprint": split_fingerprint(ds.val.Y), "seeds": a.seeds,
                           "candidates": sides, "per_seed": per_seed, "candidate_minus_default": {}}
    for name in sides:
        if name != "default":
            out["candidate_minus_default"][name] = cmp = compare_over_seeds(per_seed["default"], per_seed[name])
            print(name, "- default over seeds:", json.dumps(cmp), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
