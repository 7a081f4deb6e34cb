"""Uncertainty of the XMC metrics: per-instance contributions, bootstrap intervals, paired tests.

Every metric of :func:`xmc.metrics.evaluate_topk` is a ratio of sums over test instances,
``100 * sum_i num_i / sum_i den_i`` (P@k, nDCG@k: den = 1; PSP@k: den = the row's best
achievable weight; R@k: den = 1 for rows with a positive; unseen_R: den = the row's unseen
positives). Storing ``num`` and ``den`` per instance lets one resample instances with
replacement (the percentile bootstrap) without the predictions, and lets two methods be
compared on the *same* resamples (the paired bootstrap), which is what makes small
differences testable.

Rows of one document (the sentences of one text, the binaries of one source package) are not
independent, so by default the resampled units are the split's documents: each document's
``num`` and ``den`` are summed and whole documents are drawn (the cluster bootstrap of a ratio
of sums). A split without documents resamples its instances.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.config.schema import EvaluateConfig, filled
from xmc.io import save_npz_deterministic
from xmc.metrics.hits import _apply_filter, hit_matrix, inverse_propensity
from xmc.predictions import TopK

# Pipeline layout: one folder per split, so that a validation-only stage (selection) can depend on
# evaluation/val and metrics_val without touching anything computed from test labels.
EVALUATION_DIR = Path("evaluation")
VAL_METRICS_DIR = Path("metrics_val")

# resample weights are generated and consumed in blocks of at most this many entries (memory bound)
_BLOCK_ENTRIES = 1 << 22
_CACHED_ENTRIES = 1 << 24   # float64 resample counts kept per process: at most 128 MB per draw


@dataclass
class InstanceContributions:
    """Per-instance numerators and denominators of every metric (rows follow ``names``)."""

    names: list[str]
    num: np.ndarray  # (n_metrics, n) float64
    den: np.ndarray  # (n_metrics, n) float64
    groups: np.ndarray | None = None   # (n,) int64: each instance's document (document_codes), or None

    def __post_init__(self) -> None:
        self.names = [str(x) for x in self.names]
        self.num = np.asarray(self.num, dtype=np.float64)
        self.den = np.asarray(self.den, dtype=np.float64)
        if self.num.shape != self.den.shape or self.num.ndim != 2 or self.num.shape[0] != len(self.names):
            raise ValueError(f"num {self.num.shape} and den {self.den.shape} must be ({len(self.names)}, n)")
        if self.groups is not None:
            self.groups = np.asarray(self.groups, dtype=np.int64)
            if self.groups.shape != (self.num.shape[1],) or (len(self.groups) and self.groups.min() < 0):
                raise ValueError(f"groups must hold one document index >= 0 per instance ({self.num.shape[1]}), "
                                 f"got shape {self.groups.shape}")

    @property
    def n(self) -> int:
        """Number of instances."""
        return int(self.num.shape[1])

    def row(self, metric: str) -> int:
        """Row of ``metric`` in ``num``/``den`` (a one-line error names what exists)."""
        try:
            return self.names.index(metric)
        except ValueError:
            raise KeyError(f"metric {metric!r} not in contributions ({', '.join(self.names)})") from None

    def values(self) -> dict[str, float]:
        """Point estimates in percent, equal to ``evaluate_topk(...)["metrics"]``; 0.0 when nothing to divide."""
        num, den = self.num.sum(1), self.den.sum(1)
        return {m: (100.0 * float(num[j] / den[j]) if den[j] > 0 else 0.0) for j, m in enumerate(self.names)}

    def resampling_units(self, unit: str = "documents") -> tuple[np.ndarray, np.ndarray, str]:
        """(num, den, unit) over the units a bootstrap draws: per document (summed over its instances) when
        ``unit`` is "documents" and the instances have documents, else per instance."""
        if unit not in ("documents", "instances"):
            raise ValueError(f"bootstrap unit must be 'documents' or 'instances', not {unit!r}")
        if unit == "instances" or self.groups is None:
            return self.num, self.den, "instances"
        n_docs = int(self.groups.max()) + 1 if self.n else 0
        member = sp.csr_matrix((np.ones(self.n), (self.groups, np.arange(self.n))), shape=(n_docs, self.n))
        return np.asarray((member @ self.num.T).T), np.asarray((member @ self.den.T).T), "documents"

    def subset(self, rows: np.ndarray) -> InstanceContributions:
        """The contributions of instances ``rows`` only, their documents re-coded 0..d-1 (a bootstrap over a
        subset resamples the documents it holds)."""
        rows = np.asarray(rows, dtype=np.int64)
        groups = None
        if self.groups is not None:
            _, groups = np.unique(self.groups[rows], return_inverse=True)
        return InstanceContributions(list(self.names), self.num[:, rows], self.den[:, rows], groups)

    def save(self, path: str | Path) -> None:
        """Byte-identical npz for identical contributions (DVC hashes it); no pickled objects."""
        extra = {} if self.groups is None else {"groups": self.groups}
        save_npz_deterministic(path, names=np.array(self.names, dtype=np.str_), num=self.num, den=self.den, **extra)

    @classmethod
    def load(cls, path: str | Path) -> InstanceContributions:
        with np.load(path, allow_pickle=False) as z:
            groups = z["groups"] if "groups" in z.files else None
            return cls([str(x) for x in z["names"]], z["num"], z["den"], groups)


def document_codes(groups: Sequence[str | None] | None, n: int) -> np.ndarray | None:
    """Each instance's document as an index (first appearance order) for :class:`InstanceContributions`; an
    instance without a document is a document of its own. None when the split has no documents."""
    if groups is None:
        return None
    if len(groups) != n:
        raise ValueError(f"{len(groups)} documents given for {n} instances")
    index: dict[Any, int] = {}
    codes = np.empty(n, dtype=np.int64)
    for i, g in enumerate(groups):
        codes[i] = index.setdefault(("doc", g) if g is not None else ("row", i), len(index))
    return codes


def contrib_path(run: str, split: str = "tst", ablation: bool = False, root: str | Path = EVALUATION_DIR,
                 group: str | None = None) -> Path:
    """Where the evaluate stage keeps a run's contributions: evaluation/{tst,val}/<run>.npz, or for the test
    split of an ablation or extra-seed run evaluation/{ablations,seeds}/<run>.npz (``group``)."""
    if split not in ("tst", "val"):
        raise ValueError(f"split must be tst or val, got {split!r}")
    group = group or ("ablations" if ablation else None)
    if group not in (None, "ablations", "seeds"):
        raise ValueError(f"group must be ablations or seeds, got {group!r}")
    return Path(root) / (group or split) / f"{run}.npz"


def bootstrap_settings(params: dict[str, Any]) -> dict[str, Any]:
    """params ``evaluate.bootstrap`` (n_resamples, seed, level) with the schema's defaults for what a partial
    params tree leaves out (one place for every stage)."""
    return filled(EvaluateConfig, params.get("evaluate"), "evaluate")["bootstrap"]


def _best_psp_weights(Y: sp.csr_matrix, inv_p: np.ndarray, k: int) -> np.ndarray:
    """(n, k): each row's positive weights sorted descending, zero-padded (PSP@k's best achievable)."""
    n = Y.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(Y.indptr))
    w = inv_p[Y.indices]
    order = np.lexsort((-w, rows))
    rank = np.arange(len(order), dtype=np.int64) - Y.indptr[rows[order]]
    keep = rank < k
    best = np.zeros((n, k))
    best[rows[order][keep], rank[keep]] = w[order][keep]
    return best


def instance_contributions(
    pred: TopK,
    Y: sp.csr_matrix,
    train_label_freq: np.ndarray,
    n_train: int,
    ks: tuple[int, ...] = (1, 3, 5),
    recall_ks: tuple[int, ...] = (10, 100),
    a: float = 0.55,
    b: float = 1.5,
    filt: sp.csr_matrix | None = None,
) -> InstanceContributions:
    """The per-instance terms of every metric ``evaluate_topk`` reports (same conventions, same filter)."""
    if pred.indices.shape[0] != Y.shape[0]:
        raise ValueError(f"predictions have {pred.indices.shape[0]} rows, truth has {Y.shape[0]}")
    max_k = max(max(ks), max(recall_ks))
    if pred.k < max_k:
        raise ValueError(f"predictions hold top-{pred.k}, metrics need top-{max_k}")
    idx, Y = _apply_filter(pred, Y.tocsr(), filt)
    n = Y.shape[0]
    npos = np.diff(Y.indptr)
    has = npos > 0
    hits = hit_matrix(idx, Y)
    inv_p = inverse_propensity(train_label_freq, n_train, a, b)
    wt_hits = hits * np.where(idx >= 0, inv_p[np.maximum(idx, 0)], 0.0)
    best = _best_psp_weights(Y, inv_p, max(ks))
    disc = 1.0 / np.log2(np.arange(2, max_k + 2))
    ones = np.ones(n)
    names: list[str] = []
    nums: list[np.ndarray] = []
    dens: list[np.ndarray] = []

    def add(name: str, num: np.ndarray, den: np.ndarray) -> None:
        names.append(name)
        nums.append(num)
        dens.append(den)

    for k in ks:
        add(f"P@{k}", hits[:, :k].sum(1) / k, ones)
        dcg = (hits[:, :k] * disc[:k]).sum(1)
        idcg = np.cumsum(disc[:k])[np.clip(np.minimum(npos, k) - 1, 0, None)]
        add(f"nDCG@{k}", np.where(has, dcg / idcg, 0.0), ones)
        add(f"PSP@{k}", wt_hits[:, :k].sum(1), best[:, :k].sum(1))
    safe_npos = np.maximum(npos, 1)
    for k in recall_ks:
        add(f"R@{k}", np.where(has, hits[:, :k].sum(1) / safe_npos, 0.0), has.astype(np.float64))
    # unseen-label micro recall: hits and positives among labels with no training occurrence
    k_rec = max(recall_ks)
    unseen = np.asarray(train_label_freq) == 0
    hit_unseen = (hits[:, :k_rec] * unseen[np.maximum(idx[:, :k_rec], 0)]).sum(1)
    rows = np.repeat(np.arange(n), npos)
    pos_unseen = np.bincount(rows, weights=unseen[Y.indices].astype(np.float64), minlength=n)
    add(f"unseen_R@{k_rec}", hit_unseen, pos_unseen)
    return InstanceContributions(names, np.vstack(nums), np.vstack(dens))


def _weight_blocks(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Resample counts in consecutive blocks of rows; the same stream whatever the block size."""
    rng = np.random.default_rng(seed)
    p = np.full(n, 1.0 / n) if n else np.ones(0)
    per = max(1, _BLOCK_ENTRIES // max(n, 1))
    for start in range(0, n_resamples, per):
        size = min(per, n_resamples - start)
        if n == 0:
            yield np.zeros((size, 0), dtype=np.int64)
        else:
            yield rng.multinomial(n, p, size=size)


def _float_blocks(n: int, n_resamples: int, seed: int) -> Iterable[np.ndarray]:
    """The blocks of :func:`_weight_blocks` as float64 (the dtype of the products). A draw small enough to keep
    (test split size x resamples up to ``_CACHED_ENTRIES``) is drawn once per process: a report resamples the same
    instances with the same seed for every paired comparison, and the multinomial draw is most of the cost."""
    if n * n_resamples <= _CACHED_ENTRIES:
        return _cached_float_blocks(n, n_resamples, seed)
    return (blk.astype(np.float64) for blk in _weight_blocks(n, n_resamples, seed))


@lru_cache(maxsize=2)
def _cached_float_blocks(n: int, n_resamples: int, seed: int) -> tuple[np.ndarray, ...]:
    blocks = tuple(blk.astype(np.float64) for blk in _weight_blocks(n, n_resamples, seed))
    for blk in blocks:
        blk.flags.writeable = False   # shared by every caller
    return blocks


def bootstrap_weights(n: int, n_resamples: int = 1000, seed: int = 0) -> np.ndarray:
    """(n_resamples, n) counts of each instance in each resample (instances drawn with replacement)."""
    return np.concatenate(list(_weight_blocks(n, n_resamples, seed)), axis=0)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(100.0 * num, den, out=np.zeros_like(num, dtype=np.float64), where=den > 0)


def _resampled(c: InstanceContributions, n_resamples: int, seed: int, rows: list[int], unit: str) -> np.ndarray:
    """(n_resamples, len(rows)) metric values over the resamples."""
    num, den, _ = c.resampling_units(unit)
    num, den = num[rows], den[rows]
    out = []
    for w in _float_blocks(num.shape[1], n_resamples, seed):
        out.append(_ratio(w @ num.T, w @ den.T))
    return np.concatenate(out, axis=0)


def _percentiles(x: np.ndarray, level: float) -> np.ndarray:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return np.percentile(x, [50 * (1 - level), 50 * (1 + level)], axis=0)


def bootstrap_intervals(
    c: InstanceContributions, n_resamples: int = 1000, seed: int = 0, level: float = 0.95, unit: str = "documents"
) -> dict[str, list[float]]:
    """Percentile bootstrap interval [lo, hi] (percent, 2 decimals) of every metric in ``c``, resampling ``unit``
    (documents where ``c`` has them)."""
    stats = _resampled(c, n_resamples, seed, list(range(len(c.names))), unit)
    lo, hi = _percentiles(stats, level)
    return {m: [round(float(lo[j]), 2), round(float(hi[j]), 2)] for j, m in enumerate(c.names)}


def seed_bootstrap_intervals(
    runs: Sequence[InstanceContributions], n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
    unit: str = "documents",
) -> dict[str, list[float]]:
    """Interval of every metric of *a run* of a method trained with a random seed: each resample draws one of
    ``runs`` (the method's training seeds, evaluated on the same instances) and resamples ``unit`` of it, so the
    interval holds the seed spread as well as the data's. One run gives :func:`bootstrap_intervals`."""
    if not runs:
        raise ValueError("no runs to resample")
    first = runs[0]
    for r in runs[1:]:
        if r.n != first.n or r.names != first.names:
            raise ValueError(f"seed runs must be evaluated on the same instances and metrics: {r.n} vs {first.n}")
    units = [r.resampling_units(unit)[:2] for r in runs]
    which = np.random.default_rng([seed, 7919]).integers(0, len(runs), size=n_resamples)
    stats = np.empty((n_resamples, len(first.names)))
    start = 0
    for w in _float_blocks(units[0][0].shape[1], n_resamples, seed):
        pick = which[start:start + w.shape[0]]
        for k, (num, den) in enumerate(units):
            rows = np.flatnonzero(pick == k)
            if len(rows):
                stats[start + rows] = _ratio(w[rows] @ num.T, w[rows] @ den.T)
        start += w.shape[0]
    lo, hi = _percentiles(stats, level)
    return {m: [round(float(lo[j]), 2), round(float(hi[j]), 2)] for j, m in enumerate(first.names)}


def paired_bootstrap(
    a: InstanceContributions,
    b: InstanceContributions,
    metric: str,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    unit: str = "documents",
) -> dict[str, Any]:
    """Difference a - b of ``metric`` on the same instances, its interval and two-sided p-value.

    Both methods are resampled with the same weights, so instance difficulty cancels out. The
    p-value is that of the centred bootstrap: how often a resampled difference strays from the
    observed one by at least the observed distance from zero. ``unit``: what is drawn (documents where
    both sides have the same ones, else instances).
    """
    if a.n != b.n:
        raise ValueError(f"paired bootstrap needs the same instances: a has {a.n}, b has {b.n}")
    if (unit == "documents" and a.groups is not None and b.groups is not None
            and not np.array_equal(a.groups, b.groups)):
        raise ValueError("paired bootstrap needs the same documents on both sides (one evaluation is stale?)")
    if a.groups is None or b.groups is None:
        unit = "instances"   # documents only where both sides know them (an evaluation written before they were kept)
    ja, jb = a.row(metric), b.row(metric)
    va, vb = a.values()[metric], b.values()[metric]
    d_hat = va - vb
    (na, da, used), (nb, db, _) = a.resampling_units(unit), b.resampling_units(unit)
    diffs = []
    for w in _float_blocks(na.shape[1], n_resamples, seed):
        diffs.append(_ratio(w @ na[ja], w @ da[ja]) - _ratio(w @ nb[jb], w @ db[jb]))
    d = np.concatenate(diffs)
    lo, hi = _percentiles(d, level)
    p = (1 + int(np.count_nonzero(np.abs(d - d_hat) >= abs(d_hat)))) / (n_resamples + 1)
    return {"metric": metric, "a": round(va, 4), "b": round(vb, 4), "diff": round(d_hat, 4),
            "ci95": [round(float(lo), 2), round(float(hi), 2)], "p_value": float(p),
            "n": a.n, "unit": used, "n_units": int(na.shape[1]), "n_resamples": int(n_resamples),
            "seed": int(seed), "level": float(level)}


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of one family of tests (same order as given): a test is significant
    at alpha after correction iff its adjusted p < alpha; the family-wise error rate is then at most alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(np.argsort(p, kind="stable")):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        adj[i] = running
    return adj.tolist()


def verdict(p_value: float, diff: float, alpha: float = 0.05) -> str:
    """"A better" / "B better" when the difference is significant at ``alpha``, else "tie"."""
    if p_value >= alpha or diff == 0:
        return "tie"
    return "A better" if diff > 0 else "B better"


def paired_over_seeds(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Difference a - b of one metric over training seeds: ``a[i]`` and ``b[i]`` are two settings' figures on the
    same evaluation instances, both trained from seed i. The mean of the per-seed differences, its t-interval and
    the paired t-test's two-sided p. Unlike :func:`paired_bootstrap`, which holds one trained model per side fixed,
    this includes what retraining from another seed moves, so a difference smaller than the seed noise is a tie
    here and a small but consistent one is not."""
    from scipy import stats   # imported here: about 0.6 s, which only the seed studies use (not evaluate or serve)

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired over seeds needs one figure per seed on both sides: {x.shape} against {y.shape}")
    n = len(x)
    if n < 2:
        raise ValueError(f"paired over seeds needs at least 2 seeds, got {n}")
    d = x - y
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / float(np.sqrt(n))
    p = float(stats.ttest_rel(x, y).pvalue) if sd > 0 else (1.0 if d.mean() == 0 else 0.0)
    return {"a_mean": round(float(x.mean()), 4), "b_mean": round(float(y.mean()), 4),
            "a_sd": round(float(x.std(ddof=1)), 4), "b_sd": round(float(y.std(ddof=1)), 4),
            "diff": round(float(d.mean()), 4), "ci95": [round(float(d.mean()) - half, 2), round(float(d.mean()) + half, 2)],
            "p_value": p, "n_seeds": n, "a_at_least_b": int((d >= 0).sum()), "level": float(level)}


def split_fingerprint(Y: sp.spmatrix) -> str:
    """A short hash of a split's label matrix (shape and nonzero pattern): which instances and labels a study was
    measured on, so a decision read from a stored study is refused for another dataset or split."""
    Y = sp.csr_matrix(Y)
    Y.sort_indices()
    h = hashlib.sha256(np.asarray(Y.shape, np.int64).tobytes())
    h.update(np.asarray(Y.indptr, np.int64).tobytes())
    h.update(np.asarray(Y.indices, np.int64).tobytes())
    return h.hexdigest()[:16]
