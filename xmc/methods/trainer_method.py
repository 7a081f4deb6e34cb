"""The methods trained by the one :class:`~xmc.trainer.trainer.Trainer`: they only build their parts.

Kept apart from :mod:`xmc.methods.base` (the interface every method implements) because it imports torch and the
trainer, which a baseline's run and the training plan never need.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from xmc.config.runs import RunSpec
from xmc.io import fault_point
from xmc.methods.base import Method, RunContext
from xmc.parallel import init_from_env
from xmc.ranks import DistContext
from xmc.trainer.evaluator import RetrievalEvaluator
from xmc.trainer.trainer import Trainer, TrainConfig


class DataParallelMethod(Method):
    """A method whose trainings split their work over the ranks torchrun launched (``train.nproc_per_node``)."""

    def join_ranks(self, run: RunSpec, launched: DistContext) -> DistContext:
        return init_from_env()


@dataclass
class TrainingParts:
    """What a :class:`TrainerMethod` builds for the one trainer."""

    model: Any
    sampler: Any
    objective: Any
    fingerprint: dict[str, Any]                     # settings that make a checkpoint resumable by this run
    save: Callable[[Path], None]                    # write the trained model into a folder
    after_fit: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda history: {})  # -> summary fields


class TrainerMethod(DataParallelMethod):
    """A method trained by the shared :class:`~xmc.trainer.trainer.Trainer`: it only builds its parts."""

    @abstractmethod
    def build(self, ctx: RunContext, ds: Any) -> TrainingParts:
        """Model, sampler, objective and how to save, for the run's settings on ``ds``."""

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        cfg = ctx.config
        torch.manual_seed(int(cfg["train"]["seed"]))
        parts = self.build(ctx, ds)
        evaluator, every = RetrievalEvaluator.monitoring(ds, cfg["train"], ctx.params["evaluate"])
        trainer = Trainer(parts.model, parts.sampler, parts.objective, TrainConfig.from_params(cfg["train"]),
                          ds.trn.texts, ctx.work_dir, evaluator=evaluator, eval_every_epochs=every,
                          fingerprint_extra=parts.fingerprint, live=ctx.live)
        t0 = time.perf_counter()
        result = trainer.fit(complete=False)   # the checkpoint stays until the model is saved
        extra = parts.after_fit(result["history"])
        wall = time.perf_counter() - t0
        fault_point("train.before_save")
        parts.save(ctx.model_dir)
        ctx.after_saved.append(trainer.complete)
        hist = result["history"]
        return {
            "train_seconds": round(sum(e["seconds"] for e in hist["epochs"]), 2),  # epochs include ANN refreshes
            "wall_seconds_this_run": round(wall, 2),
            "epochs": len(hist["epochs"]),
            "steps": trainer.global_step,
            "final_loss": hist["loss"][-1]["loss"] if hist["loss"] else None,
            "refresh_seconds": [round(s, 2) for s in getattr(parts.sampler, "refresh_seconds", [])],
            "refreshed_at_epochs": list(getattr(parts.sampler, "refreshed_at", [])),
            "mined_queries": list(getattr(parts.sampler, "mined_rows", [])),   # per refresh: the queries it mined
            **extra,   # a method's own fields (and its own refresh record, where its sampler wraps another)
            "device": str(trainer.device),
            "last_validation": hist["val"][-1] if hist["val"] else None,
        }


__all__ = ["DataParallelMethod", "TrainerMethod", "TrainingParts"]
