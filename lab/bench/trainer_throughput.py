"""Training throughput: our trainer vs sentence-transformers' SentenceTransformerTrainer.

Same model (all-MiniLM-L6-v2), batch size, max length, data (semcor-wn30 training pairs: one
random positive label per instance) and loss family (in-batch softmax: our SoftmaxLoss with
in-batch negatives is MNRL's objective), in one process, timed over the same number of steps
after a warm-up. Also times one hard-negative refresh on the full label set (encode every
label and every training query, exact search, positives removed).

    python -m lab.bench.trainer_throughput [--steps 30] [--batch-size 64] [--processed data/processed]

Prints pairs/second of each and the ratio. Not a test: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from xmc.config import set_offline_env


def main() -> None:
    set_offline_env()
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=32)
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--skip-refresh", action="store_true")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)))

    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from xmc.data import load_processed
    from xmc.encoders.transformer import TransformerEncoder, default_model_dir
    from xmc.losses import SoftmaxLoss
    from xmc.models.dual_encoder import DualEncoderModel
    from xmc.negatives import HardNegativeShortlist, InBatchNegatives
    from xmc.peers.st_mnrl import mnrl_pairs
    from xmc.trainer.trainer import Trainer, TrainConfig

    ds = load_processed(a.processed)
    n_steps = a.warmup + a.steps
    bs = a.batch_size
    results: dict[str, float] = {}

    # --- ours: one positive per query, in-batch negatives, softmax (= MNRL objective)
    enc = TransformerEncoder(max_len_query=a.max_len, max_len_label=a.max_len)
    model = DualEncoderModel(enc, ds.label_texts)
    sampler = InBatchNegatives(ds.trn.Y, max_positives_per_query=1)
    cfg = TrainConfig(epochs=1, batch_size=bs, lr=2e-5, max_steps_per_epoch=n_steps, warmup_ratio=0.1)
    tr = Trainer(model, sampler, SoftmaxLoss(0.05), cfg, ds.trn.texts, "/tmp/xmc_bench_ours")
    if tr.ckpt_path.exists():
        tr.ckpt_path.unlink()
    step_times: list[float] = []
    orig_step = tr._step

    def timed_step(batch):
        t = time.perf_counter()
        out = orig_step(batch)
        step_times.append(time.perf_counter() - t)
        return out

    tr._step = timed_step  # type: ignore[method-assign]
    t0 = time.perf_counter()
    tr.fit()
    ours_total = time.perf_counter() - t0
    ours = a.steps * bs / sum(step_times[a.warmup:])
    results["ours_pairs_per_s_fwd_bwd"] = ours
    results["ours_pairs_per_s_wall"] = n_steps * bs / ours_total

    # --- sentence-transformers: SentenceTransformerTrainer + MNRL, same pairs and batch
    st = SentenceTransformer(default_model_dir(), device="cpu")
    st.max_seq_length = a.max_len
    anchors, positives = mnrl_pairs(ds.trn.texts, ds.trn.Y, ds.label_texts, 1, 0, n_steps, bs)
    data = Dataset.from_dict({"anchor": anchors, "positive": positives})

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self._t = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    timer = StepTimer()
    args = SentenceTransformerTrainingArguments(output_dir="/tmp/xmc_bench_st", num_train_epochs=1, per_device_train_batch_size=bs,
                                                max_steps=n_steps, learning_rate=2e-5, warmup_ratio=0.1, report_to=[],
                                                save_strategy="no", logging_steps=1000, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=data,
                                         loss=MultipleNegativesRankingLoss(st, scale=20.0), callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    st_total = time.perf_counter() - t0
    theirs = a.steps * bs / sum(timer.times[a.warmup:])
    results["st_pairs_per_s_step"] = theirs
    results["st_pairs_per_s_wall"] = n_steps * bs / st_total
    results["ratio_ours_over_st_step"] = ours / theirs
    results["ratio_ours_over_st_wall"] = results["ours_pairs_per_s_wall"] / results["st_pairs_per_s_wall"]

    if not a.skip_refresh:
        sl = HardNegativeShortlist(ds.trn.Y, shortlist_size=100)
        t0 = time.perf_counter()
        sl.on_epoch_start(0, model, ds.trn.texts)
        results["hard_negative_refresh_seconds"] = time.perf_counter() - t0
        results["refresh_labels"] = ds.n_labels
        results["refresh_queries"] = len(ds.trn)

    print(f"device: cpu x{torch.get_num_threads()} threads; batch {bs}; max_len {a.max_len}; {a.steps} timed steps")
    print(f"ours (xmc Trainer, in-batch softmax):      {results['ours_pairs_per_s_fwd_bwd']:.1f} pairs/s per step, "
          f"{results['ours_pairs_per_s_wall']:.1f} pairs/s wall")
    print(f"SentenceTransformerTrainer + MNRL:          {results['st_pairs_per_s_step']:.1f} pairs/s per step, "
          f"{results['st_pairs_per_s_wall']:.1f} pairs/s wall")
    print(f"ratio ours / sentence-transformers:          {results['ratio_ours_over_st_step']:.2f}x per step, "
          f"{results['ratio_ours_over_st_wall']:.2f}x wall")
    if "hard_negative_refresh_seconds" in results:
        print(f"one hard-negative refresh ({results['refresh_labels']} labels, {results['refresh_queries']} queries): "
              f"{results['hard_negative_refresh_seconds']:.1f} s")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
