"""Report: every run, the linear peer and the hybrids of params.yaml -> reports/comparison.{md,html},
reports/paired.json, reports/plots.html and reports/figures/ (xmc.report).

Each metric cell carries its 95 % bootstrap interval (``ci95`` of metrics/<name>.json); params ``report.paired``
([[a, b], ...]) adds paired bootstrap tests on the test contributions (evaluation/tst/<name>.npz).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.config.params import product_names
from xmc.io import atomic_file, write_json
from xmc.metrics.bootstrap import bootstrap_settings
from xmc.report import comparison_rows, paired_comparisons, render_figures, render_html, render_markdown, render_plots_page
from xmc.workspace import Workspace


def main() -> None:
    params = load_params()
    ws = Workspace()
    rep: dict[str, Any] = params["report"]
    boot = bootstrap_settings(params)
    alpha = rep["alpha"]
    out = ws.reports
    name = Path(params["data"]["dataset_dir"]).name
    paired, skipped = paired_comparisons(list(rep["paired"]), [ws.root / "evaluation" / "tst"], alpha=alpha, **boot)
    rows = comparison_rows(ws.root / "metrics", product_names(params))
    title = f"XMC comparison on {name} (test split)"
    # training curves come from the live records of the runs behind the rows (plots/train/<run>/)
    page = render_figures([r["method"] for r in rows], ws.root / "plots" / "eval", ws.root / "plots" / "train",
                          out / "figures", rep["training_families"], {r["method"]: r for r in rows})
    images = [f"figures/{i['file']}" for i in page["curves"]]
    kw: dict[str, Any] = {"bootstrap": boot, "paired": paired, "alpha": alpha, "skipped": skipped}
    write_json(out / "paired.json", paired)
    with atomic_file(out / "comparison.md") as fh:
        fh.write(render_markdown(rows, title, **kw))
    with atomic_file(out / "comparison.html") as fh:
        fh.write(render_html(rows, title, images, plots_page="plots.html", **kw))
    with atomic_file(out / "plots.html") as fh:
        fh.write(render_plots_page(page, f"Figures: {title}"))


if __name__ == "__main__":
    run_entry_point(main)
