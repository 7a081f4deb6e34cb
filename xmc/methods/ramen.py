"""RAMEN (Mittal et al., 2024): graph metadata as a training-time regulariser of a dual encoder.

Objective on one batch (paper §3, our notation):

    L_task(q, z) + sum over anchor sets t of ( lambda_x * R_x^t + lambda_z * R_z^t )

* L_task: the dual encoder's loss on the sampler's label pool (DecoupledSoftmax by default, the
  triplet hinge with margin 0.3 of the paper via ``loss.name: triplet``).
* R_x^t: each batch query with an edge in set t brings one of its anchors (sampled uniformly); the
  anchors the other rows brought are its negatives, except anchors it is linked to (e_in = 0).
  Triplet hinge [s(x, a_n) - s(x, a_p) + margin]_+ averaged over a row's negatives (or an InfoNCE
  over the same pool, ``regulariser.loss: softmax``).
* R_z^t: the same for labels: up to ``label_rows`` pool labels with an edge in set t, plus
  ``extra_labels`` labels drawn uniformly from those with edges (so labels without training points, which never enter a
  pool as positives, are regularised too; a documented addition to the paper's sampling).

Pruning (paper App. A): after ``warmup_epochs`` epochs on the unpruned (random-walk augmented)
graph, every edge whose cosine under the current encoder is <= ``threshold`` is dropped; repeated
every ``every_epochs`` epochs, always from the augmented graph. Inference is a plain dual encoder:
the saved folder is an ordinary encoder that ``stages.predict`` indexes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from xmc.data.columns import take_texts
from xmc.data.dataset import XMCDataset
from xmc.encoders.build import build_encoder
from xmc.errors import ConfigError
from xmc.graph.format import AnchorSet, discover_sets, load_graph_dir
from xmc.graph.rwr import prune_edges
from xmc.losses import build_loss
from xmc.methods.trainer_method import TrainerMethod, TrainingParts
from xmc.models.dual_encoder import DualEncoderModel
from xmc.negatives import build_sampler
from xmc.negatives.base import CandidateBatch, NegativeSampler, StepPlan
from xmc.trainer.objective import Objective
from xmc.trainer.objective import counted_rows

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# the regulariser
def anchor_regulariser(node_vecs: torch.Tensor, anchor_vecs: torch.Tensor, pos_col: torch.Tensor,
                       valid: torch.Tensor, kind: str = "triplet", margin: float = 0.3,
                       temperature: float = 0.05) -> torch.Tensor:
    """R over one in-batch anchor pool.

    ``node_vecs`` (R x d), ``anchor_vecs`` (P x d), ``pos_col[r]`` = column of row r's positive
    anchor, ``valid[r, c]`` False where anchor c must not be a negative of row r (its own positive
    and every other anchor the row is linked to). Rows without any negative contribute nothing.

    triplet: mean over rows of  mean_{n valid} [ s(r, n) - s(r, p) + margin ]_+
    softmax: mean over rows of  -log softmax over {p} + valid negatives of s / temperature
    """
    s = (node_vecs.float() @ anchor_vecs.float().T)
    R = s.shape[0]
    if R == 0:
        return s.sum() * 0.0
    rows = torch.arange(R, device=s.device)
    neg = valid.clone()
    neg[rows, pos_col] = False
    has = neg.any(1)
    if not bool(has.any()):
        return s.sum() * 0.0
    sp_ = s[rows, pos_col]
    if kind == "triplet":
        h = torch.relu(s - sp_[:, None] + margin) * neg
        per_row = h.sum(1) / neg.sum(1).clamp(min=1)
    elif kind == "softmax":
        logits = (s / temperature).masked_fill(~neg, float("-inf"))
        logits[rows, pos_col] = sp_ / temperature
        per_row = -(sp_ / temperature - torch.logsumexp(logits, dim=1))
    else:
        raise ConfigError(f"regulariser loss must be 'triplet' or 'softmax', not {kind!r}")
    return per_row[has].mean()


class TripletLoss(nn.Module):
    """The paper's task loss: [s(x, z_n) - s(x, z_p) + margin]_+ averaged over (p, n) pairs per query.

    The hinge is taken against each row's positives only (padded to the most any row has), so a step holds
    b x P x pool values, not b x pool x pool: at the GPU profile's batch of 1,024 and ~3,300 pooled labels the
    latter is ~45 GB per intermediate."""

    def __init__(self, margin: float = 0.3) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        pos = positives.bool()
        neg = ~pos if valid is None else (~pos & valid.bool())
        n_pos = pos.sum(1)
        P = int(n_pos.max()) if pos.numel() else 0
        if P == 0:
            return scores.sum() * 0.0
        # each row's positive columns first (stable: in column order), then the rest; keep the first P
        cols = torch.argsort(pos.to(torch.int8), dim=1, descending=True, stable=True)[:, :P]
        real = torch.arange(P, device=scores.device)[None, :] < n_pos[:, None]          # [b, P]
        sp_ = scores.gather(1, cols)                                                   # [b, P]
        h = torch.relu(scores[:, None, :] - sp_[:, :, None] + self.margin)             # [b, P, n]
        m = real[:, :, None] & neg[:, None, :]
        per = (h * m).sum((1, 2)) / m.sum((1, 2)).clamp(min=1)
        keep = m.any(2).any(1)
        return per[keep].mean() if bool(keep.any()) else scores.sum() * 0.0

    @staticmethod
    def counted_rows(positives: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The rows the loss averages over (a data-parallel rank's share): those with a positive and a negative."""
        pos = positives.bool()
        neg = ~pos if valid is None else (~pos & valid.bool())
        return pos.any(1) & neg.any(1)


