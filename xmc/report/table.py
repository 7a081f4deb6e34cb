"""Build the comparison tables from metrics/<method>.json and evaluation/{tst,ablations}/<method>.npz.

Three tables: the methods with 95 % bootstrap intervals, the spread over training seeds, and
paired bootstrap tests between chosen pairs of methods (same test instances, same resamples).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xmc.io import read_json
from xmc.metrics.bootstrap import (InstanceContributions, holm_adjusted, paired_bootstrap, seed_bootstrap_intervals,
                                   verdict)

COLUMNS = ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@10", "R@100", "unseen_R@100", "train_seconds", "predict_seconds"]
HEADERS = {"unseen_R@100": "unseen R@100", "train_seconds": "train s", "predict_seconds": "predict s"}
SEED_METRICS = ["P@1", "P@5", "PSP@5", "R@100"]
PAIRED_METRICS = ["P@1", "P@5", "PSP@5", "R@100"]

# A laptop screen (about 1280-1400 px): the page is at most 1360 px wide, each table scrolls sideways inside its
# own box (the method column stays in view) instead of widening the page, an interval sits under its value in a
# smaller font, texts wrap, and the long tables (paired tests, texts by name match) are collapsed sections.
_CSS = ("body{font-family:system-ui,sans-serif;margin:1em auto;padding:0 1em;max-width:1360px;line-height:1.35}"
        ".wrap{max-width:100%;overflow-x:auto;margin:0.5em 0}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top}"
        "th{background:#f7f7f7;font-weight:600}"
        "td:first-child,th:first-child{text-align:left;position:sticky;left:0;z-index:1;background:#fff;"
        "white-space:nowrap}th:first-child{background:#f7f7f7}"
        "td{white-space:nowrap}td.text{white-space:normal;text-align:left;color:#555;min-width:9em;max-width:15em}"
        "th.text{text-align:left}"
        ".ci{display:block;color:#777;font-size:80%;font-weight:normal}.note{color:#444;max-width:60em}"
        "td.best{background:#e8f4ea;font-weight:bold}tr.group td{background:#f4f4f4;font-weight:bold;text-align:left}"
        "details{margin:0.8em 0}summary{cursor:pointer;font-size:1.1em;font-weight:600}img{max-width:100%}")
# columns where the largest value is the best (time columns are not marked)
BEST_COLUMNS = [c for c in COLUMNS if not c.endswith("seconds")]
# runs that are not one of the five papers' methods: baselines and published peers measured in the same pipeline
PEERS = {"label_prior", "tfidf_zeroshot", "tfidf_knn", "xr_linear", "name_match", "name_match_prior",
         "name_match_uncased", "minilm_zeroshot", "st_mnrl"}


def kind_of(method: str) -> str:
    """How a row came about: ``peer`` (baseline / published peer), ``hybrid`` (a run + label-name candidates), or
    ``method`` (one of the papers' methods)."""
    if method.endswith("_hybrid"):
        return "hybrid"
    return "peer" if method in PEERS or method.startswith("xr_linear_") else "method"


def supervision(reads: tuple[str, ...], fusion: str | None, tuned_here: bool) -> str:
    """What labelled pairs of this dataset a row used, in words: ``reads`` = the labelled splits its (base) run's
    training read; ``fusion`` = ``trained`` | ``valtuned`` for a hybrid; ``tuned_here`` = this dataset's labelled
    validation chose the default settings."""
    if "trn" in reads:
        base = "training pairs"
    elif "val" in reads:
        base = "validation pairs"
    else:
        base = "none; defaults chosen on its validation" if tuned_here else "none (zero-shot)"
    if fusion == "trained":   # the trained fusion reads the training split's label counts and name precisions
        return base + "; fusion fit on validation" if "trn" in reads \
            else "training label statistics (the fusion's); fusion fit on validation"
    if fusion == "valtuned":
        return base + "; fusion fit on labelled validation" if "trn" in reads \
            else "no training pairs; fusion fit on labelled validation"
    return base


def best_per_column(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The best (largest) value of each metric column over the rows (ties: every row holding it is marked)."""
    out = {}
    for c in BEST_COLUMNS:
        vals = [r[c] for r in rows if isinstance(r.get(c), int | float)]
        if vals:
            out[c] = max(vals)
    return out


def comparison_rows(metrics_dir: str | Path, methods: list[str]) -> list[dict[str, Any]]:
    """One dict per method whose metrics file exists, in the given order."""
    rows = []
    for m in methods:
        f = Path(metrics_dir) / f"{m}.json"
        if f.exists():
            rows.append({"method": m, **read_json(f)})
    return rows


def seed_rows(metrics_dir: str | Path | Sequence[str | Path], seeds: dict[str, list[str]] | None,
              metrics: list[str] = SEED_METRICS, contribution_dirs: Sequence[str | Path] | None = None,
              bootstrap: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Mean and sample sd (ddof = 1) over a base run and its extra-seed runs; missing runs are skipped.
    ``metrics_dir``: one folder or several, searched in order for ``<run>.json`` (the base runs' metrics/ and
    the extra seeds' seeds/metrics/). With ``contribution_dirs`` (where ``<run>.npz`` test contributions are) and
    ``bootstrap`` settings, each metric also gets ``ci95``: the interval of a run with a random one of those seeds
    (:func:`seed_bootstrap_intervals`: documents and seeds resampled).

    A base run without a metrics file gives no row. ``sd`` is None with a single seed found.
    """
    dirs = [Path(metrics_dir)] if isinstance(metrics_dir, str | Path) else [Path(d) for d in metrics_dir]

    def find(run: str) -> Path | None:
        return next((d / f"{run}.json" for d in dirs if (d / f"{run}.json").exists()), None)

    def contributions(run: str) -> InstanceContributions | None:
        f = next((Path(d) / f"{run}.npz" for d in contribution_dirs or [] if (Path(d) / f"{run}.npz").exists()), None)
        return InstanceContributions.load(f) if f is not None else None

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
        runs_c = [c for r in found if (c := contributions(r)) is not None] if contribution_dirs and bootstrap else []
        if runs_c and len(runs_c) == len(found):
            ci = seed_bootstrap_intervals(runs_c, **bootstrap)
            for m in metrics:
                if m in ci:
                    row[m]["ci95"] = ci[m]
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
    unit: str = "documents",
) -> tuple[list[dict[str, Any]], list[str]]:
    """Paired bootstrap a - b on every metric of every pair whose two contribution files exist.

    A run's contributions are ``<dir>/<run>.npz`` in the first of ``contrib_dirs`` holding one (the
    ablation report pairs a main run, evaluation/tst, with an ablation, evaluation/ablations).
    Returns the result rows and one note per pair left out (so the report says why it is absent). The rows are
    one family of tests: each verdict reads its Holm-adjusted p (``p_holm``), ``p_value`` is the raw one.
    """
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    # Holm multiplies the smallest p by the family size, and a bootstrap p is at least 1 / (B + 1): enough
    # resamples that the smallest attainable corrected p is a tenth of alpha (60 tests at alpha 0.05: B >= 12,000)
    family = len(pairs or []) * len(metrics)
    n_resamples = max(int(n_resamples), math.ceil(10 * family / alpha))
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
            r = paired_bootstrap(ca, cb, m, n_resamples=n_resamples, seed=seed, level=level, unit=unit)
            rows.append({"a": a, "b": b, "metric": m, "a_value": r["a"], "b_value": r["b"], "diff": r["diff"],
                         "ci95": r["ci95"], "p_value": r["p_value"], "alpha": alpha, "n": r["n"], "unit": r["unit"],
                         "n_units": r["n_units"], "n_resamples": r["n_resamples"], "seed": r["seed"],
                         "level": r["level"]})
    # many tests in one report: a claim stands only after Holm's correction over all of them
    for row, p_holm in zip(rows, holm_adjusted([row["p_value"] for row in rows])):
        v = verdict(p_holm, row["diff"], alpha)
        row.update(p_holm=p_holm, verdict=v.lower(), better={"A better": row["a"], "B better": row["b"]}.get(v),
                   correction=f"holm over {len(rows)} tests")
    return rows, skipped


def _over(p: dict[str, Any], split: str = "test") -> str:
    """"the same 19 test documents (2097 instances)" or "the same 2097 test instances": what a paired test drew."""
    if p.get("unit") == "documents":
        return f"the same {p['n_units']} {split} documents ({p['n']} instances)"
    return f"the same {p['n']} {split} instances"


def _fmt(v: Any, col: str) -> str:
    if v is None:
        return "–"
    if col.endswith("seconds"):
        return f"{v:.1f}"
    return f"{v:.1f}" if isinstance(v, float | int) else str(v)


def _ci(r: dict[str, Any], col: str) -> list[float] | None:
    ci = (r.get("ci95") or {}).get(col)
    return ci if ci is not None and r.get(col) is not None else None


def _is_best(r: dict[str, Any], col: str, best: dict[str, float] | None) -> bool:
    return bool(best) and col in best and r.get(col) == best[col]


def _cell_md(r: dict[str, Any], col: str, best: dict[str, float] | None = None) -> str:
    ci = _ci(r, col)
    v = _fmt(r.get(col), col)
    return (f"**{v}**" if _is_best(r, col, best) else v) + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def _cell_html(r: dict[str, Any], col: str) -> str:
    """The value, and its interval on a line of its own under it (``.ci`` is a block: the column stays narrow)."""
    ci = _ci(r, col)
    return html.escape(_fmt(r.get(col), col)) + (f"<span class='ci'>[{ci[0]:.1f}, {ci[1]:.1f}]</span>" if ci else "")


def _mean_sd(d: dict[str, Any] | None) -> str:
    if not d or d.get("mean") is None:
        return "–"
    cell = f"{d['mean']:.1f} ± {d['sd']:.1f}" if d.get("sd") is not None else f"{d['mean']:.1f} (one seed)"
    return cell + (f" [{d['ci95'][0]:.1f}, {d['ci95'][1]:.1f}]" if d.get("ci95") else "")


def interval_note(rows: list[dict[str, Any]], bootstrap: dict[str, Any] | None) -> str:
    """The sentence under the table saying what the intervals are."""
    if not bootstrap or not any(r.get("ci95") for r in rows):
        return ""
    n = next((r["n_test"] for r in rows if "n_test" in r), None)
    docs = next((r["n_test_documents"] for r in rows if r.get("ci95_unit") == "documents"
                 and r.get("n_test_documents")), None)
    if docs is not None:
        over = f"the {docs} test documents ({n} instances; whole documents are drawn)"
    else:
        over = f"the {n} test instances" if n is not None else "test instances"
    lvl = f"{100 * float(bootstrap['level']):g} %"
    return (f"Cells: value [{lvl} interval]. Intervals are {lvl} percentile bootstrap intervals over {over} "
            f"(B = {bootstrap['n_resamples']} resamples, seed {bootstrap['seed']}).")


def _seed_note(seeds: list[dict[str, Any]]) -> str:
    found = ", ".join(f"{s['base']}: {s['n_found']} of {s['n_runs']} runs found" for s in seeds)
    ci = any(isinstance(v, dict) and v.get("ci95") for s in seeds for v in s.values())
    return (f"Mean ± sample sd (ddof = 1) over training seeds; {found}."
            + (" [interval]: 95 % bootstrap interval of one run with a random one of those seeds (each resample draws "
               "a seed and the documents)." if ci else ""))


def _paired_note(paired: list[dict[str, Any]], alpha: float) -> str:
    if not paired:
        return ""
    p = paired[0]
    return (f"Paired bootstrap over {_over(p)} (B = {p['n_resamples']}, seed {p['seed']}): "
            f"diff = a − b with its {100 * p['level']:g} % interval; two-sided p from the centred bootstrap; "
            f"the verdict reads Holm's adjusted p over the {len(paired)} tests of this report at α = {alpha:g} "
            "(tie: not significant after the correction).")


def _verdict_text(p: dict[str, Any]) -> str:
    return f"{p['better']} better" if p.get("better") else "tie"


def render_markdown(rows: list[dict[str, Any]], title: str = "", bootstrap: dict[str, Any] | None = None,
                    seeds: list[dict[str, Any]] | None = None, paired: list[dict[str, Any]] | None = None,
                    alpha: float = 0.05, skipped: list[str] | None = None,
                    ablation_deltas: list[dict[str, Any]] | None = None) -> str:
    """Markdown report: the methods table (with intervals), then seed variation and paired tests if any."""
    labelled = any("labelled_pairs" in r for r in rows)
    head = ["method", "kind"] + (["labelled pairs used"] if labelled else []) + [HEADERS.get(c, c) for c in COLUMNS]
    lines = [f"## {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best = best_per_column(rows)
    for r in rows:
        lines.append("| " + " | ".join([r["method"], kind_of(r["method"])]
                                       + ([r.get("labelled_pairs", "")] if labelled else [])
                                       + [_cell_md(r, c, best) for c in COLUMNS]) + " |")
    note = interval_note(rows, bootstrap)
    if note:
        lines += ["", note + " Bold: the best value of the column."]
    if seeds:
        lines += ["", "### Seed variation", "", "| run | seeds | " + " | ".join(SEED_METRICS) + " |",
                  "|" + "---|" * (2 + len(SEED_METRICS))]
        for s in seeds:
            cells = [s["base"], str(s["n_found"])] + [_mean_sd(s.get(m)) for m in SEED_METRICS]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", _seed_note(seeds)]
    lines += _name_match_lines(rows)
    if paired or skipped:
        lines += ["", "### Paired comparisons", ""]
    if paired:
        lines += ["| a | b | metric | a (%) | b (%) | a − b [95 % CI] | p | p (Holm) | verdict |", "|" + "---|" * 9]
        for p in paired:
            lines.append(f"| {p['a']} | {p['b']} | {p['metric']} | {p['a_value']:.1f} | {p['b_value']:.1f} | "
                         f"{p['diff']:+.2f} [{p['ci95'][0]:.2f}, {p['ci95'][1]:.2f}] | {p['p_value']:.3f} | "
                         f"{p['p_holm']:.3f} | {_verdict_text(p)} |")
        lines += ["", _paired_note(paired, alpha)]
    if skipped:
        lines.append("")
    for s in skipped or []:
        lines.append(f"- not compared: {s}")
    if ablation_deltas:
        lines += ["", "### Ablations: difference to their control", "",
                  "| ablation | control | " + " | ".join(f"Δ {m} [95 % CI]" for m in PAIRED_METRICS) + " | verdict (P@5) |",
                  "|" + "---|" * (3 + len(PAIRED_METRICS))]
        for d in ablation_deltas:
            cells = [_delta_cell(d, m) for m in PAIRED_METRICS]
            lines.append(f"| {d['ablation']} | {d['control']} | " + " | ".join(cells) + f" | {d['verdict']} |")
        lines += ["", _delta_note(ablation_deltas, alpha)]
    return "\n".join(lines) + "\n"


NAME_MATCH_HEAD = ["hybrid", "split", "texts with / without", "with: base → hybrid P@1",
                   "without: base → hybrid P@1", "without: hybrid − base P@1 [95 % CI]"]
NAME_MATCH_NOTE = ("A text is \"with\" when one of its true labels is among the labels whose names it contains. "
                   "Validation rows are cross-fitted (the fusion is fit on the other validation documents); intervals "
                   "resample documents.")


def _name_match_cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One row of cells per hybrid and split with a ``by_name_match`` breakdown (validation cross-fitted, test)."""
    found = [(r["method"], split, r[key]) for r in rows for split, key in (("val", "by_name_match_val"),
                                                                          ("tst", "by_name_match"))
             if isinstance(r.get(key), dict)]
    out = []
    for name, split, b in found:
        w, wo = b.get("with_correct_name_match", {}), b.get("without", {})

        def step(d: dict[str, Any]) -> str:
            return f"{d['base P@1']:.1f} → {d['hybrid P@1']:.1f}" if d.get("texts") else "–"

        diff = (f"{wo['P@1 diff']:+.2f} [{wo['P@1 diff ci95'][0]:.2f}, {wo['P@1 diff ci95'][1]:.2f}]"
                if wo.get("texts") else "–")
        out.append([name, split, f"{w.get('texts', 0)} / {wo.get('texts', 0)}", step(w), step(wo), diff])
    return out


def _name_match_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The hybrids against their base run on the texts with a correct label among their name matches and on those
    without (``by_name_match`` of the hybrids' metrics: validation cross-fitted, and test)."""
    cells = _name_match_cells(rows)
    if not cells:
        return []
    out = ["", "### Hybrids on texts with and without a correct name match", "",
           "| " + " | ".join(NAME_MATCH_HEAD) + " |", "|" + "---|" * len(NAME_MATCH_HEAD)]
    out += ["| " + " | ".join(c) + " |" for c in cells]
    return out + ["", NAME_MATCH_NOTE]


def ablation_deltas(paired: list[dict[str, Any]], controls: dict[str, str]) -> list[dict[str, Any]]:
    """Rows ``ablation − control`` per metric (from :func:`paired_comparisons` rows of the pairs
    ``[ablation, control]``), in the order of ``controls``."""
    by = {(p["a"], p["b"], p["metric"]): p for p in paired}
    out = []
    for ab, ctl in controls.items():
        ms = {m: by.get((ab, ctl, m)) for m in PAIRED_METRICS}
        if not any(ms.values()):
            continue
        p5 = ms.get("P@5")
        out.append({"ablation": ab, "control": ctl, "metrics": ms,
                    "verdict": (f"{p5['better']} better" if p5 and p5.get("better") else "tie") if p5 else "–"})
    return out


def _delta_cell(d: dict[str, Any], m: str) -> str:
    p = d["metrics"].get(m)
    return f"{p['diff']:+.2f} [{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}]" if p else "–"


def _delta_note(deltas: list[dict[str, Any]], alpha: float) -> str:
    p = next(iter(v for d in deltas for v in d["metrics"].values() if v), None)
    if p is None:
        return ""
    return (f"Δ = ablation − control in percentage points, paired bootstrap over {_over(p)} "
            f"(B = {p['n_resamples']}, seed {p['seed']}); the verdict reads P@5's Holm-adjusted p at α = {alpha:g}.")


def _delta_table_html(deltas: list[dict[str, Any]]) -> str:
    e = html.escape
    head = ["ablation", "control"] + [f"Δ {m}" for m in PAIRED_METRICS] + ["verdict (P@5)"]
    body = []
    for d in deltas:
        cells = []
        for m in PAIRED_METRICS:
            p = d["metrics"].get(m)
            if not p:
                cells.append("–")
                continue
            colour = "#1b7837" if p.get("better") == d["ablation"] else "#b2182b" if p.get("better") else "#555"
            cells.append(f"<span style='color:{colour}'>{p['diff']:+.2f}</span> "
                         f"<span class='ci'>[{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}]</span>")
        body.append([e(d["ablation"]), e(d["control"])] + cells + [e(d["verdict"])])
    return _html_table(head, body)


def _html_table(head: list[str], body: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return _wrap(f"<table><tr>{th}</tr>{trs}</table>")


def _wrap(table: str) -> str:
    """A table in a box that scrolls sideways on its own: a wide table never widens the page."""
    return f"<div class='wrap'>{table}</div>"


def _collapsed(summary: str, body: str) -> str:
    """A long section shut by default (``<details>``: no script); its summary says what it holds."""
    return f"<details><summary>{html.escape(summary)}</summary>{body}</details>"


def render_html(rows: list[dict[str, Any]], title: str, images: list[str], bootstrap: dict[str, Any] | None = None,
                seeds: list[dict[str, Any]] | None = None, paired: list[dict[str, Any]] | None = None,
                alpha: float = 0.05, skipped: list[str] | None = None,
                ablation_deltas: list[dict[str, Any]] | None = None, plots_page: str | None = None,
                others: list[dict[str, Any]] | None = None) -> str:
    """The same content as :func:`render_markdown` as one self-contained HTML page (inline CSS only).
    ``others``: more datasets' tables, each ``{"title", "rows", "paired", "skipped"}``, after this one's."""
    e = html.escape
    parts = html_tables(rows, bootstrap, seeds, paired, alpha, skipped, ablation_deltas)
    for o in others or []:
        parts.append(f"<h1>{e(o['title'])}</h1>")
        parts += html_tables(o["rows"], o.get("bootstrap"), None, o.get("paired"), alpha, o.get("skipped"))
    imgs = "".join(f"<p><img src='{e(i)}' alt='{e(i)}'></p>" for i in images)
    link = (f"<p class='note'>All figures (P@k and R@k to k = 100, recall by label frequency, training curves): "
            f"<a href='{e(plots_page)}'>{e(plots_page)}</a></p>") if plots_page else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style></head>"
            f"<body><h1>{e(title)}</h1>{link}{''.join(parts)}{imgs}</body></html>")


def html_tables(rows: list[dict[str, Any]], bootstrap: dict[str, Any] | None = None,
                seeds: list[dict[str, Any]] | None = None, paired: list[dict[str, Any]] | None = None,
                alpha: float = 0.05, skipped: list[str] | None = None,
                ablation_deltas: list[dict[str, Any]] | None = None) -> list[str]:
    """The HTML fragments of one dataset's report: the methods table, seeds, the hybrids by name match, paired
    tests, ablations. Each table scrolls inside its own box; the long ones are collapsed sections."""
    e = html.escape
    best = best_per_column(rows)
    labelled = any("labelled_pairs" in r for r in rows)
    # no "kind" column (the Markdown has one): the group rows say it, and the table is a column narrower
    used_th = "<th class='text'>labelled pairs used</th>" if labelled else ""
    th = "<th>method</th>" + used_th + "".join(f"<th>{e(HEADERS.get(c, c))}</th>" for c in COLUMNS)
    body = []
    for kind, label in (("peer", "Baselines and published peers, measured in this pipeline"),
                        ("method", "The papers' methods"), ("hybrid", "Methods with label-name candidates (hybrid)")):
        group = [r for r in rows if kind_of(r["method"]) == kind]
        if not group:
            continue
        body.append(f"<tr class='group'><td colspan='{1 + labelled + len(COLUMNS)}'>{e(label)}</td></tr>")
        for r in group:
            cells = "".join(f"<td class='best'>{_cell_html(r, c)}</td>" if _is_best(r, c, best)
                            else f"<td>{_cell_html(r, c)}</td>" for c in COLUMNS)
            used = f"<td class='text'>{e(r.get('labelled_pairs', ''))}</td>" if labelled else ""
            body.append(f"<tr><td>{e(r['method'])}</td>{used}{cells}</tr>")
    parts = [_wrap(f"<table><tr>{th}</tr>{''.join(body)}</table>")]
    note = interval_note(rows, bootstrap)
    if note:
        parts.append(f"<p class='note'>{e(note)} The interval is under each value. Shaded bold: the best value of "
                     "the column over all rows.</p>")
    parts.append("<p class='note'>Percentages on the test split; PSP with propensity A/B from params.yaml; "
                 "unseen R@100 = recall@100 over test (instance, label) pairs whose label never occurs in training.</p>")
    if seeds:
        parts.append("<h2>Seed variation</h2>")
        parts.append(_html_table(["run", "seeds"] + SEED_METRICS,
                                 [[e(s["base"]), str(s["n_found"])] + [e(_mean_sd(s.get(m))) for m in SEED_METRICS]
                                  for s in seeds]))
        parts.append(f"<p class='note'>{e(_seed_note(seeds))}</p>")
    names = _name_match_cells(rows)
    if names:
        parts.append("<h2>Hybrids on texts with and without a correct name match</h2>")
        parts.append(_collapsed(f"{len(names)} row{'s' * (len(names) != 1)} (hybrid × split): P@1 of each hybrid and "
                                "its run",
                                _html_table(NAME_MATCH_HEAD, [[e(c) for c in row] for row in names])
                                + f"<p class='note'>{e(NAME_MATCH_NOTE)}</p>"))
    if paired or skipped:
        parts.append("<h2>Paired comparisons</h2>")
    if paired:
        wins = sum(1 for p in paired if p.get("better"))
        table = _html_table(
            ["a", "b", "metric", "a (%)", "b (%)", "a − b [95 % CI]", "p", "p (Holm)", "verdict"],
            [[e(p["a"]), e(p["b"]), e(p["metric"]), f"{p['a_value']:.1f}", f"{p['b_value']:.1f}",
              f"{p['diff']:+.2f}<span class='ci'>[{p['ci95'][0]:.2f}, {p['ci95'][1]:.2f}]</span>",
              f"{p['p_value']:.3f}", f"{p['p_holm']:.3f}", e(_verdict_text(p))] for p in paired])
        parts.append(_collapsed(f"{len(paired)} tests: {wins} differences significant after Holm's correction, "
                                f"{len(paired) - wins} ties", table))
        parts.append(f"<p class='note'>{e(_paired_note(paired, alpha))}</p>")
    if skipped:
        parts.append("<ul>" + "".join(f"<li>not compared: {e(s)}</li>" for s in skipped) + "</ul>")
    if ablation_deltas:
        parts.append("<h2>Ablations: difference to their control</h2>")
        parts.append(_delta_table_html(ablation_deltas))
        parts.append(f"<p class='note'>{e(_delta_note(ablation_deltas, alpha))}</p>")
    return parts
