"""MACLR zero-shot training (Stage I + Stage II) -> models/<run>/ (an encoder folder for stages.index).

Reads only the pseudo-pairs folder (texts, ICT pairs, TF-IDF top-k): no ground-truth pair can reach
this code path. Settings: params ``maclr.defaults`` + ``maclr.runs.<run>``. Usage:
``python -m stages.maclr <run>``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.encoders import build_encoder
from xmc.errors import ConfigError
from xmc.io import atomic_dir
from xmc.maclr.pseudo import PseudoPairs
from xmc.maclr.train import stage2_pseudo_matrix, train_pairs, train_stage1
from xmc.methods.dual_encoder import deep_merge, set_threads

log = logging.getLogger("stages.maclr")


def run_cfg(params: dict, name: str) -> dict:
    """``maclr.defaults`` + the run's overrides from ``maclr.runs``."""
    m = params["maclr"]
    runs = m.get("runs") or {}
    if name not in runs:
        raise ConfigError(f"params.yaml: no run {name!r} under 'maclr.runs' (have: {sorted(runs)})")
    return deep_merge(m["defaults"], runs[name])


def main() -> None:
    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.maclr <run>")
    name = sys.argv[1]
    params = load_params()
    cfg = run_cfg(params, name)
    set_threads()
    pairs = PseudoPairs.load(params["maclr"]["pairs_dir"])
    encoder = build_encoder(cfg["encoder"])
    bs = int(params.get("index", {}).get("encode_batch_size", 256))
    work, plots = Path("checkpoints") / name, Path("plots") / "train" / name
    summary: dict = {"run": name, "pairs": pairs.meta.get("counts")}
    t_all = time.perf_counter()
    s1 = cfg["stage1"]
    if int(s1["train"].get("epochs", 1)) > 0:  # epochs 0 skips a stage (ablations)
        res = train_stage1(encoder, pairs, s1, work / "stage1", encode_batch_size=bs)
        res.pop("trainer").write_curves(plots / "stage1")
        summary["stage1"] = res
    s2 = cfg["stage2"]
    if int(s2["train"].get("epochs", 1)) > 0:
        Y, info = stage2_pseudo_matrix(encoder, pairs, s2, encode_batch_size=bs)
        trainer, secs = train_pairs(encoder, pairs.texts, pairs.label_texts, Y, s2, work / "stage2",
                                    {"maclr_stage2": s2, "stage1": cfg["stage1"], "encoder": cfg["encoder"]})
        trainer.write_curves(plots / "stage2")
        summary["stage2"] = {**info, "seconds": round(secs, 2), "steps": trainer.global_step}
    summary["train_seconds"] = round(time.perf_counter() - t_all, 2)
    with atomic_dir(Path("models") / name) as tmp:
        encoder.save(tmp)
        (tmp / "train_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    log.info("trained %s: %s", name, summary)


if __name__ == "__main__":
    run_entry_point(main)
