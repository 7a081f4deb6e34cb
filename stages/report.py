"""Report: every run, the linear peer and the hybrids of params.yaml on one dataset ->
results/<data.name>/reports/comparison.{md,html}, paired.json, plots.html, figures/ and record.json (the rows and
tests as data) (xmc.report).

A report is of one dataset: it reads only results/<data.name>/, and refuses a row evaluated on other test
instances than the rest (a stale file of another run). Each dataset's report stays in its own folder.

Each metric cell carries its 95 % bootstrap interval (``ci95`` of metrics/<name>.json); params ``report.paired``
([[a, b], ...]) adds paired bootstrap tests on the test contributions (evaluation/tst/<name>.npz), both under
results/<data.name>/.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.config.params import product_names
from xmc.config.runs import resolve_runs
from xmc.errors import ConfigError
from xmc.io import atomic_file, read_json_file, write_json
from xmc.metrics.bootstrap import bootstrap_settings
from xmc.report import (comparison_rows, paired_comparisons, render_figures, render_html, render_markdown,
                        render_plots_page, supervision)
from xmc.workspace import dataset_name, product_workspace


def main() -> None:
    params = load_params()
    ws = product_workspace(params)
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
                          out / "figures", rep["training_families"], {r["method"]: r for r in rows},
                          method_of=methods_of(params))
    images = [f"figures/{i['file']}" for i in page["curves"]]
    kw: dict[str, Any] = {"bootstrap": boot, "paired": paired, "alpha": alpha, "skipped": skipped}
    write_json(out / "paired.json", paired)
    write_json(out / "record.json", dataset_record(params, counts, name, rows, paired, skipped, boot))
    with atomic_file(out / "comparison.md") as fh:
        fh.write(render_markdown(rows, title, **kw))
    with atomic_file(out / "comparison.html") as fh:
        fh.write(render_html(rows, title, images, plots_page="plots.html", **kw))
    with atomic_file(out / "plots.html") as fh:
        fh.write(render_plots_page(page, f"Figures: {title}"))


def methods_of(params: dict[str, Any]) -> dict[str, str]:
    """Row -> its method (a hybrid: its base run's; the linear peer: ``xr_linear``): which of the papers' colours the
    figures draw it in."""
    out = {name: str(spec.get("method", "")) for name, spec in params["runs"].items()}
    out.update({name: "xr_linear" for name in params["xr_linear"]})
    out.update({name: out.get(h["base"], "") for name, h in params["hybrids"].items()})
    return out


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
    """The report as data (``counts``: the data's sizes): what the README's tables are rendered from."""
    return {"dataset": name, "dataset_dir": params["data"]["dataset_dir"], "counts": counts,
            "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "rows": rows, "paired": paired, "skipped": skipped, "bootstrap": boot}


if __name__ == "__main__":
    run_entry_point(main)
