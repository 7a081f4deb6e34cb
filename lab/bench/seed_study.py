"""A selection candidate against its run's default over several training seeds, on the validation split.

The selection rule (``docs/selection.md``) compares one trained model per candidate with a paired bootstrap over
the validation sentences. That bootstrap holds the trained models fixed, so a difference smaller than what
retraining from another seed moves can still come out "significant", and a real but small one can come out a
tie. This script trains the run's default and each candidate from seeds 0..``--seeds``-1 (the encoder's
initialisation and the batch order, as the ``*_seed1`` runs differ) and ranks the validation split with each
model, through the pipeline's own calls (``train_run`` and ``predict_run``, the ``train@`` and ``predict@`` stages'
library calls, in a scratch directory): what is compared is what the pipeline would train and serve. It reports
per metric each side's mean and sd over the seeds and candidate − default as the mean of the per-seed
differences, with a 95 % t-interval and the paired t-test's p. The test split is not read.

A candidate is either overrides of the run's settings (``--candidates``) or another run of params.yaml
(``--candidate-runs``, e.g. a selection choice's candidate runs), trained with its own settings:

    python -m bench.seed_study --run dexml_bow --seeds 9 \
        --candidates '{"refresh_every_epoch": {"negatives": {"refresh_every_epochs": 1}}}' \
        [--processed data/processed] [--out bench/seed_studies/dexml_bow_refresh.json]
    python -m bench.seed_study --run unidec --seeds 9 \
        --candidate-runs unidec_unseen_zero,unidec_dropout01 --out bench/seed_studies/unidec_example.json
    python -m bench.seed_study --run dexml_bow --seeds 5 --candidate-runs dexml_bow_epochs10 --hybrid \
        --out bench/seed_studies/dexml_bow_hybrid_epochs.json

``--hybrid`` also fuses every trained model with the label-name matches, as ``fuse@<run>`` does (the fusion fit on the
validation split, its validation predictions cross-fitted by document), and compares the hybrids over the seeds
too (``hybrid_candidate_minus_default``): a base model's choice need not carry over to its hybrid.

Any trained run: ``--processed`` is its processed data; what else it reads (RAMEN's graph, a local encoder) is
read from the working directory, as the stages read it. ``--out`` is rewritten after every trained model, and
``--resume`` keeps the rows it already holds, so a study cut short (a killed process) goes on where it stopped
(``train_run`` gives each trained run's memory back: ``xmc.trainer.memory.release_freed_memory``).
Not a test.
"""

from __future__ import annotations

import argparse
import copy
import json
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


