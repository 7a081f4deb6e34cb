"""Bag-of-words training speed: today's step against the code the speed issue was filed on, and against the roofline.

For ASTRA and DEXML-BoW (the shipped ``astra`` and ``dexml_bow`` runs; ``--runs`` also takes ``ramen`` and ``unidec``,
the other two bag-of-words methods), in one command on the same data:

* ``reference``: the library at ``--reference`` (default 4d3dee1, the code when issue 19 asked for a 5x faster
  step), checked out in a temporary git worktree and measured by this script's own code in a subprocess, with that
  commit's params;
* ``new``: the current library and params;
* ``new_torch_row_adam``: the same with RowAdam's torch path instead of its C kernel (``xmc/native``), to show
  what the kernel alone gives;
* ``new_paper_negatives`` (ASTRA): the paper's mixture (k_h = 20 stale hard + k_r = 200 weighted uniform negatives)
  for 6 epochs, the reference's settings: the same computation as the reference (equal final losses), so its ratio is
  the code's speed-up alone, where ``new`` also carries the defaults chosen since (hard negatives only, k_h = 500,
  2^19 hashed rows, 16 epochs: ``lab/docs/selection.md``, rounds 16-18);
* ``new_shared_uniform`` (ASTRA): the selection candidate ``astra_shared_uniform`` (k_h = 20 and one uniform draw of
  2,000 labels per batch: lab/docs/selection.md);
* ``new_ivf_mining``: the selection candidates ``astra_ivf_mining_kmeans3`` / ``dexml_bow_ivf_mining_kmeans3`` (hard
  negatives from an IVF index whose centroids get 3 k-means iterations, rebuilt at each refresh);
* ``new_refresh_every_5_epochs`` (DEXML-BoW): the selection candidate ``dexml_bow_refresh5``, the shortlist re-mined
  every 5 epochs (the DEXML code's interval; the default, like the reference, re-mines at every epoch).
* ``new_reference_size`` (DEXML-BoW, RAMEN, UniDEC): the reference's encoder size (d = 256 over 2^18 hashed rows; for
  UniDEC heads of 256: the selection candidates ``dexml_bow_narrow``, ``ramen_narrow``, ``unidec_narrow``), where
  ``new`` also trains the wider table chosen since (d = 768 over 2^19 rows, ``lab/docs/selection.md``, rounds 19-20).
  RAMEN's and UniDEC's other defaults also changed since the reference (RAMEN without its query graph, UniDEC's
  unseen-label rows and dropout), so for them this is the code at the reference's table, not the same computation.

``--candidates '{"d320": {"encoder": {"dim": 320}}}'`` adds variants of one's own (overrides of the shipped run, as
``lab.bench.seed_study --candidates``), and ``--variants new,d320`` trains only those variants in the first pair
(default: every variant of the run; the paired variant always): any setting's speed against the reference.

Each variant trains ``--epochs`` full epochs (``0``: as many as its run trains in ``make run``, each side by its own
params) from the same initialisation; the figure is sentences per second of
the training loop (ANN refreshes included, checkpoint writes excluded, as the trainer reports an epoch), plus the
wall time, and the final loss (equal losses: the same computation).

Roofline: per step, the bytes the step must move at least (embedding rows gathered and their gradients, the
optimiser's read-modify-write of the touched rows and their two moments) and the FLOPs it must do (bag sums,
candidate scores, their backward), counted from the real batches of the run; the machine's peaks are measured
in the same process (a large in-memory copy for bandwidth, a matrix product for FLOP/s). The roofline time of an
epoch is sum over steps of max(bytes / bandwidth, FLOPs / peak), plus, for each hard-negative refresh the run did,
the search of the training queries it mined (all, or those the steps until the next refresh draw) against every
label at the matrix-product peak (exact: 2 N L d FLOPs; IVF
mining: its k-means, assignment, coarse search and scanned lists; encoding the texts is small beside it); measured / roofline says how far the loop is from what the hardware allows.
The roofline is counted for ASTRA and DEXML-BoW only (issue 19's two targets); RAMEN's anchor sets and UniDEC's
heads and classifier table are not in ``step_cost``, so their rows carry times and no roofline.

    python -m lab.bench.bow_training_speed [--epochs 3] [--processed data/processed] [--reference 4d3dee1]
                                           [--runs astra,dexml_bow] [--repeats 3] [--validate] [--seeds]
                                           [--out lab/bench/bow_training_speed.json]

The current side's runs are the product's (params.yaml ``runs``, the variants overrides of them checked against
the method's schema); the reference worker runs this file inside the reference commit's worktree with that
commit's library and params (its own run lookup, ``xmc.methods.runs.find_run``): :func:`run_spec` and
:func:`training_context` speak to both libraries, and nothing the worker runs imports ``lab``.

``--validate``: the first pair's models (reference and ``new``) also rank the validation split (exact search: DEXML-BoW
and RAMEN by their label vectors, UniDEC in its main space, ASTRA by its classifiers), and the JSON gets both sides' P@1 / P@5 / PSP@5 / R@100 and the
paired bootstrap of new − reference with the pipeline's evaluation settings (params.yaml ``evaluate``): the
speed-up's "at equal or better validation metrics", measured in the same command.

``--paired-variant new_ivf_mining`` (for example) pairs that variant with the reference in the repeats and in
``--validate`` instead of the shipped run ("new" in the JSON's repeats and validation then means that variant).

``--seeds`` (with ``--validate``): pair i trains both sides from seed i (the encoder's initialisation and the batch
order, as the ``*_seed1`` runs differ), every pair ranks the validation split, and ``validation_over_seeds`` gives
each side's mean and sd over the seeds and new − reference as a mean with a t-interval and the paired t-test's p:
a difference that one trained pair's sentence bootstrap calls significant can still be within what retraining
from another seed moves.

The loop times of one run on this machine vary by 10-20 % between minutes, as much as the distance to a target, so
the reference and ``new`` are measured ``--repeats`` times, alternately (each pair close in time), and the figure
is the median of the pairs' speed-ups with their range (``speedup_new_over_reference_median`` / ``_range``); the
other variants run once, in the first pair.

The current library shortens the busy-wait of idle OpenMP workers (``GOMP_SPINCOUNT``, set by the stages before
torch loads: ``xmc.machine.short_openmp_spin``); this script sets it the same way for the current library and
leaves the reference worker with libgomp's default, as that commit ran. A ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` of
yours is kept on both sides (``GOMP_SPINCOUNT=300000``, libgomp's default, measures the current library without it).

Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def machine_peaks(seconds: float = 2.0) -> dict[str, float]:
    """Memory bandwidth (GB/s, read + write of a 512 MB copy) and fp32 matrix-product GFLOP/s on this process's threads."""
    import torch

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


