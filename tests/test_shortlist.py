"""The TF-IDF shortlist re-ranked by a dense model (``index.shortlist``): the re-rank is the model's own ranking of
the shortlisted labels, texts without a shortlist are searched over every label, and the prediction stage keeps
the shortlist only where the validation split does not reject it (xmc.package.build.package_run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from tests.pipeline_repo import ROOT
from xmc.ann.shortlist import rerank, shortlist_candidates
from xmc.config import load_params
from xmc.errors import ConfigError


def test_rerank_orders_each_rows_candidates_by_inner_product_ties_to_the_lower_id():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(50, 8)).astype(np.float32)
    V[7] = V[3]                                   # an exact tie between labels 3 and 7
    q = rng.normal(size=(4, 8)).astype(np.float32)
    q[0] = V[3]                                   # row 0: 3 and 7 score the same, the highest
    cand = np.array([[7, 3, 10, 11, -1], [1, 2, 3, 4, 5], [-1, -1, -1, -1, -1], [9, 8, -1, -1, -1]])
    V16 = V.astype(np.float16)                    # float16 label vectors (an index's storage) are read as they are
    D, I = rerank(q, V16, cand, 3, rows_per_block=2)
    for r in (1, 3):
        c = cand[r][cand[r] >= 0]
        s = V16[c].astype(np.float32) @ q[r]
        best = c[np.argsort(-s, kind="stable")][:3]
        assert I[r, : len(best)].tolist() == best.tolist()
        assert np.allclose(D[r, : len(best)], np.sort(s)[::-1][:3], atol=1e-5)
    assert I[0, :2].tolist() == [3, 7] and D[0, 0] == D[0, 1]
    assert I[2].tolist() == [-1, -1, -1] and np.isneginf(D[2]).all()
    assert I[3, 2] == -1 and np.isneginf(D[3, 2])     # two candidates for k = 3


def test_shortlist_candidates_are_the_labels_sharing_a_term_best_tfidf_first():
    X_lbl = sp.csr_matrix(np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0, 1.0, 0], [0, 0, 1.0]], np.float32))
    X_q = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 0, 0], [0, 0.2, 0.9]], np.float32))
    C = shortlist_candidates(X_q, X_lbl, 3)
    assert C[0].tolist() == [0, 1, -1]            # label 2 and 3 share no term with text 0
    assert C[1].tolist() == [-1, -1, -1]          # no term at all: no shortlist
    assert C[2].tolist() == [3, 2, 1]


def _tiny_run(tmp_path, monkeypatch, shortlist: str, top_k: int = 5):
    """A bag-of-words DEXML run on 8 labels with an approximate (HNSW) index, so that
    ``index.shortlist`` applies; returns (params, dataset)."""
    from xmc.baselines import fit_tfidf
    from xmc.data import Split, XMCDataset, save_processed
    from xmc.config.runs import single_run
    from xmc.methods.harness import train_run
    from xmc.workspace import Workspace

    # "the" in six label texts: texts with it get a shortlist of six, texts without one of fewer than k = 5
    labels = ["the river bank water", "the money bank account", "the green tree leaf", "the red apple fruit",
              "the fast car road", "the blue sea wave", "warm sun light", "cold snow winter"]
    texts = ["the river bank was full of water", "a bank account for money", "a leaf of a green tree",
             "an apple is a red fruit", "a car on the road, fast", "a wave on the blue sea", "the sun was warm",
             "snow in a cold winter", "zzz qqq"] * 3
    rows = [0, 1, 2, 3, 4, 5, 6, 7, 0] * 3
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (np.arange(len(rows)), rows)), shape=(len(rows), 8))

    def split(a: int, b: int) -> Split:
        return Split([f"u{i}" for i in range(a, b)], texts[a:b], Y[a:b])

    ds = XMCDataset(trn=split(0, 18), val=split(0, 9), tst=split(9, 18), label_uids=[f"L{i}" for i in range(8)],
                    label_texts=labels, meta={"content_sha256": "x"})
    monkeypatch.chdir(tmp_path)
    ws = Workspace(tmp_path)
    save_processed(ds, ws.processed)
    params = load_params(ROOT / "params.yaml")
    params["evaluate"]["bootstrap"]["n_resamples"] = 20
    params["evaluate"].update({"top_k": top_k, "recall_ks": [top_k]})
    params["index"].update({"kind": "hnsw", "shortlist": shortlist, "shortlist_k": 6,   # HNSW: IVF needs more vectors
                            "recall_target": None, "nprobe": 1, "pq_fallback": False})
    run = single_run("dexml", {"encoder": {"kind": "bow", "dim": 8, "n_buckets": 1024, "ngram_max": 1},
                               "negatives": {"kind": "in_batch"},
                               "train": {"epochs": 2, "batch_size": 4, "lr": 0.05, "eval_every_epochs": 0}},
                     params, name="tiny")
    fit_tfidf(ds.trn.texts, ds.val.texts, ds.label_texts, params["tfidf"]).save(ws.tfidf)
    train_run(params, run, ws)
    return params, ds, ws, run


def _package(params, ws, run, splits=("val", "tst")):
    from xmc.package.build import package_run

    return package_run(params, "tiny", ws, splits=splits, run_params=run.config)


def _verdicts(monkeypatch, fake):
    """The package stage's paired tests on validation answer ``fake`` (a, b, metric, ...) -> test."""
    monkeypatch.setattr("xmc.package.build.paired_bootstrap", fake)


