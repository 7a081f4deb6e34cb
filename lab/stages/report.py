"""The lab's reports on the test split: ``python -m lab.stages.report`` -> lab/results/<data.name>/reports/ablations.{md,html} (the
product's rows, the rows it dropped, and each ablation against its control with paired intervals);
``python -m lab.stages.report --seeds`` -> lab/results/<data.name>/reports/seeds.{md,html} (mean ± sd of each bag-of-words method over
its training seeds). Reads the product's metrics and the lab runs' results (lab/results/<data.name>/runs/<run>/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lab.config import load_lab, prediction_names
from lab.results import lab_root, lab_workspaces, metrics_files
from xmc.config import run_entry_point
from xmc.config.params import product_names
from xmc.io import atomic_file, read_json, write_json
from xmc.metrics.bootstrap import bootstrap_settings
from xmc.report import ablation_deltas, paired_comparisons, render_html, render_markdown, seed_rows
from xmc.workspace import product_workspace


def rows_of(names: list[str]) -> list[dict[str, Any]]:
    """The report rows of ``names`` that have test metrics, in that order."""
    files = metrics_files(names, "tst")
    return [{"method": n, **read_json(files[n])} for n in names if n in files]


def main() -> None:
    cfg = load_lab()
    product, lab = cfg["product"], cfg["lab"]
    rep = lab["report"]
    boot = bootstrap_settings(product)
    alpha = product["report"]["alpha"]
    out = lab_root() / "reports"
    name = Path(product["data"]["dataset_dir"]).name
    product_ws = product_workspace(product)
    dirs = [product_ws.root / "evaluation" / "tst"] + [ws.root / "evaluation" / "tst" for ws in lab_workspaces()]
    if "--seeds" in sys.argv[1:]:
        metric_dirs = [product_ws.root / "metrics"] + [ws.root / "metrics" for ws in lab_workspaces()]
        seeds = seed_rows(metric_dirs, rep["seeds"], contribution_dirs=dirs, bootstrap=boot)
        rows = rows_of([s["base"] for s in seeds])
        title = f"Seed variation on {name} (test split)"
        with atomic_file(out / "seeds.md") as fh:
            fh.write(render_markdown(rows, title, bootstrap=boot, seeds=seeds, alpha=alpha))
        with atomic_file(out / "seeds.html") as fh:
            fh.write(render_html(rows, title, [], bootstrap=boot, seeds=seeds, alpha=alpha))
        return
    ablations = [n for run, e in cfg["entries"].items() if e["splits"] == "val tst" and run not in rep["rows"]
                 for n in prediction_names(run, e) if n in rep["ablation_controls"]]
    names = product_names(product) + list(rep["rows"]) + ablations
    pairs = list(product["report"]["paired"]) + list(rep["paired"])
    paired, skipped = paired_comparisons(pairs, dirs, alpha=alpha, **boot)
    controls = {a: c for a, c in rep["ablation_controls"].items() if a in ablations}
    delta_rows, _ = paired_comparisons([[a, c] for a, c in controls.items()], dirs, alpha=alpha, **boot)
    deltas = ablation_deltas(delta_rows, controls)
    title = f"XMC methods and their ablations on {name} (test split)"
    kw: dict[str, Any] = {"bootstrap": boot, "paired": paired, "alpha": alpha, "skipped": skipped}
    rows = rows_of(names)
    write_json(out / "paired_ablations.json", paired + delta_rows)
    with atomic_file(out / "ablations.md") as fh:
        fh.write(render_markdown(rows, title, ablation_deltas=deltas, **kw))
    with atomic_file(out / "ablations.html") as fh:
        fh.write(render_html(rows, title, [], ablation_deltas=deltas, **kw))


if __name__ == "__main__":
    run_entry_point(main)
