"""Bag-of-words training speed: today's step against the previous one, and both against the machine's roofline.

For ASTRA and DEXML-BoW (the shipped ``astra`` and ``dexml_bow`` runs), in one process on the same data:

* ``old``: torch's SparseAdam for the embedding tables and, for ASTRA, k_r uniform negatives drawn per query
  (B x k_r classifier rows gathered per step): the settings before this benchmark existed;
* ``new``: the shipped settings (RowAdam, and ASTRA's ``uniform_shared`` draw: one matrix product).

Each variant trains ``--epochs`` full epochs (after a warm-up step) from the same initialisation; the figure is
sentences per second of the training loop (ANN refreshes included, checkpoint writes excluded, as the trainer
reports an epoch), plus the wall time.

Roofline: per step, the bytes the step must move at least (embedding rows gathered and their gradients, the
optimiser's read-modify-write of the touched rows and their two moments) and the FLOPs it must do (bag sums,
candidate scores, their backward), counted from the real batches of the run; the machine's peaks are measured
in the same process (a large in-memory copy for bandwidth, a matrix product for FLOP/s). The roofline time of an
epoch is sum over steps of max(bytes / bandwidth, FLOPs / peak); measured / roofline says how far a step is from
what the hardware allows.

    python -m bench.bow_training_speed [--epochs 1] [--processed data/processed] [--out bench/bow_training_speed.json]

Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def machine_peaks(seconds: float = 2.0) -> dict[str, float]:
    """Memory bandwidth (GB/s, read + write of a 512 MB copy) and fp32 matrix-product GFLOP/s on this process's threads."""
    a = torch.empty(128 << 20, dtype=torch.float32).uniform_()
    b = torch.empty_like(a)
    b.copy_(a)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b.copy_(a)
        n += 1
    bw = 2 * a.numel() * 4 * n / (time.perf_counter() - t0) / 1e9
    del a, b
    m = torch.randn(2048, 2048)
    torch.mm(m, m)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(m, m)
        n += 1
    flops = 2 * 2048**3 * n / (time.perf_counter() - t0) / 1e9
    return {"bandwidth_GBps": round(bw, 2), "matmul_GFLOPs": round(flops, 1)}


def _bag_tokens(model: Any, texts: list[str]) -> tuple[int, int]:
    """(token occurrences, unique rows) of the bag-of-words tables for these texts."""
    enc = model.encoder
    ids = [enc._ids(t) for t in texts]
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return len(flat), len(np.unique(flat))


def step_cost(method: str, model: Any, batch: Any, texts: list[str], label_texts: list[str]) -> tuple[float, float]:
    """(bytes, FLOPs) one training step must at least move / do, from its batch."""
    d = model.encoder.dim
    q_texts = [texts[i] for i in batch.query_idx]
    tok_q, uniq_q = _bag_tokens(model, q_texts)
    B = len(q_texts)
    if method == "astra":
        cand = batch.extras["candidates"].numpy()
        valid = batch.valid.numpy()
        n_pairs = int(valid.sum())
        shared = batch.extras.get("shared_uniform")
        R = 0 if shared is None else len(shared)
        rows_w = len(np.union1d(cand[valid], shared.numpy() if shared is not None else []))
        gathered_w = n_pairs + R                                   # classifier rows read for the scores
        flops = 3 * 2 * (n_pairs + B * R) * (d + 1) + 3 * tok_q * d   # scores fwd + 2x bwd; bag sum fwd/bwd
        moved = (gathered_w * (d + 1) * 4 * 2                      # rows read, their gradient written
                 + tok_q * d * 4 * 2                               # bag rows read, gradient written
                 + (rows_w * (d + 1) + uniq_q * d) * 4 * 7)        # Adam: read g, p, m, v; write p, m, v
        return float(moved), float(flops)
    labels = batch.label_ids
    tok_l, uniq_l = _bag_tokens(model, [label_texts[i] for i in labels])
    P = len(labels)
    uniq = len(np.union1d(np.unique(np.concatenate([model.encoder._ids(texts[i]) for i in batch.query_idx])),
                          np.unique(np.concatenate([model.encoder._ids(label_texts[i]) for i in labels]))))
    flops = 3 * 2 * B * P * d + 3 * (tok_q + tok_l) * d
    moved = (tok_q + tok_l) * d * 4 * 2 + uniq * d * 4 * 7 + (B + P) * d * 4 * 2
    return float(moved), float(flops)