def _flat_ids(enc: Any, texts: list[str]) -> np.ndarray:
    """The hashed ids of these texts back to back, from the encoder's cache (today's batched one, or the
    reference library's per-text one)."""
    if hasattr(enc, "_id_cache"):
        return enc._id_cache.ids(texts)[0]
    ids = [enc._ids(t) for t in texts]
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


def _bag_tokens(model: Any, texts: list[str]) -> tuple[int, int]:
    """(token occurrences, unique rows) of the bag-of-words tables for these texts."""
    flat = _flat_ids(model.encoder, texts)
    return len(flat), len(np.unique(flat))


def step_cost(method: str, model: Any, batch: Any, texts: list[str], label_texts: list[str],
              moment_bytes: int = 4) -> tuple[float, float]:
    """(bytes, FLOPs) one training step must at least move / do, from its batch. ``moment_bytes``: the size of an
    Adam moment (4; 2 under ``train.sparse_moments: bf16``)."""
    d = model.encoder.dim
    adam = 4 * 3 + moment_bytes * 4   # per element of a touched row: read g and p, write p; read and write m and v
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
                 + (rows_w * (d + 1) + uniq_q * d) * adam)         # Adam: read g, p, m, v; write p, m, v
        return float(moved), float(flops)
    labels = batch.label_ids
    tok_l, uniq_l = _bag_tokens(model, [label_texts[i] for i in labels])
    P = len(labels)
    uniq = len(np.union1d(_flat_ids(model.encoder, [texts[i] for i in batch.query_idx]),
                          _flat_ids(model.encoder, [label_texts[i] for i in labels])))
    flops = 3 * 2 * B * P * d + 3 * (tok_q + tok_l) * d
    moved = (tok_q + tok_l) * d * 4 * 2 + uniq * d * adam + (B + P) * d * 4 * 2
    return float(moved), float(flops)


