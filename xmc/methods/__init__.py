"""Methods as compositions of shared parts (encoder, sampler, loss, trainer, index)."""

from xmc.methods.dual_encoder import deep_merge, run_config, train_dual_encoder

__all__ = ["deep_merge", "run_config", "train_dual_encoder"]
