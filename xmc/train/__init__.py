"""One trainer for every method: losses and samplers plug in."""

from xmc.train.evaluator import RetrievalEvaluator
from xmc.train.trainer import Trainer, TrainConfig

__all__ = ["RetrievalEvaluator", "TrainConfig", "Trainer"]