def rank_validation(model: Any, ds: Any, out: Path, k: int = 100) -> None:
    """The trained dual encoder's top-``k`` labels of every validation sentence by exact inner product (as
    ``predict@`` ranks at this label count), saved as ``indices`` / ``scores`` in ``out``; the parent scores both
    sides with the current metrics code. faiss directly, not ``xmc.ann``: in the reference worker ``xmc`` is that
    commit's library, so only what both sides share (the model's encode methods, faiss) is used here."""
    import faiss

    labels = np.ascontiguousarray(model.all_label_vectors(progress=False), dtype=np.float32)
    queries = np.ascontiguousarray(model.query_vectors_np(ds.val.texts, progress=False), dtype=np.float32)
    index = faiss.IndexFlatIP(labels.shape[1])
    index.add(labels)
    scores, indices = index.search(queries, k)
    np.savez(out, indices=indices.astype(np.int32), scores=scores.astype(np.float32))


def reference_library() -> bool:
    """Whether this process imports a library from before the runs map (the reference worker in its worktree):
    there ``xmc.methods.base`` still trained runs itself. (Asked of a module both libraries have: the editable
    install of the current one would fill in a top-level module the reference lacks, such as ``xmc.trainer``.)"""
    import xmc.methods.base as base

    return hasattr(base, "train_run")


def run_spec(params: dict[str, Any], run: str, overrides: dict[str, Any]) -> Any:
    """The run ``run`` of ``params`` with ``overrides`` of its settings, with the library this process imports: the
    current one resolves the product's runs map (overrides checked against the method's schema); the reference
    library (the worker, overrides always {}) has its own lookup."""
    from xmc.config.schema import deep_merge

    if reference_library():
        from xmc.methods.runs import RunSpec, find_run

        spec = find_run(params, run)
        return RunSpec(run, spec.method, deep_merge(spec.config, overrides))
    from xmc.config.runs import RunSpec, resolve_runs

    product, _ = resolve_runs(params["runs"], params)
    if run not in product:
        raise SystemExit(f"--runs {run}: not a run of params.yaml (have: {', '.join(product)})")
    key = f"{run}__variant"
    specs, problems = resolve_runs({key: {"base": run, **overrides}}, params, ("variant",), known=product)
    if problems:
        raise SystemExit("; ".join(f"{run}: {'.'.join(map(str, loc[2:]))}: {msg}" for loc, msg in problems))
    return RunSpec(run, specs[key].method, specs[key].config)


def training_context(params: dict[str, Any], spec: Any, tmp: Path, data_root: Path | None) -> Any:
    """The method's run context in the scratch folder ``tmp``, reading its features from ``data_root`` (the folder
    holding ``data/``), with either library."""
    from xmc.methods.base import RunContext

    if reference_library():   # (params, run, model_dir, work_dir, plots_dir)
        return RunContext(params, spec, tmp / "model", tmp / "work", tmp / "plots")
    from xmc.workspace import Workspace

    return RunContext(params, spec, tmp / "model", tmp / "work", tmp / "plots", None,
                      Workspace(tmp, data_root=data_root))


def trainer_classes() -> tuple[Any, Any]:
    """(Trainer, TrainConfig) of either library (the reference's trainer package was ``xmc.train``)."""
    if reference_library():
        from xmc.train import Trainer, TrainConfig
    else:
        from xmc.trainer.trainer import Trainer, TrainConfig
    return Trainer, TrainConfig


