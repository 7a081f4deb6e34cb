"""The trainer every method uses.

It knows a model (query/label vectors), a sampler (candidate pools) and a loss
(scores, positives -> scalar); nothing about a particular loss or sampler. Features:
AdamW with linear warm-up and decay, named parameter groups with their own learning
rates, gradient clipping, bf16 autocast on GPU, all-label scoring with gradient caching
over label chunks, checkpoints every epoch (and every N steps) with resume, a live record of
the loss, learning rate, throughput and per-epoch validation metrics through DVCLive
(:mod:`xmc.trainer.live`), tqdm progress.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from xmc.config.schema import TrainSection, filled
from xmc.data.columns import take_texts
from xmc.logs import kv
from xmc.trainer.live import TrainingLog
from xmc.negatives.base import CandidateBatch, NegativeSampler, StepPlan
from xmc.trainer.checkpoint import clean_stale_temporaries, load_checkpoint, save_checkpoint
from xmc.trainer.distributed import (all_equal, all_reduce_gradients, barrier, bucket_sharded, context, encode_locally,
                                     shard_bounds, shard_encoders, unshard_encoders)
from xmc.trainer.memory import reuse_freed_memory
from xmc.trainer.objective import Objective, RetrievalObjective
from xmc.trainer.row_adam import RowAdam

log = logging.getLogger(__name__)


_DEFAULTS = TrainSection().model_dump()   # the schema's train section: the one place these defaults live


@dataclass
class TrainConfig:
    """The trainer's settings: the params ``train`` section (:class:`xmc.config.schema.TrainSection`, whose
    defaults these are) less what only the stages read (``eval_every_epochs``, ``val_max_instances``)."""

    epochs: int = _DEFAULTS["epochs"]
    batch_size: int = _DEFAULTS["batch_size"]
    lr: float = _DEFAULTS["lr"]
    # parameter-group name -> lr
    group_lr: dict[str, float] = field(default_factory=lambda: dict(_DEFAULTS["group_lr"]))
    # parameter-group name -> "adamw" (default) | "sgd" (plain SGD; sparse gradients update only touched rows)
    group_optimizer: dict[str, str] = field(default_factory=lambda: dict(_DEFAULTS["group_optimizer"]))
    schedule: str = _DEFAULTS["schedule"]  # linear | cosine (both after linear warm-up)
    weight_decay: float = _DEFAULTS["weight_decay"]
    warmup_ratio: float = _DEFAULTS["warmup_ratio"]
    grad_clip: float = _DEFAULTS["grad_clip"]
    label_chunk_size: int = _DEFAULTS["label_chunk_size"]  # all-labels mode: labels re-encoded per chunk (bounds memory)
    amp: str = _DEFAULTS["amp"]  # auto (bf16 autocast on CUDA) | off | bf16 (on any device, the CPU too)
    seed: int = _DEFAULTS["seed"]
    max_steps_per_epoch: int = _DEFAULTS["max_steps_per_epoch"]  # 0 = full epochs; >0 caps the budget (CPU profiles)
    checkpoint_every_steps: int = _DEFAULTS["checkpoint_every_steps"]
    checkpoint_interval_minutes: float = _DEFAULTS["checkpoint_interval_minutes"]
    device: str = _DEFAULTS["device"]
    sparse_optimizer: str = _DEFAULTS["sparse_optimizer"]  # row_adam | row_adam_torch | torch_sparse_adam (tables)
    sparse_moments: str = _DEFAULTS["sparse_moments"]  # float32 | bf16 (RowAdam's moments, stochastically rounded)

    @classmethod
    def from_params(cls, p: dict[str, Any] | None) -> TrainConfig:
        """From a params ``train`` section (partial: the schema's defaults fill the rest; every key is checked)."""
        p = filled(TrainSection, p, "train")
        return cls(**{k: p[k] for k in cls.__dataclass_fields__})

    def fingerprint(self, extra: dict[str, Any] | None = None) -> str:
        blob = json.dumps({**asdict(self), **(extra or {})}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _no_decay(name: str, p: nn.Parameter) -> bool:
    return p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias")


class Trainer:
    """``loss`` is either a loss over a score block (wrapped in :class:`RetrievalObjective`) or an
    :class:`Objective` that computes a batch's loss itself (two heads, regularisers, pseudo pairs)."""

    def __init__(self, model: nn.Module, sampler: NegativeSampler, loss: nn.Module, config: TrainConfig,
                 query_texts: list[str], out_dir: str | Path, evaluator: Callable[[Any], dict[str, float]] | None = None,
                 eval_every_epochs: int = 0, fingerprint_extra: dict[str, Any] | None = None,
                 live: TrainingLog | None = None, live_prefix: str = "") -> None:
        self.model, self.sampler, self.cfg = model, sampler, config
        self.objective = loss if isinstance(loss, Objective) else RetrievalObjective(loss)
        self.query_texts = query_texts
        self.out_dir = Path(out_dir)
        self.ckpt_path = self.out_dir / "checkpoint.pt"
        self.evaluator, self.eval_every_epochs = evaluator, eval_every_epochs

        # data parallel under torchrun: encoders encode their rank's share and gather (xmc.trainer.distributed)
        self.dist = context()
        if self.dist.active:
            shard_encoders(model, self.dist)
        self.objective.dist = self.dist   # an objective that shards rows scores only this rank's (objective doc)
        self.live, self.live_prefix = (live, live_prefix) if self.dist.is_main else (None, live_prefix)
        self.device = resolve_device(config.device)
        self.model.to(self.device)
        # label-sharded tables (xmc.trainer.label_table): each rank holds different rows, so each rank checkpoints its
        # own state, and a checkpoint resumes only at the world size that wrote it
        self.label_sharded = any(getattr(p, "label_sharded", False) for p in model.parameters())
        if self.label_sharded:
            self.ckpt_path = self.out_dir / f"checkpoint.rank{self.dist.rank}.step*.pt"   # see _shard_files
            fingerprint_extra = {**(fingerprint_extra or {}), "label_sharded_world": self.dist.world}
        self.fingerprint = config.fingerprint(fingerprint_extra)
        self.history: dict[str, list[dict[str, Any]]] = {"loss": [], "val": [], "epochs": []}
        self.optimizers = self._make_optimizers()
        n_batches = len(self.sampler.query_batches(0, config.batch_size, config.seed))
        self.steps_per_epoch = min(n_batches, config.max_steps_per_epoch) if config.max_steps_per_epoch else n_batches
        self.total_steps = max(1, self.steps_per_epoch * config.epochs)
        self.sampler.bind_plan(StepPlan(config.batch_size, config.seed, self.steps_per_epoch, config.epochs))
        warm = int(config.warmup_ratio * self.total_steps)
        if config.schedule not in ("linear", "cosine"):
            raise ValueError(f"schedule must be 'linear' or 'cosine', not {config.schedule!r}")

        def schedule(s: int) -> float:  # linear warm-up, then linear or cosine decay to 0
            if s < warm:
                return (s + 1) / max(1, warm)
            frac = min(1.0, (s - warm) / max(1, self.total_steps - warm))
            return 1.0 - frac if config.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in self.optimizers]
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self._last_checkpoint = time.monotonic()
        self.use_amp = config.amp == "bf16" or (config.amp == "auto" and self.device.type == "cuda")

    def _make_optimizers(self) -> list[torch.optim.Optimizer]:
        """AdamW for dense parameters; SparseAdam for sparse embedding tables (only touched rows
        are updated, so a large hashed vocabulary costs nothing per step); plain SGD for the groups
        named in ``group_optimizer`` (ASTRA's classifiers: sparse row updates, no optimiser state)."""
        sparse = {id(m.weight) for m in self.model.modules()
                  if isinstance(m, nn.Embedding | nn.EmbeddingBag) and getattr(m, "sparse", False)}
        dense_groups, sparse_groups, sgd_groups = [], [], []
        named = {id(p): n for n, p in self.model.named_parameters()}
        for gname, params in self.model.param_groups().items():
            lr = float(self.cfg.group_lr.get(gname, self.cfg.lr))
            kind = self.cfg.group_optimizer.get(gname, "adamw")
            if kind == "sgd":
                sgd_groups.append({"params": list(params), "lr": lr, "name": gname})
                continue
            if kind != "adamw":
                raise ValueError(f"group_optimizer[{gname!r}] must be 'adamw' or 'sgd', not {kind!r}")
            sp_params = [p for p in params if id(p) in sparse]
            dense = [p for p in params if id(p) not in sparse]
            decay = [p for p in dense if not _no_decay(named.get(id(p), ""), p)]
            no_decay = [p for p in dense if _no_decay(named.get(id(p), ""), p)]
            if decay:
                dense_groups.append({"params": decay, "lr": lr, "weight_decay": self.cfg.weight_decay, "name": gname})
            if no_decay:
                dense_groups.append({"params": no_decay, "lr": lr, "weight_decay": 0.0, "name": f"{gname}_no_decay"})
            if sp_params:
                sparse_groups.append({"params": sp_params, "lr": lr, "name": f"{gname}_sparse"})
        opts: list[torch.optim.Optimizer] = []
        if dense_groups:
            opts.append(torch.optim.AdamW(dense_groups))
        if sparse_groups:
            if self.cfg.sparse_optimizer in ("row_adam", "row_adam_torch"):
                opt = RowAdam(sparse_groups, native=self.cfg.sparse_optimizer == "row_adam",
                              moments=self.cfg.sparse_moments)
                log.info("sparse tables: RowAdam, %s, %s moments", "C kernel (xmc/native)" if opt.native
                         else "torch path", self.cfg.sparse_moments)
                opts.append(opt)
            else:  # torch's SparseAdam: the same rule, the reference the row-wise one is measured against
                opts.append(torch.optim.SparseAdam(sparse_groups))
        if sgd_groups:
            opts.append(torch.optim.SGD(sgd_groups))
        self._dense_params = [p for g in dense_groups for p in g["params"]]
        return opts

    # ---- checkpoints -------------------------------------------------------------------------
    def _checkpoint_due(self) -> bool:
        """At least ``checkpoint_interval_minutes`` since the last checkpoint (or the start); the ranks of a
        data-parallel run decide together (each writes or none does: writing has barriers)."""
        interval = 60.0 * self.cfg.checkpoint_interval_minutes
        due = interval <= 0 or time.monotonic() - self._last_checkpoint >= interval
        if self.dist.active and interval > 0:
            flag = torch.tensor([int(due)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            due = bool(flag.item())
        return due

    def save_checkpoint(self) -> None:
        self._last_checkpoint = time.monotonic()
        if not self.dist.is_main and not self.label_sharded:   # the same state on every rank: rank 0 writes it
            barrier(self.dist)
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "fingerprint": self.fingerprint, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
            "global_step": self.global_step, "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "sampler": self.sampler.state_dict(), "objective": self.objective.state_dict(), "history": self.history,
            "torch_rng": torch.get_rng_state(),
        }
        if not self.label_sharded:
            save_checkpoint(state, self.ckpt_path)
            barrier(self.dist)
            return
        # each rank writes its shard's state under the step; an older file goes only after every rank has written
        # the new one, so a kill at any moment leaves a step that all ranks hold (try_resume picks it)
        current = self.out_dir / f"checkpoint.rank{self.dist.rank}.step{self.global_step}.pt"
        save_checkpoint(state, current)
        barrier(self.dist)
        for path in self._shard_files().values():
            if path != current:
                path.unlink(missing_ok=True)

    def _shard_files(self) -> dict[int, Path]:
        """This rank's step-stamped checkpoints of a label-sharded run: {global step: file}."""
        found = {}
        clean_stale_temporaries(self.ckpt_path)   # its name is the files' glob pattern
        for path in self.out_dir.glob(f"checkpoint.rank{self.dist.rank}.step*.pt"):
            step = path.name[: -len(".pt")].rsplit(".step", 1)[-1]
            if step.isdigit():
                found[int(step)] = path
        return found

    def _resumable_file(self) -> Path | None:
        """The checkpoint to resume from: the one file (one process or replicated ranks), or the newest step that
        every rank of a label-sharded run holds."""
        if not self.label_sharded:
            clean_stale_temporaries(self.ckpt_path)
            return self.ckpt_path if self.ckpt_path.exists() else None

        files = self._shard_files()
        mine = torch.full((4,), -1, dtype=torch.long)
        for i, step in enumerate(sorted(files)[-4:]):
            mine[i] = step
        every = [torch.empty_like(mine) for _ in range(self.dist.world)]
        dist.all_gather(every, mine)
        common = set.intersection(*({int(x) for x in t if x >= 0} for t in every))
        return files[max(common)] if common else None

    def try_resume(self) -> bool:
        path = self._resumable_file()
        if path is None:
            return False
        state = load_checkpoint(path, map_location=self.device)
        if state.get("fingerprint") != self.fingerprint:
            log.info("checkpoint %s is from other settings; starting afresh", path)
            return False
        self.model.load_state_dict(state["model"])
        for o, st in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(st)
        for sch, st in zip(self.schedulers, state["schedulers"]):
            sch.load_state_dict(st)
        self.sampler.load_state_dict(state["sampler"])
        if state.get("objective"):
            self.objective.load_state_dict(state["objective"])
        self.history = state["history"]
        torch.set_rng_state(state["torch_rng"])
        self.epoch, self.step_in_epoch, self.global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        log.info("resumed from %s at epoch %d step %d", path, self.epoch, self.step_in_epoch)
        return True

    def _check_ranks_agree(self) -> None:
        """Every rank starts from the same point, or none trains (a writer still at work between their reads)."""
        if self.dist.active and not all_equal([self.epoch, self.step_in_epoch, self.global_step], self.dist):
            raise RuntimeError(f"{self.ckpt_path}: the ranks resumed from different checkpoints (is an earlier run "
                               f"still writing it?); stop it and rerun")

    # ---- one step ----------------------------------------------------------------------------
    def _step(self, batch: CandidateBatch) -> float:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_amp):
            if batch.label_ids is None and not self.objective.handles_all_labels:
                texts = take_texts(self.query_texts, batch.query_idx)
                pos, valid, weights = Objective.targets(batch, self.device)
                return self._all_labels_step(texts, pos, valid, weights)
            loss = self.objective(self.model, batch, self.query_texts)
        if self.dist.active and self.objective.shards_rows:
            # this rank's share of the batch loss (its rows): the shares sum to the loss, and so do their gradients
            # once the gathers' backward and the gradient all-reduce have run
            loss.backward()
            total = loss.detach().float().reshape(1).clone()
            dist.all_reduce(total)
            return float(total)
        # every rank computed the same global loss; the gathers' backward sums the ranks' shares (module doc)
        (loss / self.dist.world).backward()
        return float(loss.detach())

    def _all_labels_step(self, texts: list[str], pos, valid, weights) -> float:
        """Gradient caching (Gao et al., 2021): score against every label without holding L graphs.

        1) label vectors under no-grad, chunk by chunk (RNG state kept per chunk);
        2) loss on the scores, backward to the query tower and to the cached label vectors: streamed over label
           chunks (:meth:`_streamed_all_labels`, B x chunk scores at a time) where the loss allows it, else on the
           B x L block (split across ranks for a label-sharded loss);
        3) re-encode each chunk with a graph (same RNG state, so the same dropout) and
           backpropagate its cached gradient. Encoder graphs are bounded by the chunk size; the cached label
           vectors and their gradient are L x d.
        """
        L, chunk = self.model.n_labels, self.cfg.label_chunk_size
        # across ranks, with a loss that has a label-sharded form: each rank encodes and scores only its slice of
        # the labels and the loss combines the ranks' normalisers (no rank holds B x L scores); otherwise every
        # rank encodes its share of each chunk and gathers them (the global B x L block on each rank)
        # (not with a row-split bag-of-words table: its bags are collectives over the same texts on every rank)
        sharded = (self.dist.active and hasattr(self.objective.loss, "label_sharded") and L >= self.dist.world
                   and not bucket_sharded(self.model))
        # one process, a loss that is a function of the positives' scores and the negatives' log-sum-exp: the
        # normaliser and its gradient are streamed over label chunks (B x chunk at a time, never B x L)
        streamed = (not self.dist.active and hasattr(self.objective.loss, "from_positives") and valid is None
                    and weights is None)
        if pos.is_sparse and not streamed:
            pos = pos.to_dense()
        lo, hi = shard_bounds(L, self.dist.world, self.dist.rank) if sharded else (0, L)
        local = encode_locally(self.model) if sharded else nullcontext()
        starts = list(range(lo, hi, chunk))
        rng_states, cached = [], []
        with torch.no_grad(), local:
            for s in starts:
                rng_states.append(torch.get_rng_state())
                cached.append(self.model.label_vectors(np.arange(s, min(s + chunk, hi))).float())
        Z = torch.cat(cached).requires_grad_(True)
        q = self.model.query_vectors(texts)
        if streamed:
            loss, G = self._streamed_all_labels(q, Z.detach(), pos, chunk)
        elif sharded:
            cols = slice(lo, hi)
            loss = self.objective.loss.label_sharded(q.float() @ Z.T, pos[:, cols],
                                                     None if valid is None else valid[:, cols],
                                                     None if weights is None else weights[:, cols], self.dist.world)
        else:
            loss = self.objective.loss((q.float() @ Z.T), pos, valid, weights)
        if not streamed:
            (loss / self.dist.world).backward()
            G = Z.grad
        current = torch.get_rng_state()
        with local:
            for s, st in zip(starts, rng_states):
                torch.set_rng_state(st)
                z = self.model.label_vectors(np.arange(s, min(s + chunk, hi)))
                z.float().backward(G[s - lo : s - lo + chunk])
        torch.set_rng_state(current)
        return float(loss.detach())

    def _streamed_all_labels(self, q: torch.Tensor, Z: torch.Tensor, pos: torch.Tensor,
                             chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All-labels loss whose negatives enter through N_i = log Σ_{l ∉ P_i} exp(s_il / τ) (``loss.from_positives``).

        1) N by a streamed log-sum-exp over label chunks (no grad);
        2) the loss from the positives' scores (B x max|P|) and a leaf N: autograd gives the gradients of q and of
           the positives' label vectors, and c_i = ∂loss/∂N_i;
        3) per chunk, ∂loss/∂s_il = c_i · exp(s_il / τ - N_i) / τ on the negatives: added to the gradients of q and
           of the chunk's label vectors by two matrix products.
        Returns the loss (backward already done on the query tower) and the label vectors' gradient (L x d)."""
        loss_fn = self.objective.loss
        tau = float(loss_fn.temperature)
        B, L = q.shape[0], Z.shape[0]
        pos = (pos if pos.is_sparse else pos.to_sparse()).coalesce()
        b_idx, l_idx = pos.indices()
        counts = torch.bincount(b_idx, minlength=B)
        width = max(int(counts.max()) if len(b_idx) else 0, 1)
        slot = torch.arange(len(b_idx)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        pos_ids = torch.zeros(B, width, dtype=torch.long)
        pos_ok = torch.zeros(B, width, dtype=torch.bool)
        pos_ids[b_idx, slot], pos_ok[b_idx, slot] = l_idx, True
        qd = q.detach().float().requires_grad_(True)

        def chunk_logits(s: int, e: int) -> torch.Tensor:
            logits = (qd.detach() @ Z[s:e].T) / tau
            inside = (l_idx >= s) & (l_idx < e)
            logits[b_idx[inside], l_idx[inside] - s] = -torch.inf   # positives are not negatives
            return logits

        with torch.no_grad():
            neg_lse = torch.full((B,), -torch.inf)
            for s in range(0, L, chunk):
                neg_lse = torch.logaddexp(neg_lse, torch.logsumexp(chunk_logits(s, min(s + chunk, L)), 1))
        N = neg_lse.clone().requires_grad_(True)
        Zp = Z[pos_ids].requires_grad_(True)   # B x max|P| x d: the positives' vectors only
        loss = loss_fn.from_positives((qd[:, None, :] * Zp).sum(-1), pos_ok, N)
        loss.backward()
        gq, G = qd.grad.clone(), torch.zeros_like(Z)
        G.index_add_(0, pos_ids[pos_ok], Zp.grad[pos_ok])
        c = N.grad if N.grad is not None else torch.zeros(B)
        finite = torch.isfinite(neg_lse)
        with torch.no_grad():
            for s in range(0, L, chunk):
                e = min(s + chunk, L)
                p = torch.exp(chunk_logits(s, e) - torch.where(finite, neg_lse, 0.0)[:, None])
                g = (c * finite)[:, None] * p / tau   # ∂loss/∂s on this chunk's negatives (0 on positives)
                gq += g @ Z[s:e]
                G[s:e] += g.T @ qd.detach()
        q.backward(gq.to(q.dtype))
        return loss.detach(), G

    # ---- the loop ------------------------------------------------------------------------------
    def fit(self, complete: bool = True) -> dict[str, Any]:
        """Train to the last epoch, resuming from this run's checkpoint if there is one. ``complete=False`` keeps
        the last checkpoint: the caller saves the model and then calls :meth:`complete`, so that a kill between
        the end of training and the saved model resumes instead of training again from the start."""
        reuse_freed_memory()   # every step allocates the same large temporaries (xmc.trainer.memory)
        torch.manual_seed(self.cfg.seed)
        self._last_checkpoint = time.monotonic()
        self.try_resume()
        self._check_ranks_agree()
        if self.live is not None:
            self.live.start(self.live_prefix, self.global_step)
        self.model.train()
        t_start = time.perf_counter()
        while self.epoch < self.cfg.epochs:
            epoch = self.epoch
            t_epoch = time.perf_counter()
            self.sampler.on_epoch_start(epoch, self.model, self.query_texts)
            self.model.train()
            batches = self.sampler.query_batches(epoch, self.cfg.batch_size, self.cfg.seed)[: self.steps_per_epoch]
            bar = tqdm(total=len(batches), initial=self.step_in_epoch, desc=f"epoch {epoch + 1}/{self.cfg.epochs}",
                       unit="step", mininterval=5, disable=not self.dist.is_main)
            for i in range(self.step_in_epoch, len(batches)):
                self.sampler.on_step_start(self.global_step, self.model, self.query_texts)
                rng = np.random.default_rng([self.cfg.seed, epoch, i])
                batch = self.sampler.make_batch(batches[i], rng)
                for o in self.optimizers:
                    o.zero_grad(set_to_none=True)
                loss = self._step(batch)
                if self.dist.active:
                    all_reduce_gradients([p for p in self.model.parameters() if p.requires_grad], self.dist)
                if self.cfg.grad_clip and self._dense_params:
                    # sparse embedding rows are not clipped: SparseAdam normalises their steps anyway
                    torch.nn.utils.clip_grad_norm_(self._dense_params, self.cfg.grad_clip)
                for o in self.optimizers:
                    o.step()
                for sch in self.schedulers:
                    sch.step()
                self.global_step += 1
                self.step_in_epoch = i + 1
                lr = self.schedulers[0].get_last_lr()[0]
                parts = {k: round(v, 6) for k, v in self.objective.last_parts.items()}
                self.history["loss"].append({"step": self.global_step, "epoch": epoch + 1, "loss": round(loss, 6),
                                             "lr": lr, **parts})
                if self.live is not None:
                    self.live.log(self.global_step, {"train/loss": loss, "train/lr": lr,
                                                     **{f"train/{k}": v for k, v in parts.items()}})
                bar.set_postfix(loss=f"{loss:.4f}")
                bar.update(1)
                if self.cfg.checkpoint_every_steps and self.step_in_epoch % self.cfg.checkpoint_every_steps == 0 \
                        and self._checkpoint_due():
                    self.save_checkpoint()
            bar.close()
            epoch_seconds = time.perf_counter() - t_epoch
            if self.live is not None and batches:
                n_queries = sum(len(b) for b in batches)
                self.live.log(self.global_step, {"train/sentences_per_s": n_queries / max(epoch_seconds, 1e-9)},
                              final=True)
            val: dict[str, Any] = {}
            if self.evaluator is not None and self.eval_every_epochs and (epoch + 1) % self.eval_every_epochs == 0:
                val = {"epoch": epoch + 1, **self.evaluator(self.model)}
                self.history["val"].append(val)
                if self.dist.is_main:
                    log.info("epoch %d validation: %s", epoch + 1, kv({k: v for k, v in val.items() if k != "epoch"}))
                if self.live is not None:
                    self.live.log_validation(self.global_step, val, epoch + 1)
                self.model.train()
            self.history["epochs"].append({"epoch": epoch + 1, "seconds": round(epoch_seconds, 2),
                                           "steps": len(batches)})
            self.epoch, self.step_in_epoch = epoch + 1, 0
            # after the last epoch the trained model itself is saved next
            if self.epoch < self.cfg.epochs and self._checkpoint_due():
                self.save_checkpoint()
        if self.dist.active:
            unshard_encoders(self.model)   # a row-split table whole again on every rank, for the model's save
        self.model.eval()
        if complete:
            self.complete()
        return {"train_seconds_this_run": time.perf_counter() - t_start, "history": self.history}

    def complete(self) -> None:
        """A finished run keeps no resumable state: a rerun happens only when its settings or data changed,
        and then starts afresh. The checkpoint (model + optimiser moments: GBs for large tables) is replaced
        by a small record of the run."""
        barrier(self.dist)
        if not self.dist.is_main:
            for path in self._shard_files().values() if self.label_sharded else ():   # its own shard's state
                path.unlink(missing_ok=True)
            return
        for path in self._shard_files().values() if self.label_sharded else ():
            path.unlink(missing_ok=True)
        clean_stale_temporaries(self.ckpt_path)
        self.ckpt_path.unlink(missing_ok=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "completed.json").write_text(json.dumps(
            {"fingerprint": self.fingerprint, "epochs": self.epoch, "global_step": self.global_step}, indent=2))
