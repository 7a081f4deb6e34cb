"""Label names as evidence: name parsing, the lemmatising matcher, the label-name retriever, the hybrid fusion
and its package predictor, on small hand-written label sets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from tests.pipeline_repo import SEMCOR
from xmc.lexical import FEATURES, LabelNameMatcher, parse_label_names
from xmc.package.fuse import validation_folds
from xmc.lexical.fusion_fit import fit_boosted_fusion, fit_fusion
from xmc.lexical.hybrid import HYBRID_FEATURES, CandidateTable, FusionWeights, HybridRanker, top_k

WORDNET_STYLE = [
    "breathe, take a breath, respire (v): draw air into, and expel out of, the lungs",   # 0
    "bank (n): sloping land beside a body of water",                                     # 1
    "bank, banking company (n): a financial institution that accepts deposits",          # 2
    "bank (v): do business with a bank",                                                 # 3
    "irregularity, abnormality (n): behavior that breaches the rule",                    # 4
    "one-half, half (n): one of two equal parts",                                        # 5
    "a, angstrom (n): a metric unit of length",                                          # 6  (a function word as a name)
    "take (v): get into one's hands",                                                    # 7
    "river (n): a large natural stream of water",                                        # 8
]


@pytest.fixture
def matcher():
    return LabelNameMatcher(parse_label_names(WORDNET_STYLE), label_texts=WORDNET_STYLE)


def test_names_are_parsed_from_wordnet_style_texts_and_titles():
    n = parse_label_names(WORDNET_STYLE)
    assert n.mode == "prefix" and n.names[0] == ["breathe", "take a breath", "respire"] and n.tags[0] == "v"
    assert n.names[5] == ["one half", "half"] and n.names[2] == ["bank", "banking company"]
    titles = parse_label_names(["Apple iPhone 12, 64 GB", "Harry Potter and the Goblet of Fire"])
    assert titles.mode == "text" and titles.names[1] == ["harry potter and the goblet of fire"] and titles.tags == [None, None]
    assert parse_label_names(WORDNET_STYLE, "text").names[1] == ["bank (n): sloping land beside a body of water"]


def test_inflected_and_multi_word_names_match(matcher):
    m = matcher.match("He took a breath on the banks of the rivers ; irregularities were one-half of it .")
    assert m[0].words == 3 and m[0].pos_agrees            # took a breath -> take a breath
    assert {1, 2, 3, 4, 5, 7, 8} <= set(m)                # banks, irregularities, one-half, took, rivers
    assert m[1].ambiguity == 3 and m[4].ambiguity == 1    # three labels are named "bank"
    assert m[5].words == 2                                # "one-half" spells the two-word name "one half"


def test_part_of_speech_agreement(matcher):
    m = matcher.match("She banked the cheque")           # banked: a verb form only
    assert m[3].pos_agrees and not m[1].pos_agrees and not m[2].pos_agrees


def test_function_word_names_match_but_rank_below_content_matches(matcher):
    from xmc.package.lexical_predictors import LabelNamePredictor

    p = LabelNamePredictor(matcher, "zero_shot", None)
    D, I = p.search(["take a breath by a river"], 5)
    ids = I[0].tolist()
    assert 6 in ids and ids.index(0) < ids.index(6) and ids.index(8) < ids.index(6)


def test_sense_prior_prefers_the_frequent_sense(matcher):
    counts = np.zeros(len(WORDNET_STYLE))
    counts[[1, 2, 3]] = [2, 30, 1]
    prior, mfs = matcher.sense_prior(counts)
    assert prior[2] > prior[1] > prior[3] and mfs[2] and not mfs[1]
    assert np.isclose(prior[1] + prior[2] + prior[3], 1.0)
    # the prior ranking puts the most frequent sense first
    from xmc.package.lexical_predictors import LabelNamePredictor

    D, I = LabelNamePredictor(matcher, "prior", counts).search(["a bank"], 3)
    assert I[0, 0] == 2


def test_fusion_learns_to_use_name_evidence_and_ranks_the_union():
    """A base method whose top-1 is always a wrong label and whose list misses the true one: the true label is
    named in each text, so the fused ranking (fit on half the texts, checked on the other half) finds it."""
    rng = np.random.default_rng(0)
    n_labels, texts, gold, D, I = len(WORDNET_STYLE), [], [], [], []
    words = {4: "irregularities", 8: "rivers", 5: "one-half", 0: "took a breath"}
    for i in range(80):
        true = int(rng.choice(list(words)))
        texts.append(f"there were {words[true]} here")
        gold.append(true)
        wrong = [x for x in range(n_labels) if x != true]
        ids = rng.permutation(wrong)[:4]
        D.append(np.sort(rng.random(4))[::-1].astype(np.float32))
        I.append(ids)
    D, I = np.array(D), np.array(I)
    Y = sp.csr_matrix((np.ones(80), (np.arange(80), gold)), shape=(80, n_labels))
    ranker = HybridRanker(WORDNET_STYLE, "auto", np.ones(n_labels))
    fit = ranker.table(texts[:40], D[:40], I[:40])
    ranker.weights = fit_fusion(fit, Y[:40])
    w = dict(zip(HYBRID_FEATURES, ranker.weights.weights))
    assert w["matched"] > 0
    S, R = ranker.rank(texts[40:], D[40:], I[40:], 3)
    assert (R[:, 0] == np.array(gold[40:])).mean() > 0.9
    assert (I[40:, 0] == np.array(gold[40:])).mean() == 0.0   # the base method alone: never


def test_validation_folds_keep_documents_together():
    groups = ["d1", "d1", "d2", "d3", "d2", None, "d3"]
    f = validation_folds(groups, len(groups), 2)
    assert f[0] == f[1] and f[2] == f[4] and f[3] == f[6] and set(f) == {0, 1}
    assert set(validation_folds(["d1"] * 6, 6, 2)) == {0, 1}   # one document: blocks of rows


@pytest.mark.parametrize("fusion", ["logistic", "boosted_trees"])
def test_hybrid_package_predicts_like_the_ranker(tmp_path, fusion):
    """A package around a base run's package + a fusion (logistic weights, or trees read back from the package's
    JSON): the API's top-k equals the ranker applied to the base predictor's top-k (what the fuse stage writes), and
    the base's files are hard links of the base package's."""
    import xmc
    from tests.package_fixtures import trained_bow
    from xmc.io import atomic_dir
    from xmc.package import build_package, finish_package
    from xmc.package.lexical_predictors import HybridPredictor

    uids = [f"L{i}" for i in range(len(WORDNET_STYLE))]
    texts = ["the banks of the river", "took a breath", "irregularities in one-half of them"]
    trained_bow(WORDNET_STYLE + texts, dim=16, n_buckets=2048).save(tmp_path / "model")
    build_package(tmp_path / "base_pkg", name="base", method="dexml", source=tmp_path / "model", label_uids=uids,
                  label_texts=WORDNET_STYLE, options={"index": {"kind": "exact"}})
    base = xmc.load(str(tmp_path / "base_pkg"))
    D, I = base.topk(texts, 5)
    assert (np.abs(D) > 0).all()   # a trained encoder's scores, not the zeros of untouched rows
    ranker = HybridRanker(WORDNET_STYLE, "auto", np.arange(len(WORDNET_STYLE), dtype=float))
    Y = sp.csr_matrix((np.ones(3), ([0, 1, 2], [8, 0, 4])), shape=(3, len(WORDNET_STYLE)))
    if fusion == "logistic":
        ranker.weights = fit_fusion(ranker.table(texts, D, I), Y)
    else:   # three texts are too few to grow trees on: trees grown on the interaction table, same features
        from xmc.config.schema import BoostedTreesFusionConfig
        from xmc.lexical.hybrid import BoostedTreesFusion

        ranker.weights = fit_boosted_fusion(*_interaction_table(), BoostedTreesFusionConfig().model_dump())
        assert isinstance(ranker.weights, BoostedTreesFusion)
    with atomic_dir(tmp_path / "hybrid_pkg") as tmp:
        section = HybridPredictor.build(tmp_path / "base_pkg", tmp, WORDNET_STYLE, {"ranker": ranker, "base_k": 5})
        finish_package(tmp, section, name="hyb", method="hybrid", label_uids=uids, label_texts=WORDNET_STYLE)
    assert section["base"] == json.loads((tmp_path / "base_pkg/manifest.json").read_text())["predictor"]
    weights = [f for f in (tmp_path / "base_pkg").rglob("*") if f.is_file() and f.parent != tmp_path / "base_pkg"]
    assert weights
    for f in weights:   # one copy on disk: the base's predictor files are hard links
        linked = tmp_path / "hybrid_pkg/base" / f.relative_to(tmp_path / "base_pkg")
        assert linked.stat().st_ino == f.stat().st_ino, f
    S, R = xmc.load(str(tmp_path / "hybrid_pkg")).topk(texts, 4)
    S2, R2 = ranker.rank(texts, D, I, 4)
    assert np.array_equal(R, R2) and np.allclose(S, S2)


def test_zero_shot_name_topk_ranks_like_the_name_retriever(matcher):
    from xmc.lexical import zero_shot_name_topk
    from xmc.package.lexical_predictors import LabelNamePredictor

    texts = ["take a breath by a river", "no name here at all", "the banks"]
    ids, scores = zero_shot_name_topk(matcher, texts, 3)
    D, I = LabelNamePredictor(matcher, "zero_shot", None).search(texts, 3)
    assert ids.dtype == np.int32 and ids.shape == (3, 3)
    assert (ids == I).all() and np.allclose(scores[ids >= 0], D[I >= 0])
    assert ids[0, 0] == 0 and (ids[1] == -1).all() and np.isneginf(scores[1]).all()
    assert set(ids[2]) == {1, 2, 3}   # the three labels named "bank"


def test_valtuned_fusion_reads_no_training_counts_and_lets_the_method_pick_the_sense():
    """Three labels share the name "bank": the name evidence ties them, the method's score breaks the tie. The
    fusion ignores training counts (a zero-shot ranker), and the grid picks the weight that lets the method in."""
    from xmc.lexical.hybrid import choose_valtuned_fusion, precision_at, valtuned_fusion

    n = len(WORDNET_STYLE)
    texts = ["money in the bank"] * 6 + ["the bank of the river"] * 6
    gold = [2] * 6 + [1] * 6
    # the method ranks the right "bank" first, but its own list also holds unnamed labels above the others
    I = np.array([[2, 6, 1, 3]] * 6 + [[1, 6, 2, 3]] * 6)
    D = np.tile(np.array([0.9, 0.8, 0.3, 0.2], np.float32), (12, 1))
    Y = sp.csr_matrix((np.ones(12), (np.arange(12), gold)), shape=(12, n))
    skewed = np.zeros(n)
    skewed[3] = 1000.0   # training counts that would favour label 3: must not matter
    for counts in (np.zeros(n), skewed):
        ranker = HybridRanker(WORDNET_STYLE, "auto", counts)
        table = ranker.table(texts, D, I)
        names_only = valtuned_fusion(0.0, 0.0)
        w = dict(zip(HYBRID_FEATURES, names_only.weights))
        assert w["log_train_count"] == 0 and w["log_sense_prior"] == 0 and w["most_frequent_sense"] == 0
        rows = np.arange(12)
        p_names = precision_at(table, names_only.score(table.X), Y, rows, 1)
        best, info = choose_valtuned_fusion(table, Y, rows, [0.0, 1.0, 10.0], [0.0, 10.0], 1)
        assert info["method_weight"] > 0 and info["P@1"] == 100.0 and p_names < 100.0
        ranker.weights = best
        S, R = ranker.rank(texts, D, I, 2)
        assert (R[:, 0] == np.array(gold)).all()


def test_valtuned_fusion_keeps_the_run_where_the_names_mislead():
    """650 texts name "river" (label 8): on 400 it is the answer and the run ranks a wrong label first; on 250 the run
    is right and the name misleads. By P@1 alone the names win (61.5 against 38.5); under
    hybrid.max_loss_without_name_match only a weight that keeps the run's ranking is eligible, and a grid without one
    takes the point losing least and says the bound was not met."""
    from xmc.lexical.hybrid import choose_valtuned_fusion
    from xmc.package.fuse import with_correct_name_match

    n, named, misled_n = len(WORDNET_STYLE), 400, 250
    texts = ["the river"] * (named + misled_n)
    gold = [8] * named + [5] * misled_n
    I = np.tile(np.array([5, 8, 0, 4]), (len(texts), 1))
    D = np.tile(np.array([0.9, 0.8, 0.3, 0.2], np.float32), (len(texts), 1))
    Y = sp.csr_matrix((np.ones(len(texts)), (np.arange(len(texts)), gold)), shape=(len(texts), n))
    table = HybridRanker(WORDNET_STYLE, "auto", np.zeros(n)).table(texts, D, I)
    misled = ~with_correct_name_match(table, HYBRID_FEATURES, Y)
    assert misled.sum() == misled_n
    rows, grid = np.arange(len(texts)), [0.0, 1.0, 1.0e6]
    _, free = choose_valtuned_fusion(table, Y, rows, grid, [0.0, 10.0], 1)
    assert free["method_weight"] < 1e6 and free["P@1"] == round(100 * named / len(texts), 3)
    _, bound = choose_valtuned_fusion(table, Y, rows, grid, [0.0, 10.0], 1, misled, 1.0, 200)
    assert bound["method_weight"] == 1e6 and bound["bound_met"] is True
    assert bound["loss without a correct name match"] <= 1.0 and bound["P@1"] == round(100 * misled_n / len(texts), 3)
    _, few = choose_valtuned_fusion(table, Y, rows, grid, [0.0, 10.0], 1, misled, 1.0, misled_n + 1)
    assert (few["method_weight"], few["P@1"]) == (free["method_weight"], free["P@1"]) and "bound_met" not in few
    _, none = choose_valtuned_fusion(table, Y, rows, [0.0], [0.0, 10.0], 1, misled, 1.0, 200)
    assert none["bound_met"] is False and none["loss without a correct name match"] == 100.0


def _fuse_params(**hybrid):
    from xmc.config.schema import EvaluateConfig, HybridConfig, IndexConfig, filled

    return {"hybrid": filled(HybridConfig, hybrid, "hybrid"),
            "label_names": {"mode": "auto", "max_words": 4, "cased_names": True},
            "evaluate": filled(EvaluateConfig, {"top_k": 5, "ks": [1, 3, 5], "recall_ks": [5],
                                                "bootstrap": {"n_resamples": 20}}, "evaluate"),
            "index": filled(IndexConfig, {"kind": "exact"}, "index")}


def _fuse_workspace(root, tst_texts, tst_gold, trn_gold, runs, trn_texts=None):
    """A processed dataset of WORDNET_STYLE labels in ``root`` and, for each run (name -> bag-of-words seed), its
    package and its validation and test top-5 (what a package stage writes): the inputs of a fuse stage."""
    import xmc
    from tests.package_fixtures import trained_bow
    from xmc.data import Split, XMCDataset, save_processed
    from xmc.package import build_package
    from xmc.predictions import TopK
    from xmc.workspace import Workspace

    ws = Workspace(root)
    uids = [f"L{i}" for i in range(len(WORDNET_STYLE))]
    n_l = len(WORDNET_STYLE)
    val_texts = ["money in the bank", "the bank of the river", "took a breath", "rivers and banks"] * 3
    val_gold = [[2], [1, 8], [0], [8, 1]] * 3

    def Y(gold):
        rows = [i for i, g in enumerate(gold) for _ in g]
        return sp.csr_matrix((np.ones(len(rows)), (rows, [c for g in gold for c in g])), shape=(len(gold), n_l))

    ds = XMCDataset(uids, WORDNET_STYLE,
                    Split([f"t{i}" for i in range(len(trn_gold))], trn_texts or [f"x{i}" for i in range(len(trn_gold))],
                          Y(trn_gold), [f"d{i}" for i in range(len(trn_gold))]),
                    Split([f"s{i}" for i in range(len(tst_texts))], tst_texts, Y(tst_gold),
                          [f"e{i}" for i in range(len(tst_texts))]), meta={"layout": "test"},
                    val=Split([f"v{i}" for i in range(12)], val_texts, Y(val_gold), [f"g{i % 4}" for i in range(12)]))
    save_processed(ds, ws.processed)
    for run, seed in runs.items():
        trained_bow(WORDNET_STYLE + val_texts + tst_texts, dim=16, n_buckets=2048, seed=seed).save(root / "trained" / run)
        build_package(ws.package(run), name=run, method="dexml", source=root / "trained" / run, label_uids=uids,
                      label_texts=WORDNET_STYLE, options={"index": {"kind": "exact"}})
        base = xmc.load(str(ws.package(run)))
        for split, texts in (("val", val_texts), ("tst", tst_texts)):
            D, I = base.topk(texts, 5)   # evaluate.top_k: the predictor searches each base as deep
            TopK(I.astype(np.int32), D.astype(np.float32)).save(ws.predictions(run) / f"{split}_topk.npz")
        (ws.predictions(run) / "timing.json").write_text(json.dumps({"train_seconds": 2.0, "predict_seconds": 0.5}))
        _evaluate_base(ws, run)
    return ws, uids, ds


def _evaluate_base(ws, run):
    """The base run's evaluation records (its contributions: what the hybrid's by-name-match table compares)."""
    from xmc.data import load_processed
    from xmc.evaluation import evaluate_and_write

    evaluate_and_write(ws, run, load_processed(ws.processed), ("val", "tst"), _fuse_params())


@pytest.mark.parametrize("fusion", ["grid", "boosted_trees", "auto"])
def test_valtuned_fusion_does_not_depend_on_the_training_labels(tmp_path, fusion):
    """fuse(valtuned=True): the two weights chosen on validation from the grids, or boosted trees fit there, or
    (auto) the better of the two by cross-fitted validation P@k; the test split is ranked, and the hybrid package
    ranks the same. The training split is read only to evaluate (label propensities): with other training labels
    the fusion, its rankings and its package are byte for byte the same."""
    import xmc
    from xmc.package.fuse import fuse
    from xmc.predictions import TopK

    tst_texts = ["a bank by the river", "take a breath now"]
    params = _fuse_params(valtuned={"method_weight": [0.0, 1.0], "matched_bonus": [0.0], "fusion": fusion},
                          boosted_trees={"min_samples_leaf": 2, "early_stopping": False, "max_iter": 20})
    runs = {}
    for trn_gold in ([[0]], [[2], [2], [3], [7]]):
        root = tmp_path / f"trn{len(trn_gold)}"
        ws, uids, _ = _fuse_workspace(root, tst_texts, [[1, 8], [0]], trn_gold, {"base": 0})
        summary = fuse(params, "base_valtuned_hybrid", ["base"], ws, valtuned=True)
        chosen = summary["chosen_on_validation"]
        assert summary["valtuned"] and {"against_base", "first_bonus"} <= set(chosen)
        kind = chosen["valtuned_fusion"]["chosen"] if fusion == "auto" else fusion
        if fusion == "auto":
            assert kind in ("grid", "boosted_trees") and {"grid", "boosted_trees"} <= set(chosen["valtuned_fusion"])
        if kind == "grid" and "kept" not in chosen["against_base"]:
            assert {"fold_0", "fold_1", "all"} <= set(chosen)
            w = dict(zip(summary["fusion"]["features"], summary["fusion"]["weights"]))
            assert w["log_train_count"] == 0 and w["log_sense_prior"] == 0 and w["most_frequent_sense"] == 0
        elif kind == "boosted_trees" and "kept" not in chosen["against_base"]:
            assert summary["fusion"]["kind"] == "boosted_trees"
        out = ws.predictions("base_valtuned_hybrid")
        tst = TopK.load(out / "tst_topk.npz")
        assert (out / "val_topk.npz").is_file()
        if kind == "grid":   # 12 validation texts teach trees little; the grid's name weight ranks it first
            assert tst.indices[1, 0] == 0   # "take a breath" names label 0
        assert ws.metrics("base_valtuned_hybrid", "val").is_file() and ws.metrics("base_valtuned_hybrid", "tst").is_file()
        S, R = xmc.load(str(ws.package("base_valtuned_hybrid"))).topk(tst_texts, 5)
        assert np.array_equal(R, tst.indices) and np.allclose(S, tst.scores)
        runs[len(trn_gold)] = (summary["fusion"], TopK.load(out / "val_topk.npz"), tst, S, R)
    (f1, v1, t1, S1, R1), (f4, v4, t4, S4, R4) = runs.values()
    assert f1 == f4
    assert np.array_equal(v1.indices, v4.indices) and np.array_equal(v1.scores, v4.scores)
    assert np.array_equal(t1.indices, t4.indices) and np.array_equal(t1.scores, t4.scores)
    assert np.array_equal(R1, R4) and np.array_equal(S1, S4)


def test_cased_names_match_only_their_spelling_and_short_ones_not_first():
    """WordNet writes abbreviations and proper nouns with capitals: "He" (helium) and "Sat" (Saturday) must not
    match the pronoun and the verb form, while a case-blind matcher takes them."""
    labels = ["helium, He (n): a very light gas", "Saturday, Sabbatum, Sat (n): the seventh day",
              "sit, sit down (v): be seated", "Paris, City of Light (n): the capital of France",
              "bank (n): sloping land beside a body of water"]
    names = parse_label_names(labels)
    assert names.cased[0] == {"he": "He"} and names.cased[3] == {"paris": "Paris", "city of light": "City of Light"}
    blind = LabelNameMatcher(names, label_texts=labels)
    cased = LabelNameMatcher(names, label_texts=labels, cased_names=True)
    text = "He sat on the bank on Saturday ."
    assert {0, 1, 2, 4} <= set(blind.match(text))
    got = cased.match(text)
    assert 0 not in got and 2 in got and 4 in got   # "He" first and short: not helium; "sat": the verb only
    assert 1 in got and got[1].words == 1           # by "Saturday", spelt as in the label
    assert 1 not in cased.match("He sat down .")    # "sat" is not "Sat"
    assert 0 in cased.match("Balloons filled with He rise .")
    assert 3 in cased.match("Paris in spring") and 3 not in cased.match("the paris of the world")


def test_label_text_views_split_names_from_descriptions_and_leave_titles_whole():
    from xmc.lexical.names import label_text_view

    assert label_text_view(WORDNET_STYLE[0], "names") == "breathe, take a breath, respire (v)"
    assert label_text_view(WORDNET_STYLE[0], "description") == "draw air into, and expel out of, the lungs"
    assert label_text_view(WORDNET_STYLE[0], "full") == WORDNET_STYLE[0]
    # a title has no description: every view reads it whole
    assert {label_text_view("Harry Potter and the Goblet of Fire", v) for v in ("full", "names", "description")} \
        == {"Harry Potter and the Goblet of Fire"}
    with pytest.raises(Exception, match="label_text"):
        label_text_view(WORDNET_STYLE[0], "gloss")


def test_encoder_label_view_changes_only_the_label_side_and_is_saved(tmp_path):
    from xmc.encoders.build import build_encoder, load_encoder

    enc = build_encoder({"kind": "bow", "dim": 16, "n_buckets": 1024, "label_text": "names"})
    full = build_encoder({"kind": "bow", "dim": 16, "n_buckets": 1024})
    text = WORDNET_STYLE[1]
    names_only = full.encode(["bank (n)"], "label")
    assert np.allclose(enc.encode([text], "label"), names_only)                    # the label side reads the names
    assert np.allclose(enc.encode([text], "query"), full.encode([text], "query"))  # queries are read whole
    assert not np.allclose(full.encode([text], "label"), names_only)
    enc.save(tmp_path / "enc")
    assert load_encoder(tmp_path / "enc").label_text == "names"


def test_name_match_negatives_are_the_named_labels_minus_the_positives():
    from xmc.negatives import build_sampler

    texts = ["we sat on the bank of the river", "she took a breath"]
    Y = sp.csr_matrix(np.array([[0, 1, 0, 0, 0, 0, 0, 0, 1], [1, 0, 0, 0, 0, 0, 0, 0, 0]], np.float32))
    cfg = {"kind": "in_batch", "max_positives_per_query": 0, "name_match_per_query": 5, "name_match_shortlist": 5}
    sampler = build_sampler(Y, cfg, texts, WORDNET_STYLE, {"mode": "auto", "max_words": 4, "cased_names": True})
    named = [set(r[r >= 0].tolist()) for r in sampler.name_shortlist]
    assert named[0] == {2, 3}          # the other "bank" senses, not the tagged bank (1) or river (8)
    assert 0 not in named[1] and 7 in named[1]   # "took" names take (7); the tagged breathe (0) is no negative
    batch = sampler.make_batch(np.array([0, 1]), np.random.default_rng(0))
    assert {2, 3, 7} <= set(batch.label_ids.tolist())
    with pytest.raises(Exception, match="name_match_per_query"):
        build_sampler(Y, cfg)


def test_ensemble_fusion_learns_which_member_to_trust():
    """Two runs fused: one always ranks a wrong label first, the other ranks the true label first but lower in its
    own scores; fit on half the texts, the ensemble ranks the true label first on the other half, by the weight of
    the second run's rank (no label name is in these texts)."""
    from xmc.lexical.hybrid import hybrid_features

    rng = np.random.default_rng(0)
    n_labels, n = len(WORDNET_STYLE), 60
    gold = rng.integers(0, n_labels, n)
    texts = ["nothing named here"] * n
    I_a = np.array([[(g + 1) % n_labels, (g + 2) % n_labels, g] for g in gold])    # true label third
    I_b = np.array([[g, (g + 3) % n_labels, (g + 4) % n_labels] for g in gold])    # true label first
    D_a = np.tile(np.array([0.9, 0.8, 0.7], np.float32), (n, 1))
    D_b = np.tile(np.array([0.3, 0.2, 0.1], np.float32), (n, 1))
    Y = sp.csr_matrix((np.ones(n), (np.arange(n), gold)), shape=(n, n_labels))
    ranker = HybridRanker(WORDNET_STYLE, "auto", np.ones(n_labels), members=["a", "b"])
    assert ranker.features == hybrid_features(["a", "b"]) and ranker.features[:2] == ("a:method_score", "a:method_retrieved")
    half = slice(0, n // 2)
    table = ranker.table_many(texts[half], [(D_a[half], I_a[half]), (D_b[half], I_b[half])])
    assert table.X.shape[1] == len(ranker.features)
    ranker.weights = fit_fusion(table, Y[half], features=ranker.features)
    w = dict(zip(ranker.features, ranker.weights.weights))
    # the second run's order is what the fusion trusts: a better (lower) rank there raises the score, not in the first
    assert w["b:method_rank"] < w["a:method_rank"] - 1.0
    rest = slice(n // 2, n)
    _, R = ranker.rank_many(texts[rest], [(D_a[rest], I_a[rest]), (D_b[rest], I_b[rest])], 3)
    assert (R[:, 0] == gold[rest]).all()
    assert (I_a[rest, 0] == gold[rest]).mean() == 0.0   # the first run alone: never
    with pytest.raises(ValueError, match="fuses 2 run"):
        ranker.table_many(texts[:2], [(D_a[:2], I_a[:2])])


def test_ensemble_fuse_stage_and_its_package_rank_alike(tmp_path):
    """fuse over two runs' predictions (the lab's ensemble): validation (cross-fitted) and test rankings are written,
    the summary names the members and sums their costs, and the package built with it ranks the test texts exactly
    as the stage did, searching each member's own predictor."""
    import xmc
    from xmc.package.fuse import fuse
    from xmc.predictions import TopK

    tst_texts = ["a bank by the river", "take a breath now", "one-half of the irregularities"]
    ws, uids, _ = _fuse_workspace(tmp_path, tst_texts, [[1, 8], [0], [5, 4]], [[0], [1]], {"one": 0, "two": 1})
    params = _fuse_params()
    params["label_names"]["cased_names"] = False
    summary = fuse(params, "ensemble_hybrid", ["one", "two"], ws)
    assert summary["members"] == ["one", "two"] and summary["fusion"]["features"][:8] == [
        f"{m}:{f}" for m in ("one", "two") for f in ("method_score", "method_retrieved", "method_rank", "method_gap")]
    assert summary["train_seconds"] >= 4.0 and summary["predict_seconds"] >= 1.0   # both members' costs
    out = ws.predictions("ensemble_hybrid")
    tst = TopK.load(out / "tst_topk.npz")
    assert TopK.load(out / "val_topk.npz").indices.shape == (12, 5) and tst.indices.shape == (3, 5)
    assert tst.indices[1, 0] == 0   # "take a breath" names label 0
    assert sorted(p.name for p in (ws.package("ensemble_hybrid") / "bases").iterdir()) == ["one", "two"]
    S, R = xmc.load(str(ws.package("ensemble_hybrid"))).topk(tst_texts, 5)
    assert np.array_equal(R, tst.indices) and np.allclose(S, tst.scores)

    # a hybrid whose base is another run (hybrids one_hybrid: {base: two}, as dexml_bow_hybrid: {base:
    # dexml_bow_epochs10}) fuses that run's predictions and ships a predictor over that run's package
    summaries = {h: fuse(params, h, ["two"], ws) for h in ("one_hybrid", "two_hybrid")}
    assert summaries["one_hybrid"]["base"] == summaries["two_hybrid"]["base"] == "two"
    for split in ("val", "tst"):
        mine, theirs = (TopK.load(ws.predictions(h) / f"{split}_topk.npz") for h in ("one_hybrid", "two_hybrid"))
        assert np.array_equal(mine.indices, theirs.indices) and np.array_equal(mine.scores, theirs.scores)
    S, R = xmc.load(str(ws.package("one_hybrid"))).topk(tst_texts, 5)   # searches run two's predictor
    ranked = TopK.load(ws.predictions("one_hybrid") / "tst_topk.npz")
    assert np.array_equal(R, ranked.indices) and np.allclose(S, ranked.scores)
    own = fuse(params, "one_hybrid", ["one"], ws)   # its own run's candidates: other rankings
    assert own["base"] == "one"
    assert not np.array_equal(TopK.load(ws.predictions("one_hybrid") / "val_topk.npz").scores,
                              TopK.load(ws.predictions("two_hybrid") / "val_topk.npz").scores)
    # a lab hybrid fuses a run whose package is not kept: predictions only, from the base's workspace
    from xmc.workspace import Workspace

    lab = Workspace(tmp_path / "lab_run", data_root=tmp_path)
    fuse(params, "two_hybrid", ["two"], lab, splits=("val",), base_ws=ws, with_package=False)
    assert not lab.package("two_hybrid").exists() and not (lab.predictions("two_hybrid") / "tst_topk.npz").exists()
    assert np.array_equal(TopK.load(lab.predictions("two_hybrid") / "val_topk.npz").indices,
                          TopK.load(ws.predictions("two_hybrid") / "val_topk.npz").indices)
    assert lab.metrics("two_hybrid", "val").is_file() and not lab.metrics("two_hybrid", "tst").exists()
    from xmc.errors import ConfigError

    with pytest.raises(ConfigError, match="splits must include val"):
        fuse(params, "two_hybrid", ["two"], lab, splits=("tst",), base_ws=ws, with_package=False)
    with pytest.raises(ConfigError, match="missing \\(run the package stage of nope\\)"):
        fuse(params, "nope_hybrid", ["nope"], ws)


def test_a_hybrid_is_a_named_base_run_and_a_fusion_kind(tmp_path):
    """A hybrid is {base: <run>, fusion: trained | valtuned} under its name (DVC iterates hybrids by key)."""
    import yaml

    from xmc.config import load_params
    from xmc.errors import ConfigError
    from tests.pipeline_repo import ROOT

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    loaded = load_params(ROOT / "params.yaml")["hybrids"]
    assert loaded["maclr_valtuned_hybrid"] == {"base": "maclr", "fusion": "valtuned"}
    assert loaded["astra_hybrid"] == {"base": "astra", "fusion": "trained"}   # trained by default
    for bad, message in ((["astra", "ramen"], r"hybrids: Input should be a valid dictionary"),
                         ({"x_hybrid": {"base": "astra", "fusion": "later"}}, "hybrids.x_hybrid.fusion: "),
                         ({"x_hybrid": {"fusion": "trained"}}, "hybrids.x_hybrid.base: required key is missing")):
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({**params, "hybrids": bad}, sort_keys=False))
        with pytest.raises(ConfigError, match=message):
            load_params(tmp_path / "params.yaml")


def test_the_ensemble_stage_depends_on_every_member_it_fuses():
    """DVC cannot expand a params list into deps: the lab's ensemble stage lists the members by hand, so a member
    added in lab/params.yaml without its predictions dep would not rerun the stage when that run changes."""
    import yaml

    from lab.config import load_lab
    from tests.pipeline_repo import ROOT

    members = load_lab(ROOT / "lab/params.yaml", ROOT / "params.yaml")["lab"]["ensemble"]["members"]
    assert len(members) >= 2
    deps = yaml.safe_load((ROOT / "lab/dvc.yaml").read_text())["stages"]["ensemble"]["deps"]
    deps = [d.removeprefix("results/${data.name}/") for d in deps]   # the product's outputs of the dataset
    assert {d for d in deps if d.split("/")[0] in ("predictions", "packages")} == {f"predictions/{m}" for m in members}


def _interaction_table(n_rows: int = 600, per_row: int = 12, seed: int = 0):
    """Candidates whose truth needs an interaction: a name match helps only a candidate the method ranks high,
    and the sense prior matters only for a matched name (what a weighted sum cannot express)."""
    rng = np.random.default_rng(seed)
    n = n_rows * per_row
    col = {f: HYBRID_FEATURES.index(f) for f in ("method_score", "method_retrieved", "matched", "log_sense_prior")}
    X = rng.normal(size=(n, len(HYBRID_FEATURES)))
    X[:, col["method_retrieved"]] = (rng.random(n) < 0.8).astype(float)
    X[:, col["matched"]] = (rng.random(n) < 0.3).astype(float)
    matched = X[:, col["matched"]]
    logit = 2.5 * matched * np.tanh(2 * X[:, col["method_score"]]) + 1.5 * matched * X[:, col["log_sense_prior"]] - 1.0
    y = rng.random(n) < 1 / (1 + np.exp(-logit))
    rows = np.repeat(np.arange(n_rows), per_row)
    labels = np.tile(np.arange(per_row), n_rows)
    gold = sp.csr_matrix((y.astype(float), (rows, labels)), shape=(n_rows, per_row))
    return CandidateTable(rows, labels, X), gold


def test_boosted_fusion_scores_as_scikit_learn_and_survives_json():
    """The exported trees give scikit-learn's decision_function (missing values included) and the same scores after
    a JSON round trip; a malformed tree is refused."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from xmc.config.schema import BoostedTreesFusionConfig
    from xmc.lexical.hybrid import BoostedTreesFusion, fusion_from_json

    table, gold = _interaction_table()
    X = table.X.copy()
    X[::13, 0] = np.nan   # never seen in fitting: scikit-learn sends such values to the larger child
    st = BoostedTreesFusionConfig().model_dump()
    fusion = fit_boosted_fusion(table, gold, st)
    assert isinstance(fusion, BoostedTreesFusion) and 1 < len(fusion.trees) <= st["max_iter"]
    y = np.asarray(gold[table.rows, table.labels]).ravel() > 0
    clf = HistGradientBoostingClassifier(**{k: st[k] for k in fusion.settings if k != "n_iter"}, random_state=0)
    clf.fit(table.X, y)
    np.testing.assert_allclose(fusion.score(X), clf.decision_function(X), rtol=0, atol=1e-9)
    from xmc.native import trees_score

    assert trees_score() is not None   # the C kernel builds here, and adds the trees as the numpy path does
    assert np.array_equal(fusion.score(X), fusion.score(X, native=False))
    assert np.array_equal(fusion.score(X[:1]), fusion.score(X[:1], native=False)) and fusion.score(X[:0]).shape == (0,)
    again = fusion_from_json(json.loads(json.dumps(fusion.to_json())))
    assert isinstance(again, BoostedTreesFusion) and np.array_equal(again.score(X), fusion.score(X))
    d = fusion.describe()
    assert d["kind"] == "boosted_trees" and d["n_trees"] == len(fusion.trees) and "trees" not in d
    broken = fusion.to_json()
    broken["trees"][0]["left"][0] = 0   # a node that is its own child
    with pytest.raises(ValueError, match="inconsistent"):
        fusion_from_json(broken)
    with pytest.raises(ValueError, match="unknown fusion kind"):
        fusion_from_json({**fusion.to_json(), "kind": "forest"})
    assert isinstance(fusion_from_json(fit_fusion(table, gold).to_json()), FusionWeights)   # the format before trees


def test_boosted_fusion_ranks_better_than_the_logistic_one_where_features_interact():
    """On held-out rows of the interaction table, trees put a true candidate first more often than the weighted
    sum; with too few true candidates the trees step aside for the logistic fusion."""
    from xmc.config.schema import BoostedTreesFusionConfig

    table, gold = _interaction_table()
    train = table.rows < 400
    fit = CandidateTable(table.rows[train], table.labels[train], table.X[train])
    held = CandidateTable(table.rows[~train], table.labels[~train], table.X[~train])
    st = BoostedTreesFusionConfig().model_dump()

    def p_at_1(fusion) -> float:
        _, top = top_k(held, fusion.score(held.X), gold.shape[0], 1)
        return float(np.mean([gold[r, top[r, 0]] > 0 for r in range(400, gold.shape[0])]))

    trees, linear = p_at_1(fit_boosted_fusion(fit, gold, st)), p_at_1(fit_fusion(fit, gold))
    assert trees > linear + 0.05, (trees, linear)
    few = CandidateTable(table.rows[:40], table.labels[:40], table.X[:40])
    assert isinstance(fit_boosted_fusion(few, gold, st), FusionWeights)


def _pair_features(match, lid, prior, mfs):
    """The name features of one (text, label) pair, scalar by scalar: the definition feature_rows must equal."""
    if match is None:
        return [0.0] * len(FEATURES)
    return [1.0, float(match.words), float(np.log(match.ambiguity)), float(match.pos_agrees), match.specificity,
            float(np.log(prior[lid])), float(mfs[lid])]


def _candidate_table_by_loops(bases, matches, matcher, prior, mfs, log_count, precision):
    """The table as first written, a (text, label) pair at a time: the reference the array version must equal."""
    rows, labels, feats = [], [], []
    for i, m in enumerate(matches):
        retrieved, floors, bests = [], [], []
        for scores, ids in bases:
            ok = (ids[i] >= 0) & np.isfinite(scores[i])
            got = dict(zip(ids[i][ok].tolist(), scores[i][ok].tolist()))
            retrieved.append(got)
            floors.append((min(got.values()) - 1.0) if got else 0.0)
            bests.append(max(got.values()) if got else 0.0)
        for lid in sorted(set(m).union(*retrieved)):
            rows.append(i)
            labels.append(lid)
            f = []
            for got, floor, best in zip(retrieved, floors, bests):
                score = got.get(lid, floor)
                rank = sum(v > score for v in got.values()) if lid in got else len(got)
                f += [score, float(lid in got), float(np.log1p(rank)), best - score]
            feats.append([*f, *_pair_features(m.get(lid), lid, prior, mfs),
                          float(precision[lid]) if lid in m else 0.0, float(np.log1p(len(m))), float(log_count[lid])])
    return np.asarray(rows, np.int64), np.asarray(labels, np.int64), np.asarray(feats, np.float64)


@pytest.mark.parametrize("n_runs", [1, 3])
def test_candidate_table_equals_the_pair_by_pair_definition_to_the_last_bit(matcher, n_runs):
    from xmc.lexical.hybrid import candidate_table

    rng = np.random.default_rng(n_runs)
    texts = ["She took a breath by the river bank", "", "half of the banking company", "irregularities", "a bank",
             "nothing here", "take", "breathe and bank"]
    n, k, n_labels = len(texts), 4, len(WORDNET_STYLE)
    bases = []
    for _ in range(n_runs):
        ids = rng.integers(0, n_labels, size=(n, k))
        scores = rng.normal(size=(n, k)).astype(np.float32)
        ids[1] = -1                               # a text the run retrieved nothing for
        scores[1] = -np.inf
        ids[2, -1], scores[2, -1] = -1, -np.inf   # padding
        scores[3, 0] = np.inf                     # a non-finite score is not a retrieval
        ids[4, 1] = ids[4, 0]                     # a label listed twice: its last score counts
        scores[5, 2] = scores[5, 1]               # a tie: both rank after the labels scored higher
        bases.append((scores, ids))
    counts = rng.integers(0, 5, n_labels).astype(np.float64)
    prior, mfs = matcher.sense_prior(counts)
    log_count = np.log1p(counts)
    matches = matcher.match_many(texts)
    precision = rng.uniform(0.0, 1.0, n_labels)
    table = candidate_table(bases, matches, matcher, prior, mfs, log_count, precision)
    rows, labels, X = _candidate_table_by_loops(bases, matches, matcher, prior, mfs, log_count, precision)
    assert np.array_equal(table.rows, rows) and np.array_equal(table.labels, labels)
    assert table.X.shape == X.shape and np.array_equal(table.X.view(np.int64), X.view(np.int64))
    with pytest.raises(ValueError, match="beyond the 9 labels"):
        candidate_table([(bases[0][0], np.full((n, k), n_labels))], matches, matcher, prior, mfs, log_count)


def test_feature_rows_are_the_features_of_each_match(matcher):
    matches = matcher.match_many(["She took a breath by the river bank", "", "a half"])
    prior, mfs = matcher.sense_prior(np.arange(len(WORDNET_STYLE), dtype=np.float64))
    text, lid, F = matcher.feature_rows(matches, prior, mfs)
    expect = [(i, j, _pair_features(m, j, prior, mfs)) for i, ms in enumerate(matches) for j, m in ms.items()]
    assert text.tolist() == [e[0] for e in expect] and lid.tolist() == [e[1] for e in expect]
    assert np.array_equal(F, np.asarray([e[2] for e in expect], np.float64))
    empty = matcher.feature_rows([{}, {}], prior, mfs)
    assert [a.shape for a in empty] == [(0,), (0,), (0, 7)]


def test_identifier_label_texts_name_the_identifier_and_describe_with_the_rest():
    """``name: description`` with one identifier before the colon (debian-relations' packages): auto reads the
    identifier as the name, and a text mentioning it finds the label; WordNet texts stay in prefix mode."""
    from xmc.lexical import LabelNameMatcher, parse_label_names
    from xmc.lexical.names import label_text_view

    texts = ["0ad: Real-time strategy game of ancient warfare", "0ad-data: Real-time strategy game (data files)",
             "libfoo1: foo runtime library", "python3-numpy: Fast array facility for Python 3",
             "libfoo-dev: development files of foo"]
    names = parse_label_names(texts)
    assert names.mode == "identifier"
    assert names.names == [["0ad"], ["0ad data"], ["libfoo1"], ["python3 numpy"], ["libfoo dev"]]
    assert label_text_view(texts[3], "names") == "python3-numpy"
    assert label_text_view(texts[3], "description") == "Fast array facility for Python 3"
    found = LabelNameMatcher(names, 4, texts).match("0ad-data-common: common files for 0ad and python3-numpy")
    assert {0, 1, 3} <= set(found) and 2 not in set(found)
    assert parse_label_names(["breathe, take a breath (v): draw air into the lungs"] * 3).mode == "prefix"
    assert parse_label_names(["Harry Potter and the Goblet of Fire", "A title: with a colon"]).mode == "text"


def test_a_hybrid_below_its_run_on_validation_keeps_the_runs_ranking(tmp_path, monkeypatch):
    """A run that ranks every validation text's labels first, and a fusion that inverts it (names that mislead):
    the fusion's cross-fitted validation P@1 is below the run's, so the hybrid keeps the run's ranking (val and
    test), and says so."""
    import xmc.package.fuse as fuse_module
    from xmc.lexical.hybrid import FusionWeights
    from xmc.package.fuse import fuse
    from xmc.predictions import TopK

    def inverted(cfg, table, gold, rows, features, kind=None):
        w = np.zeros(len(features))
        w[features.index("method_score")] = -1.0
        return FusionWeights(w, 0.0, np.zeros(len(features)), np.ones(len(features)), features)

    monkeypatch.setattr(fuse_module, "fit_supervised_fusion", inverted)

    tst_texts = ["a bank by the river", "take a breath now"]
    ws, uids, ds = _fuse_workspace(tmp_path, tst_texts, [[1, 8], [0]], [[0]], {"base": 0})
    gold = [[2], [1, 8], [0], [8, 1]] * 3
    scores = np.array([[5.0, 4.0, 3.0, 2.0, 1.0]] * len(gold), np.float32)
    ids = np.array([g + [c for c in (4, 5, 6, 3, 7) if c not in g][:5 - len(g)] for g in gold], np.int32)
    TopK(ids, scores).save(ws.predictions("base") / "val_topk.npz")
    _evaluate_base(ws, "base")
    params = _fuse_params(fusion="logistic", keep_base_below_k=1)
    summary = fuse(params, "base_hybrid", ["base"], ws)
    guard = summary["chosen_on_validation"]["against_base"]
    assert guard["kept"] == "base ranking" and guard["fused P@1"] < guard["base P@1"] == 100.0
    val = TopK.load(ws.predictions("base_hybrid") / "val_topk.npz")
    assert np.array_equal(val.indices, ids)   # the run's own lists, in its order
    tst, base_tst = (TopK.load(ws.predictions(n) / "tst_topk.npz") for n in ("base_hybrid", "base"))
    assert np.array_equal(tst.indices[:, :3], base_tst.indices[:, :3])
    # off: the fusion is kept whatever it scores
    params = _fuse_params(fusion="logistic", keep_base_below_k=0)
    assert "against_base" not in fuse(params, "base_hybrid", ["base"], ws).get("chosen_on_validation", {})


def test_name_match_breakdown_splits_texts_by_a_correct_name_match_and_scores_each_side():
    """Texts whose true label is among their name matches and texts without one, each with the base's and the
    hybrid's P@1 / P@5 counted by hand from the evaluation's own per-instance terms (with its scoring filter), and
    the paired P@1 difference on each side."""
    from xmc.metrics.bootstrap import bootstrap_settings, document_codes, instance_contributions
    from xmc.package.fuse import name_match_breakdown, with_correct_name_match
    from xmc.predictions import TopK

    n_labels = len(WORDNET_STYLE)
    texts = ["there were rivers here", "the rivers ran", "nothing named", "still nothing"]
    gold = [8, 8, 3, 6]
    Y = sp.csr_matrix((np.ones(4), (np.arange(4), gold)), shape=(4, n_labels))
    base = np.array([[3, 8, 1, 2, 4], [1, 2, 3, 4, 5], [3, 1, 2, 4, 5], [6, 1, 2, 4, 5]])
    # text 4's first label is filtered (e.g. the item's own label): the evaluation drops it, so the hybrid's
    # second label (6, correct) is its first
    fused = np.array([[8, 3, 1, 2, 4], [8, 1, 2, 3, 4], [1, 3, 2, 4, 5], [7, 6, 1, 2, 4]])
    filt = sp.csr_matrix(([1.0], ([3], [7])), shape=(4, n_labels))
    ranker = HybridRanker(WORDNET_STYLE, "auto", np.ones(n_labels))
    table = ranker.table(texts, np.tile(np.linspace(1, 0.2, 5), (4, 1)), base)
    assert table.X[table.labels == 8, ranker.features.index("matched")].max() == 1.0   # "rivers" names label 8
    has = with_correct_name_match(table, ranker.features, Y)
    assert has.tolist() == [True, True, False, False]
    docs = document_codes(["d1", "d1", "d2", "d3"], 4)

    def contributions(ids: np.ndarray):
        top = TopK(ids.astype(np.int32), np.tile(np.linspace(1, 0.2, 5), (4, 1)).astype(np.float32))
        c = instance_contributions(top, Y, np.ones(n_labels), 4, (1, 5), (5,), 0.55, 1.5, filt)
        c.groups = docs
        return c

    boot = bootstrap_settings({"evaluate": {"bootstrap": {"n_resamples": 50}}})
    out = name_match_breakdown(has, contributions(base), contributions(fused), boot)
    w, wo = out["with_correct_name_match"], out["without"]
    assert (w["texts"], wo["texts"]) == (2, 2)
    assert (w["base P@1"], w["hybrid P@1"], w["P@1 diff"]) == (0.0, 100.0, 100.0)
    assert (wo["base P@1"], wo["hybrid P@1"], wo["P@1 diff"]) == (100.0, 50.0, -50.0)
    assert (w["base P@5"], wo["hybrid P@5"]) == (10.0, 20.0)
    assert wo["P@1 diff ci95"][0] <= -50.0 <= wo["P@1 diff ci95"][1]
    with pytest.raises(ValueError, match="for 3 texts"):
        name_match_breakdown(has[:3], contributions(base), contributions(fused), boot)


def test_the_fusion_is_fit_without_the_filtered_candidates():
    """A (text, label) pair the split's scoring filter holds is not a candidate of the fusion's table."""
    from xmc.package.fuse import without_pairs

    table = CandidateTable(np.array([0, 0, 1, 1]), np.array([2, 5, 2, 3]), np.arange(8, dtype=float).reshape(4, 2))
    pairs = sp.csr_matrix(([1.0, 1.0], ([0, 1], [5, 4])), shape=(2, 6))
    out = without_pairs(table, pairs)
    assert out.rows.tolist() == [0, 1, 1] and out.labels.tolist() == [2, 2, 3]
    assert out.X.tolist() == [[0, 1], [4, 5], [6, 7]]
    assert without_pairs(table, None) is table


def test_name_match_precision_is_the_shrunk_share_of_matches_that_are_answers(matcher):
    """name_match_precision: per label, (texts whose matches name it and have it for a true label + s * p0) /
    (texts whose matches name it + s), p0 the share over all matches; a label never matched gets p0."""
    from xmc.lexical.hybrid import name_match_precision

    texts = ["a bank by the river", "the bank", "take a breath", "nothing named", "a river bank"]
    n_labels = len(WORDNET_STYLE)
    gold = [[0], [5], [1], [2], [0, 8]]
    Y = sp.csr_matrix((np.ones(sum(map(len, gold))), (np.repeat(np.arange(5), [len(g) for g in gold]),
                                                        np.concatenate(gold))), shape=(5, n_labels))
    matches = matcher.match_many(texts)
    matched, answer = np.zeros(n_labels), np.zeros(n_labels)
    for i, m in enumerate(matches):
        for lid in m:
            matched[lid] += 1
            answer[lid] += lid in gold[i]
    assert matched.sum() > answer.sum() > 0   # some names matched are answers, some are not
    p0 = answer.sum() / matched.sum()
    got = name_match_precision(matcher, texts, Y, strength=2.0)
    np.testing.assert_allclose(got, (answer + 2.0 * p0) / (matched + 2.0), rtol=0, atol=1e-12)
    assert got[matched == 0].tolist() == [pytest.approx(p0)] * int((matched == 0).sum())


def test_monotone_trees_keep_the_direction_of_the_run_and_of_the_name_precision():
    """With hybrid.monotone the trees' score never falls as a run's score or a name's precision rises, nor as its
    rank falls, though the training labels say otherwise in part of the range; unconstrained trees follow them."""
    from xmc.config.schema import BoostedTreesFusionConfig
    from xmc.lexical.hybrid import MONOTONE, monotone_constraints

    table, gold = _interaction_table()
    X = table.X
    rng = np.random.default_rng(3)
    s_col = HYBRID_FEATURES.index("method_score")
    # labels that contradict the run's score at its top: the best-scored candidates are wrong
    y = (np.asarray(gold[table.rows, table.labels]).ravel() > 0) & (X[:, s_col] < 1.0)
    y |= (X[:, s_col] > 0.0) & (X[:, s_col] < 1.0) & (rng.random(len(y)) < 0.5)
    gold = sp.csr_matrix((y.astype(float), (table.rows, table.labels)), shape=gold.shape)
    st = BoostedTreesFusionConfig().model_dump()
    assert monotone_constraints(HYBRID_FEATURES)[s_col] == 1 and set(MONOTONE) <= set(HYBRID_FEATURES)
    assert monotone_constraints(("a:method_rank", "b:method_score", "text_matches")) == [-1, 1, 0]
    grid = np.linspace(-3, 3, 61)
    probe = np.repeat(X[:50], len(grid), axis=0)
    probe[:, s_col] = np.tile(grid, 50)
    for monotone in (True, False):
        fusion = fit_boosted_fusion(table, gold, st, monotone=monotone)
        steps = np.diff(fusion.score(probe).reshape(50, len(grid)), axis=1)
        if monotone:
            assert (steps >= -1e-12).all()
            assert fusion.settings["monotone"]["method_score"] == 1
            for f, sign in (("name_precision", 1), ("method_rank", -1)):
                c = HYBRID_FEATURES.index(f)
                lo, hi = probe.copy(), probe.copy()
                lo[:, c], hi[:, c] = 0.0, 1.0
                assert (sign * (fusion.score(hi) - fusion.score(lo)) >= -1e-12).all()
        else:
            assert (steps < -1e-6).any()   # the labels' reversal is learned where nothing forbids it


def test_the_first_bonus_keeps_the_runs_first_answer_unless_the_fusion_is_surer():
    """choose_first_bonus picks the grid point with the best P@1 when added to the run's first candidate; the
    ranker adds it at prediction time, and a hybrid package keeps it and the name precisions."""
    from xmc.lexical.hybrid import choose_first_bonus, first_of_a_run

    n_labels = len(WORDNET_STYLE)
    texts = ["a bank by the river", "take a breath now", "the river", "nothing named"] * 5
    n = len(texts)
    ids = np.tile(np.array([3, 5, 6, 7, 2]), (n, 1))
    scores = np.tile(np.linspace(1.0, 0.2, 5), (n, 1)).astype(np.float32)
    ranker = HybridRanker(WORDNET_STYLE, "auto", np.ones(n_labels))
    table = ranker.table(texts, scores, ids)
    first = first_of_a_run(table, ranker.features)
    assert first.sum() == n and (table.labels[first] == 3).all()
    # a fusion that prefers any name match over the run's first label, which is right on 3 texts in 4
    w = np.zeros(len(ranker.features))
    w[ranker.features.index("matched")] = 1.0
    w[ranker.features.index("method_score")] = 0.1
    ranker.weights = FusionWeights(w, 0.0, np.zeros(len(w)), np.ones(len(w)), ranker.features)
    gold = [3 if i % 4 != 3 else 7 for i in range(n)]
    Y = sp.csr_matrix((np.ones(n), (np.arange(n), gold)), shape=(n, n_labels))
    fused = ranker.weights.score(table.X)
    bonus, tried, _ = choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), [0.0, 0.5, 2.0, 5.0])
    assert bonus == 2.0 and tried["0"]["P@1"] < tried["2"]["P@1"] == tried["5"]["P@1"], tried   # ties: the smaller
    ranker.first_bonus = bonus
    _, top = ranker.rank(texts, scores, ids, 3)
    assert (top[:, 0] == 3).all()
    np.testing.assert_allclose(ranker.score(table), fused + 2.0 * first)


def test_a_hybrid_package_keeps_the_first_bonus_and_the_name_precisions(tmp_path):
    """fuse with a bonus grid of one point and the training split's name precisions: the package's fusion holds both
    and ranks the test texts exactly as the stage did."""
    import xmc
    from xmc.package.fuse import fuse
    from xmc.predictions import TopK

    tst_texts = ["a bank by the river", "take a breath now", "the rivers", "nothing"]
    ws, _, _ = _fuse_workspace(tmp_path, tst_texts, [[1, 8], [0], [8], [2]],
                               [[1], [2], [8], [0], [1, 8]] * 2, {"base": 0},
                               ["the bank", "a bank", "river", "breath", "the bank of the river"] * 2)
    summary = fuse(_fuse_params(first_bonus=[3.0], keep_base_below_k=0), "base_hybrid", ["base"], ws)
    assert summary["fusion"]["first_bonus"] == 3.0 and summary["chosen_on_validation"]["first_bonus"]["chosen"] == 3.0
    chosen = summary["chosen_on_validation"]["first_bonus"]
    loss = chosen["grid"]["3"].get("loss without a correct name match")
    # the summary says whether the bound held for the bonus taken (one grid point: taken whatever it loses), or
    # that it was not judged (fewer validation texts without a correct name match than the bound needs)
    assert chosen["texts without a correct name match"] < 200 and (loss is None or chosen["bound_met"] is None)
    fusion = json.loads((ws.package("base_hybrid") / "fusion" / "fusion.json").read_text())
    assert fusion["first_bonus"] == 3.0
    with np.load(ws.package("base_hybrid") / "fusion" / "name_precision.npz") as z:
        precision = z["precision"]
    assert precision.shape == (len(WORDNET_STYLE),) and len(set(precision.round(6))) > 1   # read from training
    tst = TopK.load(ws.predictions("base_hybrid") / "tst_topk.npz")
    S, R = xmc.load(str(ws.package("base_hybrid"))).topk(tst_texts, 5)
    assert np.array_equal(R, tst.indices) and np.allclose(S, tst.scores)


def test_the_first_bonus_is_chosen_among_those_that_keep_the_misled_texts_within_the_bound():
    """With the texts whose name matches are all wrong (misled) and a bound, a bonus that wins P@1 overall but loses
    more than the bound on those texts is not eligible; with no eligible bonus the one losing least is taken."""
    from xmc.lexical.hybrid import choose_first_bonus

    n_labels = len(WORDNET_STYLE)
    texts = ["a bank by the river"] * 8 + ["nothing named"] * 2
    n = len(texts)
    ids = np.tile(np.array([5, 7, 4, 0, 2]), (n, 1))   # the run's first (5, "half") is not named in the texts
    scores = np.tile(np.linspace(1.0, 0.2, 5), (n, 1)).astype(np.float32)
    ranker = HybridRanker(WORDNET_STYLE, "auto", np.ones(n_labels))
    table = ranker.table(texts, scores, ids)
    matched_bank_or_river = (table.X[:, ranker.features.index("matched")] > 0)
    # a fusion: a name match at 1.0 over the run's first at 0.1 + bonus; "a bank by the river" names labels 1, 2, 8
    fused = np.where(matched_bank_or_river, 1.0, 0.0) + 0.1 * table.X[:, ranker.features.index("method_score")]
    named = sorted(set(table.labels[matched_bank_or_river].tolist()))
    top_named = named[int(np.argmax([fused[(table.rows == 0) & (table.labels == lid)][0] for lid in named]))]
    # texts 0-5: the top name match is right; 6-7: the run's first (5) is right and no name match is; 8-9: unnamed
    gold = [top_named] * 6 + [5, 5, 5, 5]
    Y = sp.csr_matrix((np.ones(n), (np.arange(n), gold)), shape=(n, n_labels))
    misled = np.array([False] * 6 + [True] * 4)
    grid = [0.0, 2.0]
    free, _, _ = choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), grid)
    assert free == 0.0   # overall P@1: 8/10 names first, 4/10 with the run's first kept
    bound, tried, met = choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), grid, misled, 1.0)
    assert tried["0"]["loss without a correct name match"] == 50.0 and tried["2"]["loss without a correct name match"] == 0.0
    assert bound == 2.0 and met is True
    loose, _, _ = choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), grid, misled, 60.0)
    assert loose == 0.0
    least, _, unmet = choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), [0.0, 0.05], misled, 1.0)
    assert least == 0.0 and unmet is False   # no bonus keeps the bound: the one losing least (a tie: the first)
    # over fewer misled texts than min_texts the bound is not judged (one text would weigh 25 points): P@1 decides,
    # and each point's loss is still reported
    few, tried, judged = choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), grid, misled, 1.0,
                                            min_texts=5)
    assert few == 0.0 and judged is None and tried["0"]["loss without a correct name match"] == 50.0
    assert choose_first_bonus(table, fused, ranker.features, Y, np.arange(n), grid, misled, 1.0, min_texts=4)[0] == 2.0


# ------------------------------------------------------------------------------------------------
# the TF-IDF transform without scikit-learn
# ------------------------------------------------------------------------------------------------
TFIDF_SETTINGS = [{}, {"ngram_max": 1}, {"ngram_max": 3, "sublinear_tf": False}, {"stop_words": "english"},
                  {"token_pattern": r"(?u)\b\w+\b", "stop_words": ["the", "of", "a"]}, {"min_df": 2, "max_features": 500}]


@pytest.mark.parametrize("dataset", ["semcor-wn30", "debian-relations"])
def test_the_tfidf_encoder_gives_the_vectorisers_rows_bit_for_bit(dataset, tmp_path):
    """A package embeds texts with xmc.tfidf.TfidfTextEncoder, built from the files the tfidf stage saved;
    its rows are scikit-learn's, the same nonzeros and the same bits, for every setting of params ``tfidf``, on real
    texts of both datasets (the test split's: words the vocabulary never saw, empty rows)."""
    from xmc.baselines.tfidf import TfidfFeatures, fit_tfidf
    from xmc.tfidf import TfidfTextEncoder
    from xmc.package.lexical_predictors import _load_vectorizer

    root = SEMCOR.parent / dataset
    if not root.exists():
        pytest.skip(f"{root} not present")

    def lines(name: str, n: int) -> list[str]:
        with open(root / name, encoding="utf-8") as fh:
            return [line.rstrip("\n") for _, line in zip(range(n), fh)]

    trn, lbl, tst = lines("trn.raw.txt", 1500), lines("lbl.raw.txt", 2000), lines("tst.raw.txt", 400) + ["", "!!"]
    for settings in TFIDF_SETTINGS:
        feats = fit_tfidf(trn, None, lbl, settings)
        A = feats.transform(tst)
        A.sort_indices()
        for B in (feats.encoder().transform(tst),
                  TfidfTextEncoder.from_settings(feats.params, feats.vectorizer.vocabulary_, feats.vectorizer.idf_)
                  .transform(tst)):
            assert B.dtype == np.float32 and B.shape == A.shape, settings
            assert (B.indptr == A.indptr).all() and (B.indices == A.indices).all(), settings
            assert (B.data == A.data).all(), (settings, float(np.abs(B.data - A.data).max()))
    # through the saved files, as a package loads them
    out = tmp_path / "tfidf"
    feats.save(out)
    assert (_load_vectorizer(out).transform(tst) != TfidfFeatures.load(out).transform(tst)).nnz == 0


def test_the_tfidf_encoders_stop_words_are_scikit_learns_and_bad_settings_are_refused(tmp_path):
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS as SKLEARN_ENGLISH

    from xmc.errors import DataFormatError
    from xmc.tfidf import ENGLISH_STOP_WORDS, TfidfTextEncoder
    from xmc.package.lexical_predictors import _load_vectorizer

    assert ENGLISH_STOP_WORDS == SKLEARN_ENGLISH
    with pytest.raises(ValueError, match="2 idf values for 1 terms"):
        TfidfTextEncoder({"a": 0}, np.ones(2))
    with pytest.raises(ValueError, match="more than one capturing group"):
        TfidfTextEncoder({"a": 0}, np.ones(1), token_pattern=r"(a)(b)")
    d = tmp_path / "tfidf"
    d.mkdir()
    (d / "vocabulary.json").write_text('{"able": 0}')
    (d / "settings.json").write_text('{"stop_words": "klingon"}')
    np.savez(d / "idf.npz", idf=np.ones(1))
    with pytest.raises(DataFormatError, match="settings.json.*not a built-in stop list: 'klingon'"):
        _load_vectorizer(d)
