"""The C kernels of xmc.native: built on first use, the same rule as their torch paths, a torch fallback."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

import xmc.native as native
from xmc.encoders.bow import HashedBagOfWordsEncoder, NgramIdCache, hashed_ngrams, hashed_ngrams_many
from xmc.trainer.row_adam import RowAdam, sorted_unique_rows

needs_compiler = pytest.mark.skipif(native._compiler() is None, reason="no C compiler on this machine")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """Kernels built into an empty cache, and forgotten afterwards."""
    monkeypatch.setenv("XMC_NATIVE_CACHE", str(tmp_path / "native"))
    monkeypatch.delenv("XMC_NATIVE", raising=False)
    monkeypatch.setattr(native, "_loaded", {})
    return tmp_path / "native"


def _sparse_steps(L: int, d: int, U: int, steps: int, seed: int = 0):
    """Sparse row gradients with increasing distinct rows (as the bag and candidate ops make them), rows >= L - 5
    never touched."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = np.sort(rng.choice(L - 5, U, replace=False))
        vals = rng.standard_normal((U, d)).astype(np.float32)
        yield torch.sparse_coo_tensor(torch.from_numpy(rows)[None], torch.from_numpy(vals), (L, d),
                                      is_coalesced=True, check_invariants=False)


def _run(L, d, U, steps, **kw):
    torch.manual_seed(1)
    p = nn.Parameter(torch.randn(L, d) * 0.1)
    start = p.detach().clone()
    opt = RowAdam([p], lr=0.05, **kw)
    for g in _sparse_steps(L, d, U, steps):
        p.grad = g
        opt.step()
    return opt, p.detach(), start


@needs_compiler
@pytest.mark.parametrize("share", [0.0, 2.0])   # the torch path updating blocks in place, or gathering rows
def test_native_row_adam_equals_the_torch_path(fresh_cache, monkeypatch, share):
    from xmc.trainer import row_adam

    monkeypatch.setattr(row_adam, "_DENSE_BLOCK_SHARE", share)
    monkeypatch.setattr(row_adam, "_BLOCK_ELEMENTS", 37 * 16)
    fast, p_fast, start = _run(300, 37, 120, 12, native=True)   # 37: a row length no vector width divides
    ref, p_ref, _ = _run(300, 37, 120, 12, native=False)
    assert fast.native and not ref.native
    s_fast, s_ref = fast.state[fast.param_groups[0]["params"][0]], ref.state[ref.param_groups[0]["params"][0]]
    # the moments round as torch's kernels do (fused multiply-adds), bit for bit
    assert torch.equal(s_fast["exp_avg"], s_ref["exp_avg"]) and torch.equal(s_fast["exp_avg_sq"], s_ref["exp_avg_sq"])
    # the parameters differ only by torch's vectorised square root being an ulp off now and then
    assert torch.allclose(p_fast, p_ref, rtol=1e-6, atol=1e-7)
    assert not torch.equal(p_fast, start)
    assert torch.equal(p_fast[-5:], start[-5:]) and not s_fast["exp_avg"][-5:].any()   # lazy: untouched rows stay


@needs_compiler
def test_native_row_adam_dense_gradient_and_threads(fresh_cache):
    """A dense gradient updates every row (plain Adam); two threads give the bits one thread gives."""
    torch.manual_seed(0)
    a, b = nn.Linear(64, 48), nn.Linear(64, 48)
    b.load_state_dict(a.state_dict())
    oa, ob = RowAdam(a.parameters(), lr=0.01, native=True), RowAdam(b.parameters(), lr=0.01, native=False)
    x = torch.randn(32, 64)
    for _ in range(5):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert torch.allclose(a.weight, b.weight, rtol=1e-5, atol=1e-7) and torch.allclose(a.bias, b.bias, rtol=1e-5, atol=1e-7)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _, one, _ = _run(4096, 64, 2000, 3)   # 128,000 values per step: above the kernel's threading floor
        torch.set_num_threads(2)
        _, two, _ = _run(4096, 64, 2000, 3)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_compiler
