"""Comparison table of every evaluated method (Markdown, HTML, PNG plots)."""

from xmc.report.table import COLUMNS, comparison_rows, render_html, render_markdown, render_plots

__all__ = ["COLUMNS", "comparison_rows", "render_html", "render_markdown", "render_plots"]
