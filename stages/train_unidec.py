"""Train one UniDEC run -> models/<run>/ (encoder + heads + Ψ); predictions come from stages.predict_unidec.

Usage: ``python -m stages.train_unidec <run>``; settings = params ``unidec.defaults`` + ``unidec.runs.<run>``.
Writes models/<run>/, checkpoints/<run>/ (resume) and plots/train/<run>/. Reads the training and validation
splits only.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.methods.dual_encoder import deep_merge
from xmc.methods.unidec import train_unidec

log = logging.getLogger("stages.train_unidec")


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.train_unidec <run>")
    name = sys.argv[1]
    params = load_params()
    section = params.get("unidec") or {}
    runs = section.get("runs") or {}
    if "defaults" not in section or name not in runs:
        raise ConfigError(f"params.yaml: no UniDEC run {name!r} under 'unidec.runs' (have: {sorted(runs)})")
    cfg = deep_merge(section["defaults"], runs[name])
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val"))
    _, summary = train_unidec(ds, cfg, Path("models") / name, Path("checkpoints") / name,
                              Path("plots") / "train" / name, params.get("evaluate"))
    log.info("trained %s: %s", name, summary)


if __name__ == "__main__":
    run_entry_point(main)
