"""Train one RAMEN run -> models/<run>/ (a plain encoder folder: ``stages.index`` predicts, no graph).

Usage: ``python -m stages.train_ramen <run>``; settings = params ``dual_encoder`` + ``ramen.defaults``
+ ``ramen.runs.<run>``; graphs from ``ramen.defaults.graph_dir`` (the `graph` stage's output).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.graph.format import load_graph_dir
from xmc.methods.dual_encoder import deep_merge
from xmc.methods.ramen import train_ramen

log = logging.getLogger("stages.train_ramen")


def ramen_config(params: dict, name: str) -> dict:
    runs = params["ramen"].get("runs") or {}
    if name not in runs:
        raise ConfigError(f"params.yaml: no run {name!r} under 'ramen.runs' (have: {sorted(runs)})")
    return deep_merge(deep_merge(params["dual_encoder"], params["ramen"]["defaults"]), runs[name])


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.train_ramen <run>")
    name = sys.argv[1]
    params = load_params()
    cfg = ramen_config(params, name)
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val"))
    sets = load_graph_dir(cfg["graph_dir"], len(ds.trn), ds.n_labels) if cfg["regulariser"].get("sets") else {}
    summary = train_ramen(ds, cfg, sets, Path("models") / name, Path("checkpoints") / name,
                          Path("plots") / "train" / name, params.get("evaluate"))
    log.info("trained %s: %s", name, summary)


if __name__ == "__main__":
    run_entry_point(main)
