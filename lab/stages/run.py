"""One lab run: train it on the product's data and features, predict the splits it names, evaluate, and keep only
the results (lab/results/<data.name>/runs/<run>/: predictions, metrics, per-instance terms, curves); the model and its package are
removed (the selection and the reports need their predictions, and a lab of ~70 bag-of-words tables would hold
tens of GB). ``from_model`` runs predict with a product model in other retrieval spaces (no training).

Usage: ``python -m lab.stages.run <run>``.
"""

from __future__ import annotations

import os
import shutil
import sys

from lab.config import load_lab, prediction_names
from lab.results import lab_workspace
from stages.train import relaunch_under_torchrun
from xmc.config import run_entry_point
from xmc.encoders.cache import configure_from_params
from xmc.errors import ConfigError
from xmc.machine import set_threads
from xmc.methods.base import ranks_of
from xmc.methods.harness import train_run
from xmc.package.build import package_run
from xmc.workspace import product_workspace


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m lab.stages.run <run>")
    name = sys.argv[1]
    cfg = load_lab()
    product, entries = cfg["product"], cfg["entries"]
    if name not in entries:
        raise ConfigError(f"lab/params.yaml: no run {name!r} under runs")
    entry = entries[name]
    splits = tuple(entry["splits"].split())
    ws = lab_workspace(name)
    configure_from_params(product)
    ws.checkpoints(name).mkdir(parents=True, exist_ok=True)   # the stage's declared (persisted) checkpoint folder
    if entry["from_model"] is not None:
        model_dir, config = product_workspace(cfg["product"]).model(entry["from_model"]), {}
    else:
        spec = cfg["specs"][name]
        ranks = ranks_of(spec)
        if ranks > 1 and "WORLD_SIZE" not in os.environ:
            relaunch_under_torchrun(ranks, sys.argv[1:], module="lab.stages.run")
        train_run(product, spec, ws)
        model_dir, config = ws.model(name), spec.config
    set_threads()
    names = prediction_names(name, entry)
    spaces = entry["spaces"] or [None]
    for pred, space in zip(names, spaces):
        package_run(product, pred, ws, model_dir=model_dir, splits=splits, run_params=config,
                    options={"space": space} if space else None)
    for scratch in ("packages", "models"):   # the results stay; the package and the model go
        shutil.rmtree(ws.root / scratch, ignore_errors=True)


if __name__ == "__main__":
    run_entry_point(main)
