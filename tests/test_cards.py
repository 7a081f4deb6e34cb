"""Model cards in the Hugging Face layout: the front matter parses and says what the manifest says (dataset, metric
values, licence); the method's description follows its settings and claims none the manifest lacks; every method
has its paper's citation or an explicit "no paper"."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

from xmc.cards import (DESCRIBERS, METHOD_NOTES, NO_PAPER, PAPERS, citation, dataset_licence, encoder_card,
                       method_facts, model_card, split_front_matter)
from xmc.config.runs import method_defaults

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"
METRICS = {"val": {"P@1": 76.7618, "P@5": 53.1858, "PSP@5": 24.5265, "R@100": 68.0419, "unseen_R@100": 0.0,
                   "n_test": 1717},
           "tst": {"P@1": 75.7272, "P@3": 62.1682, "nDCG@5": 63.2397, "R@10": 50.0813, "n_test": 2097,
                   "train_seconds": 116.85, "predict_seconds": 0.3}}
PAPER_METHODS = ("dexml", "maclr", "ramen", "unidec", "astra")


def manifest(method: str, params: dict[str, Any] | None = None, predictor: dict[str, Any] | None = None,
             dataset: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
             name: str | None = None) -> dict[str, Any]:
    """A manifest as ``finish_package`` writes it: ``params`` default to the method's full default settings (what
    ``package_run`` records: run, method, the merged config, the index)."""
    if params is None:
        params = {"run": name or method, "method": method, **method_defaults(method), "index": {"kind": "auto"}}
    return {"format": "xmc-model-package", "format_version": 1, "name": name or method, "method": method,
            "predictor": predictor or {"kind": "dense"},
            "labels": {"count": 25819, "sha256": "b" * 64, "file": "labels.jsonl"},
            "dataset": dataset if dataset is not None else {"sha256": "d" * 64, "source": "data/toy", "files": [],
                                                            "train_instances": 12},
            "params": params, "code": {"xmc": "0.1.0", "git": "abc"},
            "metrics": copy.deepcopy(METRICS) if metrics is None else metrics,
            "training": {"train_seconds": 1.5, "epochs": 1, "steps": 3, "device": "cpu"}}


def section(card: str, title: str) -> str:
    """The Markdown of one ``## title`` section of a card."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", card, re.M | re.S)
    assert m, f"no section {title!r}"
    return m.group(1)


def description(m: dict[str, Any]) -> str:
    return section(model_card(m), "Model description")


def with_setting(method: str, path: str, value: Any, predictor: dict[str, Any] | None = None) -> dict[str, Any]:
    m = manifest(method, predictor=predictor)
    d = m["params"]
    *head, last = path.split(".")
    for key in head:
        d = d[key]
    d[last] = value
    return m


def licensed_folder(tmp_path: Path, files: dict[str, str], readme: str | None = None) -> Path:
    d = tmp_path / "datasets" / "toy-data"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text, encoding="utf-8")
    if readme is not None:
        (d / "README.md").write_text(readme, encoding="utf-8")
    return d


# ------------------------------------------------------------------------------------------------
# front matter
# ------------------------------------------------------------------------------------------------
def test_front_matter_parses_and_matches_the_manifest(tmp_path):
    d = licensed_folder(tmp_path, {"LICENSE-Apache-2.0.txt": "Apache License\nVersion 2.0, January 2004\n"})
    m = manifest("astra", dataset={"sha256": "d" * 64, "source": str(d), "files": ["trn.jsonl"],
                                   "train_instances": 12, "licence": dataset_licence(d)})
    card = model_card(m)
    assert card.startswith("---\n")
    meta, body = split_front_matter(card)
    assert body.startswith("# astra\n")
    assert meta["library_name"] == "xmc" and meta["pipeline_tag"] == "text-classification"
    assert {"xmc", "extreme-multi-label-classification", "astra"} <= set(meta["tags"])
    assert meta["datasets"] == ["toy-data"]
    assert meta["license"] == "apache-2.0" and meta["license_link"].endswith("toy-data/LICENSE-Apache-2.0.txt")
    # metrics: the metric names of the manifest, not its counts or timings
    assert meta["metrics"] == ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@10", "R@100", "unseen_R@100"]
    (index,) = meta["model-index"]
    assert index["name"] == "astra"
    by_split = {r["dataset"]["split"]: r for r in index["results"]}
    assert set(by_split) == {"validation", "test"}
    for split, long in (("val", "validation"), ("tst", "test")):
        r = by_split[long]
        assert r["task"]["type"] == "text-classification" and r["dataset"]["name"] == "toy-data"
        got = {x["type"]: x["value"] for x in r["metrics"]}
        want = {k: v for k, v in METRICS[split].items() if "@" in k}
        assert got == want, split   # the values as recorded, every one of them, nothing else
        assert all(long in x["name"] for x in r["metrics"])


