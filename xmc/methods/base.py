"""The method interface: every method (the papers' five, the peers, the baselines) implements :class:`Method` once.

* ``train(ctx, data)`` writes the trained model into ``ctx.model_dir`` and returns its training summary;
  methods trained by the shared :class:`~xmc.trainer.trainer.Trainer` derive from
  :class:`~xmc.methods.trainer_method.TrainerMethod` and only say how to *build* their parts (model, sampler,
  objective, how to save); this module imports no torch, so planning and the baselines' runs stay without it;
* ``predictor_kind`` names the :mod:`xmc.package.predictor` kind that serves the saved model (written into the
  model folder, so packaging needs no method code); ``train_splits`` and ``features`` say what training reads.

The harness that runs a method (:mod:`xmc.methods.harness`) is the same for every method.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from xmc.config.runs import RunSpec
from xmc.errors import ConfigError
from xmc.ranks import DistContext
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
    #: the :mod:`xmc.package.predictor` kind that predicts with a trained model of this method
    predictor_kind: ClassVar[str] = "dense"

    def splits_read(self, config: dict[str, Any]) -> tuple[str, ...]:
        """The processed splits a run of this method with ``config`` reads (default :attr:`train_splits`)."""
        return self.train_splits

    def join_ranks(self, run: RunSpec, launched: DistContext) -> DistContext:
        """Join the process group of a run torchrun launched as ``launched.world`` ranks; a method that trains in one
        process refuses (:class:`~xmc.methods.trainer_method.DataParallelMethod` joins)."""
        raise ConfigError(f"run {run.name!r}: method {self.name!r} trains in one process; it was launched as rank "
                          f"{launched.rank} of {launched.world} (run it without torchrun)")

    @abstractmethod
    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        """Train on ``data`` (the splits :meth:`splits_read` names; None when it names none), write the model into
        ``ctx.model_dir`` and return the training summary (``train_seconds`` at least)."""
