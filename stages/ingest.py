"""Ingest: dataset directory (XC raw or JSON lines) -> data/processed (canonical form)."""

from __future__ import annotations

import logging

from xmc.config import load_params, run_entry_point
from xmc.data import load_dataset_dir, save_processed, split_validation, subsample

log = logging.getLogger("stages.ingest")


def main() -> None:
    p = load_params()["data"]
    ds = load_dataset_dir(p["dataset_dir"], layout=p.get("layout", "auto"),
                          uid_separator=p.get("uid_separator"), text_fields=p.get("text_fields"))
    sub = p.get("subsample") or {}
    if sub.get("trn") or sub.get("tst") or sub.get("labels", "all") != "all":
        ds = subsample(ds, int(sub.get("trn") or 0), int(sub.get("tst") or 0), sub.get("unit", "documents"),
                       sub.get("labels", "all"))
    vcfg = p.get("validation") or {}
    if ds.val is not None and vcfg.get("use_shipped", True):
        ds.meta["validation"] = {"source": "shipped with the dataset", "instances": len(ds.val)}
    else:
        ds.val = None
        ds = split_validation(ds, float(vcfg.get("fraction", 0.1)), int(vcfg.get("seed", 0)))
    meta = save_processed(ds, p.get("processed_dir", "data/processed"))
    log.info("validation split: %s", meta["validation"])
    log.info("ingested %s: %s", p["dataset_dir"], meta["counts"])


if __name__ == "__main__":
    run_entry_point(main)
