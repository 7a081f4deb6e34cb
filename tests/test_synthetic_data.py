"""The synthetic XMC generator (lab/bench/synthetic_xmc.py): loadable by the pipeline's readers, real-data shaped
statistics, byte-identical for a seed, and learnable (TF-IDF finds labels far above chance)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lab.bench.synthetic_xmc import generate, main, word_strings
from xmc.data import detect_layout, load_dataset_dir, split_validation
from xmc.graph.build import document_query_set
from xmc.graph.format import load_graph_dir
from xmc.lexical.names import parse_label_names

N_TRAIN, N_LABELS = 2000, 1000
# the repository's params read WordNet from here (graph.wordnet_dir)
WORDNET = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "wordnet30"
FILES = ("trn.raw.txt", "tst.raw.txt", "lbl.raw.txt", "trn_X_Y.txt", "tst_X_Y.txt", "trn.jsonl", "tst.jsonl",
         "lbl.jsonl", "label_graph.tsv", "graph/taxonomy_anchors.jsonl", "graph/taxonomy_label_edges.tsv")


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("syn") / "ds"
    return d, generate(d, N_TRAIN, N_LABELS, seed=0)


def test_vocabulary_words_are_unique() -> None:
    w = word_strings(60_000)
    assert len(set(w.tolist())) == len(w)
    assert all(len(x) >= 2 and x.isalpha() for x in w[:1000].tolist())


def test_loads_with_the_pipeline_readers(synth: tuple[Path, dict]) -> None:
    d, stats = synth
    assert {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()} == set(FILES) | {"stats.json"}
    assert detect_layout(d) == "xc_raw"
    ds = load_dataset_dir(d)
    assert (len(ds.trn), len(ds.tst), ds.n_labels) == (N_TRAIN, N_TRAIN // 4, N_LABELS)
    assert ds.trn.groups is not None and len(set(ds.trn.groups)) == stats["trn"]["documents"]
    assert not set(ds.trn.groups) & set(ds.tst.groups)  # split by document, like semcor-wn30
    assert int(ds.trn.Y.sum()) == stats["trn"]["pairs"]
    # WordNet-style label texts: the label-name parser finds "names (tag): description"
    names = parse_label_names(ds.label_texts)
    assert names.mode == "prefix" and all(1 <= len(n) <= 2 for n in names.names)
    # validation carving by document group works on it
    carved = split_validation(ds, 0.1, seed=0)
    assert carved.val is not None and not set(carved.val.groups) & set(carved.trn.groups)


def test_statistics_look_like_xmc(synth: tuple[Path, dict]) -> None:
    d, stats = synth
    ds = load_dataset_dir(d)
    per_row = np.diff(ds.trn.Y.indptr)
    assert per_row.min() >= 1 and 3.0 <= per_row.mean() <= 5.5 and per_row.max() >= 15
    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    top = np.sort(freq)[::-1]
    assert top[: N_LABELS // 100].sum() > 0.10 * freq.sum()  # Zipf head
    assert (freq == 0).sum() > 0.02 * N_LABELS  # labels never seen in training ...
    assert stats["tst_labels_unseen_in_trn"] > 0  # ... some of them in the test split (zero-shot)
    assert (freq == 1).sum() > 0.05 * N_LABELS  # a long tail of singletons
    n_tok = np.array([len(t.split()) for t in ds.trn.texts])
    assert n_tok.min() >= 8 and 14 <= n_tok.mean() <= 24
    l_tok = np.array([len(t.split()) for t in ds.label_texts])
    assert l_tok.min() >= 3 and l_tok.max() <= 12
    assert stats["trn"]["avg_labels_per_instance"] == pytest.approx(per_row.mean(), abs=1e-3)
    assert stats["trn"]["labels_unseen"] == int((freq == 0).sum())


def test_same_seed_same_bytes_other_seed_other_bytes(synth: tuple[Path, dict], tmp_path: Path) -> None:
    d, stats = synth
    again = generate(tmp_path / "again", N_TRAIN, N_LABELS, seed=0)
    for f in FILES:
        assert (d / f).read_bytes() == (tmp_path / "again" / f).read_bytes(), f
    on_disk = json.loads((d / "stats.json").read_text())
    for s in (on_disk, again, stats):
        s.pop("generation_seconds")
    assert on_disk == again == json.loads(json.dumps(stats))
    generate(tmp_path / "other", N_TRAIN, N_LABELS, seed=1)
    for f in ("trn.raw.txt", "lbl.raw.txt", "trn_X_Y.txt", "label_graph.tsv"):
        assert (d / f).read_bytes() != (tmp_path / "other" / f).read_bytes(), f


def test_tfidf_finds_labels_far_above_chance(synth: tuple[Path, dict]) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer

    ds = load_dataset_dir(synth[0])
    vec = TfidfVectorizer(sublinear_tf=True).fit(ds.label_texts)
    S = (vec.transform(ds.tst.texts) @ vec.transform(ds.label_texts).T).toarray()
    top1 = S.argmax(1)
    p1 = float(np.asarray(ds.tst.Y[np.arange(len(top1)), top1]).mean())
    prior = float(np.asarray(ds.tst.Y[:, int(np.asarray(ds.trn.Y.sum(0)).argmax())].mean()))
    # measured (seeds 0-2): P@1 0.55-0.59; the most frequent training label 0.06-0.17; chance ~0.004
    assert p1 > 0.4 and p1 > prior + 0.2, (p1, prior)


def test_graph_inputs(synth: tuple[Path, dict]) -> None:
    d, stats = synth
    ds = load_dataset_dir(d)
    lines = (d / "label_graph.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["child", "relation", "parent", "child_is_label", "parent_is_label"]
    rows = [ln.split("\t") for ln in lines[1:]]
    assert sum(r[3] == "1" for r in rows) == N_LABELS and all(r[1] == "hypernym" for r in rows)
    lbl = [json.loads(x) for x in (d / "lbl.jsonl").read_text().splitlines()]
    assert [r["lid"] for r in lbl] == list(range(N_LABELS))
    assert {r[0] for r in rows if r[3] == "1"} == {r["id"] for r in lbl}
    # the RAMEN anchor-set format (graph.source_dir): every label -> its cluster and super-cluster
    sets = load_graph_dir(d / "graph", len(ds.trn), ds.n_labels)
    E = sets["taxonomy"].edges["label"]
    assert E.shape == (N_LABELS, stats["label_graph"]["taxonomy_anchors"]) and (E.getnnz(1) == 2).all()
    # the graph stage's derived query-side set from the document groups
    doc = document_query_set(ds.trn, window=2)
    assert doc.edges["query"].nnz > len(ds.trn)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--out", str(tmp_path / "cli"), "--n-train", "300", "--n-labels", "120", "--n-test", "50", "--seed", "3",
          "--no-label-graph"])
    ds = load_dataset_dir(tmp_path / "cli")
    assert (len(ds.trn), len(ds.tst), ds.n_labels) == (300, 50, 120)
    assert not (tmp_path / "cli" / "label_graph.tsv").exists() and not (tmp_path / "cli" / "lbl.jsonl").exists()
    assert json.loads(capsys.readouterr().out)["trn"]["instances"] == 300


@pytest.mark.skipif(not WORDNET.is_dir(), reason="../shared/datasets/wordnet30 not present")
def test_graph_stage_skips_a_label_graph_that_is_not_wordnet(tmp_path, caplog):
    """A dataset's own taxonomy in label_graph.tsv (nodes that are not WordNet synsets): the wordnet set is skipped
    with one warning instead of an empty anchor set that would stop RAMEN; the document set is still built."""
    import logging
    import shutil
    from types import SimpleNamespace

    from lab.bench.synthetic_xmc import generate
    from xmc.config import load_params
    from xmc.data import load_dataset_dir
    from xmc.features.graph import derive_anchor_sets
    from xmc.workspace import Workspace

    data = tmp_path / "syn"
    generate(data, n_train=600, n_labels=300, seed=0)
    ws = Workspace(tmp_path)
    side = ws.processed / "label_side"
    side.mkdir(parents=True)
    for name in ("label_graph.tsv", "lbl.jsonl"):
        shutil.copy2(data / name, side / name)
    ds = load_dataset_dir(data)
    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    gcfg = params["graph"]
    view = SimpleNamespace(n_labels=len(ds.label_texts), label_uids=[str(i) for i in range(len(ds.label_texts))],
                           label_texts=list(ds.label_texts), trn=ds.trn)
    with caplog.at_level(logging.WARNING, logger="xmc.features"):
        sets = derive_anchor_sets(gcfg, view, ws)
    assert "wordnet" not in sets and "document" in sets
    assert sum("none of the label graph's nodes is a WordNet synset" in r.message for r in caplog.records) == 1
