"""Build the comparison table from metrics/<method>.json files."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from xmc.io import read_json

COLUMNS = ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@10", "R@100", "unseen_R@100", "train_seconds", "predict_seconds"]
HEADERS = {"unseen_R@100": "unseen R@100", "train_seconds": "train s", "predict_seconds": "predict s"}


def comparison_rows(metrics_dir: str | Path, methods: list[str]) -> list[dict[str, Any]]:
    rows = []
    for m in methods:
        f = Path(metrics_dir) / f"{m}.json"
        if f.exists():
            rows.append({"method": m, **read_json(f)})
    return rows


def _fmt(v: Any, col: str) -> str:
    if v is None:
        return "–"
    if col.endswith("seconds"):
        return f"{v:.1f}"
    return f"{v:.1f}" if isinstance(v, float | int) else str(v)


def render_markdown(rows: list[dict[str, Any]], title: str = "") -> str:
    head = ["method"] + [HEADERS.get(c, c) for c in COLUMNS]
    lines = [f"## {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["method"]] + [_fmt(r.get(c), c) for c in COLUMNS]) + " |")
    return "\n".join(lines) + "\n"


def render_html(rows: list[dict[str, Any]], title: str, images: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["method"] + [HEADERS.get(c, c) for c in COLUMNS])
    body = "".join(
        "<tr><td>" + html.escape(r["method"]) + "</td>" + "".join(f"<td>{_fmt(r.get(c), c)}</td>" for c in COLUMNS) + "</tr>"
        for r in rows)
    imgs = "".join(f"<p><img src='{html.escape(i)}' alt='{html.escape(i)}'></p>" for i in images)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><table><tr>{head}</tr>{body}</table>"
            "<p>Percentages on the test split; PSP with propensity A/B from params.yaml; unseen R@100 = recall@100 "
            "over test (instance, label) pairs whose label never occurs in training.</p>"
            f"{imgs}</body></html>")


def render_plots(rows: list[dict[str, Any]], plots_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Grouped bar charts across methods; returns file names written into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
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
