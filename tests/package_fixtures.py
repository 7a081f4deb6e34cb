"""Small real model packages for the package, CLI and service tests: a real slice of semcor-wn30's labels,
real (small) encoders and heads, the real TF-IDF features and faiss index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from tests.pipeline_repo import SEMCOR

N_LABELS = 300


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


def build_all(root: Path) -> dict[str, Path]:
    """Packages of every predictor kind in ``root``: dense (BoW dual encoder), astra, unidec (3 spaces),
    tfidf_zeroshot, tfidf_knn, label_prior."""
    from xmc.baselines.tfidf import fit_tfidf
    from xmc.encoders import HashedBagOfWordsEncoder
    from xmc.methods.astra import ASTRAModel
    from xmc.methods.unidec import UniDECModel
    from xmc.package import build_package

    uids, texts = semcor_labels()
    rng = np.random.default_rng(0)
    # training "instances": each label text with a word dropped, labelled with that label (and a random other)
    trn = [" ".join(t.split()[1:]) or t for t in texts]
    rows = np.repeat(np.arange(len(trn)), 2)
    cols = np.stack([np.arange(len(trn)), rng.integers(0, len(trn), len(trn))], 1).ravel()
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(trn), len(texts)))
    Y.data[:] = 1.0
    opts = {"encode_batch_size": 64, "index": {"kind": "exact"}, "train_labels": Y,
            "tfidf_knn": {"n_neighbors": 5, "power": 1.0}}
    out: dict[str, Path] = {}
    src = root / "src"
    enc = HashedBagOfWordsEncoder(dim=32, n_buckets=4096, seed=0)
    enc.save(src / "dense")
    astra = ASTRAModel(HashedBagOfWordsEncoder(dim=16, n_buckets=4096, seed=1), texts, bias_init=-1.0)
    astra.init_classifiers("label_text")
    astra.save(src / "astra")
    UniDECModel(HashedBagOfWordsEncoder(dim=32, n_buckets=4096, seed=2), texts, dim=16).save(src / "unidec")
    feats = fit_tfidf(trn, None, texts, {"ngram_max": 2})
    feats.save(src / "tfidf")
    sp.save_npz(src / "trn_Y.npz", Y)
    specs = {"dense": ("dexml_bow", src / "dense", {}), "astra": ("astra", src / "astra", {}),
             "unidec": ("unidec", src / "unidec", {"space": "concat"}),
             "unidec_de_only": ("unidec", src / "unidec", {"space": "de"}),
             "unidec_clf_only": ("unidec", src / "unidec", {"space": "clf"}),
             "tfidf_zeroshot": ("tfidf_zeroshot", src / "tfidf", {}), "tfidf_knn": ("tfidf_knn", src / "tfidf", {}),
             "label_prior": ("label_prior", src / "trn_Y.npz", {})}
    for name, (method, source, extra) in specs.items():
        build_package(root / name, name=name, method=method, source=source, label_uids=uids, label_texts=texts,
                      options={**opts, **extra}, params={"method": method},
                      dataset={"sha256": "d" * 64, "source": "test"},
                      metrics={"val": {"P@1": 50.0, "P@5": 30.0, "PSP@5": 20.0}, "tst": {"P@1": 49.0}})
        out[name] = root / name
    return out
