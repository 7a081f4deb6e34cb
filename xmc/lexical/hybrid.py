"""Hybrid candidates and a learned fusion: a method's top-k ∪ the labels whose names occur in the text,
re-scored by a model over the method's score and the name-match evidence: gradient-boosted trees
(:class:`BoostedTreesFusion`, params ``hybrid.fusion: boosted_trees``) or a logistic model (:class:`FusionWeights`).
Trees see interactions a weighted sum cannot (a name match is strong evidence for a label the method ranks high and
weak for one it ranks low; a sense prior matters for an ambiguous name only).

Features of a (text, label) candidate (:data:`HYBRID_FEATURES`): the method's score (the row's lowest
retrieved score minus one where the method did not retrieve the label), whether the method retrieved it, its rank
and its gap to the row's best score; the name-match features of :mod:`xmc.lexical.matcher`; how often the label's
name, found in a training text, was that text's answer (:func:`name_match_precision`); how many names the text
matches; and the label's log training count. The fusion is fit on the **validation** split (a small model over
sixteen features, like any other choice made there); the validation metrics of the fused ranking are cross-fitted
by document group so that they are not in-sample.

Where a name misleads (a package name that is a common word, a word sense the text does not mean), the fusion must
not buy its gain on texts whose names are right with a loss on the others: the trees keep the direction of the
evidence (:func:`monotone_constraints`), a name's training precision tells reliable names from unreliable ones, and
the label the run ranks first keeps a bonus (:attr:`HybridRanker.first_bonus`, chosen on validation) that another
candidate must overcome.

An ensemble hybrid fuses several runs at once: the candidates are the union of their top-k lists and the name
matches, and each member run contributes its own score, retrieved flag, rank and gap (:func:`hybrid_features`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.errors import ConfigError
from xmc.io import save_npz_deterministic
from xmc.lexical.matcher import FEATURES, ZERO_SHOT_NAME_WEIGHTS, LabelNameMatcher, Match
from xmc.lexical.names import parse_label_names
from xmc.metrics import hit_matrix
from xmc.native import trees_score

METHOD_FEATURES = ("method_score", "method_retrieved", "method_rank", "method_gap")   # per fused run
HYBRID_FEATURES = (*METHOD_FEATURES, *FEATURES, "name_precision", "text_matches", "log_train_count")
# the direction a fusion's score must keep in each feature (:func:`monotone_constraints`)
MONOTONE = {"method_score": 1, "method_rank": -1, "method_gap": -1, "matched": 1, "name_precision": 1}


def hybrid_features(members: Sequence[str] | None = None) -> tuple[str, ...]:
    """The feature names of a fusion: one run's (``members`` None: :data:`HYBRID_FEATURES`), or an ensemble's, whose
    runs each contribute ``<run>:method_score`` and ``<run>:method_retrieved``."""
    if members is None:
        return HYBRID_FEATURES
    return (*(f"{m}:{f}" for m in members for f in METHOD_FEATURES), *FEATURES, "name_precision", "text_matches",
            "log_train_count")


@dataclass
class CandidateTable:
    """Every candidate of a batch of texts: row (text index), label id and feature vector."""

    rows: np.ndarray      # (m,) int
    labels: np.ndarray    # (m,) int
    X: np.ndarray         # (m, len(hybrid_features(members))) float64


def candidate_table(bases: Sequence[tuple[np.ndarray, np.ndarray]], matches: Sequence[dict[int, Match]],
                    matcher: LabelNameMatcher, prior: np.ndarray, mfs: np.ndarray,
                    log_count: np.ndarray, name_precision: np.ndarray | None = None) -> CandidateTable:
    """The union of the runs' top-k lists (``bases``: one (scores, ids) pair per run, rows aligned) and the name
    matches, one feature row per (text, label), in text order and by label id within a text. Per run
    (:data:`METHOD_FEATURES`): its score (where it did not retrieve the label: its row's lowest retrieved score minus
    one, or 0.0 for a row it retrieved nothing for), the retrieved flag, log(1 + rank) (rank: how many labels of
    the row it scored strictly higher; a label it did not retrieve ranks after all it did) and the gap to the row's
    best score (0.0 where it retrieved nothing). Then the name-match features, the label's name precision on the
    training split where its name matched (0.0 otherwise; ``name_precision`` None: 0.0), log(1 + the text's number
    of name matches) and the log training count.

    Built with array operations over (text, label) keys (the name features: :meth:`LabelNameMatcher.feature_rows`)."""
    n_rows = len(matches)
    n_labels = len(log_count)
    n_name = len(FEATURES)
    n_method = len(METHOD_FEATURES)
    # the name matches: keys text * n_labels + label, and their feature rows
    m_text, m_lid, m_feats = matcher.feature_rows(matches, prior, mfs)
    m_keys = m_text * n_labels + m_lid
    # each run's retrieved (key, score, rank); a label listed twice in a row keeps its last score (as a dict would)
    got: list[tuple[np.ndarray, ...]] = []
    for scores, ids in bases:
        ids = np.asarray(ids)[:n_rows]
        sc = np.asarray(scores)[:n_rows].astype(np.float64)
        ok = (ids >= 0) & np.isfinite(sc)
        if ids.size and ids.max() >= n_labels:
            raise ValueError(f"a top-k list names label {int(ids.max())}, beyond the {n_labels} labels")
        r, c = np.nonzero(ok)
        keys = r.astype(np.int64) * n_labels + ids[r, c].astype(np.int64)
        vals = sc[r, c]
        rev_keys, first = np.unique(keys[::-1], return_index=True)   # the last occurrence of each key
        vals = vals[::-1][first]
        key_rows = rev_keys // n_labels
        low, best = np.full(n_rows, np.inf), np.full(n_rows, -np.inf)
        np.minimum.at(low, key_rows, vals)
        np.maximum.at(best, key_rows, vals)
        floor = np.where(np.isinf(low), 0.0, low - 1.0)
        best = np.where(np.isinf(best), 0.0, best)
        # rank = labels of the row scored strictly higher: the position of the first of its ties in score order
        order = np.lexsort((-vals, key_rows))
        rs, vs = key_rows[order], vals[order]
        pos = np.arange(len(rs))
        new = np.r_[True, (rs[1:] != rs[:-1]) | (vs[1:] != vs[:-1])] if len(rs) else np.zeros(0, bool)
        first_tie = np.maximum.accumulate(np.where(new, pos, 0)) if len(rs) else pos
        rank = np.empty(len(rs), np.float64)
        rank[order] = first_tie - np.searchsorted(rs, rs)
        n_retrieved = np.bincount(key_rows, minlength=n_rows).astype(np.float64)
        got.append((rev_keys, vals, rank, floor, best, n_retrieved))
    keys = np.unique(np.concatenate([m_keys, *(g[0] for g in got)]))
    rows, labels = keys // n_labels, keys % n_labels
    X = np.empty((len(keys), n_method * len(bases) + n_name + 3), np.float64)
    for b, (k, v, rank, floor, best, n_retrieved) in enumerate(got):
        pos = np.searchsorted(k, keys)
        hit = pos < len(k)
        hit[hit] = k[pos[hit]] == keys[hit]
        col = n_method * b
        X[:, col] = floor[rows]
        X[hit, col] = v[pos[hit]]
        X[:, col + 1] = hit
        X[:, col + 2] = n_retrieved[rows]
        X[hit, col + 2] = rank[pos[hit]]
        X[:, col + 2] = np.log1p(X[:, col + 2])
        X[:, col + 3] = best[rows] - X[:, col]
    start = n_method * len(bases)
    name_cols = slice(start, start + n_name)
    X[:, name_cols] = 0.0
    at = np.searchsorted(keys, m_keys)
    X[at, name_cols] = m_feats
    X[:, start + n_name] = 0.0
    if name_precision is not None:
        X[at, start + n_name] = np.asarray(name_precision, np.float64)[m_lid]
    X[:, start + n_name + 1] = np.log1p(np.bincount(m_text, minlength=n_rows))[rows] if n_rows else 0.0
    X[:, -1] = np.asarray(log_count, np.float64)[labels]
    return CandidateTable(rows.astype(np.int64), labels.astype(np.int64), X)


def first_of_a_run(table: CandidateTable, features: tuple[str, ...]) -> np.ndarray:
    """(m,) bool: the candidates some fused run ranks first (retrieved, nothing of its row scored higher)."""
    out = np.zeros(len(table.rows), bool)
    for i, f in enumerate(features):
        if f.endswith("method_rank"):
            out |= (table.X[:, i] == 0) & (table.X[:, i - 1] > 0)   # method_retrieved precedes method_rank
    return out


def monotone_constraints(features: tuple[str, ...]) -> list[int]:
    """Per feature of a fusion: +1 (the score may only rise with it), -1 (only fall) or 0 (free), from
    :data:`MONOTONE`: a run's score and rank and a name's precision keep their direction, so trees fit on a few
    thousand validation texts cannot learn an order the evidence contradicts."""
    return [MONOTONE.get(f.split(":")[-1], 0) for f in features]


def name_match_precision(matcher: LabelNameMatcher, texts: Sequence[str], Y: sp.csr_matrix,
                         strength: float) -> np.ndarray:
    """(n_labels,) the share of the texts whose name matches name the label that have it for a true label, shrunk
    toward the share over all labels with ``strength`` pseudo-texts: (gold + strength * p0) / (matched + strength);
    a label whose name never matched gets p0. Read from the training split: how often a name found in a text is
    the answer (word senses: the sense prior; package names: low for names that are common words)."""
    Y = Y.tocsr()
    n_labels = Y.shape[1]
    m_text, m_lid, _ = matcher.feature_rows(matcher.match_many(texts), np.ones(n_labels), np.zeros(n_labels))
    matched = np.bincount(m_lid, minlength=n_labels).astype(np.float64)
    gold = np.bincount(m_lid, weights=(np.asarray(Y[m_text, m_lid]).ravel() > 0).astype(np.float64),
                       minlength=n_labels) if len(m_lid) else np.zeros(n_labels)
    p0 = float(gold.sum() / matched.sum()) if matched.sum() else 0.0
    return (gold + strength * p0) / (matched + strength)


@dataclass
class FusionWeights:
    """A logistic model over standardised features: score = ((x - mean) / scale) . w + b."""

    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray
    features: tuple[str, ...] = HYBRID_FEATURES

    def score(self, X: np.ndarray) -> np.ndarray:
        return ((X - self.mean) / self.scale) @ self.weights + self.bias

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features), "weights": self.weights.tolist(), "bias": self.bias,
                "mean": self.mean.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_json(cls, d: dict[str, Any], expected: tuple[str, ...] = HYBRID_FEATURES) -> FusionWeights:
        feats = tuple(d["features"])
        if feats != expected:
            raise ConfigError(f"fusion weights for features {feats}, this code computes {expected}")
        return cls(np.asarray(d["weights"], np.float64), float(d["bias"]), np.asarray(d["mean"], np.float64),
                   np.asarray(d["scale"], np.float64), feats)


    def describe(self) -> dict[str, Any]:
        """What a run's timing.json records of the fusion: the whole model (a dozen numbers)."""
        return {"kind": "logistic", **self.to_json()}


