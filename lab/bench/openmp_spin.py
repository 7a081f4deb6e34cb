"""How long idle OpenMP workers busy-wait (``GOMP_SPINCOUNT``), measured on the training loops it affects.

The stages set ``GOMP_SPINCOUNT`` to ``xmc.machine.OPENMP_SPIN_COUNT`` before torch loads
(``short_openmp_spin``). libgomp reads it once, when it loads, so each setting needs its own process: this script
runs a worker per setting, alternating the settings round by round (a slow minute of the machine then falls on
every setting), and each worker times, with the current library:

* ``dexml_bow``: the shipped DEXML-BoW run's training loop for ``--epochs`` epochs (its hard-negative refresh
  included), as ``lab/bench/bow_training_speed.py`` times it; and its final loss (equal losses: the same computation);
* ``minilm``: the MiniLM encoder (all-MiniLM-L6-v2) embedding ``--texts`` training sentences, and ``--steps``
  fine-tuning steps of 64 sentences (forward, backward, AdamW); and the sum of the embeddings.

    python -m lab.bench.openmp_spin [--spins 300000,20000] [--rounds 3] [--epochs 3] [--texts 3000] [--steps 8]
                                    [--processed data/processed] [--out lab/bench/openmp_spin.json]

300,000 is libgomp's default. Prints each setting's median times and their ratio to the first setting's.
Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]   # the repository: the workers run from it


def worker(processed: str, epochs: int, n_texts: int, steps: int) -> dict[str, Any]:
    """The timings of one process (its ``GOMP_SPINCOUNT`` is set by the parent)."""
    from xmc.config import set_offline_env

    set_offline_env()
    import numpy as np
    import torch

    from lab.bench.bow_training_speed import run_variant
    from xmc.config import load_params
    from xmc.data import load_processed
    from xmc.encoders.transformer import TransformerEncoder

    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))
    params = load_params()
    ds = load_processed(processed, splits=("trn", "val"))
    peaks = {"bandwidth_GBps": 1.0, "matmul_GFLOPs": 1.0}   # the roofline is bow_training_speed's business
    bow = run_variant("dexml_bow", "dexml_bow", {}, params, ds, epochs, peaks)
    enc = TransformerEncoder()
    texts = list(ds.trn.texts[:n_texts])
    enc.encode(texts[:256])   # warm-up: first-call allocations and kernel choices
    t0 = time.perf_counter()
    vectors = enc.encode(texts)
    encode_s = time.perf_counter() - t0
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5)
    t0 = time.perf_counter()
    for i in range(steps):
        q = enc(texts[(i * 64) % max(1, len(texts) - 64):][:64])
        (q @ q.T).logsumexp(-1).mean().backward()   # an in-batch softmax's shape of work
        opt.step()
        opt.zero_grad()
    train_s = time.perf_counter() - t0
    return {"dexml_bow_loop_seconds": bow["loop_seconds"], "dexml_bow_final_loss": bow["final_loss"],
            "minilm_encode_seconds": round(encode_s, 2), "minilm_train_seconds": round(train_s, 2),
            "minilm_embedding_sum": float(np.asarray(vectors, dtype=np.float64).sum())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spins", default="300000,20000", help="GOMP_SPINCOUNT values; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--texts", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "openmp_spin.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:   # one line of JSON on stdout
        print(json.dumps(worker(a.processed, a.epochs, a.texts, a.steps)))
        return
    spins = [s.strip() for s in a.spins.split(",") if s.strip()]
    base_env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in spins}
    for r in range(a.rounds):
        for spin in spins:
            cmd = [sys.executable, "-m", "lab.bench.openmp_spin", "--worker", "--processed", a.processed,
                   "--epochs", str(a.epochs), "--texts", str(a.texts), "--steps", str(a.steps)]
            p = subprocess.run(cmd, cwd=ROOT, env={**base_env, "GOMP_SPINCOUNT": spin}, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"the worker with GOMP_SPINCOUNT={spin} failed:\n{p.stderr[-3000:]}")
            runs[spin].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{a.rounds} GOMP_SPINCOUNT={spin}: {runs[spin][-1]}", flush=True)
    import numpy as np

    from xmc.machine import describe_machine

    keys = ("dexml_bow_loop_seconds", "minilm_encode_seconds", "minilm_train_seconds")
    medians = {s: {k: float(np.median([x[k] for x in runs[s]])) for k in keys} for s in spins}
    out = {"machine": {"cpus": os.cpu_count(), **{k: v for k, v in describe_machine(measure=False).items()
                                                  if k in ("cpu", "vector_isa")}},
           "settings": {"epochs": a.epochs, "texts": a.texts, "steps": a.steps, "rounds": a.rounds},
           "baseline": spins[0], "runs": runs, "medians": medians,
           "ratio_to_baseline": {s: {k: round(medians[spins[0]][k] / medians[s][k], 3) for k in keys} for s in spins},
           # the same computation whatever the spin: equal losses and embeddings
           "same_results": all(x["dexml_bow_final_loss"] == runs[spins[0]][0]["dexml_bow_final_loss"]
                               and x["minilm_embedding_sum"] == runs[spins[0]][0]["minilm_embedding_sum"]
                               for s in spins for x in runs[s])}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"ratio_to_baseline (baseline seconds / these seconds)": out["ratio_to_baseline"],
                      "same_results": out["same_results"]}))


if __name__ == "__main__":
    main()
