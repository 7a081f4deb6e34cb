"""Three other ways of paying for DEXML-BoW's hard-negative refreshes, measured against the run as it ships.

The shipped ``dexml_bow`` run trains 5 epochs of 55 steps and re-mines every training sentence's top-100 labels
exactly at the start of epochs 2-5 (``docs/training_speed.md``). On a 2-core box its steps take about 2 s an epoch
and each refresh about 2 s more, so issue 19's 5x of the 4d3dee1 loop at equal validation metrics needs the four
refreshes in well under a second each. This script measures three ideas that would keep the refreshes' semantics or
nearly so, each on the real run (seed 0, the pipeline's params):

* ``overlap``: the search run in a background thread while the steps train (the pipelined refresh ASTRA has, here
  with the shortlist of the same snapshot): one epoch of steps alone, one refresh search alone, and both at once,
  with faiss on 1 and on 2 threads. It pays only if the steps leave a core idle.
* ``batch_size``: the first epoch (no refresh in it) at batch 256 (the default), 512 and 1,024: fewer, larger steps
  would leave more of the budget to the refreshes if the step's cost were per step rather than per sentence.
* ``shortlist_drift``: how far each refresh's exact top-100 lies inside the previous refresh's exact top-K (K =
  100, 200, 400), i.e. the recall a refresh would keep by re-ranking a cached K-wide list with the current vectors
  instead of searching every label; and what such a re-rank costs here (gathering the K label vectors of each
  sentence, their scores, top-100) against the exact search on the same vectors.

    python -m bench.refresh_schedule [--processed data/processed] [--out bench/refresh_schedule.json]

Not a test: run it on an idle machine (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bow_training_speed import machine_peaks
from bench.mining_search import train_shipped


def epoch_seconds(history: dict[str, Any]) -> list[float]:
    return [round(float(e["seconds"]), 2) for e in history["epochs"]]


def overlap(processed: str, Y: Any, Q: np.ndarray, L: np.ndarray, size: int, repeats: int = 3) -> dict[str, Any]:
    """One epoch of steps, one refresh search, and both at once (the search in a thread, faiss on 1 or 2 threads),
    ``repeats`` rounds of the four measurements in turn; medians, and every round's figures."""
    import faiss

    from xmc.negatives.samplers import mine_shortlist

    rounds: dict[str, list[dict[str, float]]] = {"alone": [], "together_faiss_threads_1": [],
                                                 "together_faiss_threads_2": []}
    for _ in range(repeats):
        hist = train_shipped(processed, {"train": {"epochs": 1}}).history
        t0 = time.perf_counter()
        mine_shortlist(Y, Q, L, size)
        rounds["alone"].append({"steps_s": epoch_seconds(hist)[0], "search_s": round(time.perf_counter() - t0, 2)})
        for threads in (1, 2):
            took: dict[str, float] = {}

            def search(threads: int = threads, took: dict[str, float] = took) -> None:
                faiss.omp_set_num_threads(threads)   # per thread: faiss' OpenMP team of the calling thread
                t = time.perf_counter()
                mine_shortlist(Y, Q, L, size)
                took["s"] = time.perf_counter() - t

            hist = train_shipped(processed, {"train": {"epochs": 1}}, beside=search).history
            rounds[f"together_faiss_threads_{threads}"].append({"steps_s": epoch_seconds(hist)[0],
                                                                "search_s": round(took["s"], 2)})
        print("overlap round", {k: v[-1] for k, v in rounds.items()}, flush=True)
    faiss.omp_set_num_threads(2)

    def median(name: str, key: str) -> float:
        return round(float(np.median([r[key] for r in rounds[name]])), 2)

    # both jobs start together, so the pair takes the longer of the two; concurrency pays when that is under the
    # two run one after the other
    out: dict[str, Any] = {"rounds": rounds, "steps_alone_s": median("alone", "steps_s"),
                           "search_alone_s": median("alone", "search_s")}
    out["sequential_s"] = round(out["steps_alone_s"] + out["search_alone_s"], 2)
    for threads in (1, 2):
        name = f"together_faiss_threads_{threads}"
        out[name] = {"steps_s": median(name, "steps_s"), "search_s": median(name, "search_s"),
                     "together_s": round(float(np.median([max(r["steps_s"], r["search_s"]) for r in rounds[name]])),
                                         2)}
    print("overlap", {k: v for k, v in out.items() if k != "rounds"}, flush=True)
    return out


