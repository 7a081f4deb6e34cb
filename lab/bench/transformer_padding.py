"""The transformer encoder with and without length-bucketed batches, in one process.

A batch is padded to its longest text. :meth:`TransformerEncoder.encode` used to sort texts by characters before
batching them, and a training step sent its whole batch (DEXML: 64 sentences + their 128 label texts in one pass)
padded to its longest text, at 32 tokens for label texts of 20 tokens on average, at 64 for MACLR's sentences of
26. The encoder now sorts by token count (``length_keys``) and passes a batch through the model in groups of
similar length (:func:`xmc.encoders.transformer.length_buckets`), each padded to its own longest text. Padding is
masked out of attention and pooling, so the vectors are the same to float rounding (``max_abs_diff`` below).

Each case runs the old way (``old``: texts sorted by characters, one padded pass per batch) and the new way
(``new``), alternating, ``--repeats`` times, and reports the median seconds, the ratio and the padded tokens each
way sent through the model, and each way's time over the roofline (the real tokens' FLOPs at the matrix-product
peak measured in the same process; a training step counted as three forwards):

* ``label_encoding``: ``--labels`` label texts drawn at random (seed 0), encoded in batches of 256 (the predict
  stages' and the hard-negative refreshes' pass over every label, max length 32);
* ``dexml_step``: ``--steps`` training steps of the ``dexml`` run's shape: forward and backward of 64 sentences
  and 128 label texts in one pass (max length 32, train mode, dropout on);
* ``maclr_query_step``: ``--steps`` forward and backward passes of 64 sentences at MACLR's query length (64).

    python -m lab.bench.transformer_padding [--processed data/processed] [--labels 4096] [--steps 8] [--repeats 3]
        [--out lab/bench/transformer_padding.json]

Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.open()]


def text_flops(n: np.ndarray | int, cfg: Any) -> float:
    """Forward FLOPs of texts of ``n`` tokens through a BERT-style encoder: per layer the four h x h projections and
    the two feed-forward matrices (2 FLOPs a multiply-add per token) and attention's two n x n x h products."""
    n = np.asarray(n, np.float64)
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    return float((layers * (2 * n * (4 * h * h + 2 * h * inter) + 4 * n * n * h)).sum())


def roofline(case: dict[str, Any], real_flops: float, peak_gflops: float) -> None:
    """The case's FLOPs on its real tokens over the machine's matrix-product peak: no padding, every FLOP at peak."""
    floor = real_flops / (peak_gflops * 1e9)
    case["roofline_s"] = round(floor, 3)
    case["measured_over_roofline"] = {k: round(v / floor, 2) for k, v in case["median_s"].items()}


def padded_tokens(lengths: np.ndarray, batches: list[np.ndarray], bucketed: bool, overhead: int) -> int:
    """Tokens a batch sequence sends through the model, padding included."""
    from xmc.encoders.transformer import length_buckets

    total = 0
    for b in batches:
        groups = length_buckets(lengths[b], overhead) if bucketed else [np.arange(len(b))]
        total += sum(len(g) * int(lengths[b][g].max()) for g in groups)
    return total


class _Old:
    """The encoder as it was: sorted by characters, one padded pass per batch."""

    def __init__(self, enc: Any) -> None:
        self.enc = enc

    def __enter__(self) -> None:
        from xmc.encoders.base import TextEncoder

        self.overhead = self.enc.bucket_overhead_tokens
        self.enc.bucket_overhead_tokens = 10**12   # splitting never pays: one group
        self.enc.length_keys = lambda texts, side: TextEncoder.length_keys(self.enc, texts, side)

    def __exit__(self, *exc: Any) -> None:
        self.enc.bucket_overhead_tokens = self.overhead
        del self.enc.length_keys


