"""Where a prediction's results are: the product's (metrics/, metrics_val/, evaluation/ at the repository root) or
a lab run's (lab/runs/<run>/, the same layout). The lab's reports and the selection look every name up here."""

from __future__ import annotations

from pathlib import Path

from lab.config import LAB
from xmc.workspace import Workspace

PRODUCT = Workspace(Path("."))


def lab_workspace(name: str) -> Workspace:
    """Where a lab run's results go (lab/runs/<run>/), reading the product's data (repository root)."""
    return Workspace(LAB / "runs" / name, data_root=Path("."), checkpoint_root=LAB / "checkpoints")


def lab_workspaces() -> list[Workspace]:
    runs = LAB / "runs"
    return [Workspace(d, data_root=Path(".")) for d in sorted(runs.iterdir()) if d.is_dir()] if runs.is_dir() else []


def workspace_of(name: str, split: str = "val") -> Workspace | None:
    """The workspace holding ``name``'s metrics on ``split`` (the product's first), or None."""
    for ws in (PRODUCT, *lab_workspaces()):
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


__all__ = ["PRODUCT", "contribution_files", "lab_workspace", "lab_workspaces", "metrics_files", "workspace_of"]
