"""UniDEC's two heads on one encoder, and a trained UniDEC model as a package serves it.

:class:`UniDECHeads` is the network both training (:class:`xmc.methods.unidec.UniDECModel`, which adds the
trainable classifier table Ψ) and prediction run: the encoder Φ, the dual-encoder head g1 and the classifier head
g2. :class:`UniDECInference` is the heads with a fixed Ψ, loaded from a model folder, in one of three retrieval
spaces: ``de`` (cos of g1 vectors), ``clf`` (cos of g2(x) and Ψ_l) and ``concat`` (one index over
[Φ_D(z) ⊕ N(Ψ)], queried with [Φ_D(x) ⊕ N(Φ_C(x))], whose inner product is cos_DE + cos_CLF).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xmc.encoders.base import TextEncoder
from xmc.encoders.build import load_encoder
from xmc.errors import ConfigError, DataFormatError
from xmc.io import load_tensors
from xmc.models.layout import UNIDEC_DESCRIPTION, is_unidec_model

SPACES = ("concat", "de", "clf")
DESCRIPTION = UNIDEC_DESCRIPTION
HEADS = "unidec_heads.pt"      # {"g1", "g2" state dicts, "psi": n_labels x dim}
ENCODER = "encoder"


def check_space(space: str) -> str:
    if space not in SPACES:
        raise ConfigError(f"unidec space must be one of {SPACES}, not {space!r}")
    return space



class UniDECHeads(nn.Module):
    """Shared encoder + DE head g1 (linear, tanh, dropout; unit-norm output) + CLF head g2 (linear, dropout)."""

    def __init__(self, encoder: TextEncoder, dim: int = 256, dropout: float = 0.1,
                 dropout_clf: float | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        # ``dropout`` is g1's (DE head); ``dropout_clf`` is g2's and defaults to the same (paper: 0.1 both)
        self.dim, self.dropout_p = dim, dropout
        self.dropout_clf = dropout if dropout_clf is None else dropout_clf
        d_in = encoder.dim
        self.g1 = nn.Sequential(nn.Linear(d_in, dim), nn.Tanh(), nn.Dropout(dropout))
        self.g2 = nn.Sequential(nn.Linear(d_in, dim), nn.Dropout(self.dropout_clf))
        # Orthogonal projections with zero bias: at step 0 both heads score (almost) like the base
        # encoder (Φ is unit-norm, tanh is near-linear there), so training starts from its ranking
        # instead of from a random rotation of it.
        for lin in (self.g1[0], self.g2[0]):
            nn.init.orthogonal_(lin.weight)
            nn.init.zeros_(lin.bias)

    def query_heads(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(Φ_D(x), Φ_C(x)) from one encoder pass: the DE vector is unit-norm, the CLF one is not."""
        phi = self.encoder(list(texts), "query")
        return F.normalize(self.g1(phi), dim=-1), self.g2(phi)

    @torch.no_grad()
    def heads_np(self, texts: Sequence[str], side: str, batch_size: int = 256,
                 progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(unit-norm DE vectors, CLF vectors) of ``texts`` as float32 numpy, in eval mode."""
        was = self.training
        self.eval()
        phi = torch.from_numpy(self.encoder.encode(list(texts), side, batch_size, progress))
        de, clf = [], []
        device = self.g1[0].weight.device
        for s in range(0, len(phi), 8192):
            x = phi[s : s + 8192].to(device)
            de.append(F.normalize(self.g1(x), dim=-1).float().cpu())
            clf.append(self.g2(x).float().cpu())
        self.train(was)
        return torch.cat(de).numpy(), torch.cat(clf).numpy()

    @torch.no_grad()
    def query_space_vectors(self, texts: Sequence[str], space: str, batch_size: int = 256,
                            progress: bool = False) -> np.ndarray:
        de, clf = self.heads_np(texts, "query", batch_size, progress)
        clf_n = clf / np.maximum(np.linalg.norm(clf, axis=1, keepdims=True), 1e-12)
        return {"de": de, "clf": clf_n.astype(np.float32),
                "concat": np.ascontiguousarray(np.hstack([de, clf_n]).astype(np.float32))}[check_space(space)]

    @torch.no_grad()
    def label_space_vectors_with(self, psi: torch.Tensor, label_texts: Sequence[str], space: str,
                                 batch_size: int = 256, progress: bool = False) -> np.ndarray:
        """Label vectors of ``space`` given the classifier table ``psi`` (all labels, in order)."""
        psi_n = F.normalize(psi.float(), dim=-1).cpu().numpy()
        if check_space(space) == "clf":
            return np.ascontiguousarray(psi_n)
        de, _ = self.heads_np(label_texts, "label", batch_size, progress)
        return de if space == "de" else np.ascontiguousarray(np.hstack([de, psi_n]))

    def head_state(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"g1": self.g1.state_dict(), "g2": self.g2.state_dict()}

    def description(self, n_labels: int) -> dict[str, float | int]:
        return {"dim": self.dim, "dropout": self.dropout_p, "dropout_clf": self.dropout_clf, "n_labels": n_labels}


def read_description(path: Path, n_labels: int) -> dict[str, object]:
    if not is_unidec_model(path):
        raise ConfigError(f"{path / DESCRIPTION}: not a saved UniDEC model")
    try:
        cfg = json.loads((path / DESCRIPTION).read_text(encoding="utf-8"))
        int(cfg["dim"]), float(cfg["dropout"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataFormatError(path / DESCRIPTION, None, f"not a UniDEC model description ({str(e)[:120]})") from None
    if int(cfg["n_labels"]) != n_labels:
        raise ConfigError(f"{path}: model has {cfg['n_labels']} labels, the data {n_labels}")
    return cfg


class UniDECInference(UniDECHeads):
    """The trained heads with their classifier table Ψ (a plain tensor), predicting in one ``space``."""

    def __init__(self, encoder: TextEncoder, psi: torch.Tensor, label_texts: Sequence[str], space: str = "concat",
                 dim: int = 256, dropout: float = 0.1, dropout_clf: float | None = None) -> None:
        super().__init__(encoder, dim, dropout, dropout_clf)
        self.space = check_space(space)
        self.label_texts = list(label_texts)
        self.register_buffer("psi", psi)

    @classmethod
    def load(cls, path: str | Path, label_texts: Sequence[str], space: str = "concat",
             untouched: str = "zero") -> UniDECInference:
        """``untouched``: a bag-of-words encoder's untouched buckets (:func:`~xmc.encoders.build.load_encoder`)."""
        path = Path(path)
        cfg = read_description(path, len(label_texts))
        st = load_tensors(path / HEADS)
        try:
            model = cls(load_encoder(path / ENCODER, untouched=untouched), st["psi"], label_texts, space,
                        dim=int(cfg["dim"]), dropout=float(cfg["dropout"]), dropout_clf=cfg.get("dropout_clf"))
            model.g1.load_state_dict(st["g1"])
            model.g2.load_state_dict(st["g2"])
        except (KeyError, RuntimeError, TypeError) as e:
            raise DataFormatError(path / HEADS, None, f"does not match {DESCRIPTION} ({str(e)[:120]})") from None
        return model.eval()

    def label_space_vectors(self, space: str | None = None, batch_size: int = 256, progress: bool = False) -> np.ndarray:
        return self.label_space_vectors_with(self.psi, self.label_texts, space or self.space, batch_size, progress)

    def query_vectors(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        return self.query_space_vectors(texts, self.space, batch_size)


__all__ = ["DESCRIPTION", "ENCODER", "HEADS", "SPACES", "UniDECHeads", "UniDECInference", "check_space",
           "is_unidec_model"]
