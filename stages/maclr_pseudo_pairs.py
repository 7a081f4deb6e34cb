"""MACLR pseudo pairs from raw text -> data/maclr_pairs (versioned; see xmc.maclr.pseudo).

Reads instance and label *texts* only (xmc.maclr.corpus.load_texts_only: trn.jsonl, lbl.jsonl; never
trn_Y.npz) and writes them, the ICT pairs, the TF-IDF top-k and the label-name view (labels whose names occur
in the instance, xmc.lexical, no training data), which is all the zero-shot training
stage (``stages.train <maclr run>``) reads. Usage: ``python -m stages.maclr_pseudo_pairs``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from xmc.baselines.tfidf import fit_tfidf
from xmc.config import load_params, run_entry_point
from xmc.data.formats import read_json_lines
from xmc.io import write_json
from xmc.maclr.corpus import load_texts_only
from xmc.maclr.pseudo import PseudoPairs, ict_pairs_from_groups, ict_pairs_from_titles, tfidf_topk
from xmc.logs import kv

log = logging.getLogger("stages.maclr_pseudo_pairs")


def _raw_titles(params: dict) -> tuple[list[str], list[str]] | None:
    """(titles, contents) of the raw JSON-lines training file when the dataset has titles; the records'
    label fields are dropped as they are read."""
    data = params["data"]
    meta = json.loads((Path(data["processed_dir"]) / "source.json").read_text())
    if meta.get("layout") != "jsonl" or "title" not in (meta.get("text_fields") or []):
        return None
    src = Path(meta["source"]) / "trn.jsonl"
    recs = [(r.get("title") or "", r.get("content") or "") for _, r in read_json_lines(src)]
    return [t for t, _ in recs], [c for _, c in recs]


def build_pairs(params: dict) -> tuple[PseudoPairs, dict[str, float]]:
    cfg = params["maclr"]["pairs"]
    corpus = load_texts_only(params["data"]["processed_dir"])
    t0 = time.perf_counter()
    titled = _raw_titles(params)
    if titled is not None and len(titled[0]) == len(corpus):
        ict = ict_pairs_from_titles(*titled, remove_title_prob=float(cfg["title_remove_prob"]), seed=int(cfg["seed"]))
        ict_kind = "title"
    else:
        ict = ict_pairs_from_groups(corpus.texts, corpus.groups, window=int(cfg["ict_window"]))
        ict_kind = "neighbouring_sentences"
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
    # the timings go to a file of their own: inside data/maclr_pairs they would change its hash at every run and
    # make DVC retrain every MACLR run on identical pairs
    seconds = {"ict": round(ict_seconds, 2), "tfidf": round(tfidf_seconds, 2), "label_names": round(names_seconds, 2)}
    return pairs, seconds


def _label_name_view(texts: list[str], label_texts: list[str], params: dict):
    """(ids, scores, how the names were parsed) of the labels whose names occur in each instance (zero-shot
    ranking, top ``maclr.pairs.names_k``; None, None with k = 0). Where labels have no names apart from their
    text (mode ``text``: titles), the whole text is the name: the view then holds the exact title matches."""
    from xmc.lexical import LabelNameMatcher, parse_label_names, zero_shot_name_topk

    k = int(params["maclr"]["pairs"]["names_k"])
    names = parse_label_names(label_texts, params["label_names"]["mode"])
    if k == 0:
        return None, None, names.mode
    matcher = LabelNameMatcher(names, params["label_names"]["max_words"], label_texts,
                               params["label_names"]["cased_names"])   # the names parsed above (their mode too)
    ids, scores = zero_shot_name_topk(matcher, texts, k)
    return ids, scores, names.mode


def main() -> None:
    params = load_params()
    out = Path(params["maclr"]["pairs_dir"])
    pairs, seconds = build_pairs(params)
    pairs.save(out)
    log.info("pseudo pairs -> %s: %s", out, kv(pairs.counts()))
    for s in pairs.sample():
        log.info("sample: %s", json.dumps(s, ensure_ascii=False))
    write_json(out.parent / "maclr_pairs_timing.json", seconds)


if __name__ == "__main__":
    run_entry_point(main)
