"""Validate: great-expectations checks over data/processed -> reports/validation/ (xmc.features.validate).

A failed critical expectation exits with one line (the report is still written so a person can see which check
failed); warnings do not stop the pipeline. Training waits on ``gate.json``: the training-side checks only.
"""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.validation import validate
from xmc.workspace import product_workspace


def main() -> None:
    params = load_params()
    validate(params, product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
