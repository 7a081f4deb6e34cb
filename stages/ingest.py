"""Ingest: the dataset folder of params ``data`` (XC raw or JSON lines) -> data/processed (xmc.features.ingest)."""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.ingest import ingest
from xmc.workspace import Workspace


def main() -> None:
    ingest(load_params()["data"], Workspace())


if __name__ == "__main__":
    run_entry_point(main)
