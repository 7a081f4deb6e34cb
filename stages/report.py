"""Report: metrics/*.json of every method in params ``methods`` -> reports/comparison.{md,html,png}."""

from __future__ import annotations

from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.io import atomic_file
from xmc.report import comparison_rows, render_html, render_markdown, render_plots


def main() -> None:
    params = load_params()
    rows = comparison_rows("metrics", params["methods"])
    out = Path("reports")
    title = f"XMC comparison on {Path(params['data']['dataset_dir']).name} (test split)"
    images = render_plots(rows, Path("plots") / "eval", out / "figures")
    with atomic_file(out / "comparison.md") as fh:
        fh.write(render_markdown(rows, title))
    with atomic_file(out / "comparison.html") as fh:
        fh.write(render_html(rows, title, [f"figures/{i}" for i in images]))


if __name__ == "__main__":
    run_entry_point(main)
