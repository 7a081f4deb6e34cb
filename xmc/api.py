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

from xmc.config import read_params_file
from xmc.config.params import validate_params
from xmc.config.runs import single_run
from xmc.config.schema import ParamsError, deep_merge
from xmc.data import save_processed
from xmc.encoders.cache import configure_from_params
from xmc.errors import ConfigError
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

# keys of an override file or ``**overrides`` that set product sections rather than the method's own knobs
PRODUCT_SECTIONS = ("data", "validate", "tfidf", "label_names", "maclr_pairs", "graph", "evaluate", "index", "hybrid",
                    "encode_cache")


def read_config(path: str | Path) -> dict[str, Any]:
    """A small YAML file of overrides (``--config``): the method's knobs at the top, product sections by name."""
    raw, lines = read_params_file(path)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of overrides (e.g. train: {{epochs: 8}})")
    return raw


def settings_for(data_dir: str | Path, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the product settings with ``data.dataset_dir`` set and the product sections of ``overrides`` applied, the
    method's own overrides). Problems are one ConfigError line each."""
    product = {k: v for k, v in overrides.items() if k in PRODUCT_SECTIONS}
    method = {k: v for k, v in overrides.items() if k not in PRODUCT_SECTIONS}
    raw = deep_merge({"data": {"dataset_dir": str(data_dir)}}, product)
    raw["data"]["dataset_dir"] = str(data_dir)
    # no WordNet folder unless one is given: the wordnet anchor set needs it (a dataset with label_graph.tsv)
    raw.setdefault("graph", {}).setdefault("wordnet_dir", None)
    raw["graph"].setdefault("wordnet", {}).setdefault("enabled", bool(raw["graph"]["wordnet_dir"]))
    try:
        params = validate_params(raw)
    except ParamsError as e:
        raise ConfigError("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in e.problems)) from None
    return params, method


def train(data_dir: str | Path, method: str = "astra", out: str | Path | None = None,
          config: str | Path | None = None, work_dir: str | Path | None = None, keep_work: bool = False,
          run_validation: bool = True, **overrides: Any) -> ModelPackage:
    """Train ``method`` on the dataset folder ``data_dir`` and write its model package to ``out`` (default
    ``models/<method>``); returns the loaded :class:`~xmc.package.ModelPackage`.

    ``config``: a YAML file of overrides; ``overrides``: more of them as keyword arguments (``train={"epochs": 8}``,
    or a product section such as ``evaluate={...}``), applied after the file. ``work_dir``: where the processed
    data, features and checkpoints go (default: a scratch folder beside ``out``, removed at the end unless
    ``keep_work``; an interrupted run resumes from its checkpoints when given the same ``work_dir``)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"{data_dir}: dataset folder not found")
    merged = deep_merge(read_config(config) if config else {}, overrides)
    params, method_overrides = settings_for(data_dir, merged)
    run = single_run(method, method_overrides, params, name=method,
                     where=str(config) if config else "overrides")
    out = Path(out) if out is not None else Path("models") / method
    if out.exists() and not (out / "manifest.json").is_file():
        raise ConfigError(f"{out}: exists and is not a model package (choose another --out)")
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
        package_run(params, method, ws, splits=splits, run_params=run.config)
        _put_in_place(ws.package(method), out)
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


__all__ = ["read_config", "settings_for", "train"]
