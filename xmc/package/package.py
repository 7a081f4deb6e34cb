"""A self-contained model package: everything needed to predict, and a manifest that says what it is.

Layout of ``packages/<name>/``::

    manifest.json   format, method, run, params, dataset and label-set hashes, code version, metrics, files
    labels.jsonl    one {"uid", "text"} per label, in label-id order
    <predictor files>  e.g. encoder/ + index/ (dense), model/ + index/ (UniDEC), tfidf/ (baselines)

Loading reads nothing outside the folder. A package whose files do not match its manifest, or whose label
set differs from the one a caller expects, is refused with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xmc import __version__
from xmc.data.lines import read_json_lines
from xmc.errors import ConfigError, DataFormatError, XMCError
from xmc.io import atomic_dir, read_json_file
from xmc.cards import CARD, model_card
from xmc.package.predictor import Predictor, kind_of_source, predictor_class

FORMAT = "xmc-model-package"
FORMAT_VERSION = 1
MAX_K = 10_000  # most labels returned per text
MANIFEST = "manifest.json"
LABELS = "labels.jsonl"


class InputError(XMCError, ValueError):
    """A text or an argument of a prediction request is unusable (empty text, k out of range...)."""


@dataclass(frozen=True)
class Prediction:
    """One ranked label: its id in the dataset (``lbl.jsonl``'s ``id`` on the XC raw layout, else the row), its row
    (``index``) in the package's label order, its text, and the model's score."""

    id: str
    index: int
    text: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def label_set_sha256(uids: Sequence[str], texts: Sequence[str]) -> str:
    """Hash of the label set in order: two packages serve the same labels iff these agree."""
    h = hashlib.sha256()
    for u, t in zip(uids, texts, strict=True):
        h.update(json.dumps([u, t], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files_of(root: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[p.relative_to(root).as_posix()] = {"bytes": p.stat().st_size, "sha256": _file_sha256(p)}
    return out


# What computes a model, relative to the repository root. The pipeline rewrites tracked files as it runs
# (dvc.lock, metrics/, plots), so a whole-tree check would mark every package a clean checkout builds as dirty.
CODE_PATHS = ("xmc", "stages", "pyproject.toml")


def code_version(repo: str | Path = ".") -> dict[str, Any]:
    """The xmc version and, inside a git checkout, the commit, with ``-dirty`` when the code that builds models
    (:data:`CODE_PATHS`: changed, staged or new files) differs from it. The params are in the manifest."""
    out: dict[str, Any] = {"xmc": __version__}

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)

    try:
        p = git("describe", "--always", "--abbrev=12")
        if p.returncode == 0 and p.stdout.strip():
            status = git("status", "--porcelain", "--", *(f":/{path}" for path in CODE_PATHS))
            dirty = status.returncode != 0 or bool(status.stdout.strip())
            out["git"] = p.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def read_labels(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        raise DataFormatError(path, None, "missing from the model package")
    uids, texts = [], []
    for n, rec in read_json_lines(path):
        uid, text = rec.get("uid"), rec.get("text")
        if not isinstance(uid, str) or not isinstance(text, str):
            raise DataFormatError(path, n, "expected {\"uid\": str, \"text\": str}")
        uids.append(uid)
        texts.append(text)
    return uids, texts


# ------------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------------
def finish_package(tmp: Path, section: dict[str, Any], *, name: str, method: str, label_uids: Sequence[str],
                   label_texts: Sequence[str], params: dict[str, Any] | None = None,
                   dataset: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
                   training: dict[str, Any] | None = None, repo: str | Path = ".") -> dict[str, Any]:
    """Complete a package folder whose predictor files are in ``tmp`` (``section``: the predictor's manifest
    section): the labels, the model card and the manifest with every file's size and hash. Returns the manifest."""
    label_uids, label_texts = list(label_uids), list(label_texts)
    with open(tmp / LABELS, "w", encoding="utf-8") as fh:
        for u, t in zip(label_uids, label_texts, strict=True):
            fh.write(json.dumps({"uid": u, "text": t}, ensure_ascii=False) + "\n")
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "method": method,
        "predictor": section,
        "labels": {"count": len(label_texts), "sha256": label_set_sha256(label_uids, label_texts), "file": LABELS},
        "dataset": dataset or {}, "params": params or {}, "code": code_version(repo), "metrics": metrics or {},
        "training": training or {},
    }
    (tmp / CARD).write_text(model_card(manifest), encoding="utf-8")   # the card is one of the files
    manifest["files"] = _files_of(tmp)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False, sort_keys=False) + "\n",
                                encoding="utf-8")
    return manifest


