"""Find the labels whose name occurs in a text, with a real lemmatiser.

Every word of the text is taken as written and as each of its lemmas (lemminflect: ``took`` -> ``take``,
``irregularities`` -> ``irregularity``, with the part of speech of each lemma); a name of up to
``max_words`` words matches where some choice of forms spells it (``took a breath`` -> ``take a breath``).
The search walks a prefix set of the names, so a text costs about (words x forms x matched prefixes).

Per matched label the matcher reports what a ranker needs: the longest matching name (in words), how many
labels share that name (ambiguity), whether the part of speech of the matched word agrees with the label's
tag, and - given training label counts - the label's share of the training occurrences of the labels sharing
the name (the sense prior) and whether it is the most frequent of them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from lemminflect import getAllLemmas

from xmc.lexical.names import LabelNames, parse_label_names

TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)?")  # words; hyphens and underscores separate, as in normalised names
# universal POS of a lemma -> WordNet tags it is compatible with
UPOS_TAGS = {"NOUN": "n", "PROPN": "n", "VERB": "v", "AUX": "v", "ADJ": "as", "ADV": "r"}
FEATURES = ("matched", "match_words", "log_ambiguity", "pos_agrees", "name_specificity", "log_sense_prior",
            "most_frequent_sense")


@lru_cache(maxsize=1 << 18)
def word_forms(word: str) -> tuple[tuple[str, str], ...]:
    """(form, WordNet tags it may carry) for a word: itself (any tag) and each lemma with its POS."""
    w = word.lower()
    out: dict[str, str] = {w: "*"}
    for upos, lemmas in getAllLemmas(w).items():
        tags = UPOS_TAGS.get(upos, "")
        for lemma in lemmas:
            lemma = lemma.lower()
            if lemma != w:
                out[lemma] = "".join(dict.fromkeys(out.get(lemma, "") + tags))
    return tuple(out.items())


# The zero-shot ranking of matched labels (no training data): longer names first (one more word outweighs
# everything else), then the part of speech agreeing, less ambiguous and more specific names.
ZERO_SHOT_NAME_WEIGHTS = {"match_words": 10.0, "pos_agrees": 2.0, "log_ambiguity": -1.0, "name_specificity": 0.2}


@dataclass(frozen=True)
class Match:
    words: int           # the longest name of the label found in the text, in words
    ambiguity: int       # labels sharing that name
    pos_agrees: bool     # the matched word's part of speech fits the label's tag (or one of them is unknown)
    specificity: float = 0.0  # mean inverse document frequency of the name's words over the label texts


class LabelNameMatcher:
    """Labels whose names occur in a text (see the module doc)."""

    def __init__(self, names: LabelNames, max_words: int = 4, label_texts: Sequence[str] | None = None,
                 cased_names: bool = False) -> None:
        """``cased_names``: a name written with capitals in the label text (a proper noun, an abbreviation such
        as "He" for helium or "Sat" for Saturday) matches only the same spelling in the text, and a short one
        (up to 3 letters) not as the text's first word, where any word is capitalised."""
        self.tags = names.tags
        self.max_words = max_words
        self.cased_names = cased_names
        self.cased: dict[tuple[str, int], str] = {}
        if cased_names and names.cased is not None:
            self.cased = {(n, lid): c for lid, cs in enumerate(names.cased) for n, c in cs.items()}
        self.by_name: dict[str, list[int]] = defaultdict(list)
        for lid, ns in enumerate(names.names):
            for n in ns:
                if 0 < len(n.split()) <= max_words:
                    self.by_name[n].append(lid)
        self.prefixes = {" ".join(n.split()[:i]) for n in self.by_name for i in range(1, len(n.split()) + 1)}
        # how specific a word is, from the label texts alone (no training data): function words ("a", "in",
        # "be") occur in most label descriptions, content words in few
        docs = label_texts if label_texts is not None else [" ".join(ns) for ns in names.names]
        df: dict[str, int] = defaultdict(int)
        for t in docs:
            for w in set(TOKEN.findall(t.lower())):
                df[w] += 1
        n_docs = max(1, len(docs))
        self.specificity = {n: float(np.mean([np.log((n_docs + 1) / (df.get(w, 0) + 1)) for w in n.split()]))
                            for n in self.by_name}

    @classmethod
    def from_settings(cls, label_texts: Sequence[str], settings: dict) -> LabelNameMatcher:
        """The matcher of a params ``label_names`` section (``mode``, ``max_words``, ``cased_names``)."""
        return cls(parse_label_names(label_texts, settings["mode"]), settings["max_words"], label_texts,
                   cased_names=settings["cased_names"])

    def __len__(self) -> int:
        return len(self.tags)

    def _agrees(self, lid: int, tags: str) -> bool:
        t = self.tags[lid]
        return t is None or tags == "*" or t in tags

    def _case_fits(self, key: str, lid: int, words: list[str], start: int, end: int) -> bool:
        spelt = self.cased.get((key, lid))
        if spelt is None:
            return True
        return " ".join(words[start : end + 1]) == spelt and not (start == 0 and len(spelt) <= 3)

    def match(self, text: str) -> dict[int, Match]:
        words = TOKEN.findall(text)
        forms = [word_forms(w) for w in words]
        found: dict[int, Match] = {}
        for start in range(len(words)):
            frontier = [("", "*")]
            for i in range(start, min(len(words), start + self.max_words)):
                nxt = []
                for prefix, _ in frontier:
                    for form, tags in forms[i]:
                        key = f"{prefix} {form}" if prefix else form
                        if key in self.prefixes:
                            nxt.append((key, tags))
                if not nxt:
                    break
                n_words = i - start + 1
                for key, tags in nxt:
                    for lid in self.by_name.get(key, ()):
                        if self.cased and not self._case_fits(key, lid, words, start, i):
                            continue
                        m = Match(n_words, len(self.by_name[key]), self._agrees(lid, tags), self.specificity[key])
                        old = found.get(lid)
                        if old is None or (m.words, m.pos_agrees, -m.ambiguity) > (old.words, old.pos_agrees, -old.ambiguity):
                            found[lid] = m
                frontier = nxt
        return found

    def sense_prior(self, train_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per label: its share of the training occurrences of the labels sharing its most shared name
        (add-half smoothed), and whether it is the most frequent of them (with at least one occurrence)."""
        counts = np.asarray(train_counts, dtype=np.float64)
        prior = np.full(len(self.tags), np.nan)
        mfs = np.zeros(len(self.tags), bool)
        for lids in self.by_name.values():
            c = counts[lids]
            share = (c + 0.5) / (c.sum() + 0.5 * len(lids))
            top = c.max()
            for lid, s, ci in zip(lids, share, c):
                if np.isnan(prior[lid]) or s < prior[lid]:  # the most ambiguous name decides: the conservative prior
                    prior[lid] = s
                mfs[lid] |= bool(ci == top and ci > 0)
        return np.where(np.isnan(prior), 1.0, prior), mfs

    def feature_rows(self, matches: Sequence[dict[int, Match]], prior: np.ndarray,
                     mfs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(text index, label id, :data:`FEATURES` row) of every match of a batch of texts, in text order and
        match order. Per pair: 1, the matched words, log ambiguity, part-of-speech agreement, specificity,
        log sense prior of the label and its most-frequent-sense flag; each logarithm is taken once per distinct
        value with numpy's scalar log, so a row does not depend on the batch it comes in."""
        n = sum(len(m) for m in matches)
        text = np.fromiter((i for i, m in enumerate(matches) for _ in m), np.int64, n)
        lid = np.fromiter((j for m in matches for j in m), np.int64, n)
        ms = [mt for m in matches for mt in m.values()]
        out = np.empty((n, len(FEATURES)), np.float64)
        if not n:
            return text, lid, out
        ambiguity = np.fromiter((mt.ambiguity for mt in ms), np.int64, n)
        amb_values, amb_at = np.unique(ambiguity, return_inverse=True)
        lid_values, lid_at = np.unique(lid, return_inverse=True)
        out[:, 0] = 1.0
        out[:, 1] = np.fromiter((mt.words for mt in ms), np.float64, n)
        out[:, 2] = np.array([float(np.log(int(a))) for a in amb_values])[amb_at]
        out[:, 3] = np.fromiter((mt.pos_agrees for mt in ms), np.float64, n)
        out[:, 4] = np.fromiter((mt.specificity for mt in ms), np.float64, n)
        out[:, 5] = np.array([float(np.log(prior[j])) for j in lid_values])[lid_at]
        out[:, 6] = np.asarray(mfs, np.float64)[lid]
        return text, lid, out

    def match_many(self, texts: Sequence[str]) -> list[dict[int, Match]]:
        return [self.match(t) for t in texts]


def zero_shot_name_scores(found: dict[int, Match]) -> tuple[np.ndarray, np.ndarray]:
    """(label ids, scores) of a text's matched labels under :data:`ZERO_SHOT_NAME_WEIGHTS`."""
    w = ZERO_SHOT_NAME_WEIGHTS
    lids = np.fromiter(found, np.int64, len(found))
    sc = np.array([w["match_words"] * m.words + w["pos_agrees"] * m.pos_agrees + w["log_ambiguity"] * np.log(m.ambiguity)
                   + w["name_specificity"] * m.specificity for m in found.values()], dtype=np.float64)
    return lids, sc


def zero_shot_name_topk(matcher: LabelNameMatcher, texts: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (n, k) int32, scores (n, k) float32) of each text's best ``k`` name matches, zero-shot ranking;
    ties broken by label id; -1 / -inf pad."""
    I = np.full((len(texts), k), -1, np.int32)
    D = np.full((len(texts), k), -np.inf, np.float32)
    for r, text in enumerate(texts):
        found = matcher.match(text)
        if not found:
            continue
        lids, sc = zero_shot_name_scores(found)
        order = np.lexsort((lids, -sc))[:k]
        I[r, : len(order)], D[r, : len(order)] = lids[order], sc[order]
    return I, D
