"""MACLR: pseudo pairs with known answers, the clustering schedule through a real Stage-I run,
the losses against brute-force formulas, and the no-label-matrix guarantee of the zero-shot path."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import yaml

from xmc.baselines.tfidf import fit_tfidf
from xmc.data import Split, XMCDataset, save_processed
from xmc.encoders.build import build_encoder
from xmc.maclr.clustering import ClusterSchedule
from xmc.maclr.corpus import load_texts_only
from xmc.maclr.losses import label_regularisation_loss, supcon_loss
from xmc.maclr.pseudo import PseudoPairs, ict_pairs_from_groups, ict_pairs_from_titles, tfidf_topk, topk_to_csr, union_pairs
from xmc.maclr.train import ICTClusterSampler, fewshot_labels, restrict_columns, stage2_pseudo_matrix, train_stage1

ROOT = Path(__file__).resolve().parents[1]

LABELS = ["apple (n): a round fruit of an apple tree", "car, automobile (n): a motor vehicle with four wheels",
          "river (n): a large natural stream of water", "bank (n): sloping land beside a body of water"]
INSTANCES = ["She ate an apple from the tree .", "The car needs new wheels .", "We swam in the river water .",
             "Nothing here matches .", "They sat on the bank of the river .", "The apple tree had a round fruit ."]
GROUPS = ["d1", "d1", "d1", "d2", "d3", "d3"]


def test_tfidf_pseudo_positives_known_answers():
    f = fit_tfidf(INSTANCES, None, LABELS, {})
    ids, scores = tfidf_topk(f.trn, f.lbl, k=2, min_score=0.05)
    assert ids[0, 0] == 0 and ids[1, 0] == 1 and ids[2, 0] == 2 and ids[5, 0] == 0
    assert set(ids[4]) == {2, 3}                       # "bank ... river": both, bank first?
    assert (ids[3] == -1).all() and (scores[3] == 0).all()   # no shared term: no pseudo label
    assert (np.diff(scores[ids[:, 1] >= 0], axis=1) <= 0).all()
    # the floor removes weak matches only
    hi, _ = tfidf_topk(f.trn, f.lbl, k=2, min_score=float(scores[0, 0]) - 1e-6)
    assert hi[0, 0] == 0 and (hi >= 0).sum() < (ids >= 0).sum()
    Y = topk_to_csr(ids, len(LABELS))
    assert Y.shape == (6, 4) and Y[0, 0] == 1 and Y[3].nnz == 0
    U = union_pairs(Y, topk_to_csr(np.array([[1], [1]]), 4, rows=np.array([0, 1]), n_rows=6))
    assert U[0, 1] == 1 and U[1, 1] == 1 and U.data.max() == 1 and U.nnz == Y.nnz + 1


def test_stage2_agreement_keeps_only_pairs_both_views_rank():
    from xmc.errors import ConfigError
    from xmc.maclr.pseudo import agreed_pairs

    a = topk_to_csr(np.array([[0, 1], [2, -1], [3, 1]]), 4)
    b = topk_to_csr(np.array([[1, 2], [3, -1], [1, 3]]), 4)
    A = agreed_pairs(a, b)
    assert {(int(i), int(j)) for i, j in zip(*A.nonzero())} == {(0, 1), (2, 1), (2, 3)} and A.data.max() == 1
    # through the Stage-II miner: dense top-1 from a fake encoder vs the TF-IDF top-2 of the pairs folder
    f = fit_tfidf(INSTANCES, None, LABELS, {})
    ids, sc = tfidf_topk(f.trn, f.lbl, 2)
    pp = PseudoPairs(INSTANCES, LABELS, [], ids, sc)

    class _Enc:   # label j -> e_j; instance i -> e_(i mod 4): dense top-1 of instance i is label i mod 4
        def encode(self, texts, side, batch_size=256, progress=False):
            idx = [LABELS.index(t) if side == "label" else INSTANCES.index(t) % 4 for t in texts]
            return np.eye(4, dtype=np.float32)[idx]

    cfg = {"dense_k": 1, "sparse": True, "sparse_k": 2, "max_instances": 0}
    Yu, iu = stage2_pseudo_matrix(_Enc(), pp, {**cfg, "select": "union"})
    Ya, ia = stage2_pseudo_matrix(_Enc(), pp, {**cfg, "select": "agree"})
    want = {(i, i % 4) for i in range(6) if i % 4 in set(ids[i][ids[i] >= 0])}
    assert {(int(i), int(j)) for i, j in zip(*Ya.nonzero())} == want and want   # rows 0-2 agree on their label
    assert (Ya.multiply(Yu) != Ya).nnz == 0 and Ya.nnz < Yu.nnz and ia["instances_with_pairs"] == len(want)
    with pytest.raises(ConfigError, match="both views"):
        stage2_pseudo_matrix(None, pp, {**cfg, "dense_k": 0, "select": "agree"})


def test_stage2_label_name_view(tmp_path):
    from xmc.errors import ConfigError
    from xmc.lexical import LabelNameMatcher, parse_label_names, zero_shot_name_topk

    f = fit_tfidf(INSTANCES, None, LABELS, {})
    ids, sc = tfidf_topk(f.trn, f.lbl, 2)
    names = parse_label_names(LABELS)
    nids, nsc = zero_shot_name_topk(LabelNameMatcher(names, label_texts=LABELS), INSTANCES, 2)
    pp = PseudoPairs(INSTANCES, LABELS, ict_pairs_from_groups(INSTANCES, GROUPS), ids, sc,
                     names_ids=nids, names_scores=nsc)
    pp.save(tmp_path / "p")
    back = PseudoPairs.load(tmp_path / "p")
    assert (back.names_ids == nids).all() and back.meta["counts"]["names_pairs"] == int((nids >= 0).sum())
    assert "name_match_labels" in back.meta["sample"][0]
    Y, info = stage2_pseudo_matrix(None, back, {"dense_k": 0, "sparse": True, "sparse_view": "label_names",
                                                "sparse_k": 2, "select": "union", "max_instances": 0})
    got = {(int(i), int(j)) for i, j in zip(*Y.nonzero())}
    assert (0, 0) in got and (1, 1) in got and (2, 2) in got and not any(i == 3 for i, _ in got)
    assert info["sparse_view"] == "label_names" and info["sparse_pairs"] == Y.nnz
    unmatched = PseudoPairs(INSTANCES, LABELS, [], ids, sc, names_ids=np.full_like(nids, -1), names_scores=nsc)
    with pytest.raises(ConfigError, match="no pseudo pairs from the view"):   # names view that matched nothing
        stage2_pseudo_matrix(None, unmatched, {"dense_k": 0, "sparse": True, "sparse_view": "label_names",
                                               "sparse_k": 2, "select": "union", "max_instances": 0})
    without = PseudoPairs(INSTANCES, LABELS, [], ids, sc)   # a dataset without a names view
    with pytest.raises(ConfigError, match="no label-name view"):
        stage2_pseudo_matrix(None, without, {"dense_k": 0, "sparse": True, "sparse_view": "label_names",
                                             "sparse_k": 2, "select": "union", "max_instances": 0})


def test_ict_pairs_from_neighbouring_sentences():
    pairs = ict_pairs_from_groups(INSTANCES, GROUPS, window=1)
    got = {p.instance: (p.context, p.pseudo_label) for p in pairs}
    assert set(got) == {0, 1, 2, 4, 5}                 # d2 has one sentence: no context, no pair
    assert got[0] == (INSTANCES[1], INSTANCES[0])
    assert got[1] == (INSTANCES[0] + " " + INSTANCES[2], INSTANCES[1])
    assert got[4][0] == INSTANCES[5]                   # never crosses into another document
    assert all(p.pseudo_label not in p.context for p in pairs)
    wide = {p.instance: p.context for p in ict_pairs_from_groups(INSTANCES, GROUPS, window=2)}
    assert wide[0] == INSTANCES[1] + " " + INSTANCES[2]


def test_ict_pairs_from_titles():
    titles, contents = ["Red apples", "Cars"], ["Red apples are sweet. People like Red apples a lot.", "Only one sentence."]
    drop = ict_pairs_from_titles(titles, contents, remove_title_prob=1.0)
    assert len(drop) == 1 and drop[0].pseudo_label == "Red apples" and "Red apples" not in drop[0].context
    keep = ict_pairs_from_titles(titles, contents, remove_title_prob=0.0)
    assert keep[0].context == contents[0]


def test_pairs_folder_roundtrip_and_version(tmp_path):
    f = fit_tfidf(INSTANCES, None, LABELS, {})
    ids, sc = tfidf_topk(f.trn, f.lbl, 2)
    pp = PseudoPairs(INSTANCES, LABELS, ict_pairs_from_groups(INSTANCES, GROUPS), ids, sc)
    pp.save(tmp_path / "p")
    back = PseudoPairs.load(tmp_path / "p")
    assert back.texts == INSTANCES and len(back.ict) == 5 and (back.tfidf_ids == ids).all()
    assert back.meta["counts"]["ict_pairs"] == 5 and back.meta["sample"]
    meta = json.loads((tmp_path / "p/meta.json").read_text())
    (tmp_path / "p/meta.json").write_text(json.dumps({**meta, "version": 0}))
    from xmc.errors import DataFormatError
    with pytest.raises(DataFormatError, match="rerun"):
        PseudoPairs.load(tmp_path / "p")


def test_damaged_pairs_folder_and_corpus_give_one_line_errors_at_the_line(tmp_path):
    """A damaged pseudo-pairs file or processed text file is refused at its file and line, like the dataset readers."""
    from xmc.errors import DataFormatError

    f = fit_tfidf(INSTANCES, None, LABELS, {})
    ids, sc = tfidf_topk(f.trn, f.lbl, 2)
    PseudoPairs(INSTANCES, LABELS, ict_pairs_from_groups(INSTANCES, GROUPS), ids, sc).save(tmp_path / "p")
    ict = tmp_path / "p/ict.jsonl"
    lines = ict.read_bytes().splitlines(keepends=True)
    for bad, match in ((b"\xff\xfe\n", "not valid UTF-8"), (b"[1, 2]\n", "expected a JSON object"),
                       (b'{"i": 0, "context": \n', "invalid JSON")):
        ict.write_bytes(lines[0] + bad + b"".join(lines[2:]))
        with pytest.raises(DataFormatError, match=match) as e:
            PseudoPairs.load(tmp_path / "p")
        assert str(e.value).startswith(f"{ict}:2:") and "\n" not in str(e.value)
    d = tmp_path / "processed"
    d.mkdir()
    (d / "trn.jsonl").write_text('{"uid": "a", "text": "x"}\n')
    (d / "lbl.jsonl").write_bytes(b'{"text": "one"}\n{"text": "tw\x00o"}\n')
    with pytest.raises(DataFormatError, match="NUL byte") as e:
        load_texts_only(d)
    assert str(e.value).startswith(f"{d / 'lbl.jsonl'}:2:")


def test_cluster_schedule():
    s = ClusterSchedule(k0=4, t_k=3, t_update=2, total_steps=12)
    assert [s.k_at(t) for t in range(6)] == [4, 4, 4, 8, 8, 8]
    assert s.recluster_steps() == [0, 2, 4]                 # only in the first half
    assert [s.clustered(t) for t in (0, 5, 6, 11)] == [True, True, False, False]
    assert ClusterSchedule(4, 3, 2, 12, enabled=False).recluster_steps() == []


class _ShiftingModel:
    """Query vectors in two well-separated groups whose membership flips at every call."""

    def __init__(self, n: int) -> None:
        self.calls, self.n = 0, n

    def query_vectors_np(self, texts, batch_size=256, progress=False):
        self.calls += 1
        idx = np.array([int(t.split()[1]) for t in texts])
        side = (idx % 2) if self.calls % 2 else (idx < self.n // 2)
        v = np.where(side[:, None], [[1.0, 0.0]], [[0.0, 1.0]]) + 0.01 * np.random.default_rng(0).normal(size=(len(idx), 2))
        return v.astype(np.float32)

    def train(self):
        pass


def test_sampler_reclusters_on_schedule_and_goes_instance_level():
    from xmc.maclr.pseudo import ICTPair

    n = 16
    pairs = [ICTPair(i, f"ctx {i}", f"lab {i}") for i in range(n)]
    sched = ClusterSchedule(k0=2, t_k=2, t_update=1, total_steps=6)   # K=2 at steps 0-1, 4 at step 2
    s = ICTClusterSampler(pairs, n_labels=10, schedule=sched, label_negatives=3)
    s.query_batches(0, 8, 0)
    s.steps_per_epoch = 2
    model = _ShiftingModel(n)
    seen = []
    for step in range(6):
        s.on_step_start(step, model, s.contexts)
        b = s.make_batch(np.arange(8), np.random.default_rng(step))
        seen.append((s.cluster.copy(), b.positives.clone()))
        assert len(b.label_ids) == 3 and len(set(b.label_ids)) == 3 and b.extras["pseudo_labels"][0] == "lab 0"
    assert s.reclustered_at == [0, 1, 2] and s.k_used == [2, 2, 4]
    c0, c1 = seen[0][0], seen[1][0]
    # step 0: parity clusters; step 1: the refreshed assignment follows the model's new geometry
    assert all((c0[i] == c0[j]) == (i % 2 == j % 2) for i in range(n) for j in range(n))
    assert all((c1[i] == c1[j]) == ((i < 8) == (j < 8)) for i in range(n) for j in range(n))
    assert seen[0][1].sum() > 8 and torch.equal(seen[0][1], torch.from_numpy(c0[:8, None] == c0[None, :8]))
    for _, pos in seen[3:]:                               # second half: every instance its own cluster
        assert torch.equal(pos, torch.eye(8, dtype=torch.bool))


def test_label_regularisation_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    h, h2, lab = (torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=1) for n in (5, 5, 7))
    tau = 0.1
    want = 0.0
    for i in range(5):
        pos = math.exp(float(h[i] @ h2[i]) / tau)
        negs = sum(math.exp(float(h[i] @ lab[j]) / tau) for j in range(7))
        want += -math.log(pos / (pos + negs))
    assert label_regularisation_loss(h, h2, lab, tau).item() == pytest.approx(want / 5, rel=1e-5)


def test_supcon_matches_brute_force_and_reduces_to_ict():
    g = torch.Generator().manual_seed(1)
    q, z = (torch.nn.functional.normalize(torch.randn(6, 8, generator=g), dim=1) for _ in range(2))
    cl = [0, 0, 1, 2, 1, 0]
    same = torch.tensor([[a == b for b in cl] for a in cl])
    tau = 0.2
    want = 0.0
    for i in range(6):
        den = sum(math.exp(float(q[i] @ z[j]) / tau) for j in range(6))
        P = [p for p in range(6) if cl[p] == cl[i]]
        want += -sum(math.log(math.exp(float(q[i] @ z[p]) / tau) / den) for p in P) / len(P)
    assert supcon_loss(q, z, same, tau).item() == pytest.approx(want / 6, rel=1e-5)
    ict = torch.nn.functional.cross_entropy(q @ z.T / tau, torch.arange(6))
    assert supcon_loss(q, z, torch.eye(6, dtype=torch.bool), tau).item() == pytest.approx(ict.item(), rel=1e-5)


def _tiny_bow_stage1(k0=2, steps_cap=3, epochs=2):
    return {"mac": True, "label_reg": True, "label_weight": 1.0, "label_negatives": 3, "temperature": 0.1,
            "k0": k0, "t_k": 2, "t_update": 1, "cluster_pool": 0,
            "train": {"epochs": epochs, "batch_size": 2, "lr": 0.05, "max_steps_per_epoch": steps_cap,
                      "checkpoint_every_steps": 0, "seed": 0}}


def test_stage1_runs_through_the_trainer(tmp_path):
    f = fit_tfidf(INSTANCES, None, LABELS, {})
    ids, sc = tfidf_topk(f.trn, f.lbl, 2)
    pp = PseudoPairs(INSTANCES, LABELS, ict_pairs_from_groups(INSTANCES, GROUPS), ids, sc)
    enc = build_encoder({"kind": "bow", "dim": 16, "n_buckets": 4096, "dropout": 0.1})
    before = enc.encode(INSTANCES, "query").copy()
    res = train_stage1(enc, pp, _tiny_bow_stage1(), tmp_path / "s1")
    assert res["steps"] == 6 and res["reclustered_at"] == [0, 1, 2] and res["k_used"] == [2, 2, 4]
    rows = res["trainer"].history["loss"]
    assert "label_loss" in rows[0] and "cluster_loss" in rows[0]
    assert np.abs(enc.encode(INSTANCES, "query") - before).max() > 1e-4
    Y, info = stage2_pseudo_matrix(enc, pp, {"dense_k": 1, "sparse": True, "sparse_k": 2, "max_instances": 0})
    assert info["dense_pairs"] == 6 and info["union_pairs"] >= info["sparse_pairs"] and Y.shape == (6, 4)


def test_fewshot_label_subset():
    Y = sp.csr_matrix(np.array([[1, 0, 1, 0, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 1]], np.float32))
    labs = fewshot_labels(Y, 0.5, seed=0)
    assert len(labs) == 2 and set(labs) <= {0, 1, 2, 4}     # only labels with training instances
    R = restrict_columns(Y, labs)
    assert set(R.indices) == set(labs) & set(Y.indices) and R.shape == Y.shape


# ---- the zero-shot path cannot read the label matrix --------------------------------------------
def _write_dataset(d: Path) -> None:
    Y = sp.csr_matrix(np.eye(6, 4, dtype=np.float32))
    ds = XMCDataset([str(i) for i in range(4)], LABELS,
                    Split([f"t{i}" for i in range(6)], INSTANCES, Y, GROUPS),
                    Split(["s0"], INSTANCES[:1], Y[:1], ["d9"]), meta={"layout": "xc_raw", "source": "test"},
                    val=Split(["v0"], INSTANCES[1:2], Y[1:2], ["d8"]))
    save_processed(ds, d)


def test_zero_shot_stages_run_without_any_label_matrix(tmp_path):
    out = tmp_path / "results" / yaml.safe_load((ROOT / "params.yaml").read_text())["data"]["name"]   # the stages' outputs
    _write_dataset(out / "data/processed")
    for f in ("trn_Y.npz", "val_Y.npz", "tst_Y.npz"):
        (out / "data/processed" / f).unlink()   # nothing with ground-truth pairs is left
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["runs"] = {"tiny": {"method": "maclr", "encoder": {"kind": "bow", "dim": 16, "n_buckets": 4096, "dropout": 0.1},
                               "stage1": _tiny_bow_stage1(),
                               "stage2": {"dense_k": 1, "max_instances": 0, "sparse_view": "label_names",
                                          "select": "union",
                                          "train": {"epochs": 1, "batch_size": 2, "lr": 0.05, "max_steps_per_epoch": 2,
                                                    "checkpoint_every_steps": 0}}}}
    # only the MACLR stages run here: nothing else may name the runs this file no longer has
    params.update({"hybrids": {}, "xr_linear": {}})
    params["report"].update({"paired": [], "training_families": {}})
    params["registry"]["promote"] = []
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XMC_THREADS": "1"}
    for cmd in (["stages.maclr_pseudo_pairs"], ["stages.plan"], ["stages.train", "tiny"]):
        p = subprocess.run([sys.executable, "-m", *cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    # the pairs folder is a DVC output every MACLR run depends on: the same inputs give the same bytes (its timings
    # are in maclr_pairs_timing.json), so rebuilding it does not retrain the runs
    first = {f.name: f.read_bytes() for f in sorted((out / "data/maclr_pairs").iterdir())}
    p = subprocess.run([sys.executable, "-m", "stages.maclr_pseudo_pairs"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert {f.name: f.read_bytes() for f in sorted((out / "data/maclr_pairs").iterdir())} == first
    assert set(json.loads((out / "data/maclr_pairs_timing.json").read_text())) == {"ict", "tfidf", "label_names"}
    summary = json.loads((out / "models/tiny/train_summary.json").read_text())
    assert summary["stage1"]["steps"] == 6 and summary["stage2"]["steps"] == 2
    # the label-name view: "apple", "car", "river", "bank" are named in the instances (no label matrix read)
    assert summary["stage2"]["sparse_view"] == "label_names" and summary["stage2"]["sparse_pairs"] >= 5
    pairs = PseudoPairs.load(out / "data/maclr_pairs")
    assert set(pairs.names_ids[4][:2].tolist()) == {2, 3}   # "bank of the river": bank, river
    assert (pairs.names_ids[3] == -1).all()   # "Nothing here matches ."
    assert load_texts_only(out / "data/processed").texts == INSTANCES
    # the run's plan (the only dependency of its train@ stage) names the pseudo pairs and no processed file
    plan = json.loads((out / "plans/tiny.json").read_text())
    pairs_dir = (out / "data/maclr_pairs").relative_to(tmp_path).as_posix()
    assert list(plan["inputs"]) == [pairs_dir] and plan["inputs"][pairs_dir]


def test_dvc_zero_shot_stages_do_not_depend_on_the_label_matrix():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = stages["maclr_pseudo_pairs"]["deps"]
    assert "results/${data.name}/data/processed" not in deps and not any("_Y" in d for d in deps), deps
    # a training stage reads what its plan names (plans/maclr.json: the pseudo pairs, test_split_hygiene)
    assert stages["train"]["do"]["deps"] == ["results/${data.name}/plans/${key}.json"]


def test_cluster_pool_holds_the_next_steps_instances():
    from xmc.maclr.pseudo import ICTPair

    n = 40
    pairs = [ICTPair(i, f"ctx {i}", f"lab {i}") for i in range(n)]
    s = ICTClusterSampler(pairs, 5, ClusterSchedule(k0=4, t_k=10, t_update=2, total_steps=10), cluster_pool=12)
    batches = s.query_batches(0, 4, 0)
    s.steps_per_epoch = len(batches)
    pool = s.pool(2)
    assert len(pool) == 12 and set(batches[2]) | set(batches[3]) <= set(pool)
    s.on_step_start(2, _ShiftingModel(n), s.contexts)
    assert s.k_used == [4]                                # the schedule's K, not scaled to the pool
    outside = np.setdiff1d(np.arange(n), pool)
    assert len(set(s.cluster[outside])) == len(outside) and not set(s.cluster[outside]) & set(s.cluster[pool])
