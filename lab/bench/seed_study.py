"""A selection candidate against its run's default over several training seeds, on the validation split.

The selection rule (``lab/docs/selection.md``) compares one trained model per candidate with a paired bootstrap over
the validation sentences. That bootstrap holds the trained models fixed, so a difference smaller than what
retraining from another seed moves can still come out "significant", and a real but small one can come out a
tie. This script trains the run's default and each candidate from seeds 0..``--seeds``-1 (the encoder's
initialisation and the batch order, as the ``*_seed1`` runs differ) and ranks the validation split with each
model, through the pipeline's own calls (:func:`xmc.methods.harness.train_run` and
:func:`xmc.package.build.package_run`, what the ``train@`` / ``package@`` stages and the lab's ``run@`` stage
call, into a scratch :class:`~xmc.workspace.Workspace`): what is compared is what the pipeline would train and
serve. It reports per metric each side's mean and sd over the seeds and candidate − default as the mean of the
per-seed differences, with a 95 % t-interval and the paired t-test's p. The test split is not read.

``--run`` is a run of params.yaml (the product's ``runs``) or of lab/params.yaml (the lab's ``runs``). A candidate
is either overrides of that run's settings (``--candidates``) or another run of either file (``--candidate-runs``,
e.g. a selection choice's candidate runs), trained with its own settings:

    python -m lab.bench.seed_study --run dexml_bow --seeds 9 \
        --candidates '{"refresh_every_epoch": {"negatives": {"refresh_every_epochs": 1}}}' \
        [--processed data/processed] [--out lab/seed_studies/dexml_bow_refresh.json]
    python -m lab.bench.seed_study --run unidec --seeds 9 \
        --candidate-runs unidec_unseen_zero,unidec_dropout01 --out lab/seed_studies/unidec_example.json
    python -m lab.bench.seed_study --run dexml_bow --seeds 5 --candidate-runs dexml_bow_epochs10 --hybrid \
        --out lab/seed_studies/dexml_bow_hybrid_epochs.json

``--hybrid`` also fuses every trained model with the label-name matches, as ``fuse@<hybrid>`` does
(:func:`xmc.package.fuse.fuse`: the fusion fit on the validation split, its validation predictions cross-fitted by
document), and compares the hybrids over the seeds too (``hybrid_candidate_minus_default``): a base model's choice
need not carry over to its hybrid.

``--processed`` is the processed data (default the product's ``data/processed``); the features a run reads (TF-IDF,
RAMEN's graph, MACLR's pairs) are the ``data/`` folder beside it when it is a workspace's ``data/processed``, else
the working directory's. ``--out`` is rewritten after every trained model, and ``--resume`` keeps the rows it already
holds, so a study cut short (a killed process) goes on where it stopped (``train_run`` gives each trained run's
memory back: ``xmc.trainer.memory.release_freed_memory``). The output is what ``lab/selection.py``
(``decide_over_seeds``) reads: ``split``, ``val_fingerprint`` and ``per_seed`` rows of P@1 / P@5 / PSP@5 / R@100.
Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ("P@1", "P@5", "PSP@5", "R@100")


def validation_contributions(topk_file: Path, ds: Any, ev: dict[str, Any]) -> Any:
    """Per-sentence metric contributions of a saved top-k (``predictions/<name>/val_topk.npz``) on the validation
    split, with the pipeline's evaluation settings (``ev``: params ``evaluate``)."""
    from xmc.metrics.bootstrap import instance_contributions
    from xmc.predictions import TopK

    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    return instance_contributions(TopK.load(topk_file), ds.val.Y, freq, ds.trn.Y.shape[0], tuple(ev["ks"]),
                                  tuple(ev["recall_ks"]), float(ev["propensity_a"]), float(ev["propensity_b"]))


def validation_metrics(topk_file: Path, ds: Any, ev: dict[str, Any]) -> dict[str, float]:
    c = validation_contributions(topk_file, ds, ev)
    return {m: round(float(c.values()[m]), 2) for m in METRICS}


def compare_over_seeds(default: list[dict[str, float]], candidate: list[dict[str, float]],
                       level: float = 0.95) -> dict[str, dict[str, Any]]:
    """Per metric: candidate − default over the seeds (:func:`xmc.metrics.bootstrap.paired_over_seeds`)."""
    from xmc.metrics.bootstrap import paired_over_seeds

    return {m: paired_over_seeds([r[m] for r in candidate], [r[m] for r in default], level) for m in METRICS}


def all_runs() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the product's params, {run: RunSpec} of the product's and the lab's runs), as the stages resolve them."""
    from lab.config import load_lab

    cfg = load_lab()
    return cfg["product"], {**cfg["product_specs"], **cfg["specs"]}


