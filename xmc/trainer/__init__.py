"""One trainer for every method: losses, objectives and samplers plug in."""

from xmc.trainer.evaluator import RetrievalEvaluator
from xmc.trainer.objective import Objective, RetrievalObjective
from xmc.trainer.trainer import Trainer, TrainConfig

__all__ = ["Objective", "RetrievalEvaluator", "RetrievalObjective", "TrainConfig", "Trainer"]
