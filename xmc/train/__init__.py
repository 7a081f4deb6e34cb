"""One trainer for every method: losses, objectives and samplers plug in."""

from xmc.train.evaluator import RetrievalEvaluator
from xmc.train.objective import Objective, RetrievalObjective
from xmc.train.trainer import Trainer, TrainConfig

__all__ = ["Objective", "RetrievalEvaluator", "RetrievalObjective", "TrainConfig", "Trainer"]
