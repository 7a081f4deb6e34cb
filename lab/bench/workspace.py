"""A kept workspace's trained dense predictor and its data, for the benches that probe its vectors
(``bench.ivf_partition``, ``bench.shortlist``): the workspace's own code reads its own outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load_dense_run(workspace: str | Path, run: str, threads: int) -> tuple[Path, dict[str, Any], Any, Any]:
    """(workspace path, its params, its trn + val data, the run's dense or UniDEC predictor from
    ``indexes/<run>``, the base predictor where that is a TF-IDF shortlist); faiss and torch on ``threads``."""
    ws = Path(workspace).resolve()
    sys.path.insert(0, str(ws))   # the workspace's code reads its own outputs
    import faiss
    import torch
    import yaml

    from xmc.data import load_processed
    from xmc.package.predictors import DensePredictor, UniDECPredictor

    faiss.omp_set_num_threads(threads)
    torch.set_num_threads(threads)
    params = yaml.safe_load((ws / "params.yaml").read_text())
    ds = load_processed(ws / params["data"]["processed_dir"], splits=("trn", "val"))
    root = ws / "indexes" / run
    section = json.loads((root / "predictor.json").read_text())
    if section["kind"] == "shortlist":
        root, section = root / "base", section["base"]
    cls = {"dense": DensePredictor, "unidec": UniDECPredictor}[section["kind"]]
    return ws, params, ds, cls.load(root, section, ds.label_texts)
