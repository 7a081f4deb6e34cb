"""The model card of a package (``README.md`` next to its manifest) and of a trained encoder folder, in the Hugging
Face layout: YAML front matter (library, task, tags, dataset, metrics, licence, ``model-index``), then what the model
is, its intended and out-of-scope uses, its limits, its data and their licences, its numbers, how to use it and what
to cite. Everything is generated from the manifest (the settings, the dataset record, the metrics), so the card and
the manifest never disagree: a setting the manifest lacks is never described."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

CARD = "README.md"
CARD_METRICS = ("P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@10", "R@100", "unseen_R@100")
METHOD_NOTES = {
    "dexml": "a dual encoder trained with its loss and negatives as set below (DEXML)",
    "maclr": "a dual encoder pre-trained without labelled pairs (MACLR: zero-shot, from raw text only)",
    "maclr_fewshot": "a MACLR (or off-the-shelf) encoder fine-tuned on a few labels' pairs (MACLR few-shot)",
    "ramen": "a dual encoder regularised by graph metadata during training (RAMEN); no graph at inference",
    "unidec": "a dual encoder and per-label classifiers trained together (UniDEC)",
    "astra": "per-label classifiers over an encoder trained with them, negatives mined from an ANN index (ASTRA)",
    "pretrained": "an off-the-shelf sentence encoder, not trained here",
    "st_mnrl": "a sentence-transformers MultipleNegativesRankingLoss fine-tune (peer)",
    "label_prior": "the most frequent training labels, the same list for every text (baseline)",
    "tfidf_zeroshot": "TF-IDF cosine between the text and each label text (zero-shot baseline)",
    "tfidf_knn": "the labels of the text's nearest TF-IDF training neighbours (baseline)",
    "name_match": "the labels whose names occur in the text (the label-name retriever)",
    "hybrid": "a run's candidates united with the labels named in the text, re-scored by a fusion fit on validation",
    "ensemble": "an ensemble of several trained runs, each searched for its own top-k list",
}
# BibTeX of the paper each method comes from: titles, authors and venues as the seed papers and their notes give
# them (../shared/seeds, ../shared/methods); DEXML's seed is the anonymous submission, cited as ASTRA cites it [15]
_DEXML_BIB = """@inproceedings{gupta2024dualencoders,
  title     = {Dual-Encoders for Extreme Multi-label Classification},
  author    = {Gupta, Nilesh and Devvrit and Rawat, Ankit Singh and Bhojanapalli, Srinadh and Jain, Prateek and
               Dhillon, Inderjit S.},
  booktitle = {The Twelfth International Conference on Learning Representations, {ICLR} 2024},
  year      = {2024},
  url       = {https://openreview.net/forum?id=dNe1T0Ahby}
}"""
_MACLR_BIB = """@inproceedings{xiong2022extreme,
  title     = {Extreme Zero-Shot Learning for Extreme Text Classification},
  author    = {Xiong, Yuanhao and Chang, Wei-Cheng and Hsieh, Cho-Jui and Yu, Hsiang-Fu and Dhillon, Inderjit},
  booktitle = {Proceedings of the 2022 Conference of the North American Chapter of the Association for
               Computational Linguistics: Human Language Technologies ({NAACL} 2022)},
  year      = {2022},
  eprint    = {2112.08652},
  archivePrefix = {arXiv}
}"""
_RAMEN_BIB = """@misc{mittal2024graph,
  title     = {Graph Regularized Encoder Training for Extreme Classification},
  author    = {Mittal, Anshul and Mohan, Shikhar and Saini, Deepak and Asokan, Siddarth and Kumar, Lakshya and
               Malhotra, Pankaj and Jiao, Jian and Singh, Amit and Prabhu, Suchith Chidananda and Agarwal, Sumeet and
               Chakrabarti, Soumen and Kar, Purushottam and Varma, Manik},
  year      = {2024},
  eprint    = {2402.18434},
  archivePrefix = {arXiv}
}"""
_UNIDEC_BIB = """@inproceedings{kharbanda2025unidec,
  title     = {{UniDEC}: Unified Dual Encoder and Classifier Training for Extreme Multi-Label Classification},
  author    = {Kharbanda, Siddhant and Gupta, Devaansh and K, Gururaj and Malhotra, Pankaj and Singh, Amit and
               Hsieh, Cho-Jui and Babbar, Rohit},
  booktitle = {Proceedings of the ACM Web Conference 2025 (WWW '25)},
  year      = {2025},
  doi       = {10.1145/3696410.3714704},
  eprint    = {2405.03714},
  archivePrefix = {arXiv}
}"""
_ASTRA_BIB = """@misc{mehta2024astra,
  title     = {{ASTRA}: Accurate and Scalable {ANNS}-based Training of Extreme Classifiers},
  author    = {Mehta, Sonu and Mohan, Jayashree and Natarajan, Nagarajan and Ramjee, Ramachandran and Varma, Manik},
  year      = {2024},
  note      = {Microsoft Research India; preprint (the source text names no venue)}
}"""
PAPERS: dict[str, str] = {"dexml": _DEXML_BIB, "maclr": _MACLR_BIB, "maclr_fewshot": _MACLR_BIB, "ramen": _RAMEN_BIB,
                          "unidec": _UNIDEC_BIB, "astra": _ASTRA_BIB}
# the methods that come from no paper: a peer or a baseline of this project, said so on the card
NO_PAPER: dict[str, str] = {
    "pretrained": "no paper: an off-the-shelf encoder (peer); cite the encoder's own model card",
    "st_mnrl": "no paper: the sentence-transformers trainer with MultipleNegativesRankingLoss (peer)",
    "label_prior": "no paper: a baseline of this project",
    "tfidf_zeroshot": "no paper: a baseline of this project",
    "tfidf_knn": "no paper: a baseline of this project",
    "name_match": "no paper: this project's label-name retriever",
    "hybrid": "no paper: this project's fusion of a run with the label-name matches; cite the base run's method "
              "(its own package card)",
    "ensemble": "no paper: this project's ensemble of runs; cite the members' methods (their package cards)",
}
DUAL_ENCODERS = frozenset({"dexml", "maclr", "maclr_fewshot", "ramen", "unidec", "pretrained", "st_mnrl"})
ZERO_SHOT = frozenset({"maclr", "pretrained", "tfidf_zeroshot"})   # read no labelled (text, label) pair
SPLIT_NAMES = {"val": "validation", "tst": "test"}
_METRIC = re.compile(r"^(?:unseen_)?(?:P|nDCG|PSP|R)@\d+$")
# licence files: (pattern over the file name, then its first lines) -> SPDX id (None: not on the SPDX list), name
_LICENCES: tuple[tuple[str, str | None, str, str], ...] = (
    (r"apache[-_ ]?(?:license[-_ ,]*)?(?:version[-_ ]*)?2\.0|apache license", "Apache-2.0", "apache-2.0",
     "Apache License 2.0"),
    (r"wordnet", None, "wordnet-3.0", "WordNet 3.0 licence (Princeton University)"),
    (r"\bmit\b", "MIT", "mit", "MIT License"),
    (r"cc[-_ ]by[-_ ]sa[-_ ]4\.0|attribution-sharealike 4\.0", "CC-BY-SA-4.0", "cc-by-sa-4.0", "CC BY-SA 4.0"),
    (r"cc[-_ ]by[-_ ]4\.0|attribution 4\.0", "CC-BY-4.0", "cc-by-4.0", "CC BY 4.0"),
    (r"bsd", None, "bsd", "a BSD licence"),
    (r"gnu general public license|\bgpl", None, "gpl", "a GNU GPL licence"),
)
_MISSING = object()


# ------------------------------------------------------------------------------------------------
# the dataset's licences (recorded in the manifest by xmc.package.build.dataset_record)
# ------------------------------------------------------------------------------------------------
def _dataset_folder(source: str | Path | None) -> Path | None:
    """The dataset folder a manifest's ``dataset.source`` names: as given (the pipeline runs at the repository root),
    else relative to the repository this xmc lives in."""
    if not source:
        return None
    p = Path(source)
    for cand in (p, Path(__file__).resolve().parents[1] / p) if not p.is_absolute() else (p,):
        if cand.is_dir():
            return cand
    return None


def _licence_kind(path: Path) -> tuple[str | None, str, str]:
    head = path.name.lower()
    try:
        body = path.read_text(encoding="utf-8", errors="replace")[:3000].lower()
    except OSError:
        body = ""
    for text in (head, body):   # the file name first: it is the dataset maker's own label
        for pattern, spdx, slug, name in _LICENCES:
            if re.search(pattern, text):
                return spdx, slug, name
    return None, re.sub(r"\W+", "-", path.stem.lower()).strip("-"), f"the licence in {path.name}"


def _readme_statement(text: str) -> str | None:
    """The licence paragraph of a dataset README: a ``License.``/``Licence:`` bullet with its indented
    continuation lines, else the section under a ``## License`` heading."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*(?:[*-]\s+)?\*{0,2}licen[cs]e\*{0,2}\s*[.:]", line, re.I):
            out = [line]
            for nxt in lines[i + 1:]:
                if not nxt.strip() or not nxt.startswith((" ", "\t")) or re.match(r"^\s*[*-]\s", nxt):
                    break
                out.append(nxt)
            return _plain(" ".join(out))
        if re.match(r"^#+\s*licen[cs]e\s*$", line, re.I):
            body = []
            for nxt in lines[i + 1:]:
                if nxt.startswith("#"):
                    break
                body.append(nxt)
            return _plain(" ".join(body)) or None
    return None


def _plain(s: str) -> str:
    s = re.sub(r"^\s*[*-]\s+", "", s.strip())
    s = re.sub(r"\*\*(?:licen[cs]e)\.?\*\*[.:]?\s*", "", s, flags=re.I)
    return re.sub(r"\s+", " ", s.replace("**", "")).strip()


def _citation(text: str) -> str | None:
    m = re.search(r"```(?:bibtex|bib)\n(.*?)```", text, re.S)
    if m:
        return m.group(1).strip()
    m = re.search(r"Cite as:\s*\"([^\"]+)\"", text)
    return re.sub(r"\s+", " ", m.group(1)).strip() if m else None


def _parent_section(folder: Path) -> str:
    """This dataset's section (``## <name>/ ...``) of the README of the folder that holds it, where it has one."""
    readme = folder.parent / "README.md"
    if not readme.is_file():
        return ""
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.search(rf"^## {re.escape(folder.name)}\b.*?(?=^## |\Z)", text, re.M | re.S)
    return m.group(0) if m else ""


def dataset_licence(source: str | Path | None) -> dict[str, Any]:
    """What a manifest records of the licences of the data a model was trained on: the dataset folder's ``LICENSE*``
    / ``LICENCE*`` / ``COPYING*`` files (path as ``source`` gives it, SPDX id where there is one, name), the licence
    statement and citation of its README (or of its section in the README of the folder above: "Provenance:").
    ``{}`` when the folder cannot be found here."""
    folder = _dataset_folder(source)
    if folder is None:
        return {}
    files = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and re.match(r"^(?:licen[cs]e|copying)", p.name, re.I):
            spdx, slug, name = _licence_kind(p)
            files.append({"file": f"{Path(str(source)).as_posix()}/{p.name}", "spdx": spdx, "id": slug, "name": name})
    own = folder / "README.md"
    text = own.read_text(encoding="utf-8", errors="replace") if own.is_file() else ""
    section = _parent_section(folder)
    statement = _readme_statement(text) if text else None
    if statement is None and section:
        m = re.search(r"^Provenance:(.*?)(?:\n\s*\n|\Z)", section, re.M | re.S)
        statement = _plain(m.group(1)) if m else None
    rec: dict[str, Any] = {"files": files, "statement": statement,
                           "citation": _citation(text) or (_citation(section) if section else None)}
    if own.is_file():
        rec["readme"] = f"{Path(str(source)).as_posix()}/README.md"
    return rec


def _licence_front(lic: dict[str, Any], source: Any) -> dict[str, Any]:
    """HF's ``license`` keys: the one SPDX id where the data carry exactly one licence that has one, else ``other``
    with a name and a link to the dataset's licence files (or its README, or the folder: "unknown, see the data")."""
    files = lic.get("files") or []
    if len(files) == 1 and files[0].get("spdx"):
        return {"license": str(files[0]["spdx"]).lower(), "license_link": files[0]["file"]}
    if files:
        slugs = [str(f.get("id") or f.get("spdx") or "unknown").lower() for f in files]
        return {"license": "other", "license_name": "-and-".join(dict.fromkeys(slugs)), "license_link": files[0]["file"]}
    return {"license": "other", "license_name": "unknown-see-dataset",
            "license_link": lic.get("readme") or str(source or "unknown")}


def _licence_lines(lic: dict[str, Any], source: Any) -> list[str]:
    files = lic.get("files") or []
    out = ["The model is derived from its training data: its use is bound by the data's licences."]
    if files:
        out += [f"- `{f['file']}`: {f['name']}" + (f" (SPDX `{f['spdx']}`)" if f.get("spdx") else "") for f in files]
    else:
        out.append(f"- licence: unknown: see the dataset (`{lic.get('readme') or source or '?'}`); it ships no "
                   "licence file")
    if lic.get("statement"):
        out.append(f"- the dataset's own words: {lic['statement']}")
    return out


# ------------------------------------------------------------------------------------------------
# the method, from its settings: a fact is stated only where the manifest has the keys it needs
# ------------------------------------------------------------------------------------------------
def _get(d: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return _MISSING
        d = d[key]
    return d


def _has(*values: Any) -> bool:
    return all(v is not _MISSING for v in values)


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else f"{x:g}" if isinstance(x, float) else str(x)


def _epochs(n: Any) -> str:
    return "epoch" if n == 1 else f"{_n(n)} epochs"


def _encoder_fact(p: dict[str, Any], key: str = "encoder") -> list[str]:
    kind = _get(p, f"{key}.kind")
    if kind == "bow":
        dim, buckets, ngram = (_get(p, f"{key}.{k}") for k in ("dim", "n_buckets", "ngram_max"))
        parts = [f"{_n(dim)} dimensions" if _has(dim) else "", f"{_n(buckets)} hashed buckets" if _has(buckets) else "",
                 f"1- to {ngram}-grams" if _has(ngram) else ""]
        text = "a hashed bag-of-words encoder" + (f" ({', '.join(x for x in parts if x)})" if any(parts) else "")
    elif kind == "transformer":
        md, pool = _get(p, f"{key}.model_dir"), _get(p, f"{key}.pooling")
        # model_dir null is the shipped all-MiniLM-L6-v2 (xmc.encoders)
        name = (md or "all-MiniLM-L6-v2") if _has(md) else "a sentence-transformers model"
        text = f"a transformer sentence encoder (`{name}`" + (f", {pool} pooling" if _has(pool) else "") + ")"
    else:
        return []
    tied = _get(p, f"{key}.tied")
    if _has(tied):
        text += ", one encoder for texts and labels" if tied else ", separate text and label encoders"
    return [f"Encoder: {text}."]


def _train_fact(p: dict[str, Any], key: str = "train", what: str = "Training") -> list[str]:
    ep, bs, lr = (_get(p, f"{key}.{k}") for k in ("epochs", "batch_size", "lr"))
    cap = _get(p, f"{key}.max_steps_per_epoch")
    parts = [f"{_n(ep)} epoch{'s' if ep != 1 else ''}" if _has(ep) else "",
             f"batches of {_n(bs)} texts" if _has(bs) else "", f"learning rate {_n(lr)}" if _has(lr) else "",
             f"at most {_n(cap)} steps per epoch" if _has(cap) and cap else ""]
    return [f"{what}: {', '.join(x for x in parts if x)}."] if any(parts) else []


_LOSS_NAMES = {"decoupled_softmax": "DecoupledSoftmax (a softmax per positive whose denominator leaves out the "
                                    "query's other positives)",
               "softmax": "softmax cross-entropy over the candidates", "softtopk": "SoftTop-k",
               "bce": "binary cross-entropy", "triplet": "a triplet hinge"}


def _loss_fact(p: dict[str, Any], key: str = "loss", what: str = "Loss") -> list[str]:
    name = _get(p, f"{key}.name")
    if not _has(name):
        return []
    extra = [f"{k} {_n(v)}" for k in ("temperature", "margin", "k", "alpha") if (v := _get(p, f"{key}.{k}")) is not
             _MISSING and v is not None]
    return [f"{what}: {_LOSS_NAMES.get(name, f'`{name}`')}" + (f" ({', '.join(extra)})" if extra else "") + "."]


def _negatives_fact(p: dict[str, Any], key: str = "negatives") -> list[str]:
    kind = _get(p, f"{key}.kind")
    if not _has(kind):
        return []
    if kind == "in_batch":
        text = "in-batch only (each text's negatives are the other texts' positives in the batch)"
    elif kind == "all":
        text = "every label of the label file"
    elif kind == "hard":
        npq, size, every, start = (_get(p, f"{key}.{k}") for k in
                                   ("negatives_per_query", "shortlist_size", "refresh_every_epochs", "start_epoch"))
        text = "in-batch"
        if _has(npq, size):
            text += (f" plus {_n(npq)} hard negative{'s' if npq != 1 else ''} per query drawn from its top-{_n(size)} "
                     "labels under the encoder being trained (an ANN shortlist")
            text += f", re-mined every {_epochs(every)}" if _has(every) else ""
            text += (f", from epoch {_n(start)} on; in-batch only before" if _has(start) and start else "") + ")"
    else:
        text = f"`{kind}`"
    out = [f"Negatives: {text}."]
    nm = _get(p, f"{key}.name_match_per_query")
    if _has(nm) and nm and kind != "all":
        out.append(f"Also {_n(nm)} negative{'s' if nm != 1 else ''} per query among the labels named in the text.")
    maxp = _get(p, f"{key}.max_positives_per_query")
    if _has(maxp) and maxp:
        out.append(f"At most {_n(maxp)} positive{'s' if maxp != 1 else ''} per query per step.")
    if _get(p, f"{key}.positive_sampling") == "inverse_propensity":
        out.append("Positives are sampled by inverse propensity (tail labels more often).")
    return out


def _dexml(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    return [*_encoder_fact(p), *_loss_fact(p), *_negatives_fact(p), *_train_fact(p)]


def _astra(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    out = _encoder_fact(p)
    init, scale = _get(p, "model.init_classifiers"), _get(p, "model.init_scale")
    if _has(init):
        how = (f"from the label texts' embeddings" + (f" x {_n(scale)}" if _has(scale) else "")
               if init == "label_text" else "at random")
        out.append(f"Classifiers: one linear classifier per label (score w_l·Φ(x) + b_l), initialised {how}; trained "
                   "with the encoder by a sampled binary cross-entropy.")
    kh, kr = _get(p, "negatives.hard_negatives"), _get(p, "negatives.uniform_negatives")
    mine, every, start = (_get(p, f"negatives.{k}") for k in ("mine_with", "refresh_every_epochs", "start_epoch"))
    if _has(kh):
        if kh:
            index = {"classifiers": "the classifier vectors", "label_embeddings": "the label embeddings (ANCE-style)"}
            text = (f"Hard negatives: {_n(kh)} stale hard negatives per query from an ANN index over "
                    f"{index.get(mine, f'`{mine}`') if _has(mine) else 'the model'}")
            text += f", re-mined every {_epochs(every)}" if _has(every) else ""
            text += f" after the first {_epochs(start)}" if _has(start) and start else ""
            out.append(text + ".")
        else:
            out.append("Hard negatives: none (hard_negatives: 0).")
    if _has(kr):
        if kr:
            shared = " (one draw shared by the batch's queries)" if _get(p, "negatives.uniform_shared") is True else ""
            out.append(f"Uniform negatives: {_n(kr)} uniform negatives per query{shared}, each weighted "
                       "(L - k_h)/k_r so that the loss estimates the full one-vs-all loss.")
        else:
            out.append("Uniform negatives: none (uniform_negatives: 0): the loss after the warm-up is over the "
                       "positives and the hard negatives only.")
    if _has(kh, kr, start) and kh and start:
        # before the first refresh there is no index: the sampler fills the k_h slots at random (xmc.methods.astra)
        out.append(f"Warm-up: during the first {_epochs(start)}, before the first index refresh, the {_n(kh + kr)} "
                   "negatives of a query are drawn at random among all labels.")
    tau = _get(p, "model.logit_adjustment")
    if _has(tau) and tau:
        out.append(f"Post-hoc logit adjustment: b_l -= {_n(tau)}·log(1 + n_l), n_l the label's training count.")
    return [*out, *_train_fact(p)]


def _ramen(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    out = [*_encoder_fact(p), *_loss_fact(p, what="Task loss"), *_negatives_fact(p)]
    sets = _get(p, "regulariser.sets")
    if _has(sets) and not sets:
        out.append("Graph regularisers: none (regulariser.sets: []): the no-graph baseline, a plain dual encoder.")
    elif _has(sets):
        sides = []
        for flag, lam, what in (("label_graph", "lambda_z", "label-anchor R_z"), ("query_graph", "lambda_x",
                                                                                  "query-anchor R_x")):
            on, weight = _get(p, f"regulariser.{flag}"), _get(p, f"regulariser.{lam}")
            if _has(on):
                sides.append(f"{what} " + ((f"on (λ = {_n(weight)})" if _has(weight) else "on") if on and weight != 0
                                           else f"off ({flag}: {str(on).lower()})" if not on else f"off ({lam}: 0)"))
        rl, margin = _get(p, "regulariser.loss"), _get(p, "regulariser.margin")
        how = (f"; {rl} loss" + (f" (margin {_n(margin)})" if rl == "triplet" and _has(margin) else "")) if _has(rl) \
            else ""
        out.append(f"Graph regularisers over the anchor sets {', '.join(f'`{s}`' for s in sets)} (those whose inputs "
                   f"the dataset has): {', '.join(sides) or 'sides not recorded'}{how}. The graphs are read in "
                   "training only; inference is a plain dual encoder.")
    on, thr, warm, every = (_get(p, f"pruning.{k}") for k in ("enabled", "threshold", "warmup_epochs", "every_epochs"))
    if _has(on) and not on:
        out.append("Graph pruning: off.")
    elif _has(on):
        text = "Graph pruning: edges whose cosine under the current encoder is" + (f" <= {_n(thr)}" if _has(thr) else
                                                                                  " low") + " are dropped"
        text += f" after {_epochs(warm)}" if _has(warm) else ""
        text += f", then every {_epochs(every)}" if _has(every) else ""
        out.append(text + ".")
    return [*out, *_train_fact(p)]


def _space(pred: dict[str, Any]) -> Any:
    for section in (pred, pred.get("base") if isinstance(pred.get("base"), dict) else {}):
        if "space" in section:
            return section["space"]
    return _MISSING


def _unidec(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    out = _encoder_fact(p)
    dim, init = _get(p, "model.dim"), _get(p, "model.init_classifier")
    if _has(dim) or _has(init):
        text = "Heads: a dual-encoder head and a classifier head (one vector Ψ_l per label)"
        text += f", {_n(dim)} dimensions each" if _has(dim) else ""
        text += (", Ψ initialised from the label texts" if init == "label_text" else ", Ψ initialised at random") \
            if _has(init) else ""
        out.append(text + ".")
    beta, eta, size = (_get(p, f"psl.{k}") for k in ("max_positives_per_query", "negatives_per_query", "shortlist_size"))
    if _has(beta, eta):
        out.append("Batches (pick-some-labels): " + (f"at most {_n(beta)} positives" if beta else "all positives")
                   + f" and {_n(eta)} hard negatives per query" + (f" from its top-{_n(size)} shortlist" if _has(size)
                                                                   else "")
                   + ", the other labels of the batch's pool as negatives.")
    lam, bce = _get(p, "loss.lam"), _get(p, "loss.bce_weight")
    if _has(lam):
        out.append(f"Loss: λ = {_n(lam)} between the dual-encoder and the classifier losses"
                   + (f", auxiliary BCE weight {_n(bce)}" if _has(bce) and bce else "") + ".")
    space = _space(pred)
    spaces = {"concat": "the concatenated index [DE ⊕ normalised Ψ] (both heads)",
              "de": "the dual-encoder head only", "clf": "the classifier head only"}
    if _has(space):
        out.append(f"Retrieval space: {spaces.get(space, f'`{space}`')} (space: {space}).")
    return [*out, *_train_fact(p)]


def _maclr(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    out = [*_encoder_fact(p), "Zero-shot: trained on the raw texts of the training instances and of the labels; no "
                              "labelled (text, label) pair is read."]
    mac, reg = _get(p, "stage1.mac"), _get(p, "stage1.label_reg")
    if _has(mac) or _has(reg):
        parts = []
        if _has(mac):
            k0, tk = _get(p, "stage1.k0"), _get(p, "stage1.t_k")
            parts.append((f"multi-scale adaptive clustering" + (f" from {_n(k0)} clusters" if _has(k0) else "")
                          + (f", doubled every {_n(tk)} steps" if _has(tk) else "")) if mac
                         else "instance-level ICT throughout (mac: false)")
        if _has(reg):
            ln = _get(p, "stage1.label_negatives")
            parts.append(("label regularisation" + (f" ({_n(ln)} random labels per step)" if _has(ln) else ""))
                         if reg else "no label regularisation (label_reg: false)")
        out.append(f"Stage I: {'; '.join(parts)}.")
    dense, sparse, view, k = (_get(p, f"stage2.{x}") for x in ("dense_k", "sparse", "sparse_view", "sparse_k"))
    if _has(dense) or _has(sparse):
        views = []
        if _has(dense) and dense:
            views.append(f"the Stage-I encoder's top-{_n(dense)} labels")
        if _has(sparse) and sparse:
            vname = {"label_names": "the labels named in the text", "tfidf": "TF-IDF text-to-label-text matches"}
            views.append(f"{vname.get(view, 'the sparse view') if _has(view) else 'the sparse view'}"
                         + (f" (top {_n(k)})" if _has(k) else ""))
        sel = _get(p, "stage2.select")
        out.append("Stage II: self-training on pseudo pairs from " + (" and ".join(views) or "no view (both off)")
                   + (f" ({sel})" if _has(sel) and len(views) > 1 else "") + ".")
    out += _loss_fact(p, "stage2.loss", "Stage II loss")
    return [*out, *_train_fact(p, "stage1.train", "Stage I training"), *_train_fact(p, "stage2.train",
                                                                                     "Stage II training")]


def _fewshot(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    init, ratio = _get(p, "init"), _get(p, "ratio")
    out = []
    if _has(init) or _has(ratio):
        text = "Few-shot: the encoder " + (f"`{init}`" if _has(init) and init else "it starts from")
        text += (f" fine-tuned on the ground-truth pairs of {ratio:.0%} of the labels (with training instances)"
                 if _has(ratio) else " fine-tuned on the pairs of a few labels")
        out.append(text + ".")
    return [*out, *_loss_fact(p), *_negatives_fact(p), *_train_fact(p)]


def _pretrained(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    return [*_encoder_fact(p), "Not trained here: zero-shot, text against label text."]


def _st_mnrl(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    b = _get(p, "budget_of")
    return ["Loss: MultipleNegativesRankingLoss (in-batch negatives), by the sentence-transformers trainer"
            + (f", on the budget of run `{b}`" if _has(b) and b else "") + "."]


def _tfidf_knn(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    n, power = _get(p, "n_neighbors"), _get(p, "power")
    n = n if _has(n) else pred.get("n_neighbors", _MISSING)
    power = power if _has(power) else pred.get("power", _MISSING)
    return [f"Each of the {_n(n)} nearest training texts (TF-IDF cosine) votes for its labels"
            + (f" with cosine ** {_n(power)}" if _has(power) else "") + "."] if _has(n) else []


def _name_match(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    r = _get(p, "ranking")
    ways = {"zero_shot": "longer and less ambiguous matches first, no training data (zero-shot)",
            "prior": "by training frequency"}
    return [f"Ranking of the matched labels: {ways.get(r, f'`{r}`')} (ranking: {r})."] if _has(r) else []


def _hybrid(p: dict[str, Any], pred: dict[str, Any]) -> list[str]:
    members = [m.get("name") for m in pred.get("members") or [] if isinstance(m, dict)]
    bases = _get(p, "bases")
    runs = members or (bases if _has(bases) and isinstance(bases, list) else [])
    k = pred.get("base_k")
    cands = (f"the top-{_n(k)} labels of " if k else "the top labels of ") + (
        " and of ".join(f"run `{r}`" for r in runs) if runs else "its base run")
    mode, words = _get(p, "label_names.mode"), _get(p, "label_names.max_words")
    read = pred.get("label_names")   # the mode the package resolved (auto -> prefix, identifier or text)
    how = ([f"names read as `{read}`" + (f" (label_names.mode: {mode})" if _has(mode) and mode != read else "")]
           if read else [f"label_names.mode: {mode}"] if _has(mode) else []) + (
        [f"up to {_n(words)} words"] if _has(words) else [])
    names = "the labels whose names occur in the text" + (f" ({', '.join(how)})" if how else "")
    out = [f"{'Members' if members else 'Candidates'}: {cands}, united with {names}."]
    fusion = _get(p, "fusion")
    if fusion == "valtuned":
        out.append("Fusion: tuned on validation: the name evidence plus a bonus for a named label plus a weight times the run's "
                   "score; the two weights chosen on the validation split, no training label read.")
    elif _has(fusion):
        what = {"boosted_trees": "gradient-boosted trees", "logistic": "a logistic regression"}.get(fusion, f"`{fusion}`")
        folds = _get(p, "hybrid.cross_fit_folds")
        out.append(f"Fusion: {what} (hybrid.fusion: {fusion}) over "
                   f"{'every member' if members else 'the run'}'s score and the name features, fit on the validation "
                   "split" + (f"; its validation numbers are cross-fitted over {_n(folds)} folds of "
                                                "validation documents" if _has(folds) else "") + ".")
    grid = _get(p, "hybrid.valtuned.first_bonus" if fusion == "valtuned" else "hybrid.first_bonus")
    if _has(grid) and isinstance(grid, list) and any(grid):
        out.append("First-label bonus: the log-odds added to the label the run ranks first, chosen on cross-fitted "
                   f"validation P@1 among {', '.join(_n(g) for g in grid)}.")
    keep = _get(p, "hybrid.keep_base_below_k")
    if _has(keep) and keep and not members:
        out.append(f"Guard: where the fusion's cross-fitted validation P@{_n(keep)} is below the run's, the hybrid keeps "
                   "the run's ranking.")
    return out


DESCRIBERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
    "dexml": _dexml, "astra": _astra, "ramen": _ramen, "unidec": _unidec, "maclr": _maclr,
    "maclr_fewshot": _fewshot, "pretrained": _pretrained, "st_mnrl": _st_mnrl, "tfidf_knn": _tfidf_knn,
    "name_match": _name_match, "hybrid": _hybrid, "ensemble": _hybrid}


def method_facts(method: str, params: dict[str, Any], predictor: dict[str, Any] | None = None) -> list[str]:
    """The card's description of a run, one sentence per setting it reads from ``params`` (the run's settings as
    the manifest records them) and ``predictor`` (the package's predictor section). No key, no sentence."""
    pred = predictor or {}
    describe = DESCRIBERS.get("hybrid" if pred.get("kind") == "hybrid" else method)
    facts = describe(params or {}, pred) if describe else []
    return facts or ["The run's settings are not recorded in the manifest: the card describes none."]


def citation(method: str) -> str:
    """The BibTeX block of the method's paper, or the explicit "no paper" line of a peer or baseline."""
    if method in PAPERS:
        return "```bibtex\n" + PAPERS[method] + "\n```"
    return NO_PAPER.get(method, f"no paper recorded for method `{method}`")


def _is_zero_shot(method: str, params: dict[str, Any]) -> bool:
    return method in ZERO_SHOT or (method == "name_match" and params.get("ranking") == "zero_shot")


# ------------------------------------------------------------------------------------------------
# front matter
# ------------------------------------------------------------------------------------------------
def _metric_names(metrics: dict[str, Any]) -> list[str]:
    seen = [k for s in SPLIT_NAMES if isinstance(metrics.get(s), dict) for k, v in metrics[s].items()
            if _METRIC.match(k) and isinstance(v, int | float) and not isinstance(v, bool)]
    return [k for k in CARD_METRICS if k in seen] + sorted(set(seen) - set(CARD_METRICS), key=seen.index)


def model_index(name: str, metrics: dict[str, Any], dataset: str, task: str = "text-classification",
                note: str = "") -> list[dict[str, Any]]:
    """HF's ``model-index``: one result per split with every metric the manifest has, values as recorded."""
    results = []
    for split, long in SPLIT_NAMES.items():
        m = metrics.get(split)
        names = [k for k in _metric_names({split: m})] if isinstance(m, dict) else []
        if names:
            results.append({"task": {"type": task, "name": "Extreme multi-label classification"},
                            "dataset": {"name": dataset, "type": dataset, "split": long},
                            "metrics": [{"type": k, "value": m[k], "name": f"{k} ({long}{note})"} for k in names]})
    return [{"name": name, "results": results}] if results else []


def front_matter(meta: dict[str, Any]) -> str:
    # safe_dump quotes whatever YAML would read as another type (a "P@1"-like key stays a string)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=120) + "---\n"


def split_front_matter(card: str) -> tuple[dict[str, Any], str]:
    """(the front matter, parsed, the Markdown after it) of a card."""
    if not card.startswith("---\n"):
        return {}, card
    head, _, body = card[4:].partition("\n---\n")
    return yaml.safe_load(head) or {}, body.lstrip("\n")


def _tags(method: str, pred_kind: str | None, extra: Sequence[str] = ()) -> list[str]:
    tags = ["xmc", *extra, "extreme-multi-label-classification", method]
    if method in DUAL_ENCODERS or pred_kind == "unidec":
        tags.append("dual-encoder")
    if method in ("astra", "unidec"):
        tags.append("one-vs-all-classifiers")
    if pred_kind == "hybrid" or method == "hybrid":
        tags += ["hybrid", "label-name-matching"]
    if method in ZERO_SHOT:
        tags.append("zero-shot")
    return list(dict.fromkeys(tags))


def _dataset_name(source: Any) -> str:
    return Path(str(source)).name if source else "unknown"


# ------------------------------------------------------------------------------------------------
# the cards
# ------------------------------------------------------------------------------------------------
def _table(metrics: dict[str, Any]) -> list[str]:
    splits = [s for s in ("val", "tst") if metrics.get(s)]
    if not splits:
        return ["No metrics recorded."]
    names = {"val": "validation", "tst": "test"}
    lines = ["| split | " + " | ".join(CARD_METRICS) + " |", "|" + "---|" * (len(CARD_METRICS) + 1)]
    for s in splits:
        m = metrics[s]
        cells = [f"{m[k]:.1f}" if isinstance(m.get(k), int | float) else "–" for k in CARD_METRICS]
        lines.append(f"| {names[s]} ({m.get('n_test', '?')} instances) | " + " | ".join(cells) + " |")
    return lines


def training_record(summary: dict[str, Any]) -> dict[str, Any]:
    """What a package manifest keeps of a training summary: the fields ``training_budget`` reads (per-stage step
    counts and the machine's name for two-stage MACLR), not the whole record."""
    rec = {k: summary[k] for k in ("train_seconds", "epochs", "steps", "device") if k in summary}
    for key in ("stage1", "stage2"):
        if isinstance(summary.get(key), dict) and "steps" in summary[key]:
            rec[key] = {"steps": summary[key]["steps"]}
    machine = summary.get("machine") or {}
    if machine.get("cpu"):
        rec["machine"] = {k: machine[k] for k in ("cpu", "cores") if k in machine}
    return rec


def training_budget(summary: dict[str, Any]) -> str:
    """The card's training line ("6 epochs, 330 steps, 35.58 s on cpu") from a training summary. MACLR trains in
    two stages, each with its own step count, and records the machine but no device: the line reads those instead
    of showing "?"."""
    stages = [(label, summary[key]) for key, label in (("stage1", "Stage I"), ("stage2", "Stage II"))
              if isinstance(summary.get(key), dict)]
    if stages:
        parts = [f"{label} {st.get('steps', '?')} steps" for label, st in stages]
    else:
        parts = [f"{summary[k]} {k}" for k in ("epochs", "steps") if k in summary]
    parts.append(f"{summary.get('train_seconds', '?')} s")
    device = summary.get("device")
    if device is None:
        machine = summary.get("machine") or {}
        device = f"{machine['cpu']} ({machine.get('cores', '?')} cores)" if machine.get("cpu") else None
    # an ensemble records only the sum of its members' seconds: say no more than that
    return ", ".join(parts) + (f" on {device}" if device else " of training")


def _uses(name: str, n_labels: Any, dsname: str, method: str, params: dict[str, Any], hybrid: bool,
          lic: dict[str, Any]) -> list[str]:
    labels = f"{n_labels:,}" if isinstance(n_labels, int) else str(n_labels)
    intended = [
        "## Intended use", "",
        f"- Ranking, for a text of the same kind and domain as the training texts of `{dsname}`, the {labels} labels "
        "of this package's label file: top-k tagging, or candidate labels for a person or a downstream ranker to "
        "check.",
        f"- Comparing extreme multi-label methods on `{dsname}`: the settings, data hashes and code version are in "
        "`manifest.json`.", "",
        "## Out-of-scope use", "",
        "- Predicting labels that are not in the label file: they are never returned (a new label set needs a new "
        "package).",
        "- Reading the scores as probabilities or thresholding them into yes/no decisions: they rank labels and are "
        "not calibrated.",
        "- Texts in another language or domain than the training data, without first measuring the model on "
        "labelled data from there.",
        "- Decisions about people, or any use where a wrong label does harm, without human review.",
    ]
    if lic.get("statement"):
        intended.append("- Any use the data's licence does not allow (see Training data).")
    limits = [
        "", "## Limitations", "",
        "- Labels outside the package's label file cannot be predicted.",
        "- Language and domain: the numbers below hold for texts like the test split's; a text in another language "
        "or domain gets no guarantee from them.",
    ]
    if hybrid and params.get("fusion") == "valtuned":
        bases = ", ".join(f"`{b}`" for b in params.get("bases") or []) or "its base run"
        limits.append("- Validation-tuned fusion: the fusion reads no training label, but its two weights were chosen on "
                      "the labelled validation split, so the row is not zero-shot; what its run read depends on "
                      f"{bases} (its card).")
    elif _is_zero_shot(method, params):
        limits.append("- Zero-shot row: the model reads no labelled (text, label) pair of the training split, but its "
                      "settings were chosen on the labelled validation split, "
                      "so its numbers are those of a tuned zero-shot method, not of one that never saw a label.")
    else:
        limits.append("- Labels with few or no training instances rely on their text alone: see unseen R@100 below.")
    if hybrid:
        limits.append("- The hybrid depends on label names: it gains only where the texts say their labels' names. "
                      "Where names rarely occur in the texts (item -> related-item data, identifiers), the name "
                      "matches add little and the hybrid is about as good as its run; a misspelt or renamed label "
                      "is not matched.")
    return [*intended, *limits]


def model_card(manifest: dict[str, Any]) -> str:
    """Markdown card of one package from its manifest (before the ``files`` section is added): YAML front matter in
    the Hugging Face layout, then the sections."""
    name, method = manifest["name"], manifest["method"]
    ds, tr, params = manifest.get("dataset") or {}, manifest.get("training") or {}, manifest.get("params") or {}
    pred = manifest.get("predictor") or {}
    metrics = manifest.get("metrics") or {}
    lic = ds.get("licence") or {}
    dsname = _dataset_name(ds.get("source"))
    hybrid = pred.get("kind") == "hybrid" or method == "hybrid"
    meta: dict[str, Any] = {
        "library_name": "xmc", "pipeline_tag": "text-classification", "tags": _tags(method, pred.get("kind")),
        "datasets": [dsname], "metrics": _metric_names(metrics), **_licence_front(lic, ds.get("source")),
        "model-index": model_index(name, metrics, dsname)}
    if not meta["model-index"]:
        del meta["model-index"]
    what = METHOD_NOTES.get("hybrid" if hybrid else method, f"the {method} method")
    settings = {k: v for k, v in params.items() if k not in ("run", "method", "index")}
    n_labels = manifest["labels"]["count"]
    lines = [
        front_matter(meta) + f"# {name}", "",
        f"An extreme multi-label classifier: given a text, it ranks {n_labels:,} labels. It is {what}; predictor "
        f"kind `{pred.get('kind', '?')}`.", "",
        "## Model description", "",
        *(f"- {fact}" for fact in method_facts(method, params, pred)), "",
        *_uses(name, n_labels, dsname, method, params, hybrid, lic), "",
        "## Training data", "",
        f"- dataset: `{ds.get('source', '?')}`; {ds.get('train_instances', '?')} training instances",
        f"- training and validation files: {', '.join(ds.get('files', []))} (sha256 `{str(ds.get('sha256', ''))[:16]}…`)",
        f"- labels: `{manifest['labels'].get('file', 'labels.jsonl')}` (sha256 `{manifest['labels']['sha256'][:16]}…`)",
        "- choices were made on the validation split; the test split was read only to report the numbers below", "",
        "### Licence", "", *_licence_lines(lic, ds.get("source")), "",
        "## Evaluation", "",
        *_table(metrics), "",
        "Percentages. PSP: propensity-scored precision (Jain et al. 2016, A = 0.55, B = 1.5); unseen R@100: recall "
        "over test pairs whose label has no training instance.", "",
        "## How to use", "",
        "```bash",
        f"xmc info {name}                              # this package under packages/, or give its path",
        f"xmc predict {name} --input texts.txt -k 10   # one JSON line per text",
        f"xmc serve {name}                             # HTTP on 127.0.0.1:8000",
        "```", "",
        "```python",
        "import xmc",
        f"model = xmc.load('packages/{name}')",
        "scores, label_ids = model.topk(['a sentence to tag'], k=10)",
        "```", "",
        "## Training", "",
        f"- run `{params.get('run', name)}`, method `{method}`; "
        + (training_budget(tr) if tr else "no training (a baseline or an off-the-shelf model)"),
        f"- code: xmc {manifest.get('code', {}).get('xmc', '?')}, git `{manifest.get('code', {}).get('git', '?')}`",
        "", "Settings (from params.yaml):", "", "```json", json.dumps(settings, indent=2, default=str)[:6000], "```", "",
        "## Citation", "", citation(method),
    ]
    if lic.get("citation"):
        lines += ["", f"The data: {lic['citation']}"]
    return "\n".join(lines) + "\n"


def encoder_card(run: str, method: str, config: dict[str, Any], summary: dict[str, Any], dataset: str, *,
                 licence: dict[str, Any] | None = None) -> str:
    """The card of a trained encoder folder (``models/<run>/README.md``), in place of the generic one that
    sentence-transformers writes: what trained it, on what (``dataset``: the dataset folder), with which settings.
    Test metrics come later, with the package (``packages/<run>/README.md``). ``licence``: the data's licence record
    (default: read from the dataset folder, :func:`dataset_licence`)."""
    last = summary.get("last_validation") or {}
    val = ", ".join(f"{k} {last[k]:.1f}" for k in ("P@1", "P@5", "PSP@5", "R@100") if isinstance(last.get(k), int | float))
    lic = dataset_licence(dataset) if licence is None else licence
    dsname = _dataset_name(dataset)
    last_metrics = {"val": {k: v for k, v in last.items() if _METRIC.match(k)}} if last else {}
    # library_name holds one library: the folder loads with sentence-transformers; xmc is a tag
    meta: dict[str, Any] = {
        "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
        "tags": _tags(method, None, ("sentence-transformers", "sentence-similarity")), "datasets": [dsname],
        "metrics": _metric_names(last_metrics), **_licence_front(lic, dataset),
        "model-index": model_index(run, last_metrics, dsname, "sentence-similarity", ", end of training")}
    if not meta["model-index"]:
        del meta["model-index"]
    lines = [
        front_matter(meta) + f"# {run}: a sentence encoder trained by xmc", "",
        f"Trained by the xmc run `{run}` ({METHOD_NOTES.get(method, method)}) on `{dataset}`; "
        f"{training_budget(summary)}." + (f" Validation at the end of training: {val}." if val else ""), "",
        "## Model description", "", *(f"- {fact}" for fact in method_facts(method, config)), "",
        "## Intended use", "",
        "- Embedding texts and label texts of the training data's kind for the xmc model package built from it; "
        "ranking labels needs the label index and the labels too.", "",
        "## Out-of-scope use", "",
        "- General-purpose sentence similarity, or texts of another language or domain, without measuring it there.",
        "", "## Limitations", "",
        "- Any validation numbers above were measured during training (on at most `train.val_max_instances` "
        "validation texts); the package card has the test metrics.",
        "- Labels outside the dataset's label file were never seen; the encoder alone ranks no labels.",
        "", "## Training data", "", f"- dataset: `{dataset}`", "", "### Licence", "", *_licence_lines(lic, dataset), "",
        "## How to use", "",
        # its pooling is a setting (the description says it where the settings have it), not a constant
        "It loads as a sentence-transformers model (`SentenceTransformer(path)`). Ranking labels needs the label "
        "index and the labels too: use the model package "
        f"`packages/{run}/` (its card has the test metrics) with `xmc.load`, `xmc predict` or `xmc serve`.", "",
        "Settings (from params.yaml):", "", "```json", json.dumps(config, indent=2, default=str)[:6000], "```", "",
        "## Citation", "", citation(method),
    ]
    if lic.get("citation"):
        lines += ["", f"The data: {lic['citation']}"]
    return "\n".join(lines) + "\n"
