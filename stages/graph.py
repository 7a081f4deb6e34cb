"""RAMEN's graph: anchor sets (loaded from params ``graph.source_dir`` or derived from the dataset's label graph and
document groups), augmented by random walk with restart -> data/graph/{raw,augmented}/ and their statistics in
reports/validation/graph.html (xmc.features.build_graph). A set whose inputs the dataset lacks is skipped with one
warning line."""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.graph import build_graph
from xmc.workspace import product_workspace


def main() -> None:
    params = load_params()
    build_graph(params, product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