def build_package(out_dir: str | Path, *, name: str, method: str, source: str | Path, label_uids: Sequence[str],
                  label_texts: Sequence[str], options: dict[str, Any] | None = None,
                  params: dict[str, Any] | None = None, dataset: dict[str, Any] | None = None,
                  metrics: dict[str, Any] | None = None, training: dict[str, Any] | None = None,
                  repo: str | Path = ".") -> dict[str, Any]:
    """Write ``out_dir`` atomically from the trained model at ``source`` and return its manifest (no predictions
    or metrics: :func:`xmc.package.build.package_run` is the pipeline's way, with both).

    ``options``: ``index`` (ANN settings), ``space`` (UniDEC), ``config`` (the run's settings)."""
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"{source}: model folder not found (train it first)")
    kind = kind_of_source(source, method)
    texts = list(label_texts)
    with atomic_dir(out_dir) as tmp:
        section = predictor_class(kind, source).build(source, tmp, texts, dict(options or {}))
        return finish_package(tmp, section, name=name, method=method, label_uids=label_uids, label_texts=texts,
                              params=params, dataset=dataset, metrics=metrics, training=training, repo=repo)


# ------------------------------------------------------------------------------------------------
# loading and predicting
# ------------------------------------------------------------------------------------------------
def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not root.exists():
        raise ConfigError(f"{root}: model package not found")
    if not root.is_dir():
        raise ConfigError(f"{root}: not a model package (a file, expected a folder with {MANIFEST})")
    if not path.is_file():
        raise DataFormatError(path, None, "missing: not a model package (build one with the package stage)")
    m = read_json_file(path, "a package manifest")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataFormatError(path, None, f"not an {FORMAT} manifest")
    v = m.get("format_version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= FORMAT_VERSION:
        raise DataFormatError(path, None, f"format_version {v!r} is not one this xmc reads (1..{FORMAT_VERSION})")
    for key, typ in (("name", str), ("method", str), ("predictor", dict), ("labels", dict), ("files", dict)):
        if not isinstance(m.get(key), typ):
            raise DataFormatError(path, None, f"'{key}' missing or not a {typ.__name__}")
    return m


def check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= MAX_K:
        raise InputError(f"k must be an integer in [1, {MAX_K}] (got {k!r})")
    return int(k)


def check_texts(texts: Any) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)):
        raise InputError(f"texts must be a list of strings (got {type(texts).__name__})")
    out = []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputError(f"text {i} is not a string (got {type(t).__name__})")
        if not t.strip():
            raise InputError(f"text {i} is empty")
        out.append(t.strip())
    return out