def alternate(repeats: int, old: Callable[[], Any], new: Callable[[], Any]) -> dict[str, Any]:
    times: dict[str, list[float]] = {"old": [], "new": []}
    out: dict[str, Any] = {}
    for r in range(repeats):
        for name, fn in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            t = time.perf_counter()
            out[name] = fn()
            times[name].append(round(time.perf_counter() - t, 3))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": times, "median_s": med, "speedup": round(med["old"] / med["new"], 3), "_results": out}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--labels", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "transformer_padding.json"))
    args = ap.parse_args(argv)

    from xmc.config import set_offline_env

    set_offline_env()
    import torch

    from lab.bench.bow_training_speed import machine_peaks
    from xmc.encoders.transformer import TransformerEncoder

    peaks = machine_peaks()
    print(f"machine: {peaks}", flush=True)
    processed = Path(args.processed)
    labels, sentences = _texts(processed / "lbl.jsonl"), _texts(processed / "trn.jsonl")
    rng = np.random.default_rng(0)
    result: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__, **peaks},
        "args": vars(args), "cases": {}}

    # label encoding: the predict stages' and refreshes' pass (eval mode, no gradient)
    enc = TransformerEncoder(max_len_query=32, max_len_label=32)
    sample = [labels[i] for i in rng.choice(len(labels), size=min(args.labels, len(labels)), replace=False)]
    lengths = enc.token_lengths(sample, "label")
    old_order = np.argsort([len(t) for t in sample], kind="stable")
    new_order = np.argsort(lengths, kind="stable")
    overhead = enc.bucket_overhead_tokens
    cut = lambda order: [order[s : s + 256] for s in range(0, len(order), 256)]   # noqa: E731

    def encode_old() -> np.ndarray:
        with _Old(enc):
            return enc.encode(sample, "label", batch_size=256)

    r = alternate(args.repeats, encode_old, lambda: enc.encode(sample, "label", batch_size=256))
    res = r.pop("_results")
    r.update(texts=len(sample), real_tokens=int(lengths.sum()),
             padded_tokens={"old": padded_tokens(lengths, cut(old_order), False, overhead),
                            "new": padded_tokens(lengths, cut(new_order), True, overhead)},
             max_abs_diff=float(np.abs(res["old"] - res["new"]).max()))
    cfg = enc.query_model.config
    roofline(r, text_flops(lengths, cfg), peaks["matmul_GFLOPs"])
    result["cases"]["label_encoding"] = r
    print(f"label_encoding: {r['median_s']} s, {r['speedup']}x, padded tokens {r['padded_tokens']}, "
          f"real {r['real_tokens']}, max |diff| {r['max_abs_diff']:.2e}, over roofline {r['measured_over_roofline']}",
          flush=True)

    def steps(encoder: Any, batches: list[tuple[list[str], list[str]]], pair: bool) -> float:
        encoder.train()
        loss_sum = 0.0
        for q, lab in batches:
            encoder.zero_grad(set_to_none=True)
            if pair:
                qv, lv = encoder.encode_pair(q, lab)
                loss = (qv @ lv.T).logsumexp(1).mean()
            else:
                loss = encoder(q, "query").sum(0).norm()
            loss.backward()
            loss_sum += float(loss.detach())
        return loss_sum

    def step_case(name: str, encoder: Any, batches: list[tuple[list[str], list[str]]], pair: bool) -> None:
        """Old and new training steps over the same batches; a step's FLOPs counted as three forwards (the
        backward does about twice the forward's)."""
        lengths = [np.concatenate([encoder.token_lengths(q, "query"), encoder.token_lengths(lab, "label")])
                   for q, lab in batches]

        def old() -> float:
            with _Old(encoder):
                return steps(encoder, batches, pair)

        r = alternate(args.repeats, old, lambda: steps(encoder, batches, pair))
        r.pop("_results")
        whole = [[np.arange(len(x))] for x in lengths]
        r.update(steps=len(batches), real_tokens=int(sum(x.sum() for x in lengths)),
                 padded_tokens={way: sum(padded_tokens(x, w, way == "new", overhead) for x, w in zip(lengths, whole))
                                for way in ("old", "new")})
        roofline(r, 3 * sum(text_flops(x, cfg) for x in lengths), peaks["matmul_GFLOPs"])
        result["cases"][name] = r
        print(f"{name}: {r['median_s']} s, {r['speedup']}x, padded tokens {r['padded_tokens']}, "
              f"over roofline {r['measured_over_roofline']}", flush=True)

    # a DEXML step: 64 sentences and 128 label texts (positive + negative per sentence) in one pass
    step_case("dexml_step", enc, [([sentences[i] for i in rng.choice(len(sentences), 64)],
                                   [labels[i] for i in rng.choice(len(labels), 128)]) for _ in range(args.steps)], True)
    # MACLR's sentences at its query length
    step_case("maclr_query_step", TransformerEncoder(max_len_query=64, max_len_label=32),
              [([sentences[i] for i in rng.choice(len(sentences), 64)], []) for _ in range(args.steps)], False)

    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
