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


def main() -> None:
    params = load_params()
    out = Path(params["validate"].get("report_dir", "reports/validation"))
    ds = load_processed(params["data"].get("processed_dir", "data/processed"))
    summary = validate_dataset(ds, params["validate"])
    with atomic_file(out / "report.html") as fh:
        fh.write(render_html(summary, f"Data validation: {ds.meta.get('source', '')}"))
    write_json(out / "summary.json", summary.to_json())
    if summary.critical_failures:
        raise ValidationFailed(f"{summary.failure_line()} (report: {out / 'report.html'})")


if __name__ == "__main__":
    run_entry_point(main)
