"""Which fusion a validation-tuned hybrid should use, decided on validation of each dataset: the two-weight grid
(``hybrid.valtuned.fusion: grid``) against boosted trees on the features no training pair gives (``boosted_trees``)
and the per-dataset choice between them (``auto``).

Each variant runs the product's own ``fuse`` on a finished run of record (its base runs' packages and validation
predictions) into a scratch folder, validation only: the test split is not read. Printed per (dataset, hybrid,
variant): cross-fitted validation P@1 / P@5 overall and on the texts with / without a correct name match against
the base run, and each variant's P@1 minus the grid's with a paired interval that resamples validation documents.

    python -m lab.bench.valtuned_fusion --results semcor-wn30=/work/wt2/results/semcor-wn30 \\
        --results debian-relations=/work/wt/results/debian-relations --out lab/bench/valtuned_fusion.json
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import tempfile
import time
from pathlib import Path

from xmc.config import load_params
from xmc.metrics.bootstrap import InstanceContributions, bootstrap_settings, paired_bootstrap
from xmc.package.fuse import fuse
from xmc.workspace import Workspace

HYBRIDS = ("minilm_zeroshot_valtuned_hybrid", "maclr_valtuned_hybrid")
VARIANTS = ("grid", "boosted_trees", "auto")
ROOT = Path(__file__).resolve().parents[2]


def params_for(dataset_dir: str, name: str) -> dict:
    params = copy.deepcopy(load_params(ROOT / "params.yaml"))
    params["data"]["dataset_dir"], params["data"]["name"] = dataset_dir, name
    return params


def one(params: dict, results: Path, hybrid: str, variant: str, scratch: Path) -> dict:
    p = copy.deepcopy(params)
    p["hybrid"]["valtuned"]["fusion"] = variant
    base = p["hybrids"][hybrid]["base"]
    ws = Workspace(scratch / variant, data_root=results)
    t0 = time.perf_counter()
    summary = fuse(p, hybrid, [base], ws, valtuned=True, splits=("val",), base_ws=Workspace(results),
                   with_package=False)
    val = json.loads(ws.metrics(hybrid, "val").read_text())
    by = val["by_name_match"]
    return {"seconds": round(time.perf_counter() - t0, 1), "P@1": val["P@1"], "P@5": val["P@5"],
            "with": {k: by["with_correct_name_match"].get(k) for k in ("texts", "base P@1", "hybrid P@1")},
            "without": {k: by["without"].get(k) for k in ("texts", "base P@1", "hybrid P@1", "P@1 diff",
                                                          "P@1 diff ci95")},
            "fusion": summary["fusion"].get("kind"), "first_bonus": summary["fusion"].get("first_bonus"),
            "chosen": summary.get("chosen_on_validation", {}).get("valtuned_fusion", {}).get("chosen", variant),
            "contributions": str(ws.contributions(hybrid, "val"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", action="append", required=True, metavar="NAME=DIR",
                    help="a dataset's name and its run of record's results/<name>/ folder (repeatable)")
    ap.add_argument("--datasets-root", default=str(ROOT.parent / "shared" / "datasets"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s | %(message)s")
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="valtuned-") as tmp:
        for item in a.results:
            name, results = item.split("=", 1)
            params = params_for(str(Path(a.datasets_root) / name), name)
            boot = bootstrap_settings(params)
            for hybrid in HYBRIDS:
                rows = {v: one(params, Path(results), hybrid, v, Path(tmp) / name / hybrid) for v in VARIANTS}
                ref = InstanceContributions.load(rows["grid"]["contributions"])
                for v, r in rows.items():
                    test = paired_bootstrap(InstanceContributions.load(r.pop("contributions")), ref, "P@1",
                                            boot["n_resamples"], boot["seed"], boot["level"], boot["unit"])
                    r["P@1 minus grid"] = {"diff": round(test["diff"], 2), "ci95": test["ci95"],
                                           "p": round(test["p_value"], 4)}
                    w, wo = r["with"], r["without"]
                    print(f"{name:17} {hybrid:33} {v:13} P@1 {r['P@1']:6.2f} P@5 {r['P@5']:6.2f} | with "
                          f"({w['texts']}) {w['base P@1']} -> {w['hybrid P@1']} | without ({wo['texts']}) "
                          f"{wo['base P@1']} -> {wo['hybrid P@1']} ({wo['P@1 diff']:+.2f} {wo['P@1 diff ci95']}) | "
                          f"vs grid {r['P@1 minus grid']['diff']:+.2f} {r['P@1 minus grid']['ci95']} "
                          f"[{r['chosen']}, {r['seconds']} s]", flush=True)
                out.setdefault(name, {})[hybrid] = rows
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
