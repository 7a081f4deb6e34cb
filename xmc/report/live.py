"""A live page of running (or finished) trainings, offline: ``python -m xmc.report.live plots/train/<run> ...``.

Renders each run's DVCLive record (``plots/train/<run>/``) to PNG and writes an HTML page that reloads itself,
so a browser on a machine with no network shows the curves of a run while it trains. ``--every S`` keeps
re-rendering every S seconds until interrupted; without it the page is rendered once.
"""

from __future__ import annotations

import argparse
import html
import json
import time
from pathlib import Path

from xmc.io import atomic_file
from xmc.report.figures import method_styles, training_figure


def render_live_page(run_dirs: list[Path], out: Path, refresh_s: int = 10) -> Path:
    """``out`` (an .html file) with one figure per run and the latest values of its record."""
    out.parent.mkdir(parents=True, exist_ok=True)
    styles = method_styles([d.name for d in run_dirs])
    parts = []
    for d in run_dirs:
        png = out.with_name(f"{out.stem}_{d.name}.png")
        drawn = training_figure(d.name, [d.name], d.parent, png, styles)
        summary_path = d / "metrics.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        latest = html.escape(json.dumps(summary, indent=1)) if summary else "no record yet"
        img = f"<img src='{html.escape(png.name)}?t={int(time.time())}' alt='{html.escape(d.name)}'>" if drawn else ""
        parts.append(f"<h2>{html.escape(d.name)}</h2>{img}<pre>{latest}</pre>")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='{refresh_s}'>"
            f"<title>xmc training, live</title><style>body{{font-family:system-ui,sans-serif;margin:2em}}"
            f"img{{max-width:100%;border:1px solid #ddd}}pre{{background:#f6f6f6;padding:.5em}}</style></head><body>"
            f"<h1>Training, live</h1><p>Rendered {stamp}; this page reloads every {refresh_s} s.</p>{''.join(parts)}"
            f"</body></html>")
    with atomic_file(out) as fh:
        fh.write(page)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m xmc.report.live", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="live record folders (plots/train/<run>)")
    ap.add_argument("--out", default="reports/live.html", help="the page to write (default reports/live.html)")
    ap.add_argument("--every", type=float, default=0, help="re-render every this many seconds (0: once)")
    args = ap.parse_args(argv)
    dirs = [Path(r) for r in args.runs]
    while True:
        page = render_live_page(dirs, Path(args.out), refresh_s=max(5, int(args.every or 10)))
        if not args.every:
            print(page)
            return
        time.sleep(args.every)


if __name__ == "__main__":
    from xmc.config import run_entry_point

    run_entry_point(main)
