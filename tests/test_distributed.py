"""Data-parallel training on torch.distributed (gloo, CPU): two ranks launched by ``torchrun --nproc_per_node 2`` on the
same global batch give the losses and the parameters of one process, for DEXML's in-batch, hard-negative and
all-label pools, DEXML with the MiniLM transformer encoder on a SemCor slice, ASTRA and UniDEC with their classifier
tables replicated or sharded by label, RAMEN, MACLR's Stage I and Stage II; each rank computes the loss of its rows
only (``Objective.shards_rows``), so a missing gradient reduction shows as a different model; killed runs resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from tests.pipeline_repo import SEMCOR, ROOT, env, results_of

LABELS = [f"label {w} {v}" for w in ("red", "blue", "green", "black", "white") for v in ("shoe", "lamp", "mug", "scarf")]


def _data(n: int = 96, seed: int = 0) -> tuple[list[str], sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    texts, rows, cols = [], [], []
    for i in range(n):
        ids = sorted(set(rng.choice(len(LABELS), size=rng.integers(1, 3), replace=False).tolist()))
        texts.append(" ".join(LABELS[j].split(" ", 1)[1] for j in ids) + f" item {i % 7}")
        rows += [i] * len(ids)
        cols += ids
    return texts, sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, len(LABELS)))


def _train(negatives: dict, out: Path, steps_file: Path) -> None:
    from xmc.encoders.build import build_encoder
    from xmc.losses import DecoupledSoftmaxLoss
    from xmc.models.dual_encoder import DualEncoderModel
    from xmc.negatives import build_sampler
    from xmc.trainer.trainer import Trainer, TrainConfig
    from xmc.trainer.distributed import ShardedForward, context

    torch.manual_seed(0)
    texts, Y = _data()
    enc = build_encoder({"kind": "bow", "dim": 16, "n_buckets": 2048, "seed": 0})
    model = DualEncoderModel(enc, LABELS)
    sampler = build_sampler(Y, negatives)
    cfg = TrainConfig(epochs=2, batch_size=16, lr=0.05, warmup_ratio=0.0, label_chunk_size=7)
    tr = Trainer(model, sampler, DecoupledSoftmaxLoss(0.1), cfg, texts, out)
    tr.fit()
    if context().is_main:
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": enc.query_bag.weight.detach().numpy().tolist(),
                                          "world": context().world, "sharded": enc.trained_bucket_shards == 2,
                                          "forward_wrapped": isinstance(enc.forward, ShardedForward)}))


class _DieAt:
    """Wraps a sampler: the process exits hard (no clean-up, like a kill) when training reaches ``step``."""

    def __init__(self, sampler, step: int) -> None:
        self.__dict__["_inner"], self.__dict__["_step"] = sampler, step

    def on_step_start(self, step: int, model, texts) -> None:
        if step == self._step:
            os._exit(3)
        self._inner.on_step_start(step, model, texts)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._inner, name, value)


def _train_astra(opts: dict, out: Path, steps_file: Path) -> None:
    """ASTRA: the encoder sharded, the classifier table replicated or sharded by label (``shard``: each rank scores
    its rows, the ANN refresh searches each rank's shard and merges, mined in the background with ``async``); stale
    ANN negatives from epoch 1 and uniform negatives drawn from the step's seed."""
    from tests.test_astra import small_model, synthetic
    from xmc.methods.astra import ASTRANegatives, ASTRAObjective
    from xmc.trainer.trainer import Trainer, TrainConfig
    from xmc.trainer.distributed import context

    texts, labels, Y = synthetic(n_q=96, n_l=40)
    model = small_model(labels, shard_labels=opts.get("shard", False))
    sampler = ASTRANegatives(Y, model.dim, hard_negatives=4, uniform_negatives=8, start_epoch=1, refresh_every_epochs=1,
                             async_refresh=opts.get("async", False), uniform_shared=opts.get("shared", False),
                             work_dir=out / "shortlists")
    if opts.get("die_at"):
        sampler = _DieAt(sampler, opts["die_at"])
    cfg = TrainConfig(epochs=opts.get("epochs", 2), batch_size=16, lr=0.05, group_lr={"classifier": 5.0},
                      group_optimizer={"classifier": "sgd"}, warmup_ratio=0.0, device="cpu",
                      checkpoint_every_steps=opts.get("checkpoint_every_steps", 0))
    tr = Trainer(model, sampler, ASTRAObjective(), cfg, texts, out)
    tr.fit()
    weight = model.W.gathered()   # a collective when sharded: every rank
    if context().is_main:
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": weight.numpy().tolist(), "world": context().world,
                                          "rows_held": model.W.weight.shape[0], "sharded": model.W.sharded}))


