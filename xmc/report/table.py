"""Build the comparison tables from metrics/<method>.json and evaluation/{tst,ablations}/<method>.npz.

Three tables: the methods with 95 % bootstrap intervals, the spread over training seeds, and
paired bootstrap tests between chosen pairs of methods (same test instances, same resamples).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmc.io import read_json
from xmc.metrics.bootstrap import InstanceContributions, paired_bootstrap, verdict

COLUMNS = ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@10", "R@100", "unseen_R@100", "train_seconds", "predict_seconds"]
HEADERS = {"unseen_R@100": "unseen R@100", "train_seconds": "train s", "predict_seconds": "predict s"}
SEED_METRICS = ["P@1", "P@5", "PSP@5", "R@100"]
PAIRED_METRICS = ["P@1", "P@5", "PSP@5", "R@100"]

_CSS = ("body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin:0.5em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".ci{color:#777;font-size:85%}.note{color:#444;max-width:60em}")


def comparison_rows(metrics_dir: str | Path, methods: list[str]) -> list[dict[str, Any]]:
    """One dict per method whose metrics file exists, in the given order."""
    rows = []
    for m in methods:
        f = Path(metrics_dir) / f"{m}.json"
        if f.exists():
            rows.append({"method": m, **read_json(f)})
    return rows


def seed_rows(metrics_dir: str | Path | Sequence[str | Path], seeds: dict[str, list[str]] | None,
              metrics: list[str] = SEED_METRICS) -> list[dict[str, Any]]:
    """Mean and sample sd (ddof = 1) over a base run and its extra-seed runs; missing runs are skipped.
    ``metrics_dir``: one folder or several, searched in order for ``<run>.json`` (the base runs' metrics/ and
    the extra seeds' seeds/metrics/).

    A base run without a metrics file gives no row. ``sd`` is None with a single seed found.
    """
    dirs = [Path(metrics_dir)] if isinstance(metrics_dir, str | Path) else [Path(d) for d in metrics_dir]

    def find(run: str) -> Path | None:
        return next((d / f"{run}.json" for d in dirs if (d / f"{run}.json").exists()), None)

    out = []
    for base, extra in (seeds or {}).items():
        runs = [base] + list(extra or [])
        found = {r: read_json(f) for r in runs if (f := find(r)) is not None}
        if base not in found:
            continue
        row: dict[str, Any] = {"base": base, "runs": list(found), "n_found": len(found), "n_runs": len(runs)}
        for m in metrics:
            vals = np.array([found[r][m] for r in found if found[r].get(m) is not None], dtype=np.float64)
            row[m] = {"mean": round(float(vals.mean()), 4) if len(vals) else None,
                      "sd": round(float(vals.std(ddof=1)), 4) if len(vals) > 1 else None}
        out.append(row)
    return out


def paired_comparisons(
    pairs: list[list[str]] | None,
    contrib_dirs: list[str | Path] | tuple[str | Path, ...] = ("evaluation/tst",),
    metrics: list[str] = PAIRED_METRICS,
    alpha: float = 0.05,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Paired bootstrap a - b on every metric of every pair whose two contribution files exist.

    A run's contributions are ``<dir>/<run>.npz`` in the first of ``contrib_dirs`` holding one (the
    ablation report pairs a main run, evaluation/tst, with an ablation, evaluation/ablations).
    Returns the result rows and one note per pair left out (so the report says why it is absent).
    """
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for pair in pairs or []:
        a, b = (str(x) for x in pair)
        found = {r: [Path(d) / f"{r}.npz" for d in contrib_dirs if (Path(d) / f"{r}.npz").exists()] for r in (a, b)}
        missing = [r for r, f in found.items() if not f]
        if missing:
            where = " or ".join(str(Path(d) / "<run>.npz") for d in contrib_dirs)
            skipped.append(f"{a} vs {b}: no test contributions for {', '.join(missing)} ({where})")
            continue
        ca, cb = (InstanceContributions.load(found[r][0]) for r in (a, b))
        if ca.n != cb.n:
            skipped.append(f"{a} vs {b}: evaluated on {ca.n} and {cb.n} instances (stale evaluation?)")
            continue
        for m in metrics:
            if m not in ca.names or m not in cb.names:
                continue
            r = paired_bootstrap(ca, cb, m, n_resamples=n_resamples, seed=seed, level=level)
            v = verdict(r["p_value"], r["diff"], alpha)
            rows.append({"a": a, "b": b, "metric": m, "a_value": r["a"], "b_value": r["b"], "diff": r["diff"],
                         "ci95": r["ci95"], "p_value": r["p_value"], "verdict": v.lower(),
                         "better": {"A better": a, "B better": b}.get(v), "alpha": alpha, "n": r["n"],
                         "n_resamples": r["n_resamples"], "seed": r["seed"], "level": r["level"]})
    return rows, skipped


def _fmt(v: Any, col: str) -> str:
    if v is None:
        return "–"
    if col.endswith("seconds"):
        return f"{v:.1f}"
    return f"{v:.1f}" if isinstance(v, float | int) else str(v)


def _ci(r: dict[str, Any], col: str) -> list[float] | None:
    ci = (r.get("ci95") or {}).get(col)
    return ci if ci is not None and r.get(col) is not None else None


def _cell_md(r: dict[str, Any], col: str) -> str:
    ci = _ci(r, col)
    return _fmt(r.get(col), col) + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def _cell_html(r: dict[str, Any], col: str) -> str:
    ci = _ci(r, col)
    return html.escape(_fmt(r.get(col), col)) + (f" <span class='ci'>[{ci[0]:.1f}, {ci[1]:.1f}]</span>" if ci else "")


def _mean_sd(d: dict[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "–"
    return f"{d['mean']:.1f} ± {d['sd']:.1f}" if d.get("sd") is not None else f"{d['mean']:.1f} (one seed)"


def interval_note(rows: list[dict[str, Any]], bootstrap: dict[str, Any] | None) -> str:
    """The sentence under the table saying what the intervals are."""
    if not bootstrap or not any(r.get("ci95") for r in rows):
        return ""
    n = next((r["n_test"] for r in rows if "n_test" in r), None)
    over = f"the {n} test instances" if n is not None else "test instances"
    lvl = f"{100 * float(bootstrap['level']):g} %"
    return (f"Cells: value [{lvl} interval]. Intervals are {lvl} percentile bootstrap intervals over {over} "
            f"(B = {bootstrap['n_resamples']} resamples, seed {bootstrap['seed']}).")


def _seed_note(seeds: list[dict[str, Any]]) -> str:
    found = ", ".join(f"{s['base']}: {s['n_found']} of {s['n_runs']} runs found" for s in seeds)
    return f"Mean ± sample sd (ddof = 1) over training seeds; {found}."


def _paired_note(paired: list[dict[str, Any]], alpha: float) -> str:
    if not paired:
        return ""
    p = paired[0]
    return (f"Paired bootstrap over the same {p['n']} test instances (B = {p['n_resamples']}, seed {p['seed']}): "
            f"diff = a − b with its {100 * p['level']:g} % interval; two-sided p from the centred bootstrap; "
            f"verdict at α = {alpha:g}.")


def _verdict_text(p: dict[str, Any]) -> str:
    return f"{p['better']} better" if p.get("better") else "tie"


def render_markdown(rows: list[dict[str, Any]], title: str = "", bootstrap: dict[str, Any] | None = None,
                    seeds: list[dict[str, Any]] | None = None, paired: list[dict[str, Any]] | None = None,
                    alpha: float = 0.05, skipped: list[str] | None = None) -> str:
    """Markdown report: the methods table (with intervals), then seed variation and paired tests if any."""
    head = ["method"] + [HEADERS.get(c, c) for c in COLUMNS]
    lines = [f"## {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["method"]] + [_cell_md(r, c) for c in COLUMNS]) + " |")
    note = interval_note(rows, bootstrap)
    if note:
        lines += ["", note]
    if seeds:
        lines += ["", "### Seed variation", "", "| run | seeds | " + " | ".join(SEED_METRICS) + " |",
                  "|" + "---|" * (2 + len(SEED_METRICS))]
        for s in seeds:
            cells = [s["base"], str(s["n_found"])] + [_mean_sd(s.get(m)) for m in SEED_METRICS]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", _seed_note(seeds)]
    if paired or skipped:
        lines += ["", "### Paired comparisons", ""]
    if paired:
        lines += ["| a | b | metric | a (%) | b (%) | a − b [95 % CI] | p | verdict |", "|" + "---|" * 8]
        for p in paired:
            lines.append(f"| {p['a']} | {p['b']} | {p['metric']} | {p['a_value']:.1f} | {p['b_value']:.1f} | "
                         f"{p['diff']:+.2f} [{p['ci95'][0]:.2f}, {p['ci95'][1]:.2f}] | {p['p_value']:.3f} | "
                         f"{_verdict_text(p)} |")
        lines += ["", _paired_note(paired, alpha)]
    if skipped:
        lines.append("")
    for s in skipped or []:
        lines.append(f"- not compared: {s}")
    return "\n".join(lines) + "\n"


def _html_table(head: list[str], body: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{th}</tr>{trs}</table>"


def render_html(rows: list[dict[str, Any]], title: str, images: list[str], bootstrap: dict[str, Any] | None = None,
                seeds: list[dict[str, Any]] | None = None, paired: list[dict[str, Any]] | None = None,
                alpha: float = 0.05, skipped: list[str] | None = None) -> str:
    """The same content as :func:`render_markdown` as one self-contained HTML page (inline CSS only)."""
    e = html.escape
    parts = [_html_table(["method"] + [HEADERS.get(c, c) for c in COLUMNS],
                         [[e(r["method"])] + [_cell_html(r, c) for c in COLUMNS] for r in rows])]
    note = interval_note(rows, bootstrap)
    if note:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts.append("<p class='note'>Percentages on the test split; PSP with propensity A/B from params.yaml; "
                 "unseen R@100 = recall@100 over test (instance, label) pairs whose label never occurs in training.</p>")
    if seeds:
        parts.append("<h2>Seed variation</h2>")
        parts.append(_html_table(["run", "seeds"] + SEED_METRICS,
                                 [[e(s["base"]), str(s["n_found"])] + [e(_mean_sd(s.get(m))) for m in SEED_METRICS]
                                  for s in seeds]))
        parts.append(f"<p class='note'>{e(_seed_note(seeds))}</p>")
    if paired or skipped:
        parts.append("<h2>Paired comparisons</h2>")
    if paired:
        parts.append(_html_table(
            ["a", "b", "metric", "a (%)", "b (%)", "a − b [95 % CI]", "p", "verdict"],
            [[e(p["a"]), e(p["b"]), e(p["metric"]), f"{p['a_value']:.1f}", f"{p['b_value']:.1f}",
              f"{p['diff']:+.2f} <span class='ci'>[{p['ci95'][0]:.2f}, {p['ci95'][1]:.2f}]</span>",
              f"{p['p_value']:.3f}", e(_verdict_text(p))] for p in paired]))
        parts.append(f"<p class='note'>{e(_paired_note(paired, alpha))}</p>")
    if skipped:
        parts.append("<ul>" + "".join(f"<li>not compared: {e(s)}</li>" for s in skipped) + "</ul>")
    imgs = "".join(f"<p><img src='{e(i)}' alt='{e(i)}'></p>" for i in images)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style></head>"
            f"<body><h1>{e(title)}</h1>{''.join(parts)}{imgs}</body></html>")


def render_plots(rows: list[dict[str, Any]], plots_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Grouped bar charts across methods; returns file names written into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    if not rows:
        return written
    names = [r["method"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, prefix in zip(axes, ("P", "PSP")):
        ks = [1, 3, 5]
        w = 0.8 / len(rows)
        for i, r in enumerate(rows):
            ax.bar(np.arange(len(ks)) + i * w, [r.get(f"{prefix}@{k}", 0) for k in ks], w, label=r["method"])
        ax.set_xticks(np.arange(len(ks)) + 0.4 - w / 2, [f"{prefix}@{k}" for k in ks])
        ax.set_ylabel("%")
    axes[1].legend(fontsize=7, loc="upper right")
    fig.suptitle("Precision and propensity-scored precision at k")
    fig.tight_layout()
    fig.savefig(out_dir / "precision_at_k.png", dpi=90)
    plt.close(fig)
    written.append("precision_at_k.png")

    fig, ax = plt.subplots(figsize=(11, 3.6))
    buckets = None
    for i, m in enumerate(names):
        f = Path(plots_dir) / m / "recall_by_frequency.json"
        if not f.exists():
            continue
        data = read_json(f)
        buckets = [d["bucket"] for d in data]
        w = 0.8 / len(names)
        ax.bar(np.arange(len(data)) + i * w, [d["recall"] for d in data], w, label=m)
    if buckets:
        ax.set_xticks(np.arange(len(buckets)) + 0.4 - 0.4 / len(names), buckets)
    ax.set_xlabel("training occurrences of the label")
    ax.set_ylabel("recall@100 (%)")
    ax.set_title("Recall@100 by label frequency")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "recall_by_frequency.png", dpi=90)
    plt.close(fig)
    written.append("recall_by_frequency.png")
    return written