# ---------------------------------------------------------------------------------------------
# the sampler
class GraphAnchorSampler(NegativeSampler):
    """Wraps a label sampler (hard negatives, in-batch, ...) and adds anchors per (set, side) to
    ``CandidateBatch.extras["anchors"]``; prunes the graphs with the current encoder on schedule."""

    def __init__(self, base: NegativeSampler, sets: dict[str, AnchorSet], n_labels: int,
                 use_query_graph: bool = True, use_label_graph: bool = True, label_rows: int = 0, extra_labels: int = 0,
                 prune: bool = True, threshold: float = 0.0, warmup_epochs: int = 10, every_epochs: int = 5,
                 encode_batch_size: int = 256) -> None:
        self.base = base
        self.Y = base.Y
        self.sets = sets
        self.n_all_labels = n_labels
        self.sides = [s for s, on in (("query", use_query_graph), ("label", use_label_graph)) if on]
        self.full: dict[tuple[str, str], sp.csr_matrix] = {
            (name, side): (a.edges[side] > 0).astype(np.float32).tocsr()
            for name, a in sets.items() for side in self.sides if side in a.edges}
        self.active: dict[tuple[str, str], sp.csr_matrix] = dict(self.full)
        self.label_rows, self.extra_labels = label_rows, extra_labels
        self.prune, self.threshold = prune, threshold
        if every_epochs < 1:
            raise ConfigError("pruning.every_epochs must be >= 1")
        self.warmup_epochs, self.every_epochs = warmup_epochs, every_epochs
        self.encode_batch_size = encode_batch_size
        self.pruned_at: list[int] = []
        self.prune_log: list[dict[str, Any]] = []
        self._refresh_label_pool()

    def _refresh_label_pool(self) -> None:
        has = np.zeros(self.n_all_labels, bool)
        for (name, side), E in self.active.items():
            if side == "label":
                has |= E.getnnz(1) > 0
        self.labels_with_edges = np.flatnonzero(has)

    # -- delegation to the label sampler
    def query_batches(self, epoch: int, batch_size: int, seed: int) -> list[np.ndarray]:
        return self.base.query_batches(epoch, batch_size, seed)

    def bind_plan(self, plan: StepPlan) -> None:
        super().bind_plan(plan)
        self.base.bind_plan(plan)

    def on_step_start(self, step: int, model: Any, query_texts: list[str]) -> None:
        self.base.on_step_start(step, model, query_texts)

    def prune_due(self, epoch: int) -> bool:
        return (self.prune and epoch >= self.warmup_epochs
                and (epoch - self.warmup_epochs) % self.every_epochs == 0)

    def on_epoch_start(self, epoch: int, model: Any, query_texts: list[str]) -> None:
        self.base.on_epoch_start(epoch, model, query_texts)
        if self.prune_due(epoch) and epoch not in self.pruned_at:
            self.prune_with(model, query_texts, epoch)

    @torch.no_grad()
    def prune_with(self, model: Any, query_texts: Sequence[str], epoch: int) -> None:
        """Keep the augmented graph's edges with cosine > threshold under the current encoder."""
        t0 = time.perf_counter()
        enc = model.encoder
        entry: dict[str, Any] = {"epoch": epoch}
        for (name, side), E in self.full.items():
            aset = self.sets[name]
            node_texts = query_texts if side == "query" else model.label_texts
            rows = np.flatnonzero(E.getnnz(1) > 0)
            cols = np.flatnonzero(E.getnnz(0) > 0)
            # only nodes and anchors that have edges are embedded (matters for transformer encoders)
            nv = np.zeros((E.shape[0], enc.dim), np.float32)
            av = np.zeros((E.shape[1], enc.dim), np.float32)
            nv[rows] = enc.encode([node_texts[i] for i in rows], side, self.encode_batch_size)
            av[cols] = enc.encode([aset.anchor_texts[j] for j in cols], side, self.encode_batch_size)
            kept = prune_edges(E, nv, av, self.threshold)
            self.active[(name, side)] = kept
            entry[f"{name}/{side}"] = {"edges": int(E.nnz), "kept": int(kept.nnz),
                                       "kept_share": round(kept.nnz / max(1, E.nnz), 4)}
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        self.pruned_at.append(epoch)
        self.prune_log.append(entry)
        self._refresh_label_pool()
        log.info("graphs pruned at epoch %d: %s", epoch, entry)

    def _anchor_block(self, name: str, side: str, node_ids: np.ndarray, rng: np.random.Generator) -> dict | None:
        E, F_ = self.active[(name, side)], self.full[(name, side)]
        rows, picks = [], []
        for r, node in enumerate(node_ids):
            lo, hi = E.indptr[node], E.indptr[node + 1]
            if hi > lo:
                rows.append(r)
                picks.append(int(E.indices[lo + rng.integers(hi - lo)]))
        if not rows:
            return None
        pool, pos_col = np.unique(np.asarray(picks), return_inverse=True)
        # any edge of the unpruned graph is never a negative (a pruned edge is unsure, not false)
        linked = F_[node_ids[rows]][:, pool].toarray() > 0
        valid = ~linked
        valid[np.arange(len(rows)), pos_col] = True
        return {"set": name, "side": side, "rows": np.asarray(rows), "anchor_ids": pool,
                "pos_col": torch.from_numpy(pos_col.astype(np.int64)), "valid": torch.from_numpy(valid)}

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        batch = self.base.make_batch(query_idx, rng)
        if not self.active:
            return batch
        pool = batch.label_ids if batch.label_ids is not None else np.zeros(0, np.int64)
        extra = np.zeros(0, np.int64)
        label_rows = np.zeros(0, np.int64)
        if "label" in self.sides:
            # R_z rows: up to `label_rows` pool labels with edges (paper: the batch's chosen labels) ...
            in_pool = pool[np.isin(pool, self.labels_with_edges)]
            if self.label_rows and len(in_pool) > self.label_rows:
                in_pool = np.sort(rng.choice(in_pool, self.label_rows, replace=False))
            # ... plus `extra_labels` random labels with edges, which are encoded only for R_z
            if self.extra_labels and len(self.labels_with_edges):
                cand = rng.choice(self.labels_with_edges, min(self.extra_labels, len(self.labels_with_edges)),
                                  replace=False)
                extra = np.setdiff1d(cand, pool)
            label_rows = np.concatenate([in_pool, extra]).astype(np.int64)
        blocks = []
        for (name, side) in self.active:
            ids = np.asarray(query_idx) if side == "query" else label_rows
            blk = self._anchor_block(name, side, ids, rng)
            if blk is not None:
                blk["node_ids"] = ids[blk["rows"]]  # query rows / label ids of the block's rows
                blocks.append(blk)
        batch.extras["extra_label_ids"] = extra
        batch.extras["anchors"] = blocks
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base.state_dict(), "active": {f"{k[0]}|{k[1]}": v for k, v in self.active.items()},
                "pruned_at": list(self.pruned_at), "prune_log": list(self.prune_log)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state.get("base", {}))
        for k, v in (state.get("active") or {}).items():
            name, side = k.split("|")
            if (name, side) in self.active:
                self.active[(name, side)] = v
        self.pruned_at = list(state.get("pruned_at", []))
        self.prune_log = list(state.get("prune_log", []))
        self._refresh_label_pool()