def _train_unidec(opts: dict, out: Path, steps_file: Path) -> None:
    """UniDEC: the two heads on every rank, the classifier table replicated or sharded by label (``shard``), the
    encoder sharded; pick-some-labels batches with the clustered shortlist from epoch 1 (heads' dropout off: ranks
    draw different masks)."""
    from tests.test_unidec import synthetic
    from xmc.encoders.bow import HashedBagOfWordsEncoder
    from xmc.methods.unidec import PickSomeLabelsSampler, UniDECModel, UniDECObjective
    from xmc.trainer.trainer import Trainer, TrainConfig
    from xmc.trainer.distributed import context

    torch.manual_seed(0)
    texts, labels, Y = synthetic()
    model = UniDECModel(HashedBagOfWordsEncoder(dim=16, n_buckets=1 << 12, seed=0), labels, dim=16, dropout=0.0,
                        shard_labels=opts.get("shard", False))
    model.init_classifiers_from_label_text()
    sampler = PickSomeLabelsSampler(Y, max_positives_per_query=2, negatives_per_query=2, shortlist_size=6,
                                    refresh_every_epochs=1, start_epoch=1, cluster_size=8)
    cfg = TrainConfig(epochs=2, batch_size=32, lr=0.05, group_lr={"heads": 0.01, "classifier": 0.05},
                      warmup_ratio=0.0, device="cpu", seed=0)
    tr = Trainer(model, sampler, UniDECObjective(bce_weight=0.5), cfg, texts, out)
    tr.fit()
    model.reset_unseen_classifiers(np.asarray(Y[:40].sum(0)).ravel())   # global row writes land on their owners
    psi = model.psi.gathered()
    if context().is_main:
        dense = [p.detach().reshape(-1) for n, p in model.named_parameters() if not n.startswith("psi.")]
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": torch.cat([*dense, psi.reshape(-1)]).tolist(),
                                          "world": context().world, "rows_held": model.psi.weight.shape[0]}))


def _train_ramen(_: dict, out: Path, steps_file: Path) -> None:
    """RAMEN: graph regularisers (anchor texts encoded through the sharded encoder), pruning from epoch 1."""
    from tests.test_ramen import toy_ramen
    from xmc.trainer.trainer import Trainer, TrainConfig
    from xmc.trainer.distributed import context

    (texts, _, _, _), enc, model, sampler, obj = toy_ramen(every_epochs=1)
    cfg = TrainConfig(epochs=2, batch_size=16, lr=0.05, warmup_ratio=0.0)
    tr = Trainer(model, sampler, obj, cfg, texts, out)
    tr.fit()
    if context().is_main:
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": enc.query_bag.weight.detach().numpy().tolist(),
                                          "world": context().world}))


