"""Report: metrics of every method in params ``methods`` -> reports/comparison.{md,html} + figures.

Each metric cell carries its 95 % bootstrap interval (``ci95`` of metrics/<method>.json). Params
``report.paired``
([[a, b], ...]) adds paired bootstrap tests on the test contributions evaluation/tst/<run>.npz, also
written to reports/paired.json so that README sentences can cite them.

``python -m stages.report --ablations`` writes reports/ablations.{md,html}: the main methods followed by every
run in params ``ablations`` (metrics under ablations/metrics/), the paper ablations and side experiments that
``make run`` leaves out to stay within its time budget; its paired rows are ``report.paired`` followed by
``report.paired_ablations`` (also in reports/paired_ablations.json), with contributions from evaluation/tst/
or evaluation/ablations/.

``python -m stages.report --seeds`` writes reports/seeds.{md,html}: per run of ``report.seeds`` ({base run:
[extra-seed runs]}) the mean ± sd over its seeds (base metrics from metrics/, extra seeds from seeds/metrics/,
``make seeds``), under the base runs' own rows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.io import atomic_file, write_json
from xmc.metrics.bootstrap import EVALUATION_DIR, bootstrap_settings
from xmc.report import (ablation_deltas, comparison_rows, paired_comparisons, render_figures, render_html,
                        render_markdown, render_plots_page, seed_rows)


def main() -> None:
    params = load_params()
    rep: dict[str, Any] = params["report"]
    boot = bootstrap_settings(params)
    alpha = rep["alpha"]
    out = Path("reports")
    name = Path(params["data"]["dataset_dir"]).name
    if "--seeds" in sys.argv[1:]:
        seeds = seed_rows(["metrics", Path("seeds") / "metrics"], rep["seeds"])
        rows = comparison_rows("metrics", [s["base"] for s in seeds])
        title = f"Seed variation on {name} (test split)"
        with atomic_file(out / "seeds.md") as fh:
            fh.write(render_markdown(rows, title, bootstrap=boot, seeds=seeds, alpha=alpha))
        with atomic_file(out / "seeds.html") as fh:
            fh.write(render_html(rows, title, [], bootstrap=boot, seeds=seeds, alpha=alpha))
        return
    ablations = "--ablations" in sys.argv[1:]
    pairs = list(rep["paired"]) + (list(rep["paired_ablations"]) if ablations else [])
    dirs = [EVALUATION_DIR / "tst"] + ([EVALUATION_DIR / "ablations"] if ablations else [])
    paired, skipped = paired_comparisons(pairs, dirs, alpha=alpha, **boot)
    kw: dict[str, Any] = {"bootstrap": boot, "paired": paired, "alpha": alpha, "skipped": skipped}
    if ablations:
        rows = comparison_rows("metrics", params["methods"]) + comparison_rows(
            Path("ablations") / "metrics", params["ablations"])
        # each ablation against its control, as paired differences on the same test instances
        controls = {a: c for a, c in rep["ablation_controls"].items() if a in params["ablations"]}
        delta_rows, _ = paired_comparisons([[a, c] for a, c in controls.items()], dirs, alpha=alpha, **boot)
        deltas = ablation_deltas(delta_rows, controls)
        title = f"XMC methods and their ablations on {name} (test split)"
        write_json(out / "paired_ablations.json", paired + delta_rows)
        with atomic_file(out / "ablations.md") as fh:
            fh.write(render_markdown(rows, title, ablation_deltas=deltas, **kw))
        with atomic_file(out / "ablations.html") as fh:
            fh.write(render_html(rows, title, [], ablation_deltas=deltas, **kw))
        return
    rows = comparison_rows("metrics", params["methods"])
    title = f"XMC comparison on {name} (test split)"
    # training curves come from the live records of the runs behind the rows (plots/train/<run>/, written by
    # their training stages, which are upstream of these rows' metrics)
    page = render_figures([r["method"] for r in rows], Path("plots") / "eval", Path("plots") / "train",
                          out / "figures", rep["training_families"], {r["method"]: r for r in rows})
    images = [f"figures/{i['file']}" for i in page["curves"]]
    write_json(out / "paired.json", paired)
    with atomic_file(out / "comparison.md") as fh:
        fh.write(render_markdown(rows, title, **kw))
    with atomic_file(out / "comparison.html") as fh:
        fh.write(render_html(rows, title, images, plots_page="plots.html", **kw))
    with atomic_file(out / "plots.html") as fh:
        fh.write(render_plots_page(page, f"Figures: {title}"))


if __name__ == "__main__":
    run_entry_point(main)
