"""The pipeline's cost curve against size: the default path on synthetic XMC data from 10^4 to 10^6 labels.

For each size n (n training instances, n labels, n/10 test instances; ``lab.bench.synthetic_xmc``: Zipf label
frequencies, label texts, a label graph, document groups) a throw-away DVC workspace of the product is made with
the *scale profile* of params (below: its ``runs`` map, no hybrids, no linear peer) and the stages of the root
dvc.yaml are run one by one in DVC's order (``dvc repro -s``), each timed, with the peak RSS of the stage's
process tree (``os.wait4``). The runs: the label prior, TF-IDF zero-shot and kNN, one bag-of-words run of every
trained family — DEXML with hard negatives refreshed every epoch, RAMEN with its graph stage, UniDEC, ASTRA with
its ANN refresh — each through ``plan``, ``train@<run>`` and ``package@<run>`` (the package, its predictions and
their evaluation), then the report.

    python -m lab.bench.scale [--sizes 1e4,1e5,1e6] [--epochs 1] [--out lab/bench/scale.json]
                              [--plot lab/bench/scale.png]
    make scale-bench

Writes per size and stage: seconds and peak RSS; per stage the growth exponent (least-squares slope of
log cost on log n over the sizes run, and between consecutive sizes). Stops at the first size where a stage
fails or goes past ``--stage-timeout`` and records why. Not a test (``tests/test_scale.py`` runs the same path
at a small size).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from xmc.io import stage_from_address
from xmc.workspace import results_dir

ROOT = Path(__file__).resolve().parents[2]   # the repository
BENCH = Path(__file__).resolve().parent
# the product (the lab is not copied: the workspaces run the root dvc.yaml only)
PROJECT_FILES = ["xmc", "stages", "flows", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".gto"]
BOW = {"kind": "bow", "dim": 256, "n_buckets": 262144, "ngram_max": 2, "tied": True, "dropout": 0.0, "seed": 0}
VALIDATION_DOCUMENTS = 1300
METHODS = ["label_prior", "tfidf_zeroshot", "tfidf_knn", "dexml_bow", "ramen", "unidec", "astra"]


def bow_encoder(n_buckets: int | None = None) -> dict[str, Any]:
    """The profile's bag-of-words encoder; ``n_buckets``: another table height (the test's small sizes)."""
    return {**BOW, **({"n_buckets": int(n_buckets)} if n_buckets else {})}


def scale_params(epochs: int, auto_exact_max: int | None = None, n_buckets: int | None = None,
                 methods: list[str] | None = None) -> dict[str, Any]:
    """The scale profile (dotted keys of params.yaml): the default path's runs on their bag-of-words profile,
    ``epochs`` epochs each; ``auto_exact_max``: where the prediction indexes switch from exact to IVF (default:
    params'); ``n_buckets``: the bag-of-words table's height (default: the profile's 262,144); ``methods``: a subset
    of :data:`METHODS` (default: all)."""
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: {', '.join(unknown)} not in the scale profile ({', '.join(METHODS)})")
    bow = bow_encoder(n_buckets)
    train = {"epochs": epochs, "eval_every_epochs": 0, "max_steps_per_epoch": 0, "checkpoint_every_steps": 0}
    profile = {
        # mining indexes: exact up to index.auto_exact_max labels, IVF above (exact search is O(N·L) per refresh);
        # one refresh per epoch (the transformer DEXML's extra refresh every 60 steps would be 65 at 10^6).
        # Exact TF-IDF scoring is quadratic in the data size (every query meets every item sharing a common term):
        # postings capped per term (chosen on the synthetic 10^5 validation split: lab/bench/tfidf_pruning_*.json).
        # UniDEC predicts in its main space only: its DE-only and classifier-only spaces (two more indexes over L
        # vectors and two more searches of every query) are lab runs, which this profile does not run.
        "runs": {
            "label_prior": {"method": "label_prior"},
            "tfidf_zeroshot": {"method": "tfidf_zeroshot", "max_postings_per_term": 300},
            "tfidf_knn": {"method": "tfidf_knn", "max_postings_per_term": 300},
            "dexml_bow": {"method": "dexml", "encoder": bow,
                          "negatives": {"kind": "hard", "start_epoch": 0, "refresh_every_epochs": 1,
                                        "shortlist_size": 100, "negatives_per_query": 2, "index_kind": "auto",
                                        "refresh_every_steps": 0},
                          "train": {"batch_size": 256, "lr": 0.01, **train}},
            "ramen": {"method": "ramen", "encoder": bow, "train": {"epochs": epochs, "eval_every_epochs": 0},
                      "pruning": {"warmup_epochs": 0}, "negatives": {"index_kind": "auto"}},
            "unidec": {"method": "unidec", "encoder": bow, "train": {"epochs": epochs, "eval_every_epochs": 0},
                       "psl": {"index_kind": "auto"}},
            "astra": {"method": "astra", "encoder": bow, "train": {"epochs": epochs, "eval_every_epochs": 0},
                      "negatives": {"start_epoch": 0, "index_kind": "auto"}},
        },
        "hybrids": {}, "xr_linear": {},
        # the synthetic label graph is not WordNet: RAMEN regularises with the document (co-occurrence) set
        "graph.wordnet.enabled": False,
        "registry.promote": [], "report.paired": [], "report.training_families": {},
        # the validation split (10 % of the training documents) predicted and evaluated in full up to ~10^4
        # queries: 1,300 documents keep all of it at 10^4 and 10^5 (125 and 1,255 documents) and about 10^4 of
        # its 10^5 instances at 10^6, where every validation query costs a scan of 10^6 label vectors
        "data.subsample.val": VALIDATION_DOCUMENTS,
        **({"index.auto_exact_max": auto_exact_max} if auto_exact_max is not None else {}),
    }
    if methods:
        profile["runs"] = {m: profile["runs"][m] for m in METHODS if m in methods}
    return profile


def _set(params: dict[str, Any], dotted: str, value: Any) -> None:
    node = params
    *parents, last = dotted.split(".")
    for k in parents:
        node = node[k]
    node[last] = value


def make_workspace(dest: Path, dataset_dir: Path, overrides: dict[str, Any], refresh: bool = False) -> Path:
    """A git + DVC copy of this project reading ``dataset_dir`` with ``overrides`` applied to params.yaml.
    ``refresh``: copy this project's code and params over an existing workspace, keeping its outputs."""
    if dest.exists() and not refresh:
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "dvc.lock"),
                            dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, dest / name)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    _set(params, "data.dataset_dir", str(dataset_dir.resolve()))
    _set(params, "data.name", dataset_dir.name)   # its outputs: results/<folder name>/
    _set(params, "data.subsample", {"trn": 0, "tst": 0, "val": 0, "unit": "documents", "labels": "all"})
    for k, v in overrides.items():
        _set(params, k, v)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    from xmc.config import load_params

    load_params(dest / "params.yaml")   # a profile key the schema does not know fails here, not in a stage
    setup = [] if refresh else [["git", "init", "-q"], ["dvc", "init", "-q"],
                                ["dvc", "config", "core.analytics", "false"],
                                # as the Makefile sets it: a model's files linked from the cache, not copied
                                ["dvc", "config", "--local", "cache.type", "hardlink,symlink,copy"]]
    for cmd in (*setup, ["git", "add", "-A"], ["git", "commit", "-qm", "scale workspace", "--allow-empty"]):
        subprocess.run(cmd, cwd=dest, env=_env(), check=True, capture_output=True)
    return dest


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = ""
    e.update({"DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
              "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"})
    return e