def test_the_package_stage_keeps_the_shortlist_and_the_package_serves_it(tmp_path, monkeypatch):
    import xmc
    from xmc.baselines.tfidf import TfidfFeatures
    from xmc.encoders.build import load_encoder
    from xmc.predictions import TopK

    params, ds, ws, run = _tiny_run(tmp_path, monkeypatch, "auto")
    # a significant loss on validation would reject the shortlist: make the decision see a tie
    _verdicts(monkeypatch, lambda a, b, metric, *args, **kwargs: {
        "metric": metric, "a": 50.0, "b": 50.0, "diff": 0.0, "ci95": [-1.0, 1.0], "p_value": 1.0})
    out = _package(params, ws, run)
    timing = out["timing"]
    assert timing == json.loads((ws.predictions("tiny") / "timing.json").read_text())
    assert timing["predictor"] == "shortlist" and timing["index_kind"] == "tfidf_shortlist"
    sl = timing["shortlist"]
    assert sl["kept"] and sl["decided_on"] == "val" and sl["test"]["verdict"] == "tie" and sl["texts"] == 9
    assert set(sl["val_metrics_on_exact_texts"]) == {"shortlist", "exact"} and 0 <= timing["index_recall"] <= 1
    assert sl["shortlist_k"] == 6 and list(sl["sizes"]) == ["6"] and sl["exact_texts"] == 9
    section = json.loads((ws.package("tiny") / "manifest.json").read_text())["predictor"]
    assert section == out["predictor"] and section["kind"] == "shortlist" and section["base"]["kind"] == "dense"

    # what the stage wrote: the model's scores over the text's 6 labels of highest TF-IDF cosine, best first;
    # a text sharing a term with fewer than k = 5 labels is searched over every label
    enc = load_encoder(ws.model("tiny"))
    S = enc.encode(ds.tst.texts, "query") @ enc.encode(ds.label_texts, "label").T
    Xq = TfidfFeatures.load(ws.tfidf).transform(ds.tst.texts)
    T = (Xq @ sp.load_npz(ws.tfidf / "X_lbl.npz").T).toarray()
    short = (T > 0).sum(1) < 5
    assert 0 < short.sum() < len(short) and sl["full_searches"]["tst"] == short.sum()
    assert "val" in sl["full_searches"]   # the validation split was predicted while the shortlist was chosen
    ref = TopK.load(ws.predictions("tiny") / "tst_topk.npz")
    for r in range(len(ds.tst.texts)):
        allowed = np.arange(8) if short[r] else np.lexsort((np.arange(8), -T[r]))[:6]
        order = allowed[np.argsort(-S[r, allowed], kind="stable")][:5]
        got = ref.indices[r][ref.indices[r] >= 0]
        assert set(got.tolist()) == set(order.tolist()) and np.allclose(ref.scores[r][: len(got)],
                                                                           S[r, got], atol=1e-5), r
    D, I = xmc.load(str(ws.package("tiny"))).topk(ds.tst.texts, 5)
    assert np.array_equal(I, ref.indices.astype(I.dtype)) and np.allclose(D, ref.scores, atol=1e-6)