def test_front_matter_is_generated_yaml_whatever_the_names(tmp_path):
    """Names with YAML syntax in them (a colon, a hash, a leading star) stay strings: the front matter is dumped,
    never written by hand."""
    m = manifest("dexml", name="run: #1", dataset={"source": "data/*odd: name #x", "sha256": "0" * 64},
                 metrics={"val": {"P@1": 1.0}, "tst": {}})
    meta, body = split_front_matter(model_card(m))
    assert meta["datasets"] == ["*odd: name #x"] and meta["model-index"][0]["name"] == "run: #1"
    assert [r["dataset"]["split"] for r in meta["model-index"][0]["results"]] == ["validation"]
    assert body.startswith("# run: #1\n")
    # no metrics: no model-index at all (HF refuses an empty results list)
    meta, _ = split_front_matter(model_card(manifest("dexml", metrics={})))
    assert "model-index" not in meta and meta["metrics"] == []


def test_licence_other_lists_every_licence_file_and_unknown_says_see_the_dataset(tmp_path):
    d = licensed_folder(tmp_path, {"LICENSE-WordNet-3.0.txt": "WordNet 3.0 Copyright 2006 by Princeton University",
                                   "LICENSE-corpus-Apache-2.0.txt": "Apache License\nVersion 2.0\n"})
    rec = dataset_licence(d)
    assert [f["spdx"] for f in rec["files"]] == [None, "Apache-2.0"]
    card = model_card(manifest("astra", dataset={"source": str(d), "licence": rec}))
    meta, _ = split_front_matter(card)
    assert meta["license"] == "other" and meta["license_name"] == "wordnet-3.0-and-apache-2.0"
    assert meta["license_link"].endswith("LICENSE-WordNet-3.0.txt")
    lic = section(card, "Training data")
    assert "LICENSE-WordNet-3.0.txt`: WordNet 3.0" in lic and "LICENSE-corpus-Apache-2.0.txt`: Apache" in lic

    # no licence file, a README that states the terms and a citation
    readme = ("# toy\n\n## Source\n* **Data.** from somewhere.\n* **License.** Package metadata of the maintainers,\n"
              "  no licence statement of its own. Cite as: \"Toy 1.0,\n  Release of 2026\". Use it as a benchmark.\n"
              "* **Other.** nothing.\n")
    e = licensed_folder(tmp_path / "b", {}, readme)
    rec = dataset_licence(e)
    assert rec["files"] == [] and rec["citation"] == "Toy 1.0, Release of 2026"
    assert rec["statement"].startswith("Package metadata of the maintainers") and "Other" not in rec["statement"]
    card = model_card(manifest("astra", dataset={"source": str(e), "licence": rec}))
    meta, _ = split_front_matter(card)
    assert meta["license"] == "other" and meta["license_name"] == "unknown-see-dataset"
    assert meta["license_link"].endswith("toy-data/README.md")
    assert "unknown: see the dataset" in card and "Use it as a benchmark" in card
    assert "The data: Toy 1.0, Release of 2026" in section(card, "Citation")

    # a manifest without a licence record (an older package, a folder not found): unknown, never a guess
    assert dataset_licence(tmp_path / "absent") == {}
    card = model_card(manifest("astra"))
    assert split_front_matter(card)[0]["license_name"] == "unknown-see-dataset" and "unknown: see the dataset" in card


@pytest.mark.skipif(not (SHARED / "datasets" / "semcor-wn30").is_dir(), reason="../shared/datasets not present")
def test_the_shared_datasets_licences():
    sem = dataset_licence(SHARED / "datasets" / "semcor-wn30")
    assert sorted(f["id"] for f in sem["files"]) == ["apache-2.0", "wordnet-3.0"]
    assert "wsd_corpora (Apache-2.0" in sem["statement"]   # its provenance paragraph in datasets/README.md
    deb = dataset_licence(SHARED / "datasets" / "debian-relations")
    assert deb["files"] == [] and "internal benchmark" in deb["statement"]
    assert deb["citation"].startswith("Debian 12.15 (bookworm) main")


