"""Random walk with restart (RWR) on bipartite node->anchor graphs, and cosine pruning.

RAMEN (Appendix A) recovers missing metadata edges with a random walk with restart (400 hops,
restart probability 0.8) and prunes noisy edges with the current encoder (cosine > 0). The paper
leaves open how visits become edges; here: ``walks`` independent walkers per start node, visit
counts over all hops, and the ``top_k`` most-visited not-yet-linked nodes of the other side (with at
least ``min_visits`` visits) become new edges.

The walk is vectorised: every walker of a chunk moves in one numpy step per hop (a uniform neighbour
from the CSR row, or a jump back to its start), and visit counts are summed with scipy.sparse
every few hops. networkx would take one Python call per step per walker (hundreds of times slower).
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

log = logging.getLogger(__name__)


def bipartite_adjacency(E: sp.csr_matrix) -> sp.csr_matrix:
    """(n+m) x (n+m) symmetric 0/1 adjacency of the bipartite graph: nodes 0..n-1, then anchors."""
    B = (E.tocsr() > 0).astype(np.float32)
    return sp.bmat([[None, B], [B.T, None]], format="csr").astype(np.float32)


def random_walk_with_restart(adj: sp.csr_matrix, starts: np.ndarray, walks: int = 10, hops: int = 400,
                             restart: float = 0.8, seed: int = 0, count_mask: np.ndarray | None = None,
                             max_walkers: int = 1 << 20, flush_every: int = 25, progress: bool = False) -> sp.csr_matrix:
    """Visit counts of restarted random walks: ``V[i, v]`` = visits of node v by the walks from ``starts[i]``.

    A walker at node u jumps back to its start with probability ``restart`` (always, if u has no
    neighbour), else moves to a uniform neighbour of u; its position after each of the ``hops`` hops
    is counted (only nodes with ``count_mask`` True, if given). ``V / (walks * hops)`` estimates the
    stationary distribution of the restarted walk, ``restart * (I - (1-restart) P^T)^-1 e_s``
    (:func:`rwr_closed_form`). Starts are processed in chunks of at most ``max_walkers`` walkers, so
    memory stays bounded for graphs with millions of nodes.
    """
    adj = adj.tocsr()
    n = adj.shape[0]
    indptr, indices = adj.indptr.astype(np.int64), adj.indices.astype(np.int64)
    deg = np.diff(indptr)
    starts = np.asarray(starts, np.int64)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, max_walkers // max(1, walks))
    blocks: list[sp.csr_matrix] = []
    n_chunks = (len(starts) + per_chunk - 1) // per_chunk
    for c in tqdm(range(n_chunks), desc="random walks", unit="chunk", disable=not progress, mininterval=5):
        chunk = starts[c * per_chunk : (c + 1) * per_chunk]
        origin = np.repeat(chunk, walks)
        row = np.repeat(np.arange(len(chunk), dtype=np.int64), walks)
        cur = origin.copy()
        acc = sp.csr_matrix((len(chunk), n), dtype=np.float32)
        buf_r: list[np.ndarray] = []
        buf_c: list[np.ndarray] = []
        for h in range(hops):
            d = deg[cur]
            jump = (rng.random(len(cur)) < restart) | (d == 0)
            offs = np.minimum((rng.random(len(cur)) * d).astype(np.int64), np.maximum(d - 1, 0))
            nxt = indices[np.minimum(indptr[cur] + offs, max(len(indices) - 1, 0))] if len(indices) else cur
            cur = np.where(jump, origin, nxt)
            if count_mask is not None:
                keep = count_mask[cur]
                buf_r.append(row[keep])
                buf_c.append(cur[keep])
            else:
                buf_r.append(row)
                buf_c.append(cur)
            if (h + 1) % flush_every == 0 or h == hops - 1:
                r, cc = np.concatenate(buf_r), np.concatenate(buf_c)
                # coo -> csr sums duplicate (row, node) pairs: the visit counts of these hops
                acc = acc + sp.csr_matrix((np.ones(len(r), np.float32), (r, cc)), shape=(len(chunk), n))
                buf_r, buf_c = [], []
        blocks.append(acc)
    return sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, n), dtype=np.float32)


def rwr_closed_form(adj: sp.csr_matrix, start: int, restart: float = 0.8) -> np.ndarray:
    """Stationary distribution of the restarted walk from ``start`` (dense solve; small graphs only).

    P is the row-stochastic transition matrix (a node without neighbours jumps to the start), and
    pi = restart * e_s + (1 - restart) * P^T pi.
    """
    A = adj.toarray().astype(np.float64)
    n = A.shape[0]
    deg = A.sum(1)
    P = np.zeros_like(A)
    nz = deg > 0
    P[nz] = A[nz] / deg[nz, None]
    e = np.zeros(n)
    e[start] = 1.0
    # dangling nodes return to the start with probability 1: fold their missing mass into e_s
    P[~nz, start] = 1.0
    M = np.eye(n) - (1 - restart) * P.T
    return np.linalg.solve(M, restart * e)


def top_k_per_row(M: sp.csr_matrix, k: int, min_value: float = 0.0) -> sp.csr_matrix:
    """Keep the ``k`` largest entries of each row that are >= ``min_value``; ties broken by column."""
    M = M.tocsr()
    M.eliminate_zeros()
    coo = M.tocoo()
    keep = coo.data >= min_value
    r, c, v = coo.row[keep], coo.col[keep], coo.data[keep]
    order = np.lexsort((c, -v, r))  # by row, then value descending, then column
    r, c, v = r[order], c[order], v[order]
    first = np.searchsorted(r, r, side="left")
    rank = np.arange(len(r)) - first
    sel = rank < k
    out = sp.csr_matrix((v[sel], (r[sel], c[sel])), shape=M.shape)
    return out


def augment_edges(E: sp.csr_matrix, walks: int = 10, hops: int = 400, restart: float = 0.8, top_k: int = 5,
                  min_visits: int = 2, seed: int = 0, progress: bool = False) -> tuple[sp.csr_matrix, dict]:
    """Add RWR edges to a bipartite node->anchor edge matrix E (n x m).

    Walks start from every node with an edge on both sides: from a node, the most-visited anchors it
    is not yet linked to become candidate edges; from an anchor, the most-visited nodes. The union of
    both directions is added with weight = visit share of the walk that found it (max of the two);
    original edges keep their weight. Returns (E_augmented, info).
    """
    E = E.tocsr().astype(np.float32)
    n, m = E.shape
    adj = bipartite_adjacency(E)
    deg = np.diff(adj.indptr)
    is_anchor = np.zeros(n + m, bool)
    is_anchor[n:] = True
    src = np.flatnonzero(deg[:n] > 0)
    anc = n + np.flatnonzero(deg[n:] > 0)
    total = float(walks * hops)
    existing = (E > 0).astype(np.float32)
    # node -> anchor visits
    V = random_walk_with_restart(adj, src, walks, hops, restart, seed, count_mask=is_anchor, progress=progress)
    V = V[:, n:]
    rows_full = sp.csr_matrix((np.ones(len(src), np.float32), (src, np.arange(len(src)))), shape=(n, len(src)))
    Vq = (rows_full @ V).tocsr()  # n x m, zero rows for nodes without edges
    Vq = Vq - Vq.multiply(existing)
    new_q = top_k_per_row(Vq, top_k, min_visits)
    # anchor -> node visits
    Va = random_walk_with_restart(adj, anc, walks, hops, restart, seed + 1, count_mask=~is_anchor, progress=progress)
    Va = Va[:, :n]
    rows_a = sp.csr_matrix((np.ones(len(anc), np.float32), (anc - n, np.arange(len(anc)))), shape=(m, len(anc)))
    Vat = (rows_a @ Va).tocsr().T.tocsr()  # n x m
    Vat = Vat - Vat.multiply(existing)
    new_a = top_k_per_row(Vat.T.tocsr(), top_k, min_visits).T.tocsr()
    new = new_q.maximum(new_a) / total
    new = new - new.multiply(existing)
    new.eliminate_zeros()
    aug = (E + new).tocsr()
    aug.sum_duplicates()
    info = {"edges_before": int(E.nnz), "edges_added": int(new.nnz), "edges_after": int(aug.nnz),
            "added_from_nodes": int(new_q.nnz), "added_from_anchors": int(new_a.nnz)}
    return aug, info


def prune_edges(E: sp.csr_matrix, node_vecs: np.ndarray, anchor_vecs: np.ndarray,
                threshold: float = 0.0) -> sp.csr_matrix:
    """Keep exactly the edges whose cosine(node, anchor) is strictly above ``threshold`` (RAMEN: > 0).

    Vectors need not be normalised (cosines are computed); only the edges' rows are touched, so the
    cost is O(nnz * d), not O(n * m * d).
    """
    E = E.tocoo()
    if E.nnz == 0:
        return E.tocsr()
    qn = node_vecs / np.maximum(np.linalg.norm(node_vecs, axis=1, keepdims=True), 1e-12)
    an = anchor_vecs / np.maximum(np.linalg.norm(anchor_vecs, axis=1, keepdims=True), 1e-12)
    cos = np.empty(E.nnz, np.float32)
    step = 1 << 16  # bounded memory: nnz x d gathered in blocks
    for s in range(0, E.nnz, step):
        cos[s : s + step] = np.einsum("ij,ij->i", qn[E.row[s : s + step]], an[E.col[s : s + step]])
    keep = cos > threshold
    return sp.csr_matrix((E.data[keep], (E.row[keep], E.col[keep])), shape=E.shape)
