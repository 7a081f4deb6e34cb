"""Data-parallel training on this machine: throughput with 1 and 2 ranks, and per-rank classifier-table memory at
10^6 labels with 1, 2 and 4 ranks (label-sharded tables, ``xmc.trainer.label_table``).

1. **Throughput** on the processed training split (``data/processed``, run ``make run`` or ``dvc repro ingest``
   first): the product's ``dexml_bow`` run (bag-of-words dual encoder, hard-negative pool) and ``astra`` (its
   bag-of-words profile, classifier table sharded by label), ``--steps`` steps of the params' global batch after
   ``--warmup`` untimed ones. World 1 is one process with every core; world 2 is ``torchrun --nproc_per_node 2``
   with the cores split between the ranks (gloo). Sentences per second = steps x global batch / seconds; the same
   global batches in both, so the ratio is the speed-up data parallelism gives on this machine.
2. **CPU seconds**: the same steps with one thread per rank, 1 process against ``torchrun --nproc_per_node 2``:
   the CPU seconds of all ranks over the timed steps (``time.process_time``: every thread, gloo's too), sentences
   per CPU-second, their ratio (data parallelism divides the work when it is near 1) and the wall-clock speed-up.
3. **Memory**: ``--labels`` (10^6) x ``--dim`` rows (ASTRA's d + 1 bias column), sharded over 1, 2 and 4 CPU
   ranks; each rank scores ``--batch`` queries against ``--candidates`` candidate labels per step through the
   collective of the real training path, backpropagates and takes a lazy-Adam step (UniDEC's Ψ; ASTRA's SGD keeps
   no state). Reported per rank: rows held, table MiB, optimiser-state MiB, peak RSS and its growth over the RSS
   before the table was built, and the time per step.

    python -m lab.bench.distributed_training [--steps 30] [--labels 1000000] [--parts throughput,cpu,memory] \\
        [--methods dexml_bow,astra] [--out lab/bench/distributed_training.json]

Not a test: run it on an idle machine. Prints ratios against world 1 measured in the same command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.bench.unidec_memory import peak_rss_mb, rss_mb

ROOT = Path(__file__).resolve().parents[2]   # the repository: the children import lab.bench from it


# ---- children (one per rank under torchrun, or one process) ------------------------------------------------------
def throughput_child(a: argparse.Namespace) -> None:
    from xmc.config import load_params
    from xmc.config.runs import resolve_run
    from xmc.data import load_processed
    from xmc.trainer.trainer import Trainer, TrainConfig
    from xmc.trainer.distributed import context, init_from_env
    from xmc.workspace import product_workspace

    ctx = init_from_env()
    torch.set_num_threads(a.threads_per_rank or max(1, (os.cpu_count() or 1) // ctx.world))
    params = load_params()
    ds = load_processed(product_workspace(params).processed, splits=("trn",))
    Y, texts, labels = ds.trn.Y, ds.trn.texts, ds.label_texts
    steps = a.warmup + a.steps
    if a.method == "dexml_bow":
        from xmc.encoders.build import build_encoder
        from xmc.losses import build_loss
        from xmc.models.dual_encoder import DualEncoderModel
        from xmc.negatives import build_sampler

        cfg = resolve_run(params, "dexml_bow").config
        torch.manual_seed(0)
        model = DualEncoderModel(build_encoder(cfg["encoder"]), labels)
        # the hard-negative pool from the first step (mined once, before the timed window)
        sampler = build_sampler(Y, {**cfg["negatives"], "start_epoch": 0})
        loss = build_loss(cfg["loss"]["name"], **{k: v for k, v in cfg["loss"].items() if k != "name"})
        tcfg = {**cfg["train"]}
    else:
        from xmc.methods.astra import ASTRAObjective, build_astra_model, build_astra_sampler

        cfg = resolve_run(params, "astra").config
        torch.manual_seed(0)
        model = build_astra_model(cfg["encoder"], cfg["model"], labels, Y, shard_labels=True)
        sampler = build_astra_sampler(Y, model.dim, dict(cfg["negatives"]), None)
        loss = ASTRAObjective()
        tcfg = {**cfg["train"]}
    tcfg.update(epochs=1, max_steps_per_epoch=steps, checkpoint_every_steps=0, eval_every_epochs=0)
    times: list[float] = []
    cpu: list[float] = []   # this process's CPU seconds (every thread: gloo's too) at each step start

    class Timed:   # wraps the sampler: wall and CPU time between step starts
        def __init__(self, inner: Any) -> None:
            self.__dict__["inner"] = inner

        def on_step_start(self, step: int, m: Any, q: Any) -> None:
            times.append(time.perf_counter())
            cpu.append(time.process_time())
            self.inner.on_step_start(step, m, q)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(model, Timed(sampler), loss, TrainConfig.from_params(tcfg), texts, tmp)
        t_fit = time.perf_counter()
        tr.fit()
        times.append(time.perf_counter())
        cpu.append(time.process_time())
    timed = times[a.warmup :]
    seconds = timed[-1] - timed[0]
    my_cpu = cpu[-1] - cpu[a.warmup]
    if ctx.world > 1:   # the CPU seconds of every rank over the same timed steps
        import torch.distributed as dist

        every = [None] * ctx.world
        dist.all_gather_object(every, my_cpu)
    else:
        every = [my_cpu]
    batch = int(tcfg["batch_size"])
    sentences = (len(timed) - 1) * batch
    if context().is_main:
        Path(a.result).write_text(json.dumps({
            "method": a.method, "world": ctx.world, "threads_per_rank": torch.get_num_threads(),
            "global_batch": batch, "timed_steps": len(timed) - 1, "seconds": round(seconds, 3),
            "sentences_per_s": round(sentences / seconds, 1),
            "cpu_seconds_per_rank": [round(c, 3) for c in every], "cpu_seconds": round(sum(every), 3),
            "sentences_per_cpu_s": round(sentences / sum(every), 1),
            "fit_seconds_with_setup": round(time.perf_counter() - t_fit, 2),
            "last_loss": tr.history["loss"][-1]["loss"]}))


def memory_child(a: argparse.Namespace) -> None:
    from xmc.trainer.distributed import init_from_env
    from xmc.trainer.label_table import LabelTable
    from xmc.trainer.row_adam import RowAdam

    ctx = init_from_env()
    torch.set_num_threads(1)
    rss0 = rss_mb()
    table = LabelTable(a.labels, a.dim, shard=True, init_std=a.dim**-0.5)
    opt = RowAdam([{"params": [table.weight], "lr": 1e-3}])
    rng = np.random.default_rng(0)   # the same draws on every rank: the same global batch
    step_s = []
    for s in range(a.mem_steps):
        q = torch.from_numpy(rng.standard_normal((a.batch, a.dim), dtype=np.float32)).requires_grad_(True)
        ids = torch.from_numpy(rng.integers(0, a.labels, (a.batch, a.candidates)))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        scores = table.scores(q, ids)
        (torch.nn.functional.softplus(scores).sum(1).mean() / ctx.world).backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
    state = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
    row = {"rank": ctx.rank, "rows_held": table.weight.shape[0],
           "table_mib": round(table.weight.numel() * 4 / 2**20, 1), "optimizer_state_mib": round(state / 2**20, 1),
           "peak_rss_mib": round(peak_rss_mb(), 1), "rss_growth_mib": round(rss_mb() - rss0, 1),
           "step_seconds": round(float(np.median(step_s[1:] or step_s)), 4)}
    import torch.distributed as dist

    rows = [None] * ctx.world if ctx.world > 1 else None
    if ctx.world > 1:
        dist.all_gather_object(rows, row)
    else:
        rows = [row]
    if ctx.rank == 0:
        Path(a.result).write_text(json.dumps({"world": ctx.world, "labels": a.labels, "dim": a.dim, "ranks": rows}))


# ---- the driver --------------------------------------------------------------------------------------------------
def launch(world: int, args: list[str], result: Path, timeout: int = 3600) -> dict[str, Any]:
    env = {**os.environ, "XMC_THREADS": str(os.cpu_count() or 1),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    if world == 1:
        cmd = [sys.executable, "-m", "lab.bench.distributed_training", *args, "--result", str(result)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               "-m", "lab.bench.distributed_training", *args, "--result", str(result)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", choices=["throughput", "memory"])
    ap.add_argument("--method", default="dexml_bow", choices=["dexml_bow", "astra"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=769, help="table width (ASTRA: d + 1 bias column; d = 768 here)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--candidates", type=int, default=450)
    ap.add_argument("--mem-steps", type=int, default=5)
    ap.add_argument("--worlds", default="1,2,4", help="memory part: the world sizes")
    ap.add_argument("--threads-per-rank", type=int, default=0, help="throughput child: torch threads (0: cores / world)")
    ap.add_argument("--methods", default="dexml_bow,astra")
    ap.add_argument("--parts", default="throughput,cpu,memory")
    ap.add_argument("--result")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "distributed_training.json"))
    a = ap.parse_args()
    from xmc.config import set_offline_env

    set_offline_env()
    if a.child == "throughput":
        return throughput_child(a)
    if a.child == "memory":
        return memory_child(a)
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "cuda": torch.cuda.is_available(),
                                       "torch": torch.__version__, "backend": "nccl" if torch.cuda.is_available() else "gloo"},
                           "throughput": {}, "memory": []}
    parts = a.parts.split(",")
    methods = a.methods.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods if "throughput" in parts else ():
            rows = []
            for world in (1, 2):
                r = launch(world, ["--child", "throughput", "--method", method, "--steps", str(a.steps),
                                   "--warmup", str(a.warmup)], Path(tmp) / f"{method}{world}.json")
                rows.append(r)
                print(f"{method:10s} world {world}: {r['sentences_per_s']:8.1f} sentences/s "
                      f"({r['threads_per_rank']} threads/rank, global batch {r['global_batch']})", flush=True)
            ratio = rows[1]["sentences_per_s"] / rows[0]["sentences_per_s"]
            print(f"{method:10s} 2 ranks / 1 process: {ratio:.2f}x")
            out["throughput"][method] = {"runs": rows, "ratio_2_over_1": round(ratio, 3)}
        # the work itself: 2 ranks x 1 thread against 1 process x 1 thread on the same global batches. Data
        # parallelism divides the work when the two ranks spend about the CPU seconds of the one process
        out["cpu"] = {}
        for method in methods if "cpu" in parts else ():
            rows = [launch(world, ["--child", "throughput", "--method", method, "--steps", str(a.steps),
                                   "--warmup", str(a.warmup), "--threads-per-rank", "1"],
                           Path(tmp) / f"cpu_{method}{world}.json") for world in (1, 2)]
            cpu_ratio = rows[1]["cpu_seconds"] / rows[0]["cpu_seconds"]
            speed_up = rows[1]["sentences_per_s"] / rows[0]["sentences_per_s"]
            print(f"{method:10s} 1 thread per rank: {rows[0]['sentences_per_cpu_s']:.1f} -> "
                  f"{rows[1]['sentences_per_cpu_s']:.1f} sentences per CPU-second; CPU seconds 2 ranks / 1 process "
                  f"{cpu_ratio:.3f}x; wall-clock speed-up {speed_up:.2f}x", flush=True)
            out["cpu"][method] = {"runs": rows, "cpu_seconds_2_over_1": round(cpu_ratio, 3),
                                  "wall_speed_up": round(speed_up, 3)}
        base = None
        for world in (int(w) for w in a.worlds.split(",")) if "memory" in parts else ():
            r = launch(world, ["--child", "memory", "--labels", str(a.labels), "--dim", str(a.dim), "--batch",
                               str(a.batch), "--candidates", str(a.candidates), "--mem-steps", str(a.mem_steps)],
                       Path(tmp) / f"mem{world}.json")
            worst = max(r["ranks"], key=lambda x: x["table_mib"] + x["optimizer_state_mib"])
            per_rank = worst["table_mib"] + worst["optimizer_state_mib"]
            base = base or per_rank
            r["largest_rank_table_and_state_mib"] = round(per_rank, 1)
            r["fraction_of_world1"] = round(per_rank / base, 3)
            out["memory"].append(r)
            print(f"{a.labels:,} x {a.dim} table, {world} rank(s): {per_rank:8.1f} MiB table + Adam state per rank "
                  f"({per_rank / base:.3f} of 1 rank), peak RSS {max(x['peak_rss_mib'] for x in r['ranks']):.0f} MiB, "
                  f"step {worst['step_seconds'] * 1000:.0f} ms", flush=True)
    if Path(a.out).is_file():   # a partial run keeps the other parts' last record
        out = {**json.loads(Path(a.out).read_text()), **{k: v for k, v in out.items() if v}}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
