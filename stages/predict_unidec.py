"""Predict with one trained UniDEC run in its three retrieval spaces.

Usage: ``python -m stages.predict_unidec <run> [val] [tst]`` -> predictions/<run>/ (one index over
[DE ⊕ N(Ψ)]), predictions/<run>_de_only/ and predictions/<run>_clf_only/ (each head alone: the paper's
UniDEC-de / UniDEC-clf), each with ``<split>_topk.npz`` for the splits named (default val and tst).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.io import write_json
from xmc.methods.dual_encoder import set_threads
from xmc.methods.unidec import UniDECModel, predict_spaces
from xmc.predict import run_and_splits
from xmc.predictions import TopK

SUFFIX = {"concat": "", "de": "_de_only", "clf": "_clf_only"}


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m stages.predict_unidec <run> [val] [tst]")
    params = load_params()
    set_threads()
    model_dir = Path("models") / name
    if not (model_dir / "unidec.json").exists():
        raise ConfigError(f"{model_dir / 'unidec.json'}: not a trained UniDEC run (train it first)")
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", *splits))
    model = UniDECModel.load(model_dir, ds.label_texts)
    icfg = params.get("index", {})
    kw = {"hnsw_m": int(icfg.get("hnsw_m", 32)), "ef_search": int(icfg.get("ef_search", 128)),
          "nprobe": int(icfg.get("nprobe", 16))}
    train_seconds = json.loads((model_dir / "train_summary.json").read_text())["train_seconds"]
    timing: dict[str, dict] = {}
    for split in splits:
        preds = predict_spaces(model, ds.split(split).texts, int(params["evaluate"]["top_k"]),
                               index_kind=icfg.get("kind", "exact"), batch_size=int(icfg.get("encode_batch_size", 256)), **kw)
        for space, p in preds.items():
            out = Path("predictions") / f"{name}{SUFFIX[space]}"
            TopK(p["ids"].astype(np.int32), p["scores"]).save(out / f"{split}_topk.npz")
            t = timing.setdefault(space, {"train_seconds": train_seconds, "index_kind": p["index"].kind,
                                          "on_gpu": p["index"].on_gpu, "space": space, "dim": int(p["index"].index.d),
                                          "predict_seconds_by_split": {}})
            t["index_seconds"] = round(p["index_seconds"], 2)
            t["predict_seconds_by_split"][split] = round(p["predict_seconds"], 2)
            t["predict_seconds"] = t["predict_seconds_by_split"].get("tst", t["predict_seconds_by_split"].get("val"))
    for space, t in timing.items():
        write_json(Path("predictions") / f"{name}{SUFFIX[space]}" / "timing.json", t)


if __name__ == "__main__":
    run_entry_point(main)
