"""The `graph` stage (RAMEN): load or derive anchor sets, augment them by random walk with restart.

Usage: ``python -m stages.graph``. Settings: params ``ramen.graph``.

* ``source_dir`` set: every anchor set found there (docs/methods/ramen.md for the file format) is loaded.
* ``source_dir`` null: the sets are derived (``xmc.graph.build``): ``wordnet`` (label -> WordNet
  hypernyms + other relations), where the dataset ships a ``label_graph.tsv`` (semcor-wn30), and
  ``document`` (sentence -> neighbouring sentences of its document), where instances have groups. A set
  whose inputs the dataset lacks is skipped with one warning line.

Writes ``<out_dir>/raw/`` and ``<out_dir>/augmented/`` (both in the input format, so a user can
inspect or reuse them), statistics before/after (networkx) into ``reports/validation/graph.html``
and ``reports/validation/graph_summary.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.graph.build import document_query_set, wordnet_label_set
from xmc.graph.format import AnchorSet, load_graph_dir, save_anchor_set
from xmc.graph.rwr import augment_edges
from xmc.errors import ConfigError
from xmc.graph.stats import graph_stats, stats_html
from xmc.io import atomic_dir, atomic_file, write_json
from xmc.logs import kv

log = logging.getLogger("stages.graph")


def derive_sets(params: dict, gcfg: dict, ds) -> dict[str, AnchorSet]:
    sets: dict[str, AnchorSet] = {}
    wcfg = gcfg["wordnet"]
    # the dataset's label graph as ingest kept it (data/processed/label_side): a dataset without one has no
    # label -> anchor set, and RAMEN then runs with the sets that exist
    side = Path(params["data"]["processed_dir"]) / "label_side"
    if wcfg["enabled"] and not (side / "label_graph.tsv").is_file():
        log.warning("wordnet label set skipped: the dataset ships no label_graph.tsv")
    elif wcfg["enabled"]:
        if not gcfg["wordnet_dir"] or not Path(gcfg["wordnet_dir"]).is_dir():
            raise ConfigError(f"params.yaml: ramen.graph.wordnet_dir: {gcfg['wordnet_dir']!r} is not a folder "
                              f"(needed by ramen.graph.wordnet.enabled)")
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


def main() -> None:
    params = load_params()
    gcfg = params["ramen"]["graph"]
    ds = load_processed(params["data"]["processed_dir"], splits=("trn", "val"))
    t0 = time.perf_counter()
    if gcfg["source_dir"]:
        sets = load_graph_dir(gcfg["source_dir"], len(ds.trn), ds.n_labels)
    else:
        sets = derive_sets(params, gcfg, ds)
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
            timing[f"random_walk {name}/{side}"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            key = f"{name}/{side}"
            stats[key] = {"before": graph_stats(E), "after": graph_stats(aug), "random_walk": info,
                          "walkers": int(w["walks"]) * int((E.getnnz(1) > 0).sum() + (E.getnnz(0) > 0).sum()),
                          "seconds": round(timing[f"random_walk {name}/{side}"], 2)}
            timing[f"networkx stats {name}/{side}"] = time.perf_counter() - t1
            log.info("%s: %d -> %d edges (+%d) in %.1f s", key, E.nnz, aug.nnz, info["edges_added"],
                     timing[f"random_walk {name}/{side}"])
            new_edges[side] = aug
        augmented[name] = AnchorSet(name, aset.anchor_ids, aset.anchor_texts, new_edges)
    out = Path(gcfg["out_dir"])
    t1 = time.perf_counter()
    with atomic_dir(out) as tmp:
        (tmp / "raw").mkdir()
        (tmp / "augmented").mkdir()
        for name in sets:
            save_anchor_set(sets[name], tmp / "raw")
            save_anchor_set(augmented[name], tmp / "augmented")
    timing["write"] = time.perf_counter() - t1
    report_dir = Path(params["validate"]["report_dir"])
    report_dir.mkdir(parents=True, exist_ok=True)
    with atomic_file(report_dir / "graph.html") as fh:
        fh.write(stats_html("RAMEN graph metadata: before and after random walk with restart", stats, timing))
    summary = {"walk": w, "total_seconds": round(time.perf_counter() - t0, 2),
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


if __name__ == "__main__":
    run_entry_point(main)
