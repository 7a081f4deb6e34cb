"""One's own dataset end to end: `make run`'s pipeline (`dvc repro`) on a small dataset in the JSON-lines layout
with title-only labels, no label graph and no document groups.

What a user meets when pointing `data.dataset_dir` at their data: every stage runs, RAMEN regularises with the graph
it can build (no label graph or documents here: the training labels' co-occurrence, said in the one warning line
about the label graph), the label-name retriever reads the titles as names, and the report, the metrics and the
packages come out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.pipeline_repo import make_repo, run, stages_run, results_of

SMALL_BOW = {"kind": "bow", "dim": 32, "n_buckets": 4096, "ngram_max": 2, "tied": True, "dropout": 0.0}
RUNS = {
    "label_prior": {"method": "label_prior"},
    "tfidf_knn": {"method": "tfidf_knn"},
    "name_match": {"method": "name_match"},
    "dexml_bow": {"method": "dexml", "encoder": SMALL_BOW, "train": {"epochs": 2, "batch_size": 32}},
    "ramen": {"method": "ramen", "encoder": SMALL_BOW, "train": {"epochs": 2}, "pruning": {"warmup_epochs": 1}},
    "unidec": {"method": "unidec", "encoder": SMALL_BOW, "model": {"dim": 16},
               "train": {"epochs": 2, "eval_every_epochs": 0}},
    "astra": {"method": "astra", "encoder": SMALL_BOW, "train": {"epochs": 2},
              "negatives": {"start_epoch": 1, "hard_negatives": 4, "uniform_negatives": 16}},
}
METHODS = [*RUNS, "astra_hybrid"]
TINY = {
    "runs": RUNS,
    "hybrids": {"astra_hybrid": {"base": "astra"}},
    "graph.wordnet_dir": "../no-wordnet-here",   # no WordNet on the user's machine either
    "report.paired": [["astra_hybrid", "astra"]],
}

COLOURS = ["red", "blue", "green", "black", "white", "silver"]
THINGS = ["running shoes", "rain jacket", "desk lamp", "coffee mug", "wool scarf", "phone case", "water bottle"]


def write_product_dataset(d: Path, seed: int = 0) -> Path:
    """Titles as labels (``<colour> <thing>``), queries that name one or two of them among other words."""
    rng = random.Random(seed)
    labels = [f"{c} {t}" for c in COLOURS for t in THINGS]
    filler = ["cheap", "new", "for kids", "gift", "sale", "large", "small", "best", "fast delivery", "classic"]

    def records(n: int) -> list[dict]:
        out = []
        for i in range(n):
            ids = sorted(set(rng.sample(range(len(labels)), rng.choice([1, 1, 2]))))
            # each title as a phrase (sometimes without its colour), in random order among filler words
            phrases = [labels[j] if rng.random() < 0.8 else labels[j].split(" ", 1)[1] for j in ids]
            phrases += rng.sample(filler, 2)
            rng.shuffle(phrases)
            out.append({"uid": f"q{i}", "title": " ".join(phrases), "content": "", "target_ind": ids})
        return out

    d.mkdir(parents=True, exist_ok=True)
    (d / "lbl.json").write_text("".join(json.dumps({"uid": f"l{i}", "title": t, "content": ""}) + "\n"
                                        for i, t in enumerate(labels)))
    for name, n in (("trn", 400), ("tst", 120)):
        (d / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in records(n)))
    return d


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    data = write_product_dataset(tmp_path_factory.mktemp("own_data") / "products")
    return make_repo(tmp_path_factory.mktemp("own"), dataset_dir=data, trn_docs=0, tst_docs=0, extra_params=TINY)


def test_make_runs_pipeline_on_a_jsonl_dataset_without_graph_or_groups(repo):
    p = run(["dvc", "repro"], repo, timeout=900)
    ran = set(stages_run(p.stdout))
    assert {"ingest", "validate", "graph", "train@ramen", "train@dexml_bow", "train@astra", "train@unidec",
            "fuse@astra_hybrid", "xr_linear@xr_linear", "report"} <= ran
    log = p.stdout + p.stderr
    # each input the dataset lacks is one warning line: the validation split, document ids, a label graph; RAMEN
    # says what it regularises with
    warnings = [line for line in log.splitlines() if " WARNING " in line]
    for lacking in ("ships no validation split", "has no document ids", "label graph sets skipped"):
        assert sum(lacking in line for line in warnings) == 1, (lacking, warnings)
    assert "RAMEN's label graph is the training labels' co-occurrence" in log and "regularising with cooccurrence" in log
    graphs = json.loads((results_of(repo) / "models/ramen/train_summary.json").read_text())["graphs"]
    assert graphs.get("cooccurrence/label", 0) > 0, graphs
    meta = json.loads((results_of(repo) / "data/processed/meta.json").read_text())
    assert meta["layout"] == "jsonl" and meta["validation"]["unit"] == "rows"
    assert json.loads((results_of(repo) / "data/processed/label_side/manifest.json").read_text()) == {"files": []}
    table = (results_of(repo) / "reports/comparison.md").read_text()
    for m in METHODS:
        assert f"| {m} |" in table, m
    # the titles are the label names: matching them in the query is a strong zero-shot signal here
    assert json.loads((results_of(repo) / "metrics/name_match.json").read_text())["P@1"] > 50
    assert json.loads((results_of(repo) / "metrics/astra_hybrid.json").read_text())["P@1"] > 50
    for m in METHODS:
        assert (results_of(repo) / "packages" / m / "manifest.json").is_file(), m
    assert stages_run(run(["dvc", "repro"], repo).stdout) == []
