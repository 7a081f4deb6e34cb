"""Negative samplers: each builds the candidate-label pool of a batch of training queries."""

from xmc.negatives.base import (CandidateBatch, NegativeSampler, pool_batch, positives_mask,
                                sample_positives_per_query, StepPlan)
from xmc.negatives.samplers import AllLabels, HardNegativeShortlist, InBatchNegatives, build_sampler

__all__ = ["AllLabels", "CandidateBatch", "HardNegativeShortlist", "InBatchNegatives", "NegativeSampler",
           "build_sampler", "pool_batch", "positives_mask",
           "sample_positives_per_query", "StepPlan"]
