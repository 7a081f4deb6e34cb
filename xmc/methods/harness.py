"""The one training harness: a run -> its trained model folder, the same for every method.

Seed, read the splits and features the method declares, build, train (resumable from ``checkpoints/<run>/``),
write the model atomically with ``train_summary.json`` and ``model.json`` (method and predictor kind, so
packaging needs no method code). ``python -m stages.train <run>`` (DVC) and :func:`xmc.train` call
:func:`train_run`; under ``torchrun`` every rank runs it and rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from xmc.config.runs import RunSpec
from xmc.data import load_processed
from xmc.data.dataset import FILTER_FILES, SPLIT_FILES
from xmc.io import atomic_dir, fault_point
from xmc.machine import describe_machine, set_threads
from xmc.methods import get_method
from xmc.methods.base import Method, RunContext
from xmc.ranks import launched_context
from xmc.cards import encoder_card
from xmc.trainer.live import TrainingLog
from xmc.trainer.memory import release_freed_memory
from xmc.workspace import Workspace

log = logging.getLogger(__name__)

SUMMARY = "train_summary.json"
MODEL_INFO = "model.json"    # {"run", "method", "predictor", "config"}: what a package builder reads of a trained model


def training_inputs(method: Method, config: dict[str, Any], ws: Workspace) -> list[Path]:
    """The files and folders a run's training reads: its processed splits (with the label texts) and features."""
    splits = method.splits_read(config)
    parts = ("lbl", *splits) if splits else ()
    out = [ws.processed / f for part in parts for f in SPLIT_FILES[part]]
    out += [ws.processed / FILTER_FILES[p] for p in parts if p in FILTER_FILES and (ws.processed / FILTER_FILES[p]).is_file()]
    feature_dirs = {"tfidf": ws.tfidf, "graph": ws.anchor_sets, "maclr_pairs": ws.maclr_pairs}
    out += [feature_dirs[f] for f in method.features]
    if method.features == ("graph",):
        out.append(ws.processed / "label_side")
    return out


# trainings at least this long record the machine's matrix-product rate beside their train_seconds
MEASURE_MACHINE_SECONDS = 5.0


def train_run(params: dict[str, Any], run: RunSpec, ws: Workspace, data: Any = None) -> dict[str, Any]:
    """Train ``run`` -> ``ws.model(run.name)`` (atomically, with its summary); returns the summary.

    ``data``: the processed splits already in memory (``xmc train``); else read from ``ws.processed``."""
    method = get_method(run.method)
    set_threads()
    dist_ctx = launched_context()
    if dist_ctx.world > 1:   # torchrun launched this rank: join its group (a one-process method refuses)
        dist_ctx = method.join_ranks(run, dist_ctx)
    splits = method.splits_read(run.config)
    if data is None and splits:
        data = load_processed(ws.processed, splits=splits)
    name = run.name
    if not dist_ctx.is_main:
        # another rank of a data-parallel run: it trains in step with rank 0, which alone writes the outputs
        with tempfile.TemporaryDirectory(prefix=f"xmc-rank{dist_ctx.rank}-") as scratch:
            ctx = RunContext(params, run, Path(scratch), ws.checkpoints(name), Path(scratch) / "plots", None, ws)
            out = {"run": name, "method": run.method, **method.train(ctx, data)}
            for done in ctx.after_saved:   # in step with rank 0's, which waits for its model to be in place
                done()
            return out
    live = TrainingLog(ws.training_record(name))
    with atomic_dir(ws.model(name)) as tmp:
        ctx = RunContext(params, run, tmp, ws.checkpoints(name), ws.training_record(name), live, ws)
        try:
            summary = {"run": name, "method": run.method, **method.train(ctx, data)}
        finally:
            live.close()
        # train_seconds compare only on the same hardware (xmc.machine); the half-second matrix-product probe only
        # where there is a training time to compare (a baseline's "training" takes milliseconds)
        summary["machine"] = describe_machine(measure=summary.get("train_seconds", 0.0) >= MEASURE_MACHINE_SECONDS)
        (tmp / SUMMARY).write_text(json.dumps(summary, indent=2, default=str))
        (tmp / MODEL_INFO).write_text(json.dumps({"run": name, "method": run.method, "predictor": method.predictor_kind,
                                                  "config": run.config}, indent=2, default=str) + "\n")
        if (tmp / "README.md").is_file():   # a sentence-transformers folder: its generic card gives way to ours
            (tmp / "README.md").write_text(encoder_card(name, run.method, run.config, summary,
                                                        params["data"]["dataset_dir"]), encoding="utf-8")
    # the model is in place: only now may its checkpoints go (a kill up to here resumes from them)
    fault_point("train.after_save")
    for done in ctx.after_saved:
        done()
    ws.checkpoints(name).mkdir(parents=True, exist_ok=True)   # the stage's declared (persisted) checkpoint folder
    log.info("trained %s (%s) in %.1f s", name, run.method, summary.get("train_seconds", 0.0))
    release_freed_memory()   # the run's tables are freed now; the trainer's malloc settings would keep them resident
    return summary


__all__ = ["MODEL_INFO", "SUMMARY", "train_run", "training_inputs"]
