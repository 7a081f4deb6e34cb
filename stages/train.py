"""Train one dual-encoder run -> models/<run>/ (sentence-transformers folder for transformer runs).

Usage: ``python -m stages.train <run>``; settings = params ``dual_encoder`` + ``runs.<run>``.
The checkpoint in checkpoints/<run>/ (a persistent DVC output) lets a killed run resume.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.methods import run_config, train_dual_encoder

log = logging.getLogger("stages.train")


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.train <run>")
    name = sys.argv[1]
    params = load_params()
    cfg = run_config(params, name)
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val"))
    summary = train_dual_encoder(ds, cfg, Path("models") / name, Path("checkpoints") / name,
                                 Path("plots") / "train" / name, params.get("evaluate"))
    log.info("trained %s: %s", name, summary)


if __name__ == "__main__":
    run_entry_point(main)