def test_the_package_stage_records_the_data_licences(tmp_path):
    """``dataset_record`` (the manifest's dataset section, hybrids' too) carries the licence record of the folder
    ``source.json`` names."""
    from xmc.package.build import DATA_FILES, dataset_record
    from xmc.workspace import Workspace

    d = licensed_folder(tmp_path, {"LICENSE": "MIT License\n\nPermission is hereby granted"})
    ws = Workspace(tmp_path / "results")
    ws.processed.mkdir(parents=True)
    for f in DATA_FILES:
        (ws.processed / f).write_text("")
    (ws.processed / "source.json").write_text(json.dumps({"layout": "jsonl", "source": str(d)}))
    rec = dataset_record(ws, SimpleNamespace(trn=SimpleNamespace(Y=np.zeros((3, 2)))))
    assert rec["licence"]["files"] == [{"file": f"{d.as_posix()}/LICENSE", "spdx": "MIT", "id": "mit",
                                        "name": "MIT License"}]
    meta, _ = split_front_matter(model_card(manifest("dexml", dataset=rec)))
    assert meta["license"] == "mit"


# ------------------------------------------------------------------------------------------------
# the description follows the settings
# ------------------------------------------------------------------------------------------------
def test_astra_says_which_negatives_it_used_with_their_counts():
    none = description(with_setting("astra", "negatives.uniform_negatives", 0))
    assert "500 stale hard negatives per query from an ANN index over the classifier vectors" in none
    assert "Uniform negatives: none (uniform_negatives: 0)" in none
    assert not re.search(r"\d+ uniform negatives per query", none)
    assert "and uniform negatives" not in model_card(with_setting("astra", "negatives.uniform_negatives", 0))
    some = description(with_setting("astra", "negatives.uniform_negatives", 32))
    assert "32 uniform negatives per query" in some and "uniform_negatives: 0" not in some
    assert "the 532 negatives of a query are drawn at random" in some   # warm-up: k_h + k_r before the index
    no_hard = description(with_setting("astra", "negatives.hard_negatives", 0))
    assert "Hard negatives: none (hard_negatives: 0)" in no_hard and "Warm-up" not in no_hard
    ance = description(with_setting("astra", "negatives.mine_with", "label_embeddings"))
    assert "over the label embeddings (ANCE-style)" in ance and "classifier vectors" not in ance


def test_dexml_says_which_loss_and_negatives():
    d = description(manifest("dexml"))
    assert "Loss: DecoupledSoftmax" in d and "temperature 0.05" in d
    assert "in-batch plus 2 hard negatives per query drawn from its top-100 labels" in d
    d = description(with_setting("dexml", "loss", {"name": "softmax"}))
    assert "softmax cross-entropy" in d and "DecoupledSoftmax" not in d and "temperature" not in d
    d = description(with_setting("dexml", "negatives.kind", "in_batch"))
    assert "Negatives: in-batch only" in d and "hard negative" not in d
    assert "Negatives: every label" in description(with_setting("dexml", "negatives.kind", "all"))
    assert "3 negatives per query among the labels named" in description(
        with_setting("dexml", "negatives.name_match_per_query", 3))


def test_ramen_says_which_graphs_and_regularisers_are_on():
    d = description(manifest("ramen"))
    assert "label-anchor R_z on (λ = 1)" in d and "query-anchor R_x off (query_graph: false)" in d
    assert "`wordnet`, `relations`, `cooccurrence`, `document`" in d and "triplet loss (margin 0.3)" in d
    d = description(with_setting("ramen", "regulariser.query_graph", True))
    assert "query-anchor R_x on (λ = 0.5)" in d
    d = description(with_setting("ramen", "regulariser.sets", []))
    assert "no-graph baseline" in d and "R_z" not in d
    assert "Graph pruning: off." in description(with_setting("ramen", "pruning.enabled", False))


def test_unidec_says_its_heads_and_space():
    for space, words in (("concat", "concatenated index"), ("de", "dual-encoder head only"),
                         ("clf", "classifier head only")):
        d = description(manifest("unidec", predictor={"kind": "unidec", "space": space}))
        assert f"(space: {space})" in d and words in d, space
        assert "384 dimensions each" in d and "6 hard negatives per query from its top-30 shortlist" in d
    d = description(manifest("unidec", predictor={"kind": "shortlist", "base": {"kind": "unidec", "space": "de"}}))
    assert "(space: de)" in d
    assert "space:" not in description(manifest("unidec", predictor={"kind": "unidec"}))


