"""Hybrids: a run's candidates + the label-name matches, re-scored by a fusion fit on validation -> the hybrid's
package, predictions and metrics (the ``fuse@<hybrid>`` and ``ensemble`` stages, and ``xmc train --hybrid``).

Fusion weights are fit on the validation split only. The validation predictions of the hybrid are cross-fitted
(weights fit on the other folds of validation documents), so its validation metrics are not in-sample; the
test predictions use the weights fit on the whole validation split, through the same ranker the model package's
``hybrid`` predictor runs. A validation-tuned hybrid's fusion (``fusion: valtuned``) reads no training label: two
weights chosen on a grid, or boosted trees on the features that need no training pair, fit on validation
(``hybrid.valtuned.fusion``; ``auto`` takes the one with the better cross-fitted validation P@k); the training split
is read only to evaluate it, for the label propensities of PSP@k.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.evaluation import evaluate_split, write_evaluation
from xmc.io import atomic_dir, read_json, write_json
from xmc.lexical.fusion_fit import fit_boosted_fusion, fit_fusion
from xmc.lexical.hybrid import (HybridRanker, LossWithoutNameMatch, base_only_fusion, choose_first_bonus,
                                choose_valtuned_fusion, first_of_a_run, precision_at, top_k)
from xmc.lexical.hybrid import CandidateTable
from xmc.logs import kv
from xmc.package.build import PREDICTED_SPLITS, dataset_record
from xmc.cards import training_record
from xmc.package.package import finish_package
from xmc.package.lexical_predictors import HybridPredictor
from xmc.metrics.bootstrap import InstanceContributions, bootstrap_settings, paired_bootstrap
from xmc.predictions import TopK
from xmc.workspace import Workspace

log = logging.getLogger(__name__)
SUFFIX = "_hybrid"


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
    keep = np.isin(table.rows, rows)
    sub = CandidateTable(table.rows[keep], table.labels[keep], table.X[keep])
    if (kind or cfg["fusion"]) == "boosted_trees":
        return fit_boosted_fusion(sub, gold, cfg["boosted_trees"], features, C=cfg["C"], monotone=cfg["monotone"])
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


def with_correct_name_match(table: CandidateTable, features: tuple[str, ...], gold: Any) -> np.ndarray:
    """(n_texts,) bool: the texts with one of their true labels among their name matches."""
    gold = gold.tocsr()
    matched = table.X[:, features.index("matched")] > 0
    correct = matched & (np.asarray(gold[table.rows, table.labels]).ravel() > 0)
    has = np.zeros(gold.shape[0], bool)
    has[table.rows[correct]] = True
    return has


def without_pairs(table: CandidateTable, pairs: Any) -> CandidateTable:
    """``table`` without the candidates (text, label) that ``pairs`` (a CSR, e.g. the split's scoring filter) holds:
    the evaluation drops them from the ranking, so the fusion is fit without them."""
    if pairs is None or pairs.nnz == 0:
        return table
    pairs = pairs.tocsr()
    n_labels = pairs.shape[1]
    drop_keys = np.repeat(np.arange(pairs.shape[0], dtype=np.int64), np.diff(pairs.indptr)) * n_labels + pairs.indices
    keep = ~np.isin(table.rows.astype(np.int64) * n_labels + table.labels, drop_keys)
    return CandidateTable(table.rows[keep], table.labels[keep], table.X[keep])


def name_match_breakdown(has_match: np.ndarray, base: InstanceContributions, hybrid: InstanceContributions,
                         boot: dict[str, Any]) -> dict[str, Any]:
    """P@1 and P@5 of the base run and the hybrid (their evaluation's per-instance contributions on one split) on
    the texts with a correct label among their name matches (``has_match``) and on those without, and the hybrid −
    base P@1 on each with a paired document-resampled interval: a fusion must not buy its gain on the first group
    with a loss on the second."""
    if not base.n == hybrid.n == len(has_match):
        raise ValueError(f"contributions of {base.n} and {hybrid.n} instances for {len(has_match)} texts")
    out: dict[str, Any] = {}
    for part, rows in (("with_correct_name_match", np.flatnonzero(has_match)), ("without", np.flatnonzero(~has_match))):
        if not len(rows):
            out[part] = {"texts": 0}
            continue
        contrib = {"base": base.subset(rows), "hybrid": hybrid.subset(rows)}
        test = paired_bootstrap(contrib["hybrid"], contrib["base"], "P@1", boot["n_resamples"], boot["seed"],
                                boot["level"], boot["unit"])
        vals = {who: c.values() for who, c in contrib.items()}
        out[part] = {"texts": int(len(rows)), "base P@1": round(vals["base"]["P@1"], 2),
                     "hybrid P@1": round(vals["hybrid"]["P@1"], 2), "base P@5": round(vals["base"]["P@5"], 2),
                     "hybrid P@5": round(vals["hybrid"]["P@5"], 2), "P@1 diff": round(test["diff"], 2),
                     "P@1 diff ci95": test["ci95"], "p_value": round(test["p_value"], 4)}
    return out


def fuse(params: dict[str, Any], name: str, bases: list[str], ws: Workspace, valtuned: bool = False,
         splits: tuple[str, ...] = PREDICTED_SPLITS, base_ws: Workspace | None = None,
         with_package: bool = True) -> dict[str, Any]:
    """Fuse the runs ``bases`` (one run, or an ensemble's members) with the label-name matches into the hybrid
    ``name``: its package (the bases' predictors as hard links + the fusion; ``with_package`` False: none, for bases
    whose packages are not kept), its predictions and metrics of ``splits`` (``val`` at least: the fusion is fit
    there). ``base_ws``: where the bases' packages and predictions are (default ``ws``)."""
    base_ws = base_ws or ws
    cfg, names_cfg = params["hybrid"], params["label_names"]
    k = params["evaluate"]["top_k"]
    vt = cfg["valtuned"]
    if "val" not in splits:
        raise ConfigError(f"{name}: a hybrid is fit on the validation split (splits must include val)")
    for base in bases:
        for split in splits:
            path = base_ws.predictions(base) / f"{split}_topk.npz"
            if not path.is_file():
                raise ConfigError(f"{path}: missing (run the package stage of {base})")
    # the training split is read for the label counts and the evaluation's propensities; a validation-tuned fusion
    # gives the counts no weight (they are not among its features)
    ds = load_processed(ws.processed, splits=("trn", *splits))
    counts = np.zeros(len(ds.label_texts)) if valtuned else np.asarray(ds.trn.Y.sum(0)).ravel()

    def base_topk(split: str) -> list[tuple[np.ndarray, np.ndarray]]:
        tops = [TopK.load(base_ws.predictions(b) / f"{split}_topk.npz") for b in bases]
        return [(t.scores, t.indices) for t in tops]

    ensemble = len(bases) > 1
    t0 = time.perf_counter()
    ranker = HybridRanker(ds.label_texts, names_cfg["mode"], counts, max_words=names_cfg["max_words"],
                          cased_names=names_cfg["cased_names"], members=bases if ensemble else None)
    if not valtuned:   # how often each label's name, found in a training text, is its answer
        ranker.fit_name_precision(ds.trn.texts, ds.trn.Y, cfg["name_precision_strength"])
    table = without_pairs(ranker.table_many(ds.val.texts, base_topk("val")), ds.val_filter)
    folds = validation_folds(ds.val.groups, len(ds.val), cfg["cross_fit_folds"])
    chosen: dict[str, Any] = {}
    # the texts whose name matches are all wrong: there a fusion may lose at most hybrid.max_loss_without_name_match
    # P@1 against its run (the validation-tuned weights and the first bonus are chosen under that bound)
    misled = None if ensemble else ~with_correct_name_match(table, ranker.features, ds.val.Y)

    every = np.arange(len(ds.val))

    def fit_grid(rows: np.ndarray):
        return choose_valtuned_fusion(table, ds.val.Y, rows, vt["method_weight"], vt["matched_bonus"],
                                      vt["precision_k"], misled, cfg["max_loss_without_name_match"],
                                      cfg["min_texts_without_name_match"])

    def fit_trees(rows: np.ndarray):
        return fit_supervised_fusion(cfg, table, ds.val.Y, rows, ranker.features,
                                     kind="boosted_trees" if valtuned else None), {}

    n_misled = int(misled.sum()) if misled is not None else 0
    first = first_of_a_run(table, ranker.features)   # the candidates each run ranks first

    def with_first_bonus(kind: str, cross: np.ndarray) -> tuple[float, dict[str, Any], bool | None]:
        # the run's first answer keeps a bonus another candidate must overcome, chosen by cross-fitted validation
        # P@1 (one number picked on the predictions it is then reported on: an in-sample choice of the validation
        # row), at most hybrid.max_loss_without_name_match below the run on the texts whose name matches are all
        # wrong; the bonus is in the fusion score's units: the grid fusion's own grid, the trees' log-odds grid
        return choose_first_bonus(table, cross, ranker.features, ds.val.Y, every,
                                  vt["first_bonus"] if kind == "grid" else cfg["first_bonus"], misled,
                                  cfg["max_loss_without_name_match"], cfg["min_texts_without_name_match"])

    # a validation-tuned hybrid's fusion: the two-weight grid, boosted trees on the features no training pair
    # gives (the run's score and rank, the name matches), or (auto) whichever has the better cross-fitted
    # validation P@k, each with its own first bonus, within the bound on the texts without a correct name match
    # (ties: the grid; a second in-sample choice of the validation row)
    kinds = (("grid", "boosted_trees") if vt["fusion"] == "auto" else (vt["fusion"],)) if valtuned else ("trained",)
    fits = {"grid": fit_grid, "boosted_trees": fit_trees, "trained": fit_trees}
    crossed = {kind: cross_fitted_scores(table, folds, fits[kind]) for kind in kinds}
    bonuses = {kind: with_first_bonus(kind, crossed[kind][0]) for kind in kinds}
    kind = kinds[0]
    if len(kinds) > 1:
        bound = LossWithoutNameMatch(table, ds.val.Y, every, ranker.features, misled,
                                     cfg["max_loss_without_name_match"], cfg["min_texts_without_name_match"])
        final = {k_: crossed[k_][0] + bonuses[k_][0] * first for k_ in kinds}
        precisions = [precision_at(table, final[k_], ds.val.Y, every, vt["precision_k"]) for k_ in kinds]
        losses = [bound.of(final[k_]) for k_ in kinds]
        i, met = bound.best(precisions, losses)
        kind = kinds[i]
        chosen["valtuned_fusion"] = {"chosen": kind, **{
            k_: {f"P@{vt['precision_k']}": round(p_, 3), "first_bonus": bonuses[k_][0],
                 **({"loss without a correct name match": round(l_, 3)} if l_ is not None else {})}
            for k_, p_, l_ in zip(kinds, precisions, losses)}}
        if met is not None:
            chosen["valtuned_fusion"]["bound_met"] = met
    fit = fits[kind]
    cross, infos = crossed[kind]
    chosen.update(infos)
    ranker.weights, info = fit(every)
    if info:
        chosen["all"] = info
    if info.get("bound_met") is False:
        log.warning("%s: no validation-tuned weights keep the validation texts without a correct name match within %.2f P@1 "
                    "of %s; the ones losing least are taken (%.2f)", name, cfg["max_loss_without_name_match"],
                    bases[0], info["loss without a correct name match"])
    bonus, tried, bound_met = bonuses[kind]
    ranker.first_bonus = bonus
    cross = cross + bonus * first
    chosen["first_bonus"] = {"chosen": bonus, "grid": tried, "texts without a correct name match": n_misled}
    if n_misled:
        chosen["first_bonus"]["bound_met"] = bound_met   # None: too few texts for the bound to mean anything
    if bound_met is False:
        log.warning("%s: no first bonus keeps the validation texts without a correct name match within %.2f P@1 of "
                    "%s; the one losing least (%g: %.2f) is taken", name, cfg["max_loss_without_name_match"],
                    bases[0], bonus, tried[f"{bonus:g}"]["loss without a correct name match"])
    if not ensemble and cfg["keep_base_below_k"]:
        # where the names do not help (few texts say their labels' names), a fusion can rank below its run: the
        # hybrid then keeps the run's ranking, decided by the cross-fitted validation P@k against the run's own
        k_guard = int(cfg["keep_base_below_k"])
        keep_base = base_only_fusion(ranker.features)
        base_scores = keep_base.score(table.X)
        fused_p, base_p = (precision_at(table, cross, ds.val.Y, every, k_guard),
                           precision_at(table, base_scores, ds.val.Y, every, k_guard))
        chosen["against_base"] = {f"fused P@{k_guard}": round(fused_p, 3), f"base P@{k_guard}": round(base_p, 3)}
        if fused_p < base_p:
            log.warning("%s: the fusion ranks below %s on validation (cross-fitted P@%d %.2f < %.2f): the hybrid "
                        "keeps the run's ranking", name, bases[0], k_guard, fused_p, base_p)
            ranker.weights, ranker.first_bonus, cross = keep_base, 0.0, base_scores
            chosen["against_base"]["kept"] = "base ranking"
    fit_seconds = time.perf_counter() - t0
    predictions: dict[str, TopK] = {}
    D, I = top_k(table, cross, len(ds.val), k)
    predictions["val"] = TopK(I.astype(np.int32), D)
    rank_seconds = None
    tables = {"val": table}
    if "tst" in splits:
        t0 = time.perf_counter()
        tables["tst"] = ranker.table_many(ds.tst.texts, base_topk("tst"))
        D, I = top_k(tables["tst"], ranker.score(tables["tst"]), len(ds.tst), k)   # = ranker.rank_many
        rank_seconds = time.perf_counter() - t0
        predictions["tst"] = TopK(I.astype(np.int32), D)
    has_match = {} if ensemble else {split: with_correct_name_match(t, ranker.features, ds.split(split).Y)
                                     for split, t in tables.items()}
    timings = [read_json(base_ws.predictions(b) / "timing.json") if (base_ws.predictions(b) / "timing.json").is_file()
               else {} for b in bases]
    # a hybrid costs what its bases cost together, plus the fusion
    base_train = sum(float(t.get("train_seconds", 0.0)) for t in timings)
    base_predict = sum(float(t.get("predict_seconds") or 0.0) for t in timings)
    summary = {"train_seconds": round(base_train + fit_seconds, 2), "fusion_fit_seconds": round(fit_seconds, 2),
               "predict_seconds": (round(base_predict + rank_seconds, 2) if rank_seconds is not None else None),
               "splits": list(splits), "predictor": "hybrid",
               **({"members": bases} if ensemble else {"base": bases[0]}),
               "candidates_per_text": round(len(table.rows) / max(1, len(ds.val)), 1),
               "fusion": {**ranker.weights.describe(), "first_bonus": ranker.first_bonus},
               "cross_fit_folds": cfg["cross_fit_folds"],
               "valtuned": valtuned, **({"chosen_on_validation": chosen} if chosen else {})}
    for split, top in predictions.items():
        top.save(ws.predictions(name) / f"{split}_topk.npz")
    write_json(ws.predictions(name) / "timing.json", summary)
    metrics = {}
    boot = bootstrap_settings(params)
    for split, top in predictions.items():
        result = evaluate_split(top, ds, split, params)
        if split in has_match:
            base_path = base_ws.contributions(bases[0], split)
            if not base_path.is_file():
                raise ConfigError(f"{base_path}: missing (run the package stage of {bases[0]})")
            b = name_match_breakdown(has_match[split], InstanceContributions.load(base_path),
                                     result["contributions"], boot)
            result["metrics"]["by_name_match"] = b
            log.info("%s on %s texts with / without a correct name match: %s", name, split,
                     "; ".join(f"{v['texts']} texts, P@1 {v.get('base P@1')} -> {v.get('hybrid P@1')}"
                               for v in b.values()))
        metrics[split] = write_evaluation(ws, name, split, result, params, summary)
    d = summary["fusion"]
    log.info("fused %s with label names into %s: %.1f candidates per text, %s fusion %s", " + ".join(bases), name,
             summary["candidates_per_text"], d["kind"],
             kv(dict(zip(d["features"], d["weights"])), 3) if "weights" in d else f"of {d['n_trees']} trees")
    if not with_package:
        return summary
    with atomic_dir(ws.package(name)) as tmp:
        sources = {b: base_ws.package(b) for b in bases}
        section = HybridPredictor.build(sources if ensemble else sources[bases[0]], tmp, ds.label_texts,
                                        {"ranker": ranker, "base_k": k})
        finish_package(tmp, section, name=name, method="hybrid",
                       label_uids=ds.label_uids, label_texts=ds.label_texts,
                       params={"bases": bases, "fusion": "valtuned" if valtuned else cfg["fusion"],
                               "hybrid": cfg, "label_names": names_cfg},
                       dataset=dataset_record(ws, ds), training=training_record(summary),
                       metrics={s: {k_: v for k_, v in m.items() if k_ not in ("ci95", "by_name_match")}
                                for s, m in metrics.items()})
    return summary


__all__ = ["cross_fitted_scores", "fit_supervised_fusion", "fuse", "name_match_breakdown", "validation_folds",
           "with_correct_name_match", "without_pairs"]
