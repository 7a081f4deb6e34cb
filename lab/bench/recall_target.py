"""Which ``index.recall_target`` the approximate prediction index calibrates to, chosen on the validation split.

Above ``index.auto_exact_max`` labels the prediction index is IVF and searches the fewest lists whose recall@100
against exact search on training queries reaches ``recall_target`` (``xmc.ann.index.ANNIndex.calibrate``). A
lower target searches faster and may lose precision. In a kept scale-benchmark workspace (``python -m bench.scale
--keep``: trained one-epoch bag-of-words models on synthetic data), each run's predictor is rebuilt with an IVF
index at every target and with an exact index, and the *validation* queries are searched: per target the chosen
nprobe, the recall@100 against exact on the validation queries, P@1 / P@5 / R@100 and the index's build
(with calibration) and search seconds for the validation query vectors (encoded once per run), with a
paired bootstrap of P@5 and P@1 against exact search on the same queries. Any approximate search loses a little,
and on 10^4 queries a loss of 0.1 point is already significant, so the rule is non-inferiority: the chosen target
is the smallest at which, for every run, the lower end of the 95% interval of (approximate - exact) P@1 and P@5
stays above -``--margin`` points (default 0.5).

    python -m bench.recall_target [--workspace bench/.scale/repo_100000] [--targets 0.5,0.7,0.8,0.9,0.95,0.99]

``--equalize-norms both`` builds every approximate index with and without ``index.equalize_norms`` (the extra
coordinate that gives classifier rows one norm) and adds, per run and target, the paired comparison of the two
on the same validation queries (``equalize_norms``: search seconds, recall, P@1 / P@5 of equalized minus plain).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workspace", default=str(ROOT / "bench" / ".scale" / "repo_100000"))
    ap.add_argument("--runs", default="dexml_bow,ramen,unidec,astra")
    ap.add_argument("--targets", default="0.5,0.7,0.8,0.9,0.95,0.99")
    ap.add_argument("--split", default="val")
    ap.add_argument("--margin", type=float, default=0.5, help="points of P@1 / P@5 a target may lose (95%% bound)")
    ap.add_argument("--equalize-norms", choices=("params", "on", "off", "both"), default="params",
                    help="approximate indexes with index.equalize_norms as in params, on, off, or both compared")
    ap.add_argument("--out", default=str(ROOT / "bench" / "recall_target.json"))
    a = ap.parse_args(argv)
    ws = Path(a.workspace).resolve()
    out_path = Path(a.out).resolve()   # before the chdir below
    sys.path.insert(0, str(ROOT))   # this project's code, not the workspace's copy
    os.chdir(ws)   # the workspace's relative paths (models/, data/)
    from xmc.ann.index import ANNIndex, exact_top_ids, recall_of
    from xmc.config.schema import IndexConfig, filled
    from xmc.data import load_processed
    from xmc.methods.base import load_method, predictor_options
    from xmc.metrics.bootstrap import instance_contributions, paired_bootstrap
    from xmc.package.predictors import predictor_class
    from xmc.predictions import TopK

    params = yaml.safe_load((ws / "params.yaml").read_text())
    ds = load_processed(ws / params["data"]["processed_dir"], splits=("trn", a.split))
    split = ds.split(a.split)
    texts, Y = split.texts, split.Y
    targets = [float(t) for t in a.targets.split(",")]
    trn_freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    default_eq = bool(filled(IndexConfig, params["index"], "index")["equalize_norms"])
    equalize = {"params": [default_eq], "on": [True], "off": [False], "both": [True, False]}[a.equalize_norms]

    def contributions(scores: np.ndarray, ids: np.ndarray) -> Any:   # the report's per-instance metric terms
        return instance_contributions(TopK(ids.astype(np.int32), scores.astype(np.float32)), Y, trn_freq,
                                      ds.trn.Y.shape[0])

    rows: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    for name in a.runs.split(","):
        run, method = load_method(params, name)
        source = Path(method.predictor_source(run, params))
        cls = predictor_class(method.predictor_kind, source)
        options = predictor_options({**params, "index": {**params["index"], "kind": "exact"}}, ds, {})
        with tempfile.TemporaryDirectory(dir=ws) as tmp:   # encoders and label vectors once per run
            section = cls.build(source, Path(tmp), ds.label_texts, options)
            predictor = cls.load(Path(tmp), section, ds.label_texts)
            vectors = predictor.index.vectors()
            q_val = predictor.query_vectors(texts)
            q_trn = predictor.query_vectors(options["calibration_texts"])
        truth = exact_top_ids(q_val, vectors, 100)
        results: dict[str, Any] = {}
        for target, eq in [(None, default_eq), *((t, e) for t in targets for e in equalize)]:   # None: exact
            index = ANNIndex.from_params(params["index"])
            index.use_gpu = False
            index.kind, index.recall_target, index.equalize_norms = ("exact" if target is None else "ivf"), target, eq
            t0 = time.perf_counter()
            index.build(vectors, None if target is None else q_trn)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            scores, ids = index.search(q_val, 100)
            search_s = time.perf_counter() - t0
            key = "exact" if target is None else str(target) + ("" if eq == default_eq else f"/equalize_norms={eq}")
            cal = index.calibration or {}
            results[key] = {"contrib": contributions(scores, ids), "build_s": build_s, "search_s": search_s, "calibration": cal,
                            "val_recall": recall_of(ids, truth), "target": target, "equalize_norms": eq, "kind": index.kind,
                            "equalized": index.norm_max is not None or bool(cal.get("equalized_norms"))}
            print(f"{name} {key}: {index.kind}, {cal.get('knob', 'width')} {cal.get('value', '-')}, "
                  f"calibration recall {cal.get('recall', '-')}, "
                  f"{a.split} recall {results[key]['val_recall']:.3f}, build {build_s:.1f} s, search "
                  f"{search_s:.2f} s", flush=True)
        ref = results["exact"]["contrib"]
        for key, r in results.items():
            m = r["contrib"].values()
            row = {"run": name, "target": key if r["target"] is None else str(r["target"]),
                   "equalize_norms": r["equalize_norms"], "equalized": r["equalized"],
                   "kind": r["kind"], "knob": r["calibration"].get("knob"), "nprobe": r["calibration"].get("value"),
                   "fallback": r["calibration"].get("fallback"),
                   "calibration_recall": r["calibration"].get("recall"),
                   f"{a.split}_recall_at_100": round(r["val_recall"], 4), "build_seconds": round(r["build_s"], 1),
                   "search_seconds": round(r["search_s"], 2),
                   **{k: round(m[k], 2) for k in ("P@1", "P@5", "PSP@5", "R@100")}}
            if key != "exact":
                row["vs_exact"] = {k: paired_bootstrap(r["contrib"], ref, k, n_resamples=2000) for k in ("P@1", "P@5")}
            rows.append(row)
            print(json.dumps(row), flush=True)
        if len(equalize) == 2:   # equalized against plain, same target, same queries
            for t in targets:
                on, off = (results[str(t) + ("" if e == default_eq else f"/equalize_norms={e}")] for e in (True, False))
                comparisons.append({
                    "run": name, "target": t, "equalized": on["equalized"],
                    "nprobe": [on["calibration"].get("value"), off["calibration"].get("value")],
                    "fallback": [on["calibration"].get("fallback"), off["calibration"].get("fallback")],
                    "search_seconds": [round(on["search_s"], 2), round(off["search_s"], 2)],
                    f"{a.split}_recall_at_100": [round(on["val_recall"], 4), round(off["val_recall"], 4)],
                    "equalized_minus_plain": {k: paired_bootstrap(on["contrib"], off["contrib"], k, n_resamples=2000)
                                              for k in ("P@1", "P@5")}})
                print("equalize_norms", json.dumps(comparisons[-1]), flush=True)

    def holds(row: dict[str, Any]) -> bool:
        return all(c["ci95"][0] > -a.margin for c in row["vs_exact"].values())

    chosen = next((t for t in targets if all(holds(r) for r in rows if r["target"] == str(t)
                                             and r["equalize_norms"] == default_eq)), None)
    out = {"workspace": str(ws), "split": a.split, "queries": len(texts), "labels": len(ds.label_texts),
           "cpus": os.cpu_count(), "python": sys.version.split()[0], "targets": targets, "rows": rows,
           "rule": f"smallest target at which every run's 95% interval of P@1 and P@5 minus exact search stays "
                   f"above -{a.margin} points", "margin": a.margin,
           "chosen": chosen, **({"equalize_norms": comparisons} if comparisons else {})}
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"chosen recall_target: {chosen}")
    return out


if __name__ == "__main__":
    main()
