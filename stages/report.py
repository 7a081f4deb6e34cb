"""Report: metrics of every method in params ``methods`` -> reports/comparison.{md,html} + figures.

``python -m stages.report --ablations`` writes reports/ablations.{md,html}: the main methods followed by every
run in params ``ablations`` (metrics under ablations/metrics/), the paper ablations and side experiments that
``make run`` leaves out to stay within its time budget.
"""

from __future__ import annotations

import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.io import atomic_file
from xmc.report import comparison_rows, render_html, render_markdown, render_plots


def main() -> None:
    params = load_params()
    out = Path("reports")
    name = Path(params["data"]["dataset_dir"]).name
    if "--ablations" in sys.argv[1:]:
        rows = comparison_rows("metrics", params["methods"]) + comparison_rows(
            Path("ablations") / "metrics", params.get("ablations") or [])
        title = f"XMC methods and their ablations on {name} (test split)"
        with atomic_file(out / "ablations.md") as fh:
            fh.write(render_markdown(rows, title))
        with atomic_file(out / "ablations.html") as fh:
            fh.write(render_html(rows, title, []))
        return
    rows = comparison_rows("metrics", params["methods"])
    title = f"XMC comparison on {name} (test split)"
    images = render_plots(rows, Path("plots") / "eval", out / "figures")
    with atomic_file(out / "comparison.md") as fh:
        fh.write(render_markdown(rows, title))
    with atomic_file(out / "comparison.html") as fh:
        fh.write(render_html(rows, title, [f"figures/{i}" for i in images]))


if __name__ == "__main__":
    run_entry_point(main)
