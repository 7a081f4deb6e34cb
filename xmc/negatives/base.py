"""The sampler interface the trainer uses, and the pieces samplers share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from xmc.metrics import inverse_propensity


@dataclass(frozen=True)
class StepPlan:
    """What the trainer will run: the batch size and seed its :meth:`NegativeSampler.query_batches` are drawn with,
    the steps of an epoch (after any cap) and the epochs. A sampler that mines for future steps reads it to mine only
    the queries those steps draw."""

    batch_size: int
    seed: int
    steps_per_epoch: int
    epochs: int


@dataclass
class CandidateBatch:
    """Queries of one step and the labels they are scored against.

    ``label_ids`` None means every label (the trainer then uses gradient caching).
    ``positives[b, c]`` is True when candidate c is a true label of query b: every true
    label that falls in the pool is a positive, never a negative.
    """

    query_idx: np.ndarray
    label_ids: np.ndarray | None
    positives: torch.Tensor
    valid: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # method-specific (anchors, pseudo labels, ...)


def positives_mask(Y: sp.csr_matrix, query_idx: np.ndarray, label_ids: np.ndarray | None) -> torch.Tensor:
    """``[b, c]`` True where label ``label_ids[c]`` (label c when None) is a true label of query ``query_idx[b]``.

    With strictly increasing ``label_ids`` (a pool from ``np.unique``) the queries' nonzeros are looked up in
    them by binary search instead of slicing the label columns out of the sparse rows (scipy's column fancy
    indexing, about as slow as the rest of a bag-of-words step's batch making)."""
    rows = Y[query_idx]
    if label_ids is None:
        return torch.from_numpy(rows.toarray() > 0)
    label_ids = np.asarray(label_ids)
    if len(label_ids) > 1 and not bool((label_ids[1:] > label_ids[:-1]).all()):
        return torch.from_numpy(rows[:, label_ids].toarray() > 0)
    rows.sum_duplicates()   # toarray() sums repeated entries: the same, before asking "> 0"
    out = np.zeros((len(query_idx), len(label_ids)), dtype=bool)
    keep = rows.data > 0
    r = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))[keep]
    c = rows.indices[keep]
    at = np.searchsorted(label_ids, c)
    hit = at < len(label_ids)
    hit[hit] = label_ids[at[hit]] == c[hit]
    out[r[hit], at[hit]] = True
    return torch.from_numpy(out)


def sample_positives_per_query(Y: sp.csr_matrix, query_idx: np.ndarray, max_per_query: int,
                               rng: np.random.Generator, label_weights: np.ndarray | None = None) -> list[np.ndarray]:
    """Up to ``max_per_query`` positives of each query (0 = all of them), uniformly or, with
    ``label_weights``, with probability proportional to each positive's weight."""
    out = []
    for q in query_idx:
        pos = Y.indices[Y.indptr[q] : Y.indptr[q + 1]]
        if max_per_query and len(pos) > max_per_query:
            p = None
            if label_weights is not None:
                w = label_weights[pos]
                p = w / w.sum()
            pos = rng.choice(pos, max_per_query, replace=False, p=p)
        out.append(pos)
    return out


