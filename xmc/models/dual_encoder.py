"""The dual encoder: query and label towers of one :class:`~xmc.encoders.base.TextEncoder`.

A model exposes query vectors and label vectors (both with gradients) and their no-grad numpy versions for
indexing; a score is their inner product. The trainer optimises it; a dense predictor serves its encoder.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from xmc.encoders.base import TextEncoder


class DualEncoderModel(nn.Module):
    """Query and label towers from one :class:`TextEncoder` (shared weights unless untied)."""

    def __init__(self, encoder: TextEncoder, label_texts: Sequence[str]) -> None:
        super().__init__()
        self.encoder = encoder
        self.label_texts = list(label_texts)

    @property
    def n_labels(self) -> int:
        return len(self.label_texts)

    def query_vectors(self, texts: Sequence[str]) -> torch.Tensor:
        return self.encoder(list(texts), "query")

    def label_vectors(self, label_ids: np.ndarray) -> torch.Tensor:
        return self.encoder([self.label_texts[i] for i in label_ids], "label")

    @torch.no_grad()
    def all_label_vectors(self, batch_size: int = 256, progress: bool = True) -> np.ndarray:
        return self.encoder.encode(self.label_texts, "label", batch_size, progress)

    @torch.no_grad()
    def query_vectors_np(self, texts: Sequence[str], batch_size: int = 256, progress: bool = True) -> np.ndarray:
        return self.encoder.encode(list(texts), "query", batch_size, progress)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Named parameter groups, so a method can give each its own learning rate."""
        return {"encoder": [p for p in self.encoder.parameters() if p.requires_grad]}

    def pair_vectors(self, texts: Sequence[str], label_ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and label vectors of one step; a tied encoder encodes both sides in one pass."""
        return self.encoder.encode_pair(texts, [self.label_texts[i] for i in label_ids])
