"""The linear one-vs-all peer: PECOS XR-Linear on TF-IDF features (fit and rank; the stage writes the files).

libpecos needs numpy < 2 and scipy < 1.14, so these functions run in the PECOS environment the Makefile creates
(``.venv-pecos``); importing this module does not import libpecos, calling them does.

Its settings are params ``xr_linear`` (:class:`xmc.config.schema.XrLinearRunConfig`); the lab's variants override them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.errors import ConfigError
from xmc.predictions import TopK, topk_from_sparse


def require_libpecos() -> Any:
    """libpecos's ``Indexer``, ``LabelEmbeddingFactory`` and ``XLinearModel``; a one-line error where it is missing."""
    try:   # imported here: libpecos lives only in the PECOS environment (.venv-pecos), see above
        from pecos.xmc import Indexer, LabelEmbeddingFactory
        from pecos.xmc.xlinear.model import XLinearModel
    except ImportError:
        raise ConfigError("libpecos is not installed in this environment: run the stage with .venv-pecos/bin/python "
                          "(`make setup` creates it)") from None
    return Indexer, LabelEmbeddingFactory, XLinearModel


def fit_xr_linear(X: sp.csr_matrix, Y: sp.csr_matrix, cfg: dict[str, Any]) -> Any:
    """A PECOS ``XLinearModel``: PIFA (or PII) label features, a hierarchical k-means label tree of ``nr_splits``
    children per node and leaves of at most ``max_leaf_size`` labels, one linear model per tree node (cost ``Cp`` on
    positives, ``Cn`` on negatives; weights below ``threshold`` dropped)."""
    Indexer, LabelEmbeddingFactory, XLinearModel = require_libpecos()
    X = X.tocsr().astype(np.float32)
    Y = Y.tocsr().astype(np.float32)
    if X.shape[0] != Y.shape[0]:
        raise ConfigError(f"XR-Linear: {X.shape[0]} feature rows against {Y.shape[0]} label rows")
    label_feat = LabelEmbeddingFactory.create(Y, X, method=cfg["label_embedding"])
    tree = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", nr_splits=cfg["nr_splits"],
                       max_leaf_size=cfg["max_leaf_size"], seed=cfg["seed"], threads=cfg["threads"])
    return XLinearModel.train(X, Y, C=tree, threshold=cfg["threshold"], Cp=cfg["Cp"], Cn=cfg["Cn"],
                              solver_type=cfg["solver_type"], threads=cfg["threads"])


def rank_xr_linear(model: Any, X: sp.csr_matrix, cfg: dict[str, Any], k: int) -> TopK:
    """The top ``k`` labels of each row of ``X`` by beam search down the tree (``beam_size`` nodes a level)."""
    S = model.predict(X.tocsr().astype(np.float32), beam_size=cfg["beam_size"], only_topk=k,
                      post_processor=cfg["post_processor"], threads=cfg["threads"])
    return topk_from_sparse(S, k)


def load_xr_linear(path: str) -> Any:
    """A saved ``XLinearModel`` for prediction."""
    *_, XLinearModel = require_libpecos()
    return XLinearModel.load(path, is_predict_only=True)
