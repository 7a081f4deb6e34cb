"""What ``xmc train`` / :func:`xmc.train` will do, settled before any training code is imported: the dataset folder,
the overrides (a ``--config`` file, then keyword arguments) validated by the params schema, the method's run and the
output folder. A mistyped key or method fails here in a second, not after torch, scikit-learn and the encoder
have loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xmc.config import read_params_file
from xmc.config.params import validate_params
from xmc.config.runs import RunSpec, single_run
from xmc.config.schema import ParamsError, deep_merge
from xmc.errors import ConfigError

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


@dataclass(frozen=True)
class TrainingRequest:
    """A training settled: the product settings, the method's run and where its package goes."""
    data_dir: Path
    params: dict[str, Any]
    run: RunSpec
    out: Path


def resolve_training(data_dir: str | Path, method: str, out: str | Path | None = None,
                     config: str | Path | None = None, **overrides: Any) -> TrainingRequest:
    """Check the folder, the overrides, the method and ``out`` (default ``models/<method>``); one ConfigError line
    for the first problem."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"{data_dir}: dataset folder not found")
    merged = deep_merge(read_config(config) if config else {}, overrides)
    params, method_overrides = settings_for(data_dir, merged)
    run = single_run(method, method_overrides, params, name=method, where=str(config) if config else "overrides")
    out = Path(out) if out is not None else Path("models") / method
    if out.exists() and not (out / "manifest.json").is_file():
        raise ConfigError(f"{out}: exists and is not a model package (choose another --out)")
    return TrainingRequest(data_dir, params, run, out)


__all__ = ["PRODUCT_SECTIONS", "TrainingRequest", "read_config", "resolve_training", "settings_for"]
