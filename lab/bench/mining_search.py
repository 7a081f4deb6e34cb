"""The hard-negative refresh's search against the hardware's floor, and the faster searches tried in its place.

DEXML-BoW (the shipped ``dexml_bow`` run) re-mines its hard negatives at every epoch from the second: every training
sentence against every label, exactly, keeping each sentence's top ``shortlist_size`` labels that are not its own.
Its steps are 5.5-6x faster than at 4d3dee1, but these four searches are about as slow as they were, so they bound
the whole run's speed-up (``docs/training_speed.md``). This script asks how far the search itself is from what the
machine can do, and what the faster ways of getting (nearly) the same shortlist cost in time and in recall.

It trains the shipped run with the current library (seed 0, the pipeline's params) once for one epoch and once for
all its epochs, and on both models' vectors (those of the first and of the last refresh) times, each the median of
``--repeats`` runs:

* ``refresh``: the refresh's own search (:func:`xmc.negatives.samplers.mine_shortlist`, exact: the faiss index, the
  search to ``size`` + the 99th percentile of the positive counts, the positives dropped, long rows searched again);
* ``blas_scores_only``: the score matrix alone, block by block through numpy's BLAS, nothing selected: the floor of
  any exact search on this machine;
* ``faiss_knn_k1`` / ``faiss_knn``: faiss' brute-force search keeping 1 / the refresh's k labels (what selection
  costs on top of the matrix product);
* ``torch_mm_topk``: torch's matrix product (MKL) and ``topk``, 1,024 sentences at a time;
* ``int8_dynamic_linear``: the scores from torch's dynamically quantised int8 linear layer (fbgemm), the
  low-precision matrix product a CPU has without bf16 or VNNI instructions (scores only);
* ``pca<d>_rerank<m>``: the vectors projected on the label vectors' top ``d`` principal directions (uncentred),
  searched for ``m`` candidates, re-ranked with the full vectors;
* ``ivf_kmeans3``: the selection candidate ``dexml_bow_ivf_mining_kmeans3`` (IVF, 3 k-means iterations, rebuilt at
  every refresh).

For each approximate search, ``shortlist_recall`` is the mean over sentences of |its shortlist ∩ exact's| / |exact's|
(positives dropped on both sides). The machine's peaks are measured in the same process.

    python -m bench.mining_search [--processed data/processed] [--repeats 3] [--out bench/mining_search.json]

Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from bench.bow_training_speed import machine_peaks


class ShippedRun(NamedTuple):
    Y: Any            # the training label matrix (CSR)
    texts: Any        # the training sentences
    history: dict[str, Any]
    sampler: Any      # the hard-negative sampler, with its refresh record
    model: Any


def train_shipped(processed: str, overrides: dict[str, Any] | None = None,
                  on_refresh: Callable[[np.ndarray, np.ndarray], None] | None = None,
                  beside: Callable[[], None] | None = None) -> ShippedRun:
    """Train the shipped ``dexml_bow`` run (the pipeline's params, ``overrides`` merged into its config) with the
    current library. ``on_refresh(query_vecs, label_vecs)`` sees every hard-negative refresh's vectors; ``beside()``
    runs in a thread started with the training."""
    import torch

    from xmc.config import load_params
    from xmc.config.schema import deep_merge
    from xmc.data import load_processed
    from xmc.methods import get_method
    from xmc.methods.base import RunContext
    from xmc.methods.runs import RunSpec, find_run
    from xmc.trainer import TrainConfig, Trainer

    params = load_params()
    ds = load_processed(processed, splits=("trn",))
    spec = find_run(params, "dexml_bow")
    cfg = deep_merge(spec.config, overrides or {})
    cfg["train"]["eval_every_epochs"] = 0
    with tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(params, RunSpec("dexml_bow", spec.method, cfg), Path(tmp) / "model", Path(tmp) / "work",
                         Path(tmp) / "plots")
        torch.manual_seed(int(cfg["train"]["seed"]))
        parts = get_method(spec.method).build(ctx, ds)
        sampler = parts.sampler
        if on_refresh is not None:
            mine = sampler.refresh_from_vectors

            def recorded(query_vecs: np.ndarray, label_vecs: np.ndarray, rows: np.ndarray | None = None) -> None:
                on_refresh(query_vecs, label_vecs)
                mine(query_vecs, label_vecs, rows)

            sampler.refresh_from_vectors = recorded
        trainer = Trainer(parts.model, sampler, parts.objective, TrainConfig.from_params(cfg["train"]),
                          ds.trn.texts, ctx.work_dir, fingerprint_extra=parts.fingerprint)
        thread = threading.Thread(target=beside) if beside is not None else None
        if thread is not None:
            thread.start()
        result = trainer.fit()
        if thread is not None:
            thread.join()
    return ShippedRun(ds.trn.Y.tocsr(), ds.trn.texts, result["history"], sampler, parts.model)


def trained_vectors(processed: str, epochs: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """(training label matrix, training sentence vectors, label vectors) of the shipped ``dexml_bow`` run trained
    for ``epochs`` epochs (0: its own count)."""
    run = train_shipped(processed, {"train": {"epochs": epochs}} if epochs > 0 else None)
    labels = np.ascontiguousarray(run.model.all_label_vectors(progress=False), dtype=np.float32)
    queries = np.ascontiguousarray(run.model.query_vectors_np(run.texts, progress=False), dtype=np.float32)
    return run.Y, queries, labels


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """(median seconds over ``repeats`` calls, the last call's result)."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def shortlist_recall(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean over sentences of |approx ∩ exact| / |exact| (both shortlists of the same width, -1 pads ignored)."""
    from xmc.ann.index import recall_of

    return round(recall_of(approx, exact), 4)


def measure(Y: Any, Q: np.ndarray, L: np.ndarray, size: int, repeats: int) -> dict[str, Any]:
    import faiss
    import torch

    from xmc.negatives.samplers import drop_positives, mine_shortlist

    n_pos = np.diff(Y.indptr)
    k = min(size + int(np.quantile(n_pos, 0.99)), len(L))
    gflop = 2.0 * len(Q) * len(L) * Q.shape[1] / 1e9
    out: dict[str, Any] = {"sentences": len(Q), "labels": len(L), "dim": int(Q.shape[1]), "k": k,
                           "search_GFLOP": round(gflop, 1)}

    def row(name: str, seconds: float, ids: np.ndarray | None = None, exact: np.ndarray | None = None) -> None:
        out[name] = {"seconds": round(seconds, 3), "GFLOP_per_s": round(gflop / seconds, 1)}
        if ids is not None and exact is not None:
            out[name]["shortlist_recall"] = shortlist_recall(drop_positives(Y, ids, size), exact)
        print(name, out[name], flush=True)

    t, exact = timed(lambda: mine_shortlist(Y, Q, L, size, "exact"), repeats)
    row("refresh", t)

    def blas_scores() -> None:
        for s in range(0, len(Q), 2048):
            Q[s : s + 2048] @ L.T

    row("blas_scores_only", timed(blas_scores, repeats)[0])
    row("faiss_knn_k1", timed(lambda: faiss.knn(Q, L, 1, metric=faiss.METRIC_INNER_PRODUCT), repeats)[0])
    t, (_, ids) = timed(lambda: faiss.knn(Q, L, k, metric=faiss.METRIC_INNER_PRODUCT), repeats)
    row("faiss_knn", t, ids, exact)

    Qt, Lt = torch.from_numpy(Q), torch.from_numpy(L)

    def torch_topk() -> np.ndarray:
        with torch.no_grad():
            return torch.cat([torch.topk(Qt[s : s + 1024] @ Lt.T, k, dim=1).indices
                              for s in range(0, len(Q), 1024)]).numpy()

    t, ids = timed(torch_topk, repeats)
    row("torch_mm_topk", t, ids, exact)

    lin = torch.nn.Linear(L.shape[1], len(L), bias=False)
    with torch.no_grad():
        lin.weight.copy_(Lt)
    qlin = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)

    def int8_scores() -> None:
        with torch.no_grad():
            for s in range(0, len(Q), 1024):
                qlin(Qt[s : s + 1024])

    row("int8_dynamic_linear", timed(int8_scores, repeats)[0])

    for d, m in ((128, 200), (128, 300), (64, 400)):
        def pca_rerank(d: int = d, m: int = m) -> np.ndarray:
            _, V = np.linalg.eigh(L.T @ L)          # uncentred: inner products, not distances, are preserved
            P = np.ascontiguousarray(V[:, ::-1][:, :d])
            _, cand = faiss.knn(np.ascontiguousarray(Q @ P), np.ascontiguousarray(L @ P), m,
                                metric=faiss.METRIC_INNER_PRODUCT)
            ct = torch.from_numpy(cand)
            with torch.no_grad():
                best = [torch.gather(ct[s : s + 2048], 1, torch.einsum("bd,bmd->bm", Qt[s : s + 2048],
                                                                         Lt[ct[s : s + 2048]]).topk(k, dim=1).indices)
                        for s in range(0, len(Q), 2048)]
            return torch.cat(best).numpy()

        t, ids = timed(pca_rerank, repeats)
        row(f"pca{d}_rerank{m}", t, ids, exact)

    t, ivf = timed(lambda: mine_shortlist(Y, Q, L, size, "ivf", kmeans_iters=3), repeats)
    out["ivf_kmeans3"] = {"seconds": round(t, 3), "shortlist_recall": shortlist_recall(ivf, exact)}
    print("ivf_kmeans3", out["ivf_kmeans3"], flush=True)
    return out


def main() -> None:
    from xmc.config import load_params, set_offline_env
    from xmc.machine import short_openmp_spin

    set_offline_env()
    short_openmp_spin()   # as the stages run
    ap = argparse.ArgumentParser()
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/mining_search.json")
    args = ap.parse_args()
    size = int(load_params()["bow_encoder"]["negatives"]["shortlist_size"])
    from xmc.machine import describe_machine

    result: dict[str, Any] = {"machine": {**describe_machine(measure=False), **machine_peaks()},
                              "shortlist_size": size}
    print("machine", result["machine"], flush=True)
    for name, epochs in (("after_1_epoch", 1), ("after_all_epochs", 0)):
        Y, Q, L = trained_vectors(args.processed, epochs)
        result[name] = measure(Y, Q, L, size, args.repeats)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
