"""Index one trained model and predict: embed all labels, build the ANN index, write top-k predictions.

Usage: ``python -m stages.index <model> [val] [tst]`` -> indexes/<model>/ and predictions/<model>/<split>_topk.npz
for each split named (default: val and tst). Dual encoders index their encoded label texts, ASTRA its
classifier vectors. Selection candidates predict ``val`` only: the test split is read by the runs
that are reported, once.
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
from xmc.io import atomic_dir, write_json
from xmc.methods.dual_encoder import set_threads
from xmc.predict import load_retrieval_model, run_and_splits
from xmc.predictions import TopK


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m stages.index <model> [val] [tst]")
    params = load_params()
    set_threads()
    model_dir = Path("models") / name
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", *splits))
    model = load_retrieval_model(model_dir, ds.label_texts)
    icfg = params.get("index", {})
    bs = int(icfg.get("encode_batch_size", 256))
    k = int(params["evaluate"]["top_k"])
    t0 = time.perf_counter()
    label_vecs = np.ascontiguousarray(model.all_label_vectors(batch_size=bs), dtype=np.float32)
    index = ANNIndex.from_params(icfg).build(label_vecs)
    index_seconds = time.perf_counter() - t0
    predict_seconds = {}
    for split in splits:
        t0 = time.perf_counter()
        D, I = index.search(model.query_vectors_np(ds.split(split).texts, batch_size=bs), k)
        TopK(I.astype(np.int32), D).save(Path("predictions") / name / f"{split}_topk.npz")
        predict_seconds[split] = round(time.perf_counter() - t0, 2)
    with atomic_dir(Path("indexes") / name) as tmp:
        index.save(tmp / "ann")
        np.save(tmp / "label_vectors.npy", label_vecs)
    summary_path = model_dir / "train_summary.json"
    train_seconds = json.loads(summary_path.read_text())["train_seconds"] if summary_path.exists() else 0.0
    write_json(Path("predictions") / name / "timing.json", {
        "train_seconds": train_seconds, "index_seconds": round(index_seconds, 2),
        "predict_seconds": predict_seconds.get("tst", predict_seconds.get("val")),
        "predict_seconds_by_split": predict_seconds, "index_kind": index.kind, "on_gpu": index.on_gpu})


if __name__ == "__main__":
    run_entry_point(main)