def batch_size(processed: str, sizes: tuple[int, ...] = (256, 512, 1024)) -> dict[str, Any]:
    """The first epoch (no refresh) at each batch size: 14,073 sentences either way."""
    out = {}
    for bs in sizes:
        hist = train_shipped(processed, {"train": {"epochs": 1, "batch_size": bs}}).history
        out[str(bs)] = {"epoch_s": epoch_seconds(hist)[0], "steps": int(hist["epochs"][0]["steps"])}
        print("batch_size", bs, out[str(bs)], flush=True)
    return out


def rerank(Q: np.ndarray, L: np.ndarray, cand: np.ndarray, size: int, chunk: int = 1024) -> np.ndarray:
    """Each sentence's ``cand`` labels re-ranked by the current vectors, top ``size`` kept."""
    import torch

    Qt, Lt, ct = torch.from_numpy(Q), torch.from_numpy(L), torch.from_numpy(np.maximum(cand, 0).astype(np.int64))
    with torch.no_grad():
        best = []
        for s in range(0, len(Q), chunk):
            c = ct[s : s + chunk]
            scores = torch.bmm(Lt[c], Qt[s : s + chunk, :, None])[..., 0]
            scores[torch.from_numpy(cand[s : s + chunk] < 0)] = float("-inf")
            best.append(torch.gather(c, 1, scores.topk(size, dim=1).indices))
    return torch.cat(best).numpy()


def found_in(truth: np.ndarray, cand: np.ndarray) -> float:
    """Mean over sentences of |truth ∩ cand| / |truth| (-1 pads ignored); ``cand`` may be wider than ``truth``."""
    hits = [len(set(t[t >= 0].tolist()) & set(c[c >= 0].tolist())) / max(1, int((t >= 0).sum()))
            for t, c in zip(truth, cand)]
    return float(np.mean(hits)) if hits else 1.0


def shortlist_drift(processed: str, size: int, widths: tuple[int, ...] = (100, 200, 400)) -> dict[str, Any]:
    from xmc.negatives.samplers import mine_shortlist

    snaps: list[tuple[np.ndarray, np.ndarray]] = []
    run = train_shipped(processed, on_refresh=lambda q, lv: snaps.append((q.copy(), lv.copy())))
    Y, hist, sampler = run.Y, run.history, run.sampler
    out: dict[str, Any] = {"epoch_s": epoch_seconds(hist),
                           "refresh_s": [round(float(x), 2) for x in sampler.refresh_seconds], "refreshes": []}
    lists = [{k: mine_shortlist(Y, q, lv, k) for k in widths} for q, lv in snaps]
    for e in range(1, len(snaps)):
        q, lv = snaps[e]
        row: dict[str, Any] = {"refresh": e + 1}
        t0 = time.perf_counter()
        mine_shortlist(Y, q, lv, size)
        row["exact_search_s"] = round(time.perf_counter() - t0, 2)
        for k in widths:
            # the exact top-size found among the previous refresh's exact top-k: what a re-rank of that list keeps
            row[f"recall_in_previous_top{k}"] = round(found_in(lists[e][size], lists[e - 1][k]), 4)
            t0 = time.perf_counter()
            rerank(q, lv, lists[e - 1][k], size)
            row[f"rerank_top{k}_s"] = round(time.perf_counter() - t0, 2)
        out["refreshes"].append(row)
        print("drift", row, flush=True)
    return out


def main() -> None:
    from xmc.config import load_params, set_offline_env
    from xmc.machine import describe_machine
    from xmc.machine import short_openmp_spin

    set_offline_env()
    short_openmp_spin()   # as the stages run
    ap = argparse.ArgumentParser()
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--out", default="bench/refresh_schedule.json")
    args = ap.parse_args()
    bow = load_params()["bow_encoder"]
    size, dim = int(bow["negatives"]["shortlist_size"]), int(bow["encoder"]["dim"])
    result: dict[str, Any] = {"machine": {**describe_machine(measure=False), **machine_peaks()},
                              "shortlist_size": size}
    print("machine", result["machine"], flush=True)
    result["shortlist_drift"] = shortlist_drift(args.processed, size)
    from xmc.data import load_processed

    Y = load_processed(args.processed, splits=("trn",)).trn.Y.tocsr()
    rng = np.random.default_rng(0)   # the search's cost does not depend on the vectors' values
    Q = rng.standard_normal((Y.shape[0], dim)).astype(np.float32)
    L = rng.standard_normal((Y.shape[1], dim)).astype(np.float32)
    result["overlap"] = overlap(args.processed, Y, Q, L, size)
    result["batch_size"] = batch_size(args.processed)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