def draw_from_rows(table: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``k`` distinct entries of each row of ``table`` (-1 pads are not entries), drawn uniformly without
    replacement for all rows at once, back to back in row order.

    The ``k`` smallest of independent uniform keys over a row's entries are a uniform ``k``-subset of them; one
    draw and one partial sort for the whole batch replace a ``Generator.choice`` per row (several milliseconds
    of a bag-of-words step at 256 queries)."""
    if k <= 0 or table.size == 0:
        return np.zeros(0, np.int64)
    picked = table                 # k at least a row's width: every entry
    if k < table.shape[1]:
        keys = rng.random(table.shape)
        keys[table < 0] = 2.0      # above every entry's key: a pad is picked only where a row has fewer than k
        picked = np.take_along_axis(table, np.argpartition(keys, k - 1, axis=1)[:, :k], axis=1)
    return picked[picked >= 0].astype(np.int64)


def positive_sampling_weights(Y: sp.csr_matrix, kind: str, a: float = 0.55, b: float = 1.5) -> np.ndarray | None:
    """Per-label weights for picking a query's positives: None (uniform) or inverse propensity.

    Inverse propensity (Jain et al., 2016) picks a tail positive of a query several times more
    often than a head one, so a one-positive-per-step budget is not spent mostly on head labels
    (which the in-batch pool already supplies as negatives to everyone else).
    """
    if kind == "uniform":
        return None
    if kind != "inverse_propensity":
        raise ValueError(f"positive_sampling must be 'uniform' or 'inverse_propensity', not {kind!r}")

    freq = np.asarray(Y.sum(axis=0)).ravel()
    return inverse_propensity(freq, Y.shape[0], a, b)


def pool_batch(Y: sp.csr_matrix, query_idx: np.ndarray, sampled: list[np.ndarray], extra: list[np.ndarray],
               unsampled_positives: str) -> CandidateBatch:
    """The pool = sampled positives + extra labels; the targets of each query in it.

    ``unsampled_positives`` says what a true label of a query is when it lands in the pool without
    having been sampled for that query: ``"positive"`` (every in-pool true label is a positive) or
    ``"mask"`` (left out of that query's loss, neither positive nor negative, as the DEXML code does
    when it samples positives: otherwise frequent labels collect a positive term from every query
    they belong to and the model drifts to the head). A true label is never a negative.
    """
    if not (sampled or extra):
        pool, inv = np.zeros(0, np.int64), np.zeros(0, np.int64)
    else:
        pool, inv = np.unique(np.concatenate(sampled + extra), return_inverse=True)
    truth = positives_mask(Y, query_idx, pool)
    if unsampled_positives == "positive":
        return CandidateBatch(query_idx, pool, truth)
    if unsampled_positives != "mask":
        raise ValueError(f"unsampled_positives must be 'positive' or 'mask', not {unsampled_positives!r}")
    # query b's sampled positives are the first entries of the concatenation: their pool columns are ``inv``'s
    n_sampled = np.fromiter((len(p) for p in sampled), dtype=np.int64, count=len(sampled))
    chosen = np.zeros(tuple(truth.shape), dtype=bool)
    chosen[np.repeat(np.arange(len(sampled)), n_sampled), inv[: int(n_sampled.sum())]] = True
    chosen = torch.from_numpy(chosen)
    return CandidateBatch(query_idx, pool, chosen, valid=~(truth & ~chosen))


class NegativeSampler:
    """Base: random query batches; subclasses choose the candidate pool."""

    def __init__(self, Y: sp.csr_matrix, max_positives_per_query: int = 0, unsampled_positives: str = "mask",
                 positive_sampling: str = "uniform", propensity_a: float = 0.55, propensity_b: float = 1.5) -> None:
        self.Y = Y.tocsr()
        self.max_positives_per_query = max_positives_per_query
        self.unsampled_positives = unsampled_positives
        self.positive_weights = positive_sampling_weights(self.Y, positive_sampling, propensity_a, propensity_b)
        # name-match negatives (set by :func:`xmc.negatives.samplers.build_sampler`): a fixed per-query shortlist
        self.name_shortlist: np.ndarray | None = None
        self.name_per_query = 0
        self.plan: StepPlan | None = None

    def bind_plan(self, plan: StepPlan) -> None:
        """Called by the trainer before the first epoch (see :class:`StepPlan`)."""
        self.plan = plan

    def name_match_negatives(self, query_idx: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        """Up to ``name_per_query`` labels per query drawn from its name-match shortlist (none when unset)."""
        if self.name_shortlist is None or self.name_per_query <= 0:
            return []
        return [draw_from_rows(self.name_shortlist[query_idx], self.name_per_query, rng)]

    def sample_positives(self, query_idx: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        return sample_positives_per_query(self.Y, query_idx, self.max_positives_per_query, rng, self.positive_weights)

    @property
    def n_labels(self) -> int:
        return self.Y.shape[1]

    def query_batches(self, epoch: int, batch_size: int, seed: int) -> list[np.ndarray]:
        """Deterministic per (seed, epoch), so a resumed epoch replays the same batches.

        Queries without any positive are skipped (nothing to learn from them).
        """
        rng = np.random.default_rng([seed, epoch])
        has = np.flatnonzero(np.diff(self.Y.indptr) > 0)
        perm = rng.permutation(has)
        return [perm[s : s + batch_size] for s in range(0, len(perm), batch_size)]

    def on_epoch_start(self, epoch: int, model: Any, query_texts: list[str]) -> None:
        """Hook for samplers that refresh state from the current model (e.g. an ANN shortlist)."""

    def on_step_start(self, step: int, model: Any, query_texts: list[str]) -> None:
        """Hook for samplers whose state moves with steps (e.g. MACLR's re-clustering every T steps)."""

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:  # pragma: no cover
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