def run_variant(method: str, run: str, overrides: dict[str, Any], params: dict[str, Any], ds: Any, epochs: int,
                peaks: dict[str, float], val_topk: Path | None = None, seed: int | None = None,
                data_root: Path | None = None) -> dict[str, Any]:
    """One variant trained ``epochs`` epochs (its loop timed, its roofline counted); ``data_root``: the folder
    holding ``data/`` (``--processed`` is its ``data/processed``), where RAMEN's anchor sets are."""
    from xmc.methods import get_method

    import torch

    Trainer, TrainConfig = trainer_classes()
    spec = run_spec(params, run, overrides)
    cfg = spec.config
    if epochs > 0:   # else the run's own length, as `make run` trains it
        cfg["train"]["epochs"] = epochs
    cfg["train"]["eval_every_epochs"] = 0
    if data_root is not None and str(cfg.get("graph_dir", "")).startswith("data/"):
        # the reference library reads RAMEN's anchor sets from its settings: the graph stage's output beside
        # --processed (the reference worker runs in a bare worktree); the current one from the workspace's data
        cfg["graph_dir"] = str(data_root / str(cfg["graph_dir"]))
    if seed is not None:   # another training draw: the encoder's initialisation and the batch order, as seed runs do
        cfg["train"]["seed"] = seed
        if "seed" in cfg.get("encoder", {}):
            cfg["encoder"]["seed"] = seed
    with tempfile.TemporaryDirectory() as tmp:
        ctx = training_context(params, spec, Path(tmp), data_root)
        torch.manual_seed(int(cfg["train"]["seed"]))
        parts = get_method(spec.method).build(ctx, ds)
        trainer = Trainer(parts.model, parts.sampler, parts.objective, TrainConfig.from_params(cfg["train"]),
                          ds.trn.texts, ctx.work_dir, fingerprint_extra=parts.fingerprint)
        # the roofline of the epochs about to run, from their real batches (same seeds as the trainer's)
        bytes_, flops = [], []
        sampler = parts.sampler
        batches = (sampler.query_batches(0, trainer.cfg.batch_size, trainer.cfg.seed)[: min(8, trainer.steps_per_epoch)]
                   if method in ROOFLINE_RUNS else [])
        for i, qi in enumerate(batches):
            b = sampler.make_batch(qi, np.random.default_rng([trainer.cfg.seed, 0, i]))
            m, f = step_cost(method, parts.model, b, ds.trn.texts, ds.label_texts,
                             moment_bytes=2 if cfg["train"].get("sparse_moments") == "bf16" else 4)
            bytes_.append(m)
            flops.append(f)
        per_step = max(np.mean(bytes_) / (peaks["bandwidth_GBps"] * 1e9),
                       np.mean(flops) / (peaks["matmul_GFLOPs"] * 1e9)) if bytes_ else None
        t0 = time.perf_counter()
        result = trainer.fit()
        wall = time.perf_counter() - t0
        # what the stage does after the loop and before saving (ASTRA: the logit adjustment of its biases), outside
        # the timed loop, so the ranked model is the one the pipeline saves (a reference library may lack the hook)
        after_fit = getattr(parts, "after_fit", None)
        if after_fit is not None:
            after_fit(result["history"])
        if val_topk is not None:   # every run here ranks by all_label_vectors / query_vectors_np (rank_validation)
            rank_validation(parts.model, ds, val_topk)
    epochs_h = result["history"]["epochs"]
    loop = sum(e["seconds"] for e in epochs_h)
    n = sum(e["steps"] for e in epochs_h) * trainer.cfg.batch_size
    n = min(n, len(ds.trn) * len(epochs_h))
    per_epoch = min(trainer.steps_per_epoch * trainer.cfg.batch_size, len(ds.trn))
    times = {"seed": int(cfg["train"]["seed"]), "epochs": len(epochs_h), "loop_seconds": round(loop, 2),
             "wall_seconds": round(wall, 2), "sentences_per_s": round(n / loop, 1),
             # the first epoch also hashes every text once (the encoder caches the ids), later ones add refreshes
             "epoch_sentences_per_s": [round(per_epoch / e["seconds"], 1) for e in epochs_h],
             "epoch_seconds": [round(e["seconds"], 2) for e in epochs_h],
             "final_loss": result["history"]["loss"][-1]["loss"]}
    if per_step is None:   # no roofline counted for this method
        return times
    steps_roof = per_step * trainer.steps_per_epoch * len(epochs_h)
    # the hard-negative refreshes are in the loop's time too: each encodes the training queries it mines (all of
    # them, or those the steps until the next refresh draw) and every label, and searches them, exactly (the mining
    # index at this size: 2 N L d' FLOPs) or by IVF, at the matrix-product peak
    refreshes = len(getattr(sampler, "refreshed_at", [])) + len(getattr(sampler, "refreshed_at_steps", []))
    dim = parts.model.encoder.dim + (1 if method == "astra" else 0)   # ASTRA mines with classifiers and biases
    L = len(ds.label_texts)
    mined = list(getattr(sampler, "mined_rows", [])) or [len(ds.trn)] * refreshes
    neg = cfg.get("negatives", {})

    def search_flops(N: int) -> float:
        if neg.get("index_kind") == "ivf":   # k-means, adding (assignment), the coarse search and nprobe lists scanned
            from xmc.ann import ANNIndex   # only the current library has IVF mining (the reference never gets here)

            mining = ANNIndex(kind="ivf")
            nlist, nprobe = mining.nlist_for(L), mining.nprobe
            return 2.0 * dim * ((neg.get("kmeans_iters") or 10) * L * nlist + L * nlist + N * nlist   # faiss: 10
                                + N * min(nprobe, nlist) / nlist * L)
        return 2.0 * N * L * dim

    refresh_flops_all = sum(search_flops(N) for N in mined)
    refresh_flops = refresh_flops_all / max(1, len(mined))
    refresh_roof = refresh_flops_all / (peaks["matmul_GFLOPs"] * 1e9)
    roof = steps_roof + refresh_roof
    return {**times,
            "step_bytes_MB": round(float(np.mean(bytes_)) / 1e6, 1), "step_GFLOP": round(float(np.mean(flops)) / 1e9, 2),
            "refreshes": refreshes, "mined_queries": mined, "refresh_TFLOP": round(refresh_flops / 1e12, 3),
            "roofline_steps_seconds": round(float(steps_roof), 2), "roofline_refresh_seconds": round(float(refresh_roof), 2),
            "roofline_seconds": round(float(roof), 2), "measured_over_roofline": round(float(loop / roof), 1),
            "refresh_seconds": [round(float(x), 2) for x in getattr(sampler, "refresh_seconds", [])]}


