"""Training as a function call: a dataset folder and a method in, a model package out (``xmc.train``, ``xmc train``).

    import xmc
    model = xmc.train("path/to/dataset", method="astra", out="models/astra", train={"epochs": 8})
    model.predict(["a text"], k=5)

The same steps as the product pipeline, in one process and a scratch workspace, with no DVC and no git: read the
folder (any supported layout) and split validation as ingest does, validate it, build the features the method reads,
train with the method's defaults and the overrides, evaluate on validation (and on test when the folder has one)
and write the package that ``xmc predict`` / ``xmc serve`` load. The pipeline's stages call the same functions.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from xmc.config.training import TrainingRequest, read_config, resolve_training, settings_for
from xmc.data import save_processed
from xmc.encoders.cache import configure_from_params
from xmc.features import FEATURES_OF
from xmc.features.graph import build_graph
from xmc.features.ingest import read_dataset
from xmc.features.maclr_pairs import build_maclr_pairs
from xmc.features.tfidf import build_tfidf
from xmc.features.validation import validate
from xmc.io import protect_inputs
from xmc.methods import get_method
from xmc.methods.harness import train_run
from xmc.package import ModelPackage, load
from xmc.package.build import package_run
from xmc.workspace import Workspace

log = logging.getLogger(__name__)

BUILDERS = {"tfidf": build_tfidf, "graph": build_graph, "maclr_pairs": build_maclr_pairs}


def train(data_dir: str | Path, method: str = "astra", out: str | Path | None = None,
          config: str | Path | None = None, work_dir: str | Path | None = None, keep_work: bool = False,
          run_validation: bool = True, **overrides: Any) -> ModelPackage:
    """Train ``method`` on the dataset folder ``data_dir`` and write its model package to ``out`` (default
    ``models/<method>``); returns the loaded :class:`~xmc.package.ModelPackage`.

    ``config``: a YAML file of overrides; ``overrides``: more of them as keyword arguments (``train={"epochs": 8}``,
    or a product section such as ``evaluate={...}``), applied after the file. ``work_dir``: where the processed
    data, features and checkpoints go (default: a scratch folder beside ``out``, removed at the end unless
    ``keep_work``; an interrupted run resumes from its checkpoints when given the same ``work_dir``)."""
    return train_resolved(resolve_training(data_dir, method, out, config, **overrides), work_dir=work_dir,
                          keep_work=keep_work, run_validation=run_validation)


def train_resolved(req: TrainingRequest, work_dir: str | Path | None = None, keep_work: bool = False,
                   run_validation: bool = True) -> ModelPackage:
    """:func:`train` of a request :func:`~xmc.config.training.resolve_training` has checked (``xmc train`` checks
    before it imports this module)."""
    data_dir, params, run, out = req.data_dir, req.params, req.run, req.out
    method = run.method
    protect_inputs(str(data_dir), params["graph"]["wordnet_dir"], params["graph"]["source_dir"])
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix=f".xmc-train-{method}-", dir=out.parent))
    ws = Workspace(scratch)
    try:
        configure_from_params(params)
        ds, side = read_dataset(params["data"])
        save_processed(ds, ws.processed, side)
        if run_validation:
            validate(params, ws)
        needed = list(FEATURES_OF.get(method, ()))
        impl = get_method(method)
        if len(ds.label_texts) > params["index"]["auto_exact_max"] \
                and impl.predictor_kind in ("dense", "unidec") and "tfidf" not in needed:
            needed.append("tfidf")   # above auto_exact_max the package may rank a TF-IDF shortlist
        for feature in dict.fromkeys(needed):
            BUILDERS[feature](params, ws)
        train_run(params, run, ws)
        splits = ("val", "tst") if len(ds.tst) else ("val",)   # test metrics when the folder has a test split
        package_run(params, run.name, ws, splits=splits, run_params=run.config)
        _put_in_place(ws.package(run.name), out)
        return load(out)
    finally:
        if not keep_work and work_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _put_in_place(package: Path, out: Path) -> None:
    """Move the finished package to ``out``; a package already there is replaced only once the new one is in place
    (a kill in between leaves one of the two whole, never a mix)."""
    old = out.parent / f".{out.name}.replaced-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    try:
        os.replace(package, out)
    except BaseException:
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["read_config", "settings_for", "train", "train_resolved"]
