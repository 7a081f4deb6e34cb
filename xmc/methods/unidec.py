"""UniDEC (Kharbanda et al., WWW'25): a dual-encoder head and a classifier head on one encoder,
trained together on pick-some-labels (PSL) batches.

* :class:`UniDECModel` - shared encoder Φ; DE head Φ_D = N(g1(Φ)), g1 = Linear, Tanh, Dropout;
  CLF head Φ_C = g2(Φ), g2 = Linear, Dropout (unnormalised); a per-label classifier table Ψ (L x d).
  Scores: DE <Φ_D(x), Φ_D(z_l)>, CLF <Φ_C(x), Ψ_l>. Inference searches one index over
  [Φ_D(z_l) ⊕ N(Ψ_l)] with [Φ_D(x) ⊕ N(Φ_C(x))], so a hit's score is cos_DE + cos_CLF.
* :class:`PickSomeLabelsSampler` - query batches made of k-means clusters of the DE query
  embeddings; per query ≤ β sampled positives and η hard negatives from an ANN shortlist
  (both refreshed every τ epochs); pool = union; in-batch positives = every true label in the pool.
* :class:`UniDECObjective` - DecoupledSoftmax on both heads, both directions (q→l, l→q),
  λ-weighted, plus the optional auxiliary BCE on the classifier head over the pool.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from xmc.ann import ANNIndex
from xmc.config.schema import PickSomeLabels, UnidecLoss, UnidecModel, filled
from xmc.data.columns import take_texts
from xmc.encoders.base import TextEncoder
from xmc.encoders.build import build_encoder, load_encoder
from xmc.errors import ConfigError
from xmc.io import load_tensors
from xmc.losses import DecoupledSoftmaxLoss
from xmc.negatives.base import CandidateBatch, draw_from_rows, pool_batch
from xmc.negatives.samplers import HardNegativeShortlist
from xmc.methods.trainer_method import TrainerMethod, TrainingParts
from xmc.models.unidec import DESCRIPTION, ENCODER, HEADS, SPACES, UniDECHeads, check_space, read_description
from xmc.trainer.label_table import LabelTable
from xmc.trainer.objective import Objective, counted_rows

log = logging.getLogger(__name__)



# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------
class UniDECModel(UniDECHeads):
    """Shared encoder + DE head (g1) + CLF head (g2) (:class:`~xmc.models.unidec.UniDECHeads`) + the trainable
    classifier table Ψ.

    ``space`` chooses what :meth:`all_label_vectors` / :meth:`query_vectors_np` return (the
    generic evaluator and hard-negative miner call those): ``concat`` (UniDEC), ``de`` or ``clf``.
    """

    def __init__(self, encoder: TextEncoder, label_texts: Sequence[str], dim: int = 256, dropout: float = 0.1,
                 space: str = "concat", dropout_clf: float | None = None, shard_labels: bool = False) -> None:
        check_space(space)
        super().__init__(encoder, dim, dropout, dropout_clf)
        self.space = space
        self.label_texts = list(label_texts)
        # sparse: a step touches only the pool's rows (the trainer gives it lazy Adam); shard_labels: under torchrun
        # each rank holds its slice of the rows and their Adam moments (xmc.trainer.label_table)
        self.psi = LabelTable(self.n_labels, dim, shard=shard_labels, init_std=dim**-0.5)

    @property
    def n_labels(self) -> int:
        return len(self.label_texts)

    # ---- training-time forward (with gradients) -------------------------------------------------
    def label_de(self, label_ids: np.ndarray) -> torch.Tensor:
        return F.normalize(self.g1(self.encoder([self.label_texts[i] for i in label_ids], "label")), dim=-1)

    def classifiers(self, label_ids: np.ndarray) -> torch.Tensor:
        return self.psi(torch.as_tensor(np.asarray(label_ids), dtype=torch.long, device=self.psi.weight.device))

    def classifier_scores(self, q_clf: torch.Tensor, label_ids: np.ndarray) -> torch.Tensor:
        """<Φ_C(x), Ψ_l> for the pool (B x C); on a label-sharded Ψ the ranks' blocks are summed."""
        ids = torch.as_tensor(np.asarray(label_ids), dtype=torch.long, device=self.psi.weight.device)
        return self.psi.scores(q_clf, ids) if self.psi.sharded else q_clf @ self.psi(ids).T

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Paper §2: encoder 1e-4, projections 2e-4, Ψ 1e-3 - three groups with their own lr."""
        return {"encoder": [p for p in self.encoder.parameters() if p.requires_grad],
                "heads": list(self.g1.parameters()) + list(self.g2.parameters()),
                "classifier": [self.psi.weight]}

    # ---- no-grad numpy views (indexing, mining, clustering) ------------------------------------
    @torch.no_grad()
    def label_space_vectors(self, space: str, batch_size: int = 256, progress: bool = True) -> np.ndarray:
        # a sharded Ψ is gathered: a collective
        return self.label_space_vectors_with(self.psi.gathered(), self.label_texts, space, batch_size, progress)

    def all_label_vectors(self, batch_size: int = 256, progress: bool = True) -> np.ndarray:
        return self.label_space_vectors(self.space, batch_size, progress)

    def query_vectors_np(self, texts: Sequence[str], batch_size: int = 256, progress: bool = True) -> np.ndarray:
        return self.query_space_vectors(texts, self.space, batch_size, progress)

    @torch.no_grad()
    def init_classifiers_from_label_text(self, batch_size: int = 256) -> None:
        """Ψ_l := Φ_C(z_l) (the CLF projection of label l's text, eval mode). The paper leaves Ψ's
        init open; this starts the classifier as a label-text retriever (so labels that never occur
        in training keep a meaningful vector) instead of from noise."""
        # this rank's rows (all in one process); the encoder is not yet sharded at build time, so no collective
        _, clf = self.heads_np(self.label_texts[self.psi.lo : self.psi.hi], "label", batch_size, progress=False)
        self.psi.weight.data.copy_(torch.from_numpy(clf).to(self.psi.weight.device))

    @torch.no_grad()
    def reset_unseen_classifiers(self, train_label_freq: np.ndarray, batch_size: int = 256) -> int:
        """Ψ_l := Φ_C(z_l) under the *trained* encoder for labels with no training positive.

        [not in the paper] Such a Ψ_l never receives a positive gradient: it keeps its initial
        vector (made by the untrained encoder) minus whatever pushes it got as a hard negative, so
        its CLF half only adds noise to the concatenated score. Its label-text CLF embedding is
        the classifier's zero-shot estimate. Returns the number of rows replaced."""
        unseen = np.flatnonzero(np.asarray(train_label_freq).ravel() == 0)
        if len(unseen):
            _, clf = self.heads_np([self.label_texts[i] for i in unseen], "label", batch_size, progress=False)
            self.psi.set_rows(unseen, clf)
        return len(unseen)

    @torch.no_grad()
    def zero_unseen_classifiers(self, train_label_freq: np.ndarray) -> int:
        """Ψ_l := 0 for labels with no training positive, so they are ranked by their DE half alone.

        [not in the paper] Such a Ψ_l never receives a positive gradient (it keeps its initial
        vector minus the pushes it got as a hard negative), so its CLF cosine is noise that buries
        unseen labels in the concatenated index; a zero row has cosine 0 (N(0) = 0), leaving cos_DE.
        Returns the number of rows zeroed."""
        unseen = np.flatnonzero(np.asarray(train_label_freq).ravel() == 0)
        if len(unseen):
            self.psi.set_rows(unseen, np.zeros((len(unseen), self.dim), np.float32))
        return len(unseen)

    # ---- persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """The layout :class:`xmc.models.unidec.UniDECInference` loads."""
        psi = self.psi.gathered(dst=0)   # a label-sharded Ψ comes together on rank 0, which alone writes it
        if psi is None:
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.encoder.save(path / ENCODER)
        torch.save({**self.head_state(), "psi": psi}, path / HEADS)
        (path / DESCRIPTION).write_text(json.dumps(self.description(self.n_labels), indent=2))

    @classmethod
    def load(cls, path: str | Path, label_texts: Sequence[str], space: str = "concat") -> UniDECModel:
        path = Path(path)
        cfg = read_description(path, len(label_texts))
        model = cls(load_encoder(path / ENCODER), label_texts, dim=cfg["dim"], dropout=cfg["dropout"], space=space,
                    dropout_clf=cfg.get("dropout_clf"))
        st = load_tensors(path / HEADS)
        model.g1.load_state_dict(st["g1"])
        model.g2.load_state_dict(st["g2"])
        model.psi.weight.data.copy_(st["psi"])
        return model.eval()


# ------------------------------------------------------------------------------------------------
# pick-some-labels sampler
# ------------------------------------------------------------------------------------------------
def cluster_chunks(vectors: np.ndarray, ids: np.ndarray, cluster_size: int, seed: int, niter: int = 10) -> list[np.ndarray]:
    """Spherical k-means (faiss) into ~len/cluster_size clusters; clusters larger than
    ``cluster_size`` are cut into chunks of at most that size, so every chunk is a group of
    similar queries of bounded size (NGAME-style batching: a batch is several such chunks)."""
    n = len(ids)
    k = max(1, min(n, int(math.ceil(n / max(1, cluster_size)))))
    if k == 1:
        return [ids.copy()]
    x = np.ascontiguousarray(vectors[ids], dtype=np.float32)
    km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, spherical=True, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=max(256, 4 * cluster_size))
    km.train(x)
    _, assign = km.index.search(x, 1)
    assign = assign.ravel()
    order = np.argsort(assign, kind="stable")
    bounds = np.flatnonzero(np.diff(assign[order])) + 1
    chunks = []
    for members in np.split(ids[order], bounds):
        chunks.extend(members[s : s + cluster_size] for s in range(0, len(members), cluster_size))
    return chunks