@dataclass
class BoostedTreesFusion:
    """Gradient-boosted regression trees over the raw features (binary log-loss, fit by scikit-learn's
    HistGradientBoostingClassifier): score = baseline + Σ_t tree_t(x), the log-odds that the candidate is a true
    label. The trees are kept as plain arrays (node: feature, threshold, children, value) and evaluated here, so a
    model package holds JSON, not a pickled estimator, and reads the same under any scikit-learn version.

    A node with ``feature[n] < 0`` is a leaf; elsewhere x goes left when ``x[feature] <= threshold`` (a missing
    value goes where ``missing_left`` says), which is scikit-learn's own rule (tested against its
    ``decision_function``)."""

    trees: list[dict[str, np.ndarray]]   # per tree: feature (int), threshold, missing_left (bool), left, right, value
    baseline: float
    features: tuple[str, ...] = HYBRID_FEATURES
    settings: dict[str, Any] | None = None

    def _native_score(self, X: np.ndarray) -> np.ndarray | None:
        """The C kernel's scores (``xmc/native/trees_score.c``: the same additions in the same order), or None where
        it cannot be built (or ``XMC_NATIVE=0``)."""
        fn = trees_score()
        if fn is None or not self.trees:
            return None
        flat = self.__dict__.get("_flat")
        if flat is None:   # the trees concatenated, once per fusion
            sizes = [len(t["feature"]) for t in self.trees]
            flat = {k: np.ascontiguousarray(np.concatenate([t[k] for t in self.trees]).astype(dtype))
                    for k, dtype in (("feature", np.int64), ("threshold", np.float64), ("missing_left", np.uint8),
                                     ("left", np.int64), ("right", np.int64), ("value", np.float64))}
            flat["start"] = np.ascontiguousarray(np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64))
            self.__dict__["_flat"] = flat
        X = np.ascontiguousarray(X, np.float64)
        out = np.empty(len(X))
        fn(X.ctypes.data, len(X), X.shape[1] if X.ndim == 2 else 0, flat["feature"].ctypes.data,
           flat["threshold"].ctypes.data, flat["missing_left"].ctypes.data, flat["left"].ctypes.data,
           flat["right"].ctypes.data, flat["value"].ctypes.data, flat["start"].ctypes.data, len(self.trees),
           float(self.baseline), out.ctypes.data)
        return out

    def score(self, X: np.ndarray, native: bool = True) -> np.ndarray:
        """baseline + the sum of the trees' leaf values, by the C kernel where it builds; else (or ``native=False``)
        a tree at a time, one level per pass over the rows not yet at a leaf (measured faster than every tree at once
        over a rows x trees node array, from 150 rows up)."""
        X = np.asarray(X, np.float64)
        if native and len(X) and X.ndim == 2 and X.shape[1] == len(self.features):
            fast = self._native_score(X)
            if fast is not None:
                return fast
        out = np.full(len(X), self.baseline)
        rows = np.arange(len(X))
        for t in self.trees:
            feature, threshold, missing_left = t["feature"], t["threshold"], t["missing_left"]
            node = np.zeros(len(X), np.int64)
            live = rows[feature[node] >= 0]
            while live.size:
                n = node[live]
                x = X[live, feature[n]]
                left = np.where(np.isnan(x), missing_left[n], x <= threshold[n])
                node[live] = np.where(left, t["left"][n], t["right"][n])
                live = live[feature[node[live]] >= 0]
            out += t["value"][node]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"kind": "boosted_trees", "features": list(self.features), "baseline": self.baseline,
                "settings": self.settings or {},
                "trees": [{"feature": t["feature"].tolist(), "threshold": t["threshold"].tolist(),
                           "missing_left": t["missing_left"].astype(int).tolist(), "left": t["left"].tolist(),
                           "right": t["right"].tolist(), "value": t["value"].tolist()} for t in self.trees]}

    @classmethod
    def from_json(cls, d: dict[str, Any], expected: tuple[str, ...] = HYBRID_FEATURES) -> BoostedTreesFusion:
        feats = tuple(d["features"])
        if feats != expected:
            raise ConfigError(f"fusion trees for features {feats}, this code computes {expected}")
        trees = []
        for t in d["trees"]:
            tree = {"feature": np.asarray(t["feature"], np.int64), "threshold": np.asarray(t["threshold"], np.float64),
                    "missing_left": np.asarray(t["missing_left"], bool), "left": np.asarray(t["left"], np.int64),
                    "right": np.asarray(t["right"], np.int64), "value": np.asarray(t["value"], np.float64)}
            n = len(tree["feature"])
            inner = tree["feature"] >= 0
            if any(len(a) != n for a in tree.values()) or n == 0 or (tree["feature"] >= len(feats)).any() or (
                    inner & ((tree["left"] <= np.arange(n)) | (tree["right"] <= np.arange(n))
                             | (tree["left"] >= n) | (tree["right"] >= n))).any():
                raise ValueError("a tree's node arrays are inconsistent (lengths, features or children)")
            trees.append(tree)
        return cls(trees, float(d["baseline"]), feats, dict(d.get("settings") or {}))

    def describe(self) -> dict[str, Any]:
        """What a run's timing.json records of the fusion (the trees themselves are in the predictor's fusion.json)."""
        return {"kind": "boosted_trees", "features": list(self.features), "n_trees": len(self.trees),
                "leaves": int(sum(int((t["feature"] < 0).sum()) for t in self.trees)), "settings": self.settings or {}}


