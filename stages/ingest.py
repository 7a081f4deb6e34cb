"""Ingest: dataset directory (XC raw or JSON lines) -> data/processed (canonical form)."""

from __future__ import annotations

import logging

from xmc.config import load_params, run_entry_point
from xmc.data import load_dataset_dir, save_processed, split_validation, subsample, subsample_validation
from xmc.data.dataset import label_side_files
from xmc.logs import kv

log = logging.getLogger("stages.ingest")


def main() -> None:
    p = load_params()["data"]
    ds = load_dataset_dir(p["dataset_dir"], layout=p["layout"], uid_separator=p["uid_separator"],
                          text_fields=p["text_fields"])
    sub = p["subsample"]
    if sub["trn"] or sub["tst"] or sub["labels"] != "all":
        ds = subsample(ds, sub["trn"], sub["tst"], sub["unit"], sub["labels"])
    vcfg = p["validation"]
    if ds.val is not None and vcfg["use_shipped"]:
        ds.meta["validation"] = {"source": "shipped with the dataset", "instances": len(ds.val)}
    else:
        ds.val = None
        ds = split_validation(ds, vcfg["fraction"], vcfg["seed"])
    ds = subsample_validation(ds, sub["val"], sub["unit"])
    side = label_side_files(p["dataset_dir"])
    meta = save_processed(ds, p["processed_dir"], side)
    if side:
        log.info("label-side files kept for the label graph: %s", ", ".join(sorted(side)))
    log.info("validation split: %s", kv(meta["validation"]))
    log.info("ingested %s: %s", p["dataset_dir"], kv(meta["counts"]))


if __name__ == "__main__":
    run_entry_point(main)
