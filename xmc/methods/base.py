"""The method interface: every method (the papers' five, the peers, the baselines) implements :class:`Method` once.

* ``train(ctx, data)`` writes the trained model into ``ctx.model_dir`` and returns its training summary;
  methods trained by the shared :class:`~xmc.trainer.Trainer` derive from :class:`TrainerMethod` and only say
  how to *build* their parts (model, sampler, objective, how to save);
* ``predictor_kind`` names the :mod:`xmc.package.predictors` kind that serves the saved model (written into the
  model folder, so packaging needs no method code); ``train_splits`` and ``features`` say what training reads.

The harness that runs a method (:mod:`xmc.methods.harness`) is the same for every method.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from xmc.config.runs import RunSpec
from xmc.errors import ConfigError
from xmc.io import fault_point
from xmc.trainer import RetrievalEvaluator, Trainer, TrainConfig
from xmc.workspace import Workspace

def ranks_of(run: RunSpec) -> int:
    """The data-parallel ranks a run asks for: ``train.nproc_per_node``, or for MACLR's two stages their
    ``stage1.train`` / ``stage2.train`` (one world for the whole run: they must agree); no ``train`` section: 1."""
    found = {}
    for where in ("", "stage1", "stage2"):
        section = run.config.get(where) if where else run.config
        train = section.get("train") if isinstance(section, dict) else None
        if isinstance(train, dict) and "nproc_per_node" in train:
            found[f"{where}.train" if where else "train"] = int(train["nproc_per_node"])
    if len(set(found.values())) > 1:
        raise ConfigError(f"run {run.name!r}: " + ", ".join(f"{k}.nproc_per_node {v}" for k, v in found.items())
                          + " differ: one run trains in one set of ranks")
    return next(iter(found.values()), 1)


@dataclass
class RunContext:
    """Where one run reads its settings and writes its outputs."""

    params: dict[str, Any]   # the product settings the run reads (evaluate, label_names, index)
    run: RunSpec
    model_dir: Path          # the (temporary) folder the trained model is written to
    work_dir: Path           # resumable checkpoints (checkpoints/<run>/)
    plots_dir: Path          # the live training record (plots/train/<run>/, DVCLive)
    live: Any = None         # its :class:`~xmc.trainer.live.TrainingLog`, shared by the run's trainers
    ws: Workspace = field(default_factory=Workspace)   # where the processed data and the features are
    # run once the model is in place (Trainer.complete: drop the checkpoints a kill before that would resume from)
    after_saved: list[Callable[[], None]] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        return self.run.config


class Method(ABC):
    """One way of training a retriever and predicting with it."""

    name: ClassVar[str]
    #: processed splits training reads (``()``: the method reads its own inputs, e.g. MACLR's pseudo pairs)
    train_splits: ClassVar[tuple[str, ...]] = ("trn", "val")
    #: features (:mod:`xmc.features`) training reads beyond the processed splits: ``tfidf``, ``graph``, ``maclr_pairs``
    features: ClassVar[tuple[str, ...]] = ()
    #: the :mod:`xmc.package.predictors` kind that predicts with a trained model of this method
    predictor_kind: ClassVar[str] = "dense"

    def splits_read(self, config: dict[str, Any]) -> tuple[str, ...]:
        """The processed splits a run of this method with ``config`` reads (default :attr:`train_splits`)."""
        return self.train_splits

    @abstractmethod
    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        """Train on ``data`` (the splits :meth:`splits_read` names; None when it names none), write the model into
        ``ctx.model_dir`` and return the training summary (``train_seconds`` at least)."""


@dataclass
class TrainingParts:
    """What a :class:`TrainerMethod` builds for the one trainer."""

    model: Any
    sampler: Any
    objective: Any
    fingerprint: dict[str, Any]                     # settings that make a checkpoint resumable by this run
    save: Callable[[Path], None]                    # write the trained model into a folder
    after_fit: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda history: {})  # -> summary fields


class TrainerMethod(Method):
    """A method trained by the shared :class:`~xmc.trainer.Trainer`: it only builds its parts."""

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
