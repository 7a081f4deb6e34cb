"""RAMEN's graph metadata: anchor sets loaded (``graph.source_dir``) or derived from the dataset's label graph and
document groups, augmented by random walk with restart -> ``data/graph/{raw,augmented}/``, with statistics."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from xmc.data import load_processed
from xmc.data.dataset import XMCDataset
from xmc.errors import ConfigError
from xmc.graph.build import document_query_set, item_relations_label_set, label_cooccurrence_set, wordnet_label_set
from xmc.graph.format import AnchorSet, load_graph_dir, save_anchor_set
from xmc.graph.rwr import augment_edges
from xmc.graph.stats import graph_stats, stats_html
from xmc.io import atomic_dir, atomic_file, write_json
from xmc.logs import kv
from xmc.workspace import Workspace

log = logging.getLogger(__name__)


def derive_anchor_sets(gcfg: dict[str, Any], ds: XMCDataset, ws: Workspace) -> dict[str, AnchorSet]:
    """``wordnet`` (label -> WordNet hypernyms and relations) where the dataset ships a ``label_graph.tsv``, and
    ``relations`` (label -> the training labels of the training item that is that label) where labels are items
    of the training set, ``cooccurrence`` (label -> the labels it shares training instances with) where neither
    gave a label graph (``enabled: auto``), and ``document`` (instance -> neighbouring instances of its document)
    where instances have groups; a set whose inputs the dataset lacks is skipped with one warning line."""
    sets: dict[str, AnchorSet] = {}
    skipped: list[str] = []   # why a label set is absent: a warning only when the dataset ends with no label graph
    wcfg = gcfg["wordnet"]
    side = ws.processed / "label_side"
    if wcfg["enabled"] and not (side / "label_graph.tsv").is_file():
        skipped.append("wordnet: the dataset ships no label_graph.tsv")
    elif wcfg["enabled"]:
        if not gcfg["wordnet_dir"] or not Path(gcfg["wordnet_dir"]).is_dir():
            raise ConfigError(f"params.yaml: graph.wordnet_dir: {gcfg['wordnet_dir']!r} is not a folder "
                              f"(needed by graph.wordnet.enabled)")
        wn = wordnet_label_set(side, gcfg["wordnet_dir"], ds.n_labels, list(wcfg["relations"]),
                               wcfg["hypernym_levels"], label_uids=list(ds.label_uids))
        if len(wn.anchor_ids):
            sets["wordnet"] = wn
        else:   # a label graph whose nodes are not WordNet synsets (a dataset's own taxonomy): nothing to anchor on
            skipped.append("wordnet: none of the label graph's nodes is a WordNet synset")
    if gcfg["relations"]["enabled"]:
        rel = item_relations_label_set(ds.trn, list(ds.label_texts), list(ds.label_uids))
        if rel.edges["label"].nnz:
            sets["relations"] = rel
        else:
            skipped.append("relations: no label is a training item with labels of its own")
    ccfg = gcfg["cooccurrence"]
    if ccfg["enabled"] is True or (ccfg["enabled"] == "auto" and not sets):
        co = label_cooccurrence_set(ds.trn, list(ds.label_texts), list(ds.label_uids), ccfg["top_k"], ccfg["min_count"])
        if co.edges["label"].nnz:
            if skipped:   # the label graph is the training labels' own: said once, with why the others are absent
                log.warning("label graph sets skipped: %s; RAMEN's label graph is the training labels' co-occurrence",
                            "; ".join(skipped))
                skipped = []
            sets["cooccurrence"] = co
        else:
            skipped.append("cooccurrence: no two labels share a training instance")
    if skipped:
        (log.info if sets else log.warning)("label graph sets skipped: %s%s", "; ".join(skipped),
                                            "" if sets else " (RAMEN's label regulariser has no edges)")
    dcfg = gcfg["document"]
    if dcfg["enabled"] and not any(g is not None for g in (ds.trn.groups or [])):
        # ingest said so (one warning line per missing input)
        log.info("document query set skipped: the training instances have no document groups")
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
            timing[f"graph stats {key}"] = time.perf_counter() - t1
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


__all__ = ["build_graph", "derive_anchor_sets"]
