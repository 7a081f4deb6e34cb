"""MACLR's pseudo pairs from raw text -> data/maclr_pairs (xmc.features.build_maclr_pairs).

Reads instance and label *texts* only (never a label matrix): the texts, the ICT pairs, the TF-IDF top-k and the
label-name view are all the zero-shot training stage reads.
"""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.maclr_pairs import build_maclr_pairs
from xmc.workspace import Workspace


def main() -> None:
    build_maclr_pairs(load_params(), Workspace())


if __name__ == "__main__":
    run_entry_point(main)
