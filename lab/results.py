"""Where a prediction's results are, for the product's dataset (params.yaml ``data.name``): the product's
(results/<name>/: metrics/, metrics_val/, evaluation/) or a lab run's (lab/results/<name>/runs/<run>/, the same
layout). The lab's reports and the selection look every name up here."""

from __future__ import annotations

from pathlib import Path

from lab.config import LAB
from xmc.config import load_params
from xmc.workspace import Workspace, product_workspace, results_name


def product() -> Workspace:
    """The product's workspace of the dataset params.yaml names (what the lab reads)."""
    return product_workspace(load_params())


def lab_root() -> Path:
    """The lab's outputs of that dataset: lab/results/<data.name>/ (plans, runs, checkpoints, reports)."""
    return LAB / "results" / results_name(load_params()["data"])


def lab_workspace(name: str) -> Workspace:
    """Where a lab run's results go (lab/results/<data.name>/runs/<run>/), reading the product's data and features
    of the same dataset."""
    root = lab_root()
    return Workspace(root / "runs" / name, data_root=product().root, checkpoint_root=root / "checkpoints")


def lab_workspaces() -> list[Workspace]:
    runs, data = lab_root() / "runs", product().root
    return [Workspace(d, data_root=data) for d in sorted(runs.iterdir()) if d.is_dir()] if runs.is_dir() else []


def workspace_of(name: str, split: str = "val") -> Workspace | None:
    """The workspace holding ``name``'s metrics on ``split`` (the product's first), or None."""
    for ws in (product(), *lab_workspaces()):
        if ws.metrics(name, split).is_file():
            return ws
    return None


def metrics_files(names: list[str], split: str) -> dict[str, Path]:
    out = {}
    for n in names:
        ws = workspace_of(n, split)
        if ws is not None:
            out[n] = ws.metrics(n, split)
    return out


def contribution_files(names: list[str], split: str) -> dict[str, Path]:
    out = {}
    for n in names:
        ws = workspace_of(n, split)
        if ws is not None and ws.contributions(n, split).is_file():
            out[n] = ws.contributions(n, split)
    return out


__all__ = ["contribution_files", "lab_root", "lab_workspace", "lab_workspaces", "metrics_files", "product",
           "workspace_of"]
