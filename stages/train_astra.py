"""Train one ASTRA run and write its test predictions (exact/ANN search over the classifier vectors).

Usage: ``python -m stages.train_astra <run>``; settings = params ``astra.defaults`` + ``astra.runs.<run>``.
Writes models/<run>/ (encoder + classifiers), checkpoints/<run>/ (resume; the memory-mapped
shortlist), plots/train/<run>/ and predictions/<run>/.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import numpy as np

from xmc.ann import ANNIndex
from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.io import write_json
from xmc.methods.astra import train_astra
from xmc.methods.dual_encoder import deep_merge
from xmc.predictions import TopK

log = logging.getLogger("stages.train_astra")


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.train_astra <run>")
    name = sys.argv[1]
    params = load_params()
    section = params.get("astra") or {}
    runs = section.get("runs") or {}
    if "defaults" not in section or name not in runs:
        raise ConfigError(f"params.yaml: no ASTRA run {name!r} under 'astra.runs' (have: {sorted(runs)})")
    cfg = deep_merge(section["defaults"], runs[name])
    ds = load_processed(params["data"].get("processed_dir", "data/processed"))
    model, summary = train_astra(ds, cfg, Path("models") / name, Path("checkpoints") / name,
                                 Path("plots") / "train" / name, params.get("evaluate"))
    log.info("trained %s: %s", name, summary)
    icfg = params.get("index", {})
    bs = int(icfg.get("encode_batch_size", 256))
    t0 = time.perf_counter()
    index = ANNIndex.from_params(icfg).build(model.all_label_vectors())
    index_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    D, I = index.search(model.query_vectors_np(ds.tst.texts, batch_size=bs), int(params["evaluate"]["top_k"]))
    predict_seconds = time.perf_counter() - t0
    out = Path("predictions") / name
    TopK(I.astype(np.int32), D).save(out / "tst_topk.npz")
    write_json(out / "timing.json", {"train_seconds": summary["train_seconds"], "index_seconds": round(index_seconds, 2),
                                     "predict_seconds": round(predict_seconds, 2), "index_kind": index.kind,
                                     "on_gpu": index.on_gpu})


if __name__ == "__main__":
    run_entry_point(main)
