"""A run's training record, written while it trains, through DVCLive (the DVC ecosystem's logger).

One :class:`TrainingLog` per run, in ``plots/train/<run>/``: ``metrics.json`` (the latest values: what
``dvc metrics show`` and ``dvc exp show`` read, also while the run goes) and ``plots/metrics/**.tsv`` (one
history per metric over the training step: what ``dvc plots show`` draws). The trainer logs per step the loss,
its parts, the learning rate and the step throughput, and per epoch the validation metrics and the epoch's
sentences per second. A run made of several trainers (MACLR's Stage I and II) logs each under its prefix, on
one step axis.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

# the validation metrics a run's live record carries (the evaluator computes more; these are the report's)
LIVE_VALIDATION = ("P@1", "P@5", "PSP@5", "R@100")


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
        from dvclive import Live

        resuming = self.live is None and resumed_at_step > 0
        if self.live is None:
            # a resumed run keeps the history written before the interruption (the stage persists the folder)
            self.live = Live(dir=str(self.directory), resume=resumed_at_step > 0, report=None, save_dvc_exp=False,
                             dvcyaml=None, monitor_system=False)
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
        declared outputs exist."""
        if self.live is None:
            self.start()
        self.live.make_summary()
        (self.directory / "plots" / "metrics").mkdir(parents=True, exist_ok=True)
        self.live = None