Fusion = FusionWeights | BoostedTreesFusion


def fusion_from_json(d: dict[str, Any], expected: tuple[str, ...] = HYBRID_FEATURES) -> Fusion:
    """A fusion saved by ``to_json`` (logistic when it names no kind: the format before trees)."""
    kind = d.get("kind", "logistic")
    if kind == "boosted_trees":
        return BoostedTreesFusion.from_json(d, expected)
    if kind != "logistic":
        raise ValueError(f"unknown fusion kind {kind!r} (expected logistic or boosted_trees)")
    return FusionWeights.from_json(d, expected)


def valtuned_fusion(method_weight: float, matched_bonus: float) -> FusionWeights:
    """Fusion weights that read no training data: the label-name retriever's zero-shot score (the validation-tuned fusion: only its two weights are chosen on labelled validation)
    (:data:`xmc.lexical.matcher.ZERO_SHOT_NAME_WEIGHTS`) + ``matched_bonus`` for a named label +
    ``method_weight`` x the method's score. Training counts and sense priors get weight 0."""
    w = np.zeros(len(HYBRID_FEATURES))
    w[HYBRID_FEATURES.index("method_score")] = method_weight
    w[HYBRID_FEATURES.index("matched")] = matched_bonus
    for f, v in ZERO_SHOT_NAME_WEIGHTS.items():
        w[HYBRID_FEATURES.index(f)] = v
    return FusionWeights(w, 0.0, np.zeros(len(HYBRID_FEATURES)), np.ones(len(HYBRID_FEATURES)))


