"""great-expectations checks of ``data/processed`` -> ``reports/validation/`` and the gate training waits on."""

from __future__ import annotations

from typing import Any

from xmc.data import load_processed
from xmc.errors import ValidationFailed
from xmc.io import atomic_file, write_json
from xmc.validation import render_html, validate_dataset
from xmc.workspace import Workspace

GATE_TABLES = ("trn", "val", "lbl")


def validate(params: dict[str, Any], ws: Workspace) -> Any:
    """great-expectations checks of ``data/processed`` -> ``report.html``, ``summary.json`` and ``gate.json`` (the
    checks of the training, validation and label tables, which training waits on); a critical failure raises
    :class:`~xmc.errors.ValidationFailed` after the report is written."""
    out = ws.validation_reports
    ds = load_processed(ws.processed)
    summary = validate_dataset(ds, params["validate"])
    summary.extra_sections["Validation split (every choice is made on it; test is only reported)"] = \
        ds.meta.get("validation", {"source": "unknown"})
    with atomic_file(out / "report.html") as fh:
        fh.write(render_html(summary, f"Data validation: {ds.meta.get('source', '')}"))
    write_json(out / "summary.json", summary.to_json())
    write_json(out / "gate.json", {
        "critical_failures": sum(1 for c in summary.critical_failures if c.table in GATE_TABLES),
        "checks": [{"table": c.table, "check": c.description, "severity": c.severity, "success": c.success}
                   for c in summary.checks if c.table in GATE_TABLES]})
    if summary.critical_failures:
        raise ValidationFailed(f"{summary.failure_line()} (report: {out / 'report.html'})")
    return summary


__all__ = ["GATE_TABLES", "validate"]
