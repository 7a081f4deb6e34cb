"""A hashed bag-of-words dual encoder: uni+bigram hashes -> EmbeddingBag -> d dims.

Trains at thousands of texts per second on a CPU, so CPU users and fast tests get a real
dual encoder. Hashing (CRC32, stable across processes) needs no vocabulary fitting.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xmc.encoders.base import SIDES, TextEncoder
from xmc.errors import DataFormatError
from xmc.io import load_tensors, read_json_file

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
        sorted_ids, order = torch.sort(ids, stable=True)   # the entries grouped by bucket
        uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        bag_of = torch.repeat_interleave(torch.arange(len(lengths), device=ids.device), lengths)
        values = F.embedding_bag(bag_of[order], grad.contiguous(), starts, mode="sum", per_sample_weights=w[order])
        g = torch.sparse_coo_tensor(uniq.unsqueeze(0), values, ctx.shape, is_coalesced=True, check_invariants=False)
        return g, None, None, None, None


class HashedBagOfWordsEncoder(TextEncoder):
    kind = "bow"

    def __init__(self, dim: int = 256, n_buckets: int = 1 << 18, ngram_max: int = 2, tied: bool = True,
                 dropout: float = 0.0, seed: int = 0, label_text: str = "full") -> None:
        super().__init__()
        self.set_label_text(label_text)
        self.dim, self.n_buckets, self.ngram_max, self.tied = dim, n_buckets, ngram_max, tied
        g = torch.Generator().manual_seed(seed)
        self.query_bag = nn.EmbeddingBag(n_buckets, dim, mode="sum", sparse=True)  # only touched rows get gradients
        with torch.no_grad():
            self.query_bag.weight.copy_(torch.randn(n_buckets, dim, generator=g) / dim**0.5)
        self.label_bag = self.query_bag if tied else nn.EmbeddingBag(n_buckets, dim, mode="sum", sparse=True)
        if not tied:
            with torch.no_grad():
                self.label_bag.weight.copy_(self.query_bag.weight)
        self.dropout = nn.Dropout(dropout)
        self._cache: dict[str, np.ndarray] = {}

    def _ids(self, text: str) -> np.ndarray:
        ids = self._cache.get(text)
        if ids is None:
            ids = np.asarray(hashed_ngrams(text, self.n_buckets, self.ngram_max), dtype=np.int64)
            if len(self._cache) < 2_000_000:
                self._cache[text] = ids
        return ids

    def forward(self, texts: list[str], side: str = "query") -> torch.Tensor:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}")
        return self._bags([self._ids(t) for t in self.side_texts(texts, side)],
                          self.query_bag if side == "query" else self.label_bag)

    def encode_pair(self, query_texts: Sequence[str], label_texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tied: both sides' bags in one pass over the table, so a training step gathers each distinct bucket once
        and the table gets one sparse gradient (no sum of two gradients and no coalesce in the optimiser)."""
        if not self.tied:
            return super().encode_pair(query_texts, label_texts)
        queries = list(query_texts)
        ids = [self._ids(t) for t in queries] + [self._ids(t) for t in self.side_texts(list(label_texts), "label")]
        v = self._bags(ids, self.query_bag)
        return v[: len(queries)], v[len(queries):]

    def _bags(self, ids: list[np.ndarray], bag: nn.EmbeddingBag) -> torch.Tensor:
        """The normalised 1/sqrt(n)-weighted bag sums of these hashed id lists."""
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        flat = np.concatenate(ids)
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]])).to(self.device)
        # 1/sqrt(n) weights: long texts do not dominate, short ones are not drowned
        w = torch.from_numpy(np.repeat(1.0 / np.sqrt(lengths), lengths).astype(np.float32)).to(self.device)
        flat_t = torch.from_numpy(flat).to(self.device)
        if not torch.is_grad_enabled() or not bag.weight.requires_grad:
            out = bag(flat_t, offsets, per_sample_weights=w)
        else:
            # the table's gradient has one row per distinct bucket of the batch, in increasing order: fewer bytes
            # than one per token occurrence, and nothing for the optimiser to coalesce (_WeightedBags)
            out = _WeightedBags.apply(bag.weight, flat_t, offsets, w, torch.from_numpy(lengths).to(self.device))
        return F.normalize(self.dropout(out), dim=-1)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save({k: v for k, v in self.state_dict().items()}, path / "bow_encoder.pt")
        (path / "xmc_encoder.json").write_text(json.dumps({
            "kind": self.kind, "dim": self.dim, "n_buckets": self.n_buckets, "ngram_max": self.ngram_max, "tied": self.tied,
            **self.description()}, indent=2))

    @classmethod
    def load(cls, path: str | Path) -> HashedBagOfWordsEncoder:
        path = Path(path)
        cfg = read_json_file(path / "xmc_encoder.json", "an encoder description")
        try:
            enc = cls(dim=int(cfg["dim"]), n_buckets=int(cfg["n_buckets"]), ngram_max=int(cfg["ngram_max"]),
                      tied=bool(cfg["tied"]))
            enc.load_state_dict(load_tensors(path / "bow_encoder.pt"))
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise DataFormatError(path / "bow_encoder.pt", None, f"does not match xmc_encoder.json ({str(e)[:120]})") from None
        return enc