def base_only_fusion(features: tuple[str, ...] = HYBRID_FEATURES) -> FusionWeights:
    """A fusion that keeps the run's own ranking: its score alone (a name-matched label it did not retrieve scores
    below the lowest it retrieved), what a hybrid falls back to where the names do not help on validation."""
    w = np.zeros(len(features))
    w[features.index("method_score")] = 1.0
    return FusionWeights(w, 0.0, np.zeros(len(features)), np.ones(len(features)), features)


def precision_at(table: CandidateTable, scores: np.ndarray, gold: sp.csr_matrix, rows: np.ndarray, k: int) -> float:
    """P@k (%) over the given text rows of the table's top-k under ``scores`` (rows without candidates count 0)."""
    keep = np.isin(table.rows, rows)
    sub = CandidateTable(table.rows[keep], table.labels[keep], table.X[keep])
    _, I = top_k(sub, scores[keep], gold.shape[0], k)

    hits = hit_matrix(I[rows], gold.tocsr()[rows])
    return float(100.0 * hits.sum() / (k * max(1, len(rows))))


class LossWithoutNameMatch:
    """P@1 points lost against the run's own ranking on the texts of ``rows`` with no correct label among their name
    matches (``misled``), the bound :func:`choose_valtuned_fusion` and :func:`choose_first_bonus` choose under:
    judged (``bounded``) only over at least ``min_texts`` such texts, where one text weighs under the bound."""

    def __init__(self, table: CandidateTable, gold: sp.csr_matrix, rows: np.ndarray, features: tuple[str, ...],
                 misled: np.ndarray | None, max_loss: float | None, min_texts: int) -> None:
        self.table, self.gold, self.max_loss = table, gold, max_loss
        self.wo = np.intersect1d(rows, np.flatnonzero(misled)) if misled is not None and max_loss is not None \
            else np.zeros(0, np.int64)
        self.base = precision_at(table, base_only_fusion(features).score(table.X), gold, self.wo, 1) \
            if len(self.wo) else None
        self.bounded = self.base is not None and len(self.wo) >= max(1, min_texts)

    def of(self, scores: np.ndarray) -> float | None:
        """The loss under ``scores`` (None: no such texts)."""
        return None if self.base is None else self.base - precision_at(self.table, scores, self.gold, self.wo, 1)

    def best(self, precisions: Sequence[float], losses: Sequence[float | None]) -> tuple[int, bool | None]:
        """The grid point with the best precision among those within the bound (ties: the first; none within: the
        one losing least), and whether the bound held (None: not judged)."""
        eligible = [i for i in range(len(precisions)) if not self.bounded or losses[i] <= self.max_loss + 1e-9]
        if not eligible:
            return min(range(len(losses)), key=lambda i: losses[i]), False
        best = eligible[0]
        for i in eligible[1:]:
            if precisions[i] > precisions[best] + 1e-9:
                best = i
        return best, (True if self.bounded else None)


