"""ASTRA: unbiased sampled loss, classifier-index shortlist, sparse SGD updates, tiny end-to-end run."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from xmc.encoders.bow import HashedBagOfWordsEncoder
from xmc.errors import ConfigError
from xmc.methods.astra import (ASTRAModel, ASTRANegatives, ASTRAObjective, build_astra_model, full_ova_loss,
                               mine_classifier_shortlist)
from xmc.trainer.trainer import Trainer, TrainConfig


def synthetic(n_q: int = 240, n_l: int = 40, seed: int = 0):
    """Queries are cue words tied to labels through a hidden map the label texts do not reveal."""
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


def small_model(labels, seed: int = 0, shard_labels: bool = False) -> ASTRAModel:
    torch.manual_seed(seed)
    model = ASTRAModel(HashedBagOfWordsEncoder(dim=16, n_buckets=1 << 12, seed=seed), labels, bias_init=-1.0,
                       shard_labels=shard_labels)
    with torch.no_grad():  # spread the scores so the sampled terms differ a lot between labels
        model.W.weight.mul_(3.0)
    return model.eval()


@pytest.mark.parametrize("with_shortlist", [False, True])
@pytest.mark.parametrize("uniform_shared", [False, True], ids=["per_query", "shared"])
def test_sampled_loss_is_unbiased_estimate_of_full_ova_loss(with_shortlist, uniform_shared):
    texts, labels, Y = synthetic(n_q=16, n_l=40)
    model = small_model(labels)
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=5, uniform_negatives=7, start_epoch=0,
                             uniform_shared=uniform_shared)
    if with_shortlist:
        sampler.on_epoch_start(0, model, texts)
        assert sampler.shortlist is not None and sampler.refreshed_at == [0]
    query_idx = np.arange(16)
    objective = ASTRAObjective()
    with torch.no_grad():
        full = float(full_ova_loss(model, Y, query_idx, texts))
        draws = [float(objective(model, sampler.make_batch(query_idx, np.random.default_rng(s)), texts))
                 for s in range(800)]
    mean, sem = float(np.mean(draws)), float(np.std(draws) / np.sqrt(len(draws)))
    # the estimate is unbiased: its mean is within a few standard errors of the full loss ...
    assert abs(mean - full) < 4 * sem + 1e-3 * full, (mean, full, sem)
    # ... and it is not trivially so (single draws vary)
    assert np.std(draws) > 0.01 * full


def test_dropping_the_uniform_weight_biases_the_estimate():
    """The same check fails without the (L - k_h)/k_r weight: the test can tell a biased estimator."""
    texts, labels, Y = synthetic(n_q=16, n_l=40)
    model = small_model(labels)
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=5, uniform_negatives=7, start_epoch=0)
    sampler.on_epoch_start(0, model, texts)
    objective = ASTRAObjective()
    query_idx = np.arange(16)
    with torch.no_grad():
        full = float(full_ova_loss(model, Y, query_idx, texts))
        vals = []
        for s in range(100):
            b = sampler.make_batch(query_idx, np.random.default_rng(s))
            b.weights = torch.where(b.extras["kind"] == 3, torch.ones_like(b.weights), b.weights)
            vals.append(float(objective(model, b, texts)))
    sem = np.std(vals) / np.sqrt(len(vals))
    assert full - np.mean(vals) > max(20 * sem, 0.05 * full), (np.mean(vals), full)


def test_batch_candidates_positives_hard_uniform_and_weights():
    texts, labels, Y = synthetic(n_q=12, n_l=30)
    model = small_model(labels)
    L, k_h, k_r = 30, 4, 6
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=k_h, uniform_negatives=k_r, start_epoch=1)
    q = np.arange(12)
    warm = sampler.make_batch(q, np.random.default_rng(0))  # before τ_s: k_h + k_r uniform
    kind = warm.extras["kind"].numpy()
    assert not (kind == 2).any() and ((kind == 3).sum(1) == k_h + k_r).all()
    assert np.allclose(warm.weights.numpy()[kind == 3], L / (k_h + k_r))
    sampler.on_epoch_start(1, model, texts)
    b = sampler.make_batch(q, np.random.default_rng(1))
    cand, kind = b.extras["drawn"], b.extras["kind"].numpy()
    pos, valid, w = b.positives.numpy(), b.valid.numpy(), b.weights.numpy()
    for i in range(12):
        truth = set(Y[i].indices.tolist())
        assert set(cand[i][pos[i]].tolist()) == truth  # k_p = 0: every positive
        hard = cand[i][(kind[i] == 2) & valid[i]]
        assert len(hard) == k_h and not truth & set(hard.tolist())
        assert hard.tolist() == sampler.shortlist[i][:k_h].tolist()
        uni = (kind[i] == 3)
        assert uni.sum() == k_r and not set(cand[i][uni].tolist()) & set(hard.tolist())  # R drawn from [L] \ H
        # a uniform draw that hits a positive is no negative: masked out
        assert all((c in truth) == (not v) for c, v in zip(cand[i][uni], valid[i][uni]))
        assert np.allclose(w[i][uni], (L - k_h) / k_r) and np.allclose(w[i][kind[i] == 2], 1.0)
        assert not (pos[i] & (kind[i] != 1)).any()


def test_shortlist_comes_from_classifier_vectors_without_positives_and_is_memory_mapped(tmp_path):
    texts, labels, Y = synthetic(n_q=20, n_l=30)
    model = small_model(labels)
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=3, uniform_negatives=2, start_epoch=0, work_dir=tmp_path)
    sampler.on_epoch_start(0, model, texts)
    qv, W = model.query_vectors_np(texts, progress=False), model.all_label_vectors()
    for i in range(20):
        scores = W @ qv[i]
        scores[Y[i].indices] = -np.inf
        assert set(sampler.shortlist[i].tolist()) == set(np.argsort(-scores)[:3].tolist())
    assert isinstance(sampler.shortlist, np.memmap) and (tmp_path / "shortlist_epoch0.npy").exists()
    # the label-embedding ablation mines from Φ(z_l), a different ranking
    other = ASTRANegatives(Y, model.dim, hard_negatives=3, uniform_negatives=2, start_epoch=0,
                           mine_with="label_embeddings")
    other.on_epoch_start(0, model, texts)
    assert not np.array_equal(other.shortlist, sampler.shortlist)
    # rows of queries without a vector stay empty
    out = np.zeros((20, 3), np.int32)
    qv_missing = qv.copy()
    qv_missing[5] = np.nan
    mine_classifier_shortlist(Y, qv_missing, W, 3, out)
    assert (out[5] == -1).all() and (out[4] >= 0).all()


def test_query_buffer_is_a_memory_mapped_file_a_checkpoint_refers_to(tmp_path):
    import pickle

    texts, labels, Y = synthetic(n_q=20, n_l=30)
    sampler = ASTRANegatives(Y, 4, hard_negatives=3, uniform_negatives=2, start_epoch=0, work_dir=tmp_path)
    sampler.record_query_vectors(np.array([1, 3]), torch.arange(10, dtype=torch.float32).reshape(2, 5))
    assert isinstance(sampler.query_buffer, np.memmap) and (tmp_path / "query_buffer.npy").is_file()
    state = sampler.state_dict()
    assert "query_buffer" not in state and len(pickle.dumps(state)) < 2000   # not the N x (d+1) array
    # a resumed run reopens the file: the recorded rows are there, the others still unseen
    resumed = ASTRANegatives(Y, 4, hard_negatives=3, uniform_negatives=2, start_epoch=0, work_dir=tmp_path)
    resumed.load_state_dict(state)
    assert np.array_equal(resumed.query_buffer[3], np.arange(5, 10, dtype=np.float32))
    assert np.isnan(resumed.query_buffer[0]).all()
    # a new run never reads an older run's file
    fresh = ASTRANegatives(Y, 4, hard_negatives=3, uniform_negatives=2, start_epoch=0, work_dir=tmp_path)
    assert np.isnan(fresh.query_buffer).all()
    # without a work_dir the buffer is an in-memory array, pickled with the state
    mem = ASTRANegatives(Y, 4, hard_negatives=3, uniform_negatives=2)
    mem.record_query_vectors(np.array([2]), torch.ones(1, 5))
    back = ASTRANegatives(Y, 4, hard_negatives=3, uniform_negatives=2)
    back.load_state_dict(pickle.loads(pickle.dumps(mem.state_dict())))
    assert np.array_equal(back.query_buffer[2], np.ones(5, np.float32))


def test_refresh_schedule_and_async_refresh_match_the_synchronous_one(tmp_path):
    texts, labels, Y = synthetic()
    runs = {}
    for mode in (False, True):
        model = small_model(labels)
        sampler = ASTRANegatives(Y, model.dim, hard_negatives=4, uniform_negatives=8, start_epoch=1,
                                 refresh_every_epochs=2, async_refresh=mode)
        cfg = TrainConfig(epochs=6, batch_size=32, lr=0.05, group_lr={"classifier": 5.0},
                          group_optimizer={"classifier": "sgd"}, schedule="cosine", warmup_ratio=0.0, device="cpu")
        trainer = Trainer(model, sampler, ASTRAObjective(), cfg, texts, tmp_path / f"ckpt{mode}")
        trainer.fit()
        runs[mode] = sampler
        assert sampler.refreshed_at == [1, 3, 5]
    # async mining at the start of epoch e-1 sees one epoch less of training than mining at e, so the
    # shortlists differ in general, but both exclude positives and have k_h entries
    for s in runs.values():
        assert (s.shortlist[np.diff(Y.indptr) > 0] >= 0).all()


def test_pipelined_refresh_does_not_mine_for_an_epoch_after_the_last(tmp_path):
    texts, labels, Y = synthetic()
    mined = {}
    for total in (None, 4):
        model = small_model(labels)
        sampler = ASTRANegatives(Y, model.dim, hard_negatives=4, uniform_negatives=8, start_epoch=1,
                                 refresh_every_epochs=1, async_refresh=True, total_epochs=total)
        cfg = TrainConfig(epochs=4, batch_size=32, lr=0.05, group_lr={"classifier": 5.0},
                          group_optimizer={"classifier": "sgd"}, schedule="cosine", warmup_ratio=0.0, device="cpu")
        Trainer(model, sampler, ASTRAObjective(), cfg, texts, tmp_path / f"ckpt{total}").fit()
        assert sampler.refreshed_at == [1, 2, 3]
        mined[total] = None if sampler._pending is None else sampler._pending[0]
    # without the run's length the last epoch starts mining a shortlist for epoch 4, which never trains
    assert mined == {None: 4, 4: None}


def test_only_the_candidate_rows_of_W_move_under_sgd(tmp_path):
    texts, labels, Y = synthetic(n_q=64, n_l=400)
    model = small_model(labels)
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=2, uniform_negatives=3, start_epoch=5)
    before = model.W.weight.detach().clone()
    cfg = TrainConfig(epochs=1, batch_size=8, lr=0.01, group_lr={"classifier": 1.0}, group_optimizer={"classifier": "sgd"},
                      max_steps_per_epoch=1, warmup_ratio=0.0, device="cpu")
    trainer = Trainer(model, sampler, ASTRAObjective(), cfg, texts, tmp_path / "ckpt")
    batch_q = sampler.query_batches(0, 8, cfg.seed)[0]
    touched = sampler.make_batch(batch_q, np.random.default_rng([cfg.seed, 0, 0]))
    rows = set(touched.extras["candidates"][touched.valid].tolist())
    trainer.fit()
    moved = set(np.flatnonzero((model.W.weight.detach() != before).any(1).numpy()).tolist())
    assert moved and moved <= rows and len(moved) < 400 // 4


def test_tiny_end_to_end_train_improves_and_round_trips(tmp_path):
    texts, labels, Y = synthetic()
    model = build_astra_model({"kind": "bow", "dim": 32, "n_buckets": 1 << 12}, {"init_classifiers": "random"}, labels, Y)
    assert model.W.weight[:, -1].allclose(torch.tensor(np.log((Y.nnz / 240 / 40) / (1 - Y.nnz / 240 / 40)), dtype=torch.float32))

    def p_at_1(m):
        top = np.argmax(m.query_vectors_np(texts, progress=False) @ m.all_label_vectors().T, axis=1)
        return 100.0 * float(np.mean(Y[np.arange(len(texts)), top].A1 > 0))

    before = p_at_1(model)
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=4, uniform_negatives=8, start_epoch=2, refresh_every_epochs=1,
                             work_dir=tmp_path / "sl")
    cfg = TrainConfig(epochs=6, batch_size=32, lr=0.05, group_lr={"classifier": 10.0},
                      group_optimizer={"classifier": "sgd"}, schedule="cosine", warmup_ratio=0.0, device="cpu")
    trainer = Trainer(model, sampler, ASTRAObjective(), cfg, texts, tmp_path / "ckpt")
    trainer.fit()
    after = p_at_1(model)
    assert after > before + 40, (before, after)
    parts = trainer.history["loss"][-1]
    assert {"positive", "hard", "uniform"} <= set(parts)
    model.save(tmp_path / "model")
    again = ASTRAModel.load(tmp_path / "model", labels)
    assert np.allclose(again.all_label_vectors(), model.all_label_vectors())
    with pytest.raises(ConfigError, match="labels"):
        ASTRAModel.load(tmp_path / "model", labels[:-1])
    # the serving side (xmc.models.astra, no training code): the encoder and W = [w_l, b_l] as trained
    from xmc.models.astra import is_astra_model, load_astra

    assert is_astra_model(tmp_path / "model")
    encoder, W = load_astra(tmp_path / "model", len(labels))
    assert np.allclose(W, model.all_label_vectors(), atol=1e-6)
    q = np.hstack([encoder.encode(texts[:5], "query"), np.ones((5, 1), np.float32)])
    assert np.allclose(q, model.query_vectors_np(texts[:5], progress=False), atol=1e-6)
    with pytest.raises(ConfigError, match="labels"):
        load_astra(tmp_path / "model", len(labels) + 1)


def test_logit_adjustment_lowers_each_bias_by_tau_log_count_and_favours_the_rarer_of_two_tied_labels():
    labels = ["first label", "second label", "third label"]
    model = ASTRAModel(HashedBagOfWordsEncoder(dim=8, n_buckets=1 << 8, seed=0), labels, bias_init=-2.0)
    phi = torch.from_numpy(model.query_vectors_np(["first label"], progress=False)[0, :-1])
    with torch.no_grad():   # labels 0 and 1 score alike for this query (1 + bias); label 2 scores -1 + bias
        model.W.weight[:2, :-1] = phi
        model.W.weight[2, :-1] = -phi
    weights = model.W.weight[:, :-1].detach().clone()
    counts = np.array([99, 0, 7])
    model.adjust_logits(counts, 0.0)
    assert torch.equal(model.W.weight[:, -1], torch.full((3,), -2.0))
    model.adjust_logits(counts, 0.5)
    assert torch.allclose(model.W.weight[:, -1], torch.tensor(-2.0 - 0.5 * np.log1p(counts), dtype=torch.float32))
    assert torch.equal(model.W.weight[:, :-1], weights)   # only the bias moves
    scores = model.query_vectors_np(["first label"], progress=False) @ model.all_label_vectors().T
    assert int(np.argmax(scores[0])) == 1   # the tie goes to the label with fewer training positives
    with pytest.raises(ValueError, match="3 labels"):
        model.adjust_logits(counts[:2], 0.5)


def test_bad_settings_are_one_line_config_errors():
    _, labels, Y = synthetic(n_q=8, n_l=10)
    with pytest.raises(ConfigError, match="mine_with"):
        ASTRANegatives(Y, 16, mine_with="labels")
    with pytest.raises(ConfigError, match="not both 0"):
        ASTRANegatives(Y, 16, hard_negatives=0, uniform_negatives=0)
    with pytest.raises(ConfigError, match="init_classifiers"):
        build_astra_model({"kind": "bow", "dim": 8, "n_buckets": 256}, {"init_classifiers": "zeros"}, labels, Y)
    with pytest.raises(ConfigError, match="logit_adjustment"):
        build_astra_model({"kind": "bow", "dim": 8, "n_buckets": 256}, {"logit_adjustment": -0.5}, labels, Y)
