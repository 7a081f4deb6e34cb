"""Report: every run, the linear peer and the hybrids of params.yaml -> reports/comparison.{md,html},
reports/paired.json, reports/plots.html and reports/figures/ (xmc.report).

A table per dataset: each run records its dataset's rows and tests in reports/datasets/<dataset>.json, which the
pipeline keeps across runs (a persistent output), so after ``make run DATASET=debian-relations`` and ``make run``
the comparison shows the current dataset first and each other dataset's last run in this workspace after it.

Each metric cell carries its 95 % bootstrap interval (``ci95`` of metrics/<name>.json); params ``report.paired``
([[a, b], ...]) adds paired bootstrap tests on the test contributions (evaluation/tst/<name>.npz).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.config.params import dataset_name, product_names
from xmc.config.runs import resolve_runs
from xmc.errors import ConfigError
from xmc.io import atomic_file, read_json_file, write_json
from xmc.metrics.bootstrap import bootstrap_settings
from xmc.report import (comparison_rows, paired_comparisons, render_figures, render_html, render_markdown,
                        render_plots_page, supervision)
from xmc.workspace import Workspace


def main() -> None:
    params = load_params()
    ws = Workspace()
    rep: dict[str, Any] = params["report"]
    boot = bootstrap_settings(params)
    alpha = rep["alpha"]
    out = ws.reports
    name = dataset_name(params["data"])
    paired, skipped = paired_comparisons(list(rep["paired"]), [ws.root / "evaluation" / "tst"], alpha=alpha, **boot)
    rows = comparison_rows(ws.root / "metrics", product_names(params))
    check_one_dataset(rows, ws.root / "metrics")
    used = labelled_pairs_used(params, ws.root / "plans", Path(params["data"]["dataset_dir"]).name)
    for r in rows:
        r["labelled_pairs"] = used.get(r["method"], "")
        val = ws.metrics(r["method"], "val")
        if val.is_file() and "by_name_match" in (m := read_json_file(val, "validation metrics")):
            r["by_name_match_val"] = m["by_name_match"]
    title = f"XMC comparison on {name} (test split)"
    summary = ws.validation_reports / "summary.json"
    counts = read_json_file(summary, "the data summary (stages.validate)").get("counts", {}) if summary.is_file() else {}
    if params["data"]["open_labels"]:
        n_labels = counts["n_labels"]
        title = f"XMC comparison on {name} (test split; open label space: {n_labels:,} labels)"
    # training curves come from the live records of the runs behind the rows (plots/train/<run>/)
    page = render_figures([r["method"] for r in rows], ws.root / "plots" / "eval", ws.root / "plots" / "train",
                          out / "figures", rep["training_families"], {r["method"]: r for r in rows})
    images = [f"figures/{i['file']}" for i in page["curves"]]
    kw: dict[str, Any] = {"bootstrap": boot, "paired": paired, "alpha": alpha, "skipped": skipped}
    write_json(out / "paired.json", paired)
    others = other_datasets(out / "datasets", name)
    write_json(out / "datasets" / f"{name}.json", dataset_record(params, counts, name, rows, paired, skipped, boot))
    with atomic_file(out / "comparison.md") as fh:
        fh.write(render_markdown(rows, title, **kw))
        for o in others:
            fh.write("\n" + render_markdown(o["rows"], o["title"], bootstrap=o.get("bootstrap"), paired=o.get("paired"),
                                            alpha=alpha, skipped=o.get("skipped")))
    with atomic_file(out / "comparison.html") as fh:
        fh.write(render_html(rows, title, images, plots_page="plots.html", others=others, **kw))
    with atomic_file(out / "plots.html") as fh:
        fh.write(render_plots_page(page, f"Figures: {title}"))


def check_one_dataset(rows: list[dict[str, Any]], metrics_dir: Path) -> None:
    """A table mixes no datasets: every row is evaluated on the same test instances (a metrics file left from a run
    on another dataset is one error line)."""
    counts: dict[int, list[str]] = {}
    for r in rows:
        counts.setdefault(int(r.get("n_test", -1)), []).append(r["method"])
    if len(counts) > 1:
        usual = max(counts, key=lambda n: len(counts[n]))
        odd = next(m for n, ms in counts.items() if n != usual for m in ms)
        raise ConfigError(f"{metrics_dir / (odd + '.json')}: evaluated on {next(n for n, ms in counts.items() if odd in ms)} "
                          f"test instances, the other rows on {usual}: a stale evaluation of another dataset? "
                          f"(dvc repro evaluates it again)")


def labelled_splits(plan_file: Path) -> tuple[str, ...]:
    """The splits whose label matrices (``<split>_Y.npz``) a run's training read, as its plan recorded them (the
    plan lists every input the training reads: reading it keeps method code, and torch, out of the report)."""
    inputs = read_json_file(plan_file, "a training plan (stages.plan)")["inputs"]
    return tuple(sorted(Path(p).name.removesuffix("_Y.npz") for p in inputs if p.endswith("_Y.npz")))


def labelled_pairs_used(params: dict[str, Any], plans: Path, dataset: str) -> dict[str, str]:
    """Row name -> what labelled pairs of the dataset it used (training, validation, none), in words; ``plans``:
    the training plans (stages.plan), one per run."""
    specs, _ = resolve_runs(params["runs"], params)
    reads = {name: labelled_splits(plans / f"{name}.json") for name in specs}
    reads.update({name: ("trn",) for name in params["xr_linear"]})
    tuned_here = dataset in params["report"]["settings_chosen_on"]
    out = {name: supervision(r, None, tuned_here) for name, r in reads.items()}
    for name, h in params["hybrids"].items():
        out[name] = supervision(reads.get(h["base"], ()), h["fusion"], tuned_here)
    return out


def dataset_record(params: dict[str, Any], counts: dict[str, Any], name: str, rows: list[dict[str, Any]],
                   paired: list[dict[str, Any]], skipped: list[str], boot: dict[str, Any]) -> dict[str, Any]:
    """What the comparison of a later run on another dataset shows of this one (``counts``: the data's sizes)."""
    return {"dataset": name, "dataset_dir": params["data"]["dataset_dir"], "counts": counts,
            "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "rows": rows, "paired": paired, "skipped": skipped, "bootstrap": boot}


def other_datasets(records: Path, current: str) -> list[dict[str, Any]]:
    """The other datasets' records of earlier runs in this workspace, each with the title of its table."""
    out = []
    for path in sorted(records.glob("*.json")) if records.is_dir() else []:
        rec = json.loads(path.read_text(encoding="utf-8"))
        if rec.get("dataset") == current:
            continue
        rec["title"] = (f"XMC comparison on {rec['dataset']} (test split; the last run on it here, "
                        f"{rec['written']}, data.dataset_dir: {rec['dataset_dir']})")
        out.append(rec)
    return out


if __name__ == "__main__":
    run_entry_point(main)
