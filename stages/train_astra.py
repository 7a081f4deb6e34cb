"""Train one ASTRA run -> models/<run>/ (encoder + classifiers); predictions come from stages.index.

Usage: ``python -m stages.train_astra <run>``; settings = params ``astra.defaults`` + ``astra.runs.<run>``.
Writes models/<run>/, checkpoints/<run>/ (resume; the memory-mapped shortlist) and plots/train/<run>/.
Reads the training and validation splits only.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.methods.astra import train_astra
from xmc.methods.dual_encoder import deep_merge

log = logging.getLogger("stages.train_astra")


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.train_astra <run>")
    name = sys.argv[1]
    params = load_params()
    section = params.get("astra") or {}
    runs = section.get("runs") or {}
    if "defaults" not in section or name not in runs:
        raise ConfigError(f"params.yaml: no ASTRA run {name!r} under 'astra.runs' (have: {sorted(runs)})")
    cfg = deep_merge(section["defaults"], runs[name])
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val"))
    _, summary = train_astra(ds, cfg, Path("models") / name, Path("checkpoints") / name,
                             Path("plots") / "train" / name, params.get("evaluate"))
    log.info("trained %s: %s", name, summary)


if __name__ == "__main__":
    run_entry_point(main)
