"""Selection report: which setting each choice of lab/params.yaml ``selection`` keeps, decided on validation only.

Usage: ``python -m lab.stages.selection``. Reads the candidates' validation metrics and per-instance terms (the
product's metrics_val/ and evaluation/val/, or a lab run's lab/results/<data.name>/runs/<run>/), the seed studies some choices name
(lab/seed_studies/*.json, validation split) and data/processed/val_Y.npz (never a test-split file) and writes
lab/results/<data.name>/reports/selection.{json,md,html}. A candidate not evaluated on validation yet leaves its choice incomplete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import scipy.sparse as sp

from lab.config import load_lab
from lab.results import contribution_files, lab_root, metrics_files
from lab.selection import render_selection_html, render_selection_markdown, select_all
from xmc.config import run_entry_point
from xmc.io import atomic_file, read_json, write_json
from xmc.metrics.bootstrap import InstanceContributions, bootstrap_settings, split_fingerprint
from xmc.workspace import product_workspace


def main() -> None:
    cfg = load_lab()
    selection: dict[str, Any] = cfg["lab"]["selection"]
    boot = bootstrap_settings(cfg["product"])
    runs = sorted({str(r) for c in selection["choices"].values() for r in c["candidates"].values() if r is not None})
    val_metrics = {r: read_json(f) for r, f in metrics_files(runs, "val").items()}
    val_contrib = {r: InstanceContributions.load(f) for r, f in contribution_files(runs, "val").items()}
    # choices decided over training seeds read their study (a lab JSON of the validation split)
    study_files = {str(c["seed_study"]["file"]) for c in selection["choices"].values() if c.get("seed_study")}
    seed_studies = {f: read_json(Path(f)) for f in study_files if Path(f).exists()}
    val_Y = product_workspace(cfg["product"]).processed / "val_Y.npz"
    val_Y_matrix = sp.load_npz(val_Y) if val_Y.exists() else None
    fingerprint = split_fingerprint(val_Y_matrix) if val_Y_matrix is not None and seed_studies else None
    report = select_all(selection, val_metrics, val_contrib, **boot, seed_studies=seed_studies,
                        val_fingerprint=fingerprint)
    # MACLR is zero-shot on training data but its settings are chosen with validation labels: say how many
    n_pairs = int(val_Y_matrix.nnz) if val_Y_matrix is not None else None
    for c in report["choices"]:
        if c.get("method") != "maclr":
            continue
        n_inst = next((val_metrics[r["run"]].get("n_test") for r in c["candidates"] if r["run"] in val_metrics), None)
        if n_inst is not None:
            c["val_labels_used"] = {"instances": int(n_inst), "pairs": n_pairs}
    out = lab_root() / "reports"
    write_json(out / "selection.json", report)
    with atomic_file(out / "selection.md") as fh:
        fh.write(render_selection_markdown(report))
    with atomic_file(out / "selection.html") as fh:
        fh.write(render_selection_html(report))


if __name__ == "__main__":
    run_entry_point(main)
