"""Cold and warm load + first prediction of every package kind, each in a fresh process.

    python -m lab.bench.package_load [--packages results/semcor-wn30/packages] [--repeats 3] [--out FILE]

For each package: ``cold`` evicts the package's files from the page cache first (``posix_fadvise(DONTNEED)`` on
each file after ``fsync``: no root needed; hard links share the inode, so the trained model's pages go too), as a
fresh copy or a freshly booted box reads them; ``warm`` runs right after, with the files cached. Each run is a new
``python`` process that times ``import xmc``, ``xmc.load(package)`` and the first ``predict`` of three texts; the
process's own wall time includes the interpreter start. The peer in the same command is ``xmc --help`` (the CLI
with no model). Prints a table and writes JSON (median over ``--repeats`` per cell).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TEXTS = ["He went to the bank to deposit his pay.", "The river overflowed its banks after the storm.",
         "a library to parse JSON in C"]

# what one run measures, in a child process (so that nothing is imported or cached in this one)
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import xmc
t1 = time.perf_counter()
m = xmc.load(sys.argv[1])
t2 = time.perf_counter()
preds = m.predict(json.loads(sys.argv[2]), k=5)
t3 = time.perf_counter()
import resource
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_predict_s": t3 - t2,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "first": preds[0][0].id}))
"""


def package_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def evict(root: Path) -> None:
    """Drop the files' pages from the page cache (each file: fsync, then POSIX_FADV_DONTNEED)."""
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_run(package: Path) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, str(package), json.dumps(TEXTS)], capture_output=True, text=True,
                       env={**os.environ, "TQDM_DISABLE": "1"}, timeout=900)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{package}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    return {**json.loads(p.stdout.strip().splitlines()[-1]), "process_s": wall}


def cli_help_seconds(repeats: int) -> float:
    xmc = Path(sys.executable).with_name("xmc")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([str(xmc), "--help"], capture_output=True, check=True, timeout=120)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_of(runs: list[dict]) -> dict:
    keys = ("import_s", "load_s", "first_predict_s", "process_s", "peak_rss_mib")
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in keys} | {"first_label": runs[-1]["first"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", type=Path, default=Path("results/semcor-wn30/packages"))
    ap.add_argument("--only", default="", help="comma-separated package names (default: every package)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cold-libraries", action="store_true",
                    help="cold also evicts the environment's files (torch, faiss...: sys.prefix), as after a reboot")
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or sorted(p.name for p in a.packages.iterdir()
                                                          if (p / "manifest.json").is_file())
    rows = []
    for name in names:
        root = a.packages / name
        manifest = json.loads((root / "manifest.json").read_text())
        cold, warm = [], []
        for _ in range(a.repeats):
            evict(root)
            if a.cold_libraries:
                evict(Path(sys.prefix))
            cold.append(one_run(root))
            warm.append(one_run(root))
        row = {"package": name, "kind": manifest.get("predictor", {}).get("kind"), "mib": round(package_bytes(root) / 2**20, 1),
               "cold": median_of(cold), "warm": median_of(warm)}
        rows.append(row)
        print(f"{name:<28} {row['kind']:<12} {row['mib']:>8.1f} MiB  cold load {row['cold']['load_s']:6.2f} s + "
              f"first predict {row['cold']['first_predict_s']:5.2f} s (process {row['cold']['process_s']:6.2f} s) | "
              f"warm load {row['warm']['load_s']:6.2f} s + {row['warm']['first_predict_s']:5.2f} s "
              f"(process {row['warm']['process_s']:6.2f} s)", flush=True)
    help_s = cli_help_seconds(a.repeats)
    print(f"xmc --help: {help_s:.2f} s")
    out = {"packages": str(a.packages), "repeats": a.repeats, "cold_libraries": a.cold_libraries, "texts": len(TEXTS), "xmc_help_s": round(help_s, 3),
           "cpu_count": os.cpu_count(), "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
