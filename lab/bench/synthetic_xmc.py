"""Deterministic synthetic XMC datasets, up to a million instances x a million labels on one machine.

Why: the real data at hand (semcor-wn30) has 26k labels and 16k training sentences; the "a million labels on
one machine" work needs inputs of 10^5..10^6 instances and labels that the pipeline reads like a real benchmark,
with the statistics that make XMC hard (a Zipf label distribution, labels never seen in training, a long tail
of labels per instance) and text that a model can actually learn from, so that a precision far above chance
says the pipeline works and a precision near zero says it does not.

What it writes (the XC repository raw layout of ``xmc/data/formats.py``, file for file like semcor-wn30)::

    trn.raw.txt, tst.raw.txt   one instance text per line                       (read_text_lines)
    lbl.raw.txt                one label text per line, "name, name (t): words"  (read_text_lines)
    trn_X_Y.txt, tst_X_Y.txt   header "n_rows n_labels", rows "lid:1.0 ..."      (read_sparse_labels)
    trn.jsonl, tst.jsonl       {"uid", "doc"} per row: document groups           (formats._read_sidecar)
    lbl.jsonl                  {"lid", "id", "pos", "parent"} per label           (graph.build.label_synsets)
    label_graph.tsv            child relation parent child_is_label parent_is_label: label -> cluster ->
                               super-cluster hypernym tree                        (graph.build.wordnet_label_set)
    graph/taxonomy_anchors.jsonl, graph/taxonomy_label_edges.tsv
                               the same tree as a RAMEN anchor set (label -> cluster and super-cluster
                               anchors), for ``graph.source_dir``                 (graph.format.load_graph_dir)
    stats.json                 counts, labels per instance, label-frequency quantiles, generation seconds

The generative model, all of it vectorised numpy:

* vocabulary of ``max(5000, 2 L)`` pronounceable words (``bako``, ``strei``...), word ``r`` of Zipf rank ``r``
  (the frequent words are the short ones, as in a language); background tokens are Zipf(1) over it;
* labels: Zipf(1) popularity (Zipf-Mandelbrot, offset 5) over a random permutation of the label ids (most
  labels are rare; at L = n_train about 40 % are never drawn for training); each label has three "specific"
  words, sits in a cluster of ~16 labels (two cluster words) inside a super-cluster of ~16 clusters (two
  words). A label text names it by its specific words and describes it with cluster / super-cluster /
  background words (3-12 tokens);
* instances come in documents (groups, ~8 instances); a document has a focus cluster (drawn by cluster mass)
  and each label draw comes from that cluster with probability 1/2, else from the global Zipf: the marginal
  label distribution stays exactly Zipf, while labels co-occur within clusters and documents;
* labels per instance: geometric with mean 5 (cap 100; ~3.8 after merging repeated draws) plus a rare (2e-4)
  row of 20-100 labels;
* an instance text is 8-30 tokens (more in a row with many labels): 0-3 mentions of each of its labels'
  topic words (specific or cluster words), background words for the rest, shuffled. TF-IDF against label
  texts finds its labels far above chance (P@1 ~0.55); not every label is mentioned, and words are shared
  between labels, so nothing is trivial.

Every file is a deterministic function of (n_train, n_labels, n_test, seed): the same arguments give
byte-identical files (except stats.json's ``generation_seconds``), on any machine with the same numpy.
Rows are generated in fixed-size chunks, each from its own seeded stream, and streamed to disk, so memory
stays under 1 GB for 10^6 x 10^6 (about 15 s on one core) and the bytes do not depend on how writes are cut.

RAMEN's graph stage on this data: with ``graph.source_dir: null`` it derives the ``document`` set from
the document groups; its ``wordnet`` builder reads label_graph.tsv + lbl.jsonl but keeps only WordNet synsets,
so it finds no anchor here and skips the set with one warning (``graph.wordnet.enabled=false`` says so
up front). ``graph.source_dir: <out>/graph`` loads the ``taxonomy`` label set instead.

    python -m lab.bench.synthetic_xmc --out DIR --n-train N --n-labels L [--n-test M] [--seed S] [--no-label-graph]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("lab.bench.synthetic_xmc")

# --- the model's constants (changing one changes every generated file) --------------------------------------
LABEL_ZIPF = 1.0            # label popularity ~ 1 / (rank + LABEL_OFFSET) ** LABEL_ZIPF (Zipf-Mandelbrot):
LABEL_OFFSET = 5.0          # the offset flattens the very head (no label in a third of all rows), tail unchanged
WORD_ZIPF = 1.0             # background word frequency exponent
N_STOP = 100                # the most frequent words are background only, never a label's topic word
CLUSTER_SIZE = 16           # labels per cluster (on average), clusters per super-cluster
MEAN_LABELS = 5.0           # labels drawn per instance: geometric, support >= 1 (~3.8 distinct after merging repeats)
MAX_LABELS = 100
LARGE_ROW_RATE = 2e-4       # share of rows drawing 20..100 labels (log-uniform): the rare huge row
MEAN_DOC_SIZE = 8           # instances per document (geometric)
DOC_FOCUS = 0.5             # a label draw comes from the document's focus cluster with this probability
MIN_TOKENS, MAX_TOKENS = 8, 30
MENTION_P = (0.15, 0.45, 0.30, 0.10)        # 0..3 mentions of a label in its instance's text
SLOT_P = (0.40, 0.25, 0.15, 0.12, 0.08)     # which topic word a mention uses: spec0..2, cluster word 0..1
TAGS = (b"n", b"v", b"a", b"r")             # the "(t)" of a label text, like WordNet's part of speech
MAX_LABEL_TOKENS = 12
CHUNK_ROWS = 1 << 16        # rows per generated chunk: fixed, so the streams (and the bytes) never depend on it

# syllable = onset (consonants) + nucleus (vowels): the consonant/vowel runs of a word parse back into
# syllables one way only, so distinct syllable sequences are distinct words
ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
          "br", "ch", "dr", "gr", "kr", "pl", "sh", "st", "tr", "th")
NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ou")

_SPLIT_CODE = {"trn": 1, "tst": 2}


@dataclass
class _Table:
    """Byte strings ("entries") in one buffer: entry i is buf[start[i]:start[i] + length[i]].

    Every entry ends with its separator (a space), which the renderer turns into the newline at the end of
    a line, so a line of token ids renders with one numpy gather."""

    buf: np.ndarray     # uint8
    start: np.ndarray   # int64
    length: np.ndarray  # int64


def _concat_bytes(arr: np.ndarray) -> np.ndarray:
    """The bytes of an 'S' array, entries back to back (entries hold no NUL, numpy's padding)."""
    mat = arr.view(np.uint8).reshape(len(arr), arr.dtype.itemsize)
    return mat[mat != 0]


def _table(arr: np.ndarray) -> _Table:
    length = np.strings.str_len(arr).astype(np.int64)
    start = np.zeros(len(arr), np.int64)
    np.cumsum(length[:-1], out=start[1:])
    return _Table(_concat_bytes(arr), start, length)


def _render_lines(ids: np.ndarray, counts: np.ndarray, table: _Table) -> bytes:
    """Lines of entries: line j is the next ``counts[j]`` (>= 1) entries of ``ids``, newline-terminated."""
    lens = table.length[ids]
    ends = np.cumsum(lens)
    # output byte b of token t is buf[start[t] + b - first byte of t]: one repeat + one gather
    src = np.arange(int(ends[-1]), dtype=np.int64)
    src += np.repeat(table.start[ids] - (ends - lens), lens)
    out = table.buf[src]
    out[ends[np.cumsum(counts) - 1] - 1] = 10  # each line's last separator -> "\n"
    return out.tobytes()


def _join(*cols: np.ndarray | bytes) -> bytes:
    """Row-wise concatenation of 'S' columns (or constant bytes), all rows back to back."""
    acc = np.asarray(cols[0])
    for c in cols[1:]:
        acc = np.strings.add(acc, c)
    return _concat_bytes(np.atleast_1d(acc)).tobytes()


def _s(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype("S")


def word_strings(n_words: int) -> np.ndarray:
    """The vocabulary ('S' array): word r is the bijective base-|syllables| numeral of r in syllables."""
    syl = np.array([o + n for o in ONSETS for n in NUCLEI], dtype="S")
    base = len(syl)
    r = np.arange(n_words, dtype=np.int64)
    n_syl = np.ones(n_words, np.int64)
    rem = r.copy()
    block = base
    while True:  # words of 1 syllable come first, then 2, ... (the frequent words are short)
        longer = rem >= block
        if not longer.any():
            break
        rem[longer] -= block
        n_syl[longer] += 1
        block *= base
    words = np.full(n_words, b"", dtype="S1")
    for pos in range(int(n_syl.max())):
        digit = rem % base
        rem //= base
        words = np.strings.add(np.where(n_syl > pos, syl[digit], b""), words)
    return words


def _zipf_cum(n: int, exponent: float) -> np.ndarray:
    return np.cumsum(1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent)


def _draw(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws (u in [0, 1)) from an unnormalised cumulative distribution."""
    return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), len(cum) - 1)


class _Model:
    """Everything label-side: vocabulary, label popularity, clusters, topic words, label texts."""

    def __init__(self, n_labels: int, seed: int) -> None:
        L = n_labels
        rng = np.random.default_rng([seed, 0])
        self.L = L
        self.V = V = max(5000, 2 * L)
        self.word_s = words = word_strings(V)
        # entries: words + " ", words + ", " (the last name before an alternative name), "(t): " tags
        self.words = _table(np.concatenate([np.strings.add(words, b" "), np.strings.add(words, b", "),
                                            np.array([b"(" + t + b"): " for t in TAGS], dtype="S")]))
        self.word_cum = _zipf_cum(V, WORD_ZIPF)
        # label popularity: Zipf over a random order of the label ids
        rank = rng.permutation(L)
        p = 1.0 / (rank + LABEL_OFFSET) ** LABEL_ZIPF
        self.C = C = max(1, math.ceil(L / CLUSTER_SIZE))
        self.S = S = max(1, math.ceil(C / CLUSTER_SIZE))
        self.cluster = rng.integers(0, C, L)
        self.super = rng.integers(0, S, C)
        self.spec = rng.integers(N_STOP, V, (L, 3))
        self.cluster_words = rng.integers(N_STOP, V, (C, 2))
        self.super_words = rng.integers(N_STOP, V, (S, 2))
        self.tag = rng.integers(0, len(TAGS), L)
        # labels sorted by cluster, one cumulative popularity: a global draw and a draw within a cluster are
        # both one searchsorted into it
        self.order = np.argsort(self.cluster, kind="stable")
        self.cum = np.cumsum(p[self.order])
        self.lo = np.searchsorted(self.cluster[self.order], np.arange(C), side="left")
        self.hi = np.searchsorted(self.cluster[self.order], np.arange(C), side="right")
        base = np.concatenate([[0.0], self.cum])
        self.c_base = base[self.lo]
        self.c_mass = base[self.hi] - base[self.lo]
        self.c_cum = np.cumsum(self.c_mass)
        # topic words an instance uses to mention a label (SLOT_P order)
        self.topic = np.concatenate([self.spec, self.cluster_words[self.cluster]], axis=1)
        self.label_ids, self.label_counts = self._label_tokens(rng)

    def _label_tokens(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of every label text "spec0 [spec1][, spec2] (t): description" (3..12 tokens)."""
        L, V = self.L, self.V
        two_names = rng.random(L) < 0.5
        alt = rng.random(L) < 0.4
        names = np.full((L, 3), -1, np.int64)
        names[:, 0] = self.spec[:, 0]
        names[two_names, 1] = self.spec[two_names, 1]
        last = np.where(two_names, 1, 0)
        names[alt, last[alt]] += V  # the comma variant closes the first name
        names[alt, 2] = self.spec[alt, 2]
        tag = (2 * V + self.tag)[:, None]
        # description: cluster word(s), a super-cluster word, maybe the third specific word, background
        desc = np.full((L, 9), -1, np.int64)
        c, s = self.cluster, self.super[self.cluster]
        desc[:, 0] = self.cluster_words[c, 0]
        m = rng.random(L) < 0.5
        desc[m, 1] = self.cluster_words[c[m], 1]
        m = rng.random(L) < 0.5
        desc[m, 2] = self.super_words[s[m], rng.integers(0, 2, int(m.sum()))]
        m = ~alt & (rng.random(L) < 0.5)
        desc[m, 3] = self.spec[m, 2]
        used = (names >= 0).sum(1) + 1 + (desc[:, :4] >= 0).sum(1)
        n_bg = np.minimum(rng.integers(0, 6, L), MAX_LABEL_TOKENS - used)
        bg = _draw(self.word_cum, rng.random((L, 5)))
        desc[:, 4:] = np.where(np.arange(5) < n_bg[:, None], bg, -1)
        # shuffle each description (padding last)
        key = rng.random(desc.shape) + (desc < 0)
        desc = np.take_along_axis(desc, np.argsort(key, axis=1, kind="stable"), axis=1)
        tok = np.concatenate([names, tag, desc], axis=1)
        keep = tok >= 0
        return tok[keep], keep.sum(1)

    def draw_labels(self, u: np.ndarray, focus: np.ndarray | None) -> np.ndarray:
        """Label ids for uniforms ``u``: global Zipf draws, or within cluster ``focus`` where focus >= 0."""
        L = self.L
        x = u * self.cum[-1]
        lo, hi = np.zeros(len(u), np.int64), np.full(len(u), L - 1)
        if focus is not None:
            f = focus >= 0
            x[f] = self.c_base[focus[f]] + u[f] * self.c_mass[focus[f]]
            lo[f], hi[f] = self.lo[focus[f]], self.hi[focus[f]] - 1
        idx = np.clip(np.searchsorted(self.cum, x, side="right"), lo, hi)
        return self.order[idx]


def _documents(n: int, rng: np.random.Generator) -> np.ndarray:
    """Document id of each of ``n`` rows: consecutive runs of geometric length (mean MEAN_DOC_SIZE)."""
    sizes = rng.geometric(1.0 / MEAN_DOC_SIZE, n // MEAN_DOC_SIZE + 16)
    while sizes.sum() < n:
        sizes = np.concatenate([sizes, rng.geometric(1.0 / MEAN_DOC_SIZE, n // MEAN_DOC_SIZE + 16)])
    return np.repeat(np.arange(len(sizes)), sizes)[:n]


def _write_split(model: _Model, name: str, n: int, seed: int, d: Path) -> dict[str, Any]:
    """Stream ``<name>.raw.txt``, ``<name>_X_Y.txt`` and ``<name>.jsonl``; returns label counts and stats."""
    L = model.L
    code = _SPLIT_CODE[name]
    rng = np.random.default_rng([seed, 1, code])
    doc = _documents(n, rng)
    n_docs = int(doc[-1]) + 1
    focus = np.minimum(np.searchsorted(model.c_cum, rng.random(n_docs) * model.c_cum[-1], side="right"), model.C - 1)
    y_table = _table(np.strings.add(_s(np.arange(L)), b":1.0 "))
    label_freq = np.zeros(L, np.int64)
    per_row = np.zeros(n, np.int32)
    n_tokens = 0
    max_tokens = 0
    with open(d / f"{name}.raw.txt", "wb") as ft, open(d / f"{name}_X_Y.txt", "wb") as fy, \
            open(d / f"{name}.jsonl", "wb") as fj:
        fy.write(f"{n} {L}\n".encode())
        for ci, r0 in enumerate(range(0, n, CHUNK_ROWS)):
            r1 = min(n, r0 + CHUNK_ROWS)
            m = r1 - r0
            g = np.random.default_rng([seed, 2, code, ci])
            # labels per row: geometric, plus the rare huge row
            k = g.geometric(1.0 / MEAN_LABELS, m)
            big = g.random(m) < LARGE_ROW_RATE
            k[big] = np.round(np.exp(g.uniform(math.log(20), math.log(MAX_LABELS), int(big.sum()))))
            k = np.minimum(k, min(MAX_LABELS, L))
            row = np.repeat(np.arange(m), k)
            foc = np.where(g.random(len(row)) < DOC_FOCUS, focus[doc[r0:r1]][row], -1)
            lab = model.draw_labels(g.random(len(row)), foc)
            key = np.unique(row * L + lab)  # sorted (row, label), duplicates drawn twice merged
            row, lab = key // L, key % L
            counts = np.bincount(row, minlength=m)
            per_row[r0:r1] = counts
            label_freq += np.bincount(lab, minlength=L)
            fy.write(_render_lines(lab, counts, y_table))
            # text: mentions of the labels' topic words + background, shuffled within the row
            n_men = np.minimum(np.searchsorted(np.cumsum(MENTION_P), g.random(len(lab)), side="right"),
                               len(MENTION_P) - 1)
            men_pair = np.repeat(np.arange(len(lab)), n_men)
            slot = np.minimum(np.searchsorted(np.cumsum(SLOT_P), g.random(len(men_pair)), side="right"),
                              len(SLOT_P) - 1)
            men_word = model.topic[lab[men_pair], slot]
            men_row = row[men_pair]
            length = np.clip(MIN_TOKENS + np.round(g.gamma(2.0, 5.5, m)).astype(np.int64), MIN_TOKENS, MAX_TOKENS)
            n_bg = np.maximum(length - np.bincount(men_row, minlength=m), 2)
            bg_row = np.repeat(np.arange(m), n_bg)
            bg_word = _draw(model.word_cum, g.random(len(bg_row)))
            t_row = np.concatenate([men_row, bg_row])
            t_word = np.concatenate([men_word, bg_word])
            order = np.lexsort((g.random(len(t_row)), t_row))
            t_counts = np.bincount(t_row, minlength=m)
            ft.write(_render_lines(t_word[order], t_counts, model.words))
            n_tokens += int(t_counts.sum())
            max_tokens = max(max_tokens, int(t_counts.max()))
            # sidecar: uid and document, the groups of validation carving and of RAMEN's document set
            rows = np.arange(r0, r1)
            fj.write(_join(b'{"uid": "', name.encode(), b"-", _s(rows), b'", "doc": "', name.encode(), b"-d",
                           _s(doc[r0:r1]), b'"}\n'))
    freq_q = (0.5, 0.9, 0.99, 0.999, 1.0)
    seen = label_freq > 0
    top = np.sort(label_freq)[::-1]
    n_top = max(1, L // 100)
    return {
        "label_freq": label_freq,
        "stats": {
            "instances": n,
            "documents": n_docs,
            "pairs": int(per_row.sum()),
            "distinct_labels": int(seen.sum()),
            "labels_unseen": int(L - seen.sum()),
            "avg_labels_per_instance": round(float(per_row.mean()), 3),
            "max_labels_per_instance": int(per_row.max()),
            "labels_per_instance_quantiles": {str(q): float(np.quantile(per_row, q)) for q in (0.5, 0.9, 0.99, 1.0)},
            "avg_instances_per_label": round(float(label_freq[seen].mean()), 3) if seen.any() else 0.0,
            "labels_with_1_instance": int((label_freq == 1).sum()),
            "labels_with_le5_instances": int(((label_freq >= 1) & (label_freq <= 5)).sum()),
            "max_label_freq": int(label_freq.max()),
            "label_freq_quantiles": {str(q): float(np.quantile(label_freq, q)) for q in freq_q},
            "top_1pct_labels_share_of_pairs": round(float(top[:n_top].sum() / max(1, top.sum())), 4),
            "avg_tokens_per_instance": round(n_tokens / n, 2),
            "max_tokens_per_instance": max_tokens,
        },
    }


def _write_label_side(model: _Model, d: Path, label_graph: bool) -> dict[str, Any]:
    """lbl.raw.txt, the graph/ anchor set and (label_graph) lbl.jsonl + label_graph.tsv."""
    L = model.L
    ptr = np.concatenate([[0], np.cumsum(model.label_counts)])
    with open(d / "lbl.raw.txt", "wb") as fh:
        for r0 in range(0, L, CHUNK_ROWS):
            r1 = min(L, r0 + CHUNK_ROWS)
            fh.write(_render_lines(model.label_ids[ptr[r0]:ptr[r1]], model.label_counts[r0:r1], model.words))
    lid = np.arange(L)
    clusters = np.unique(model.cluster)  # clusters with at least one label; super-clusters of those
    supers = np.unique(model.super[clusters])

    def text(ids: np.ndarray) -> np.ndarray:  # word ids (n, k) -> "w1 w2 ..." per row ('S')
        acc = model.word_s[ids[:, 0]]
        for j in range(1, ids.shape[1]):
            acc = np.strings.add(np.strings.add(acc, b" "), model.word_s[ids[:, j]])
        return acc

    gdir = d / "graph"
    gdir.mkdir()
    with open(gdir / "taxonomy_anchors.jsonl", "wb") as fh:
        fh.write(_join(b'{"id": "c', _s(clusters), b'", "text": "',
                       text(np.concatenate([model.cluster_words[clusters],
                                            model.super_words[model.super[clusters]]], 1)),
                       b'"}\n'))
        fh.write(_join(b'{"id": "s', _s(supers), b'", "text": "', text(model.super_words[supers]), b'"}\n'))
    with open(gdir / "taxonomy_label_edges.tsv", "wb") as fh:
        for r0 in range(0, L, CHUNK_ROWS):
            r1 = min(L, r0 + CHUNK_ROWS)
            c = model.cluster[r0:r1]
            fh.write(_join(_s(lid[r0:r1]), b"\tc", _s(c), b"\n", _s(lid[r0:r1]), b"\ts", _s(model.super[c]), b"\n"))
    info: dict[str, Any] = {"clusters": int(len(clusters)), "super_clusters": int(len(supers)),
                            "taxonomy_anchors": int(len(clusters) + len(supers)), "taxonomy_label_edges": 2 * L}
    if label_graph:
        with open(d / "lbl.jsonl", "wb") as fh:
            for r0 in range(0, L, CHUNK_ROWS):
                r1 = min(L, r0 + CHUNK_ROWS)
                fh.write(_join(b'{"lid": ', _s(lid[r0:r1]), b', "id": "l', _s(lid[r0:r1]), b'", "pos": "',
                               np.array(TAGS, dtype="S1")[model.tag[r0:r1]], b'", "parent": "c',
                               _s(model.cluster[r0:r1]), b'"}\n'))
        with open(d / "label_graph.tsv", "wb") as fh:
            fh.write(b"child\trelation\tparent\tchild_is_label\tparent_is_label\n")
            for r0 in range(0, L, CHUNK_ROWS):
                r1 = min(L, r0 + CHUNK_ROWS)
                fh.write(_join(b"l", _s(lid[r0:r1]), b"\thypernym\tc", _s(model.cluster[r0:r1]), b"\t1\t0\n"))
            fh.write(_join(b"c", _s(clusters), b"\thypernym\ts", _s(model.super[clusters]), b"\t0\t0\n"))
        info.update({"nodes": int(L + len(clusters) + len(supers)), "edges": int(L + len(clusters)),
                     "label_to_label_edges": 0})
    return info


def generate(out_dir: str | Path, n_train: int, n_labels: int, n_test: int | None = None, seed: int = 0,
             label_graph: bool = True) -> dict[str, Any]:
    """Write a synthetic dataset to ``out_dir`` (replaced atomically) and return its statistics (stats.json).

    ``n_test`` defaults to ``max(1, n_train // 4)``. ``label_graph=False`` leaves out ``label_graph.tsv`` and
    ``lbl.jsonl`` (with them, the graph stage's WordNet builder runs on this data and finds no WordNet synset)."""
    from xmc.io import atomic_dir

    if n_train < 1 or n_labels < 1:
        raise ValueError(f"n_train and n_labels must be >= 1 (got {n_train}, {n_labels})")
    n_test = max(1, n_train // 4) if n_test is None else n_test
    if n_test < 1:
        raise ValueError(f"n_test must be >= 1 (got {n_test})")
    t0 = time.perf_counter()
    model = _Model(n_labels, seed)
    log.info("model: %d labels, %d words, %d clusters (%.1f s)", n_labels, model.V, model.C, time.perf_counter() - t0)
    with atomic_dir(out_dir) as tmp:
        graph = _write_label_side(model, tmp, label_graph)
        log.info("label side written (%.1f s)", time.perf_counter() - t0)
        trn = _write_split(model, "trn", n_train, seed, tmp)
        log.info("trn written (%.1f s)", time.perf_counter() - t0)
        tst = _write_split(model, "tst", n_test, seed, tmp)
        log.info("tst written (%.1f s)", time.perf_counter() - t0)
        f_trn, f_tst = trn["label_freq"], tst["label_freq"]
        stats: dict[str, Any] = {
            "generator": "lab.bench.synthetic_xmc",
            "arguments": {"n_train": n_train, "n_labels": n_labels, "n_test": n_test, "seed": seed,
                          "label_graph": label_graph},
            "model": {"label_zipf": LABEL_ZIPF, "label_offset": LABEL_OFFSET, "word_zipf": WORD_ZIPF,
                      "vocabulary": model.V,
                      "cluster_size": CLUSTER_SIZE, "mean_labels_geometric": MEAN_LABELS, "max_labels": MAX_LABELS,
                      "large_row_rate": LARGE_ROW_RATE, "mean_doc_size": MEAN_DOC_SIZE, "doc_focus": DOC_FOCUS,
                      "tokens": [MIN_TOKENS, MAX_TOKENS], "mention_p": list(MENTION_P), "slot_p": list(SLOT_P)},
            "label_space_size": n_labels,
            "avg_tokens_per_label": round(float(model.label_counts.mean()), 2),
            "trn": trn["stats"],
            "tst": tst["stats"],
            "tst_labels_unseen_in_trn": int(((f_tst > 0) & (f_trn == 0)).sum()),
            "tst_label_occurrences_unseen_in_trn": int(f_tst[f_trn == 0].sum()),
            "label_graph": graph,
            "generation_seconds": round(time.perf_counter() - t0, 2),
        }
        (tmp / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output dataset directory (replaced)")
    ap.add_argument("--n-train", type=int, required=True)
    ap.add_argument("--n-labels", type=int, required=True)
    ap.add_argument("--n-test", type=int, default=None, help="default: n_train // 4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-label-graph", action="store_true",
                    help="leave out label_graph.tsv and lbl.jsonl (graph/ is always written)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stats = generate(a.out, a.n_train, a.n_labels, a.n_test, a.seed, label_graph=not a.no_label_graph)
    print(json.dumps({k: stats[k] for k in ("trn", "tst", "tst_labels_unseen_in_trn", "generation_seconds")}, indent=1))


if __name__ == "__main__":
    main()
