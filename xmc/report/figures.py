"""The report's pictures, rendered to PNG (no browser, no CDN) and gathered in ``reports/plots.html``.

* P@k and R@k for k = 1..100 of every method (``plots/eval/<method>/at_k.json``);
* recall@100 by the label's training frequency (``plots/eval/<method>/recall_by_frequency.json``);
* training curves overlaid per method family, from each run's live record (``plots/train/<run>/plots/metrics``,
  written by DVCLive while the run trained): loss and validation P@5 over the training step.

Every method keeps one style across figures: a colour of the Okabe–Ito palette (distinguishable with the
common colour-vision deficiencies) combined with a line style and a marker, so 30+ methods stay distinct.
"""

from __future__ import annotations

import csv
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xmc.io import read_json

OKABE_ITO = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def method_styles(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One distinct (colour, line style, marker) per name, in order: colours vary fastest."""
    out = {}
    for i, n in enumerate(names):
        out[n] = {"color": OKABE_ITO[i % len(OKABE_ITO)], "linestyle": LINESTYLES[(i // len(OKABE_ITO)) % len(LINESTYLES)],
                  "marker": MARKERS[(i // (len(OKABE_ITO) * len(LINESTYLES)) + i) % len(MARKERS)]}
    return out


def _plt() -> Any:
    # imported here: pyplot must follow the choice of the Agg backend, a process-wide setting made when a figure is
    # drawn (on import it would be a side effect on every importer)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_tsv_series(path: Path, field: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one DVCLive metric history (``step<TAB>...<TAB><field>``)."""
    xs, ys = [], []
    with open(path, encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            if row.get(field) not in (None, ""):
                xs.append(float(row["step"]))
                ys.append(float(row[field]))
    return xs, ys


def _points(metrics: dict[str, Any], field: str) -> list[dict[str, Any]]:
    """The k where a metrics file has the value (P@k or R@k), for a method evaluated before the curves existed."""
    prefix = {"precision": "P@", "recall": "R@"}[field]
    ks = sorted(int(k[len(prefix):]) for k in metrics if k.startswith(prefix) and k[len(prefix):].isdigit())
    return [{"k": k, field: metrics[f"{prefix}{k}"]} for k in ks if isinstance(metrics[f"{prefix}{k}"], int | float)]


def curves_figure(names: Sequence[str], eval_dir: Path, out: Path, field: str, ylabel: str, title: str,
                  styles: dict[str, dict[str, Any]], metrics: dict[str, dict[str, Any]] | None = None) -> bool:
    """One line per method over k = 1..K from ``at_k.json`` (else the points of its metrics); legend outside."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 5.2))
    drawn = 0
    for n in names:
        f = eval_dir / n / "at_k.json"
        if f.is_file():
            rows = [r for r in read_json(f) if field in r]
        else:
            rows = _points((metrics or {}).get(n, {}), field)
        if not rows:
            continue
        st = styles[n]
        ax.plot([r["k"] for r in rows], [r[field] for r in rows], label=n, color=st["color"], linestyle=st["linestyle"],
                marker=st["marker"], markevery=max(1, len(rows) // 8), markersize=4, linewidth=1.4)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xscale("log")
    _finish(fig, ax, out, "k (log scale)", ylabel, title)
    return True


def _finish(fig: Any, ax: Any, out: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, grid, the legend outside the axes (30+ methods would cover the lines), saved and closed."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    _plt().close(fig)


def frequency_figure(names: Sequence[str], eval_dir: Path, out: Path, styles: dict[str, dict[str, Any]]) -> \
        list[dict[str, Any]]:
    """Recall@100 per training-frequency bucket, one line per method (buckets in their natural order); returns
    the table behind it (method -> bucket -> recall) for the page."""
    plt = _plt()
    table: list[dict[str, Any]] = []
    fig, ax = plt.subplots(figsize=(10, 5.2))
    buckets: list[str] = []
    for n in names:
        f = eval_dir / n / "recall_by_frequency.json"
        if not f.is_file():
            continue
        data = read_json(f)
        buckets = [d["bucket"] for d in data]
        st = styles[n]
        ax.plot(range(len(data)), [d["recall"] for d in data], label=n, color=st["color"], linestyle=st["linestyle"],
                marker=st["marker"], markersize=4, linewidth=1.2)
        table.append({"method": n, **{d["bucket"]: d["recall"] for d in data},
                      "_pairs": {d["bucket"]: d["test_pairs"] for d in data}})
    if not table:
        plt.close(fig)
        return table
    ax.set_xticks(range(len(buckets)), buckets)
    _finish(fig, ax, out, "training instances of the label", "R@100 (%) of the test pairs of those labels",
            "Recall@100 by the label's training frequency")
    return table


def _smooth(ys: list[float], window: int) -> list[float]:
    if window <= 1 or len(ys) < window:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def training_figure(family: str, runs: Sequence[str], train_dir: Path, out: Path,
                    styles: dict[str, dict[str, Any]]) -> bool:
    """Loss (moving average over ~2 % of the steps) and validation P@5 over the step, one line per run (and per
    stage of a multi-stage run such as MACLR)."""
    plt = _plt()
    fig, (ax_l, ax_v) = plt.subplots(1, 2, figsize=(12, 4.2))
    drawn = 0
    for run in runs:
        metrics = train_dir / run / "plots" / "metrics"
        if not metrics.is_dir():
            continue
        st = styles.get(run, {"color": "#000000", "linestyle": "-", "marker": "o"})
        # one loss history per stage of the run (MACLR: stage1/train, stage2/train): solid, then dashed, dotted
        for i, loss in enumerate(sorted(metrics.glob("**/loss.tsv"))):
            xs, ys = read_tsv_series(loss, "loss")
            part = loss.parent.relative_to(metrics).as_posix().removesuffix("/train")
            label = run if part in ("train", ".") else f"{run} ({part})"
            alts = [x for x in LINESTYLES if x != st["linestyle"]]
            ls = st["linestyle"] if i == 0 else alts[(i - 1) % len(alts)]
            ax_l.plot(xs, _smooth(ys, max(1, len(ys) // 50)), label=label, color=st["color"], linestyle=ls, linewidth=1.2)
            drawn += 1
        for val in sorted(metrics.glob("**/val/P@5.tsv")):
            xs, ys = read_tsv_series(val, "P@5")
            ax_v.plot(xs, ys, label=run, color=st["color"], linestyle=st["linestyle"], marker=st["marker"], markersize=4)
    if not drawn:
        plt.close(fig)
        return False
    ax_l.set_title(f"Training loss: {family}")
    ax_l.set_xlabel("training step")
    ax_l.set_ylabel("loss (moving average)")
    ax_v.set_title("Validation P@5 at the end of each epoch")
    ax_v.set_xlabel("training step")
    ax_v.set_ylabel("P@5 (%), validation split")
    for ax in (ax_l, ax_v):
        ax.grid(True, alpha=0.3)
    ax_l.legend(fontsize=7, frameon=False)
    if ax_v.lines:
        ax_v.legend(fontsize=7, frameon=False)
    else:
        ax_v.text(0.5, 0.5, "no per-epoch validation in these runs", ha="center", va="center", transform=ax_v.transAxes)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def render_figures(names: Sequence[str], eval_dir: str | Path, train_dir: str | Path, out_dir: str | Path,
                   families: dict[str, list[str]], metrics: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every figure of the report into ``out_dir``; returns what the plots page shows (titles, files, tables)."""
    eval_dir, train_dir, out_dir = Path(eval_dir), Path(train_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    styles = method_styles(list(names) + [r for rs in families.values() for r in rs if r not in names])
    page: dict[str, Any] = {"curves": [], "frequency": None, "frequency_table": [], "training": []}
    for field, label, file in (("precision", "P@k (%)", "precision_at_k.png"), ("recall", "R@k (%)", "recall_at_k.png")):
        title = f"{label.split(' ')[0]} of every method, k = 1..100 (test split)"
        if curves_figure(names, eval_dir, out_dir / file, field, label, title, styles, metrics):
            page["curves"].append({"title": title, "file": file})
    table = frequency_figure(names, eval_dir, out_dir / "recall_by_frequency.png", styles)
    if table:
        page["frequency"] = {"title": "Recall@100 by the label's training frequency", "file": "recall_by_frequency.png"}
        page["frequency_table"] = table
    for i, (family, runs) in enumerate(families.items()):
        file = f"training_{i + 1}.png"
        if training_figure(family, runs, train_dir, out_dir / file, styles):
            page["training"].append({"title": f"Training: {family}", "file": file, "runs": list(runs)})
    return page


def render_plots_page(page: dict[str, Any], title: str, figures_prefix: str = "figures/") -> str:
    """``reports/plots.html``: every figure as a static image, and the frequency table behind its figure."""
    e = html.escape
    css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}img{max-width:100%;border:1px solid #ddd}"
           "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
           "td:first-child,th:first-child{text-align:left}.note{color:#444;max-width:60em}")
    parts = [f"<h1>{e(title)}</h1>", "<p class='note'>Static pictures rendered by the report stage (no script, no "
             "network): the same data as <code>dvc plots show</code>. Back to the <a href='comparison.html'>comparison"
             "</a>.</p>"]
    for sec, items in (("Precision and recall at k", page["curves"]),
                       ("Recall by label frequency", [page["frequency"]] if page["frequency"] else []),
                       ("Training curves per method family", page["training"])):
        if not items:
            continue
        parts.append(f"<h2>{e(sec)}</h2>")
        for it in items:
            parts.append(f"<h3>{e(it['title'])}</h3><p><img src='{e(figures_prefix + it['file'])}' "
                         f"alt='{e(it['title'])}'></p>")
        if sec == "Recall by label frequency" and page["frequency_table"]:
            buckets = [k for k in page["frequency_table"][0] if k not in ("method", "_pairs")]
            pairs = page["frequency_table"][0]["_pairs"]
            head = "".join(f"<th>{e(b)}<br><small>{pairs.get(b, '')} pairs</small></th>" for b in buckets)
            best = {b: max((r.get(b) or 0.0) for r in page["frequency_table"]) for b in buckets}
            body = "".join(
                "<tr><td>" + e(r["method"]) + "</td>" + "".join(
                    f"<td>{'<b>' if (r.get(b) or 0.0) == best[b] and best[b] > 0 else ''}{(r.get(b) or 0.0):.1f}"
                    f"{'</b>' if (r.get(b) or 0.0) == best[b] and best[b] > 0 else ''}</td>" for b in buckets) + "</tr>"
                for r in page["frequency_table"])
            parts.append("<p class='note'>R@100 (%) of the test (instance, label) pairs whose label has that many "
                         "training instances; best per column in bold.</p>")
            parts.append(f"<table><tr><th>method</th>{head}</tr>{body}</table>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{css}</style></head>"
            f"<body>{''.join(parts)}</body></html>")