def seeded_params(params: dict[str, Any], run: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """A copy of ``params`` whose run ``run`` has ``overrides`` and trains from ``seed`` (the trainer's batch order
    and, where the encoder has one, its initialisation), everything else as the pipeline has it."""
    from xmc.config.schema import deep_merge
    from xmc.methods.runs import _at, find_run

    out = copy.deepcopy(params)
    spec = find_run(out, run)
    *parent, name = spec.where.split(".")
    runs = _at(out, tuple(parent))
    if not parent or not isinstance(runs, dict) or name not in runs:   # a peer or a derived run (st_mnrl)
        raise SystemExit(f"--run/--candidate-runs {run}: not a trained run of params.yaml ({spec.where})")
    seeds: dict[str, Any] = {"train": {"seed": seed}}
    if "seed" in spec.config.get("encoder", {}):
        seeds["encoder"] = {"seed": seed}
    runs[name] = deep_merge(deep_merge(runs.get(name) or {}, overrides), seeds)
    return out


def train_and_rank(params: dict[str, Any], run: str, processed: Path, ds: Any, hybrid: bool = False) -> dict[str, Any]:
    """Train ``run`` as ``train@<run>`` does and rank the validation split as ``predict@<run>`` does, in a scratch
    root that sees ``processed`` as its processed data; its validation metrics and training time. ``hybrid``: also
    fuse the run's validation predictions with the label-name matches as ``fuse@<run>`` does (the fusion fit on
    validation, its validation predictions cross-fitted by document) and add that hybrid's metrics as ``hybrid``."""
    from xmc.methods.base import predict_run, train_run

    with tempfile.TemporaryDirectory(prefix="xmc-seed-study-") as tmp:
        root = Path(tmp)
        link = root / params["data"]["processed_dir"]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(processed.resolve(), target_is_directory=True)
        summary = train_run(params, run, root)
        predict_run(params, run, ("val",), root, all_variants=False)
        row: dict[str, Any] = validation_metrics(root / "predictions" / run / "val_topk.npz", ds, params["evaluate"])
        if hybrid:
            from xmc.lexical.fuse import SUFFIX, fuse_run

            only_val = copy.deepcopy(params)
            only_val["predictions"][run] = "val"   # the scratch root holds the validation predictions only
            fused = fuse_run(only_val, run, root, with_predictor=False)
            row["hybrid"] = validation_metrics(root / "predictions" / (run + SUFFIX) / "val_topk.npz", ds,
                                               params["evaluate"])
            row["hybrid"]["fusion_fit_seconds"] = fused["fusion_fit_seconds"]
    row["train_seconds"] = summary.get("train_seconds")
    if summary.get("final_loss") is not None:
        row["final_loss"] = summary["final_loss"]
    return row


def main() -> None:
    from xmc.config import set_offline_env

    set_offline_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="dexml_bow")
    ap.add_argument("--candidates", default="{}", help="JSON: {name: overrides of the run's settings}")
    ap.add_argument("--candidate-runs", default="", help="comma-separated runs of params.yaml, each a side of its own")
    ap.add_argument("--seeds", type=int, default=9)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--out", default="")
    ap.add_argument("--hybrid", action="store_true",
                    help="also fuse every model with the label-name matches (fuse@<run>) and compare the hybrids")
    ap.add_argument("--resume", action="store_true",
                    help="keep the (seed, side) rows already in --out and train only the missing ones")
    a = ap.parse_args()
    from xmc.config import load_params, setup_logging
    from xmc.data import load_processed
    from xmc.methods.runs import find_run

    setup_logging("WARNING")   # one line per trained model below, not the stages' logs
    params = load_params()
    # side -> (run trained, overrides of its settings)
    sides: dict[str, tuple[str, dict[str, Any]]] = {"default": (a.run, {})}
    sides.update({name: (a.run, o) for name, o in json.loads(a.candidates).items()})
    sides.update({r: (r, {}) for r in filter(None, a.candidate_runs.split(","))})
    if len(sides) < 2:
        raise SystemExit("--candidates or --candidate-runs: at least one candidate")
    if a.seeds < 2:   # the paired t-test over seeds needs two
        raise SystemExit(f"--seeds {a.seeds}: at least 2")
    method = find_run(params, a.run).method
    for side, (run, _) in sides.items():
        if find_run(params, run).method != method:
            raise SystemExit(f"--candidate-runs {run}: a {find_run(params, run).method} run, not {method}")
    processed = Path(a.processed)
    ds = load_processed(processed, splits=("trn", "val"))
    from xmc.metrics.bootstrap import split_fingerprint

    candidates = {name: overrides if run == a.run else {"run": run} for name, (run, overrides) in sides.items()}
    out: dict[str, Any] = {"run": a.run, "split": "val", "n_sentences": int(ds.val.Y.shape[0]),
                           "val_fingerprint": split_fingerprint(ds.val.Y), "seeds": a.seeds,
                           "candidates": candidates, "per_seed": {name: [] for name in sides},
                           "candidate_minus_default": {},
                           **({"hybrid": True, "hybrid_candidate_minus_default": {}} if a.hybrid else {})}
    if a.resume and a.out and Path(a.out).is_file():
        before = json.loads(Path(a.out).read_text())
        if (before.get("candidates") != candidates or before.get("val_fingerprint") != out["val_fingerprint"]
                or bool(before.get("hybrid")) != a.hybrid):
            raise SystemExit(f"--resume: {a.out} holds another study (candidates, validation split or --hybrid differ)")
        out["per_seed"].update({k: v for k, v in before["per_seed"].items() if k in sides})
        out.update({k: v for k, v in before.items() if k not in out})   # notes added to the file by hand
    per_seed: dict[str, list[dict[str, Any]]] = out["per_seed"]
    for seed in range(a.seeds):
        for name, (run, overrides) in sides.items():
            if any(r["seed"] == seed for r in per_seed[name]):
                continue
            seeded = seeded_params(params, run, overrides, seed)
            row = {"seed": seed, **train_and_rank(seeded, run, processed, ds, hybrid=a.hybrid)}
            per_seed[name].append(row)
            per_seed[name].sort(key=lambda r: r["seed"])
            print(name, row, flush=True)
            if a.out:   # after every model: a study cut short (killed, out of memory) resumes with --resume
                Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    for name in sides:
        if name != "default":
            out["candidate_minus_default"][name] = cmp = compare_over_seeds(per_seed["default"], per_seed[name])
            print(name, "- default over seeds:", json.dumps(cmp), flush=True)
            if a.hybrid:
                out["hybrid_candidate_minus_default"][name] = hcmp = compare_over_seeds(
                    [r["hybrid"] for r in per_seed["default"]], [r["hybrid"] for r in per_seed[name]])
                print(name, "hybrid - default hybrid over seeds:", json.dumps(hcmp), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