# A target is a DVC address (``dvc.yaml:report``) or a stage name or group of the pipeline (``report``, ``package``,
# ``package@astra``); the order lists DVC addresses.
_ORDER = """
import json, sys
import networkx as nx
from dvc.repo import Repo
repo = Repo(".")
order = []
for target in sys.argv[1:]:
    named = [s for s in repo.index.stages if s.name == target] or \\
        [s for s in repo.index.stages if s.name.split("@")[0] == target]
    for stage in (named if named and ":" not in target else repo.stage.collect(target)):
        for node in nx.dfs_postorder_nodes(repo.index.graph, stage):   # dependencies first
            if node.addressing not in order:
                order.append(node.addressing)
print(json.dumps(order))
"""


def stage_order(repo: Path, targets: list[str]) -> list[str]:
    """The stages ``dvc repro targets`` runs, dependencies first (DVC's own stage graph of the workspace)."""
    p = subprocess.run([sys.executable, "-c", _ORDER, *targets], cwd=repo, env=_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"reading the stage graph failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# Runs the command as its child and prints the child's peak RSS (KiB) last. A process's peak RSS starts at its
# parent's resident size when it forks, so the stage must be forked from this small process, not from the benchmark
# (which holds the generated data) or a test runner; Linux folds every reaped descendant's peak into the child's,
# so the figure is the largest process of the stage's tree (DVC or the stage itself).
_PEAK = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(p.pid, 0)
print(f"XMC_PEAK_RSS_KIB={usage.ru_maxrss}", flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_stage(repo: Path, stage: str, timeout: float, force: bool = False) -> dict[str, Any]:
    """``dvc repro -s stage`` (``-f``: even if up to date): wall seconds, peak RSS (MiB) of its process tree, exit
    status."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", _PEAK, "dvc", "repro", "-s", *(["-f"] if force else []), stage],
                         cwd=repo, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        return {"stage": stage_from_address(stage), "seconds": round(time.perf_counter() - t0, 2), "ok": False,
                "why": "timeout",
                "peak_rss_mib": float("nan")}
    seconds = time.perf_counter() - t0
    marks = [line for line in out.splitlines() if line.startswith("XMC_PEAK_RSS_KIB=")]
    peak = int(marks[-1].split("=", 1)[1]) / 1024 if marks else float("nan")
    row = {"stage": stage_from_address(stage), "seconds": round(seconds, 2), "ok": p.returncode == 0,
           "peak_rss_mib": round(peak, 1)}
    if p.returncode != 0:
        lines = [line for line in out.strip().splitlines() if not line.startswith("XMC_PEAK_RSS_KIB=")]
        row["why"] = lines[-1][:300] if lines else f"exit {p.returncode}"
    return row


def growth(sizes: list[int], values: list[float]) -> dict[str, Any]:
    """Least-squares slope of log value on log size, and the slope between each pair of consecutive sizes."""
    pts = [(math.log(n), math.log(max(v, 1e-3))) for n, v in zip(sizes, values)]
    if len(pts) < 2:
        return {"exponent": None, "pairwise": []}
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / max(sum((x - mx) ** 2 for x, _ in pts), 1e-12)
    pair = [round((b[1] - a[1]) / (b[0] - a[0]), 2) for a, b in zip(pts, pts[1:])]
    return {"exponent": round(slope, 2), "pairwise": pair}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from xmc.report.figures import method_styles

    sizes = [r["n"] for r in result["runs"]]
    stages = sorted({s["stage"] for r in result["runs"] for s in r["stages"]})
    styles = method_styles(stages)   # colour x line style x marker: every stage its own look
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for stage in stages:
        pts = [(r["n"], s) for r in result["runs"] for s in r["stages"] if s["stage"] == stage and s["ok"]]
        if not pts:
            continue
        xs = [n for n, _ in pts]
        axes[0].plot(xs, [s["seconds"] for _, s in pts], label=stage, **styles[stage])
        axes[1].plot(xs, [s["peak_rss_mib"] for _, s in pts], label=stage, **styles[stage])
    for ax, what in zip(axes, ("seconds", "peak RSS (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training instances = labels")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle(f"Pipeline cost against size (sizes {', '.join(f'{n:,}' for n in sizes)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def code_version() -> str:
    """The commit the benchmark's workspaces were copied from (+ "-dirty" with uncommitted changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--", *PROJECT_FILES) else "")


def _rows_file(work: Path, n: int) -> Path:
    return work / f"rows_{n}.jsonl"


def _meta_file(work: Path, n: int) -> Path:
    return work / f"run_{n}.json"


def run_size(n: int, work: Path, epochs: int, stage_timeout: float, targets: list[str],
             resume: bool = False, collect: bool = False, auto_exact_max: int | None = None,
             n_buckets: int | None = None, methods: list[str] | None = None) -> dict[str, Any]:
    """Generate size ``n``, make its workspace and run the stages. Each finished stage's row is appended to
    ``work/rows_<n>.jsonl`` as it ends, so an interrupted run keeps what it measured; ``resume`` continues a kept
    workspace (made with ``--keep``) with the code it was made with: stages with a successful row are not run again,
    the others are forced (a half-run stage may have left outputs that DVC would take as done). ``collect``: run
    nothing, report the recorded rows of a kept workspace (a run still going or interrupted is not ``completed``)."""
    from lab.bench.synthetic_xmc import generate

    data, repo = work / f"data_{n}", work / f"repo_{n}"
    rows_file, meta_file = _rows_file(work, n), _meta_file(work, n)
    kept: dict[str, dict[str, Any]] = {}
    if collect and not (repo.is_dir() and meta_file.is_file()):
        raise SystemExit(f"{repo}: no kept workspace with recorded rows to collect")
    if (resume or collect) and repo.is_dir() and meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if rows_file.is_file():
            for line in rows_file.read_text().splitlines():
                row = json.loads(line)
                if row["ok"]:
                    kept[row["stage"]] = row
        print(f"  resuming the workspace of commit {meta['commit']}: {len(kept)} stages kept", flush=True)
    else:
        t0 = time.perf_counter()
        stats = generate(data, n_train=n, n_labels=n, n_test=max(1000, n // 10), seed=0)
        meta = {"commit": code_version(), "dataset": stats, "generate_seconds": round(time.perf_counter() - t0, 1)}
        make_workspace(repo, data, scale_params(epochs, auto_exact_max, n_buckets, methods))
        meta_file.write_text(json.dumps(meta, indent=2) + "\n")
        rows_file.unlink(missing_ok=True)
    rows = []
    for address in stage_order(repo, targets):
        stage = stage_from_address(address)   # rows name stages without their pipeline file
        if collect and stage not in kept:
            print(f"  n={n:>9,}  {stage:32s} not run", flush=True)
            rows.append({"stage": stage, "seconds": 0.0, "ok": False, "why": "not run", "peak_rss_mib": 0.0})
            continue
        if stage in kept:
            row = kept[stage]
            print(f"  n={n:>9,}  {stage:32s} {row['seconds']:9.1f} s  {row['peak_rss_mib']:8.0f} MiB (kept)", flush=True)
            rows.append(row)
            continue
        row = run_stage(repo, address, stage_timeout, force=resume)
        rows.append(row)
        with rows_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"  n={n:>9,}  {stage:32s} {row['seconds']:9.1f} s  {row['peak_rss_mib']:8.0f} MiB"
              f"{'' if row['ok'] else '  FAILED: ' + row.get('why', '')}", flush=True)
        if not row["ok"]:
            break
    return {"n": n, "n_labels": n, "commit": meta["commit"], "dataset": meta["dataset"],
            "generate_seconds": meta["generate_seconds"], "stages": rows,
            "completed": all(r["ok"] for r in rows), "total_seconds": round(sum(r["seconds"] for r in rows), 1),
            "peak_rss_mib": max((r["peak_rss_mib"] for r in rows), default=0.0), **outcomes(repo)}


def outcomes(repo: Path) -> dict[str, Any]:
    """Test P@1/P@5/R@100 per method, and per approximate prediction index its kind, the search width its
    calibration chose and the recall@100 against exact search (``predictions/<run>/timing.json``)."""
    metrics, indexes = {}, {}
    repo = results_dir(repo / "params.yaml")
    for m in METHODS:
        f = repo / "metrics" / f"{m}.json"
        if f.is_file():
            d = json.loads(f.read_text())
            metrics[m] = {k: d.get(k) for k in ("P@1", "P@5", "R@100")}
        t = repo / "predictions" / m / "timing.json"
        if t.is_file():
            d = json.loads(t.read_text())
            cal = d.get("index_calibration") or {}
            sl = d.get("shortlist") or {}
            if d.get("index_kind", "exact") != "exact" or cal or sl:   # approximate, calibrated, or a shortlist
                indexes[m] = {"kind": d["index_kind"], "index_seconds": d.get("index_seconds"),
                              "predict_seconds": d.get("predict_seconds"), "recall_at_100": d.get("index_recall"),
                              **({"calibrated": _calibration_summary(cal)} if cal else {}),
                              **({"shortlist": _shortlist_summary(sl)} if sl else {})}
    return {"metrics": metrics, "indexes": indexes}


def _shortlist_summary(sl: dict[str, Any]) -> dict[str, Any]:
    """The validation choice between the TF-IDF shortlist and exact search (``index.shortlist``)."""
    test = sl.get("test") or {}
    return {"kept": sl.get("kept"), "shortlist_k": sl.get("shortlist_k"), "exact_texts": sl.get("exact_texts"),
            "metric": test.get("metric"),
            "val_shortlist": test.get("a"), "val_exact": test.get("b"), "diff": test.get("diff"),
            "ci95": test.get("ci95"), "p_value": test.get("p_value"), "verdict": test.get("verdict"),
            "seconds_per_1000": sl.get("seconds_per_1000"), "recall_against_exact": sl.get("recall_against_exact")}


def _calibration_summary(cal: dict[str, Any]) -> dict[str, Any]:
    """What a calibration chose and measured; ``before``: the kind it fell back from (IVF before a PQ scan)."""
    keys = ("kind", "knob", "value", "recall", "recall_target", "fallback", "search_seconds_per_1000",
            "exact_seconds_per_1000")
    out = {k: cal.get(k) for k in keys}
    if cal.get("before"):
        out["before"] = {k: cal["before"].get(k) for k in keys}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replot", action="store_true", help="redraw --plot from --out without running anything")
    ap.add_argument("--sizes", default="1e4,1e5,1e6")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--work", default=str(BENCH / ".scale"))
    ap.add_argument("--out", default=str(BENCH / "scale.json"))
    ap.add_argument("--plot", default=str(BENCH / "scale.png"))
    ap.add_argument("--stage-timeout", type=float, default=3 * 3600)
    ap.add_argument("--targets", default="report", help="the stages run, with everything they depend on")
    ap.add_argument("--auto-exact-max", type=int, default=None,
                    help="labels above which the prediction indexes are IVF (default: params' index.auto_exact_max)")
    ap.add_argument("--bow-buckets", type=int, default=None,
                    help="height of the bag-of-words table (default: the profile's 262,144; the test's small sizes "
                         "use fewer, since at a thousand instances the table's allocation, saving and loading "
                         "outweigh the training)")
    ap.add_argument("--methods", default="", help="comma-separated runs of the profile to run (default: all of "
                    + ", ".join(METHODS) + ")")
    ap.add_argument("--keep", action="store_true", help="keep the workspaces and data (default: delete each)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the kept workspaces of an interrupted --keep run: stages it finished keep their "
                         "rows (work/rows_<n>.jsonl), the rest run with the workspace's code (implies --keep)")
    ap.add_argument("--restage", default="",
                    help="comma-separated stages to rerun with the current code in the kept workspace of each size "
                         "(made with --keep), replacing their rows in --out")
    ap.add_argument("--drop-stages", default="",
                    help="with --restage: comma-separated stages the path no longer has (renamed or removed); their "
                         "rows are removed from --out before the rerun")
    ap.add_argument("--collect", action="store_true",
                    help="run nothing: write --out from the rows recorded in the kept workspaces (work/rows_<n>.jsonl)")
    ap.add_argument("--merge", action="store_true",
                    help="add these sizes' runs to --out (replacing runs of the same size) and recompute the growth")
    ap.add_argument("--table", action="store_true", help="print --out as a Markdown table (stage x size) and stop")
    a = ap.parse_args(argv)
    if a.table:
        result = json.loads(Path(a.out).read_text())
        print(markdown_table(result))
        return result
    if a.replot:
        result = json.loads(Path(a.out).read_text())
        plot(result, Path(a.plot))
        return result
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    methods = [m for m in a.methods.split(",") if m] or list(METHODS)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
                              "profile": {"methods": methods, "epochs": a.epochs, "encoder": bow_encoder(a.bow_buckets)}, "runs": []}
    if a.restage:
        return restage(sizes, work, a.restage.split(","), a.epochs, a.stage_timeout, Path(a.out), a.plot,
                       a.auto_exact_max, drop=[s for s in a.drop_stages.split(",") if s], n_buckets=a.bow_buckets,
                       methods=methods)
    for n in sizes:
        print(f"size {n:,}", flush=True)
        run = run_size(n, work, a.epochs, a.stage_timeout, a.targets.split(","), resume=a.resume,
                       collect=a.collect, auto_exact_max=a.auto_exact_max, n_buckets=a.bow_buckets,
                       methods=methods)
        result["runs"].append(run)
        if not (a.keep or a.resume or a.collect):
            shutil.rmtree(work / f"repo_{n}", ignore_errors=True)
            shutil.rmtree(work / f"data_{n}", ignore_errors=True)
            _rows_file(work, n).unlink(missing_ok=True)
            _meta_file(work, n).unlink(missing_ok=True)
        if not run["completed"]:
            print(f"stopping: size {n:,} did not complete", flush=True)
            break
    if a.merge and Path(a.out).is_file():
        kept = [r for r in json.loads(Path(a.out).read_text())["runs"] if r["n"] not in sizes]
        result["runs"] = sorted(kept + result["runs"], key=lambda r: r["n"])
    result["growth"] = growth_table(result["runs"])
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    if a.plot and result["runs"]:
        plot(result, Path(a.plot))
    print("growth exponents (seconds, peak RSS) over the sizes where each stage finished:")
    for stage, g in result["growth"].items():
        print(f"  {stage:32s} {g['seconds']['exponent']!s:>6} {g['peak_rss']['exponent']!s:>6}")
    return result


def restage(sizes: list[int], work: Path, stages: list[str], epochs: int, stage_timeout: float, out: Path,
            plot_path: str | None, auto_exact_max: int | None = None, drop: list[str] = (),
            n_buckets: int | None = None, methods: list[str] | None = None) -> dict[str, Any]:
    """Rerun ``stages`` with the current code in each size's kept workspace; their rows in ``out`` are replaced
    (marked with the commit that ran them) and the growth recomputed. ``drop``: stages the path no longer has,
    whose rows are removed first."""
    result = json.loads(out.read_text())
    for n in sizes:
        repo, data = work / f"repo_{n}", work / f"data_{n}"
        if not repo.is_dir():
            raise SystemExit(f"{repo}: no kept workspace (run this size with --keep first)")
        make_workspace(repo, data, scale_params(epochs, auto_exact_max, n_buckets, methods), refresh=True)
        run = next(r for r in result["runs"] if r["n"] == n)
        run["stages"] = [r for r in run["stages"] if r["stage"] not in drop]
        for stage in stages:
            row = run_stage(repo, stage_order(repo, [stage])[-1], stage_timeout, force=True)
            row["commit"] = code_version()
            print(f"  n={n:>9,}  {stage:32s} {row['seconds']:9.1f} s  {row['peak_rss_mib']:8.0f} MiB (rerun)", flush=True)
            run["stages"] = [row if r["stage"] == stage else r for r in run["stages"]]
            if stage not in {r["stage"] for r in run["stages"]}:
                run["stages"].append(row)
            run["completed"] = all(r["ok"] for r in run["stages"])
            run["total_seconds"] = round(sum(r["seconds"] for r in run["stages"]), 1)
            run["peak_rss_mib"] = max(r["peak_rss_mib"] for r in run["stages"])
            found = outcomes(repo)
            run.setdefault("metrics", {}).update(found["metrics"])
            run.setdefault("indexes", {}).update(found["indexes"])
            result["growth"] = growth_table(result["runs"])
            out.write_text(json.dumps(result, indent=2) + "\n")   # after every stage: an interrupted rerun keeps its rows
    if plot_path:
        plot(result, Path(plot_path))
    return result


def markdown_table(result: dict[str, Any]) -> str:
    """Per stage: seconds / peak MiB at each size, and the growth exponent of seconds; then the whole path."""
    runs = result["runs"]
    stages = list(dict.fromkeys(s["stage"] for r in runs for s in r["stages"]))
    head = "| stage | " + " | ".join(f"10^{round(math.log10(r['n']))}: s / peak MiB" for r in runs) + " | exponent (s) |"
    lines = [head, "|" + "---|" * (len(runs) + 2)]
    for stage in stages:
        cells = []
        for r in runs:
            row = next((s for s in r["stages"] if s["stage"] == stage), None)
            if row is None or row.get("why") == "not run":
                cells.append("not run" if row else "–")
            else:
                cells.append(f"{row['seconds']:,.1f} / {row['peak_rss_mib']:,.0f}"
                             + ("" if row["ok"] else f" ({row.get('why', 'failed')})"))
        g = result.get("growth", {}).get(stage, {}).get("seconds", {}).get("exponent")
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {'–' if g is None else g} |")
    lines.append("| **whole path** | " + " | ".join(f"**{r['total_seconds']:,.0f} s / {r['peak_rss_mib']:,.0f}**"
                                                  for r in runs) + " | |")
    return "\n".join(lines)


def growth_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage: the growth exponents of seconds and peak RSS over the sizes where that stage finished (a size
    that stopped later still measured the stages before; a stage that failed, timed out or was not run is left
    out)."""
    stages = list(dict.fromkeys(s["stage"] for r in runs for s in r["stages"]))
    table = {}
    for stage in stages:
        pts = [(r["n"], s) for r in runs for s in r["stages"] if s["stage"] == stage and s.get("ok", True)]
        table[stage] = {"seconds": growth([n for n, _ in pts], [s["seconds"] for _, s in pts]),
                        "peak_rss": growth([n for n, _ in pts], [s["peak_rss_mib"] for _, s in pts])}
    return table


if __name__ == "__main__":
    main()