IVF_MINING = {"negatives": {"index_kind": "ivf", "kmeans_iters": 3}}   # selection candidates *_ivf_mining_kmeans3
TORCH_ROW_ADAM = {"train": {"sparse_optimizer": "row_adam_torch"}}   # RowAdam without its C kernel (xmc/native)
NARROW = {"encoder": {"dim": 256, "n_buckets": 262144}}   # the reference's bag-of-words table (d 256 over 2^18 rows)
VARIANTS = {
    "astra": {"new": {},
              "new_torch_row_adam": TORCH_ROW_ADAM,
              # the reference's computation on today's code: the paper's mixture for the reference's 6 epochs, on
              # the reference's 2^18 hashed rows and without the logit adjustment (round 17 of lab/docs/selection.md)
              "new_paper_negatives": {"negatives": {"hard_negatives": 20, "uniform_negatives": 200},
                                      "encoder": {"n_buckets": 262144}, "model": {"logit_adjustment": 0.0},
                                      "train": {"epochs": 6}},
              # the selection candidate astra_shared_uniform
              "new_shared_uniform": {"negatives": {"hard_negatives": 20, "uniform_shared": True,
                                                   "uniform_negatives": 2000}},
              "new_ivf_mining": IVF_MINING},
    # the selection candidate dexml_bow_refresh5: the shortlist re-mined every 5 epochs (the default between rounds 5
    # and 9 of lab/docs/selection.md), to separate what the code gained from what the interval gains
    "dexml_bow": {"new": {}, "new_torch_row_adam": TORCH_ROW_ADAM, "new_ivf_mining": IVF_MINING,
                  "new_refresh_every_5_epochs": {"negatives": {"refresh_every_epochs": 5}},
                  # the reference's encoder size (d = 256 over 2^18 hashed rows; the default until round 20 of
                  # lab/docs/selection.md): the code's own speed-up at the same table, where new also carries the
                  # wider table chosen since (3x the row width, twice the rows)
                  "new_reference_size": NARROW},
    # the other two bag-of-words methods: times and validation only (no roofline counted), each at today's default
    # and at the reference's table (the selection candidates ramen_narrow / unidec_narrow)
    "ramen": {"new": {}, "new_reference_size": NARROW},
    "unidec": {"new": {}, "new_reference_size": {**NARROW, "model": {"dim": 256}}},
}
ROOFLINE_RUNS = ("dexml_bow", "astra")   # the runs whose steps step_cost counts
REFERENCE = "4d3dee1"   # the library when issue 19 was filed (ASTRA ~260 sentences/s by the issue's own figure)
ROOT = Path(__file__).resolve().parents[2]   # the repository (its git worktrees hold the reference)