class ModelPackage:
    """A loaded model package: ``predict(texts, k)`` → ranked labels with uids, texts and scores."""

    def __init__(self, root: Path, manifest: dict[str, Any], label_uids: list[str], label_texts: list[str],
                 predictor: Predictor) -> None:
        self.root, self.manifest = root, manifest
        self.label_uids, self.label_texts = label_uids, label_texts
        self.predictor = predictor

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def method(self) -> str:
        return self.manifest["method"]

    @property
    def n_labels(self) -> int:
        return len(self.label_uids)

    @property
    def labels_sha256(self) -> str:
        return self.manifest["labels"]["sha256"]

    def topk(self, texts: Sequence[str] | str, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """(scores, label ids), each (n, min(k, labels)); ids are -1 where fewer labels exist."""
        texts, k = check_texts(texts), check_k(k)
        k = min(k, self.n_labels)  # a small label set: all of its labels, ranked
        if not texts:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        return self.predictor.search(texts, k)

    def predict(self, texts: Sequence[str] | str, k: int = 10) -> list[list[Prediction]]:
        """Top-k labels of each text, best first."""
        D, I = self.topk(texts, k)
        return [[Prediction(self.label_uids[i], int(i), self.label_texts[i], float(s)) for i, s in zip(ids, scores)
                 if i >= 0] for ids, scores in zip(I, D)]

    def predict_stream(self, items: Iterable[tuple[str, str]], k: int = 10,
                       batch_size: int = 256) -> Iterator[tuple[str, str, list[Prediction]]]:
        """(id, text, labels) for a stream of (id, text), ``batch_size`` texts at a time (bounded memory)."""
        k = check_k(k)
        batch: list[tuple[str, str]] = []
        for item in items:
            batch.append(item)
            if len(batch) >= batch_size:
                yield from self._emit(batch, k)
                batch = []
        if batch:
            yield from self._emit(batch, k)

    def _emit(self, batch: list[tuple[str, str]], k: int) -> Iterator[tuple[str, str, list[Prediction]]]:
        preds = self.predict([t for _, t in batch], k)
        for (uid, text), p in zip(batch, preds):
            yield uid, text, p

    def info(self) -> dict[str, Any]:
        """The manifest without its file list, plus where the package is and what its scores mean."""
        m = {k: v for k, v in self.manifest.items() if k != "files"}
        m["path"] = str(self.root)
        m["score"] = score_meaning(self.manifest["predictor"])
        m["bytes"] = sum(int(f.get("bytes", 0)) for f in self.manifest["files"].values())
        return m

    def __repr__(self) -> str:
        return f"ModelPackage({self.name!r}, method={self.method!r}, labels={self.n_labels}, path={str(self.root)!r})"


# What a prediction's score is, per predictor kind: every score ranks (higher first); none is a probability
SCORE_MEANING = {
    "dense": "inner product of the text's vector and the label's vector (cosine where the encoder normalises; ASTRA:"
             " the label classifier's logit w·x + b)",
    "unidec": "inner product of the text's and the label's vectors in the package's space (UniDEC: the encoder's"
              " and the classifier's scores together)",
    "shortlist": "the base predictor's inner product, over the text's TF-IDF shortlist",
    "tfidf_zeroshot": "cosine of the TF-IDF vectors of the text and of the label's text, in [0, 1]",
    "tfidf_knn": "the sum, over the text's nearest training texts (TF-IDF cosine) that have the label, of "
                 "cosine ** power",
    "label_prior": "the label's number of training texts (the same for every text)",
    "label_names": "an ordering of the labels whose names the text contains (ranking zero_shot: longer, less "
                   "ambiguous, more specific names first; prior: log(1 + training count))",
    "hybrid": "the fusion's score of the label among the base run's top labels and the name matches (trained "
              "fusion: log-odds of boosted trees or a logistic regression, plus the first bonus; valtuned: the "
              "weighted sum of the name evidence and the run's score)",
}


def score_meaning(section: dict[str, Any]) -> str:
    """What the scores of a package with predictor section ``section`` are (``xmc info``, ``GET /model``)."""
    return SCORE_MEANING.get(str(section.get("kind")), "the method's raw score") + "; higher ranks first, not " \
        "a probability"


def _expected_label_hash(expect_labels: str | Path | None) -> str | None:
    """``expect_labels``: a label-set hash, or a labels file ({"uid","text"} JSON lines, e.g. lbl.jsonl)."""
    if expect_labels is None:
        return None
    s = str(expect_labels)
    if len(s) == 64 and all(c in "0123456789abcdef" for c in s):
        return s
    uids, texts = read_labels(Path(s))
    return label_set_sha256(uids, texts)


def load(path: str | Path, *, expect_labels: str | Path | None = None, verify: bool = False) -> ModelPackage:
    """Load a model package folder.

    ``expect_labels`` (a labels file or a label-set hash) refuses a package built for another label set;
    ``verify`` also checks every file's SHA-256 against the manifest (sizes are always checked)."""
    root = Path(path)
    manifest = read_manifest(root)
    mpath = root / MANIFEST
    for rel, meta in manifest["files"].items():
        f = root / rel
        if not isinstance(meta, dict) or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise DataFormatError(mpath, None, f"bad file entry {rel!r}")
        if not f.is_file():
            raise DataFormatError(f, None, "listed in the manifest but missing: an incomplete package (pull it again)")
        if f.stat().st_size != meta.get("bytes"):
            raise DataFormatError(f, None, f"{f.stat().st_size} bytes, the manifest says {meta.get('bytes')}: a corrupt "
                                  "or partly copied package")
        if verify and _file_sha256(f) != meta.get("sha256"):
            raise DataFormatError(f, None, "content does not match the manifest's SHA-256: a corrupt package")
    uids, texts = read_labels(root / manifest["labels"].get("file", LABELS))
    count, digest = manifest["labels"].get("count"), manifest["labels"].get("sha256")
    if len(uids) != count:
        raise DataFormatError(root / LABELS, None, f"{len(uids)} labels, the manifest says {count}")
    if label_set_sha256(uids, texts) != digest:
        raise DataFormatError(root / LABELS, None, "label uids/texts differ from the manifest's label-set hash")
    want = _expected_label_hash(expect_labels)
    if want is not None and want != digest:
        raise ConfigError(f"{root}: the package was built for another label set ({count} labels, hash {digest[:12]}) "
                          f"than the one expected ({str(expect_labels)[:80]}, hash {want[:12]})")
    section = manifest["predictor"]
    cls = predictor_class(section.get("kind"), mpath)
    if os.environ.get("XMC_PACKAGE_USE_GPU") in ("0", "false"):
        section = {**section, "use_gpu": False}
    try:
        predictor = cls.load(root, section, texts)
    except (ValueError, KeyError, TypeError, IndexError, EOFError, UnicodeDecodeError, zipfile.BadZipFile,
            pickle.UnpicklingError) as e:
        # a file that is not what its writer wrote (a pickle where arrays belong, a truncated archive, a hand-edited
        # config): named, in one line, never run (every reader refuses pickles)
        if isinstance(e, XMCError):
            raise
        first = (str(e).splitlines() or [""])[0][:160]
        raise DataFormatError(root, None, f"the {section.get('kind')} predictor cannot be loaded: "
                              f"{type(e).__name__}: {first} (a corrupt or foreign package)") from None
    return ModelPackage(root, manifest, uids, texts, predictor)


__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_K", "InputError", "ModelPackage", "Prediction", "build_package",
           "check_k", "check_texts", "code_version", "finish_package", "label_set_sha256", "load", "read_labels",
           "read_manifest"]
