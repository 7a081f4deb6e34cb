"""Where a pipeline's files live: one object instead of path strings spread over the stages.

The product pipeline writes every output of a dataset under ``results/<data.name>/`` (:func:`product_workspace`),
so a run on one dataset never touches another's; ``xmc train`` works in a scratch folder of its own; the lab keeps
its outputs under ``lab/results/<data.name>/`` and reads the product's data and features of the same dataset
(``data_root``). Every stage and library function takes a :class:`Workspace`, so the same code writes each layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from xmc.errors import ConfigError

RESULTS = Path("results")   # the product's outputs: results/<data.name>/
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def dataset_name(data: dict[str, Any]) -> str:
    """The name a report gives the data of params ``data``: the dataset folder's, ``+<catalogue folder>`` with an
    open label space (``semcor-wn30+wordnet30``)."""
    name = Path(data["dataset_dir"]).name
    if data.get("open_labels"):
        cat = Path(data["open_labels"])
        name += f"+{cat.parent.name or cat.stem}"
    return name


def results_name(data: dict[str, Any]) -> str:
    """The name the outputs of params ``data`` are kept under: ``data.name``, else :func:`dataset_name`."""
    return str(data.get("name") or dataset_name(data))


def product_workspace(params: dict[str, Any], repo: str | Path = ".") -> "Workspace":
    """The product pipeline's workspace of the dataset of ``params`` (``params["data"]``): results/<name>/."""
    return Workspace(Path(repo) / RESULTS / results_name(params["data"]))


def results_dir(params_file: str | Path) -> Path:
    """results/<data.name>/ beside ``params_file``, read from the file's ``data`` section as written (no schema, no
    import of the pipeline's code: what a recipe, the registry or a benchmark needs to find the outputs)."""
    path = Path(params_file)
    try:
        data = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("data")
    except (OSError, yaml.YAMLError, AttributeError) as e:
        raise ConfigError(f"{path}: unreadable ({(str(e).splitlines() or [type(e).__name__])[0][:120]})") from None
    if not isinstance(data, dict) or not data.get("dataset_dir"):
        raise ConfigError(f"{path}: no data.dataset_dir, so no dataset whose outputs to look up")
    return path.parent / RESULTS / results_name(data)


@dataclass(frozen=True)
class Workspace:
    """``root``: where models, packages, predictions, metrics and reports go; ``data_root``: where the processed data
    and the features are (default: ``root``); ``checkpoint_root``: where resumable checkpoints go (default:
    ``root``; the lab keeps them outside each run's results)."""

    root: Path = Path(".")
    data_root: Path | None = None
    checkpoint_root: Path | None = None

    def __post_init__(self) -> None:
        for name in ("root", "data_root", "checkpoint_root"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))

    @property
    def dataset_record(self) -> Path:
        """Which dataset these outputs are of (written by the ingest stage, checked before it writes)."""
        return self.root / "dataset.json"

    @property
    def data(self) -> Path:
        return self.data_root if self.data_root is not None else self.root

    # ---- data and features (ingest, tfidf, graph, maclr_pseudo_pairs) ----------------------------
    @property
    def processed(self) -> Path:
        return self.data / "data" / "processed"

    @property
    def tfidf(self) -> Path:
        return self.data / "data" / "tfidf"

    @property
    def graph(self) -> Path:
        return self.data / "data" / "graph"

    @property
    def anchor_sets(self) -> Path:
        """RAMEN's anchor sets after the random walk (what training reads)."""
        return self.graph / "augmented"

    @property
    def maclr_pairs(self) -> Path:
        return self.data / "data" / "maclr_pairs"

    @property
    def validation_reports(self) -> Path:
        return self.data / "reports" / "validation"

    # ---- per run -----------------------------------------------------------------------------------
    def plan(self, run: str) -> Path:
        return self.root / "plans" / f"{run}.json"

    def model(self, run: str) -> Path:
        return self.root / "models" / run

    def checkpoints(self, run: str) -> Path:
        return (self.checkpoint_root or self.root / "checkpoints") / run

    def training_record(self, run: str) -> Path:
        """The live training record (DVCLive) of a run."""
        return self.root / "plots" / "train" / run

    def package(self, name: str) -> Path:
        return self.root / "packages" / name

    def predictions(self, name: str) -> Path:
        return self.root / "predictions" / name

    def metrics(self, name: str, split: str) -> Path:
        """Test metrics in ``metrics/`` (what ``dvc metrics show`` reads), validation ones in ``metrics_val/``."""
        return self.root / ("metrics_val" if split == "val" else "metrics") / f"{name}.json"

    def contributions(self, name: str, split: str) -> Path:
        """Per-instance metric terms (paired tests)."""
        return self.root / "evaluation" / split / f"{name}.npz"

    def curves(self, name: str) -> Path:
        """P@k / R@k curves and recall by label frequency (test split)."""
        return self.root / "plots" / "eval" / name

    @property
    def reports(self) -> Path:
        return self.root / "reports"


__all__ = ["NAME", "RESULTS", "Workspace", "dataset_name", "product_workspace", "results_dir", "results_name"]
