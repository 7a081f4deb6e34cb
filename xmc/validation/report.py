"""A self-contained HTML data-validation report (no server, opens from disk)."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from xmc.validation.checks import ValidationSummary

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.pass{background:#e8f6e8}.fail-critical{background:#fbe0e0}.fail-warning{background:#fff4d6}
.badge{display:inline-block;padding:2px 8px;border-radius:4px;font-weight:bold}
code{font-size:12px}
"""


def _histogram_png(hist: dict[str, Any]) -> str:
    # imported here: pyplot must follow the choice of the Agg backend, a process-wide setting made when a figure is
    # drawn (on import it would be a side effect on every importer)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.8))
    ax.bar(hist["bins"], hist["labels"], color="#4a7bb7")
    ax.set_xlabel("training occurrences of a label")
    ax.set_ylabel("labels")
    ax.set_title("Label frequency (long tail)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(summary: ValidationSummary, title: str = "Data validation report") -> str:
    ok = not summary.critical_failures
    status = ("PASSED" if ok else "FAILED") + (f" with {len(summary.warnings)} warning(s)" if summary.warnings else "")
    color = "#2e7d32" if ok else "#c62828"
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>",
           f"<p><span class='badge' style='color:white;background:{color}'>{status}</span> "
           f"{sum(c.success for c in summary.checks)} of {len(summary.checks)} checks passed; "
           f"{len(summary.critical_failures)} critical failure(s).</p>",
           "<h2>Checks</h2><table><tr><th>table</th><th>check</th><th>expectation</th><th>severity</th><th>result</th>"
           "<th>observed / unexpected</th><th>sample of unexpected values</th></tr>"]
    for c in summary.checks:
        cls = "pass" if c.success else f"fail-{c.severity}"
        observed = c.observed if c.observed is not None else (f"{c.unexpected_count} unexpected" if c.unexpected_count is not None else "")
        out.append(
            f"<tr class='{cls}'><td>{c.table}</td><td>{html.escape(c.description)}</td>"
            f"<td><code>{html.escape(c.expectation)}({html.escape(c.column or '')})</code></td><td>{c.severity}</td>"
            f"<td>{'pass' if c.success else 'FAIL'}</td><td>{html.escape(str(observed))}</td>"
            f"<td>{html.escape('; '.join(c.unexpected_sample))}</td></tr>")
    out.append("</table>")
    out.append("<h2>Counts</h2>")
    cnt = summary.counts
    rows = [{"split": s, **{k: v for k, v in cnt[s].items()}} for s in ("trn", "val", "tst") if s in cnt]
    out.append(f"<p>Labels: {cnt.get('n_labels')}; filtered test pairs: {cnt.get('tst_filter_pairs', 0)}</p>" + _table(rows))
    lf = summary.label_frequency
    out.append("<h2>Label frequency</h2>")
    out.append(_table([{"measure": k.replace("_", " "), "value": v} for k, v in lf.items() if not isinstance(v, dict)]))
    if "train_freq_histogram" in lf:
        out.append(f"<img alt='label frequency histogram' src='data:image/png;base64,{_histogram_png(lf['train_freq_histogram'])}'>")
    for name, section in summary.extra_sections.items():
        out.append(f"<h2>{html.escape(name)}</h2>")
        if isinstance(section, list) and section and isinstance(section[0], dict):
            out.append(_table(section))
        else:
            out.append(f"<pre>{html.escape(json.dumps(section, indent=2))}</pre>")
    out.append("</body></html>")
    return "\n".join(out)
