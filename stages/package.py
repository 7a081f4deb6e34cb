"""Build the model package of one run -> packages/<name>/ (see xmc.package).

Usage: ``python -m stages.package <name>``; settings = params ``packages.<name>`` (``source``: the trained
model folder or the baseline's features; ``space``: UniDEC's retrieval space), ``index``, ``tfidf_knn``.
The manifest carries the run's params, the hashes of the data it was trained and validated on, the code
version, and its validation and test metrics (``metrics_val/<name>.json``, ``metrics/<name>.json``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.config.schema import deep_merge
from xmc.errors import ConfigError
from xmc.io import read_json_file, sha256_files

log = logging.getLogger("stages.package")

DATA_FILES = ("trn.jsonl", "trn_Y.npz", "val.jsonl", "val_Y.npz", "lbl.jsonl")
METRIC_KEYS_DROPPED = ("ci95",)


def run_params(params: dict[str, Any], run: str, name: str) -> dict[str, Any]:
    """The settings that made ``run``: its method's defaults merged with the run's own."""
    if run in params.get("runs", {}):
        from xmc.methods import run_config

        return {"method": "dual_encoder", **run_config(params, run)}
    for method in ("ramen", "unidec", "astra"):
        sec = params.get(method, {})
        if run in (sec.get("runs") or {}):
            return {"method": method, **deep_merge(sec.get("defaults") or {}, sec["runs"][run] or {})}
    maclr = params.get("maclr", {})
    if run in (maclr.get("runs") or {}):
        return {"method": "maclr", **deep_merge(maclr.get("defaults") or {}, maclr["runs"][run] or {})}
    if run in (params.get("pretrained") or {}):
        return {"method": "pretrained", **params["pretrained"][run]}
    if run == "st_mnrl":
        return {"method": "st_mnrl", **params.get("st_mnrl", {})}
    if name in ("tfidf_zeroshot", "tfidf_knn", "label_prior"):
        return {"method": name, "tfidf": params.get("tfidf", {}),
                **({"tfidf_knn": params.get("tfidf_knn", {})} if name == "tfidf_knn" else {})}
    return {"method": "unknown"}


def _metrics(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: missing (a packaged run must be evaluated on both splits: params reported and validated)")
    m = read_json_file(path, "a metrics file")
    return {k: v for k, v in m.items() if k not in METRIC_KEYS_DROPPED}


def main() -> None:
    import scipy.sparse as sp

    from xmc.data import load_processed
    from xmc.methods.dual_encoder import set_threads
    from xmc.package import build_package

    if len(sys.argv) < 2:
        raise ConfigError("usage: python -m stages.package <name>")
    name = sys.argv[1]
    params = load_params()
    specs = params.get("packages") or {}
    if name not in specs:
        raise ConfigError(f"params.yaml: no package {name!r} under 'packages' (have: {sorted(specs)})")
    spec = specs[name]
    set_threads()
    processed = Path(params["data"].get("processed_dir", "data/processed"))
    ds = load_processed(processed, splits=("trn",))
    source = Path(spec["source"])
    run = source.name if source.parent.name == "models" else name
    options: dict[str, Any] = {"encode_batch_size": int(params["index"]["encode_batch_size"]), "index": params["index"],
                               "space": spec.get("space"), "tfidf_knn": params.get("tfidf_knn", {}),
                               "train_labels": sp.csr_matrix(ds.trn.Y)}
    summary_path = source / "train_summary.json"
    training = read_json_file(summary_path, "a training summary") if summary_path.is_file() else {}
    manifest = build_package(
        Path("packages") / name, name=name, method=name if name in ("label_prior", "tfidf_zeroshot", "tfidf_knn")
        else run_params(params, run, name)["method"], source=source,
        label_uids=ds.label_uids, label_texts=ds.label_texts, options=options,
        params={"run": run, **run_params(params, run, name), "space": spec.get("space"), "index": params["index"]},
        dataset={"sha256": sha256_files([processed / f for f in DATA_FILES]), "files": list(DATA_FILES),
                 "source": read_json_file(processed / "source.json", "the dataset source").get("source")
                 if (processed / "source.json").exists() else None,
                 "train_instances": int(ds.trn.Y.shape[0])},
        metrics={"val": _metrics(Path("metrics_val") / f"{name}.json"), "tst": _metrics(Path("metrics") / f"{name}.json")},
        training={k: training[k] for k in ("train_seconds", "epochs", "steps", "device") if k in training})
    log.info("packaged %s (%s, %d labels) -> packages/%s", name, manifest["predictor"]["kind"],
             manifest["labels"]["count"], name)


if __name__ == "__main__":
    run_entry_point(main)
