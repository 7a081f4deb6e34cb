"""Build the model package of one prediction -> packages/<name>/ (see xmc.package).

Usage: ``python -m stages.package <name>`` for each name in params ``packages`` (a run, or a variant such as
``unidec_de_only``). The predictor is the one ``stages.predict`` built and evaluated (``indexes/<name>/``);
this stage adds the labels and the manifest: the run's method and settings, the hashes of the data it was
trained and validated on, the code version, and its validation and test metrics (``metrics_val/<name>.json``,
``metrics/<name>.json``). A reporting stage: it reads test metrics, never test data.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError
from xmc.io import read_json_file, sha256_files

log = logging.getLogger("stages.package")

DATA_FILES = ("trn.jsonl", "trn_Y.npz", "val.jsonl", "val_Y.npz", "lbl.jsonl")
METRIC_KEYS_DROPPED = ("ci95",)


def _metrics(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: missing (a packaged run must be evaluated on both splits: params reported and validated)")
    m = read_json_file(path, "a metrics file")
    return {k: v for k, v in m.items() if k not in METRIC_KEYS_DROPPED}


def main() -> None:
    from xmc.data import load_processed
    from xmc.methods.base import SUMMARY, find_prediction
    from xmc.package import package_from_predictor
    from xmc.package.card import training_record

    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.package <name>")
    name = sys.argv[1]
    params = load_params()
    if name not in params["packages"]:
        raise ConfigError(f"params.yaml: no package {name!r} under 'packages' (have: {sorted(params['packages'])})")
    ens = params["hybrid"]["ensemble"]
    if ens["members"] and name == ens["name"]:   # the ensemble hybrid: every member's run and training
        method_name = "ensemble"
        run_params: dict[str, Any] = {"method": method_name, "members": {}}
        training: dict[str, Any] = {"train_seconds": 0.0}
        for member in ens["members"]:
            run, method, options = find_prediction(params, member)
            run_params["members"][member] = {"run": run.name, "method": run.method, **run.config, **options}
            summary = method.predictor_source(run, params) / SUMMARY
            training["train_seconds"] += float((read_json_file(summary, "a training summary") if summary.is_file()
                                                else {}).get("train_seconds", 0.0))
        run_params["hybrid"] = {**params["hybrid"], "label_names": params["label_names"]}
    else:
        run, method, options = find_prediction(params, name)
        method_name = run.method
        run_params = {"run": run.name, "method": run.method, **run.config, **options}
        summary = method.predictor_source(run, params) / SUMMARY
        training = read_json_file(summary, "a training summary") if summary.is_file() else {}
    processed = Path(params["data"]["processed_dir"])
    ds = load_processed(processed, splits=("trn",))
    source_info = read_json_file(processed / "source.json", "the dataset source") if (processed / "source.json").exists() else {}
    manifest = package_from_predictor(
        Path("packages") / name, Path("indexes") / name, name=name, method=method_name, label_uids=ds.label_uids,
        label_texts=ds.label_texts,
        params={**run_params, "index": params["index"]},
        dataset={"sha256": sha256_files([processed / f for f in DATA_FILES]), "files": list(DATA_FILES),
                 "source": source_info.get("source"),
                 "train_instances": int(ds.trn.Y.shape[0])},
        metrics={"val": _metrics(Path("metrics_val") / f"{name}.json"), "tst": _metrics(Path("metrics") / f"{name}.json")},
        training=training_record(training))
    log.info("packaged %s (%s, %d labels) -> packages/%s", name, manifest["predictor"]["kind"],
             manifest["labels"]["count"], name)


if __name__ == "__main__":
    run_entry_point(main)