def test_maclr_says_zero_shot_and_its_stages_few_shot_its_share():
    card = model_card(manifest("maclr"))
    d = section(card, "Model description")
    assert "Zero-shot" in d and "multi-scale adaptive clustering from 110 clusters" in d
    assert "Stage II: self-training on pseudo pairs from the labels named in the text (top 3)" in d
    assert "Zero-shot row" in section(card, "Limitations")
    assert "instance-level ICT throughout" in description(with_setting("maclr", "stage1.mac", False))
    few = with_setting("maclr_fewshot", "ratio", 0.05)
    few["params"]["init"] = "models/maclr"
    d = description(few)
    assert "Few-shot: the encoder `models/maclr` fine-tuned on the ground-truth pairs of 5% of the labels" in d
    assert "Zero-shot row" not in section(model_card(few), "Limitations")


def test_hybrids_say_their_members_and_fusion():
    import xmc

    params = yaml.safe_load((Path(xmc.__file__).parents[1] / "params.yaml").read_text())
    hyb = {"bases": ["astra"], "fusion": "boosted_trees", "hybrid": params["hybrid"],
           "label_names": params["label_names"]}
    pred = {"kind": "hybrid", "base_k": 100, "base": {"kind": "dense"}, "label_names": "prefix"}
    card = model_card(manifest("hybrid", hyb, pred, name="astra_hybrid"))
    d = section(card, "Model description")
    assert "Candidates: the top-100 labels of run `astra`, united with the labels whose names occur" in d
    assert "gradient-boosted trees (hybrid.fusion: boosted_trees)" in d and "cross-fitted over 2 folds" in d
    assert "depends on label names" in section(card, "Limitations")
    assert {"hybrid", "label-name-matching"} <= set(split_front_matter(card)[0]["tags"])
    vt = model_card(manifest("hybrid", {**hyb, "fusion": "valtuned", "bases": ["maclr"]}, pred,
                             name="maclr_valtuned_hybrid"))
    assert "Fusion: tuned on validation" in vt and "boosted" not in section(vt, "Model description")
    limits = section(vt, "Limitations")
    assert "Validation-tuned fusion" in limits and "the row is not zero-shot" in limits and "`maclr`" in limits
    ens = {"kind": "hybrid", "base_k": 100, "members": [{"name": "astra", "base": {}}, {"name": "unidec", "base": {}}]}
    d = description(manifest("hybrid", {**hyb, "bases": ["astra", "unidec"]}, ens, name="ens"))
    assert "Members: the top-100 labels of run `astra` and of run `unidec`" in d and "every member's score" in d
    assert "Guard" not in d   # an ensemble hybrid has no keep-the-run guard


def test_every_number_in_a_description_is_a_setting_of_the_manifest():
    """Each method's default settings with every number replaced by a distinct one: each number the description
    prints is one of them (or k_h + k_r, or a share as a percentage), so none is made up."""
    for method in sorted(set(DESCRIBERS) - {"hybrid", "ensemble"}):
        if method in ("st_mnrl",):
            continue
        params = {"run": method, "method": method, **method_defaults(method)}
        counter = iter(range(1001, 100000, 7))
        values: list[float] = []

        def renumber(d: Any) -> Any:
            if isinstance(d, dict):
                return {k: renumber(v) for k, v in d.items()}
            if isinstance(d, bool) or not isinstance(d, int | float):
                return d
            values.append(v := next(counter) if isinstance(d, int) else next(counter) / 10000)
            return v

        params = renumber(params)
        text = description(manifest(method, params, {"kind": "unidec", "space": "concat"}))
        text = text.replace("1- to", "").replace("all-MiniLM-L6-v2", "").replace("log(1 + n_l)", "").replace("P@1", "")
        allowed = {f"{v:g}" for v in values} | {f"{v:,}" for v in values if isinstance(v, int)}
        allowed |= {f"{a + b:,}" for a in values for b in values if isinstance(a, int) and isinstance(b, int)}
        allowed |= {f"{v:.0%}" for v in values if isinstance(v, float)}
        for number in re.findall(r"\d[\d,.]*%?", text):
            assert number.rstrip(".,") in allowed, (method, number)