def _with_loss(info: dict[str, Any], loss: float | None) -> dict[str, Any]:
    return {**info, "loss without a correct name match": round(loss, 3)} if loss is not None else info


def choose_valtuned_fusion(table: CandidateTable, gold: sp.csr_matrix, rows: np.ndarray,
                            method_weights: Sequence[float], matched_bonuses: Sequence[float],
                            k: int, misled: np.ndarray | None = None, max_loss: float | None = None,
                            min_texts: int = 1) -> tuple[FusionWeights, dict[str, Any]]:
    """The grid point of :func:`valtuned_fusion` with the best P@k on ``rows`` (ties: the first in grid order).

    With ``misled`` (per text: no correct label among its name matches) and ``max_loss``, as in
    :func:`choose_first_bonus`: only points whose P@1 on those of ``rows`` is at most ``max_loss`` points below the
    run's own ranking are eligible (:class:`LossWithoutNameMatch`). A large enough ``method_weight`` keeps the run's
    ranking (the names only break its ties), so a grid that holds one always has an eligible point."""
    bound = LossWithoutNameMatch(table, gold, rows, HYBRID_FEATURES, misled, max_loss, min_texts)
    points = [(float(mw), float(mb)) for mw in method_weights for mb in matched_bonuses]
    assert points, "an empty validation-tuned grid"
    precisions, losses = [], []
    for mw, mb in points:   # one candidate-score vector at a time (a grid of 33 on ~10^6 candidates)
        s = valtuned_fusion(mw, mb).score(table.X)
        precisions.append(precision_at(table, s, gold, rows, k))
        losses.append(bound.of(s))
    i, met = bound.best(precisions, losses)
    mw, mb = points[i]
    info = _with_loss({"method_weight": mw, "matched_bonus": mb, f"P@{k}": round(precisions[i], 3)}, losses[i])
    if met is not None:
        info["bound_met"] = met
    return valtuned_fusion(mw, mb), info


