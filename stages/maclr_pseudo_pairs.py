"""MACLR's pseudo pairs from raw text -> data/maclr_pairs (xmc.features.build_maclr_pairs).

Reads instance and label *texts* only (never a label matrix): the texts, the ICT pairs, the TF-IDF top-k and the
label-name view are all the zero-shot training stage reads.
"""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.maclr_pairs import build_maclr_pairs
from xmc.workspace import product_workspace


def main() -> None:
    params = load_params()
    build_maclr_pairs(params, product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
