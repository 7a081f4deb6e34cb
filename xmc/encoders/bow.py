"""A hashed bag-of-words dual encoder: uni+bigram hashes -> EmbeddingBag -> d dims.

Trains at thousands of texts per second on a CPU, so CPU users and fast tests get a real
dual encoder. Hashing (CRC32, stable across processes) needs no vocabulary fitting.

A saved encoder keeps only the rows training moved (the table is trained with lazy, row-wise updates: a row no
training text or label text hashed to keeps its random initial value). At 2^19 x 768 that is 0.7 of 1.6 GB on
semcor-wn30. A loaded encoder maps each bucket to its stored row, and an untouched bucket to a zero row:
an n-gram unseen in training then adds nothing to a text's vector instead of a random direction
(``untouched="init"`` rebuilds the initial rows from the seed instead, the table exactly as trained).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
import torch.nn.functional as F
from torch import nn

from xmc import native
from xmc.encoders.base import SIDES, TextEncoder
from xmc.errors import DataFormatError
from xmc.io import load_tensors, read_json_file
from xmc.parallel import DistContext, shard_bounds

_TOKEN = re.compile(r"\w+", re.UNICODE)


@lru_cache(maxsize=1 << 20)
def _hash(token: str, n_buckets: int) -> int:
    return zlib.crc32(token.encode("utf-8")) % n_buckets


def hashed_ngrams(text: str, n_buckets: int, ngram_max: int = 2) -> list[int]:
    toks = _TOKEN.findall(text.lower())
    ids = [_hash(t, n_buckets) for t in toks]
    for n in range(2, ngram_max + 1):
        ids += [_hash(" ".join(toks[i : i + n]), n_buckets) for i in range(len(toks) - n + 1)]
    return ids or [0]


def hashed_ngrams_many(texts: Sequence[str], n_buckets: int, ngram_max: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hashed_ngrams` of every text: (their ids back to back as int64, each text's id count).

    ASCII texts go to a C loop (``xmc/native/ngram_hash.c``: the same tokens, n-grams and CRC-32) in one call; the
    others, and every text where no C compiler is found, go through :func:`hashed_ngrams`. The ids are equal either
    way (``tests/test_native.py``)."""
    n = len(texts)
    counts = np.zeros(n, np.int64)
    parts: list[np.ndarray | None] = [None] * n
    fn = native.ngram_hash() if n else None
    ascii_rows = [i for i, t in enumerate(texts) if t.isascii()] if fn is not None else []
    if ascii_rows:
        raw = [texts[i].encode("ascii") for i in ascii_rows]
        lengths = np.fromiter((len(b) for b in raw), np.int64, count=len(raw))
        offsets = np.zeros(len(raw) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        buf = np.frombuffer(b"".join(raw) or b"\0", dtype=np.uint8)
        cap = ngram_max * (int(offsets[-1]) // 2 + len(raw)) + len(raw)
        ids = np.empty(cap, np.int64)
        got = np.empty(len(raw), np.int64)
        w = fn(buf.ctypes.data, offsets.ctypes.data, len(raw), ngram_max, n_buckets, ids.ctypes.data,
               got.ctypes.data, cap)
        if w < 0:
            raise MemoryError("the n-gram hashing kernel ran out of memory" if w == -2 else "n-gram id bound too small")
        ends = np.cumsum(got)
        for k, i in enumerate(ascii_rows):
            parts[i] = ids[ends[k] - got[k]: ends[k]]
    for i, t in enumerate(texts):
        if parts[i] is None:
            parts[i] = np.asarray(hashed_ngrams(t, n_buckets, ngram_max), dtype=np.int64)
    for i, a in enumerate(parts):
        counts[i] = len(a)  # type: ignore[arg-type]
    flat = np.concatenate(parts) if n else np.zeros(0, np.int64)  # type: ignore[arg-type]
    return flat, counts


class NgramIdCache:
    """text -> its hashed n-gram ids, kept as one flat array with per-text offsets, so the ids of a batch are one
    gather instead of a lookup and a small array per text. Holds at most ``max_texts`` texts and ``max_ids`` ids
    (int32 where the bucket count allows); when a batch would pass either, the cache starts over (training reads
    the same texts every epoch, prediction streams new ones)."""

    def __init__(self, n_buckets: int, ngram_max: int, max_ids: int = 100_000_000, max_texts: int = 2_000_000) -> None:
        self.n_buckets, self.ngram_max, self.max_ids, self.max_texts = n_buckets, ngram_max, max_ids, max_texts
        self._dtype = np.int32 if n_buckets <= np.iinfo(np.int32).max else np.int64
        self.clear()

    def clear(self) -> None:
        self._slot: dict[str, int] = {}
        self._flat = np.zeros(1 << 16, self._dtype)
        self._ptr = np.zeros(1 << 12, np.int64)   # _ptr[s] .. _ptr[s + 1]: slot s's ids
        self._n_slots = 0

    def __len__(self) -> int:
        return self._n_slots

    def _fits(self, n_texts: int, n_ids: int) -> bool:
        return (self._n_slots + n_texts <= self.max_texts
                and int(self._ptr[self._n_slots]) + n_ids <= self.max_ids)

    def _store(self, texts: list[str], flat: np.ndarray, counts: np.ndarray) -> None:
        used = int(self._ptr[self._n_slots])
        if used + len(flat) > len(self._flat):
            grown = np.zeros(max(2 * len(self._flat), used + len(flat)), self._dtype)
            grown[:used] = self._flat[:used]
            self._flat = grown
        if self._n_slots + len(texts) + 1 > len(self._ptr):
            grown_ptr = np.zeros(max(2 * len(self._ptr), self._n_slots + len(texts) + 1), np.int64)
            grown_ptr[: self._n_slots + 1] = self._ptr[: self._n_slots + 1]
            self._ptr = grown_ptr
        self._flat[used: used + len(flat)] = flat
        s0 = self._n_slots
        self._ptr[s0 + 1: s0 + len(texts) + 1] = used + np.cumsum(counts)
        for k, t in enumerate(texts):
            self._slot[t] = s0 + k
        self._n_slots += len(texts)

    def ids(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the texts' ids back to back, int64; each text's id count)."""
        get = self._slot.get
        slots = [get(t, -1) for t in texts]
        if -1 in slots:
            new = list(dict.fromkeys(t for t, s in zip(texts, slots) if s < 0))
            flat, counts = hashed_ngrams_many(new, self.n_buckets, self.ngram_max)
            if not self._fits(len(new), len(flat)):
                # full: start over with this batch's texts only (hashing again the ones it already held)
                self.clear()
                new = list(dict.fromkeys(texts))
                flat, counts = hashed_ngrams_many(new, self.n_buckets, self.ngram_max)
                if not self._fits(len(new), len(flat)):   # a batch larger than the whole cache: hashed, not kept
                    return hashed_ngrams_many(list(texts), self.n_buckets, self.ngram_max)
            self._store(new, flat, counts)
            slots = [self._slot[t] for t in texts]
        s = np.asarray(slots, dtype=np.int64)
        starts = self._ptr[s]
        lengths = self._ptr[s + 1] - starts
        total = int(lengths.sum())
        # positions of each text's run: start of the run, then +1 per id (one gather, no per-text slices)
        pos = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)
        return self._flat[pos].astype(np.int64), lengths


class _WeightedBags(torch.autograd.Function):
    """``out[b] = Σ_k w_k table[ids_k]`` over bag b's entries, with a sparse row gradient for the table.

    Both directions are weighted bag sums, the CPU's fastest kernel for them (embedding_bag): forward over the
    table's rows in place (no gathered copy), backward over the bags' gradients with the entries grouped by
    bucket, which gives the gradient of each distinct bucket once, in increasing order (a coalesced sparse tensor,
    as the row-wise optimisers want it). nn.EmbeddingBag(sparse=True) would give one gradient row per token
    occurrence and leave the summing to a coalesce."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,  # type: ignore[override]
                per_sample_weights: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids, per_sample_weights, lengths)
        ctx.shape = weight.shape
        return F.embedding_bag(ids, weight.detach(), offsets, mode="sum", per_sample_weights=per_sample_weights)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ids, w, lengths = ctx.saved_tensors
        # the entries grouped by bucket; bucket ids fit in int32, whose radix sort takes about 0.6x the time of
        # int64's (stable either way, so the same order and the same sums)
        keys = ids.to(torch.int32) if ctx.shape[0] <= torch.iinfo(torch.int32).max else ids
        sorted_ids, order = torch.sort(keys, stable=True)
        uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
        uniq = uniq.to(torch.int64)
        starts = torch.cumsum(counts, 0) - counts
        bag_of = torch.repeat_interleave(torch.arange(len(lengths), device=ids.device), lengths)
        values = F.embedding_bag(bag_of[order], grad.contiguous(), starts, mode="sum", per_sample_weights=w[order])
        g = torch.sparse_coo_tensor(uniq.unsqueeze(0), values, ctx.shape, is_coalesced=True, check_invariants=False)
        return g, None, None, None, None


INIT_CHUNK_ROWS = 16384   # rows of the initial table drawn at a time when it is rebuilt (the same draws as at once)


def initial_rows(n_buckets: int, dim: int, seed: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows) of the table's initial values, in chunks: ``torch.randn(n_buckets, dim)`` of the seeded
    generator scaled by 1/sqrt(dim), drawn chunk by chunk (the generator gives the same numbers either way)."""
    g = torch.Generator().manual_seed(seed)
    for lo in range(0, n_buckets, INIT_CHUNK_ROWS):
        n = min(INIT_CHUNK_ROWS, n_buckets - lo)
        yield lo, torch.randn(n, dim, generator=g) / dim**0.5


def touched_buckets(weight: torch.Tensor, seed: int) -> torch.Tensor:
    """The buckets whose rows differ from their initial values (sorted int64 ids)."""
    n, dim = weight.shape
    moved = [torch.nonzero((weight[lo : lo + len(init)] != init).any(dim=1)).flatten() + lo
             for lo, init in initial_rows(n, dim, seed)]
    return torch.cat(moved) if moved else torch.zeros(0, dtype=torch.long)


class HashedBagOfWordsEncoder(TextEncoder):
    kind = "bow"

    def __init__(self, dim: int = 256, n_buckets: int = 1 << 18, ngram_max: int = 2, tied: bool = True,
                 dropout: float = 0.0, seed: int = 0, label_text: str = "full", _initialise: bool = True) -> None:
        super().__init__()
        self.set_label_text(label_text)
        self.dim, self.n_buckets, self.ngram_max, self.tied, self.seed = dim, n_buckets, ngram_max, tied, seed
        # a loaded encoder holds only the stored rows: bucket -> row of its table (-1: an untouched bucket, whose
        # n-grams add nothing to a bag but still count in its 1/sqrt(n) weight)
        self._rows_of: dict[str, np.ndarray] = {}
        if _initialise:
            g = torch.Generator().manual_seed(seed)
            # only touched rows get gradients (sparse). EmbeddingBag's own init draws from torch's global generator,
            # which the parts a method builds after the encoder then continue from: kept, so runs stay as they were
            self.query_bag = nn.EmbeddingBag(n_buckets, dim, mode="sum", sparse=True)
            with torch.no_grad():
                self.query_bag.weight.copy_(torch.randn(n_buckets, dim, generator=g) / dim**0.5)
            self.label_bag = self.query_bag if tied else nn.EmbeddingBag(n_buckets, dim, mode="sum", sparse=True)
            if not tied:
                with torch.no_grad():
                    self.label_bag.weight.copy_(self.query_bag.weight)
        else:
            # load(): the saved rows become the tables, so neither is drawn (about 8 s at 524,288 x 768)
            self.query_bag = self.label_bag = None
        self.dropout = nn.Dropout(dropout)
        self._id_cache = NgramIdCache(n_buckets, ngram_max)
        # data parallelism over the table's rows (shard_buckets): (context, first row, end row) while training
        self._bucket_shard: tuple[DistContext, int, int] | None = None
        self.trained_bucket_shards = 1   # how many ranks the last training split the table over (a record)

    # ---- data parallelism over the table's rows --------------------------------------------------
    def shard_buckets(self, ctx: DistContext) -> None:
        """Split the work on the table by its rows across the ranks of a data-parallel run.

        Rank r owns the buckets ``[lo, hi)``: for every text all ranks see, it sums only its own buckets' weighted
        rows, and the ranks' partial bags are summed with an autograd all-reduce (B x d vectors, not table rows), so
        every rank holds every bag. The backward hands each rank the gradient of the whole batch's bags, and its
        partial bags turn it into the complete gradient of its own rows: no table gradient crosses ranks, each
        rank's optimiser updates its rows only (a 1/world share of the encoding, backward and update work), and
        the rows a rank does not own go stale on it until :meth:`unshard_buckets`. The table's parameter is marked
        ``label_sharded`` (no gradient all-reduce; each rank checkpoints its own state)."""
        if self.query_bag is None or self._rows_of:
            raise ValueError("shard_buckets: only a whole trainable table can be split across ranks")
        self._bucket_shard = (ctx, *shard_bounds(self.n_buckets, ctx.world, ctx.rank))
        self.trained_bucket_shards = ctx.world
        for bag in {id(b): b for b in (self.query_bag, self.label_bag)}.values():
            bag.weight.label_sharded = True

    @property
    def bucket_sharded(self) -> bool:
        return self._bucket_shard is not None

    @torch.no_grad()
    def unshard_buckets(self) -> None:
        """Every rank gets every row's current value (each rank's own rows, summed over ranks: one all-reduce of
        the table), and the encoder works alone again. A collective: every rank calls it, at the end of training."""
        if self._bucket_shard is None:
            return
        _, lo, hi = self._bucket_shard
        for bag in {id(b): b for b in (self.query_bag, self.label_bag)}.values():
            w = bag.weight.data
            w[:lo] = 0.0   # stale here: their owners hold the trained values
            w[hi:] = 0.0
            dist.all_reduce(w)
            if hasattr(bag.weight, "label_sharded"):
                del bag.weight.label_sharded
        self._bucket_shard = None

    def forward(self, texts: list[str], side: str = "query") -> torch.Tensor:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}")
        which = "query" if side == "query" or self.tied else "label"
        return self._bags(self.side_texts(texts, side), self.query_bag if which == "query" else self.label_bag,
                          self._rows_of.get(which))

    def encode_pair(self, query_texts: Sequence[str], label_texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tied: both sides' bags in one pass over the table, so a training step gathers each distinct bucket once
        and the table gets one sparse gradient (no sum of two gradients and no coalesce in the optimiser)."""
        if not self.tied:
            return super().encode_pair(query_texts, label_texts)
        queries = list(query_texts)
        v = self._bags(queries + self.side_texts(list(label_texts), "label"), self.query_bag, self._rows_of.get("query"))
        return v[: len(queries)], v[len(queries):]

    def _bags(self, texts: Sequence[str], bag: nn.EmbeddingBag, rows_of: np.ndarray | None = None) -> torch.Tensor:
        """The normalised 1/sqrt(n)-weighted bag sums of these texts' hashed n-grams (``rows_of``: bucket -> row of
        a loaded encoder's stored table)."""
        flat, lengths = self._id_cache.ids(texts)
        # 1/sqrt(n) weights: long texts do not dominate, short ones are not drowned
        w_np = np.repeat(1.0 / np.sqrt(lengths), lengths).astype(np.float32)
        if rows_of is not None:
            # a loaded table holds the touched rows only: an untouched bucket's term is dropped (it would add a zero
            # row), which leaves the table as stored, memory-mapped, with no zero row appended by a copy
            flat = rows_of[flat].astype(np.int64)
            kept = flat >= 0
            if not kept.all():
                text_of = np.repeat(np.arange(len(lengths)), lengths)
                flat, w_np = flat[kept], w_np[kept]
                lengths = np.bincount(text_of[kept], minlength=len(lengths))
        shard = self._bucket_shard if rows_of is None else None
        if shard is not None:   # this rank's buckets only; the weights keep each text's whole length (shard_buckets)
            _, lo, hi = shard
            text_of = np.repeat(np.arange(len(lengths)), lengths)
            mine = (flat >= lo) & (flat < hi)
            flat, w_np = flat[mine], w_np[mine]
            lengths = np.bincount(text_of[mine], minlength=len(lengths))
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)).to(self.device)
        w = torch.from_numpy(w_np).to(self.device)
        flat_t = torch.from_numpy(flat).to(self.device)
        if not torch.is_grad_enabled() or not bag.weight.requires_grad:
            out = bag(flat_t, offsets, per_sample_weights=w)
        else:
            # the table's gradient has one row per distinct bucket of the batch, in increasing order: fewer bytes
            # than one per token occurrence, and nothing for the optimiser to coalesce (_WeightedBags)
            out = _WeightedBags.apply(bag.weight, flat_t, offsets, w, torch.from_numpy(lengths).to(self.device))
        if shard is not None:   # the ranks' partial bags summed (autograd: the backward sums their gradients)
            if torch.is_grad_enabled() and out.requires_grad:
                out = dfn.all_reduce(out)
            else:
                out = out.contiguous()
                dist.all_reduce(out)
        return F.normalize(self.dropout(out), dim=-1)

    def _stored(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(buckets, their rows) of the ``query`` or ``label`` table as saved: the rows training moved."""
        bag = self.query_bag if which == "query" else self.label_bag
        weight = bag.weight.detach()
        rows_of = self._rows_of.get(which)
        if rows_of is not None:   # a loaded encoder: its stored rows
            buckets = torch.from_numpy(np.flatnonzero(rows_of >= 0))
            return buckets, weight[torch.from_numpy(rows_of[buckets.numpy()].astype(np.int64))].contiguous()
        buckets = touched_buckets(weight, self.seed)
        return buckets, weight[buckets].contiguous()

    def save(self, path: str | Path) -> None:
        """``bow_encoder.pt``: {"<side>_buckets": ids, "<side>_rows": their rows} per stored table (``query``, and
        ``label`` when untied); ``xmc_encoder.json``: the settings, with the seed the initial rows came from."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, torch.Tensor] = {}
        for which in ("query",) if self.tied else ("query", "label"):
            buckets, rows = self._stored(which)
            tensors[f"{which}_buckets"], tensors[f"{which}_rows"] = buckets.to(torch.int64), rows
        torch.save(tensors, path / "bow_encoder.pt")
        (path / "xmc_encoder.json").write_text(json.dumps({
            "kind": self.kind, "dim": self.dim, "n_buckets": self.n_buckets, "ngram_max": self.ngram_max, "tied": self.tied,
            "seed": self.seed, "storage": "touched_rows", **self.description()}, indent=2))

    @classmethod
    def load(cls, path: str | Path, untouched: str = "zero", trainable: bool = False) -> HashedBagOfWordsEncoder:
        """A saved encoder. ``untouched``: ``zero`` (a bucket training never touched adds nothing) or ``init`` (its
        initial random row, rebuilt from the seed: the table exactly as trained, 8 s at 2^19 x 768). ``trainable``:
        a whole sparse table to train further (``init`` rows where untouched), instead of the stored rows only."""
        if untouched not in ("zero", "init"):   # an argument, not the folder: not reported as a corrupt file
            raise ValueError(f"untouched must be zero or init, not {untouched!r}")
        untouched = "init" if trainable else untouched
        path = Path(path)
        cfg = read_json_file(path / "xmc_encoder.json", "an encoder description")
        try:
            enc = cls(dim=int(cfg["dim"]), n_buckets=int(cfg["n_buckets"]), ngram_max=int(cfg["ngram_max"]),
                      tied=bool(cfg["tied"]), seed=int(cfg.get("seed", 0)), _initialise=False)
            enc.set_label_text(cfg.get("label_text", "full"))
            # memory-mapped: a cold load reads the rows a query touches, not the whole table (hundreds of MB)
            st = load_tensors(path / "bow_encoder.pt", mmap=not trainable and untouched == "zero")
            if cfg.get("storage") != "touched_rows":   # a whole table (encoders saved before touched-row storage)
                enc._full_tables(st)
            else:
                for which in ("query",) if enc.tied else ("query", "label"):
                    enc._load_rows(which, st[f"{which}_buckets"], st[f"{which}_rows"], untouched, trainable)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
            raise DataFormatError(path / "bow_encoder.pt", None, f"does not match xmc_encoder.json ({str(e)[:120]})") from None
        return enc

    def _full_tables(self, st: dict[str, torch.Tensor]) -> None:
        self.query_bag = nn.EmbeddingBag.from_pretrained(st["query_bag.weight"], freeze=False, mode="sum", sparse=True)
        self.label_bag = self.query_bag if self.tied else nn.EmbeddingBag.from_pretrained(
            st["label_bag.weight"], freeze=False, mode="sum", sparse=True)

    def _load_rows(self, which: str, buckets: torch.Tensor, rows: torch.Tensor, untouched: str,
                   trainable: bool = False) -> None:
        ids = buckets.to(torch.int64).numpy()
        if rows.shape != (len(ids), self.dim) or (len(ids) and (ids.min() < 0 or ids.max() >= self.n_buckets
                                                                or (np.diff(ids) <= 0).any())):
            raise ValueError(f"{which}: {len(ids)} sorted bucket ids in [0, {self.n_buckets}) and as many rows of "
                             f"{self.dim} expected, got rows of shape {tuple(rows.shape)}")
        if untouched == "init":
            table = torch.empty(self.n_buckets, self.dim)
            for lo, init in initial_rows(self.n_buckets, self.dim, self.seed):
                table[lo : lo + len(init)] = init
            table[torch.from_numpy(ids)] = rows.float()
            bag = nn.EmbeddingBag.from_pretrained(table, freeze=not trainable, mode="sum", sparse=True)
        elif untouched == "zero":
            table = rows.float()   # float32 as saved: the memory-mapped tensor itself, no copy
            rows_of = np.full(self.n_buckets, -1, np.int32 if len(ids) < 2**31 - 1 else np.int64)
            rows_of[ids] = np.arange(len(ids))
            self._rows_of[which] = rows_of
            bag = nn.EmbeddingBag.from_pretrained(table, freeze=True, mode="sum", sparse=True)
        else:
            raise ValueError(f"untouched must be zero or init, not {untouched!r}")
        if which == "query":
            self.query_bag = bag
            if self.tied:
                self.label_bag = bag
        else:
            self.label_bag = bag