def choose_first_bonus(table: CandidateTable, scores: np.ndarray, features: tuple[str, ...], gold: sp.csr_matrix,
                       rows: np.ndarray, grid: Sequence[float], misled: np.ndarray | None = None,
                       max_loss: float | None = None, min_texts: int = 1) -> tuple[float, dict[str, Any], bool | None]:
    """The bonus of :attr:`HybridRanker.first_bonus` from ``grid``, added to ``scores`` (cross-fitted fused scores)
    of the candidates a run ranks first: the best P@1 on ``rows`` (ties: the first in grid order). With ``misled``
    (per text: no correct label among its name matches) and ``max_loss``, only bonuses whose P@1 on those texts is at
    most ``max_loss`` points below the run's own ranking are eligible (none is: the one losing least), so the fusion
    does not buy its gain where the names are right with a loss where they mislead. The bound holds only over at
    least ``min_texts`` such texts (fewer: each grid point's loss is reported, P@1 alone decides). Returns (bonus,
    what each grid point scored, whether the bound held: None where it was not judged)."""
    first = first_of_a_run(table, features)
    bound = LossWithoutNameMatch(table, gold, rows, features, misled, max_loss, min_texts)
    bonuses = [float(b) for b in grid]
    precisions, losses = [], []
    for b in bonuses:
        s = scores + b * first
        precisions.append(precision_at(table, s, gold, rows, 1))
        losses.append(bound.of(s))
    tried = {f"{b:g}": _with_loss({"P@1": round(p, 3)}, loss) for b, p, loss in zip(bonuses, precisions, losses)}
    i, met = bound.best(precisions, losses)
    return bonuses[i], tried, met


