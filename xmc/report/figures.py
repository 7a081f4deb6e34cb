"""The report's pictures, rendered to PNG (no browser, no CDN) and gathered in ``reports/plots.html``.

* P@k and R@k for k = 1..100 of every method (``plots/eval/<method>/at_k.json``);
* recall@100 by the label's training frequency (``plots/eval/<method>/recall_by_frequency.json``);
* training curves overlaid per method family, from each run's live record (``plots/train/<run>/plots/metrics``,
  written by DVCLive while the run trained): loss and validation P@5 over the training step.

Thirty lines in one axes cannot be told apart, so the curves are small multiples, one panel per group of rows
(:func:`group_styles`): the baselines and peers in greys, the five papers' methods (DEXML, MACLR, RAMEN, UniDEC,
ASTRA) each in its own colour of the Okabe–Ito palette (distinguishable with the common colour-vision
deficiencies), and their hybrids in the colour of their paper, dashed. The peers are drawn again, faint and
unlabelled, behind the other panels, so every panel reads against the same baselines.
"""

from __future__ import annotations

import csv
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xmc.io import read_json
from xmc.report.table import kind_of

OKABE_ITO = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
# the five papers' methods (method names of params ``runs``): one Okabe–Ito colour each, never a grey
PAPER_COLOURS = {"dexml": "#0072B2", "maclr": "#E69F00", "ramen": "#009E73", "unidec": "#CC79A7", "astra": "#D55E00"}
PEER_GREYS = ["#1a1a1a", "#5a5a5a", "#8c8c8c"]
CONTEXT_GREY = "#d0d0d0"   # the peers behind the other panels
# the panels of a curve figure: the groups of :func:`xmc.report.table.kind_of`
PANELS = (("peer", "Baselines and peers"), ("method", "The papers' methods"),
          ("hybrid", "With label-name candidates (hybrids)"))


