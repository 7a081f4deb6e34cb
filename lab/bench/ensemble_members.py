"""Member sets of the ensemble hybrid compared on the validation split, with the pipeline's own fusion.

The ensemble (params ``hybrid.ensemble``) re-scores the union of its members' top-k lists and the label-name
matches with one fusion fit on the validation split, its validation predictions cross-fitted by document
(``xmc.lexical.fuse.fuse_ensemble``). Which runs are its members was set by hand. This script fuses each candidate
member set exactly as the ``fuse_ensemble`` stage does (same call, same settings, the members' committed
validation predictions), in a scratch directory, and compares every candidate with the current members by a
paired bootstrap over the validation sentences (the pipeline's evaluation settings). It first refits the
current members and checks that the result equals the pipeline's own ``predictions/<ensemble>/val_topk.npz``, so
what is compared is what the stage would write. The test split is not read.

    python -m bench.ensemble_members --candidates '{"bow_only": ["astra", "dexml_bow", "ramen", "unidec",
        "tfidf_knn"]}' [--root .] [--out bench/ensemble_members.json]

A candidate is a list of runs, or ``{"replace": {old: new}}`` / ``{"drop": [...]}`` / ``{"add": [...]}`` applied to
the current members. Each member needs validation predictions in ``<root>/predictions/<run>/``; the members'
training time (their ``timing.json``) is reported beside each set, as the ensemble's row of the report counts it.
Not a test.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.bow_training_speed import VALIDATION_METRICS as METRICS


def member_set(current: list[str], spec: Any) -> list[str]:
    """A candidate's members: a list as given, or edits of the current members."""
    if isinstance(spec, list):
        return [str(m) for m in spec]
    if not isinstance(spec, dict) or set(spec) - {"replace", "drop", "add"}:
        raise SystemExit(f"--candidates: {spec!r} is neither a list of runs nor {{replace, drop, add}} edits")
    members = [spec.get("replace", {}).get(m, m) for m in current if m not in spec.get("drop", [])]
    return members + [m for m in spec.get("add", []) if m not in members]


def fuse_validation(params: dict[str, Any], members: list[str], root: Path, scratch: Path, name: str) -> Path:
    """The ensemble of ``members`` fit and ranked on the validation split as the stage does it (no test split, no
    predictor): the path of its ``val_topk.npz`` under ``scratch``. The members' prediction folders are links
    into ``root``; the ensemble is written under the ensemble's own name, which no member has (params check)."""
    from xmc.lexical.fuse import _fuse

    out_name = params["hybrid"]["ensemble"]["name"]
    if out_name in members:
        raise SystemExit(f"--candidates: {name} names the ensemble {out_name} as its own member")
    work = scratch / name
    (work / "predictions").mkdir(parents=True)
    (work / Path(params["data"]["processed_dir"])).parent.mkdir(parents=True, exist_ok=True)
    (work / params["data"]["processed_dir"]).symlink_to((root / params["data"]["processed_dir"]).resolve())
    p = copy.deepcopy(params)
    for m in members:
        if not (root / "predictions" / m / "val_topk.npz").is_file():
            raise SystemExit(f"{root / 'predictions' / m / 'val_topk.npz'}: missing (no validation predictions of {m})")
        (work / "predictions" / m).symlink_to((root / "predictions" / m).resolve())
        p["predictions"][m] = "val"   # the fusion is fit and ranked on validation only
    _fuse(p, members, out_name, work, with_predictor=False, ensemble=True)
    return work / "predictions" / out_name / "val_topk.npz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", required=True, help="JSON {name: [runs] | {replace|drop|add: ...}}")
    ap.add_argument("--root", default=".", help="the workspace whose predictions/ and data/ are read")
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    from xmc.config import load_params
    from xmc.data import load_processed
    from xmc.io import read_json
    from xmc.metrics.bootstrap import paired_bootstrap
    from xmc.machine import set_threads

    from bench.bow_training_speed import validation_contributions

    set_threads()
    root = Path(a.root).resolve()
    params = load_params(root / "params.yaml")
    ens = params["hybrid"]["ensemble"]
    current = list(ens["members"])
    candidates = {name: member_set(current, spec) for name, spec in json.loads(a.candidates).items()}
    ev, boot = params["evaluate"], params["evaluate"]["bootstrap"]
    ds = load_processed(root / params["data"]["processed_dir"], splits=("trn", "val"))

    def train_seconds(members: list[str]) -> float:
        return round(sum(float(read_json(root / "predictions" / m / "timing.json").get("train_seconds", 0.0))
                         if (root / "predictions" / m / "timing.json").is_file() else 0.0 for m in members), 1)

    out: dict[str, Any] = {"split": "val", "n_sentences": int(ds.val.Y.shape[0]), "ensemble": ens["name"],
                           "current_members": current, "candidates": candidates, "sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        ref_file = fuse_validation(params, current, root, scratch, "current")
        shipped = root / "predictions" / ens["name"] / "val_topk.npz"
        if shipped.is_file():
            x, y = np.load(ref_file), np.load(shipped)
            out["current_reproduces_pipeline"] = bool(np.array_equal(x["indices"], y["indices"])
                                                      and np.allclose(x["scores"], y["scores"], rtol=1e-6))
        ref = validation_contributions(ref_file, ds, ev)
        out["sets"]["current"] = {"members": current, "train_seconds": train_seconds(current),
                                  **{m: round(float(ref.values()[m]), 2) for m in METRICS}}
        print("current", out["sets"]["current"], "reproduces the pipeline:", out.get("current_reproduces_pipeline"),
              flush=True)
        for name, members in candidates.items():
            c = validation_contributions(fuse_validation(params, members, root, scratch, name), ds, ev)
            row = {"members": members, "train_seconds": train_seconds(members),
                   **{m: round(float(c.values()[m]), 2) for m in METRICS},
                   "minus_current": {m: {k: v for k, v in paired_bootstrap(
                       c, ref, m, int(boot["n_resamples"]), int(boot["seed"]), float(boot["level"])).items()
                       if k in ("diff", "ci95", "p_value")} for m in METRICS}}
            out["sets"][name] = row
            print(name, row, flush=True)
            if a.out:
                Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
