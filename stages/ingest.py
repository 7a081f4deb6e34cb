"""Ingest: the dataset folder of params ``data`` (XC raw or JSON lines) -> data/processed (xmc.features.ingest)."""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.ingest import ingest
from xmc.workspace import product_workspace


def main() -> None:
    params = load_params()
    ingest(params["data"], product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
