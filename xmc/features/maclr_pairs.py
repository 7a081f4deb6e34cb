"""MACLR's pseudo pairs from raw text -> ``data/maclr_pairs``: instance and label texts only (never a label matrix),
the ICT pairs, the TF-IDF top-k and the label-name view, which is all the zero-shot training reads."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from xmc.baselines.tfidf import fit_tfidf
from xmc.data.formats import json_split_file, read_json_lines
from xmc.io import write_json
from xmc.lexical import LabelNameMatcher, parse_label_names, zero_shot_name_topk
from xmc.logs import kv
from xmc.maclr.corpus import load_texts_only
from xmc.maclr.pseudo import PseudoPairs, ict_pairs_from_groups, ict_pairs_from_titles, tfidf_topk
from xmc.workspace import Workspace

log = logging.getLogger(__name__)


def _raw_titles(ws: Workspace, uids: list[str]) -> tuple[list[str], list[str]] | None:
    """(titles, contents) of the training instances ``uids`` from the raw JSON-lines training file when the
    dataset has titles; matched by uid, since ingest may have carved the validation split out of that file. The
    records' label fields are dropped as they are read."""
    meta = json.loads((ws.processed / "source.json").read_text(encoding="utf-8"))
    if meta.get("layout") != "jsonl" or "title" not in (meta.get("text_fields") or []):
        return None
    src = json_split_file(meta["source"], "trn")
    if src is None:   # the source folder moved since ingest: the neighbouring-sentence view instead
        return None
    # the uid rule of the JSON-lines loader: the record's "uid", else its row number
    by_uid = {str(r.get("uid", i)): (r.get("title") or "", r.get("content") or "")
              for i, (_, r) in enumerate(read_json_lines(src))}
    if not all(u in by_uid for u in uids):
        return None
    return [by_uid[u][0] for u in uids], [by_uid[u][1] for u in uids]


def _label_name_view(texts: list[str], label_texts: list[str], params: dict[str, Any]) -> tuple[Any, Any, str]:
    """(ids, scores, how the names were parsed) of the labels whose names occur in each instance (zero-shot
    ranking, top ``maclr_pairs.names_k``; None, None with k = 0). Where labels have no names apart from their
    text (mode ``text``: titles), the whole text is the name: the view then holds the exact title matches."""
    k = int(params["maclr_pairs"]["names_k"])
    names = parse_label_names(label_texts, params["label_names"]["mode"])
    if k == 0:
        return None, None, names.mode
    matcher = LabelNameMatcher(names, params["label_names"]["max_words"], label_texts,
                               params["label_names"]["cased_names"])
    ids, scores = zero_shot_name_topk(matcher, texts, k)
    return ids, scores, names.mode


def make_maclr_pairs(params: dict[str, Any], ws: Workspace) -> tuple[PseudoPairs, dict[str, float]]:
    """The pseudo pairs from instance and label *texts* only (``load_texts_only``: never a label matrix)."""
    cfg = params["maclr_pairs"]
    corpus = load_texts_only(ws.processed)
    t0 = time.perf_counter()
    titled = _raw_titles(ws, corpus.uids)
    if titled is not None:
        ict = ict_pairs_from_titles(*titled, remove_title_prob=float(cfg["title_remove_prob"]), seed=int(cfg["seed"]))
        ict_kind = "title"
    elif corpus.groups is not None:
        ict = ict_pairs_from_groups(corpus.texts, corpus.groups, window=int(cfg["ict_window"]))
        ict_kind = "neighbouring_sentences"
    else:   # short texts of their own (queries, product titles): the TF-IDF and name views carry Stage I
        log.warning("no inverse-cloze pairs: the training instances have neither titles with content nor "
                    "document groups")
        ict, ict_kind = [], "none"
    ict_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the baseline's vectoriser settings, fit on training + label texts; no validation or test text is read
    feats = fit_tfidf(corpus.texts, None, corpus.label_texts, params["tfidf"])
    ids, scores = tfidf_topk(feats.trn, feats.lbl, int(cfg["tfidf_k"]), float(cfg["tfidf_min_score"]))
    tfidf_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    names_ids, names_scores, names_mode = _label_name_view(corpus.texts, corpus.label_texts, params)
    names_seconds = time.perf_counter() - t0
    pairs = PseudoPairs(corpus.texts, corpus.label_texts, ict, ids, scores,
                        meta={"ict_kind": ict_kind, "params": cfg, "tfidf_params": params["tfidf"],
                              "label_names": {**params["label_names"], "parsed_as": names_mode}},
                        names_ids=names_ids, names_scores=names_scores)
    seconds = {"ict": round(ict_seconds, 2), "tfidf": round(tfidf_seconds, 2), "label_names": round(names_seconds, 2)}
    return pairs, seconds


def build_maclr_pairs(params: dict[str, Any], ws: Workspace) -> dict[str, float]:
    pairs, seconds = make_maclr_pairs(params, ws)
    pairs.save(ws.maclr_pairs)
    log.info("pseudo pairs -> %s: %s", ws.maclr_pairs, kv(pairs.counts()))
    for s in pairs.sample():
        log.info("sample: %s", json.dumps(s, ensure_ascii=False))
    # the timings go to a file of their own: inside data/maclr_pairs they would change its hash at every run and
    # make DVC retrain every MACLR run on identical pairs
    write_json(ws.maclr_pairs.parent / "maclr_pairs_timing.json", seconds)
    return seconds


__all__ = ["build_maclr_pairs", "make_maclr_pairs"]
