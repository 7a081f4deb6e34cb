"""The fuse stage's work: a run's predictions + label-name matches -> the run's hybrid predictions and predictor.

Fusion weights are fit on the validation split only. The validation predictions of the hybrid are cross-fitted
(weights fit on the other folds of validation documents), so its validation metrics are not in-sample; the
test predictions use the weights fit on the whole validation split, through the same ranker the model package's
``hybrid`` predictor runs.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from xmc.logs import kv

log = logging.getLogger(__name__)
SUFFIX = "_hybrid"
ZERO_SHOT_SUFFIX = "_zs_hybrid"


def validation_folds(groups: list[Any] | None, n_rows: int, n_folds: int) -> np.ndarray:
    """Fold of each validation row: whole documents (groups) go together, round-robin in sorted order;
    rows without a group are split by position."""
    keys = sorted({str(g) for g in groups if g is not None}) if groups else []
    if len(keys) < n_folds:  # fewer documents than folds: contiguous blocks of rows
        return (np.arange(n_rows) * n_folds // max(1, n_rows)).astype(np.int64)
    fold_of = {g: i % n_folds for i, g in enumerate(keys)}
    return np.array([fold_of[str(g)] if g is not None else i % n_folds for i, g in enumerate(groups)], np.int64)


def fit_supervised_fusion(cfg: dict[str, Any], table: Any, gold: Any, rows: np.ndarray, features: tuple[str, ...],
                          kind: str | None = None) -> Any:
    """The fusion ``kind`` (default params ``hybrid.fusion``: boosted_trees or logistic) fit on the candidates of the
    validation texts ``rows`` of ``table`` (:class:`~xmc.lexical.hybrid.CandidateTable`)."""
    from xmc.lexical.hybrid import CandidateTable, fit_boosted_fusion, fit_fusion

    keep = np.isin(table.rows, rows)
    sub = CandidateTable(table.rows[keep], table.labels[keep], table.X[keep])
    if (kind or cfg["fusion"]) == "boosted_trees":
        return fit_boosted_fusion(sub, gold, cfg["boosted_trees"], features, C=cfg["C"])
    return fit_fusion(sub, gold, cfg["C"], features)


def cross_fitted_scores(table: Any, folds: np.ndarray, fit: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """Each candidate's score under a fusion fit on the other folds' texts (``folds``: fold of each text; ``fit``:
    text rows -> (fusion, info)): the validation predictions of a hybrid, not in-sample. Returns (scores, the
    folds' infos)."""
    cross = np.zeros(len(table.rows))
    infos: dict[str, Any] = {}
    for f in range(int(folds.max()) + 1 if len(folds) else 0):
        held = folds[table.rows] == f
        if held.any() and (~held).any():
            w, info = fit(np.flatnonzero(folds != f))
            cross[held] = w.score(table.X[held])
            if info:
                infos[f"fold_{f}"] = info
    return cross, infos


def fuse_run(params: dict[str, Any], name: str, root: str | Path = ".", zero_shot: bool = False,
             with_predictor: bool = True, base: str | None = None) -> dict[str, Any]:
    """``with_predictor``: also write ``indexes/<run>_hybrid`` (the model package's hybrid predictor over the run's
    index); without it only the predictions are written (a run trained elsewhere whose index is not here, e.g. the
    GPU profiles). ``zero_shot``: read no training data (``<run>_zs_hybrid``): the fusion is the label-name retriever's
    zero-shot score plus a weighted method score (:func:`xmc.lexical.hybrid.zero_shot_fusion`), the two weights
    chosen on the validation split from ``hybrid.zero_shot`` grids; otherwise (``<run>_hybrid``) the fusion of
    ``hybrid.fusion`` (boosted trees or logistic) fit on validation, with the training label counts among its
    features. ``base``: the run whose predictions and index are fused into ``<name>_hybrid`` (default: ``name``
    itself; the pipeline's hybrids take theirs from ``hybrid.runs``, :func:`hybrid_base`)."""
    out_name = name + (ZERO_SHOT_SUFFIX if zero_shot else SUFFIX)
    return _fuse(params, [base or name], out_name, Path(root), zero_shot=zero_shot, with_predictor=with_predictor)


def hybrid_base(params: dict[str, Any], name: str) -> str:
    """The run whose top-k the pipeline's ``<name>_hybrid`` fuses (params ``hybrid.runs``, ``<run>: <base run>``):
    the run itself unless the hybrid's own choice differs from its method's."""
    return str(params["hybrid"]["runs"].get(name, name))


def fuse_ensemble(params: dict[str, Any], root: str | Path = ".") -> dict[str, Any]:
    """The ensemble hybrid (params ``hybrid.ensemble``): the union of the member runs' top-k lists and the name
    matches, re-scored by one fusion (``hybrid.fusion``) of every member's score and the name evidence, fit on
    validation (cross-fitted there) -> ``predictions/<name>`` and the predictor ``indexes/<name>`` over the members' indexes."""
    from xmc.errors import ConfigError

    ens = params["hybrid"]["ensemble"]
    members = list(ens["members"])
    if len(members) < 2 or len(set(members)) != len(members):
        raise ConfigError(f"params.yaml: hybrid.ensemble.members must name two or more distinct runs (have {members})")
    return _fuse(params, members, ens["name"], Path(root), ensemble=True)


def _fuse(params: dict[str, Any], bases: list[str], out_name: str, root: Path, zero_shot: bool = False,
          with_predictor: bool = True, ensemble: bool = False) -> dict[str, Any]:
    """Fuse the runs ``bases`` (one run, or an ensemble's members) with the label-name matches into ``out_name``."""
    from xmc.config.schema import predicted_splits
    from xmc.data import load_processed
    from xmc.errors import ConfigError
    from xmc.io import atomic_dir, read_json, write_json
    from xmc.lexical.hybrid import HybridRanker, choose_zero_shot_fusion, top_k
    from xmc.methods.base import PREDICTOR_SECTION
    from xmc.package.predictors import HybridPredictor
    from xmc.predictions import TopK

    cfg, names_cfg = params["hybrid"], params["label_names"]
    k = params["evaluate"]["top_k"]
    zs = cfg["zero_shot"]
    # the splits every base run predicts: a selection candidate has only "val", and its hybrid then ranks only the
    # validation split too
    splits = tuple(s for s in predicted_splits(params, bases[0]) if all(s in predicted_splits(params, b) for b in bases))
    if "val" not in splits:
        raise ConfigError(f"params.yaml: predictions.{bases[0]} must include val (the fusion is fit there)")
    for name in bases:
        for split in splits:
            if not (root / "predictions" / name / f"{split}_topk.npz").is_file():
                raise ConfigError(f"{root / 'predictions' / name / f'{split}_topk.npz'}: missing (run the prediction "
                                  f"stage of {name})")
    if zero_shot:  # no training split is read: the label counts the ranker keeps are zeros (weight 0 anyway)
        ds = load_processed(root / params["data"]["processed_dir"], splits=splits, without_training=True)
        counts = np.zeros(len(ds.label_texts))
    else:
        ds = load_processed(root / params["data"]["processed_dir"], splits=("trn", *splits))
        counts = np.asarray(ds.trn.Y.sum(0)).ravel()

    def base_topk(split: str) -> list[tuple[np.ndarray, np.ndarray]]:
        tops = [TopK.load(root / "predictions" / name / f"{split}_topk.npz") for name in bases]
        return [(t.scores, t.indices) for t in tops]

    t0 = time.perf_counter()
    ranker = HybridRanker(ds.label_texts, names_cfg["mode"], counts, max_words=names_cfg["max_words"],
                          cased_names=names_cfg["cased_names"], members=bases if ensemble else None)
    table = ranker.table_many(ds.val.texts, base_topk("val"))
    folds = validation_folds(ds.val.groups, len(ds.val), cfg["cross_fit_folds"])
    chosen: dict[str, Any] = {}

    def fit(rows: np.ndarray):
        if zero_shot:
            w, info = choose_zero_shot_fusion(table, ds.val.Y, rows, zs["method_weight"], zs["matched_bonus"],
                                              zs["precision_k"])
            return w, info
        return fit_supervised_fusion(cfg, table, ds.val.Y, rows, ranker.features), {}

    cross, infos = cross_fitted_scores(table, folds, fit)
    chosen.update(infos)
    ranker.weights, info = fit(np.arange(len(ds.val)))
    if info:
        chosen["all"] = info
    fit_seconds = time.perf_counter() - t0
    D, I = top_k(table, cross, len(ds.val), k)
    TopK(I.astype(np.int32), D).save(root / "predictions" / out_name / "val_topk.npz")
    t0 = time.perf_counter()
    if "tst" in splits:
        D, I = ranker.rank_many(ds.tst.texts, base_topk("tst"), k)
        TopK(I.astype(np.int32), D).save(root / "predictions" / out_name / "tst_topk.npz")
    rank_seconds = time.perf_counter() - t0 if "tst" in splits else None
    if with_predictor:
        with atomic_dir(root / "indexes" / out_name) as tmp:
            sources = {name: root / "indexes" / name for name in bases}
            section = HybridPredictor.build(sources if ensemble else sources[bases[0]], tmp, ds.label_texts,
                                            {"ranker": ranker, "base_k": k})
            (tmp / PREDICTOR_SECTION).write_text(json.dumps(section, indent=2) + "\n")
    timings = [read_json(root / "predictions" / name / "timing.json")
               if (root / "predictions" / name / "timing.json").is_file() else {} for name in bases]
    # an ensemble costs what its members cost together, plus the fusion
    base_train = sum(float(t.get("train_seconds", 0.0)) for t in timings)
    base_predict = sum(float(t.get("predict_seconds") or 0.0) for t in timings)
    summary = {"train_seconds": round(base_train + fit_seconds, 2),
               "fusion_fit_seconds": round(fit_seconds, 2),
               "predict_seconds": (round(base_predict + rank_seconds, 2) if rank_seconds is not None else None),
               "splits": list(splits), "predictor": "hybrid",
               **({"members": bases} if ensemble else {"base": bases[0]}),
               "candidates_per_text": round(len(table.rows) / max(1, len(ds.val)), 1),
               "fusion": ranker.weights.describe(), "cross_fit_folds": cfg["cross_fit_folds"],
               "zero_shot": zero_shot, **({"chosen_on_validation": chosen} if chosen else {})}
    write_json(root / "predictions" / out_name / "timing.json", summary)
    d = summary["fusion"]
    log.info("fused %s with label names into %s: %.1f candidates per text, %s fusion %s", " + ".join(bases), out_name,
             summary["candidates_per_text"], d["kind"],
             kv(dict(zip(d["features"], d["weights"])), 3) if "weights" in d else f"of {d['n_trees']} trees")
    return summary
