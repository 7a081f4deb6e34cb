"""Ingest: any supported dataset folder -> ``data/processed``, with its validation split (the dataset's own, or
carved out of training by document) and the label-side files a label graph needs."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from xmc.data import load_dataset_dir, save_processed, split_validation, subsample, subsample_validation
from xmc.data.dataset import XMCDataset, label_side_files
from xmc.data.open_labels import open_label_space
from xmc.errors import ConfigError
from xmc.io import atomic_file
from xmc.logs import kv
from xmc.workspace import Workspace

log = logging.getLogger(__name__)


def read_dataset(data: dict[str, Any]) -> tuple[XMCDataset, dict[str, Path]]:
    """The dataset folder of params ``data`` read, subsampled and with its validation split, as ingest keeps it:
    (dataset, the label-side files to keep beside it)."""
    ds = load_dataset_dir(data["dataset_dir"], layout=data["layout"], uid_separator=data["uid_separator"],
                          text_fields=data["text_fields"])
    sub = data["subsample"]
    if sub["trn"] or sub["tst"] or sub["labels"] != "all":
        ds = subsample(ds, sub["trn"], sub["tst"], sub["unit"], sub["labels"])
    if data["open_labels"]:
        ds = open_label_space(ds, data["dataset_dir"], data["open_labels"])
    vcfg = data["validation"]
    if ds.val is not None and vcfg["use_shipped"]:
        ds.meta["validation"] = {"source": "shipped with the dataset", "instances": len(ds.val)}
    else:
        if ds.val is None:
            log.warning("%s ships no validation split: %g of the training %s move to validation "
                        "(data.validation.fraction)", data["dataset_dir"], vcfg["fraction"],
                        "documents" if ds.trn is not None and ds.trn.groups is not None else "instances")
        ds.val = None
        ds = split_validation(ds, vcfg["fraction"], vcfg["seed"])
    ds = subsample_validation(ds, sub["val"], sub["unit"])
    if ds.trn is None or len(ds.trn) == 0 or ds.trn.Y.nnz == 0:
        raise ConfigError(f"{data['dataset_dir']}: no labelled training instances (a dataset needs training labels)")
    if ds.trn.groups is None:
        log.warning("%s has no document ids: validation is split by instance, intervals resample instances and "
                    "RAMEN's document set is skipped", data["dataset_dir"])
    return ds, label_side_files(data["dataset_dir"])


IDENTITY = ("dataset_dir", "open_labels")   # what makes the data another dataset (not a subsample or a re-split)


def claim_results(data: dict[str, Any], ws: Workspace) -> None:
    """Check that ``ws`` (results/<data.name>/) holds outputs of this dataset or none, and record it there
    (``dataset.json``): a run on another dataset under the same name would overwrite them, so it is refused (the
    pipeline's first stage: DVC has removed none of the folder's outputs yet)."""
    def norm(v: Any) -> Any:
        return os.path.normpath(v) if isinstance(v, str) else v

    record, mine = ws.dataset_record, {k: norm(data.get(k)) for k in IDENTITY}
    if record.is_file():
        try:
            theirs = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{record}: unreadable ({e}); delete it if {ws.root} is yours to overwrite") from None
        other = {k: norm(theirs.get(k)) for k in IDENTITY}
        if other != mine:
            raise ConfigError(
                f"{record}: {ws.root}/ holds the outputs of {kv(other)}, not of {kv(mine)}: give this dataset a "
                f"name of its own (data.name in params.yaml, or `python -m xmc.config.use_dataset "
                f"{data['dataset_dir']}`, which sets it)")
    ws.root.mkdir(parents=True, exist_ok=True)
    with atomic_file(record) as fh:
        fh.write(json.dumps({"name": ws.root.name, **mine}, indent=2) + "\n")


def ingest(data: dict[str, Any], ws: Workspace) -> dict[str, Any]:
    """Dataset folder -> ``data/processed``; returns the metadata written."""
    ds, side = read_dataset(data)
    meta = save_processed(ds, ws.processed, side)
    if side:
        log.info("label-side files kept for the label graph: %s", ", ".join(sorted(side)))
    log.info("validation split: %s", kv(meta["validation"]))
    log.info("ingested %s: %s", data["dataset_dir"], kv(meta["counts"]))
    return meta


__all__ = ["claim_results", "ingest", "read_dataset"]
