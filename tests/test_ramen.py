"""RAMEN: random walk with restart vs its closed form, pruning, the regulariser vs brute force,
the graph file format and its errors, and a tiny end-to-end training run through the Trainer."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from xmc.encoders.bow import HashedBagOfWordsEncoder
from xmc.errors import DataFormatError
from xmc.graph import (AnchorSet, augment_edges, bipartite_adjacency, load_graph_dir, prune_edges,
                       random_walk_with_restart, rwr_closed_form, save_anchor_set)
from xmc.graph.build import document_query_set, item_relations_label_set, label_cooccurrence_set, wordnet_label_set
from xmc.graph.rwr import top_k_per_row
from xmc.graph.stats import degree_histogram, graph_stats
from xmc.data.dataset import Split
from xmc.losses import DecoupledSoftmaxLoss
from xmc.methods.ramen import GraphAnchorSampler, RamenObjective, TripletLoss, anchor_regulariser
from xmc.models.dual_encoder import DualEncoderModel
from xmc.negatives import InBatchNegatives
from xmc.trainer.trainer import Trainer, TrainConfig
from xmc.trainer.live import TrainingLog
from xmc.trainer.checkpoint import load_checkpoint


def small_bipartite(seed: int = 0, n: int = 7, m: int = 5) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    E = (rng.random((n, m)) < 0.35).astype(np.float32)
    E[np.arange(n), rng.integers(0, m, n)] = 1  # every node has an edge
    E[-1] = 0  # one isolated node: exercises the dangling-node restart
    return sp.csr_matrix(E)


# ---- random walk with restart --------------------------------------------------------------
@pytest.mark.parametrize("restart", [0.8, 0.3])
def test_rwr_visit_frequencies_match_closed_form_stationary_distribution(restart):
    A = bipartite_adjacency(small_bipartite())
    starts = np.array([0, 2, 6, 8])  # nodes, the isolated node (6) and an anchor
    walks, hops = 400, 400
    V = random_walk_with_restart(A, starts, walks=walks, hops=hops, restart=restart, seed=1).toarray()
    for i, s in enumerate(starts):
        pi = rwr_closed_form(A, int(s), restart)
        assert pi.sum() == pytest.approx(1.0)
        est = V[i] / (walks * hops)
        assert np.abs(est - pi).max() < 0.01, (s, est.round(3), pi.round(3))
    # the isolated node never leaves its start
    assert V[2, 6] == walks * hops


def test_rwr_is_deterministic_and_counts_only_masked_nodes():
    A = bipartite_adjacency(small_bipartite())
    mask = np.zeros(A.shape[0], bool)
    mask[7:] = True
    V1 = random_walk_with_restart(A, np.array([0, 1]), walks=5, hops=50, seed=3, count_mask=mask, max_walkers=7)
    V2 = random_walk_with_restart(A, np.array([0, 1]), walks=5, hops=50, seed=3, count_mask=mask, max_walkers=7)
    assert (V1 != V2).nnz == 0
    assert V1[:, :7].nnz == 0 and V1.sum() > 0


def test_augment_adds_only_new_top_k_edges_and_keeps_originals():
    E = small_bipartite(2, 12, 8)
    aug, info = augment_edges(E, walks=50, hops=100, restart=0.5, top_k=2, min_visits=1, seed=0)
    assert info["edges_before"] == E.nnz and info["edges_after"] == aug.nnz == E.nnz + info["edges_added"]
    assert np.all(aug.multiply(E > 0).data == 1.0)  # original edges keep weight 1
    new = aug - aug.multiply(E > 0)
    new.eliminate_zeros()
    assert new.nnz == info["edges_added"] > 0
    assert np.all((new.data > 0) & (new.data < 1))  # visit shares
    # every new edge joins two nodes of the same connected component (2 hops or more apart)
    comp = {v: k for k, c in enumerate(nx.connected_components(to_networkx(E))) for v in c}
    for r, c in zip(*new.nonzero()):
        assert comp[("n", r)] == comp[("a", c)]


def to_networkx(E: sp.spmatrix) -> nx.Graph:
    """The bipartite graph as networkx sees it: nodes ("n", i) and ("a", j), one edge per entry of E."""
    G = nx.Graph()
    G.add_nodes_from(("n", i) for i in range(E.shape[0]))
    G.add_nodes_from(("a", j) for j in range(E.shape[1]))
    coo = sp.coo_matrix(E)
    G.add_edges_from((("n", int(r)), ("a", int(c))) for r, c in zip(coo.row, coo.col))
    return G


@pytest.mark.parametrize("seed", range(4))
def test_graph_stats_are_networkx_s_numbers(seed):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 40)), int(rng.integers(1, 30))
    E = sp.random(n, m, density=float(rng.uniform(0.01, 0.2)), random_state=seed, format="coo")
    # a duplicate entry and an explicit zero: one edge each, as networkx counts them
    E = sp.coo_matrix((np.r_[E.data, 0.5, 0.0], (np.r_[E.row, 0, n - 1], np.r_[E.col, 0, m - 1])), shape=(n, m)).tocsr()
    G = to_networkx(E)
    st = graph_stats(E)
    node_deg = np.array([G.degree(("n", i)) for i in range(n)])
    anc_deg = np.array([G.degree(("a", j)) for j in range(m)])
    comps = [len(c) for c in nx.connected_components(G) if len(c) > 1]
    assert st["edges"] == G.number_of_edges() and (st["nodes"], st["anchors"]) == (n, m)
    assert st["node_degree"]["max"] == node_deg.max() and st["node_degree"]["isolated"] == (node_deg == 0).sum()
    assert st["node_degree"]["mean"] == round(float(node_deg.mean()), 3)
    assert st["anchor_degree"]["median"] == float(np.median(anc_deg))
    assert st["anchor_degree"]["histogram"] == degree_histogram(anc_deg)
    assert st["node_degree"]["histogram"] == degree_histogram(node_deg)
    assert st["components_with_edges"] == len(comps) and st["largest_component"] == max(comps, default=0)
    assert graph_stats(sp.csr_matrix((n, m)))["components_with_edges"] == 0


def test_top_k_per_row_breaks_ties_by_column():
    M = sp.csr_matrix(np.array([[3, 1, 3, 2], [0, 0, 0, 0], [1, 5, 0, 5]], np.float32))
    out = top_k_per_row(M, 2, min_value=2).toarray()
    assert out.tolist() == [[3, 0, 3, 0], [0, 0, 0, 0], [0, 5, 0, 5]]


# ---- pruning ---------------------------------------------------------------------------------
def test_pruning_keeps_exactly_the_edges_above_threshold():
    rng = np.random.default_rng(0)
    E = sp.csr_matrix((rng.random((30, 20)) < 0.3).astype(np.float32) * rng.uniform(0.5, 2, (30, 20)).astype(np.float32))
    nv, av = rng.normal(size=(30, 8)).astype(np.float32), rng.normal(size=(20, 8)).astype(np.float32) * 3
    for thr in (0.0, 0.25, -0.1):
        kept = prune_edges(E, nv, av, thr)
        for r, c in zip(*E.nonzero()):
            cos = nv[r] @ av[c] / np.linalg.norm(nv[r]) / np.linalg.norm(av[c])
            assert (kept[r, c] != 0) == (cos > thr)
            if cos > thr:
                assert kept[r, c] == E[r, c]  # weights survive
        assert kept.nnz == sum(1 for r, c in zip(*E.nonzero())
                               if nv[r] @ av[c] / np.linalg.norm(nv[r]) / np.linalg.norm(av[c]) > thr)


# ---- the regulariser ---------------------------------------------------------------------------
def brute_force_triplet(s: np.ndarray, pos_col: np.ndarray, valid: np.ndarray, margin: float) -> float:
    per_row = []
    for r in range(s.shape[0]):
        terms = [max(0.0, s[r, n] - s[r, pos_col[r]] + margin)
                 for n in range(s.shape[1]) if n != pos_col[r] and valid[r, n]]
        if terms:
            per_row.append(sum(terms) / len(terms))
    return float(np.mean(per_row))


def test_regulariser_matches_brute_force():
    rng = np.random.default_rng(0)
    x = torch.nn.functional.normalize(torch.randn(6, 5, dtype=torch.float64), dim=1)
    a = torch.nn.functional.normalize(torch.randn(4, 5, dtype=torch.float64), dim=1)
    pos_col = torch.tensor([0, 1, 1, 3, 2, 0])
    valid = torch.from_numpy(rng.random((6, 4)) < 0.7)
    valid[5] = False  # a row whose only anchor is its positive: no negative, no term
    valid[5, 0] = True
    s = (x @ a.T).numpy()
    for margin in (0.3, 1.0):
        got = anchor_regulariser(x, a, pos_col, valid, "triplet", margin)
        assert float(got) == pytest.approx(brute_force_triplet(s, pos_col.numpy(), valid.numpy(), margin), abs=1e-6)
    # softmax variant: -log p(positive) among positive + valid negatives
    T = 0.1
    got = anchor_regulariser(x, a, pos_col, valid, "softmax", temperature=T)
    rows = []
    for r in range(6):
        neg = [n for n in range(4) if n != pos_col[r] and valid[r, n]]
        if neg:
            logits = np.array([s[r, pos_col[r]]] + [s[r, n] for n in neg]) / T
            rows.append(-(logits[0] - np.log(np.exp(logits).sum())))
    assert float(got) == pytest.approx(float(np.mean(rows)), abs=1e-6)


def test_triplet_task_loss_matches_brute_force():
    rng = np.random.default_rng(1)
    s = torch.from_numpy(rng.uniform(-1, 1, (3, 5)))
    pos = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    got = float(TripletLoss(0.3)(s, pos))
    rows = []
    for b in range(2):
        P, N = np.flatnonzero(pos[b]), np.flatnonzero(~pos[b])
        rows.append(np.mean([max(0, s[b, n] - s[b, p] + 0.3) for p in P for n in N]))
    assert got == pytest.approx(float(np.mean(rows)))


def test_triplet_task_loss_equals_the_pairwise_form_and_its_gradient():
    # the loss pads each row's positives instead of forming every (p, n) pair over the pool: same value, same
    # gradient as the b x pool x pool form, on rows with 0, 1 and many positives and a validity mask
    rng = np.random.default_rng(2)
    s = torch.from_numpy(rng.uniform(-1, 1, (7, 40))).requires_grad_()
    pos = torch.from_numpy(rng.random((7, 40)) < 0.15)
    pos[0] = False
    pos[1] = False
    pos[1, 3] = True
    pos[2] = True
    pos[2, :5] = False
    valid = torch.from_numpy(rng.random((7, 40)) < 0.8)

    def pairwise(scores):
        neg = ~pos & valid
        h = torch.relu(scores[:, None, :] - scores[:, :, None] + 0.3)
        m = pos[:, :, None] & neg[:, None, :]
        per = (h * m).sum((1, 2)) / m.sum((1, 2)).clamp(min=1)
        keep = m.any(2).any(1)
        return per[keep].mean()

    got = TripletLoss(0.3)(s, pos, valid)
    (g_got,) = torch.autograd.grad(got, s)
    want = pairwise(s)
    (g_want,) = torch.autograd.grad(want, s)
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    assert torch.allclose(g_got, g_want, atol=1e-12)
    assert float(TripletLoss(0.3)(s, torch.zeros_like(pos))) == 0.0


# ---- the file format ---------------------------------------------------------------------------
def write(tmp_path, name, text):
    (tmp_path / name).write_bytes(text.encode("utf-8", "surrogateescape"))   # "\udcff" writes the byte 0xff
    return tmp_path / name


def test_format_round_trip(tmp_path):
    E = sp.csr_matrix(np.array([[1, 0, 0.5], [0, 0, 0], [0, 2, 0]], np.float32))
    aset = AnchorSet("cats", ["a", "b", "c"], ["alpha", "beta", "gamma"], {"label": E})
    save_anchor_set(aset, tmp_path)
    got = load_graph_dir(tmp_path, n_queries=10, n_labels=3)["cats"]
    assert got.anchor_ids == aset.anchor_ids and got.anchor_texts == aset.anchor_texts
    assert "query" not in got.edges and (got.edges["label"] != E).nnz == 0


@pytest.mark.parametrize("anchors, edges, message", [
    ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "", "anchors.jsonl:2: duplicate anchor id 'a'"),
    ('{"id": "a", "text": "x"}\n{"id": "b"\n', "", "anchors.jsonl:2: invalid JSON"),
    ('{"id": "a", "text": "x"}\n["b", "y"]\n', "", "anchors.jsonl:2: expected a JSON object"),
    ('{"id": "a", "text": ""}\n', "", "anchors.jsonl:1: anchor 'a' has an empty"),
    ('{"id": "a", "text": "x"}\n', "0\ta\n1\tzz\n", "edges.tsv:2: unknown anchor id 'zz'"),
    ('{"id": "a", "text": "x"}\n', "# comment\n\n7\ta\n", "edges.tsv:3: src_row 7 out of range [0, 3)"),
    ('{"id": "a", "text": "x"}\n', "x\ta\n", "edges.tsv:1: src_row 'x' is not an integer"),
    ('{"id": "a", "text": "x"}\n', "0 a\n", "edges.tsv:1: expected 'src_row<TAB>anchor_id[<TAB>weight]'"),
    ('{"id": "a", "text": "x"}\n', "0\ta\t-1\n", "edges.tsv:1: weight must be a positive finite number"),
    ('{"id": "a", "text": "x"}\n{"id": "b", "text": "\udcff"}\n', "", "anchors.jsonl:2: not valid UTF-8"),
    ('{"id": "a", "text": "x"}\n', "0\ta\n0\t\udcfe\n", "edges.tsv:2: not valid UTF-8"),
    ('{"id": "a", "text": "x"}\n', "0\ta\x00\n", "edges.tsv:1: NUL byte"),
])
def test_malformed_graph_files_give_one_line_errors(tmp_path, anchors, edges, message):
    write(tmp_path, "s_anchors.jsonl", anchors)
    write(tmp_path, "s_query_edges.tsv", edges)
    with pytest.raises(DataFormatError) as e:
        load_graph_dir(tmp_path, n_queries=3, n_labels=2)
    assert message in str(e.value) and "\n" not in str(e.value)


def _tiny_wordnet(tmp_path, label_graph: bytes):
    """A two-label dataset side (lbl.jsonl, label_graph.tsv) and a three-synset WordNet folder."""
    data, wn = tmp_path / "data", tmp_path / "wn"
    data.mkdir()
    wn.mkdir()
    (data / "lbl.jsonl").write_text('{"lid": 0, "id": "s1"}\n{"lid": 1, "id": "s2"}\n')
    (wn / "synsets.jsonl").write_text("".join(json.dumps({"id": s, "lemmas": [s], "pos": "n", "definition": f"a {s}"})
                                              + "\n" for s in ("s1", "s2", "p1")))
    (wn / "edges.tsv").write_text("src\tpointer\tdst\ns1\t+\ts2\n")
    (data / "label_graph.tsv").write_bytes(label_graph)
    return data, wn


def test_wordnet_label_set_from_the_label_graph_and_wordnet_pointers(tmp_path):
    data, wn = _tiny_wordnet(tmp_path, b"child\trelation\tparent\ns1\thypernym\tp1\n")
    aset = wordnet_label_set(data, wn, 2, ["+"], hypernym_levels=1)
    assert aset.anchor_ids == ["p1", "s2"] and aset.anchor_texts[0] == "p1 (n): a p1"
    assert aset.edges["label"].toarray().tolist() == [[1, 1], [0, 0]]


def test_relations_label_set_links_a_label_that_is_a_training_item_to_that_items_labels():
    # labels a, b, c are packages; training items a (-> b, c) and x (-> a); b and c are no training item
    labels = ["a: tool", "b: library", "c: data"]
    Y = sp.csr_matrix(np.array([[0, 1, 1], [1, 0, 0]], np.float32))
    trn = Split(uids=["a", "x"], texts=["a: tool", "x: other"], Y=Y)
    aset = item_relations_label_set(trn, labels, ["0", "1", "2"])
    assert aset.anchor_ids == ["1", "2"] and aset.anchor_texts == ["b: library", "c: data"]
    assert aset.edges["label"].toarray().tolist() == [[1, 1], [0, 0], [0, 0]]
    # word-sense data: no label text is a sentence, so the set is empty
    none = item_relations_label_set(Split(uids=["s"], texts=["a sentence"], Y=Y[:1]), labels, ["0", "1", "2"])
    assert none.edges["label"].nnz == 0 and none.anchor_ids == []


def test_cooccurrence_label_set_keeps_the_most_shared_labels_of_each_label():
    rng = np.random.default_rng(0)
    Y = sp.csr_matrix((rng.random((60, 9)) < 0.3).astype(np.float32))
    labels = [f"l{j}" for j in range(9)]
    aset = label_cooccurrence_set(Split(uids=[str(i) for i in range(60)], texts=["t"] * 60, Y=Y), labels,
                                  [str(j) for j in range(9)], top_k=3, min_count=4)
    C = (Y.T @ Y).toarray()
    E = aset.edges["label"].toarray()
    for a in range(9):
        # brute force: the other labels sharing >= 4 instances, most shared first, ties by label id
        want = sorted((b for b in range(9) if b != a and C[a, b] >= 4), key=lambda b: (-C[a, b], b))[:3]
        got = sorted(int(aset.anchor_ids[c]) for c in np.flatnonzero(E[a]))
        assert got == sorted(want), (a, got, want)
    assert all(aset.anchor_texts[c] == f"l{aset.anchor_ids[c]}" for c in range(aset.n_anchors))
    # single-label data: no two labels share an instance, no edges
    single = sp.csr_matrix((np.ones(9, np.float32), (range(9), range(9))), shape=(9, 9))
    assert label_cooccurrence_set(Split(uids=list("abcdefghi"), texts=["t"] * 9, Y=single), labels,
                                  [str(j) for j in range(9)]).edges["label"].nnz == 0


@pytest.mark.parametrize("label_graph, message", [
    (b"child\trelation\tparent\ns1\thypernym\t\xffp1\n", "label_graph.tsv:2: not valid UTF-8"),
    (b"child\tparent\ns1\tp1\n", "label_graph.tsv:1: expected header"),
    (b"child\trelation\tparent\ns1 hypernym p1\n", "label_graph.tsv:2: expected at least 3 tab-separated fields"),
    (b"", "label_graph.tsv: empty file"),
])
def test_bad_label_graph_is_a_one_line_error_naming_the_line(tmp_path, label_graph, message):
    data, wn = _tiny_wordnet(tmp_path, label_graph)
    with pytest.raises(DataFormatError) as e:
        wordnet_label_set(data, wn, 2, ["+"])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("records, message", [
    ('{"lid": 0, "id": "s1"}\n{"lid": "one", "id": "s2"}\n', "lbl.jsonl:2: lid 'one' is not an integer"),
    ('{"lid": 0, "id": "s1"}\n\n{"lid": 1}\n', "lbl.jsonl:3: expected an object with a string 'id'"),
    ('[0, "s1"]\n', "lbl.jsonl:1: expected a JSON object"),
    ('{"lid": 0, "id": "s1"}\n{"lid": 5, "id": "s2"}\n', "lbl.jsonl:2: lid 5 out of range [0, 2)"),
])
def test_bad_label_record_is_a_one_line_error_naming_the_line(tmp_path, records, message):
    data, wn = _tiny_wordnet(tmp_path, b"child\trelation\tparent\ns1\thypernym\tp1\n")
    (data / "lbl.jsonl").write_text(records)
    with pytest.raises(DataFormatError) as e:
        wordnet_label_set(data, wn, 2, ["+"])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_anchor_set_without_edges_and_missing_dir_are_errors(tmp_path):
    write(tmp_path, "s_anchors.jsonl", '{"id": "a", "text": "x"}\n')
    with pytest.raises(DataFormatError, match="neither s_query_edges.tsv nor s_label_edges.tsv"):
        load_graph_dir(tmp_path, 3, 2)
    with pytest.raises(DataFormatError, match="graph directory not found"):
        load_graph_dir(tmp_path / "nope", 3, 2)


def test_document_set_links_neighbouring_sentences_of_the_same_document():
    Y = sp.csr_matrix((5, 2), dtype=np.float32)
    trn = Split(texts=list("abcde"), Y=Y, uids=[f"u{i}" for i in range(5)], groups=["d1", "d1", "d1", "d2", "d2"])
    E = document_query_set(trn, window=1).edges["query"].toarray()
    assert E.tolist() == [[0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0]]


# ---- sampler + objective + trainer -----------------------------------------------------------
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def toy_problem(n_q=40, n_l=20, seed=0):
    rng = np.random.default_rng(seed)
    labels = [" ".join(rng.choice(WORDS, 2)) + f" l{i}" for i in range(n_l)]
    rows, cols, texts = [], [], []
    for q in range(n_q):
        pos = rng.choice(n_l, 2, replace=False)
        rows += [q] * 2
        cols += list(pos)
        texts.append(" ".join(labels[p] for p in pos))
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_q, n_l))
    anchors = [f"anchor {w}" for w in WORDS]
    El = sp.csr_matrix((rng.random((n_l, len(WORDS))) < 0.2).astype(np.float32))
    Eq = sp.csr_matrix((rng.random((n_q, len(WORDS))) < 0.2).astype(np.float32))
    sets = {"words": AnchorSet("words", WORDS, anchors, {"label": El, "query": Eq})}
    return texts, labels, Y, sets


def test_sampler_blocks_mask_linked_anchors_and_objective_matches_parts():
    texts, labels, Y, sets = toy_problem()
    sampler = GraphAnchorSampler(InBatchNegatives(Y), sets, len(labels), extra_labels=5, prune=False)
    batch = sampler.make_batch(np.arange(8), np.random.default_rng(0))
    blocks = {b["side"]: b for b in batch.extras["anchors"]}
    assert set(blocks) == {"query", "label"}
    for side, blk in blocks.items():
        E = sets["words"].edges[side]
        for r, node in enumerate(blk["node_ids"]):
            pos = blk["anchor_ids"][blk["pos_col"][r]]
            assert E[node, pos] > 0  # the positive is a real edge
            for c, a in enumerate(blk["anchor_ids"]):
                if c != blk["pos_col"][r]:
                    assert bool(blk["valid"][r, c]) == (E[node, a] == 0)  # linked anchors are never negatives
    assert set(batch.extras["extra_label_ids"]).isdisjoint(batch.label_ids)
    enc = HashedBagOfWordsEncoder(dim=16, n_buckets=1 << 12)
    model = DualEncoderModel(enc, labels)
    obj = RamenObjective(DecoupledSoftmaxLoss(0.05), sets, lambda_x=0.5, lambda_z=2.0)
    total = float(obj(model, batch, texts).detach())
    p = obj.last_parts
    assert total == pytest.approx(p["task"] + 0.5 * p["R_q_words"] + 2.0 * p["R_l_words"], rel=1e-5)


def toy_ramen(every_epochs: int = 2):
    """The data, encoder, model, sampler (pruning from epoch 1) and objective of a small RAMEN run."""
    torch.manual_seed(0)
    texts, labels, Y, sets = toy_problem()
    enc = HashedBagOfWordsEncoder(dim=16, n_buckets=1 << 12)
    model = DualEncoderModel(enc, labels)
    sampler = GraphAnchorSampler(InBatchNegatives(Y), sets, len(labels), extra_labels=4,
                                 prune=True, threshold=0.0, warmup_epochs=1, every_epochs=every_epochs)
    return (texts, labels, Y, sets), enc, model, sampler, RamenObjective(DecoupledSoftmaxLoss(0.05), sets)


def test_ramen_trains_through_the_trainer_and_prunes_on_schedule(tmp_path):
    (texts, labels, Y, sets), enc, model, sampler, obj = toy_ramen()
    cfg = TrainConfig(epochs=4, batch_size=16, lr=0.05, warmup_ratio=0.0)
    live = TrainingLog(tmp_path / "plots")
    tr = Trainer(model, sampler, obj, cfg, texts, tmp_path / "w", live=live)
    tr.fit()
    assert sampler.pruned_at == [1, 3]
    for (name, side), E in sampler.active.items():
        assert (E - E.multiply(sampler.full[(name, side)])).nnz == 0  # pruning only removes edges
    hist = tr.history["loss"]
    assert {"task", "R_q_words", "R_l_words"} <= set(hist[-1])
    assert np.mean([h["loss"] for h in hist[-3:]]) < np.mean([h["loss"] for h in hist[:3]])
    live.close()
    assert (tmp_path / "plots" / "plots" / "metrics" / "train" / "R_l_words.tsv").is_file()
    # pruned graphs are part of the checkpoint: a resumed sampler gets them back. A finished run drops its
    # checkpoint (completed.json replaces it), so write one of the final state explicitly.
    assert not (tmp_path / "w" / "checkpoint.pt").exists() and (tmp_path / "w" / "completed.json").exists()
    tr.save_checkpoint()
    state = load_checkpoint(tmp_path / "w" / "checkpoint.pt")["sampler"]
    fresh = GraphAnchorSampler(InBatchNegatives(Y), sets, len(labels))
    fresh.load_state_dict(state)
    assert fresh.pruned_at == [1, 3]
    assert all((fresh.active[k] != v).nnz == 0 for k, v in sampler.active.items())
    json.dumps(sampler.prune_log)


def test_ramen_regularises_with_a_graph_or_is_refused(tmp_path):
    """No silent fallback: on data with no label graph and no documents RAMEN regularises with the labels'
    co-occurrence (its weights differ from the no-graph baseline's); with no regulariser edges at all it is refused
    with one line; ``regulariser.sets: []`` is the no-graph baseline, asked for by name."""
    import xmc
    from tests.test_own_dataset_e2e import write_product_dataset
    from xmc.errors import ConfigError

    data = write_product_dataset(tmp_path / "products")
    small = {"encoder": {"kind": "bow", "dim": 16, "n_buckets": 2048}, "train": {"epochs": 2},
             "pruning": {"warmup_epochs": 1}, "run_validation": False}
    xmc.train(data, "ramen", out=tmp_path / "graph", **small)
    xmc.train(data, "ramen", out=tmp_path / "baseline", regulariser={"sets": []}, **small)
    weights = {name: {p.name: p.read_bytes() for p in sorted((tmp_path / name / "encoder").rglob("*")) if p.is_file()}
               for name in ("graph", "baseline")}
    assert weights["graph"] and weights["graph"].keys() == weights["baseline"].keys()
    assert weights["graph"] != weights["baseline"]
    with pytest.raises(ConfigError, match="no RAMEN regulariser that is on has graph edges"):
        xmc.train(data, "ramen", out=tmp_path / "refused", graph={"cooccurrence": {"enabled": False}}, **small)
    assert not (tmp_path / "refused").exists()
