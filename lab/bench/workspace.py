"""A kept workspace's packaged dense predictor and its data, for the benches that probe its vectors
(``lab.bench.ivf_partition``, ``lab.bench.shortlist``): the workspace's own code reads its own outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load_dense_run(workspace: str | Path, run: str, threads: int) -> tuple[Path, dict[str, Any], Any, Any]:
    """(workspace path, its params, its trn + val data, the run's dense or UniDEC predictor from its package
    ``packages/<run>``, the base predictor where that is a TF-IDF shortlist); faiss and torch on ``threads``."""
    ws = Path(workspace).resolve()
    sys.path.insert(0, str(ws))   # the workspace's code reads its own outputs
    import faiss
    import torch
    import yaml

    from xmc.data import load_processed
    from xmc.package.predictors import DensePredictor, UniDECPredictor
    from xmc.workspace import Workspace

    faiss.omp_set_num_threads(threads)
    torch.set_num_threads(threads)
    params = yaml.safe_load((ws / "params.yaml").read_text())
    layout = Workspace(ws)
    ds = load_processed(layout.processed, splits=("trn", "val"))
    root = layout.package(run)
    if not (root / "manifest.json").is_file():
        raise SystemExit(f"{root}: no model package (dvc repro package@{run} in the workspace)")
    section = json.loads((root / "manifest.json").read_text())["predictor"]
    if section["kind"] == "shortlist":
        root, section = root / "base", section["base"]
    if section["kind"] not in ("dense", "unidec"):
        raise SystemExit(f"{root}: a {section['kind']} predictor, not a dense or UniDEC one")
    cls = {"dense": DensePredictor, "unidec": UniDECPredictor}[section["kind"]]
    return ws, params, ds, cls.load(root, section, ds.label_texts)
