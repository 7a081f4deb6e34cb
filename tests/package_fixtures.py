"""Small real model packages for the package, CLI and service tests: a real slice of semcor-wn30's labels,
real (small) encoders and heads, the real TF-IDF features and faiss index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from tests.pipeline_repo import SEMCOR

N_LABELS = 300


def trained_bow(texts, dim: int = 32, n_buckets: int = 4096, seed: int = 0, **kwargs):
    """A bag-of-words encoder whose rows of every n-gram of ``texts`` moved off their initial values, as training
    moves the rows its texts hash to. A saved encoder keeps only the rows training moved and a loaded one maps an
    untouched bucket to zero (xmc.encoders.bow): an encoder saved untrained would encode every text as zero."""
    import torch

    from xmc.encoders.bow import HashedBagOfWordsEncoder
    from xmc.encoders.bow import hashed_ngrams_many

    enc = HashedBagOfWordsEncoder(dim=dim, n_buckets=n_buckets, seed=seed, **kwargs)
    flat, _ = hashed_ngrams_many(list(texts), n_buckets, enc.ngram_max)
    ids = torch.from_numpy(np.unique(flat))
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for bag in {id(b): b for b in (enc.query_bag, enc.label_bag)}.values():
            bag.weight[ids] += 0.1 * torch.randn(len(ids), dim, generator=g) / dim**0.5
    return enc


def semcor_labels(n: int = N_LABELS) -> tuple[list[str], list[str]]:
    uids, texts = [], []
    # the label texts as ingest writes them from the XC raw layout: "lemmas (pos): gloss"
    with open(SEMCOR / "lbl.raw.txt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            uids.append(str(i))
            texts.append(line.rstrip("\n"))
            if len(uids) >= n:
                break
    return uids, texts


def _baseline_model(method: str, model_dir: Path, ws, Y: sp.csr_matrix) -> Path:
    """A baseline's model folder as its method's training writes it (xmc.methods.baselines): the TF-IDF files it
    predicts with, the training labels or their frequencies."""
    from types import SimpleNamespace

    from xmc.config.runs import RunSpec
    from xmc.methods import get_method
    from xmc.methods.base import RunContext

    ctx = RunContext({}, RunSpec(method, method, {}), model_dir, model_dir.parent / "work", model_dir.parent / "plots",
                     ws=ws)
    model_dir.mkdir(parents=True, exist_ok=True)
    get_method(method).train(ctx, SimpleNamespace(trn=SimpleNamespace(Y=Y)))
    return model_dir


def build_all(root: Path) -> dict[str, Path]:
    """Packages of every predictor kind in ``root``: dense (BoW dual encoder), astra, unidec (3 spaces),
    tfidf_zeroshot, tfidf_knn, label_prior. The encoders' rows of the label and training texts moved (as training
    moves them); the baselines' model folders are what their methods write."""
    from xmc.baselines.tfidf import fit_tfidf
    from xmc.methods.astra import ASTRAModel
    from xmc.methods.unidec import UniDECModel
    from xmc.package import build_package
    from xmc.workspace import Workspace

    uids, texts = semcor_labels()
    rng = np.random.default_rng(0)
    # training "instances": each label text with a word dropped, labelled with that label (and a random other)
    trn = [" ".join(t.split()[1:]) or t for t in texts]
    rows = np.repeat(np.arange(len(trn)), 2)
    cols = np.stack([np.arange(len(trn)), rng.integers(0, len(trn), len(trn))], 1).ravel()
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(trn), len(texts)))
    Y.data[:] = 1.0
    opts = {"encode_batch_size": 64, "index": {"kind": "exact"}}
    out: dict[str, Path] = {}
    src = root / "src"
    seen = texts + trn
    trained_bow(seen, dim=32, n_buckets=4096, seed=0).save(src / "dense")
    astra = ASTRAModel(trained_bow(seen, dim=16, n_buckets=4096, seed=1), texts, bias_init=-1.0)
    astra.init_classifiers("label_text")
    astra.save(src / "astra")
    UniDECModel(trained_bow(seen, dim=32, n_buckets=4096, seed=2), texts, dim=16).save(src / "unidec")
    ws = Workspace(src)
    fit_tfidf(trn, None, texts, {"ngram_max": 2}).save(ws.tfidf)
    specs = {"dense": ("dexml_bow", src / "dense", {}), "astra": ("astra", src / "astra", {}),
             "unidec": ("unidec", src / "unidec", {"space": "concat"}),
             "unidec_de_only": ("unidec", src / "unidec", {"space": "de"}),
             "unidec_clf_only": ("unidec", src / "unidec", {"space": "clf"}),
             "tfidf_zeroshot": ("tfidf_zeroshot", _baseline_model("tfidf_zeroshot", src / "tfidf_zeroshot", ws, Y), {}),
             "tfidf_knn": ("tfidf_knn", _baseline_model("tfidf_knn", src / "tfidf_knn", ws, Y),
                           {"config": {"n_neighbors": 5, "power": 1.0}}),
             "label_prior": ("label_prior", _baseline_model("label_prior", src / "label_prior", ws, Y), {})}
    for name, (method, source, extra) in specs.items():
        build_package(root / name, name=name, method=method, source=source, label_uids=uids, label_texts=texts,
                      options={**opts, **extra}, params={"method": method},
                      dataset={"sha256": "d" * 64, "source": "test"},
                      metrics={"val": {"P@1": 50.0, "P@5": 30.0, "PSP@5": 20.0}, "tst": {"P@1": 49.0}})
        out[name] = root / name
    return out