def method_styles(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One distinct (colour, line style, marker) per name, in order: colours vary fastest."""
    out = {}
    for i, n in enumerate(names):
        out[n] = {"color": OKABE_ITO[i % len(OKABE_ITO)], "linestyle": LINESTYLES[(i // len(OKABE_ITO)) % len(LINESTYLES)],
                  "marker": MARKERS[(i // (len(OKABE_ITO) * len(LINESTYLES)) + i) % len(MARKERS)]}
    return out


def paper_of(name: str, method_of: dict[str, str] | None = None) -> str | None:
    """Which of the five papers a row belongs to (its run's method, a hybrid its base's), or None for a baseline or
    peer. ``method_of``: row -> method (the report's runs and hybrids); a row it lacks goes by its name's start
    (``dexml_bow`` -> dexml)."""
    if method_of and name in method_of:
        m = method_of[name]
        return m if m in PAPER_COLOURS else None
    return next((p for p in PAPER_COLOURS if name == p or name.startswith(p + "_")), None)


def group_styles(names: Sequence[str], method_of: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """One style per row: ``group`` (peer, method, hybrid: the panel), ``paper``, colour, line style, marker, width.

    A paper's first run is a thick solid line of its colour, another run of it (dexml_bow_epochs10) dash-dotted;
    its hybrids dashed, a second one (validation-tuned fusion) dotted. Baselines, peers and the hybrids of peers are greys
    told apart by marker and line style."""
    out: dict[str, dict[str, Any]] = {}
    seen: dict[tuple[str, str], int] = {}
    n_grey = 0
    for n in names:
        group, paper = kind_of(n), paper_of(n, method_of)
        if paper is None:
            out[n] = {"group": group, "paper": None, "color": PEER_GREYS[n_grey % len(PEER_GREYS)],
                      "linestyle": LINESTYLES[(n_grey // len(PEER_GREYS)) % len(LINESTYLES)],
                      "marker": MARKERS[n_grey % len(MARKERS)], "linewidth": 1.2}
            n_grey += 1
            continue
        i = seen[(paper, group)] = seen.get((paper, group), -1) + 1
        styles = (["-", "-.", ":"] if group != "hybrid" else ["--", ":", "-."])
        out[n] = {"group": group, "paper": paper, "color": PAPER_COLOURS[paper], "linestyle": styles[i % len(styles)],
                  "marker": MARKERS[list(PAPER_COLOURS).index(paper)], "linewidth": 2.2 if i == 0 else 1.5}
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


def _curve_rows(name: str, eval_dir: Path, field: str, metrics: dict[str, dict[str, Any]] | None) -> \
        list[dict[str, Any]]:
    f = eval_dir / name / "at_k.json"
    if f.is_file():
        return [r for r in read_json(f) if field in r]
    return _points((metrics or {}).get(name, {}), field)


def _panel_figure(series: dict[str, tuple[list[float], list[float]]], styles: dict[str, dict[str, Any]], out: Path,
                  xlabel: str, ylabel: str, title: str, xlog: bool = False,
                  xticks: list[str] | None = None) -> None:
    """One panel per group of rows that has a series (:data:`PANELS`), sharing the y axis; the peers faint behind
    the other panels; each panel's legend under it."""
    plt = _plt()
    panels = [(g, label) for g, label in PANELS if any(styles[n]["group"] == g for n in series)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 5.6), sharey=True, squeeze=False)
    peers = [n for n in series if styles[n]["group"] == "peer"]
    for ax, (group, label) in zip(axes[0], panels):
        if group != "peer":
            for n in peers:
                ax.plot(*series[n], color=CONTEXT_GREY, linewidth=0.9, zorder=1)
        for n in (n for n in series if styles[n]["group"] == group):
            st = styles[n]
            xs, ys = series[n]
            ax.plot(xs, ys, label=n, color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                    markevery=max(1, len(xs) // 8), markersize=4, linewidth=st.get("linewidth", 1.4), zorder=2)
        if xlog:
            ax.set_xscale("log")
        if xticks is not None:
            ax.set_xticks(range(len(xticks)), xticks, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if group != "peer" and peers:
            handles.append(plt.Line2D([], [], color=CONTEXT_GREY, linewidth=2))
            labels.append("baselines and peers (left panel)")
        # under the panel (thirty names would cover the lines); lower with the tilted bucket names
        below = -0.16 if xticks is None else -0.28
        ax.legend(handles, labels, fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, below), ncol=2, frameon=False)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


def curves_figure(names: Sequence[str], eval_dir: Path, out: Path, field: str, ylabel: str, title: str,
                  styles: dict[str, dict[str, Any]], metrics: dict[str, dict[str, Any]] | None = None) -> bool:
    """One line per method over k = 1..K from ``at_k.json`` (else the points of its metrics), one panel per group
    of rows (``styles``: :func:`group_styles`)."""
    series = {}
    for n in names:
        rows = _curve_rows(n, eval_dir, field, metrics)
        if rows:
            series[n] = ([r["k"] for r in rows], [r[field] for r in rows])
    if not series:
        return False
    _panel_figure(series, styles, out, "k (log scale)", ylabel, title, xlog=True)
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
    """Recall@100 per training-frequency bucket, one line per method (buckets in their natural order), one panel
    per group of rows; returns the table behind it (method -> bucket -> recall) for the page."""
    table: list[dict[str, Any]] = []
    series: dict[str, tuple[list[float], list[float]]] = {}
    buckets: list[str] = []
    for n in names:
        f = eval_dir / n / "recall_by_frequency.json"
        if not f.is_file():
            continue
        data = read_json(f)
        buckets = [d["bucket"] for d in data]
        series[n] = (list(range(len(data))), [d["recall"] for d in data])
        table.append({"method": n, **{d["bucket"]: d["recall"] for d in data},
                      "_pairs": {d["bucket"]: d["test_pairs"] for d in data}})
    if not table:
        return table
    _panel_figure(series, styles, out, "training instances of the label",
                  "R@100 (%) of the test pairs of those labels", "Recall@100 by the label's training frequency",
                  xticks=buckets)
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
            ax_l.plot(xs, _smooth(ys, max(1, len(ys) // 50)), label=label, color=st["color"], linestyle=ls,
                      linewidth=st.get("linewidth", 1.2))
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
                   families: dict[str, list[str]], metrics: dict[str, dict[str, Any]] | None = None,
                   method_of: dict[str, str] | None = None) -> dict[str, Any]:
    """Every figure of the report into ``out_dir``; returns what the plots page shows (titles, files, tables).
    ``method_of``: row -> its method (a hybrid's: its base run's), which paper's colour it is drawn in."""
    eval_dir, train_dir, out_dir = Path(eval_dir), Path(train_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    styles = group_styles(list(names) + [r for rs in families.values() for r in rs if r not in names], method_of)
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
    css = ("body{font-family:system-ui,sans-serif;margin:1em auto;padding:0 1em;max-width:1360px}"
           "img{max-width:100%;border:1px solid #ddd}.wrap{max-width:100%;overflow-x:auto}"
           "table{border-collapse:collapse;margin:0.5em 0;font-size:13px}"
           "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
           "td:first-child,th:first-child{text-align:left}.note{color:#444;max-width:60em}")
    parts = [f"<h1>{e(title)}</h1>", "<p class='note'>Static pictures rendered by the report stage (no script, no "
             "network): every curve of every row, and the training records. <code>dvc plots show</code> draws only a "
             "few chosen curves (dvc.yaml <code>plots:</code>) and needs the network to load Vega. Back to the "
             "<a href='comparison.html'>comparison</a>.</p>",
             "<p class='note'>One panel per group of rows: the baselines and peers in greys (drawn again, faint, "
             "behind the other panels); each of the five papers' methods (DEXML, MACLR, RAMEN, UniDEC, ASTRA) in its "
             "own colour, solid (another run of it dash-dotted); its hybrids in the same colour, dashed (a second "
             "hybrid, such as the validation-tuned fusion, dotted). The frequency table's rows are every row's.</p>"]
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
            parts.append(f"<div class='wrap'><table><tr><th>method</th>{head}</tr>{body}</table></div>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{css}</style></head>"
            f"<body>{''.join(parts)}</body></html>")
