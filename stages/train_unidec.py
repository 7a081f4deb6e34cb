"""Train one UniDEC run and write its test predictions for the three retrieval spaces.

Usage: ``python -m stages.train_unidec <run>``; settings = params ``unidec.defaults`` + ``unidec.runs.<run>``.
Writes models/<run>/ (encoder + heads + Ψ), checkpoints/<run>/ (resume), plots/train/<run>/,
predictions/<run>/ (one index over [DE ⊕ N(Ψ)]), predictions/<run>_de_only/ and
predictions/<run>_clf_only/ (each head alone: the paper's UniDEC-de / UniDEC-clf ablation).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.io import write_json
from xmc.methods.dual_encoder import deep_merge
from xmc.methods.unidec import predict_spaces, train_unidec
from xmc.predictions import TopK

log = logging.getLogger("stages.train_unidec")

SUFFIX = {"concat": "", "de": "_de_only", "clf": "_clf_only"}


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.train_unidec <run>")
    name = sys.argv[1]
    params = load_params()
    section = params.get("unidec") or {}
    runs = section.get("runs") or {}
    if "defaults" not in section or name not in runs:
        raise ConfigError(f"params.yaml: no UniDEC run {name!r} under 'unidec.runs' (have: {sorted(runs)})")
    cfg = deep_merge(section["defaults"], runs[name])
    ds = load_processed(params["data"].get("processed_dir", "data/processed"))
    model, summary = train_unidec(ds, cfg, Path("models") / name, Path("checkpoints") / name,
                                  Path("plots") / "train" / name, params.get("evaluate"))
    log.info("trained %s: %s", name, summary)
    icfg = {**params.get("index", {}), **cfg.get("index", {})}
    kw = {"hnsw_m": int(icfg.get("hnsw_m", 32)), "ef_search": int(icfg.get("ef_search", 128)),
          "nprobe": int(icfg.get("nprobe", 16))}
    preds = predict_spaces(model, ds.tst.texts, int(params["evaluate"]["top_k"]), index_kind=icfg.get("kind", "exact"),
                           batch_size=int(icfg.get("encode_batch_size", 256)), **kw)
    for space, p in preds.items():
        out = Path("predictions") / f"{name}{SUFFIX[space]}"
        TopK(p["ids"].astype(np.int32), p["scores"]).save(out / "tst_topk.npz")
        write_json(out / "timing.json", {"train_seconds": summary["train_seconds"],
                                         "index_seconds": round(p["index_seconds"], 2),
                                         "predict_seconds": round(p["predict_seconds"], 2),
                                         "index_kind": p["index"].kind, "on_gpu": p["index"].on_gpu,
                                         "space": space, "dim": int(p["index"].index.d)})


if __name__ == "__main__":
    run_entry_point(main)
