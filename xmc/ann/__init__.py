"""Approximate / exact nearest-neighbour search over faiss (``python -m xmc.ann`` for a CLI)."""

from xmc.ann.index import ANNIndex, gpu_available

__all__ = ["ANNIndex", "gpu_available"]
