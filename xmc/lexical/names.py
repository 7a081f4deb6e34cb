"""Label names kept apart from label descriptions.

A label's *name* is what an instance says when it means the label: a WordNet synset's lemmas, a product or
Wikipedia title. Its *description* (a gloss, a category path) explains it. Which part of a label text is its
name depends on the dataset:

* ``prefix``: ``"name, other name (pos): description"``, the WordNet style of semcor-wn30's label texts:
  the names before `` (<tag>): ``, split on ``", "``, and the tag (part of speech) kept;
* ``identifier``: ``"name: description"`` where the name is one identifier without spaces (a Debian package
  ``libfoo-dev: development files of foo``, a SKU, a slug): the identifier is the name, the rest the description;
* ``text``: the whole label text is one name (titles: LF-AmazonTitles, LF-WikiSeeAlsoTitles);
* ``auto``: ``prefix`` when most label texts have that shape, else ``identifier`` when most have that one, else
  ``text``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from xmc.errors import ConfigError

PREFIX = re.compile(r"^(?P<names>[^:()]{1,400}?) \((?P<tag>[a-z])\): ")
IDENTIFIER = re.compile(r"^(?P<name>[^\s:()]{1,200}): ")
MODES = ("auto", "prefix", "identifier", "text")
# what part of a label text an encoder reads: all of it, the names (with the tag), or the description
LABEL_TEXT_VIEWS = ("full", "names", "description")


def normalise_name(name: str) -> str:
    """Lower case, word separators as single spaces (``take_a_breath``, ``take-a-breath`` -> ``take a breath``)."""
    return " ".join(re.sub(r"[_\-]+", " ", name.lower()).split())


@dataclass(frozen=True)
class LabelNames:
    """Per label: its names (normalised) and an optional tag (WordNet part of speech: n, v, a, s, r)."""

    names: list[list[str]]
    tags: list[str | None]
    mode: str
    # per label: normalised name -> its spelling with capitals, for names written with capitals in the label text
    # (WordNet: proper nouns and abbreviations such as "He" (helium) or "Sat" (Saturday)); prefix mode only
    cased: list[dict[str, str]] | None = None

    def __len__(self) -> int:
        return len(self.names)


def parse_label_names(label_texts: Sequence[str], mode: str = "auto") -> LabelNames:
    """The names of every label, by ``mode`` (see the module doc)."""
    if mode not in MODES:
        raise ConfigError(f"label_names.mode must be one of {', '.join(MODES)} (got {mode!r})")
    matches = [PREFIX.match(t) for t in label_texts]
    if mode == "auto":
        most = 0.9 * len(label_texts)
        if label_texts and sum(m is not None for m in matches) >= most:
            mode = "prefix"
        elif label_texts and sum(IDENTIFIER.match(t) is not None for t in label_texts) >= most:
            mode = "identifier"
        else:
            mode = "text"
    if mode == "identifier":
        matches = [IDENTIFIER.match(t) for t in label_texts]
    names: list[list[str]] = []
    tags: list[str | None] = []
    cased: list[dict[str, str]] = []
    for text, m in zip(label_texts, matches):
        if mode == "identifier" and m is not None:
            n = normalise_name(m["name"])
            names.append([n] if n else [])
            tags.append(None)
            cased.append({})
        elif mode == "prefix" and m is not None:
            raw = m["names"].split(", ")
            parts = [normalise_name(p) for p in raw]
            names.append([p for p in dict.fromkeys(parts) if p])
            tags.append(m["tag"])
            cased.append({n: " ".join(re.sub(r"[_\-]+", " ", r).split()) for n, r in zip(parts, raw)
                          if n and r != r.lower()})
        else:
            n = normalise_name(text)
            names.append([n] if n else [])
            tags.append(None)
            cased.append({})
    return LabelNames(names, tags, mode, cased)


def label_text_view(text: str, view: str) -> str:
    """The part of one label text an encoder reads under ``view`` (:data:`LABEL_TEXT_VIEWS`).

    ``names``: ``"breathe, take a breath (v)"`` of ``"breathe, take a breath (v): draw air into ..."``;
    ``description``: ``"draw air into ..."``. A text without the ``names (tag): description`` shape (a title)
    is all name and its own description, so every view returns it whole.
    """
    if view == "full":
        return text
    if view not in LABEL_TEXT_VIEWS:
        raise ConfigError(f"encoder.label_text must be one of {', '.join(LABEL_TEXT_VIEWS)} (got {view!r})")
    m = PREFIX.match(text) or IDENTIFIER.match(text)
    if m is None:
        return text
    part = text[: m.end()].rstrip(": ") if view == "names" else text[m.end():].strip()
    return part or text
