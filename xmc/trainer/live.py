"""A run's training record, written while it trains, through DVCLive (the DVC ecosystem's logger).

One :class:`TrainingLog` per run, in ``plots/train/<run>/``: ``metrics.json`` (the latest values: what
``dvc metrics show`` and ``dvc exp show`` read, also while the run goes) and ``plots/metrics/**.tsv`` (one
history per metric over the training step: what ``dvc plots show`` draws). The trainer logs per step the loss,
its parts, the learning rate and the step throughput, and per epoch the validation metrics and the epoch's
sentences per second. A run made of several trainers (MACLR's Stage I and II) logs each under its prefix, on
one step axis. Where DVCLive is not installed (a stock PyTorch image on a GPU worker, outside the DVC project)
the same two kinds of file are written by :class:`PlainLive`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# the validation metrics a run's live record carries (the evaluator computes more; these are the report's)
LIVE_VALIDATION = ("P@1", "P@5", "PSP@5", "R@100")


class PlainLive:
    """The part of ``dvclive.Live`` the trainer uses, without DVC: ``metrics.json`` (latest values, nested at
    ``/`` as DVCLive writes them, with ``step``) and ``plots/metrics/<name>.tsv`` (``step``, value) per metric."""

    def __init__(self, dir: str, resume: bool = False) -> None:  # noqa: A002 - DVCLive's argument name
        self.dir = Path(dir)
        self.step = 0
        self._latest: dict[str, float] = {}
        self.plots = self.dir / "plots" / "metrics"
        self.plots.mkdir(parents=True, exist_ok=True)
        if not resume:
            for f in self.plots.rglob("*.tsv"):
                f.unlink()

    def log_metric(self, name: str, value: float) -> None:
        self._latest[name] = value
        f = self.plots / f"{name}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        new = not f.exists()
        with f.open("a") as fh:
            if new:
                fh.write(f"step\t{name.rsplit('/', 1)[-1]}\n")
            fh.write(f"{self.step}\t{value}\n")

    def make_summary(self) -> None:
        summary: dict = {}
        for name, v in self._latest.items():
            node = summary
            *parents, last = name.split("/")
            for k in parents:
                node = node.setdefault(k, {})
            node[last] = v
        summary["step"] = self.step
        tmp = self.dir / "metrics.json.tmp"
        tmp.write_text(json.dumps(summary, indent=4))
        os.replace(tmp, self.dir / "metrics.json")


def _drop_cut_summary(path: Path) -> None:
    """dvclive rewrites ``metrics.json`` in place, so a run killed during that write leaves it cut short, and
    dvclive's resume (which reads it for the last step) would stop on it. It holds only the latest values, written
    again at the next sync (the per-step histories are other files, and the trainer sets every step itself), so a
    cut one is removed."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError):   # a cut or empty file (UnicodeDecodeError is a ValueError)
        log.warning("%s was cut short by the interrupted run: removed (written again at the next record)", path)
        path.unlink(missing_ok=True)


def _dvclive_class() -> Any:
    """``dvclive.Live``, or None where DVCLive is not installed (the record is then written by PlainLive).
    Imported when a run first logs, not with this module: dvclive pulls in pandas (about half a second), which every
    stage importing the trainer would pay, and a run that trains no step never uses it."""
    try:
        return importlib.import_module("dvclive").Live
    except ImportError:
        return None


def _open_live(directory: Path, resume: bool) -> Any:
    Live = _dvclive_class()  # noqa: N806 (the class)
    if Live is None:
        log.warning("dvclive is not installed: the training record in %s is written without it", directory)
        return PlainLive(dir=str(directory), resume=resume)
    if resume:
        _drop_cut_summary(directory / "metrics.json")
    return Live(dir=str(directory), resume=resume, report=None, save_dvc_exp=False, dvcyaml=None, monitor_system=False)


class TrainingLog:
    """DVCLive under the trainer: opened by the first trainer of a run, closed by the run harness."""

    def __init__(self, directory: str | Path, sync_every_s: float = 2.0) -> None:
        self.directory = Path(directory)
        self.sync_every_s = sync_every_s
        self.live = None
        self.prefix = ""
        self.base = 0            # this trainer's step 0 on the run's step axis
        self.last_step = -1
        self._last_sync = 0.0

    def start(self, prefix: str = "", resumed_at_step: int = 0) -> None:
        """A trainer starts (``resumed_at_step`` > 0: from a checkpoint): later steps go under ``prefix``."""
        resuming = self.live is None and resumed_at_step > 0
        if self.live is None:
            # a resumed run keeps the history written before the interruption (the stage persists the folder)
            self.live = _open_live(self.directory, resumed_at_step > 0)
        self.prefix = f"{prefix}/" if prefix else ""
        # a resumed trainer goes on at its own step (the steps between its checkpoint and the interruption are
        # logged again); a later trainer of the run (MACLR's Stage II) starts after the last step logged
        self.base = 0 if resuming or self.last_step < 0 else self.last_step + 1

    def log(self, step: int, values: Mapping[str, float], final: bool = False) -> None:
        """Values at the trainer's ``step``; the summary file is rewritten at most every ``sync_every_s``."""
        if self.live is None:
            return
        s = self.base + int(step)
        self.live.step = s
        for name, v in values.items():
            self.live.log_metric(f"{self.prefix}{name}", float(v))
        self.last_step = max(self.last_step, s)
        now = time.monotonic()
        if final or now - self._last_sync >= self.sync_every_s:
            self.live.make_summary()
            self._last_sync = now

    def log_validation(self, step: int, metrics: Mapping[str, float], epoch: int) -> None:
        self.log(step, {"epoch": epoch, **{f"val/{k}": metrics[k] for k in LIVE_VALIDATION if k in metrics}},
                 final=True)

    def close(self) -> None:
        """The summary written; a run that trained no step still leaves its (empty) record, so the stage's
        declared outputs exist (written without DVCLive, whose start-up reads the DVC repository: most of a
        baseline's "training" time)."""
        if self.live is None:
            self.live = PlainLive(dir=str(self.directory))
        self.live.make_summary()
        (self.directory / "plots" / "metrics").mkdir(parents=True, exist_ok=True)
        self.live = None