def test_the_package_stage_builds_the_index_where_validation_rejects_the_shortlist(tmp_path, monkeypatch):
    params, _, ws, run = _tiny_run(tmp_path, monkeypatch, "auto")
    _verdicts(monkeypatch, lambda a, b, metric, *args, **kwargs: {
        "metric": metric, "a": 40.0, "b": 50.0, "diff": -10.0, "ci95": [-15.0, -5.0], "p_value": 0.001})
    timing = _package(params, ws, run)["timing"]
    assert timing["predictor"] == "dense" and timing["index_kind"] == "hnsw"
    assert timing["shortlist"]["kept"] is False and timing["shortlist"]["test"]["verdict"] == "exact better"
    assert not (ws.package("tiny") / "base").exists() and not (ws.package("tiny") / "tfidf").exists()
    # without a validation split there is nothing to decide on: the index, and the record says why
    timing = _package(params, ws, run, ("tst",))["timing"]
    assert timing["predictor"] == "dense" and "no validation split" in timing["shortlist"]["why"]
    # shortlist: tfidf keeps it without asking; its recall against exact search is still reported
    params["index"]["shortlist"] = "tfidf"
    timing = _package(params, ws, run, ("tst",))["timing"]
    assert timing["predictor"] == "shortlist" and timing["shortlist"]["kept"] and "test" not in timing["shortlist"]
    assert timing["index_recall_queries"] == 9 and 0 <= timing["index_recall"] <= 1
    assert set(timing["shortlist"]["full_searches"]) == {"tst"}


def test_a_shortlist_shorter_than_the_predictions_is_refused(tmp_path, monkeypatch):
    from xmc.package.build import _shortlist_mode

    params = load_params(ROOT / "params.yaml")
    params["index"].update({"kind": "auto", "auto_exact_max": 2, "shortlist": "auto", "shortlist_k": 50})
    with pytest.raises(ConfigError, match="index.shortlist_k"):
        _shortlist_mode(params, "dense", 10)
    assert _shortlist_mode(params, "tfidf_zeroshot", 10) is None          # not a dense predictor
    params["index"]["shortlist_k"] = 200
    assert _shortlist_mode(params, "dense", 2) is None                     # an exact index: nothing to replace
    assert _shortlist_mode(params, "dense", 10) == "auto"
    params["index"]["shortlist"] = "off"
    assert _shortlist_mode(params, "unidec", 10) is None


def test_full_search_of_a_few_texts_equals_exact_search():
    import faiss

    from xmc.ann.shortlist import full_search

    rng = np.random.default_rng(1)
    V = rng.normal(size=(5000, 16)).astype(np.float32)
    q = rng.normal(size=(7, 16)).astype(np.float32)
    D, I = full_search(q, V, 20, block=1024)              # several blocks merged
    D_f, I_f = faiss.knn(q, V, 20, metric=faiss.METRIC_INNER_PRODUCT)
    assert np.array_equal(I, I_f) and np.allclose(D, D_f, atol=1e-4)
    D, I = full_search(q[:2], V[:5], 8)                    # fewer labels than k: -1 / -inf pad
    assert (I[:, 5:] == -1).all() and np.isneginf(D[:, 5:]).all() and sorted(I[0, :5].tolist()) == list(range(5))


@pytest.mark.parametrize("larger_better", [True, False])
def test_the_shortlist_size_is_the_smallest_unless_a_larger_is_significantly_better(tmp_path, monkeypatch,
                                                                                   larger_better):
    params, _, ws, run = _tiny_run(tmp_path, monkeypatch, "auto")
    params["index"]["shortlist_k"] = [7, 5]
    answers = iter([(1.0, 0.001) if larger_better else (1.0, 0.3), (0.0, 1.0)])   # k7 vs k5, then vs exact

    def fake(a, b, metric, *args, **kwargs):
        diff, p = next(answers)
        return {"metric": metric, "a": 50.0 + diff, "b": 50.0, "diff": diff, "ci95": [0.0, 0.0], "p_value": p}

    _verdicts(monkeypatch, fake)
    sl = _package(params, ws, run)["timing"]["shortlist"]
    chosen = 7 if larger_better else 5
    assert sl["kept"] and sl["shortlist_k_candidates"] == [5, 7] and sl["shortlist_k"] == chosen
    assert sl["sizes"]["7"]["test_against_k5"]["verdict"] == ("k7 better" if larger_better else "tie")
    assert json.loads((ws.package("tiny") / "manifest.json").read_text())["predictor"]["shortlist_k"] == chosen
