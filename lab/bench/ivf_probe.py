"""The IVF probe against the full IVF build it replaces, on the same label vectors and queries, in one process.

Above ``xmc.ann.index.PROBE_MIN_VECTORS`` a prediction index built as IVF with a recall target first adds a sample
of the vectors to a copy of its trained lists and calibrates that (``ANNIndex._probe_ivf``); where the width the
target needs is predicted no faster than brute force, the full index is neither filled nor calibrated and the
fallback (a PQ scan, then exact search) is built at once. This bench takes each run's label vectors and
calibration queries from a kept scale workspace (``python -m bench.scale --keep``: the saved prediction index and
the package's query encoder; the 1,000 training queries the pipeline calibrates on) and builds the index both
ways, one after the other: ``full`` (the probe disabled: fill, calibrate, fall back), then ``probe``. Per run:
build seconds of each and their ratio, the kind and width each chose with its recall@100 against exact search
and seconds per 1,000 queries, and the probe's estimate (recall and seconds at its width) against what the full
IVF measured at the same width.

    python -m bench.ivf_probe [--workspace bench/.scale/repo_1000000] [--runs dexml_bow,ramen,unidec,astra]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_inputs(ws: Path, run: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(label vectors, calibration query vectors, the saved index's settings) of one run's prediction index."""
    import torch

    from xmc.ann import ANNIndex
    from xmc.data import load_processed
    from xmc.methods.base import predictor_options
    from xmc.package.predictors import predictor_class

    root = ws / "indexes" / run
    section = json.loads((root / "predictor.json").read_text())
    saved = ANNIndex.load(root / section.get("index", "index"), use_gpu=False)
    vectors = np.ascontiguousarray(saved.vectors(), dtype=np.float32)
    settings = {k: getattr(saved, k) for k in ("recall_target", "calibration_sample", "equalize_norms", "pq_fallback")}
    n = len(vectors)
    del saved
    predictor = predictor_class(section["kind"], root).load(root, section, [""] * n)
    # the training queries the pipeline calibrates on, chosen as the prediction stage chooses them
    params = yaml.safe_load((ws / "params.yaml").read_text())
    ds = load_processed(ws / "data" / "processed", splits=("trn",))
    calib = predictor_options(params, ds, {})["calibration_texts"]
    with torch.inference_mode():
        queries = predictor.query_vectors(calib)
    return vectors, np.ascontiguousarray(queries, dtype=np.float32), settings


def build(vectors: np.ndarray, queries: np.ndarray, settings: dict[str, Any], probe: bool) -> dict[str, Any]:
    import xmc.ann.index as ann

    floor = ann.PROBE_MIN_VECTORS
    ann.PROBE_MIN_VECTORS = floor if probe else len(vectors) + 1
    try:
        t = time.perf_counter()
        idx = ann.ANNIndex(kind="ivf", storage="float16", use_gpu=False, recall_target=settings["recall_target"],
                           calibration_sample=settings["calibration_sample"],
                           equalize_norms=settings["equalize_norms"], pq_fallback=settings["pq_fallback"])
        idx.build(vectors, queries)
        seconds = time.perf_counter() - t
    finally:
        ann.PROBE_MIN_VECTORS = floor
    cal = idx.calibration or {}
    out = {"build_seconds": round(seconds, 2), "kind": idx.kind, "knob": cal.get("knob"), "value": cal.get("value"),
           "recall": cal.get("recall"), "search_seconds_per_1000": cal.get("search_seconds_per_1000"),
           "exact_seconds_per_1000": cal.get("exact_seconds_per_1000"), "calibration": cal}
    del idx
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workspace", default=str(ROOT / "bench" / ".scale" / "repo_1000000"))
    ap.add_argument("--runs", default="dexml_bow,ramen,unidec,astra")
    ap.add_argument("--out", default=str(ROOT / "bench" / "ivf_probe.json"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))   # this project's code, not the workspace's copy
    import faiss

    from xmc.machine import describe_machine

    ws = Path(a.workspace).resolve()
    result: dict[str, Any] = {"workspace": str(ws), "machine": describe_machine(measure=False),
                              "python": platform.python_version(), "faiss": faiss.__version__, "runs": {}}
    for run in [r for r in a.runs.split(",") if r]:
        vectors, queries, settings = run_inputs(ws, run)
        print(f"{run}: {vectors.shape[0]:,} x {vectors.shape[1]} label vectors, {len(queries):,} calibration queries",
              flush=True)
        rows: dict[str, Any] = {}
        for way in ("full", "probe"):   # the full build first: the page cache and faiss' threads are warm for both
            rows[way] = build(vectors, queries, settings, probe=way == "probe")
            r = rows[way]
            print(f"  {way:5s} build {r['build_seconds']:7.1f} s -> {r['kind']} {r['knob']} {r['value']} recall "
                  f"{r['recall']} at {r['search_seconds_per_1000']} s per 1,000 queries "
                  f"(exact {r['exact_seconds_per_1000']})", flush=True)
        full_cal, probe_cal = rows["full"]["calibration"], rows["probe"]["calibration"]
        probe = probe_cal.get("probe") or (probe_cal.get("before") or {}).get("probe") or {}
        ivf = full_cal.get("before") if full_cal.get("kind") != "ivf" else full_cal   # the full IVF's calibration
        width = str(probe.get("nprobe"))
        rows["probe_against_full_ivf"] = {
            "nprobe": probe.get("nprobe"), "skipped": probe.get("skip"),
            "recall": {"probe": probe.get("recall"), "full": (ivf or {}).get("tried", {}).get(width)},
            "seconds_per_1000": {"probe_estimate": probe.get("estimated_seconds_per_1000"),
                                 "full": (ivf or {}).get("search_seconds_per_1000")
                                 if (ivf or {}).get("value") == probe.get("nprobe") else None},
            "recall_by_nprobe": {w: {"probe": r, "full": (ivf or {}).get("tried", {}).get(w)}
                                 for w, r in probe.get("tried", {}).items()}}
        rows["full_over_probe_build"] = round(rows["full"]["build_seconds"] / rows["probe"]["build_seconds"], 2)
        rows["same_index"] = ((rows["full"]["kind"], rows["full"]["value"])
                              == (rows["probe"]["kind"], rows["probe"]["value"]))
        print(f"  full / probe build: {rows['full_over_probe_build']:.2f}x; same index chosen: {rows['same_index']}",
              flush=True)
        result["runs"][run] = rows
        del vectors, queries
        gc.collect()
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