def seeded_run(specs: dict[str, Any], params: dict[str, Any], run: str, overrides: dict[str, Any], seed: int) -> Any:
    """The run ``run`` of ``specs`` (:func:`all_runs`) with ``overrides`` of its settings, trained from ``seed``
    (the trainer's batch order and, where the encoder has one, its initialisation); everything else as the run
    has it. The overrides are checked against the method's schema as a run entry's are."""
    from xmc.config.runs import RunSpec, resolve_runs
    from xmc.config.schema import deep_merge

    spec = specs.get(run)
    train = spec.config.get("train") if spec is not None else None
    if spec is None or spec.method == "st_mnrl" or not isinstance(train, dict) or "seed" not in train:
        # a baseline, a derived run (st_mnrl trains on another run's budget) or a run predicting with a product model
        raise SystemExit(f"--run/--candidate-runs {run}: not a trained run of params.yaml or lab/params.yaml"
                         + (f" ({spec.where})" if spec is not None else ""))
    seeds: dict[str, Any] = {"train": {"seed": seed}}
    if "seed" in spec.config.get("encoder", {}):
        seeds["encoder"] = {"seed": seed}
    key = f"{run}__seed{seed}"
    resolved, problems = resolve_runs({key: {"base": run, **deep_merge(overrides, seeds)}}, params, ("seed_study",),
                                      known=specs)
    if problems:
        raise SystemExit("; ".join(f"{run}: {'.'.join(map(str, loc[2:]))}: {msg}" for loc, msg in problems))
    return RunSpec(run, spec.method, resolved[key].config, spec.where)


def data_root_of(processed: Path, scratch: Path) -> Path:
    """The data root a scratch workspace reads ``processed`` from (``<root>/data/processed``): the workspace that
    holds it, or links in ``scratch`` to it and to the working directory's features."""
    processed = Path(os.path.normpath(processed.absolute()))   # not resolved: data/processed may be a link
    if processed.name == "processed" and processed.parent.name == "data":
        return processed.parent.parent
    data = scratch / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "processed").symlink_to(processed, target_is_directory=True)
    for feature in ("tfidf", "graph", "maclr_pairs"):
        if (Path("data") / feature).exists():
            (data / feature).symlink_to((Path("data") / feature).resolve(), target_is_directory=True)
    return scratch


def train_and_rank(params: dict[str, Any], spec: Any, data_root: Path, ds: Any, hybrid: bool = False) -> dict[str, Any]:
    """Train ``spec`` as ``train@<run>`` does and predict the validation split with its package as ``package@<run>``
    does, in a scratch workspace reading its data and features from ``data_root``; its validation metrics and
    training time. ``hybrid``: also fuse the run's validation predictions with the label-name matches as
    ``fuse@<hybrid>`` does and add that hybrid's metrics as ``hybrid``."""
    from xmc.methods.harness import train_run
    from xmc.package.build import package_run
    from xmc.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="xmc-seed-study-") as tmp:
        ws = Workspace(Path(tmp), data_root=data_root, checkpoint_root=Path(tmp) / "checkpoints")
        name = spec.name
        summary = train_run(params, spec, ws)
        package_run(params, name, ws, splits=("val",), run_params=spec.config, ds=ds)
        shutil.rmtree(ws.package(name))   # not kept: only the predictions are read
        row: dict[str, Any] = validation_metrics(ws.predictions(name) / "val_topk.npz", ds, params["evaluate"])
        if hybrid:
            from xmc.package.fuse import fuse

            fused = fuse(params, name + "_hybrid", [name], ws, splits=("val",), with_package=False)
            row["hybrid"] = validation_metrics(ws.predictions(name + "_hybrid") / "val_topk.npz", ds,
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
    ap.add_argument("--candidate-runs", default="",
                    help="comma-separated runs of params.yaml or lab/params.yaml, each a side of its own")
    ap.add_argument("--seeds", type=int, default=9)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--out", default="")
    ap.add_argument("--hybrid", action="store_true",
                    help="also fuse every model with the label-name matches (fuse@<hybrid>) and compare the hybrids")
    ap.add_argument("--resume", action="store_true",
                    help="keep the (seed, side) rows already in --out and train only the missing ones")
    a = ap.parse_args()
    import xmc.data
    from xmc.config import setup_logging

    setup_logging("WARNING")   # one line per trained model below, not the stages' logs
    params, specs = all_runs()
    # side -> (run trained, overrides of its settings)
    sides: dict[str, tuple[str, dict[str, Any]]] = {"default": (a.run, {})}
    sides.update({name: (a.run, o) for name, o in json.loads(a.candidates).items()})
    sides.update({r: (r, {}) for r in filter(None, a.candidate_runs.split(","))})
    if len(sides) < 2:
        raise SystemExit("--candidates or --candidate-runs: at least one candidate")
    if a.seeds < 2:   # the paired t-test over seeds needs two
        raise SystemExit(f"--seeds {a.seeds}: at least 2")
    for side, (run, overrides) in sides.items():   # every side checked before anything trains
        seeded_run(specs, params, run, overrides, 0)
    method = specs[a.run].method
    for side, (run, _) in sides.items():
        if specs[run].method != method:
            raise SystemExit(f"--candidate-runs {run}: a {specs[run].method} run, not {method}")
    processed = Path(a.processed)
    ds = xmc.data.load_processed(processed, splits=("trn", "val"))
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
    with tempfile.TemporaryDirectory(prefix="xmc-seed-study-data-") as scratch:
        data_root = data_root_of(processed, Path(scratch))
        for seed in range(a.seeds):
            for name, (run, overrides) in sides.items():
                if any(r["seed"] == seed for r in per_seed[name]):
                    continue
                spec = seeded_run(specs, params, run, overrides, seed)
                row = {"seed": seed, **train_and_rank(params, spec, data_root, ds, hybrid=a.hybrid)}
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