def _train_maclr_stage1(_: dict, out: Path, steps_file: Path) -> None:
    """MACLR Stage I: ICT pseudo pairs in clustered batches (multi-scale k re-clustered from the gathered
    embeddings), label regularisation on; the encoder sharded."""
    from xmc.encoders.build import build_encoder
    from xmc.maclr.pseudo import ICTPair, PseudoPairs
    from xmc.maclr.train import train_stage1
    from xmc.trainer.distributed import context

    torch.manual_seed(0)
    texts, _ = _data(n=96)
    pairs = PseudoPairs(texts=texts, label_texts=LABELS,
                        ict=[ICTPair(instance=i, context=t, pseudo_label=" ".join(t.split()[:2]))
                             for i, t in enumerate(texts)],
                        tfidf_ids=np.full((len(texts), 1), -1, np.int32), tfidf_scores=np.zeros((len(texts), 1), np.float32),
                        meta={"counts": {"ict": len(texts)}})
    enc = build_encoder({"kind": "bow", "dim": 16, "n_buckets": 2048, "seed": 0, "dropout": 0.0})
    res = train_stage1(enc, pairs, {"train": {"epochs": 2, "batch_size": 16, "lr": 0.05, "warmup_ratio": 0.0},
                                    "k0": 4, "t_k": 2, "t_update": 3, "label_reg": True, "label_negatives": 4}, out)
    tr = res["trainer"]
    if context().is_main:
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": enc.query_bag.weight.detach().numpy().tolist(),
                                          "world": context().world, "reclustered_at": res["reclustered_at"]}))


def semcor_slice(n: int = 48) -> tuple[list[str], list[str], sp.csr_matrix]:
    """The first ``n`` SemCor training sentences and the label texts of the senses they are tagged with (ids
    renumbered 0..L-1): a small real slice."""
    texts = (SEMCOR / "trn.raw.txt").read_text(encoding="utf-8").splitlines()[:n]
    rows = (SEMCOR / "trn_X_Y.txt").read_text(encoding="utf-8").splitlines()[1 : n + 1]
    ids = [[int(t.split(":")[0]) for t in r.split()] for r in rows]
    used = sorted({j for r in ids for j in r})
    col = {j: c for c, j in enumerate(used)}
    names = (SEMCOR / "lbl.raw.txt").read_text(encoding="utf-8").splitlines()
    r_i = [i for i, r in enumerate(ids) for _ in r]
    c_i = [col[j] for r in ids for j in r]
    Y = sp.csr_matrix((np.ones(len(r_i), np.float32), (r_i, c_i)), shape=(n, len(used)))
    return texts, [names[j] for j in used], Y


def _train_dexml_transformer(_: dict, out: Path, steps_file: Path) -> None:
    """DEXML with the real MiniLM encoder (its dropout off: ranks would draw other masks) on a SemCor slice,
    in-batch negatives; every rank encodes its share of the batch's sentences and senses."""
    from xmc.encoders.transformer import TransformerEncoder
    from xmc.losses import DecoupledSoftmaxLoss
    from xmc.models.dual_encoder import DualEncoderModel
    from xmc.negatives import build_sampler
    from xmc.trainer.trainer import Trainer, TrainConfig
    from xmc.trainer.distributed import context

    torch.manual_seed(0)
    texts, labels, Y = semcor_slice(32)
    enc = TransformerEncoder(max_len_query=24, max_len_label=24)
    for m in enc.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model = DualEncoderModel(enc, labels)
    sampler = build_sampler(Y, {"kind": "in_batch", "max_positives_per_query": 0})
    cfg = TrainConfig(epochs=1, batch_size=8, lr=1e-4, warmup_ratio=0.0, device="cpu", amp="off")
    tr = Trainer(model, sampler, DecoupledSoftmaxLoss(0.05), cfg, texts, out)
    tr.fit()
    if context().is_main:
        layer = enc.query_model.encoder.layer[-1].output.dense.weight
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": layer.detach().reshape(-1)[:20000].numpy().tolist(),
                                          "world": context().world}))


