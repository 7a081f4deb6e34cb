"""Comparison table of every evaluated method (Markdown, HTML, PNG plots) and the validation selection report."""

from xmc.report.selection import render_selection_html, render_selection_markdown, select, select_all
from xmc.report.table import (
    COLUMNS,
    PAIRED_METRICS,
    SEED_METRICS,
    comparison_rows,
    interval_note,
    paired_comparisons,
    render_html,
    render_markdown,
    render_plots,
    seed_rows,
)

__all__ = ["COLUMNS", "PAIRED_METRICS", "SEED_METRICS", "comparison_rows", "interval_note", "paired_comparisons",
           "render_html", "render_markdown", "render_plots", "render_selection_html", "render_selection_markdown",
           "seed_rows", "select", "select_all"]