def run_variant(method: str, run: str, overrides: dict[str, Any], params: dict[str, Any], ds: Any, epochs: int,
                peaks: dict[str, float]) -> dict[str, Any]:
    from xmc.config.schema import deep_merge
    from xmc.methods import get_method
    from xmc.methods.base import RunContext
    from xmc.methods.runs import RunSpec, find_run
    from xmc.train import Trainer, TrainConfig

    spec = find_run(params, run)
    cfg = deep_merge(spec.config, overrides)
    cfg["train"]["epochs"] = epochs
    cfg["train"]["eval_every_epochs"] = 0
    with tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(params, RunSpec(run, spec.method, cfg), Path(tmp) / "model", Path(tmp) / "work",
                         Path(tmp) / "plots")
        torch.manual_seed(int(cfg["train"]["seed"]))
        parts = get_method(spec.method).build(ctx, ds)
        trainer = Trainer(parts.model, parts.sampler, parts.objective, TrainConfig.from_params(cfg["train"]),
                          ds.trn.texts, ctx.work_dir, fingerprint_extra=parts.fingerprint)
        # the roofline of the epochs about to run, from their real batches (same seeds as the trainer's)
        bytes_, flops = [], []
        sampler = parts.sampler
        batches = sampler.query_batches(0, trainer.cfg.batch_size, trainer.cfg.seed)[: trainer.steps_per_epoch]
        for i, qi in enumerate(batches[:8]):
            b = sampler.make_batch(qi, np.random.default_rng([trainer.cfg.seed, 0, i]))
            m, f = step_cost(method, parts.model, b, ds.trn.texts, ds.label_texts)
            bytes_.append(m)
            flops.append(f)
        per_step = max(np.mean(bytes_) / (peaks["bandwidth_GBps"] * 1e9), np.mean(flops) / (peaks["matmul_GFLOPs"] * 1e9))
        t0 = time.perf_counter()
        result = trainer.fit()
        wall = time.perf_counter() - t0
    epochs_h = result["history"]["epochs"]
    loop = sum(e["seconds"] for e in epochs_h)
    n = sum(e["steps"] for e in epochs_h) * trainer.cfg.batch_size
    n = min(n, len(ds.trn) * len(epochs_h))
    roof = per_step * trainer.steps_per_epoch * len(epochs_h)
    return {"epochs": len(epochs_h), "loop_seconds": round(loop, 2), "wall_seconds": round(wall, 2),
            "sentences_per_s": round(n / loop, 1), "final_loss": result["history"]["loss"][-1]["loss"],
            "step_bytes_MB": round(float(np.mean(bytes_)) / 1e6, 1), "step_GFLOP": round(float(np.mean(flops)) / 1e9, 2),
            "roofline_seconds": round(float(roof), 2), "measured_over_roofline": round(float(loop / roof), 1)}


VARIANTS = {
    "astra": {"old": {"train": {"sparse_optimizer": "torch_sparse_adam"}, "negatives": {"uniform_shared": False}},
              "new": {},
              # the selection candidate astra_shared_uniform (a validation tie on P@5 with the per-query draw)
              "new_shared_uniform": {"negatives": {"uniform_shared": True, "uniform_negatives": 2000}}},
    "dexml_bow": {"old": {"train": {"sparse_optimizer": "torch_sparse_adam"}}, "new": {}},
}


def main() -> None:
    from xmc.config import load_params, set_offline_env

    set_offline_env()
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--runs", default="astra,dexml_bow")
    ap.add_argument("--out", default="bench/bow_training_speed.json")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))
    from xmc.data import load_processed

    params = load_params()
    ds = load_processed(a.processed, splits=("trn", "val"))
    peaks = machine_peaks()
    print("machine peaks:", peaks, flush=True)
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                       "python": platform.python_version(), "torch": torch.__version__, **peaks},
                           "train_sentences": len(ds.trn), "epochs": a.epochs, "runs": {}}
    for run in a.runs.split(","):
        res = {}
        for variant in VARIANTS[run]:
            res[variant] = run_variant(run, run, VARIANTS[run][variant], params, ds, a.epochs, peaks)
            print(run, variant, res[variant], flush=True)
        for variant in VARIANTS[run]:
            if variant != "old":
                res[f"speedup_{variant}_over_old"] = round(res[variant]["sentences_per_s"] / res["old"]["sentences_per_s"], 2)
        res["settings"] = VARIANTS[run]  # what each variant changes on the shipped run
        out["runs"][run] = res
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({r: {k: x for k, x in v.items() if k.startswith("speedup")} for r, v in out["runs"].items()}))


if __name__ == "__main__":
    main()
