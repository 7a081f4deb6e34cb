"""Index one trained encoder: embed all labels, build the ANN index, write top-k test predictions.

Usage: ``python -m stages.index <model>`` -> indexes/<model>/ and predictions/<model>/.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from xmc.ann import ANNIndex
from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.encoders import load_encoder
from xmc.errors import ConfigError
from xmc.io import atomic_dir, write_json
from xmc.methods.dual_encoder import set_threads
from xmc.models import DualEncoderModel
from xmc.predictions import TopK


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.index <model>")
    name = sys.argv[1]
    params = load_params()
    set_threads()
    model_dir = Path("models") / name
    encoder = load_encoder(model_dir)
    ds = load_processed(params["data"].get("processed_dir", "data/processed"))
    model = DualEncoderModel(encoder, ds.label_texts)
    icfg = params.get("index", {})
    bs = int(icfg.get("encode_batch_size", 256))
    t0 = time.perf_counter()
    label_vecs = model.all_label_vectors(batch_size=bs)
    index = ANNIndex.from_params(icfg).build(label_vecs)
    index_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    D, I = index.search(model.query_vectors_np(ds.tst.texts, batch_size=bs), int(params["evaluate"]["top_k"]))
    predict_seconds = time.perf_counter() - t0
    with atomic_dir(Path("indexes") / name) as tmp:
        index.save(tmp / "ann")
        np.save(tmp / "label_vectors.npy", label_vecs)
    TopK(I.astype(np.int32), D).save(Path("predictions") / name / "tst_topk.npz")
    summary_path = model_dir / "train_summary.json"
    train_seconds = json.loads(summary_path.read_text())["train_seconds"] if summary_path.exists() else 0.0
    write_json(Path("predictions") / name / "timing.json", {
        "train_seconds": train_seconds, "index_seconds": round(index_seconds, 2),
        "predict_seconds": round(predict_seconds, 2), "index_kind": index.kind, "on_gpu": index.on_gpu})


if __name__ == "__main__":
    run_entry_point(main)
