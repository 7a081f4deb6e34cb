"""Peer: sentence-transformers' trainer with MultipleNegativesRankingLoss -> models/st_mnrl/.

Encoder, batch size, learning rate, epochs and step cap come from the ``dexml`` run so the
two trainers are compared on the same budget.
"""

from __future__ import annotations

from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.io import atomic_dir
from xmc.methods import run_config
from xmc.methods.dual_encoder import set_threads
from xmc.peers.st_mnrl import train_st_mnrl


def main() -> None:
    params = load_params()
    set_threads()
    cfg = run_config(params, params.get("st_mnrl", {}).get("budget_of", "dexml"))
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val"))
    with atomic_dir(Path("models") / "st_mnrl") as tmp:
        train_st_mnrl(ds.trn.texts, ds.trn.Y, ds.label_texts, cfg, tmp, Path("checkpoints") / "st_mnrl")


if __name__ == "__main__":
    run_entry_point(main)