@pytest.mark.parametrize("dense", [False, True])
def test_bf16_moments_native_equals_the_torch_path(fresh_cache, dense):
    """bfloat16 moments: the C kernel and the torch path draw the same rounding bits, so m and v agree bit for bit
    (sparse row gradients, and a dense gradient updated row by row); half the moments' memory."""
    def run(native_: bool):
        torch.manual_seed(1)
        p = nn.Parameter(torch.randn(300, 37) * 0.1)
        opt = RowAdam([p], lr=0.05, native=native_, moments="bf16")
        for g in _sparse_steps(300, 37, 120, 12):
            p.grad = g.to_dense() if dense else g
            opt.step()
        return opt, opt.state[p], p.detach()

    fast, s_fast, p_fast = run(True)
    ref, s_ref, p_ref = run(False)
    assert fast.native and not ref.native
    assert s_fast["exp_avg"].dtype == torch.bfloat16 and s_fast["exp_avg"].element_size() == 2
    assert torch.equal(s_fast["exp_avg"], s_ref["exp_avg"]) and torch.equal(s_fast["exp_avg_sq"], s_ref["exp_avg_sq"])
    assert torch.allclose(p_fast, p_ref, rtol=1e-6, atol=1e-7)
    if not dense:   # lazy: rows never touched keep zero moments
        assert not s_fast["exp_avg"][-5:].float().any()
    with pytest.raises(ValueError, match="moments must be one of"):
        RowAdam([nn.Parameter(torch.zeros(2, 2))], moments="fp16")


@pytest.mark.parametrize("native_", [True, False])
def test_bf16_moments_round_stochastically_so_the_second_moment_keeps_moving(fresh_cache, native_):
    """With b2 = 0.999 the second moment of a steady gradient grows by 0.1 % of the gap per step, less than half a
    bfloat16 ulp once it passes ~0.1: rounded to nearest it would stall there; rounded stochastically its mean over
    the elements follows the float32 moment."""
    if native_ and native._compiler() is None:
        pytest.skip("no C compiler on this machine")
    steps, n = 600, 4096
    p = nn.Parameter(torch.zeros(1, n))
    opt = RowAdam([p], lr=1e-3, native=native_, moments="bf16")
    v_nearest = torch.zeros(n, dtype=torch.bfloat16)
    for _ in range(steps):
        p.grad = torch.ones(1, n)
        opt.step()
        v_nearest = (v_nearest.float() * 0.999 + 0.001).to(torch.bfloat16)   # what round-to-nearest would store
    v32 = 1 - 0.999**steps   # 0.451
    v = opt.state[p]["exp_avg_sq"].float()
    assert abs(v.mean().item() - v32) < 0.002 and v.std().item() < 0.05   # each element: within a few ulps
    assert v32 - v_nearest.float().mean().item() > 0.1   # the test can tell the two roundings apart


def test_bf16_moments_survive_a_checkpoint_round_trip(tmp_path):
    """torch's load_state_dict casts the moments to the parameter's dtype: RowAdam casts them back, so a resumed run
    continues with the same bfloat16 moments and the same steps as one that never stopped."""
    def steps(opt, p, gs):
        for g in gs:
            p.grad = g
            opt.step()

    grads = list(_sparse_steps(300, 37, 120, 6, seed=4))
    torch.manual_seed(1)
    p = nn.Parameter(torch.randn(300, 37) * 0.1)
    q = nn.Parameter(p.detach().clone())
    whole, first = RowAdam([p], lr=0.05, moments="bf16"), RowAdam([q], lr=0.05, moments="bf16")
    steps(whole, p, grads)
    steps(first, q, grads[:3])
    torch.save(first.state_dict(), tmp_path / "opt.pt")
    resumed = RowAdam([q], lr=0.05, moments="bf16")
    resumed.load_state_dict(torch.load(tmp_path / "opt.pt"))
    assert resumed.state[q]["exp_avg"].dtype == torch.bfloat16
    steps(resumed, q, grads[3:])
    assert torch.equal(p, q) and torch.equal(whole.state[p]["exp_avg_sq"], resumed.state[q]["exp_avg_sq"])