# ---------------------------------------------------------------------------------------------
# the objective
class RamenObjective(Objective):
    """Task loss on the label pool + lambda_x * R_x + lambda_z * R_z over every anchor block. Across ranks the task
    loss is split by the batch's rows; the regularisers (anchor blocks of a few rows each) are computed whole on
    every rank, each rank's share 1 / world of them."""

    shards_rows = True

    def __init__(self, loss: nn.Module, sets: dict[str, AnchorSet], lambda_x: float = 1.0, lambda_z: float = 1.0,
                 reg_loss: str = "triplet", margin: float = 0.3, temperature: float = 0.05) -> None:
        super().__init__()
        self.loss = loss
        self.anchor_texts = {n: a.anchor_texts for n, a in sets.items()}
        self.lambdas = {"query": float(lambda_x), "label": float(lambda_z)}
        self.reg_loss, self.margin, self.temperature = reg_loss, float(margin), float(temperature)

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        texts = take_texts(query_texts, batch.query_idx)
        extra = batch.extras.get("extra_label_ids", np.zeros(0, np.int64))
        n_pool = len(batch.label_ids)
        all_labels = np.concatenate([batch.label_ids, extra]).astype(np.int64)
        q, z_all = model.pair_vectors(texts, all_labels)
        order = np.argsort(all_labels, kind="stable")
        pos, valid, weights = self.targets(batch, q.device)
        rows = self.rows(len(q))
        task = self.share(self.loss, counted_rows(self.loss, pos, valid), rows, (q[rows] @ z_all[:n_pool].T).float(),
                          pos, valid, weights)
        total = task
        parts = {"task": float(task.detach())}
        for blk in batch.extras.get("anchors", []):
            lam = self.lambdas[blk["side"]]
            if lam == 0.0:
                continue
            a = model.encoder([self.anchor_texts[blk["set"]][j] for j in blk["anchor_ids"]], blk["side"])
            if blk["side"] == "query":
                nodes = q[torch.from_numpy(blk["rows"]).to(q.device)]
            else:  # label ids -> their columns among the encoded labels (pool, then extras)
                col = np.searchsorted(all_labels[order], blk["node_ids"])
                nodes = z_all[torch.from_numpy(order[col]).to(q.device)]
            r = anchor_regulariser(nodes, a, blk["pos_col"].to(q.device), blk["valid"].to(q.device),
                                   self.reg_loss, self.margin, self.temperature)
            total = total + lam * self.replicated(r)
            parts[f"R_{blk['side'][0]}_{blk['set']}"] = float(r.detach())
        self.last_parts = parts
        return total


