"""Comparison table of every evaluated method (Markdown, HTML), its figures and plots page (PNG, offline)."""

from xmc.report.figures import render_figures, render_plots_page
from xmc.report.table import (
    COLUMNS,
    PAIRED_METRICS,
    SEED_METRICS,
    comparison_rows,
    interval_note,
    paired_comparisons,
    render_html,
    render_markdown,
    ablation_deltas,
    seed_rows,
    supervision,
)

__all__ = ["COLUMNS", "PAIRED_METRICS", "SEED_METRICS", "ablation_deltas", "comparison_rows", "interval_note",
           "paired_comparisons", "render_figures", "render_html", "render_markdown", "render_plots_page", "seed_rows",
           "supervision"]