@needs_compiler
def test_native_kernel_is_built_once_into_its_cache(fresh_cache):
    assert native.row_adam() is not None
    (lib,) = fresh_cache.glob("row_adam-*.so")
    stamp = lib.stat().st_mtime_ns
    native._loaded.clear()
    assert native.row_adam() is not None
    assert [p.name for p in fresh_cache.iterdir()] == [lib.name] and lib.stat().st_mtime_ns == stamp


def test_without_a_working_compiler_row_adam_takes_the_torch_path(fresh_cache, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")   # a "compiler" that fails every build
    with caplog.at_level(logging.WARNING, logger="xmc.native"):
        assert native.row_adam() is None
    assert "native kernel row_adam unavailable, using the torch path" in caplog.text
    assert not any(fresh_cache.glob("*.so")) and not any(p.suffix == ".so" for p in fresh_cache.glob("*"))
    opt, p, start = _run(50, 8, 10, 2)
    assert not opt.native and not torch.equal(p, start)


def test_xmc_native_0_switches_the_kernels_off(fresh_cache, monkeypatch):
    monkeypatch.setenv("XMC_NATIVE", "0")
    assert native.row_adam() is None
    assert RowAdam([nn.Parameter(torch.zeros(3, 2))]).native is False


def test_tied_bag_encodes_both_sides_in_one_pass_with_the_same_vectors_and_gradient():
    """encode_pair on a tied bag-of-words encoder: the vectors and table gradient of two separate forwards, as one
    sparse gradient whose rows are distinct and increasing (nothing for the optimiser to coalesce)."""
    queries = ["a cat sat on the mat", "dogs bark", "the cat"]
    labels = ["cat feline animal", "dog canine", "mat floor covering", "cat feline animal"]
    grads, vecs = [], []
    for pair in (True, False):
        enc = HashedBagOfWordsEncoder(dim=16, n_buckets=512, seed=3)
        if pair:
            q, z = enc.encode_pair(queries, labels)
        else:
            q, z = enc(queries, "query"), enc(labels, "label")
        (q @ z.T).pow(2).sum().backward()
        vecs.append((q.detach(), z.detach()))
        grads.append(enc.query_bag.weight.grad)
    assert torch.allclose(vecs[0][0], vecs[1][0], atol=1e-6) and torch.allclose(vecs[0][1], vecs[1][1], atol=1e-6)
    assert torch.allclose(grads[0].to_dense(), grads[1].to_dense(), atol=1e-6)
    rows, _ = sorted_unique_rows(grads[0])
    assert rows is not None and rows.numel() == grads[0]._nnz()
    assert sorted_unique_rows(grads[1].coalesce())[0].numel() == rows.numel()   # the same rows touched
    # against torch's own bag op with a dense gradient
    enc = HashedBagOfWordsEncoder(dim=16, n_buckets=512, seed=3)
    table = enc.query_bag.weight.detach().clone().requires_grad_(True)
    ids = [np.asarray(hashed_ngrams(t, 512, 2)) for t in queries + labels]
    lengths = np.array([len(i) for i in ids])
    w = torch.from_numpy(np.repeat(1 / np.sqrt(lengths), lengths).astype(np.float32))
    ref = torch.nn.functional.embedding_bag(torch.from_numpy(np.concatenate(ids)), table,
                                            torch.from_numpy(np.r_[0, np.cumsum(lengths)[:-1]]), mode="sum",
                                            per_sample_weights=w)
    ref = torch.nn.functional.normalize(ref, dim=-1)
    (ref[:3] @ ref[3:].T).pow(2).sum().backward()
    assert torch.allclose(torch.cat(vecs[0]), ref.detach(), atol=1e-6)
    assert torch.allclose(grads[0].to_dense(), table.grad, atol=1e-6)


LABEL = "bank, riverbank (n): sloping land beside a body of water"


def test_tied_pair_reads_the_label_view():
    """The one-pass path of a tied encoder applies the label side's text view (names / description) as the
    two-pass path does."""
    enc = HashedBagOfWordsEncoder(dim=8, n_buckets=256, seed=0, label_text="names")
    label = LABEL
    _, z = enc.encode_pair(["a query"], [label])
    assert torch.allclose(z, enc([label], "label"), atol=1e-6)
    assert not torch.allclose(z, enc([label], "query"), atol=1e-3)


def test_tied_transformer_pair_reads_the_label_view():
    """The tied MiniLM's one forward pass for both sides reads the label side's view, as its label side does."""
    from xmc.encoders.transformer import TransformerEncoder

    enc = TransformerEncoder(max_len_query=16, max_len_label=16, label_text="names").eval()
    with torch.no_grad():
        q, z = enc.encode_pair(["he sat on the river bank"], [LABEL])
        assert torch.allclose(q, enc(["he sat on the river bank"], "query"), atol=1e-5)
        assert torch.allclose(z, enc([LABEL], "label"), atol=1e-5)
        assert not torch.allclose(z, enc([LABEL], "query"), atol=1e-3)


HASH_TEXTS = ["The cat sat on the mat.", "", "   ", "!!!", "one", "Two words", "snake_case and CamelCase 42x",
              "tab\tnew\nline", "naïve café", "İstanbul STRASSE straße", "日本語 の テキスト", "a-b c.d e'f",
              "x" * 3000, "MIXED case Words words WORDS", "12 345 6789"]


@needs_compiler
@pytest.mark.parametrize("ngram_max", [1, 2, 3])
def test_hashing_kernel_gives_the_python_ids(fresh_cache, ngram_max):
    """The C loop over ASCII texts (xmc/native/ngram_hash.c) and the Python function give the same ids in the same
    order, for every text kind (non-ASCII texts stay with Python); so do both with the kernel switched off."""
    rng = np.random.default_rng(ngram_max)
    words = ["alpha", "Beta", "gamma_1", "DELTA", "e", "42", "zeta-eta", "theta.", "ïota", "Kappa's"]
    texts = HASH_TEXTS + [" ".join(rng.choice(words, rng.integers(0, 30))) for _ in range(300)]
    for n_buckets in (7, 1 << 18, (1 << 31) - 1):
        want = [hashed_ngrams(t, n_buckets, ngram_max) for t in texts]
        flat, counts = hashed_ngrams_many(texts, n_buckets, ngram_max)
        assert counts.tolist() == [len(w) for w in want]
        assert flat.tolist() == [i for w in want for i in w]
    assert native.ngram_hash() is not None and any(fresh_cache.glob("ngram_hash-*.so"))


def test_hashing_without_the_kernel_gives_the_same_ids(fresh_cache, monkeypatch):
    monkeypatch.setenv("XMC_NATIVE", "0")
    flat, counts = hashed_ngrams_many(HASH_TEXTS, 1 << 18, 2)
    assert native.ngram_hash() is None
    assert flat.tolist() == [i for t in HASH_TEXTS for i in hashed_ngrams(t, 1 << 18, 2)]


def test_id_cache_gathers_batches_and_starts_over_when_full():
    """NgramIdCache: a batch's ids equal each text's own, with repeats and new texts mixed in, also when a batch
    makes the cache start over, and for a batch larger than the whole cache (hashed, not kept)."""
    rng = np.random.default_rng(0)
    pool = [f"text {i} with words {i % 7} and {i % 13}" for i in range(400)] + HASH_TEXTS
    cache = NgramIdCache(1 << 10, 2, max_ids=2_000)
    for _ in range(60):
        batch = [pool[i] for i in rng.integers(0, len(pool), rng.integers(1, 60))]
        flat, lengths = cache.ids(batch)
        want = [hashed_ngrams(t, 1 << 10, 2) for t in batch]
        assert lengths.tolist() == [len(w) for w in want] and flat.tolist() == [i for w in want for i in w]
        assert int(cache._ptr[len(cache)]) <= 2_000
    big = pool[:300]
    flat, lengths = cache.ids(big)
    assert flat.tolist() == [i for t in big for i in hashed_ngrams(t, 1 << 10, 2)]
    by_count = NgramIdCache(1 << 10, 2, max_texts=25)   # the text bound starts it over too
    for _ in range(30):
        batch = [pool[i] for i in rng.integers(0, len(pool), rng.integers(1, 20))]
        assert by_count.ids(batch)[0].tolist() == [i for t in batch for i in hashed_ngrams(t, 1 << 10, 2)]
        assert len(by_count) <= 25
    assert flat.dtype == np.int64 and cache.ids([])[0].tolist() == []