def top_k(table: CandidateTable, scores: np.ndarray, n_rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores (n, k) float32, ids (n, k) int64) of the best k candidates per row; -1 / -inf pad."""
    D = np.full((n_rows, k), -np.inf, np.float32)
    I = np.full((n_rows, k), -1, np.int64)
    order = np.lexsort((table.labels, -scores, table.rows))  # by row, then score desc, then label id
    rows, labels, sc = table.rows[order], table.labels[order], scores[order]
    starts = np.searchsorted(rows, np.arange(n_rows))
    ends = np.searchsorted(rows, np.arange(n_rows), side="right")
    for r in range(n_rows):
        n = min(k, ends[r] - starts[r])
        I[r, :n] = labels[starts[r] : starts[r] + n]
        D[r, :n] = sc[starts[r] : starts[r] + n]
    return D, I


class HybridRanker:
    """A method's top-k ∪ name matches, fused: the one implementation behind the ``fuse`` stage and the
    ``hybrid`` predictor of model packages. With ``members`` (run names) it fuses several runs' top-k lists at once
    (the ensemble hybrid): :meth:`table_many` / :meth:`rank_many` take one (scores, ids) pair per member, in order."""

    def __init__(self, label_texts: Sequence[str], mode: str, train_counts: np.ndarray,
                 weights: Fusion | None = None, max_words: int = 4, cased_names: bool = False,
                 members: Sequence[str] | None = None, name_precision: np.ndarray | None = None,
                 first_bonus: float = 0.0) -> None:
        self.names = parse_label_names(label_texts, mode)
        self.matcher = LabelNameMatcher(self.names, max_words=max_words, label_texts=label_texts,
                                        cased_names=cased_names)
        self.train_counts = np.asarray(train_counts, np.float64)
        self.prior, self.mfs = self.matcher.sense_prior(self.train_counts)
        self.log_count = np.log1p(self.train_counts)
        self.members = tuple(members) if members is not None else None
        self.features = hybrid_features(self.members)
        self.weights = weights
        # (n_labels,) how often a name match is the answer on the training split (:func:`name_match_precision`);
        # zeros for a fusion that reads no training label
        self.name_precision = (np.zeros(len(self.train_counts)) if name_precision is None
                               else np.asarray(name_precision, np.float64))
        # added to the fused score of a label some run ranks first: the run keeps its first answer unless the
        # fusion is that much surer of another (chosen on cross-fitted validation P@1; 0 = plain fusion)
        self.first_bonus = float(first_bonus)

    def fit_name_precision(self, texts: Sequence[str], Y: sp.csr_matrix, strength: float) -> None:
        """Set :attr:`name_precision` from labelled texts (the training split)."""
        self.name_precision = name_match_precision(self.matcher, texts, Y, strength)

    def score(self, table: CandidateTable, weights: Fusion | None = None) -> np.ndarray:
        """The fused score of each candidate of ``table``: the fusion's (``weights``, default the ranker's) plus
        :attr:`first_bonus` where a run ranks the label first."""
        w = weights or self.weights
        if w is None:
            raise ValueError("the hybrid ranker has no fusion weights (fit them on the validation split)")
        s = w.score(table.X)
        return s + self.first_bonus * first_of_a_run(table, self.features) if self.first_bonus else s

    def table(self, texts: Sequence[str], base_scores: np.ndarray, base_ids: np.ndarray) -> CandidateTable:
        return self.table_many(texts, [(base_scores, base_ids)])

    def table_many(self, texts: Sequence[str], bases: Sequence[tuple[np.ndarray, np.ndarray]]) -> CandidateTable:
        n_runs = len(self.members) if self.members is not None else 1
        if len(bases) != n_runs:
            raise ValueError(f"the ranker fuses {n_runs} run(s), got {len(bases)} top-k lists")
        return candidate_table(bases, self.matcher.match_many(texts), self.matcher, self.prior, self.mfs,
                               self.log_count, self.name_precision)

    def rank(self, texts: Sequence[str], base_scores: np.ndarray, base_ids: np.ndarray, k: int) \
            -> tuple[np.ndarray, np.ndarray]:
        return self.rank_many(texts, [(base_scores, base_ids)], k)

    def rank_many(self, texts: Sequence[str], bases: Sequence[tuple[np.ndarray, np.ndarray]], k: int) \
            -> tuple[np.ndarray, np.ndarray]:
        t = self.table_many(texts, bases)
        return top_k(t, self.score(t), len(texts), k)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_npz_deterministic(path / "train_counts.npz", counts=self.train_counts.astype(np.float32))
        save_npz_deterministic(path / "name_precision.npz", precision=self.name_precision.astype(np.float64))
        (path / "fusion.json").write_text(json.dumps({"label_names": self.names.mode,
                                                      "max_words": self.matcher.max_words,
                                                      "cased_names": self.matcher.cased_names,
                                                      "first_bonus": self.first_bonus,
                                                      **({"members": list(self.members)} if self.members else {}),
                                                      **(self.weights.to_json() if self.weights else {})}, indent=2))