def test_a_card_never_claims_a_setting_the_manifest_lacks():
    for method in METHOD_NOTES:
        d = description(manifest(method, {"method": method}, {"kind": "dense"}))
        if method in ("maclr", "pretrained", "st_mnrl", "hybrid", "ensemble"):
            # a fact of the method itself (zero-shot, not trained, its trainer's loss, its candidates), no setting
            assert not re.search(r"\d", d.replace("top labels", "")), (method, d)
        else:
            assert "not recorded in the manifest" in d, method
    # half the ASTRA settings: the negatives it has, nothing about those it lacks
    d = description(manifest("astra", {"method": "astra", "negatives": {"uniform_negatives": 32}}))
    assert "32 uniform negatives per query" in d
    assert "Hard negatives" not in d and "Warm-up" not in d and "Encoder" not in d and "epoch" not in d
    d = description(manifest("astra", {"method": "astra", "negatives": {"hard_negatives": 50}}))
    assert "over the model" in d and "classifier vectors" not in d and "uniform" not in d.lower()
    assert method_facts("unknown_method", {"x": 1}) == [
        "The run's settings are not recorded in the manifest: the card describes none."]


# ------------------------------------------------------------------------------------------------
# citations and the encoder card
# ------------------------------------------------------------------------------------------------
def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def test_every_method_has_its_paper_or_says_no_paper():
    for method in METHOD_NOTES:
        c = citation(method)
        assert (method in PAPERS and c.startswith("```bibtex\n@") and "title" in c) or c.startswith("no paper"), method
        assert c in section(model_card(manifest(method, {"method": method})), "Citation")
    assert set(PAPER_METHODS) <= set(PAPERS) and not set(PAPERS) & set(NO_PAPER)
    assert "{ICLR} 2024" in PAPERS["dexml"] and "Dual-Encoders for Extreme Multi-label Classification" in PAPERS["dexml"]
    assert "NAACL" in PAPERS["maclr"] and "WWW '25" in PAPERS["unidec"] and "Mittal, Anshul" in PAPERS["ramen"]
    for bib in PAPERS.values():
        assert bib.count("{") == bib.count("}")


@pytest.mark.skipif(not (SHARED / "seeds").is_dir(), reason="../shared/seeds not present")
def test_paper_titles_are_the_seed_papers_titles():
    seeds = {"astra": "astra-anns-based-training.txt", "maclr": "maclr-extreme-zero-shot.txt",
             "ramen": "ramen-graph-regularized-encoder.txt", "unidec": "unidec-unified-dual-encoder-classifier.txt"}
    for method, file in seeds.items():
        first = next(line for line in (SHARED / "seeds" / file).read_text().splitlines() if line.strip())
        title = first.removeprefix("Title:").strip()
        bib_title = re.search(r"title\s*=\s*\{(.*)\},\n", PAPERS[method]).group(1)
        assert _norm(bib_title) == _norm(title), method


def test_encoder_card_is_a_sentence_transformers_card(tmp_path):
    d = licensed_folder(tmp_path, {"LICENSE-Apache-2.0.txt": "Apache License\nVersion 2.0\n"})
    config = method_defaults("maclr")
    summary = {"train_seconds": 3.0, "stage1": {"steps": 2}, "stage2": {"steps": 3},
               "last_validation": {"P@1": 41.5, "P@5": 20.25, "n": 500}}
    card = encoder_card("maclr", "maclr", config, summary, str(d))
    meta, body = split_front_matter(card)
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    assert {"xmc", "sentence-transformers", "dual-encoder", "maclr"} <= set(meta["tags"])
    assert meta["datasets"] == ["toy-data"] and meta["license"] == "apache-2.0"
    (res,) = meta["model-index"][0]["results"]
    assert res["dataset"]["split"] == "validation" and {m["type"]: m["value"] for m in res["metrics"]} == \
        {"P@1": 41.5, "P@5": 20.25}
    assert body.startswith("# maclr: a sentence encoder trained by xmc\n")
    assert "Zero-shot" in section(card, "Model description") and "Extreme Zero-Shot Learning" in card
    # a licence record given by the caller wins; none found: unknown
    card = encoder_card("r", "dexml", {}, {"train_seconds": 1}, "nowhere/data", licence={})
    assert split_front_matter(card)[0]["license_name"] == "unknown-see-dataset" and "not recorded" in card