def measure(runs: list[str], variants: dict[str, dict[str, Any]], processed: str, epochs: int,
            peaks: dict[str, float], val_dir: Path | None = None, seed: int | None = None,
            validated: str = "new") -> dict[str, dict[str, Any]]:
    """{run: {variant: figures}} with the library this process imports (and the params of its working directory);
    with ``val_dir``, the reference (variant "") and the ``validated`` variant rank the validation split."""
    from xmc.config import load_params
    from xmc.data import load_processed

    params = load_params()
    ds = load_processed(processed, splits=("trn", "val"))
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        for variant, overrides in variants.get(run, {"": {}}).items():
            side = "reference" if variant == "" else "new"   # compare_validation's two sides
            val_topk = val_dir / f"{run}_{side}.npz" if val_dir and variant in ("", validated) else None
            out.setdefault(run, {})[variant] = fig = run_variant(run, run, overrides, params, ds, epochs, peaks,
                                                                 val_topk, seed, Path(processed).absolute().parents[1])
            print(run, variant or "reference", fig, flush=True)
    return out


def measure_reference(commit: str, runs: list[str], processed: str, epochs: int,
                      peaks: dict[str, float], default_spin: bool = False,
                      val_dir: Path | None = None, seed: int | None = None) -> dict[str, dict[str, Any]]:
    """The same measurement of the library at ``commit``: a temporary worktree, this script run there as a worker
    (its directory first on the path, so ``import xmc`` is that commit's). ``default_spin``: the worker runs without
    the ``GOMP_SPINCOUNT`` this process set, at libgomp's default, as that commit did."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "reference"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            if default_spin:   # the reference library left libgomp's default spin (xmc.machine.short_openmp_spin)
                env.pop("GOMP_SPINCOUNT", None)
            p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", "--runs", ",".join(runs),
                                "--epochs", str(epochs), "--processed", str(Path(processed).absolute()),
                                "--peaks", json.dumps(peaks), *(["--val-dir", str(val_dir)] if val_dir else []),
                                *(["--seed", str(seed)] if seed is not None else [])],
                               cwd=tree, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"the reference run at {commit} failed:\n{p.stderr[-3000:]}")
            return json.loads(p.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


VALIDATION_METRICS = ("P@1", "P@5", "PSP@5", "R@100")


def validation_contributions(topk_file: Path, ds: Any, ev: dict[str, Any]) -> Any:
    """Per-sentence metric contributions of a ``rank_validation`` file on the validation split, with the pipeline's
    evaluation settings (``ev``: params ``evaluate``)."""
    from xmc.metrics.bootstrap import instance_contributions
    from xmc.predictions import TopK

    z = np.load(topk_file)
    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    return instance_contributions(TopK(z["indices"], z["scores"]), ds.val.Y, freq, ds.trn.Y.shape[0],
                                  tuple(ev["ks"]), tuple(ev["recall_ks"]), float(ev["propensity_a"]),
                                  float(ev["propensity_b"]))


def compare_validation(runs: list[str], processed: str, val_dir: Path) -> dict[str, dict[str, Any]]:
    """Validation P@1 / P@5 / PSP@5 / R@100 of each side's model (``rank_validation``) and the paired bootstrap of
    new − reference on the same sentences, with the pipeline's evaluation settings."""
    from xmc.config import load_params
    from xmc.data import load_processed
    from xmc.metrics.bootstrap import paired_bootstrap

    params = load_params()
    ev, boot = params["evaluate"], params["evaluate"]["bootstrap"]
    ds = load_processed(processed, splits=("trn", "val"))
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        sides = {side: val_dir / f"{run}_{side}.npz" for side in ("reference", "new")}
        if not all(f.exists() for f in sides.values()):
            continue
        contrib = {side: validation_contributions(f, ds, ev) for side, f in sides.items()}
        metrics = VALIDATION_METRICS
        out[run] = {side: {m: round(float(c.values()[m]), 2) for m in metrics} for side, c in contrib.items()}
        out[run]["n_sentences"] = int(ds.val.Y.shape[0])
        out[run]["new_minus_reference"] = {
            m: {k: v for k, v in paired_bootstrap(contrib["new"], contrib["reference"], m, int(boot["n_resamples"]),
                                                   int(boot["seed"]), float(boot["level"])).items()
                if k in ("diff", "ci95", "p_value")} for m in metrics}
        print(run, "validation", out[run], flush=True)
    return out


