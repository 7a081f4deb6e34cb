"""The training plans: plans/<run>.json for every run of params ``runs`` (xmc.methods.plan).

Each ``train@<run>`` stage depends on its plan only: the run's settings, the hashes of the data and features its
method reads and of the library code its training imports. Editing prediction code or another run's settings leaves
a plan byte for byte as it was, so DVC does not retrain that run.
"""

from __future__ import annotations

import json
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.config.runs import resolve_runs
from xmc.io import atomic_dir
from xmc.methods.plan import run_plan
from xmc.workspace import Workspace, product_workspace


def write_plans(params: dict, entries: dict, ws: Workspace, out: Path, known: dict | None = None) -> None:
    """The plan of every run in ``entries`` into the folder ``out`` (replaced atomically)."""
    specs, _ = resolve_runs(entries, params, known=known)
    with atomic_dir(out) as tmp:
        for name, spec in specs.items():
            (tmp / f"{name}.json").write_text(json.dumps(run_plan(params, spec, ws), indent=1, sort_keys=True) + "\n")


def main() -> None:
    params = load_params()
    ws = product_workspace(params)
    write_plans(params, params["runs"], ws, ws.root / "plans")


if __name__ == "__main__":
    run_entry_point(main)
