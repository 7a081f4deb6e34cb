"""Retrieval evaluation of a model during or after training (primary metric: P@1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.ann import ANNIndex
from xmc.config.schema import EvaluateConfig, TrainSection, filled
from xmc.metrics import evaluate_topk
from xmc.predictions import TopK


def predict_topk(model: Any, texts: list[str], k: int = 100, index_kind: str = "exact",
                 label_vectors: np.ndarray | None = None, batch_size: int = 256) -> TopK:
    """Encode labels (unless given) and queries, exact/ANN inner-product search, top-k."""
    lv = model.all_label_vectors(batch_size=batch_size) if label_vectors is None else label_vectors
    qv = model.query_vectors_np(texts, batch_size=batch_size)
    D, I = ANNIndex(kind=index_kind).build(lv).search(qv, k)
    return TopK(I.astype(np.int32), D)


class RetrievalEvaluator:
    """Evaluates a model on held-out queries; declares ``primary_metric``."""

    primary_metric = "P@1"

    def __init__(self, texts: list[str], Y: sp.csr_matrix, train_label_freq: np.ndarray, n_train: int,
                 k: int = 100, a: float = 0.55, b: float = 1.5, filt: sp.csr_matrix | None = None) -> None:
        self.texts, self.Y, self.freq, self.n_train, self.k, self.a, self.b = texts, Y, train_label_freq, n_train, k, a, b
        self.filt = filt   # the split's scoring filter: pairs dropped from the ranking, as the evaluation drops them

    @classmethod
    def monitoring(cls, ds: Any, train_cfg: dict[str, Any], eval_params: dict[str, Any] | None
                   ) -> tuple[RetrievalEvaluator | None, int]:
        """The per-epoch monitor of a training run and its period (``train.eval_every_epochs``; 0 = none):
        the first ``train.val_max_instances`` queries of the **validation** split (0 = all of it). The test
        split is never loaded for training, so it cannot leak into curves, early stopping or choices.
        ``train_cfg`` and ``eval_params`` (the params ``train`` and ``evaluate`` sections) may be partial: the
        schema's defaults fill the rest."""
        train_cfg = filled(TrainSection, train_cfg, "train")
        every = train_cfg["eval_every_epochs"]
        if not every:
            return None, 0
        ev = filled(EvaluateConfig, eval_params, "evaluate")
        if ds.val is None or len(ds.val) == 0:
            return None, 0
        n_val = train_cfg["val_max_instances"] or len(ds.val)
        freq = np.asarray(ds.trn.Y.sum(0)).ravel()
        filt = ds.val_filter[:n_val] if getattr(ds, "val_filter", None) is not None else None
        return cls(ds.val.texts[:n_val], ds.val.Y[:n_val], freq, len(ds.trn),
                   a=ev["propensity_a"], b=ev["propensity_b"], filt=filt), every

    def __call__(self, model: Any) -> dict[str, float]:
        pred = predict_topk(model, self.texts, self.k)
        m = evaluate_topk(pred, self.Y, self.freq, self.n_train, recall_ks=(10, self.k), a=self.a, b=self.b,
                          filt=self.filt)["metrics"]
        return {k: float(v) for k, v in m.items() if k[0] in "PnRu"}