def seed_summary(per_seed: list[dict[str, Any]], level: float = 0.95) -> dict[str, Any]:
    """Across training seeds (one reference/new pair per seed, each ranked on the same validation sentences): new −
    reference per metric as the mean of the per-seed differences, with a t-interval and the paired t-test's p
    (:func:`xmc.metrics.bootstrap.paired_over_seeds`; ``a`` is new, ``b`` the reference). The per-seed bootstrap
    resamples sentences for one trained pair; this asks whether the change moves the metric beyond what
    retraining from another seed moves it."""
    from xmc.metrics.bootstrap import paired_over_seeds

    out: dict[str, Any] = {"seeds": [v["seed"] for v in per_seed]}
    for m in VALIDATION_METRICS:
        out[m] = paired_over_seeds([v["new"][m] for v in per_seed], [v["reference"][m] for v in per_seed], level)
    return out


def _spin_setting() -> str:
    """This process's OpenMP idle-wait setting, as libgomp read it from the environment."""
    for var in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        if var in os.environ:
            return f"{var}={os.environ[var]}"
    return "libgomp default"


def main() -> None:
    from xmc.config import set_offline_env

    set_offline_env()
    ap = argparse.ArgumentParser()
    # 3: ASTRA's hard negatives start at its third epoch; 0: each run's own epoch count in its side's params (the
    # whole run as `make run` trains it: DEXML-BoW 5, ASTRA 6 on both sides), every refresh of that run included
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--runs", default="astra,dexml_bow")
    ap.add_argument("--reference", default=REFERENCE, help="the commit whose library is the baseline")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "bow_training_speed.json"))
    ap.add_argument("--repeats", type=int, default=3,
                    help="reference/new pairs measured alternately; the median ratio is reported")
    ap.add_argument("--validate", action="store_true",
                    help="the first pair's models also rank the validation split; paired bootstrap of the "
                         "two sides (the current metrics code for both)")
    ap.add_argument("--seeds", action="store_true",
                    help="pair i trains both sides from seed i (encoder initialisation and batch order); with --validate "
                         "every pair ranks the validation split, and the JSON compares the sides across seeds")
    ap.add_argument("--paired-variant", default="new",
                    help="the current-library variant the repeats pair with the reference (and --validate ranks), "
                         "e.g. new_ivf_mining; default: the shipped run")
    ap.add_argument("--candidates", default="{}",
                    help='JSON {name: overrides of the shipped run}: more variants of every run in --runs, e.g. '
                         '\'{"d320": {"encoder": {"dim": 320}}}\' (as lab.bench.seed_study --candidates)')
    ap.add_argument("--variants", default="",
                    help="comma-separated variants the first pair trains (default: every variant of each run; the "
                         "paired variant always)")
    ap.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--val-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peaks", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.worker:   # before torch (and its OpenMP runtime) loads, as the stages do it
        from xmc.machine import short_openmp_spin

        spin_set_here = short_openmp_spin()   # then the reference worker runs without it
    import torch

    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))
    runs = a.runs.split(",")
    if a.worker:   # inside the reference worktree: one line of JSON on stdout
        res = measure(runs, {}, a.processed, a.epochs, json.loads(a.peaks), Path(a.val_dir) if a.val_dir else None,
                      a.seed)
        print(json.dumps({r: v[""] for r, v in res.items()}))
        return
    if unknown_runs := [run for run in runs if run not in VARIANTS]:
        raise SystemExit(f"--runs: {', '.join(unknown_runs)} has no variants here (have: {', '.join(VARIANTS)})")
    extra = json.loads(a.candidates)
    if clash := set(extra) & {v for run in runs for v in VARIANTS[run]}:
        raise SystemExit(f"--candidates: {', '.join(sorted(clash))} is already a variant")
    all_variants = {run: {**VARIANTS[run], **extra} for run in runs}
    pv = a.paired_variant   # checked before anything is measured
    if any(pv not in all_variants[run] for run in runs):
        raise SystemExit(f"--paired-variant {pv}: not a variant of every run in --runs")
    wanted = set(a.variants.split(",")) | {pv} if a.variants else None
    if wanted and (unknown := wanted - {v for run in runs for v in all_variants[run]}):
        raise SystemExit(f"--variants: {', '.join(sorted(unknown))} is not a variant of {', '.join(runs)}")
    variants = {run: {v: x for v, x in all_variants[run].items() if wanted is None or v in wanted} for run in runs}
    peaks = machine_peaks()
    print("machine peaks:", peaks, flush=True)
    from xmc.machine import describe_machine

    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                       "python": platform.python_version(), "torch": torch.__version__,
                                       **{k: v for k, v in describe_machine(measure=False).items()
                                          if k in ("cpu", "vector_isa")}, **peaks,
                                       # idle OpenMP workers' busy-wait before they sleep, on each side
                                       "gomp_spincount": {"new": _spin_setting(),
                                                          "reference": "libgomp default" if spin_set_here else
                                                          _spin_setting()}},
                           "reference_commit": a.reference, "epochs": a.epochs or "each run's own",
                           "seed_per_pair": a.seeds, "runs": {}}
    val_tmp = tempfile.TemporaryDirectory() if a.validate else None

    def pair_seed(i: int) -> int | None:
        return i if a.seeds else None

    def pair_val_dir(i: int) -> Path | None:   # every pair validates under --seeds, else the first
        if val_tmp is None or (i > 0 and not a.seeds):
            return None
        d = Path(val_tmp.name) / f"pair{i}"
        d.mkdir()
        return d

    val_dir = pair_val_dir(0)
    reference = measure_reference(a.reference, runs, a.processed, a.epochs, peaks, spin_set_here, val_dir, pair_seed(0))
    new = measure(runs, variants, a.processed, a.epochs, peaks, val_dir, pair_seed(0), pv)
    validations = [compare_validation(runs, a.processed, val_dir)] if val_dir else []
    # repeats: reference and new alternately, so a slow minute of the machine falls on both sides of one ratio;
    # the median of the pairs' ratios is the figure, their range its spread
    pairs = {run: [(reference[run], new[run][pv])] for run in runs}
    for i in range(1, a.repeats):
        print(f"repeat {i + 1} of {a.repeats}", flush=True)
        val_dir = pair_val_dir(i)
        ref_i = measure_reference(a.reference, runs, a.processed, a.epochs, peaks, spin_set_here, val_dir,
                                  pair_seed(i))
        new_i = measure(runs, {run: {pv: all_variants[run][pv]} for run in runs}, a.processed, a.epochs, peaks,
                        val_dir, pair_seed(i), pv)
        if val_dir:
            validations.append(compare_validation(runs, a.processed, val_dir))
        for run in runs:
            pairs[run].append((ref_i[run], new_i[run][pv]))
    if val_tmp:
        val_tmp.cleanup()
    for run in runs:
        res = {"reference": reference[run], **new[run]}
        for variant in new[run]:
            res[f"speedup_{variant}_over_reference"] = round(res[variant]["sentences_per_s"]
                                                             / res["reference"]["sentences_per_s"], 2)
        ratios = [n["sentences_per_s"] / r["sentences_per_s"] for r, n in pairs[run]]
        res["repeats"] = [{"seed": n.get("seed"), "reference_loop_seconds": r["loop_seconds"], "new_loop_seconds": n["loop_seconds"],
                           "reference_sentences_per_s": r["sentences_per_s"],
                           "new_sentences_per_s": n["sentences_per_s"], "speedup": round(x, 2)}
                          for (r, n), x in zip(pairs[run], ratios)]
        res["paired_variant"] = pv   # what "new" means in repeats, validation and the median below
        res["speedup_new_over_reference_median"] = round(float(np.median(ratios)), 2)
        res["speedup_new_over_reference_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
        res["settings"] = variants[run]   # what each variant changes on the shipped run
        per_pair = [{"seed": n.get("seed"), **v[run]} for v, (_, n) in zip(validations, pairs[run]) if run in v]
        if per_pair:
            res["validation"] = per_pair[0]
        if a.seeds and len(per_pair) > 1:
            res["validation_by_seed"] = per_pair
            res["validation_over_seeds"] = summary = seed_summary(per_pair)
            print(run, "validation over seeds", summary, flush=True)
        out["runs"][run] = res
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({r: {k: x for k, x in v.items() if k.startswith("speedup")} for r, v in out["runs"].items()}))


if __name__ == "__main__":
    main()
