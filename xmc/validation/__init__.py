"""Data validation with great-expectations 1.x, and a standalone HTML report."""

from xmc.validation.checks import CheckResult, ValidationSummary, label_frequency_summary, validate_dataset
from xmc.validation.report import render_html

__all__ = ["CheckResult", "ValidationSummary", "label_frequency_summary", "render_html", "validate_dataset"]