def _train_maclr_stage2(_: dict, out: Path, steps_file: Path) -> None:
    """MACLR Stage II: the dual encoder self-trained on pseudo pairs (here: the TF-IDF top-3 senses of each
    SemCor sentence, a real view of the slice), DecoupledSoftmax with in-batch negatives (``train_pairs``)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from xmc.encoders.build import build_encoder
    from xmc.maclr.train import train_pairs
    from xmc.trainer.distributed import context

    torch.manual_seed(0)
    texts, labels, _ = semcor_slice(96)
    vec = TfidfVectorizer().fit(texts + labels)
    S = (vec.transform(texts) @ vec.transform(labels).T).toarray()
    top = np.argsort(-S, 1)[:, :3]
    Y = sp.csr_matrix((np.ones(top.size, np.float32), (np.repeat(np.arange(len(texts)), 3), top.ravel())),
                      shape=(len(texts), len(labels)))
    enc = build_encoder({"kind": "bow", "dim": 16, "n_buckets": 2048, "seed": 0, "dropout": 0.0})
    cfg = {"negatives": {"kind": "in_batch", "max_positives_per_query": 0},
           "loss": {"name": "decoupled_softmax", "temperature": 0.1},
           "train": {"epochs": 2, "batch_size": 16, "lr": 0.05, "warmup_ratio": 0.0}}
    tr, _ = train_pairs(enc, texts, labels, Y, cfg, out, {"test": "stage2"})
    if context().is_main:
        steps_file.write_text(json.dumps({"loss": [h["loss"] for h in tr.history["loss"]],
                                          "weight": enc.query_bag.weight.detach().numpy().tolist(),
                                          "world": context().world}))


TRAIN = {"dexml": _train, "astra": _train_astra, "unidec": _train_unidec, "ramen": _train_ramen,
         "maclr": _train_maclr_stage1, "dexml_transformer": _train_dexml_transformer,
         "maclr_stage2": _train_maclr_stage2}


def two_ranks(method: str, opts: dict, out: Path, result: Path, timeout: float = 600) -> None:
    """The real launcher: ``torchrun --nproc_per_node 2`` (gloo, one thread per rank) on ``method``'s run."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tests.distributed_worker", method, json.dumps(opts), str(out), str(result)]
    p = subprocess.run(cmd, cwd=ROOT, env={**env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]


def _worker(rank: int, world: int, init_file: str, negatives: dict, out: str, result: str, method: str = "dexml") -> None:
    import torch.distributed as dist

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from xmc.parallel import exit_rank

    try:
        TRAIN[method](negatives, Path(out), Path(result))
    except BaseException:
        traceback.print_exc()
        exit_rank(1)
    exit_rank(0)   # as stages.train's ranks end: a normal exit can abort in gloo's threads (xmc.parallel.exit_rank)


NEGATIVES = {
    "in_batch": {"kind": "in_batch", "max_positives_per_query": 0},
    "hard": {"kind": "hard", "shortlist_size": 5, "negatives_per_query": 2, "max_positives_per_query": 0,
             "refresh_every_epochs": 1, "start_epoch": 1},
    "all": {"kind": "all", "max_positives_per_query": 0},
}


@pytest.mark.parametrize("pool", list(NEGATIVES))
def test_two_ranks_train_like_one_process(pool, tmp_path):
    torch.set_num_threads(1)
    _train(NEGATIVES[pool], tmp_path / "one", tmp_path / "one.json")
    two_ranks("dexml", NEGATIVES[pool], tmp_path / "two", tmp_path / "two.json")
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    # the bag-of-words table was split by its rows across the two ranks (no text split, no table gradient exchanged)
    assert (one["world"], one["sharded"], two["world"], two["sharded"]) == (1, False, 2, True)
    assert not two["forward_wrapped"]
    assert len(one["loss"]) == len(two["loss"]) == 12
    assert np.allclose(one["loss"], two["loss"], rtol=1e-4, atol=1e-5), (one["loss"][:3], two["loss"][:3])
    assert np.allclose(one["weight"], two["weight"], rtol=1e-3, atol=5e-5)
    # rank 0 wrote the run's record; the other rank wrote nothing of its own
    assert (tmp_path / "two" / "completed.json").is_file()


OTHER = {"astra": ("astra", {}),
         "astra_sharded": ("astra", {"shard": True, "async": True, "shared": True, "epochs": 3}),
         "unidec": ("unidec", {}), "unidec_sharded": ("unidec", {"shard": True}),
         "ramen": ("ramen", {}), "maclr_stage1": ("maclr", {}), "maclr_stage2": ("maclr_stage2", {}),
         "dexml_transformer": ("dexml_transformer", {})}


@pytest.mark.parametrize("case", list(OTHER))
def test_other_methods_two_ranks_train_like_one_process(case, tmp_path):
    method, opts = OTHER[case]
    if method in ("dexml_transformer", "maclr_stage2") and not SEMCOR.exists():
        pytest.skip("../shared/datasets/semcor-wn30 not present")
    torch.set_num_threads(1)
    TRAIN[method](opts, tmp_path / "one", tmp_path / "one.json")
    two_ranks(method, opts, tmp_path / "two", tmp_path / "two.json")
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert two["world"] == 2 and len(one["loss"]) == len(two["loss"]) >= 4 and one["world"] == 1
    assert np.allclose(one["loss"], two["loss"], rtol=1e-4, atol=1e-5), (one["loss"][:3], two["loss"][:3])
    assert np.allclose(one["weight"], two["weight"], rtol=1e-3, atol=5e-5)
    if opts.get("shard"):   # rank 0 held its half of the table: 40 labels -> rows 0..19
        assert (one["rows_held"], two["rows_held"]) == (40, 20)
    if method == "maclr":
        assert one["reclustered_at"] == two["reclustered_at"] and len(one["reclustered_at"]) >= 2


def test_killed_label_sharded_run_resumes_to_the_same_model(tmp_path):
    """Two ranks with a label-sharded ASTRA table, checkpointing every 2 steps, die hard at step 9 (after the
    background refresh of epoch 2 was started); rerun, every rank resumes from the newest step all ranks hold and
    the run ends with the model of an uninterrupted single process."""
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    opts = {"shard": True, "async": True, "epochs": 3, "checkpoint_every_steps": 2}
    _train_astra(opts, tmp_path / "one", tmp_path / "one.json")
    with pytest.raises(mp.ProcessExitedException):
        mp.spawn(_worker, args=(2, str(tmp_path / "init1"), {**opts, "die_at": 9}, str(tmp_path / "two"),
                                str(tmp_path / "two.json"), "astra"), nprocs=2, join=True)
    left = sorted(p.name for p in (tmp_path / "two").glob("checkpoint*.pt"))
    assert left == ["checkpoint.rank0.step8.pt", "checkpoint.rank1.step8.pt"], left
    mp.spawn(_worker, args=(2, str(tmp_path / "init2"), opts, str(tmp_path / "two"), str(tmp_path / "two.json"),
                            "astra"), nprocs=2, join=True)
    one, two = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert np.allclose(one["loss"], two["loss"], rtol=1e-4, atol=1e-5)
    assert np.allclose(one["weight"], two["weight"], rtol=1e-3, atol=5e-5)
    assert not list((tmp_path / "two").glob("checkpoint*.pt")) and (tmp_path / "two" / "completed.json").is_file()


def test_stage_launches_torchrun_and_a_killed_two_rank_run_resumes(tmp_path):
    """`python -m stages.train <run>` with train.nproc_per_node 2 runs under torchrun; killed mid-run (the whole
    process group), the rerun resumes from the step both ranks checkpointed (each holds its rows of the row-split
    table) and finishes with the model and its live record."""
    import signal
    import subprocess
    import time

    from tests.pipeline_repo import env, make_repo, run
    from tests.test_own_dataset_e2e import TINY, write_product_dataset

    data = write_product_dataset(tmp_path / "data" / "products")
    bow = {"kind": "bow", "dim": 16, "n_buckets": 2048}
    repo = make_repo(tmp_path / "repo", dataset_dir=data, trn_docs=0, tst_docs=0, extra_params={**TINY,
        "runs": {"dexml_bow": {"method": "dexml", "encoder": bow,
                               "negatives": {"kind": "in_batch", "max_positives_per_query": 0},
                               "train": {"epochs": 100, "batch_size": 32, "lr": 0.01, "max_steps_per_epoch": 0,
                                         "checkpoint_every_steps": 2, "checkpoint_interval_minutes": 0,
                                         "nproc_per_node": 2}}},
        "hybrids": {}, "report.paired": []})
    run(["dvc", "repro", "validate"], repo)
    ckpts = results_of(repo) / "checkpoints" / "dexml_bow"   # a row-split table: each rank checkpoints its own rows
    p = subprocess.Popen([env()["PATH"].split(os.pathsep)[0] + "/python", "-m", "stages.train", "dexml_bow"], cwd=repo,
                         env={**env(), "XMC_THREADS": "2"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    deadline = time.time() + 240
    def both_ranks_checkpointed() -> bool:
        steps = [{f.name.split(".step")[1] for f in ckpts.glob(f"checkpoint.rank{r}.step*.pt")} for r in (0, 1)]
        return bool(steps[0] & steps[1])

    while not both_ranks_checkpointed() and time.time() < deadline and p.poll() is None:
        time.sleep(0.5)
    assert both_ranks_checkpointed(), p.communicate()[0][-3000:]
    ranks = [int(x) for x in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
    # kill -9 the launcher alone: the ranks notice their launcher is gone and stop (they are in their own session)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    deadline = time.time() + 30
    while any(Path(f"/proc/{r}").exists() and "(python" in Path(f"/proc/{r}/stat").read_text()[:40]
              and " Z " not in Path(f"/proc/{r}/stat").read_text()[:60] for r in ranks) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{r}").exists() and " Z " not in Path(f"/proc/{r}/stat").read_text()[:60]
                   for r in ranks), "a rank outlived its launcher"
    assert not (results_of(repo) / "models" / "dexml_bow").exists()
    second = run(["python", "-m", "stages.train", "dexml_bow"], repo, timeout=600)
    out = second.stdout + second.stderr
    assert "resumed from" in out and out.count("trained dexml_bow") == 1, out[-3000:]   # rank 0 alone reports
    summary = json.loads((results_of(repo) / "models" / "dexml_bow" / "train_summary.json").read_text())
    assert summary["epochs"] == 100
    live = json.loads((results_of(repo) / "plots" / "train" / "dexml_bow" / "metrics.json").read_text())
    assert live["step"] == summary["steps"]


def test_entry_point_hands_every_exit_code_to_its_finish_hook(capsys):
    """stages.train ends a torchrun rank through ``finish`` (xmc.parallel.exit_rank) on success, on a failure (its
    one-line message first) and on sys.exit; outside a process group exit_rank returns and the usual exit follows."""
    from xmc.config import run_entry_point
    from xmc.errors import ConfigError
    from xmc.parallel import exit_rank

    def fails() -> None:
        raise ConfigError("run 'x': no such run")

    seen: list[int] = []
    run_entry_point(lambda: None, finish=seen.append)
    with pytest.raises(SystemExit) as bad:
        run_entry_point(fails, finish=seen.append)
    with pytest.raises(SystemExit) as quit_:
        run_entry_point(lambda: sys.exit(3), finish=seen.append)
    assert seen == [0, 2, 3] and bad.value.code == 2 and quit_.value.code == 3
    assert "error: run 'x': no such run" in capsys.readouterr().err
    assert exit_rank(0) is None   # no process group here: nothing to end