class PickSomeLabelsSampler(HardNegativeShortlist):
    """PSL batches (UniDEC §3, Algorithm 1).

    * ``max_positives_per_query`` = β: positives sampled per query (0 = all);
    * ``negatives_per_query`` = η: hard negatives drawn per query from its top-``shortlist_size``
      DE neighbours (positives removed), the shortlist rebuilt every ``refresh_every_epochs`` = τ;
    * query batches: chunks of ``cluster_size`` similar queries (k-means over Φ_D(x)), re-clustered
      every ``cluster_every_epochs``, chunk order shuffled per epoch; random batches before the first
      clustering (or always, with ``cluster_size`` 0);
    * pool L_B = ∪ sampled positives ∪ hard negatives; P_i^B = P_i ∩ L_B (every true label in the
      pool is a positive, including those brought by other queries: ``unsampled_positives="positive"``).
    """

    def __init__(self, Y: sp.csr_matrix, max_positives_per_query: int = 3, negatives_per_query: int = 6,
                 shortlist_size: int = 30, refresh_every_epochs: int = 5, start_epoch: int = 0,
                 cluster_size: int = 16, cluster_every_epochs: int | None = None, cluster_start_epoch: int | None = None,
                 index_kind: str = "exact", encode_batch_size: int = 256, **positive_sampling: Any) -> None:
        super().__init__(Y, max_positives_per_query, shortlist_size=shortlist_size,
                         negatives_per_query=negatives_per_query, refresh_every_epochs=refresh_every_epochs,
                         start_epoch=start_epoch, index_kind=index_kind, encode_batch_size=encode_batch_size,
                         unsampled_positives="positive", **positive_sampling)
        self.cluster_size = int(cluster_size)
        self.cluster_every = int(cluster_every_epochs or refresh_every_epochs)
        self.cluster_start = int(start_epoch if cluster_start_epoch is None else cluster_start_epoch)
        if self.cluster_every < 1:
            raise ConfigError("cluster_every_epochs must be >= 1")
        self.chunks: list[np.ndarray] | None = None
        self.clustered_at: list[int] = []
        self.cluster_seconds: list[float] = []

    def cluster_due(self, epoch: int) -> bool:
        return self.cluster_size > 0 and epoch >= self.cluster_start and \
            (epoch - self.cluster_start) % self.cluster_every == 0

    def on_epoch_start(self, epoch: int, model: Any, query_texts: list[str]) -> None:
        mine = self.negatives_per_query > 0 and self.due(epoch) and epoch not in self.refreshed_at
        clus = self.cluster_due(epoch) and epoch not in self.clustered_at
        if not (mine or clus):
            return
        t0 = time.perf_counter()
        # one encoding of the training queries serves both the shortlist and the clustering
        qv = model.query_space_vectors(query_texts, "de", self.encode_batch_size, progress=False)
        if mine:
            lv = model.label_space_vectors("de", self.encode_batch_size, progress=False)
            self.refresh_from_vectors(qv, lv)
            self.refreshed_at.append(epoch)
            self.refresh_seconds.append(time.perf_counter() - t0)
            log.info("PSL hard-negative shortlist refreshed at epoch %d in %.1f s", epoch, self.refresh_seconds[-1])
        if clus:
            t1 = time.perf_counter()
            has = np.flatnonzero(np.diff(self.Y.indptr) > 0)
            self.chunks = cluster_chunks(qv, has, self.cluster_size, seed=epoch)
            self.clustered_at.append(epoch)
            self.cluster_seconds.append(time.perf_counter() - t1)
            log.info("PSL query clusters refreshed at epoch %d: %d chunks in %.1f s", epoch, len(self.chunks),
                     self.cluster_seconds[-1])

    def query_batches(self, epoch: int, batch_size: int, seed: int) -> list[np.ndarray]:
        if self.chunks is None:
            return super().query_batches(epoch, batch_size, seed)
        rng = np.random.default_rng([seed, epoch])
        order = np.concatenate([self.chunks[i] for i in rng.permutation(len(self.chunks))])
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        sampled = self.sample_positives(query_idx, rng)  # P̂_i, |P̂_i| <= β
        extra: list[np.ndarray] = []  # Ĥ_i ⊂ H_i − P_i
        if self.shortlist is not None and self.negatives_per_query > 0:
            extra.append(draw_from_rows(self.shortlist[query_idx], self.negatives_per_query, rng))
        batch = pool_batch(self.Y, query_idx, sampled, extra, "positive")
        pos = batch.positives
        batch.extras["pool_size"] = float(pos.shape[1])
        batch.extras["in_batch_positives"] = float(pos.sum(1).float().mean()) if pos.numel() else 0.0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "chunks": self.chunks, "clustered_at": list(self.clustered_at),
                "cluster_seconds": list(self.cluster_seconds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.chunks = state.get("chunks")
        self.clustered_at = list(state.get("clustered_at", []))
        self.cluster_seconds = list(state.get("cluster_seconds", []))


# ------------------------------------------------------------------------------------------------
# objective
# ------------------------------------------------------------------------------------------------
class UniDECObjective(Objective):
    """L = λ·L_D + (1−λ)·L_C (+ w_bce·BCE on the CLF scores over the pool), where each head's loss is
    λ_h·DS(q→l) + (1−λ_h)·DS(l→q) on the same pool and the same in-batch positive mask.

    The l→q direction is the DS loss on the transposed score block: each pool label against the
    batch's queries, its positives being the in-batch queries that have it (P_L); labels of the
    pool with no positive query in the batch drop out (no term)."""

    def __init__(self, temperature_de: float = 0.05, temperature_clf: float = 0.05, lam: float = 0.5,
                 lam_de: float = 0.5, lam_clf: float = 0.5, bce_weight: float = 0.0) -> None:
        super().__init__()
        self.ds_de, self.ds_clf = DecoupledSoftmaxLoss(temperature_de), DecoupledSoftmaxLoss(temperature_clf)
        self.temperature_clf = temperature_clf
        self.lam, self.lam_de, self.lam_clf, self.bce_weight = lam, lam_de, lam_clf, bce_weight

    shards_rows = True

    def _both_ways(self, loss: DecoupledSoftmaxLoss, s: torch.Tensor, pos: torch.Tensor, rows: slice,
                   lam_q2l: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(q→l, l→q) losses of this rank's rows ``s`` of the B x C block (their shares across ranks). The l→q
        direction needs every query of a label's column: across ranks its negatives' log-sum-exp and positive terms
        are combined from the ranks' rows (``label_sharded`` on the transposed rows), which returns the whole
        l→q loss on every rank, so its share is 1 / world of it."""
        q2l = self.share(loss, counted_rows(loss, pos, None), rows, s, pos)
        if lam_q2l >= 1.0:
            return q2l, s.sum() * 0.0
        if self.shards_rows and self.dist.active:
            return q2l, loss.label_sharded(s.T, pos[rows].T, None, None, self.dist.world) / self.dist.world
        return q2l, loss(s.T, pos.T)

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        if batch.label_ids is None:
            raise ConfigError("UniDEC trains on a label pool; an all-labels batch has no PSL pool")
        q_de, q_clf = model.query_heads(take_texts(query_texts, batch.query_idx))
        z_de = model.label_de(batch.label_ids)
        pos = batch.positives.to(q_de.device)
        rows = self.rows(len(q_de))   # this rank's rows of the batch (all of them in one process)
        s_de = (q_de[rows] @ z_de.T).float()
        # a label-sharded Ψ scores the global batch where its rows live (a collective); a replicated one this
        # rank's rows only
        s_clf = (model.classifier_scores(q_clf, batch.label_ids)[rows] if model.psi.sharded
                 else model.classifier_scores(q_clf[rows], batch.label_ids)).float()
        de_q2l, de_l2q = self._both_ways(self.ds_de, s_de, pos, rows, self.lam_de)
        clf_q2l, clf_l2q = self._both_ways(self.ds_clf, s_clf, pos, rows, self.lam_clf)
        l_de = self.lam_de * de_q2l + (1 - self.lam_de) * de_l2q
        l_clf = self.lam_clf * clf_q2l + (1 - self.lam_clf) * clf_l2q
        loss = self.lam * l_de + (1 - self.lam) * l_clf
        bce = s_clf.sum() * 0.0
        if self.bce_weight > 0 and s_clf.shape[0]:
            # auxiliary one-vs-all BCE over the pool (the paper's "DS + BCE" CLF loss; weight and
            # label set unstated there): mean over pool entries so its scale is pool-size free
            bce = F.binary_cross_entropy_with_logits(s_clf, pos[rows].float()) * (s_clf.shape[0] / len(q_de))
            loss = loss + self.bce_weight * bce
        self.last_parts = {"de_q2l": float(de_q2l.detach()), "de_l2q": float(de_l2q.detach()),
                           "clf_q2l": float(clf_q2l.detach()), "clf_l2q": float(clf_l2q.detach()),
                           "bce": float(bce.detach()), "pool_size": batch.extras.get("pool_size", float(pos.shape[1])),
                           "in_batch_positives": batch.extras.get("in_batch_positives", float(pos.sum(1).float().mean()))}
        return loss


# ------------------------------------------------------------------------------------------------
# inference
# ------------------------------------------------------------------------------------------------
def predict_spaces(model: UniDECModel, texts: Sequence[str], k: int, spaces: Sequence[str] = SPACES,
                   index_kind: str = "exact", batch_size: int = 256, **index_kw: Any) -> dict[str, dict[str, Any]]:
    """Top-k per retrieval space from one encoding of labels and queries.

    ``concat`` is one ANN index over [Φ_D(z) ⊕ N(Ψ)], queried with [Φ_D(x) ⊕ N(Φ_C(x))]: its inner
    product is exactly cos_DE + cos_CLF, so no re-ranking stage is needed. Returns
    {space: {"scores", "ids", "index", "index_seconds", "predict_seconds"}}."""
    t0 = time.perf_counter()
    de_l = model.label_space_vectors("de", batch_size, progress=False)
    psi_n = model.label_space_vectors("clf", batch_size)
    t_lbl = time.perf_counter() - t0
    t0 = time.perf_counter()
    de_q, clf_q = model.heads_np(texts, "query", batch_size, progress=False)  # one encoder pass, both heads
    clf_q = (clf_q / np.maximum(np.linalg.norm(clf_q, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    t_q = time.perf_counter() - t0
    lv = {"de": de_l, "clf": psi_n, "concat": np.hstack([de_l, psi_n])}
    qv = {"de": de_q, "clf": clf_q, "concat": np.hstack([de_q, clf_q])}
    out = {}
    for space in spaces:
        t0 = time.perf_counter()
        index = ANNIndex(kind=index_kind, **index_kw).build(np.ascontiguousarray(lv[space], dtype=np.float32))
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        D, I = index.search(np.ascontiguousarray(qv[space], dtype=np.float32), k)
        out[space] = {"scores": D, "ids": I, "index": index, "index_seconds": t_lbl + t_build,
                      "predict_seconds": t_q + time.perf_counter() - t0}
    return out


# ------------------------------------------------------------------------------------------------
# one run: build, train, save, predict
# ------------------------------------------------------------------------------------------------
def build_psl_sampler(Y: sp.csr_matrix, cfg: dict[str, Any] | None) -> PickSomeLabelsSampler:
    """The pick-some-labels sampler of ``unidec.psl`` (schema defaults filled; unset optional knobs keep the
    sampler's: clustering with the shortlist refresh)."""
    return PickSomeLabelsSampler(Y, **filled(PickSomeLabels, cfg, "unidec.psl"))


def build_unidec_objective(cfg: dict[str, Any] | None) -> UniDECObjective:
    return UniDECObjective(**filled(UnidecLoss, cfg, "unidec.loss"))


def build_unidec_model(encoder_cfg: dict[str, Any], model_cfg: dict[str, Any] | None,
                       label_texts: Sequence[str], shard_labels: bool = False) -> UniDECModel:
    m = filled(UnidecModel, model_cfg, "unidec.model")
    model = UniDECModel(build_encoder(encoder_cfg), label_texts, dim=m["dim"], dropout=m["dropout"],
                        dropout_clf=m["dropout_clf"], shard_labels=shard_labels)
    if m["init_classifier"] == "label_text":
        model.init_classifiers_from_label_text()
    return model


class UniDECMethod(TrainerMethod):
    """Encoder + DE head + classifier head on the one trainer; predicts in three spaces (the concatenated one,
    and each head alone as the paper's UniDEC-de / UniDEC-clf)."""

    name = "unidec"
    predictor_kind = "unidec"
    SPACE_SUFFIX: dict[str, str] = {"concat": "", "de": "_de_only", "clf": "_clf_only"}

    def build(self, ctx: Any, ds: Any) -> TrainingParts:
        cfg = ctx.config
        model = build_unidec_model(cfg["encoder"], cfg["model"], ds.label_texts,
                                   shard_labels=bool(cfg["train"].get("shard_label_tables", True)))
        sampler = build_psl_sampler(ds.trn.Y, cfg["psl"])
        freq = np.asarray(ds.trn.Y.sum(0)).ravel()

        def after_fit(history: dict[str, Any]) -> dict[str, Any]:
            # labels without training points: keep their trained classifier, zero it, or reset it to its label text
            mode = cfg["model"]["unseen_classifier"]
            n_reset = (model.reset_unseen_classifiers(freq) if mode == "label_text"
                       else model.zero_unseen_classifiers(freq) if mode == "zero" else 0)
            losses = history["loss"]
            return {"mean_pool_size": round(float(np.mean([r["pool_size"] for r in losses])), 1) if losses else None,
                    "mean_in_batch_positives": round(float(np.mean([r["in_batch_positives"] for r in losses])), 2)
                    if losses else None,
                    "cluster_seconds": [round(s, 2) for s in sampler.cluster_seconds],
                    "clustered_at_epochs": sampler.clustered_at, "unseen_classifiers_reset": n_reset}

        return TrainingParts(model, sampler, build_unidec_objective(cfg["loss"]),
                             fingerprint={"method": "unidec", **{k: cfg[k] for k in ("encoder", "model", "psl", "loss")},
                                          "data": ds.meta.get("content_sha256")},
                             save=model.save, after_fit=after_fit)

    def prediction_variants(self, run: Any) -> dict[str, dict[str, Any]]:
        return {f"{run.name}{suffix}": {"space": space} for space, suffix in self.SPACE_SUFFIX.items()}
