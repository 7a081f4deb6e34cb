"""ASTRA scale benchmark: time and peak memory per training step as L grows, against the all-labels loss.

    python -m lab.bench.astra_scale                   # L = 1e4, 1e5, 1e6 (about 5 minutes on 2 cores)
    python -m lab.bench.astra_scale --labels 10000 100000 --steps 10

Synthetic data (random label "texts" are never encoded: classifiers start random), a small
bag-of-words encoder, batch 256. Per (method, L) a fresh subprocess builds the model, runs warm-up
steps, then times ``--steps`` full training steps (batch construction + forward + backward +
optimiser step; the median over the steps); peak memory is the largest resident-set growth over
the resident set before the timed steps, sampled every 2 ms (what a step needs on top of the model). ASTRA's steps use a real shortlist mined once from the
classifier vectors (timed too: the refresh is per τ_r epochs, not per step). Prints ratios; writes
lab/bench/astra_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch


def synthetic(n_queries: int, n_labels: int, seed: int = 0) -> tuple[list[str], sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choice(vocab, 8)) for _ in range(n_queries)]
    rows, cols = [], []
    for q in range(n_queries):
        pos = rng.choice(n_labels, int(rng.integers(1, 4)), replace=False)
        rows += [q] * len(pos)
        cols += pos.tolist()
    return texts, sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_queries, n_labels))


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(method: str, n_labels: int, steps: int, batch: int, dim: int, k_h: int, k_r: int) -> dict:
    from xmc.encoders.bow import HashedBagOfWordsEncoder
    from xmc.methods.astra import ASTRAModel, ASTRANegatives, ASTRAObjective, FullOvAObjective
    from xmc.machine import set_threads
    from xmc.negatives.base import CandidateBatch, positives_mask

    set_threads()  # XMC_THREADS, else every core
    torch.manual_seed(0)
    texts, Y = synthetic(8 * batch, n_labels)
    model = ASTRAModel(HashedBagOfWordsEncoder(dim=dim, n_buckets=1 << 16), [""] * n_labels, bias_init=-8.0)
    opts = [torch.optim.SparseAdam(list(model.encoder.parameters()), lr=1e-3), torch.optim.SGD([model.W.weight], lr=1.0)]
    out: dict = {"method": method, "labels": n_labels}
    if method == "astra":
        sampler = ASTRANegatives(Y, dim, hard_negatives=k_h, uniform_negatives=k_r, start_epoch=0)
        t0 = time.perf_counter()
        sampler.on_epoch_start(0, model, texts)  # exact index over the L classifier vectors, N queries
        out["refresh_seconds"] = round(time.perf_counter() - t0, 3)
        objective = ASTRAObjective()
        make = sampler.make_batch
    else:
        objective = FullOvAObjective(Y)

        def make(q: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
            return CandidateBatch(q, np.arange(n_labels), positives_mask(Y, q, None))

    def step(i: int) -> None:
        q = np.arange((i * batch) % len(texts), (i * batch) % len(texts) + batch)
        b = make(q, np.random.default_rng(i))
        for o in opts:
            o.zero_grad(set_to_none=True)
        objective(model, b, texts).backward()
        for o in opts:
            o.step()

    for i in range(3):  # warm-up: allocator, tokeniser cache
        step(i)
    base = rss_mib()
    peak = [base]
    stop = threading.Event()

    def watch() -> None:  # transient memory of a step: sample the resident set while the steps run
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(3 + i)
        times.append(time.perf_counter() - t0)
    stop.set()
    watcher.join()
    out["step_seconds"] = round(float(np.median(times)), 4)  # median: robust to a busy machine
    out["step_peak_mib"] = round(peak[0] - base, 1)
    out["model_mib"] = round(model.W.weight.numel() * 4 / 2**20, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)  # the CPU profile's d (astra_256 runs)
    ap.add_argument("--hard", type=int, default=20)
    ap.add_argument("--uniform", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "astra_scale.json"))
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "L"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.steps, a.batch, a.dim, a.hard, a.uniform)))
        return
    rows = []
    for L in a.labels:
        for method in ("astra", "all_labels"):
            cmd = [sys.executable, "-m", "lab.bench.astra_scale", "--one", method, str(L), "--steps", str(a.steps),
                   "--batch", str(a.batch), "--dim", str(a.dim), "--hard", str(a.hard), "--uniform", str(a.uniform)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
            if res.returncode != 0:
                raise SystemExit(f"{method} L={L} failed:\n{res.stderr[-2000:]}")
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    by = {(r["method"], r["labels"]): r for r in rows}
    L0, L1 = min(a.labels), max(a.labels)
    summary = {
        "astra_step_ratio_maxL_vs_minL": round(by["astra", L1]["step_seconds"] / by["astra", L0]["step_seconds"], 2),
        "all_labels_step_ratio_maxL_vs_minL": round(by["all_labels", L1]["step_seconds"] / by["all_labels", L0]["step_seconds"], 2),
        "all_labels_over_astra_step": {L: round(by["all_labels", L]["step_seconds"] / by["astra", L]["step_seconds"], 1)
                                       for L in a.labels},
        "all_labels_over_astra_peak_memory": {L: round(max(by["all_labels", L]["step_peak_mib"], 1) /
                                                       max(by["astra", L]["step_peak_mib"], 1), 1) for L in a.labels},
    }
    print(f"\n{'L':>9} | {'ASTRA s/step':>12} {'peak MiB':>9} {'refresh s':>9} | {'all-labels s/step':>17} {'peak MiB':>9}")
    for L in a.labels:
        s, f = by["astra", L], by["all_labels", L]
        print(f"{L:>9} | {s['step_seconds']:>12.4f} {s['step_peak_mib']:>9.1f} {s['refresh_seconds']:>9.2f} | "
              f"{f['step_seconds']:>17.4f} {f['step_peak_mib']:>9.1f}")
    print(f"\nASTRA step time at L={L1} / L={L0}: {summary['astra_step_ratio_maxL_vs_minL']}x; "
          f"all-labels: {summary['all_labels_step_ratio_maxL_vs_minL']}x")
    print(f"all-labels / ASTRA step time per L: {summary['all_labels_over_astra_step']}")
    print(f"all-labels / ASTRA step peak memory per L: {summary['all_labels_over_astra_peak_memory']}")
    Path(a.out).write_text(json.dumps({"config": {k: v for k, v in vars(a).items() if k not in ("one", "out")},
                                       "torch_threads": torch.get_num_threads(), "rows": rows, "summary": summary},
                                      indent=2))


if __name__ == "__main__":
    main()
