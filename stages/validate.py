"""Validate: great-expectations checks over data/processed -> HTML report + JSON summary.

A failed critical expectation exits 1 with a one-line message (the report is still
written so a person can see which check failed); warnings do not stop the pipeline.
"""

from __future__ import annotations

from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ValidationFailed
from xmc.io import atomic_file, write_json
from xmc.validation import render_html, validate_dataset


GATE_TABLES = ("trn", "val", "lbl")


def main() -> None:
    params = load_params()
    out = Path(params["validate"]["report_dir"])
    ds = load_processed(params["data"]["processed_dir"])
    summary = validate_dataset(ds, params["validate"])
    summary.extra_sections["Validation split (every choice is made on it; test is only reported)"] = \
        ds.meta.get("validation", {"source": "unknown"})
    with atomic_file(out / "report.html") as fh:
        fh.write(render_html(summary, f"Data validation: {ds.meta.get('source', '')}"))
    write_json(out / "summary.json", summary.to_json())
    # what training waits on: the checks of the training, validation and label tables only (no test split)
    write_json(out / "gate.json", {
        "critical_failures": sum(1 for c in summary.critical_failures if c.table in GATE_TABLES),
        "checks": [{"table": c.table, "check": c.description, "severity": c.severity, "success": c.success}
                   for c in summary.checks if c.table in GATE_TABLES]})
    if summary.critical_failures:
        raise ValidationFailed(f"{summary.failure_line()} (report: {out / 'report.html'})")


if __name__ == "__main__":
    run_entry_point(main)
