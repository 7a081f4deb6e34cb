"""Prediction latency and throughput of model packages, in process and through the HTTP service.

For each package: p50/p99 latency of one text (batch 1) and texts/s at batch 64, over real test-split texts,
(a) through the Python API (``xmc.load(path).predict``) and (b) through ``xmc serve`` over HTTP on loopback
(a real uvicorn server in a subprocess, one keep-alive client). For a transformer package it also measures,
in the same process, (c) the peer: sentence-transformers' ``SentenceTransformer.encode`` + the same faiss
index, and (d) a dynamically int8-quantised copy of the query encoder, with the share of test texts whose
top-10 is identical to the float model's (the package keeps float weights unless that share is 1.0 and
it is faster).

    python -m lab.bench.serve_latency [--packages packages/astra packages/dexml_bow packages/minilm_zeroshot] \\
        [--n 300] [--out lab/bench/serve_latency.json]

The packages are the product's (``make run``): two bag-of-words ones and the off-the-shelf MiniLM, the transformer
package of the product (the lab's MiniLM-trained ``dexml`` keeps no package; ``xmc train --method dexml`` with a
transformer encoder makes one).

Not a test: run it on an idle machine (the figures in the committed JSON are from the 2-core CPU box).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def _pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2),
            "mean_ms": round(float(a.mean()), 2)}


def time_batch1(fn: Callable[[list[str]], Any], texts: list[str], warmup: int = 10) -> dict[str, float]:
    for t in texts[:warmup]:
        fn([t])
    lat = []
    for t in texts:
        t0 = time.perf_counter()
        fn([t])
        lat.append(time.perf_counter() - t0)
    return _pct(lat)


def time_batch64(fn: Callable[[list[str]], Any], texts: list[str], batch: int = 64) -> dict[str, float]:
    fn(texts[:batch])
    t0 = time.perf_counter()
    n = 0
    for s in range(0, len(texts) - batch + 1, batch):
        fn(texts[s : s + batch])
        n += batch
    dt = time.perf_counter() - t0
    return {"texts_per_s": round(n / dt, 1), "batch": batch, "texts": n}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_figures(package: str, texts: list[str]) -> dict[str, Any]:
    import httpx

    port = _free_port()
    xmc_bin = Path(sys.executable).with_name("xmc")
    cmd = [str(xmc_bin)] if xmc_bin.exists() else [sys.executable, "-m", "xmc.cli"]
    proc = subprocess.Popen([*cmd, "serve", package, "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "XMC_LOG_LEVEL": "warning"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        with httpx.Client(timeout=60) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"xmc serve exited {proc.returncode}")
                try:
                    if client.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("service not healthy in 180 s")
                time.sleep(0.3)

            def call(batch: list[str]) -> Any:
                r = client.post(url + "/predict", json={"texts": batch, "k": 10})
                r.raise_for_status()
                return r

            return {"batch1": time_batch1(call, texts), "batch64": time_batch64(call, texts)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def transformer_extras(pkg: Any, texts: list[str]) -> dict[str, Any]:
    """The sentence-transformers peer and an int8 dynamic-quantised query encoder, in this process."""
    import torch
    from sentence_transformers import SentenceTransformer

    pred = pkg.predictor
    enc = pred.encoder
    out: dict[str, Any] = {}
    st = SentenceTransformer(str(pkg.root / "encoder"), device="cpu")
    st.max_seq_length = enc.max_len["query"]

    def st_predict(batch: list[str]) -> Any:
        q = st.encode(batch, batch_size=256, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return pred.index.search(np.ascontiguousarray(q, np.float32), 10)

    out["peer_sentence_transformers"] = {"batch1": time_batch1(st_predict, texts), "batch64": time_batch64(st_predict, texts)}
    D_ref, I_ref = pkg.topk(texts, 10)
    float_model = enc.query_model
    q_model = torch.ao.quantization.quantize_dynamic(float_model, {torch.nn.Linear}, dtype=torch.qint8)
    enc.query_model = q_model
    try:
        D_q, I_q = pkg.topk(texts, 10)
        agree = float((I_q == I_ref).all(1).mean())
        overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I_q, I_ref)]))
        timing = {"batch1": time_batch1(lambda b: pkg.topk(b, 10), texts), "batch64": time_batch64(lambda b: pkg.topk(b, 10), texts)}
    finally:
        enc.query_model = float_model
    out["int8_dynamic_quantised"] = {**timing, "top10_identical_share": round(agree, 4),
                                     "top10_overlap": round(overlap, 4)}
    return out


def main() -> None:
    from xmc.config import set_offline_env

    set_offline_env()
    os.environ.setdefault("TQDM_DISABLE", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packages", nargs="+", default=["packages/astra", "packages/dexml_bow", "packages/minilm_zeroshot"])
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--n", type=int, default=300, help="test texts timed (batch 1), and at batch 64")
    ap.add_argument("--no-http", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    import xmc

    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))
    with open(Path(a.processed) / "tst.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh][: a.n]
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                           "python": platform.python_version(), "torch": torch.__version__},
                               "texts": len(texts), "k": 10, "packages": {}}
    targets = {"dense-bow": 5.0, "dense-transformer": 30.0}
    for path in a.packages:
        t0 = time.perf_counter()
        pkg = xmc.load(path)
        load_s = time.perf_counter() - t0
        enc = getattr(pkg.predictor, "encoder", None)
        kind = f"{pkg.predictor.kind}-{getattr(enc, 'kind', 'none')}"
        r: dict[str, Any] = {"method": pkg.method, "kind": kind, "labels": pkg.n_labels, "load_seconds": round(load_s, 2),
                             "api": {"batch1": time_batch1(lambda b: pkg.predict(b, 10), texts),
                                     "batch64": time_batch64(lambda b: pkg.predict(b, 10), texts)}}
        if getattr(enc, "kind", "") == "transformer":
            r.update(transformer_extras(pkg, texts))
        if not a.no_http:
            del pkg
            r["http"] = http_figures(path, texts)
        target = targets.get(kind)
        if target:
            r["target_p50_ms"] = target
            r["api_p50_within_target"] = r["api"]["batch1"]["p50_ms"] <= target
            if "http" in r:
                r["http_p50_within_target"] = r["http"]["batch1"]["p50_ms"] <= target
        if "peer_sentence_transformers" in r:
            peer = r["peer_sentence_transformers"]
            r["ratio_api_vs_peer"] = {"batch1_p50": round(r["api"]["batch1"]["p50_ms"] / peer["batch1"]["p50_ms"], 3),
                                      "batch64_throughput": round(r["api"]["batch64"]["texts_per_s"] / peer["batch64"]["texts_per_s"], 3)}
        results["packages"][Path(path).name] = r
        print(json.dumps({Path(path).name: r}, indent=2), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
