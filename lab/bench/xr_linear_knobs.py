"""XR-Linear's other knobs on the validation split: each variant of the product's linear-peer run (``params.yaml:
xr_linear.xr_linear``, its "defaults" here) against those settings themselves, over several tree seeds.

``lab/bench/xr_linear_grid.py`` chose the cost and the tree width. A one-seed sweep of the other knobs left two that
moved P@5 by about as much as the tree seed does (leaves of 200 labels, PII label features), so a decision needs
the seed variation: every variant and the defaults are trained from tree seeds 0..``--seeds``-1 with the functions
the ``xr_linear@`` stages call, and per metric the mean of the per-seed differences (variant − defaults), its
95 % t-interval and the paired t-test's p are reported (``xmc.metrics.bootstrap.paired_over_seeds``).

The output is a seed study (``lab/seed_studies/``, the format of ``lab.bench.seed_study``: split, validation
fingerprint, per-seed figures of every side), so a ``lab/params.yaml: selection`` choice can name it and the lab's
``selection`` stage decides that choice by its rule over seeds: the side with the best mean selection metric
replaces the reference only if the paired t-test gives p < ``selection.alpha``.

Run it in the PECOS environment from a workspace with the ``tfidf`` stage's outputs; the test split is not read::

    .venv-pecos/bin/python -m lab.bench.xr_linear_knobs --variant leaves200:max_leaf_size=200 \\
        --variant pii:label_embedding=pii [--seeds 5] [--out lab/seed_studies/xr_linear_label_tree.json]

Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import yaml

from lab.bench.seed_study import compare_over_seeds
from lab.bench.xr_linear_grid import (METRICS, linear_settings, parse_seed_args, ranking_settings, selection_rule,
                                      train_and_rank, validation_data)


def parse_variant(text: str, defaults: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``[name:]key=value[,key=value]`` → (the side's name, overrides of ``defaults``); values parsed as YAML
    scalars, keys checked. Without a name the side is called by its overrides."""
    name, sep, body = text.partition(":")
    if not sep:
        name, body = text, text
    name = name.strip()
    if not name or name == "defaults":
        raise SystemExit(f"error: --variant {text!r}: a side needs a name other than 'defaults'")
    out: dict[str, Any] = {}
    for part in body.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SystemExit(f"error: --variant {text!r}: expected key=value[,key=value]")
        if key not in defaults:
            raise SystemExit(f"error: --variant {text!r}: {key!r} is not a knob of the xr_linear run "
                             f"({', '.join(sorted(defaults))})")
        out[key] = yaml.safe_load(value)
    return name, out


def main() -> None:
    from xmc.config import load_params
    from xmc.metrics.bootstrap import paired_over_seeds, split_fingerprint, verdict

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="a side: [name:]key=value[,key=value] overriding the run's settings; repeat for several")
    ap.add_argument("--run", default="xr_linear", help="the product's linear-peer run (params.yaml xr_linear)")
    args = parse_seed_args(ap, "tree seeds 0..N-1 for every variant and the defaults",
                           "lab/seed_studies/xr_linear_label_tree.json")

    params = load_params()
    base = linear_settings(params, args.run)
    sel = selection_rule()
    metric = sel["metric"]
    ev = ranking_settings(params)
    variants = dict(parse_variant(v, base) for v in args.variant)
    if len(variants) != len(args.variant):
        raise SystemExit("error: two --variant sides have the same name")
    data = validation_data(params)

    def run(overrides: dict[str, Any], seed: int) -> dict[str, float]:
        cell = train_and_rank(data, {**base, **overrides, "seed": seed}, ev)
        return {"seed": seed, **cell["metrics"], "train_seconds": cell["train_seconds"]}

    per_seed: dict[str, list[dict[str, float]]] = {"defaults": [], **{v: [] for v in variants}}
    for seed in range(args.seeds):
        per_seed["defaults"].append(run({}, seed))
        print(f"seed {seed} defaults: {per_seed['defaults'][-1]}", flush=True)
        for name, overrides in variants.items():
            per_seed[name].append(run(overrides, seed))
            print(f"seed {seed} {name}: {per_seed[name][-1]}", flush=True)

    results = []
    for name, overrides in variants.items():
        diffs = {**compare_over_seeds(per_seed["defaults"], per_seed[name]),
                 "train_seconds": paired_over_seeds([r["train_seconds"] for r in per_seed[name]],
                                                    [r["train_seconds"] for r in per_seed["defaults"]])}
        d = diffs[metric]
        results.append({"variant": name, "overrides": overrides, "minus_defaults": diffs,
                        "verdict": verdict(d["p_value"], d["diff"], sel["alpha"])})
        print(f"{name} − defaults over {args.seeds} tree seeds: "
              + "; ".join(f"{m} {diffs[m]['diff']:+.2f} [{diffs[m]['ci95'][0]:.2f}, {diffs[m]['ci95'][1]:.2f}] "
                          f"p {diffs[m]['p_value']:.3f}" for m in METRICS), flush=True)

    out = {"what": "XR-Linear on the validation split: variants of the xr_linear run against its settings, each "
                   "trained from the same tree seeds; differences are variant − defaults over seeds",
           "run": "xr_linear", "split": "val", "n_sentences": int(data["Yv"].shape[0]),
           "val_fingerprint": split_fingerprint(data["Yv"]),
           "command": "python -m lab.bench.xr_linear_knobs " + " ".join(f"--variant {v}" for v in args.variant)
                      + f" --seeds {args.seeds} --out {args.out}",
           "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "python": platform.python_version()},
           "defaults": base, "selection_metric": metric, "alpha": sel["alpha"], "seeds": args.seeds,
           "candidates": {"defaults": {}, **variants}, "per_seed": per_seed, "variants": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