# ---------------------------------------------------------------------------------------------
def build_task_loss(cfg: dict[str, Any]) -> nn.Module:
    if cfg["name"] == "triplet":
        return TripletLoss(**({"margin": float(cfg["margin"])} if cfg.get("margin") is not None else {}))
    return build_loss(cfg["name"], **{k: v for k, v in cfg.items() if k != "name"})


def check_regularisers(run: str, reg: dict[str, Any], sets: dict[str, AnchorSet], graph_dir: Path) -> None:
    """RAMEN trains with a regulariser that has edges, or it is refused: with none it would be DEXML under another
    name. ``regulariser.sets: []`` alone asks for the no-graph baseline (the ablation), and says so."""
    if not reg["sets"]:
        log.info("%s: regulariser.sets is []: the no-graph baseline (a plain dual encoder)", run)
        return
    wanted = {side for side, on, lam in (("label", reg["label_graph"], reg["lambda_z"]),
                                          ("query", reg["query_graph"], reg["lambda_x"])) if on and lam > 0}
    present = {side for n in reg["sets"] if n in sets for side, E in sets[n].edges.items() if E.nnz}
    if not wanted & present:
        have = ", ".join(f"{n} ({'/'.join(sets[n].edges)})" for n in sets) or "none"
        raise ConfigError(f"{run}: no RAMEN regulariser that is on has graph edges (on: "
                          f"{', '.join(sorted(wanted)) or 'none'}; anchor sets in {graph_dir}: {have}): it would train "
                          f"as a plain dual encoder. Give the dataset a label graph (label_graph.tsv) or document ids, "
                          f"switch on regulariser.query_graph, or set regulariser.sets: [] for the no-graph baseline")
    missing = [n for n in reg["sets"] if n not in sets]
    if missing:
        # a dataset has the inputs of some sets only (WordNet senses: wordnet; catalogue items: relations; other
        # multi-label data: cooccurrence): the graph stage skipped the others. A warning only where a regulariser that
        # is on is left with no edges.
        report = log.warning if wanted - present else log.info
        report("%s: graph sets %s are not in %s (the dataset lacks their inputs): regularising with %s", run,
               ", ".join(missing), graph_dir, ", ".join(n for n in reg["sets"] if n in sets))


