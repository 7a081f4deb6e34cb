"""Peak memory and time per epoch: UniDEC's pick-some-labels training vs DEXML's all-labels mode.

Same data (the processed training split), encoder config, batch size and number of timed steps;
each mode runs in its own subprocess so peak memory is not shared:

* ``unidec``     - UniDECModel (DE + CLF heads, Ψ), PickSomeLabelsSampler (≤β positives + η hard
                   negatives per query, clustered batches), UniDECObjective (DS both heads, both ways);
* ``dexml_all``  - DualEncoderModel, ``negatives.kind: all`` (every label scored for every query, the
                   trainer's gradient caching over ``label_chunk_size`` chunks), DecoupledSoftmax.

Memory: on GPU ``torch.cuda.max_memory_allocated`` during the timed steps; on CPU the process's peak
RSS (``resource.getrusage``) and its growth over the RSS before training (the model and data being
the same kind in both, the growth is the training-time working set: activations, score blocks,
optimiser state). Time per epoch = mean step time x steps per epoch (+ UniDEC's shortlist and
clustering refresh, amortised over its refresh period τ).

    python -m lab.bench.unidec_memory [--steps 8] [--encoder bow|transformer] [--batch-size 256] [--beta 3]
                                      [--eta 6] [--tau 5] [--shortlist 0] [--out f.json]

Prints both modes and the ratios DEXML-all / UniDEC. Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch

from xmc.config import set_offline_env


def rss_mb() -> float:
    """Current resident set size (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def encoder_cfg(kind: str) -> dict[str, Any]:
    if kind == "bow":
        return {"kind": "bow", "dim": 256, "n_buckets": 262144, "ngram_max": 2, "tied": True}
    return {"kind": "transformer", "model_dir": None, "max_len_query": 32, "max_len_label": 32,
            "freeze_embeddings": True}


def child(a: argparse.Namespace) -> dict[str, Any]:
    from xmc.data import load_processed
    from xmc.encoders.build import build_encoder
    from xmc.losses import DecoupledSoftmaxLoss
    from xmc.methods.unidec import PickSomeLabelsSampler, UniDECModel, UniDECObjective
    from xmc.models.dual_encoder import DualEncoderModel
    from xmc.negatives import AllLabels
    from xmc.trainer.trainer import Trainer, TrainConfig

    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))
    torch.manual_seed(0)
    ds = load_processed(a.processed)
    enc = build_encoder(encoder_cfg(a.encoder))
    lr = 0.01 if a.encoder == "bow" else 1e-4
    steps = a.warmup + a.steps
    cfg = TrainConfig(epochs=1, batch_size=a.batch_size, lr=lr, max_steps_per_epoch=steps, warmup_ratio=0.0,
                      label_chunk_size=a.label_chunk, seed=0)
    refresh_s = 0.0
    if a.child == "unidec":
        model = UniDECModel(enc, ds.label_texts, dim=256, dropout=0.1)
        sampler = PickSomeLabelsSampler(ds.trn.Y, max_positives_per_query=a.beta, negatives_per_query=a.eta,
                                        shortlist_size=a.shortlist or a.eta * a.tau, refresh_every_epochs=a.tau,
                                        start_epoch=0,
                                        cluster_size=16)
        objective: Any = UniDECObjective(bce_weight=0.0)
    else:
        model = DualEncoderModel(enc, ds.label_texts)
        sampler = AllLabels(ds.trn.Y)
        objective = DecoupledSoftmaxLoss(0.05)
    trainer = Trainer(model, sampler, objective, cfg, ds.trn.texts, a.work_dir)
    steps_per_epoch = len(sampler.query_batches(0, a.batch_size, 0))
    if a.child == "unidec":  # the refresh (shortlist + clusters) runs outside the timed steps
        t0 = time.perf_counter()
        sampler.on_epoch_start(0, model, ds.trn.texts)
        refresh_s = time.perf_counter() - t0
    on_gpu = trainer.device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss0 = rss_mb()
    step_times: list[float] = []
    batches = sampler.query_batches(0, a.batch_size, 0)[:steps]
    model.train()
    for i, q in enumerate(batches):
        t0 = time.perf_counter()
        batch = sampler.make_batch(q, np.random.default_rng([0, i]))
        for o in trainer.optimizers:
            o.zero_grad(set_to_none=True)
        trainer._step(batch)  # the trainer's own step (all-labels: its gradient-cached path)
        for o in trainer.optimizers:
            o.step()
        if on_gpu:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
    timed = step_times[a.warmup:]
    step_s = float(np.mean(timed))
    out = {
        "mode": a.child, "encoder": a.encoder, "device": str(trainer.device), "batch_size": a.batch_size,
        "timed_steps": len(timed), "step_seconds": round(step_s, 4), "steps_per_epoch": steps_per_epoch,
        "refresh_seconds": round(refresh_s, 2),
        "epoch_seconds": round(step_s * steps_per_epoch + (refresh_s / a.tau if a.child == "unidec" else 0.0), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1), "rss_before_training_mb": round(rss0, 1),
        "train_rss_growth_mb": round(peak_rss_mb() - rss0, 1),
        "labels_scored_per_query": ds.n_labels if a.child == "dexml_all" else None,
    }
    if a.child == "unidec":
        pools = [sampler.make_batch(q, np.random.default_rng([1, i])).label_ids.size for i, q in enumerate(batches)]
        out["labels_scored_per_query"] = round(float(np.mean(pools)), 1)
    if on_gpu:
        out["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def main() -> None:
    set_offline_env()
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--encoder", choices=("bow", "transformer"), default="bow")
    ap.add_argument("--label-chunk", type=int, default=2048)
    ap.add_argument("--beta", type=int, default=3)
    ap.add_argument("--eta", type=int, default=6)
    ap.add_argument("--tau", type=int, default=5, help="refresh period (epochs) the refresh time is amortised over")
    ap.add_argument("--shortlist", type=int, default=0, help="ANN shortlist |H| per query (0 = eta x tau, the paper)")
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--work-dir", default="/tmp/unidec_memory_bench")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--child", choices=("unidec", "dexml_all"), default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a)))
        return
    results = {}
    for mode in ("unidec", "dexml_all"):
        cmd = [sys.executable, "-m", "lab.bench.unidec_memory", "--child", mode,
               "--work-dir", f"{a.work_dir}/{mode}"]
        for opt in ("steps", "warmup", "batch_size", "encoder", "label_chunk", "beta", "eta", "tau", "shortlist",
                    "processed"):
            cmd += [f"--{opt.replace('_', '-')}", str(getattr(a, opt))]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        results[mode] = json.loads(line[-1][len("RESULT "):])
    u, d = results["unidec"], results["dexml_all"]
    ratios = {
        "epoch_time_dexml_all_over_unidec": round(d["epoch_seconds"] / u["epoch_seconds"], 2),
        "step_time_dexml_all_over_unidec": round(d["step_seconds"] / u["step_seconds"], 2),
        "peak_rss_dexml_all_over_unidec": round(d["peak_rss_mb"] / u["peak_rss_mb"], 2),
        "train_rss_growth_dexml_all_over_unidec": round(d["train_rss_growth_mb"] / max(u["train_rss_growth_mb"], 1e-3), 2),
        "labels_scored_dexml_all_over_unidec": round(d["labels_scored_per_query"] / u["labels_scored_per_query"], 1),
    }
    if "gpu_peak_mb" in u and "gpu_peak_mb" in d:
        ratios["gpu_peak_dexml_all_over_unidec"] = round(d["gpu_peak_mb"] / u["gpu_peak_mb"], 2)
    results["ratios"] = ratios
    results["settings"] = {k: getattr(a, k) for k in ("steps", "warmup", "batch_size", "encoder", "label_chunk", "beta",
                                                       "eta", "tau", "shortlist")}
    results["settings"]["threads"] = os.environ.get("XMC_THREADS", "all")
    results["settings"]["note"] = ("epoch_seconds = mean of the timed steps x steps_per_epoch (+ refresh / tau for "
                                   "UniDEC): an extrapolation from the timed steps, not a full epoch")
    for mode in ("unidec", "dexml_all"):
        print(mode, json.dumps(results[mode]))
    print("ratios", json.dumps(ratios))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
