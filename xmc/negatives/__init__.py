"""Negative samplers: each builds the candidate-label pool of a batch of training queries."""

from xmc.negatives.base import CandidateBatch, NegativeSampler, positives_mask, sample_positives
from xmc.negatives.samplers import AllLabels, HardNegativeShortlist, InBatchNegatives, build_sampler

__all__ = ["AllLabels", "CandidateBatch", "HardNegativeShortlist", "InBatchNegatives", "NegativeSampler",
           "build_sampler", "positives_mask", "sample_positives"]