class RAMENMethod(TrainerMethod):
    """A dual encoder with graph regularisers on the one trainer (or, with no sets / both graphs off, its
    no-graph baseline). The saved model is a plain encoder folder: no graph at inference."""

    name = "ramen"
    features = ("graph",)

    def build(self, ctx: Any, ds: XMCDataset) -> TrainingParts:
        cfg = ctx.config
        reg, pr = cfg["regulariser"], cfg["pruning"]
        graph_dir = ctx.ws.anchor_sets
        sets = load_graph_dir(graph_dir, len(ds.trn), ds.n_labels) \
            if reg["sets"] and not (graph_dir.is_dir() and not discover_sets(graph_dir)) else {}
        check_regularisers(ctx.run.name, reg, sets, graph_dir)
        if cfg["negatives"]["kind"] == "all":
            raise ConfigError("ramen: negatives.kind 'all' is not supported (R_z needs an explicit label pool)")
        use_sets = {n: sets[n] for n in reg["sets"] if n in sets}
        encoder = build_encoder(cfg["encoder"])
        model = DualEncoderModel(encoder, ds.label_texts)
        base = build_sampler(ds.trn.Y, cfg["negatives"], ds.trn.texts, ds.label_texts, ctx.params["label_names"])
        sampler = GraphAnchorSampler(
            base, use_sets, ds.n_labels, use_query_graph=reg["query_graph"] and reg["lambda_x"] > 0,
            use_label_graph=reg["label_graph"] and reg["lambda_z"] > 0, label_rows=reg["label_rows"],
            extra_labels=reg["extra_labels"], prune=pr["enabled"], threshold=pr["threshold"],
            warmup_epochs=pr["warmup_epochs"], every_epochs=pr["every_epochs"])
        objective = RamenObjective(build_task_loss(cfg["loss"]), use_sets, reg["lambda_x"], reg["lambda_z"], reg["loss"],
                                   reg["margin"], reg["temperature"])
        graph_fp = {f"{n}/{s}": int(E.nnz) for (n, s), E in sampler.full.items()}

        def after_fit(history: dict[str, Any]) -> dict[str, Any]:
            return {"graphs": graph_fp, "pruned_at_epochs": sampler.pruned_at, "prune_log": sampler.prune_log,
                    "refresh_seconds": [round(s, 2) for s in getattr(base, "refresh_seconds", [])],
                    "refreshed_at_epochs": list(getattr(base, "refreshed_at", [])),
                    "mined_queries": list(getattr(base, "mined_rows", []))}

        return TrainingParts(model, sampler, objective,
                             fingerprint={k: cfg[k] for k in ("encoder", "loss", "negatives", "regulariser", "pruning")}
                             | {"data": ds.meta.get("content_sha256"), "graph": graph_fp},
                             save=encoder.save, after_fit=after_fit)
