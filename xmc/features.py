"""The data layer of a pipeline: ingest, validation and the features the methods read.

* :func:`ingest`: any supported dataset folder -> ``data/processed`` (the validation split carved out of training
  where the dataset ships none);
* :func:`validate`: great-expectations checks -> ``reports/validation/`` and the gate training waits on;
* :func:`build_tfidf`: one TF-IDF vectoriser fit on training + label texts -> ``data/tfidf``;
* :func:`build_graph`: RAMEN's anchor sets, augmented by random walk with restart -> ``data/graph``;
* :func:`build_maclr_pairs`: MACLR's pseudo pairs from raw text (no labelled pair) -> ``data/maclr_pairs``.

The DVC stages of the same names and ``xmc train`` call these; each writes atomically into its
:class:`~xmc.workspace.Workspace` folder.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from xmc.baselines.tfidf import fit_tfidf
from xmc.data import load_dataset_dir, load_processed, save_processed, split_validation, subsample, subsample_validation
from xmc.data.dataset import XMCDataset, label_side_files
from xmc.data.formats import read_json_lines
from xmc.errors import ConfigError, ValidationFailed
from xmc.graph.build import document_query_set, wordnet_label_set
from xmc.graph.format import AnchorSet, load_graph_dir, save_anchor_set
from xmc.graph.rwr import augment_edges
from xmc.graph.stats import graph_stats, stats_html
from xmc.io import atomic_dir, atomic_file, write_json
from xmc.lexical import LabelNameMatcher, parse_label_names, zero_shot_name_topk
from xmc.logs import kv
from xmc.maclr.corpus import load_texts_only
from xmc.maclr.pseudo import PseudoPairs, ict_pairs_from_groups, ict_pairs_from_titles, tfidf_topk
from xmc.workspace import Workspace

log = logging.getLogger(__name__)

GATE_TABLES = ("trn", "val", "lbl")


# ------------------------------------------------------------------------------------------------
# ingest and validation
# ------------------------------------------------------------------------------------------------
def read_dataset(data: dict[str, Any]) -> tuple[XMCDataset, dict[str, Path]]:
    """The dataset folder of params ``data`` read, subsampled and with its validation split, as ingest keeps it:
    (dataset, the label-side files to keep beside it)."""
    ds = load_dataset_dir(data["dataset_dir"], layout=data["layout"], uid_separator=data["uid_separator"],
                          text_fields=data["text_fields"])
    sub = data["subsample"]
    if sub["trn"] or sub["tst"] or sub["labels"] != "all":
        ds = subsample(ds, sub["trn"], sub["tst"], sub["unit"], sub["labels"])
    vcfg = data["validation"]
    if ds.val is not None and vcfg["use_shipped"]:
        ds.meta["validation"] = {"source": "shipped with the dataset", "instances": len(ds.val)}
    else:
        ds.val = None
        ds = split_validation(ds, vcfg["fraction"], vcfg["seed"])
    ds = subsample_validation(ds, sub["val"], sub["unit"])
    if ds.trn is None or len(ds.trn) == 0 or ds.trn.Y.nnz == 0:
        raise ConfigError(f"{data['dataset_dir']}: no labelled training instances (a dataset needs training labels)")
    return ds, label_side_files(data["dataset_dir"])


def ingest(data: dict[str, Any], ws: Workspace) -> dict[str, Any]:
    """Dataset folder -> ``data/processed``; returns the metadata written."""
    ds, side = read_dataset(data)
    meta = save_processed(ds, ws.processed, side)
    if side:
        log.info("label-side files kept for the label graph: %s", ", ".join(sorted(side)))
    log.info("validation split: %s", kv(meta["validation"]))
    log.info("ingested %s: %s", data["dataset_dir"], kv(meta["counts"]))
    return meta


def validate(params: dict[str, Any], ws: Workspace) -> Any:
    """great-expectations checks of ``data/processed`` -> ``report.html``, ``summary.json`` and ``gate.json`` (the
    checks of the training, validation and label tables, which training waits on); a critical failure raises
    :class:`~xmc.errors.ValidationFailed` after the report is written."""
    from xmc.validation import render_html, validate_dataset   # great-expectations: 3 s to import, this stage only

    out = ws.validation_reports
    ds = load_processed(ws.processed)
    summary = validate_dataset(ds, params["validate"])
    summary.extra_sections["Validation split (every choice is made on it; test is only reported)"] = \
        ds.meta.get("validation", {"source": "unknown"})
    with atomic_file(out / "report.html") as fh:
        fh.write(render_html(summary, f"Data validation: {ds.meta.get('source', '')}"))
    write_json(out / "summary.json", summary.to_json())
    write_json(out / "gate.json", {
        "critical_failures": sum(1 for c in summary.critical_failures if c.table in GATE_TABLES),
        "checks": [{"table": c.table, "check": c.description, "severity": c.severity, "success": c.success}
                   for c in summary.checks if c.table in GATE_TABLES]})
    if summary.critical_failures:
        raise ValidationFailed(f"{summary.failure_line()} (report: {out / 'report.html'})")
    return summary


# ------------------------------------------------------------------------------------------------
# TF-IDF
# ------------------------------------------------------------------------------------------------
def build_tfidf(params: dict[str, Any], ws: Workspace) -> dict[str, Any]:
    """One vectoriser fit on training and label texts -> ``data/tfidf`` (the test split is never read here)."""
    ds = load_processed(ws.processed, splits=("trn", "val"))
    t0 = time.perf_counter()
    feats = fit_tfidf(ds.trn.texts, ds.val.texts, ds.label_texts, params["tfidf"])
    timing = {"fit_seconds": round(time.perf_counter() - t0, 3), "vocabulary": len(feats.vectorizer.vocabulary_)}
    feats.save(ws.tfidf)
    write_json(ws.tfidf.parent / "tfidf_timing.json", timing)
    return timing


# ------------------------------------------------------------------------------------------------
# RAMEN's graph
# ------------------------------------------------------------------------------------------------
def derive_anchor_sets(gcfg: dict[str, Any], ds: XMCDataset, ws: Workspace) -> dict[str, AnchorSet]:
    """``wordnet`` (label -> WordNet hypernyms and relations) where the dataset ships a ``label_graph.tsv``, and
    ``document`` (instance -> neighbouring instances of its document) where instances have groups; a set whose
    inputs the dataset lacks is skipped with one warning line."""
    sets: dict[str, AnchorSet] = {}
    wcfg = gcfg["wordnet"]
    side = ws.processed / "label_side"
    if wcfg["enabled"] and not (side / "label_graph.tsv").is_file():
        log.warning("wordnet label set skipped: the dataset ships no label_graph.tsv")
    elif wcfg["enabled"]:
        if not gcfg["wordnet_dir"] or not Path(gcfg["wordnet_dir"]).is_dir():
            raise ConfigError(f"params.yaml: graph.wordnet_dir: {gcfg['wordnet_dir']!r} is not a folder "
                              f"(needed by graph.wordnet.enabled)")
        wn = wordnet_label_set(side, gcfg["wordnet_dir"], ds.n_labels, list(wcfg["relations"]),
                               wcfg["hypernym_levels"], label_uids=list(ds.label_uids))
        if len(wn.anchor_ids):
            sets["wordnet"] = wn
        else:   # a label graph whose nodes are not WordNet synsets (a dataset's own taxonomy): nothing to anchor on
            log.warning("wordnet label set skipped: none of the label graph's nodes is a WordNet synset")
    dcfg = gcfg["document"]
    if dcfg["enabled"] and not any(g is not None for g in (ds.trn.groups or [])):
        log.warning("document query set skipped: the training instances have no document groups")
    elif dcfg["enabled"]:
        sets["document"] = document_query_set(ds.trn, dcfg["window"])
    return sets


def build_graph(params: dict[str, Any], ws: Workspace) -> dict[str, Any]:
    """Anchor sets (loaded from ``graph.source_dir`` or derived) and their random-walk augmentation ->
    ``data/graph/{raw,augmented}/``, statistics -> ``reports/validation/graph.{html,summary.json}``."""
    gcfg = params["graph"]
    ds = load_processed(ws.processed, splits=("trn", "val"))
    t0 = time.perf_counter()
    sets = load_graph_dir(gcfg["source_dir"], len(ds.trn), ds.n_labels) if gcfg["source_dir"] \
        else derive_anchor_sets(gcfg, ds, ws)
    timing = {"load_or_derive": time.perf_counter() - t0}
    w = gcfg["walk"]
    augmented: dict[str, AnchorSet] = {}
    stats: dict[str, dict] = {}
    for name, aset in sets.items():
        new_edges = {}
        for side, E in aset.edges.items():
            t1 = time.perf_counter()
            aug, info = augment_edges(E, walks=int(w["walks"]), hops=int(w["hops"]), restart=float(w["restart"]),
                                      top_k=int(w["top_k"]), min_visits=int(w["min_visits"]), seed=int(w["seed"]),
                                      progress=True)
            key = f"{name}/{side}"
            timing[f"random_walk {key}"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            stats[key] = {"before": graph_stats(E), "after": graph_stats(aug), "random_walk": info,
                          "walkers": int(w["walks"]) * int((E.getnnz(1) > 0).sum() + (E.getnnz(0) > 0).sum()),
                          "seconds": round(timing[f"random_walk {key}"], 2)}
            timing[f"networkx stats {key}"] = time.perf_counter() - t1
            log.info("%s: %d -> %d edges (+%d) in %.1f s", key, E.nnz, aug.nnz, info["edges_added"],
                     timing[f"random_walk {key}"])
            new_edges[side] = aug
        augmented[name] = AnchorSet(name, aset.anchor_ids, aset.anchor_texts, new_edges)
    t1 = time.perf_counter()
    with atomic_dir(ws.graph) as tmp:
        (tmp / "raw").mkdir()
        (tmp / "augmented").mkdir()
        for name in sets:
            save_anchor_set(sets[name], tmp / "raw")
            save_anchor_set(augmented[name], tmp / "augmented")
    timing["write"] = time.perf_counter() - t1
    report_dir = ws.validation_reports
    with atomic_file(report_dir / "graph.html") as fh:
        fh.write(stats_html("RAMEN graph metadata: before and after random walk with restart", stats, timing))
    summary: dict[str, Any] = {"walk": w, "total_seconds": round(time.perf_counter() - t0, 2),
                               "timing_seconds": {k: round(v, 2) for k, v in timing.items()}, "sets": {}}
    for key, st in stats.items():
        summary["sets"][key] = {"nodes": st["before"]["nodes"], "anchors": st["before"]["anchors"],
                                "edges_before": st["before"]["edges"], "edges_after": st["after"]["edges"],
                                "mean_node_degree_before": st["before"]["node_degree"]["mean"],
                                "mean_node_degree_after": st["after"]["node_degree"]["mean"],
                                "isolated_nodes": st["before"]["node_degree"]["isolated"],
                                "walkers": st["walkers"], "walk_seconds": st["seconds"],
                                "node_degree_histogram_before": st["before"]["node_degree"]["histogram"],
                                "node_degree_histogram_after": st["after"]["node_degree"]["histogram"]}
    write_json(report_dir / "graph_summary.json", summary)
    log.info("graph stage done in %.1f s: %s", summary["total_seconds"], kv(summary["timing_seconds"], 1))
    return summary


# ------------------------------------------------------------------------------------------------
# MACLR's pseudo pairs
# ------------------------------------------------------------------------------------------------
def _raw_titles(ws: Workspace) -> tuple[list[str], list[str]] | None:
    """(titles, contents) of the raw JSON-lines training file when the dataset has titles; the records'
    label fields are dropped as they are read."""
    meta = json.loads((ws.processed / "source.json").read_text(encoding="utf-8"))
    if meta.get("layout") != "jsonl" or "title" not in (meta.get("text_fields") or []):
        return None
    src = Path(meta["source"]) / "trn.jsonl"
    recs = [(r.get("title") or "", r.get("content") or "") for _, r in read_json_lines(src)]
    return [t for t, _ in recs], [c for _, c in recs]


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
    titled = _raw_titles(ws)
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


# the features each method's training reads beyond the processed data (xmc train builds only these)
FEATURES_OF: dict[str, tuple[str, ...]] = {"maclr": ("maclr_pairs",), "ramen": ("graph",), "tfidf_zeroshot": ("tfidf",),
                                           "tfidf_knn": ("tfidf",)}
BUILDERS = {"tfidf": build_tfidf, "graph": build_graph, "maclr_pairs": build_maclr_pairs}


__all__ = ["BUILDERS", "FEATURES_OF", "build_graph", "build_maclr_pairs", "build_tfidf", "derive_anchor_sets", "ingest",
           "make_maclr_pairs", "read_dataset", "validate"]
