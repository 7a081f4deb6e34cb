"""UniDEC: PSL pool construction, clustered batches, the two-head objective, the concatenated
index, save/load, and a tiny end-to-end train (real faiss, bag-of-words encoder)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from xmc.encoders.bow import HashedBagOfWordsEncoder
from xmc.losses import DecoupledSoftmaxLoss
from xmc.methods.unidec import (PickSomeLabelsSampler, UniDECModel, UniDECObjective, cluster_chunks,
                                predict_spaces)
from xmc.trainer.trainer import Trainer, TrainConfig


def hand_batch():
    # 4 queries x 8 labels; query 3 is not in the batch
    Y = sp.csr_matrix(np.array([
        [1, 1, 0, 0, 0, 0, 0, 0],   # q0: {0, 1}
        [0, 1, 1, 0, 0, 0, 0, 0],   # q1: {1, 2}
        [0, 0, 0, 1, 0, 0, 1, 0],   # q2: {3, 6}
        [0, 0, 0, 0, 0, 0, 0, 1],   # q3: {7}
    ], np.float32))
    s = PickSomeLabelsSampler(Y, max_positives_per_query=1, negatives_per_query=1, shortlist_size=2, cluster_size=0)
    # hand-made shortlist (positives already removed, as mine_shortlist does); label 6 is a hard
    # negative of q0 but a true label of q2, label 2 a hard negative of q2 but a true label of q1
    s.shortlist = np.array([[6, 6], [4, 4], [2, 2], [5, 5]], np.int32)
    return Y, s


def test_psl_pool_membership_in_batch_positives_and_no_positive_as_negative():
    Y, s = hand_batch()
    q = np.array([0, 1, 2])
    rng = np.random.default_rng(3)
    sampled = s.sample_positives(q, np.random.default_rng(3))  # the same draws make_batch will make
    b = s.make_batch(q, rng)
    pool = b.label_ids.tolist()
    # pool = ∪ (≤β sampled positives ∪ η hard negatives), deduplicated and sorted
    expected = sorted(set(np.concatenate(sampled).tolist()) | {6, 4, 2})
    assert pool == expected
    assert all(len(p) == 1 for p in sampled)
    assert 7 not in pool and 5 not in pool  # nothing from outside the batch's queries
    # in-batch positives: all true labels of each query that fall in the pool (P_i ∩ L_B)
    truth = Y[q][:, b.label_ids].toarray() > 0
    assert b.positives.numpy().tolist() == truth.tolist()
    assert b.valid is None  # nothing masked: every in-pool true label is a positive
    col = {l: i for i, l in enumerate(pool)}
    assert b.positives[2, col[6]] and b.positives[1, col[2]]  # mined for another query, still a positive
    assert not b.positives[0, col[6]] and not b.positives[2, col[2]]  # and a negative where it is not true
    # the DS loss treats ~positives as negatives: no true label of a query is ever among them
    neg = ~b.positives.numpy()
    assert not (neg & truth).any()
    assert b.extras["pool_size"] == len(pool)


def test_psl_beta_zero_takes_all_positives_and_eta_zero_no_negatives():
    Y, s = hand_batch()
    s.max_positives_per_query, s.negatives_per_query = 0, 0
    b = s.make_batch(np.array([0, 1, 2]), np.random.default_rng(0))
    assert b.label_ids.tolist() == [0, 1, 2, 3, 6]
    assert b.positives.sum(1).tolist() == [2, 2, 2]


def test_clustered_batches_cover_every_query_once_and_group_similar_ones():
    rng = np.random.default_rng(0)
    centers = np.eye(8, dtype=np.float32)
    who = np.repeat(np.arange(8), 12)
    vecs = centers[who] + 0.05 * rng.standard_normal((len(who), 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    chunks = cluster_chunks(vecs, np.arange(len(who)), cluster_size=12, seed=0)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(len(who)))
    assert max(len(c) for c in chunks) <= 12
    purity = np.mean([np.bincount(who[c]).max() / len(c) for c in chunks])
    assert purity > 0.9

    Y = sp.csr_matrix((np.ones(len(who)), (np.arange(len(who)), who)), shape=(len(who), 8))
    s = PickSomeLabelsSampler(Y, negatives_per_query=0, cluster_size=12)
    s.chunks = chunks
    batches = s.query_batches(epoch=1, batch_size=24, seed=0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(who)))
    assert all(len(b) <= 24 for b in batches)
    assert [b.tolist() for b in batches] == [b.tolist() for b in s.query_batches(1, 24, 0)]  # replayable


def tiny_model(n_labels=12, dim=16, seed=0):
    torch.manual_seed(seed)
    labels = [f"label{i} word{i % 5} thing{i % 3}" for i in range(n_labels)]
    return UniDECModel(HashedBagOfWordsEncoder(dim=dim, n_buckets=4096, seed=seed), labels, dim=8, dropout=0.0), labels


def test_concatenated_index_scores_equal_sum_of_head_scores():
    model, labels = tiny_model()
    with torch.no_grad():
        model.psi.weight.mul_(torch.rand(len(labels), 1) * 3 + 0.1)  # unequal norms: normalisation matters
    texts = ["word1 thing2 extra", "label3 word3", "thing0 something else"]
    preds = predict_spaces(model, texts, k=len(labels))
    de_l = model.label_space_vectors("de", progress=False)
    psi_n = model.label_space_vectors("clf", progress=False)
    q_de = model.query_space_vectors(texts, "de", progress=False)
    q_clf = model.query_space_vectors(texts, "clf", progress=False)
    assert np.allclose(np.linalg.norm(psi_n, axis=1), 1, atol=1e-5)
    assert np.allclose(np.linalg.norm(q_clf, axis=1), 1, atol=1e-5)
    full = {"de": q_de @ de_l.T, "clf": q_clf @ psi_n.T}
    full["concat"] = full["de"] + full["clf"]
    for space, p in preds.items():
        got = p["scores"]
        want = np.take_along_axis(full[space], p["ids"], axis=1)
        assert np.allclose(got, want, atol=1e-5), space
        assert np.allclose(np.sort(full[space], axis=1)[:, ::-1], got, atol=1e-5)  # exact top-k
    # the model's generic views (used by the evaluator and the miner) are the concatenated space
    assert np.allclose(model.all_label_vectors(progress=False) @ model.query_vectors_np(texts, progress=False).T,
                       full["concat"].T, atol=1e-5)


def test_objective_is_both_heads_both_directions_with_equal_weights():
    model, labels = tiny_model()
    Y = sp.csr_matrix(np.array([[1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 0]], np.float32),
                      shape=(3, len(labels)))
    s = PickSomeLabelsSampler(Y, max_positives_per_query=0, negatives_per_query=0, cluster_size=0)
    b = s.make_batch(np.arange(3), np.random.default_rng(0))
    texts = ["label0 word0", "label2 word2", "label4 thing1"]
    obj = UniDECObjective(temperature_de=0.1, temperature_clf=0.5, bce_weight=0.0)
    model.eval()  # no dropout: the reference below recomputes the same scores
    loss = obj(model, b, texts)
    with torch.no_grad():
        q_de, q_clf = model.query_heads(texts)
        s_de = q_de @ model.label_de(b.label_ids).T
        s_clf = q_clf @ model.classifiers(b.label_ids).T
        ds_de, ds_clf = DecoupledSoftmaxLoss(0.1), DecoupledSoftmaxLoss(0.5)
        pos = b.positives
        want = 0.5 * (0.5 * ds_de(s_de, pos) + 0.5 * ds_de(s_de.T, pos.T)) + \
            0.5 * (0.5 * ds_clf(s_clf, pos) + 0.5 * ds_clf(s_clf.T, pos.T))
    assert torch.allclose(loss, want, atol=1e-5)
    assert set(obj.last_parts) >= {"de_q2l", "de_l2q", "clf_q2l", "clf_l2q", "pool_size", "in_batch_positives"}
    loss.backward()
    g = model.psi.weight.grad.coalesce()  # sparse: only the pool's classifier rows get a gradient
    assert sorted(g.indices()[0].unique().tolist()) == b.label_ids.tolist()
    assert model.g1[0].weight.grad is not None and model.g2[0].weight.grad is not None

    with_bce = UniDECObjective(temperature_de=0.1, temperature_clf=0.5, bce_weight=1.0)
    assert float(with_bce(model, b, texts).detach()) > float(want) and with_bce.last_parts["bce"] > 0


def test_param_groups_cover_every_trainable_parameter_once():
    model, _ = tiny_model()
    groups = model.param_groups()
    assert set(groups) == {"encoder", "heads", "classifier"}
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters() if p.requires_grad}


def synthetic(n_q=240, n_l=40, seed=0):
    """Queries are words tied to labels through a hidden map the label texts do not reveal, so the
    untrained model is near chance and only training can make it good."""
    rng = np.random.default_rng(seed)
    cue = [f"cue{j}" for j in range(n_l)]
    labels = [f"item {i} of the catalogue" for i in range(n_l)]
    rows, cols, texts = [], [], []
    for q in range(n_q):
        pos = rng.choice(n_l, rng.integers(1, 4), replace=False)
        rows += [q] * len(pos)
        cols += pos.tolist()
        texts.append(" ".join([cue[p] for p in pos] + list(rng.choice(["the", "a", "some", "any"], 2))))
    return texts, labels, sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_q, n_l))


def p_at_1(model, texts, Y):
    top = predict_spaces(model, texts, k=1, spaces=("concat",))["concat"]["ids"][:, 0]
    return 100.0 * float(np.mean(Y[np.arange(len(texts)), top].A1 > 0))


def test_tiny_end_to_end_train_improves_and_round_trips(tmp_path):
    torch.manual_seed(0)
    texts, labels, Y = synthetic()
    model = UniDECModel(HashedBagOfWordsEncoder(dim=32, n_buckets=1 << 12, seed=0), labels, dim=32, dropout=0.1)
    model.init_classifiers_from_label_text()
    before = p_at_1(model, texts, Y)
    sampler = PickSomeLabelsSampler(Y, max_positives_per_query=2, negatives_per_query=2, shortlist_size=6,
                                    refresh_every_epochs=2, start_epoch=1, cluster_size=8)
    cfg = TrainConfig(epochs=6, batch_size=32, lr=0.05, group_lr={"heads": 0.01, "classifier": 0.05},
                      schedule="cosine", warmup_ratio=0.0, device="cpu", seed=0)
    trainer = Trainer(model, sampler, UniDECObjective(bce_weight=0.5), cfg, texts, tmp_path / "ckpt")
    trainer.fit()
    assert sampler.refreshed_at == [1, 3, 5] and sampler.clustered_at == [1, 3, 5]
    assert sampler.shortlist is not None and sampler.chunks is not None
    after = p_at_1(model, texts, Y)
    assert after > before + 30, (before, after)
    losses = [r["loss"] for r in trainer.history["loss"]]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])

    model.save(tmp_path / "model")
    again = UniDECModel.load(tmp_path / "model", labels)
    assert np.allclose(again.all_label_vectors(progress=False), model.all_label_vectors(progress=False), atol=1e-6)
    assert np.allclose(again.query_vectors_np(texts[:5], progress=False), model.query_vectors_np(texts[:5], progress=False),
                       atol=1e-6)
    with pytest.raises(Exception, match="labels"):
        UniDECModel.load(tmp_path / "model", labels[:-1])
    # the serving side (xmc.models.unidec, no training code) loads the same heads and Ψ: each space scores alike
    from xmc.models.unidec import SPACES, UniDECInference

    for space in SPACES:
        served = UniDECInference.load(tmp_path / "model", labels, space)
        assert np.allclose(served.label_space_vectors(), model.label_space_vectors(space, progress=False), atol=1e-6)
        assert np.allclose(served.query_vectors(texts[:5]), model.query_space_vectors(texts[:5], space), atol=1e-6)
    with pytest.raises(Exception, match="space"):
        UniDECInference.load(tmp_path / "model", labels, "both")


def test_reset_unseen_classifiers_touches_only_labels_without_training_positives():
    model, labels = tiny_model()
    before = model.psi.weight.detach().clone()
    freq = np.array([3, 0, 1, 0] + [2] * (len(labels) - 4))
    assert model.reset_unseen_classifiers(freq) == 2
    after = model.psi.weight.detach()
    _, clf = model.heads_np([labels[1], labels[3]], "label", 8, progress=False)
    assert torch.allclose(after[[1, 3]], torch.from_numpy(clf), atol=1e-6)
    seen = np.flatnonzero(freq > 0)
    assert torch.equal(after[seen], before[seen])


def test_per_head_dropout_is_built_and_survives_save_load(tmp_path):
    _, labels = tiny_model()
    model = UniDECModel(HashedBagOfWordsEncoder(dim=16, n_buckets=4096, seed=0), labels, dim=8, dropout=0.0,
                        dropout_clf=0.3)
    assert model.g1[2].p == 0.0 and model.g2[1].p == 0.3
    model.save(tmp_path / "m")
    again = UniDECModel.load(tmp_path / "m", labels)
    assert again.g1[2].p == 0.0 and again.g2[1].p == 0.3
    same = UniDECModel(HashedBagOfWordsEncoder(dim=16, n_buckets=4096, seed=0), labels, dim=8, dropout=0.2)
    assert same.g1[2].p == same.g2[1].p == 0.2  # dropout_clf defaults to the DE head's


def test_zero_unseen_classifiers_leaves_their_de_score_alone_in_the_concatenated_index():
    model, labels = tiny_model()
    freq = np.array([3, 0, 1, 0] + [2] * (len(labels) - 4))
    before = model.psi.weight.detach().clone()
    assert model.zero_unseen_classifiers(freq) == 2
    seen = np.flatnonzero(freq > 0)
    assert torch.equal(model.psi.weight[seen], before[seen]) and not model.psi.weight[[1, 3]].any()
    texts = ["label1 word1", "thing0 word3"]
    concat = model.query_space_vectors(texts, "concat", progress=False) @ model.label_space_vectors("concat", progress=False).T
    de = model.query_space_vectors(texts, "de", progress=False) @ model.label_space_vectors("de", progress=False).T
    assert np.allclose(concat[:, [1, 3]], de[:, [1, 3]], atol=1e-5)  # cos_CLF of a zero row is 0
    assert not np.allclose(concat[:, seen], de[:, seen], atol=1e-3)
