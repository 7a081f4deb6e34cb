"""The GPU profile of every method on the transformer encoder (MiniLM), run on a lent GPU machine, with each
run's training time, epochs and test/validation metrics: ``lab/bench/gpu/`` (``metrics/``, ``metrics_val/``,
``evaluation/``), ``lab/bench/gpu_profiles.json``.

The profiles are the full-length ones of ``docs/methods/*.md`` (DEXML 20 epochs with hard negatives refreshed by
the encoder being trained, MACLR's paper schedule, RAMEN / UniDEC / ASTRA on MiniLM). A lease of GPU time is
short, so each method gets a wall-clock budget: a two-epoch probe run measures what an epoch costs (the second
epoch carries the periodic work, refreshes and pruning, so the estimate is high), and the run proper trains the
most epochs that fit the budget, at most the profile's; the epoch-dependent schedule (refresh / pruning /
clustering periods) is scaled with it. Every row records the epochs run, the profile's epochs, seconds per epoch and
the projection to the full length. A profile is a run of its method (``xmc.config.runs``) based on the run it
profiles: the lab's ``dexml`` (MiniLM) and the product's ``maclr``, ``ramen``, ``unidec`` and ``astra``, with the
profile's overrides; it is trained and packaged as the pipeline does (``xmc.methods.harness.train_run``,
``xmc.package.build.package_run``: predictions and metrics of both splits).

Three steps, because the GPU machine has neither the data nor the encoder package nor the network:

    python -m lab.bench.gpu_profiles pack        # here: .gpu/ = data (processed, graph, MACLR pairs) + MiniLM + wheels
    # on the GPU machine (device tool, carry .gpu):
    pip install --target /tmp/site .gpu/wheels/*.whl; PYTHONPATH=/tmp/site:. python -m lab.bench.gpu_profiles run \\
        --work /tmp/gpuws --out $OUT --methods dexml,astra,unidec,ramen,maclr --budget 105 --total 540
        # --epochs dexml=20 trains a method whose epoch cost an earlier lease measured, with no probe
    python -m lab.bench.gpu_profiles collect DIR...   # here: the folders that came back -> lab/bench/gpu/,
                                                 # lab/bench/gpu_profiles.json (earlier leases' rows kept; paired
                                                 # tests against the CPU xr_linear)
    python -m lab.bench.gpu_profiles refuse DIR... --calls N,...   # here: collected calls fused again with the
                                                 # label names when the fusion changed (no new lease)

With faiss-gpu (the image has CUDA 13 and no faiss; see :func:`pack_faiss_gpu`):

    python -m lab.bench.gpu_profiles pack --faiss-gpu --data-dirs data/processed   # the methods' data only: 64 MiB
    # there, before python starts: source lab/bench/faiss_gpu/env.sh .gpu
    python -m lab.bench.gpu_profiles faiss-check --out $OUT   # ANNIndex on the GPU against the CPU -> faiss_gpu.json

``pack`` stores MiniLM's weights in float16 (the transfer limit; the machine rebuilds float32 weights from them),
and of the word-embedding table only the rows of the word pieces that occur in the carried texts, as int8 with a
float16 scale per row (the other rows are never looked up by this data; they are rebuilt as zeros). Sentence
embeddings of the rebuilt model against MiniLM's: cosine ≥ 0.9999 (``tests/test_gpu_profiles.py``). The CPU profile of
the same methods is the default pipeline (``metrics/<run>.json``).
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

ROOT = Path(__file__).resolve().parents[2]   # the repository
BENCH = Path(__file__).resolve().parent
CARRY = ROOT / ".gpu"
DATA_DIRS = ["data/processed", "data/graph/augmented", "data/maclr_pairs"]   # what the five runs read
WHEELS = ["faiss-cpu==1.15.1", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
          "typing-inspection==0.4.5", "typing-extensions==4.16.0"]
ST_FILES = ["config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
            "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json"]
EMBEDDING = "embeddings.word_embeddings.weight"
# the word-embedding table trains too (frozen only in the CPU profiles, where its optimiser step is the cost)
MINILM = {"kind": "transformer", "model_dir": None, "pooling": "mean", "max_len_query": 32, "max_len_label": 32,
          "tied": True, "dropout": 0.0, "freeze_embeddings": False}
EVAL_RESERVE_S = 35.0   # prediction (val + tst) and evaluation of a run on the GPU machine
# a one-epoch probe missed the periodic work that starts at epoch 1: RAMEN's 19-epoch run (refresh + pruning
# every epoch, ~10 s each) was estimated at 11.7 s per epoch, took ~17 and was stopped at its limit
PROBE_EPOCHS = 2
NO_CKPT = {"checkpoint_every_steps": 0, "checkpoint_interval_minutes": 1000.0}


# ------------------------------------------------------------------------------------------------
# the profiles (docs/methods/*.md "GPU profile") and how their schedules scale with the epochs run
# ------------------------------------------------------------------------------------------------
def _every(epochs: int, paper_every: int, paper_epochs: int) -> int:
    """A period of ``paper_every`` in ``paper_epochs`` epochs, kept in proportion for ``epochs``."""
    return max(1, round(paper_every * epochs / paper_epochs))


def _dexml(e: int) -> dict[str, Any]:
    return {"encoder": dict(MINILM),
            "train": {"epochs": e, "max_steps_per_epoch": 0, "batch_size": 256, "lr": 2e-4, "eval_every_epochs": 0,
                      **NO_CKPT},
            "negatives": {"negatives_per_query": 5, "refresh_every_epochs": _every(e, 5, 20),
                          "refresh_every_steps": 0}}


def _maclr(e: int) -> dict[str, Any]:
    steps = e * math.ceil(15790 / 256)   # T: Stage I steps (15,790 ICT pairs at batch 256); T_K = T/10, T_upd = T/20
    return {"encoder": {"model_dir": None, "freeze_embeddings": False},
            "stage1": {"train": {"epochs": e, "max_steps_per_epoch": 0, "batch_size": 256, **NO_CKPT},
                       "t_k": max(1, steps // 10), "t_update": max(1, steps // 20), "cluster_pool": 0},
            "stage2": {"train": {"epochs": e, "max_steps_per_epoch": 0, "batch_size": 256, "lr": 1e-5, **NO_CKPT}}}


def _ramen(e: int) -> dict[str, Any]:
    return {"encoder": dict(MINILM),
            "train": {"epochs": e, "batch_size": 1024, "lr": 2e-4, "max_steps_per_epoch": 0, "eval_every_epochs": 0,
                      **NO_CKPT},
            "pruning": {"warmup_epochs": _every(e, 10, 300), "every_epochs": _every(e, 5, 300)},
            "loss": {"name": "triplet", "margin": 0.3},
            # one sampled positive per query (DEXML's code, as the paper's triplets): with every positive (8.9 per
            # query) a batch of 1,024 puts ~11k label texts through the encoder with gradients, past 139 GiB
            "negatives": {"max_positives_per_query": 1, "refresh_every_epochs": _every(e, 5, 300)}}


def _unidec(e: int) -> dict[str, Any]:
    return {"encoder": dict(MINILM), "model": {"dim": 384, "dropout": 0.1},
            "train": {"epochs": e, "batch_size": 512, "lr": 1e-4,
                      "group_lr": {"encoder": 1e-4, "heads": 2e-4, "classifier": 1e-3},
                      "max_steps_per_epoch": 0, "eval_every_epochs": 0, **NO_CKPT},
            "psl": {"refresh_every_epochs": _every(e, 5, 50), "shortlist_size": 30, "start_epoch": 0}}


def _astra(e: int) -> dict[str, Any]:
    # negatives: the paper's smaller setting (50 hard, 500 uniform per query: its range is 50-800 / 100-6400)
    return {"encoder": dict(MINILM),
            "train": {"epochs": e, "batch_size": 512, "lr": 1e-5, "group_optimizer": {"classifier": "sgd"},
                      "group_lr": {"classifier": 25.6}, "max_steps_per_epoch": 0, "eval_every_epochs": 0, **NO_CKPT},
            "negatives": {"hard_negatives": 50, "uniform_negatives": 500, "start_epoch": _every(e, 5, 75),
                          "refresh_every_epochs": _every(e, 5, 75)}}


# method -> (run, profile's epochs, overrides of that run for e epochs, predictions evaluated); the run is the lab's
# (dexml: MiniLM) or the product's of that name, the profile its variant with these overrides
PROFILES: dict[str, tuple[str, int, Callable[[int], dict[str, Any]], list[str]]] = {
    "dexml": ("dexml", 20, _dexml, ["dexml"]),
    "maclr": ("maclr", 20, _maclr, ["maclr"]),
    "ramen": ("ramen", 300, _ramen, ["ramen"]),
    "unidec": ("unidec", 50, _unidec, ["unidec", "unidec_de_only", "unidec_clf_only"]),
    "astra": ("astra", 75, _astra, ["astra"]),
}
# a UniDEC prediction's retrieval space (``xmc.package.build.package_run`` option ``space``)
SPACES = {"unidec": "concat", "unidec_de_only": "de", "unidec_clf_only": "clf"}


def base_runs(params: dict[str, Any]) -> dict[str, Any]:
    """{run: RunSpec} of the product's runs (``params``) and the lab's (``lab/params.yaml``, where it is)."""
    from xmc.config import problems_error, read_params_file
    from xmc.config.runs import resolve_runs

    specs, _ = resolve_runs(params["runs"], params)
    lab = ROOT / "lab" / "params.yaml"
    if lab.is_file():
        from lab.config import lab_entry

        raw, lines = read_params_file(lab)
        entries = {n: lab_entry(e)[1] for n, e in (raw.get("runs") or {}).items()}
        lab_specs, problems = resolve_runs(entries, params, ("runs",), known=specs)
        if problems:
            raise problems_error(lab, lines, problems)
        specs = {**specs, **lab_specs}
    return specs


def _train_sections(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [sec["train"] for sec in (cfg, cfg.get("stage1"), cfg.get("stage2"))
            if isinstance(sec, dict) and isinstance(sec.get("train"), dict)]


def profile_run(params: dict[str, Any], method: str, epochs: int, model_dir: str | None, max_steps: int = 0,
                known: dict[str, Any] | None = None) -> Any:
    """``method``'s GPU profile for ``epochs`` epochs as a run (:class:`xmc.config.runs.RunSpec`): the run it
    profiles (``known``, default :func:`base_runs`) with the profile's overrides; the encoder read from
    ``model_dir``; ``max_steps`` > 0 caps every epoch (a quick check of the plumbing on a CPU, not a profile).
    A profile key the run's schema does not know fails here, not on the GPU machine."""
    from xmc.config.runs import RunSpec, resolve_runs
    from xmc.config.schema import deep_merge

    run, _, overrides_of, _ = PROFILES[method]
    known = known if known is not None else base_runs(params)
    if run not in known:
        raise SystemExit(f"profile {method}: no run {run!r} in params.yaml or lab/params.yaml to base it on")
    overrides = deep_merge(overrides_of(epochs), {"encoder": {"model_dir": model_dir}})
    if max_steps:
        for train in _train_sections(overrides):
            train["max_steps_per_epoch"] = max_steps
    key = f"{run}_gpu_profile"
    specs, problems = resolve_runs({key: {"base": run, **overrides}}, params, ("gpu_profiles",), known=known)
    if problems:
        raise SystemExit("; ".join(f"profile {method}: {'.'.join(map(str, loc[2:]))}: {msg}" for loc, msg in problems))
    return RunSpec(run, specs[key].method, specs[key].config, f"lab/bench/gpu_profiles.py PROFILES[{method!r}]")


# ------------------------------------------------------------------------------------------------
# pack (here) and unpack (there)
# ------------------------------------------------------------------------------------------------
def _texts(path: Path) -> Iterator[str]:
    """Every string a data file holds (JSON-lines values, TSV fields)."""
    def strings(v: Any) -> Iterator[str]:
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from strings(x)
        elif isinstance(v, list):
            for x in v:
                yield from strings(x)

    with path.open(encoding="utf-8") as f:
        for line in f:
            if path.suffix == ".jsonl":
                yield from strings(json.loads(line))
            else:
                yield from line.rstrip("\n").split("\t")


def used_token_ids(tokenizer: Any, roots: list[Path]) -> set[int]:
    """The word pieces of every text under ``roots`` (+ special tokens and every piece of one character)."""
    ids: set[int] = set(tokenizer.all_special_ids)
    ids |= {i for t, i in tokenizer.get_vocab().items() if len(t.removeprefix("##")) <= 1}
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".jsonl", ".tsv", ".txt")):
            batch: list[str] = []
            for text in _texts(path):
                batch.append(text)
                if len(batch) == 4096:
                    ids.update(i for row in tokenizer(batch, add_special_tokens=False)["input_ids"] for i in row)
                    batch = []
            if batch:
                ids.update(i for row in tokenizer(batch, add_special_tokens=False)["input_ids"] for i in row)
    return ids


def product_root() -> Path:
    """The product's outputs of the dataset ROOT/params.yaml names: ROOT/results/<data.name>/ (its data/ is what
    a lease carries, and its evaluation/ the CPU peers a GPU run is compared with)."""
    from xmc.workspace import results_dir

    return results_dir(ROOT / "params.yaml")


def pack(dest: Path = CARRY, wheels: bool = True, data_root: Path | None = None, preset: int = 6,
         data_dirs: list[str] | None = None, faiss_gpu: bool = False) -> dict[str, Any]:
    """``.gpu/``: data.tar.xz, minilm/ (float16 weights, int8 used embedding rows, xz), wheels/ (what the GPU
    image lacks). ``data_dirs``: only these of :data:`DATA_DIRS` (a lease that runs some methods; the carry limit).
    ``faiss_gpu``: faiss-gpu (``faiss_gpu.tar.xz``, see :func:`pack_faiss_gpu`) in place of the faiss-cpu wheel."""
    data_dirs = list(data_dirs or DATA_DIRS)
    data_root = data_root or product_root()
    import numpy as np
    import torch
    from safetensors.torch import load_file, save
    from transformers import AutoTokenizer

    from xmc.encoders.transformer import default_model_dir

    dest.mkdir(parents=True, exist_ok=True)
    missing = [d for d in data_dirs if not (data_root / d).is_dir()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: run `dvc repro graph maclr_pseudo_pairs` first")
    with tarfile.open(dest / "data.tar.xz", "w:xz") as tar:
        for d in data_dirs:
            tar.add(data_root / d, arcname=d)
    src = Path(default_model_dir())
    out = dest / "minilm"
    shutil.rmtree(out, ignore_errors=True)
    for f in ST_FILES:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / f, out / f)
    tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    keep = np.array(sorted(used_token_ids(tok, [data_root / d for d in data_dirs])), np.int64)
    state = load_file(str(src / "model.safetensors"))
    emb = state.pop(EMBEDDING)
    rows = emb[torch.from_numpy(keep)]
    scale = (rows.abs().amax(1, keepdim=True) / 127.0).clamp(min=1e-12)
    packed = {k: v.to(torch.float16) for k, v in state.items()}
    packed[EMBEDDING + ".rows"] = torch.from_numpy(keep)
    packed[EMBEDDING + ".int8"] = torch.round(rows / scale).to(torch.int8)
    packed[EMBEDDING + ".scale"] = scale.to(torch.float16)
    blob = save(packed, metadata={"vocab_size": str(emb.shape[0])})
    (out / "weights.safetensors.xz").write_bytes(lzma.compress(blob, preset=preset))
    if wheels:
        wd = dest / "wheels"
        shutil.rmtree(wd, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", "-d", str(wd),
               *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                             "manylinux2014_x86_64") for a in ("--platform", p)], *WHEELS]
        if faiss_gpu:
            cmd = [a for a in cmd if not a.startswith("faiss-cpu")]
        subprocess.run(cmd, check=True)
    (dest / "faiss_gpu.tar.xz").unlink(missing_ok=True)
    if faiss_gpu:
        pack_faiss_gpu(dest / "faiss_gpu.tar.xz")
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    info = {"bytes": size, "embedding_rows_kept": int(len(keep)), "vocab_size": int(emb.shape[0])}
    print(json.dumps(info))
    return info


# faiss-gpu-cu12 1.14.1 has sm_70 / sm_80 code only ("no kernel image is available" on an H200, lease 5); the
# faiss-gpu wheel (1.15) has sm_90
FAISS_GPU = ["faiss-gpu==1.15.1", "nvidia-cuda-runtime-cu12==12.9.79"]
FAISS_GPU_ARCH = 90   # the H200's; the wheel's other architectures are blanked (lab/bench/faiss_gpu/fatbin.py)
SHIM = BENCH / "faiss_gpu"


def pack_faiss_gpu(path: Path) -> None:
    """``path`` (tar.xz): ``site/faiss`` (the faiss-gpu wheel's files) and ``cuda12/`` (the CUDA 12 runtime,
    ``libcublas.so.12`` built from ``lab/bench/faiss_gpu/cublas12_shim.c`` and an empty ``libcublasLt.so.12``).

    The GPU image has CUDA 13 only. PyPI's faiss-gpu wheel is built for CUDA 12 and needs its runtime (0.7 MB,
    carried) and cuBLAS 12 (about 600 MB, past the device tool's 64 MiB carry limit): the shim forwards the eight
    cuBLAS calls faiss makes to the image's cuBLAS 13. The wheel's own OpenBLAS goes too (4.3 MB compressed with its
    Fortran runtime); ``blas_shim.c`` forwards faiss's BLAS/LAPACK calls to the OpenBLAS inside the image's scipy.
    ``libfaiss.so`` keeps only the sm_90 code (199 MB with six architectures; 13 MB compressed with one).
    ``lab/bench/faiss_gpu/env.sh`` sets the machine up."""
    from lab.bench.faiss_gpu.fatbin import keep_only

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "-d", str(t / "whl"),
                        *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                      "manylinux2014_x86_64") for a in ("--platform", p)], *FAISS_GPU], check=True)
        site, libs = t / "site", t / "cuda12"
        libs.mkdir()
        for whl in sorted((t / "whl").glob("*.whl")):
            with zipfile.ZipFile(whl) as z:
                if whl.name.startswith("faiss"):
                    z.extractall(site)
                else:
                    (libs / "libcudart.so.12").write_bytes(z.read("nvidia/cuda_runtime/lib/libcudart.so.12"))
        for f in site.rglob("*.so*"):
            f.chmod(0o755)
        # the marker makes faiss/__init__ preload CUDA 12 from the nvidia-*-cu12 packages; env.sh's
        # LD_LIBRARY_PATH supplies the runtime and the shims instead
        (site / "faiss" / "_gpu_build.py").unlink()
        print(f"libfaiss.so: {sorted(keep_only(site / 'faiss' / 'libfaiss.so', FAISS_GPU_ARCH).items())}")
        # the bundled OpenBLAS (and the gfortran / quadmath only it needs) gives way to lab/bench/faiss_gpu/blas_shim.c
        bundled = site / "faiss_gpu.libs"
        (blas,) = bundled.glob("libopenblas*.so")
        for f in [blas, *bundled.glob("libgfortran*"), *bundled.glob("libquadmath*")]:
            f.unlink()
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(blas), str(SHIM / "blas_shim.c"), "-ldl"],
                       check=True)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(libs / "libcublas.so.12"),
                        "-Wl,-soname,libcublas.so.12", f"-Wl,--version-script={SHIM / 'cublas12.map'}",
                        str(SHIM / "cublas12_shim.c"), "-ldl"], check=True)
        (t / "empty.c").write_text("/* libcublasLt.so.12: needed by name only */\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(libs / "libcublasLt.so.12"),
                        "-Wl,-soname,libcublasLt.so.12", str(t / "empty.c")], check=True)
        tmp_out = path.with_name(path.name + ".tmp")
        with tarfile.open(tmp_out, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:   # the carry limit: 0.5 MB
            tar.add(site, arcname="site")
            tar.add(libs, arcname="cuda12")
        os.replace(tmp_out, path)


def _vocab_size(blob: bytes) -> int:
    """The ``vocab_size`` that ``pack`` wrote in the safetensors header's metadata."""
    n = int.from_bytes(blob[:8], "little")
    return int(json.loads(blob[8 : 8 + n])["__metadata__"]["vocab_size"])


def unpack(carry: Path, work: Path) -> Path:
    """The workspace: ``data/`` unpacked and ``minilm/`` rebuilt with float32 weights; returns the model folder."""
    import torch
    from safetensors.torch import load, save_file

    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(carry / "data.tar.xz") as tar:
        tar.extractall(work, filter="data")
    model = work / "minilm"
    shutil.copytree(carry / "minilm", model, dirs_exist_ok=True, ignore=shutil.ignore_patterns("weights.*"))
    blob = lzma.decompress((carry / "minilm" / "weights.safetensors.xz").read_bytes())
    packed = load(blob)
    vocab = _vocab_size(blob)
    rows, q, scale = (packed.pop(EMBEDDING + s) for s in (".rows", ".int8", ".scale"))
    emb = torch.zeros((vocab, q.shape[1]), dtype=torch.float32)
    emb[rows] = q.float() * scale.float()
    state = {k: v.float() for k, v in packed.items()}
    state[EMBEDDING] = emb
    save_file(state, str(model / "model.safetensors"))
    shutil.copy2(ROOT / "params.yaml", work / "params.yaml")
    return model


# ------------------------------------------------------------------------------------------------
# faiss-check (there): does faiss-gpu work through xmc's index, and what does it buy
# ------------------------------------------------------------------------------------------------
def _clustered(n: int, d: int, seed: int, centres: int = 2000) -> np.ndarray:
    """``n`` unit vectors around ``centres`` random directions (embeddings cluster; uniform noise has no IVF
    structure), float32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d)).astype(np.float32)
    out = np.empty((n, d), np.float32)
    for s in range(0, n, 262144):
        m = min(262144, n - s)
        x = c[rng.integers(0, centres, m)] + 0.7 * rng.standard_normal((m, d)).astype(np.float32)
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _timed_index(vectors: Any, queries: Any, k: int, use_gpu: bool, kind: str = "exact",
                 recall_target: float | None = None, repeats: int = 3) -> tuple[dict[str, Any], Any]:
    """Build an ANNIndex and search ``queries`` (best of ``repeats``); returns timings and the ids."""
    from xmc.ann import ANNIndex

    t0 = time.perf_counter()
    idx = ANNIndex(kind=kind, use_gpu=use_gpu, recall_target=recall_target)
    idx.build(vectors, queries=queries[:1000] if recall_target else None, recall_k=k)
    build = time.perf_counter() - t0
    best, ids = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, ids = idx.search(queries, k)
        best = min(best, time.perf_counter() - t0)
    return {"kind": idx.kind, "on_gpu": idx.on_gpu, "build_s": round(build, 3), "search_s": round(best, 4),
            "queries_per_s": round(len(queries) / best), **({"nprobe": idx.nprobe} if idx.kind == "ivf" else {})}, ids


def _overlap(a: Any, b: Any) -> float:
    """Mean fraction of each row's ids in ``a`` that are in the same row of ``b`` (order ignored)."""
    return float(sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / a.size)


def faiss_check(out: Path, large: int = 1_000_000) -> dict[str, Any]:
    """xmc's ANNIndex on faiss-gpu against the same index on the CPU (all host cores): this data's shapes (25,819
    labels, 14,073 training queries of DEXML's refresh; d 384 MiniLM, 769 ASTRA's classifier rows) exact, and
    ``large`` vectors exact and IVF at recall 0.95. Top-100 overlap with the CPU's exact ids; ``out/faiss_gpu.json``."""
    import faiss

    from xmc.ann import gpu_available

    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"faiss": faiss.__version__, "gpus": faiss.get_num_gpus(), "gpu_available": gpu_available(),
                           "cpu_threads": faiss.omp_get_max_threads(), "cases": []}
    if not res["gpu_available"]:
        (out / "faiss_gpu.json").write_text(json.dumps(res, indent=1))
        raise SystemExit("faiss sees no GPU")
    cases = [("semcor labels, MiniLM", 25819, 384, 14073, "exact", None),
             ("semcor labels, ASTRA classifier rows", 25819, 769, 14073, "exact", None)]
    if large:
        cases += [(f"{large:,} vectors", large, 384, 2000, "exact", None),
                  (f"{large:,} vectors", large, 384, 2000, "ivf", 0.95)]
    truth: dict[tuple[int, int], Any] = {}
    for name, n, d, nq, kind, target in cases:
        t_case = time.perf_counter()
        x = _clustered(n, d, seed=n + d)
        q = _clustered(nq, d, seed=n + d + 1)
        row: dict[str, Any] = {"case": name, "vectors": n, "d": d, "queries": nq, "k": 100}
        gpu, ids_gpu = _timed_index(x, q, 100, True, kind, target)
        if (n, d) not in truth:
            cpu, truth[(n, d)] = _timed_index(x, q, 100, False, "exact", None, repeats=1)
            row["cpu_exact"] = cpu
        row["gpu"] = gpu
        row["overlap_with_cpu_exact"] = round(_overlap(ids_gpu, truth[(n, d)]), 5)
        if not res["cases"]:
            # ASTRA and UniDEC build and search their mining index in a background thread while the GPU trains
            import torch

            box: dict[str, Any] = {}
            th = threading.Thread(target=lambda: box.update(zip(("t", "ids"), _timed_index(x, q, 100, True, kind))))
            a = torch.randn(8192, 8192, device="cuda")
            th.start()
            while th.is_alive():
                a = torch.nn.functional.normalize(a @ a, dim=1)
            torch.cuda.synchronize()
            row["gpu_in_thread_beside_torch"] = {**box["t"], "same_ids": bool((box["ids"] == ids_gpu).all())}
        if "cpu_exact" in row:
            row["search_speedup"] = round(row["cpu_exact"]["search_s"] / gpu["search_s"], 1)
        row["case_s"] = round(time.perf_counter() - t_case, 1)
        res["cases"].append(row)
        print(json.dumps(row), flush=True)
        (out / "faiss_gpu.json").write_text(json.dumps(res, indent=1))
    return res


# ------------------------------------------------------------------------------------------------
# run (there): one child process per method (a crash or a timeout loses that method only)
# ------------------------------------------------------------------------------------------------
def _train_eval(method: str, epochs: int, model_dir: str, eval_: bool, max_steps: int = 0) -> dict[str, Any]:
    """In the workspace (cwd): train ``method``'s run for ``epochs`` epochs; with ``eval_``, package it and predict
    and evaluate val + tst for every prediction of it (``package@`` does that). Returns times, the training summary
    and the metrics."""
    import torch

    from xmc.config import load_params, set_offline_env, setup_logging
    from xmc.methods.harness import train_run
    from xmc.package.build import package_run
    from xmc.workspace import Workspace

    set_offline_env()
    setup_logging("INFO")

    run, paper_epochs, _, variants = PROFILES[method]
    params = load_params("params.yaml")
    spec = profile_run(params, method, epochs, model_dir, max_steps)
    ws = Workspace(Path("."))
    for d in (ws.model(run), ws.checkpoints(run), ws.training_record(run),
              *(f(v) for v in variants for f in (ws.package, ws.predictions))):
        shutil.rmtree(d, ignore_errors=True)
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    summary = train_run(params, spec, ws)
    row: dict[str, Any] = {"method": method, "run": run, "epochs": epochs, "profile_epochs": paper_epochs,
                           "train_wall_s": round(time.perf_counter() - t0, 2), "summary": summary}
    if torch.cuda.is_available():
        row["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if not eval_:
        return row
    t0 = time.perf_counter()
    row["metrics"], row["metrics_val"] = {}, {}
    for v in variants:
        package_run(params, v, ws, model_dir=ws.model(run), splits=("val", "tst"), run_params=spec.config,
                    options={"space": SPACES[v]} if v in SPACES else None)
        shutil.rmtree(ws.package(v), ignore_errors=True)   # only the predictions and metrics come back
        row["metrics"][v] = json.loads(ws.metrics(v, "tst").read_text())
        row["metrics_val"][v] = json.loads(ws.metrics(v, "val").read_text())
    row["predict_s"] = round(time.perf_counter() - t0, 2)   # index, prediction and evaluation of both splits
    return row


def _child(method: str, epochs: int, model_dir: str, eval_: bool, timeout: float, log: Any,
           max_steps: int = 0) -> dict[str, Any]:
    """``_train_eval`` in a child process (its own GPU context), killed at ``timeout`` seconds; its output is
    copied to ``log`` as it comes (progress bars included: read in chunks, not lines)."""
    code = (f"import json, sys; from lab.bench.gpu_profiles import _train_eval; "
            f"r = _train_eval({method!r}, {epochs}, {model_dir!r}, {eval_}, {max_steps}); "
            f"print('XMC_GPU_ROW=' + json.dumps(r, default=str), flush=True)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "true",   # a fresh process: batch tokenization on every core
           "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    fd = p.stdout.fileno()
    os.set_blocking(fd, False)
    buf = bytearray()
    timed_out = False
    while True:
        if time.perf_counter() - t0 > timeout:
            timed_out = True
            os.killpg(p.pid, 9)
            break
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            time.sleep(0.2)
            continue
        if not chunk:
            break
        buf += chunk
        log.write(chunk.decode("utf-8", "replace"))
        log.flush()
    p.wait()
    seconds = round(time.perf_counter() - t0, 1)
    if timed_out:
        return {"method": method, "epochs": epochs, "ok": False, "why": f"timeout after {timeout:.0f} s",
                "seconds": seconds}
    lines = buf.decode("utf-8", "replace").replace("\r", "\n").splitlines()
    rows = [json.loads(x.split("=", 1)[1]) for x in lines if x.startswith("XMC_GPU_ROW=")]
    if p.returncode != 0 or not rows:
        tail = [x.rstrip() for x in lines if x.strip()][-3:]
        return {"method": method, "epochs": epochs, "ok": False, "why": " | ".join(tail)[-600:], "seconds": seconds}
    return {**rows[-1], "ok": True, "seconds": seconds}


def _pack_outputs(out: Path) -> None:
    with tarfile.open(out / "gpu_outputs.tar.gz.tmp", "w:gz") as tar:
        # predictions too (~2 MB a run): a GPU run can then be fused with the label-name retriever here
        for d in ("metrics", "metrics_val", "evaluation", "plots/train", "predictions"):
            if Path(d).exists():
                tar.add(d)
    os.replace(out / "gpu_outputs.tar.gz.tmp", out / "gpu_outputs.tar.gz")


def run(work: Path, out: Path, methods: list[str], budget: float, carry: Path = CARRY, max_steps: int = 0,
        total: float = float("inf"), epochs_fixed: dict[str, int] | None = None) -> dict[str, Any]:
    """Each method: a two-epoch probe, then the most epochs (≤ the profile's) that fit its budget with prediction
    and evaluation: ``budget`` seconds, or with a ``total`` its share of what is left (time a method did not use
    goes to those after it); a method is not started when less than 0.6 x ``budget`` of ``total`` is left.
    A method in ``epochs_fixed`` trains that many epochs with no probe (its epoch cost known from an earlier
    lease), limited by what is left less 0.6 x ``budget`` for each method after it.
    Rows go to ``out/gpu_profiles.json`` (and the metrics files to ``gpu_outputs.tar.gz``) after each."""
    epochs_fixed = epochs_fixed or {}
    import torch

    t_all = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    model_dir = str(unpack(carry, work)) if not (work / "minilm" / "model.safetensors").exists() else str(work / "minilm")
    os.chdir(work)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "cpu_count": os.cpu_count(), "budget_s_per_method": budget,
        "unpack_s": round(time.perf_counter() - t_all, 1), "rows": []}

    def remaining() -> float:
        return total - (time.perf_counter() - t_all)

    with (out / "gpu_profiles.log").open("a") as log:
        for i, method in enumerate(methods):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"method": method}
            # time a method did not use goes to those after it
            budget_i = max(budget, remaining() / (len(methods) - i)) if math.isfinite(total) else budget
            row["budget_s"] = round(budget_i, 1)
            if remaining() < 0.6 * budget:
                row.update(ok=False, why=f"not started: {remaining():.0f} s left")
            elif method in epochs_fixed:
                epochs = int(min(PROFILES[method][1], epochs_fixed[method]))
                limit = remaining() - 5.0 - 0.6 * budget * (len(methods) - i - 1)
                row.update(probe=None, budget_s=round(limit, 1))
                row.update(_child(method, epochs, model_dir, True, limit, log, max_steps))
            else:
                probe = _child(method, PROBE_EPOCHS, model_dir, False, min(0.6 * budget_i, remaining()), log,
                               max_steps)
                row["probe"] = {k: probe.get(k) for k in ("ok", "why", "seconds", "train_wall_s")}
                if probe["ok"]:
                    # the run proper costs about: start-up + fixed (model load, label-text init) + epochs x epoch,
                    # then prediction and evaluation (reserved). The probe's second epoch carries the periodic
                    # work (refreshes, pruning, re-clustering start at epoch 1; a short run's scaled schedule does
                    # it every epoch), its first does not: the 1.3 margin on the mean covers the difference
                    train_s = float(probe["summary"]["train_seconds"])
                    epoch = max(train_s / PROBE_EPOCHS, 1e-3) * 1.3
                    fixed = probe["seconds"] - train_s
                    left = budget_i - (time.perf_counter() - t0) - fixed - EVAL_RESERVE_S
                    epochs = int(max(1, min(PROFILES[method][1], left // epoch)))
                    row["probe"].update(epochs=PROBE_EPOCHS, epoch_s=round(epoch / 1.3, 2), fixed_s=round(fixed, 1))
                    expected = fixed + epochs * epoch + EVAL_RESERVE_S
                    limit = min(remaining() - 5.0, max(budget_i - (time.perf_counter() - t0), 1.5 * expected))
                    row.update(_child(method, epochs, model_dir, True, limit, log, max_steps))
                else:
                    row.update(ok=False, why="probe: " + str(probe.get("why")))
            row["method_s"] = round(time.perf_counter() - t0, 1)
            result["rows"].append(row)
            result["total_s"] = round(time.perf_counter() - t_all, 1)
            (out / "gpu_profiles.json").write_text(json.dumps(result, indent=1, default=str))
            _pack_outputs(out)
            print(f"{method}: {'ok' if row.get('ok') else 'FAILED ' + str(row.get('why'))[-300:]}"
                  f" epochs {row.get('epochs')} in {row['method_s']} s", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.gpu_profiles", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: .gpu/ with the data, MiniLM and wheels to carry")
    p.add_argument("--dest", type=Path, default=CARRY)
    p.add_argument("--no-wheels", action="store_true")
    p.add_argument("--data-root", type=Path, default=None, help="the folder whose data/ is packed (default: results/<data.name>/)")
    p.add_argument("--data-dirs", default=",".join(DATA_DIRS), help="which of the data folders (comma-separated)")
    p.add_argument("--faiss-gpu", action="store_true", help="faiss-gpu-cu12 + a cuBLAS 12 shim, not faiss-cpu")
    r = sub.add_parser("run", help="on the GPU machine")
    r.add_argument("--work", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--carry", type=Path, default=CARRY)
    r.add_argument("--methods", default="astra,dexml,unidec,ramen,maclr")
    r.add_argument("--budget", type=float, default=110.0, help="seconds per method, probe and evaluation included")
    r.add_argument("--max-steps", type=int, default=0, help="cap every epoch at this many steps (a plumbing check)")
    r.add_argument("--total", type=float, default=float("inf"), help="seconds for all methods (a lease's limit)")
    r.add_argument("--epochs", default="", help="METHOD=N,...: train N epochs with no probe (cost known)")
    k = sub.add_parser("faiss-check", help="on the GPU machine: xmc's ANNIndex on faiss-gpu against faiss on the CPU")
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--large", type=int, default=1_000_000, help="vectors of the large case (0: none)")
    c = sub.add_parser("collect", help="here: the files that came back -> lab/bench/gpu/, lab/bench/gpu_profiles.json")
    c.add_argument("dirs", type=Path, nargs="+", help="the folders of the device calls, in order")
    c.add_argument("--peers", default="xr_linear", help="CPU runs to test against (the product's or the lab's)")
    c.add_argument("--fresh", action="store_true",
                   help="drop the earlier leases' rows from lab/bench/gpu_profiles.json")
    f = sub.add_parser("refuse", help="here: collected calls' runs fused again with the label names (current fusion)")
    f.add_argument("dirs", type=Path, nargs="+", help="the folders of device calls already collected")
    f.add_argument("--calls", required=True, help="their call numbers in lab/bench/gpu_profiles.json, comma-separated")
    f.add_argument("--peers", default="xr_linear", help="CPU runs to test against (the product's or the lab's)")
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.dest, wheels=not args.no_wheels, data_root=args.data_root,
             data_dirs=[d for d in args.data_dirs.split(",") if d], faiss_gpu=args.faiss_gpu)
    elif args.cmd == "faiss-check":
        faiss_check(args.out.resolve(), args.large)
    elif args.cmd == "run":
        methods = [m for m in args.methods.split(",") if m]
        unknown = sorted(set(methods) - set(PROFILES))
        if unknown:
            raise SystemExit(f"unknown methods {unknown}; choose from {sorted(PROFILES)}")
        fixed = {m: int(n) for m, n in (x.split("=") for x in args.epochs.split(",") if x)}
        unknown = sorted(set(fixed) - set(methods))
        if unknown:
            raise SystemExit(f"--epochs names methods not in --methods: {unknown}")
        run(args.work.resolve(), args.out.resolve(), methods, args.budget, args.carry.resolve(), args.max_steps,
            args.total, fixed)
    elif args.cmd == "collect":
        collect(args.dirs, tuple(x for x in args.peers.split(",") if x), keep=not args.fresh)
    else:
        refuse(args.dirs, [int(x) for x in args.calls.split(",") if x], tuple(x for x in args.peers.split(",") if x))


def gpu_results() -> Any:
    """Where collected GPU runs' metrics and per-instance files go: ``lab/bench/gpu/`` (``metrics/<v>.json`` test,
    ``metrics_val/<v>.json`` validation, ``evaluation/{tst,val}/<v>.npz``), apart from the CPU runs'."""
    from xmc.workspace import Workspace

    return Workspace(ROOT / "lab" / "bench" / "gpu")


def bench_json() -> Path:
    return ROOT / "lab" / "bench" / "gpu_profiles.json"


def cpu_contributions(name: str, split: str = "tst") -> Path:
    """A CPU run's per-instance file: the product's (``results/<data.name>/evaluation/``) or a lab run's
    (``lab/results/<data.name>/runs/<name>/``)."""
    from xmc.workspace import Workspace

    root = product_root()
    product = Workspace(root).contributions(name, split)
    lab = Workspace(ROOT / "lab" / root.relative_to(ROOT) / "runs" / name).contributions(name, split)
    return product if product.exists() or not lab.exists() else lab


def hybrid_of(variant: str) -> dict[str, Any] | None:
    """The hybrid of ``variant`` in params.yaml ``hybrids`` or lab/params.yaml ``hybrids`` (``<variant>_hybrid``,
    trained or zero-shot fusion), or None."""
    import yaml

    from xmc.package.fuse import SUFFIX

    found: dict[str, Any] = {}
    for path in (ROOT / "params.yaml", ROOT / "lab" / "params.yaml"):
        if path.is_file():
            found.update((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("hybrids") or {})
    entry = found.get(variant + SUFFIX)
    return {"fusion": "trained", **entry} if isinstance(entry, dict) and entry.get("base") == variant else None


def _fuse_with_label_names(call_dir: Path, variant: str, carry: Path | None = None) -> dict[str, Any] | None:
    """A GPU run's predictions that came back (``call_dir/predictions/<variant>``) fused here with the label-name
    retriever as the pipeline's fuse stage does (weights fit on validation, cross-fitted there; ``<variant>_hybrid``)
    and evaluated (:func:`xmc.package.fuse.fuse`), in a workspace holding the carried data. None when the call brought
    no predictions of ``variant`` or neither params file has a hybrid of it. Returns the metrics of both splits and
    the folder of the evaluation files."""
    from xmc.config import load_params
    from xmc.data import load_processed
    from xmc.evaluation import evaluate_and_write
    from xmc.package.fuse import SUFFIX, fuse
    from xmc.workspace import Workspace

    pred = call_dir / "predictions" / variant
    if not all((pred / f"{s}_topk.npz").is_file() for s in ("val", "tst")):
        return None
    entry = hybrid_of(variant)
    if entry is None:
        return None
    params = load_params(ROOT / "params.yaml")
    ws = Workspace(call_dir / "fuse_workspace")   # one per call: the runs of a call share its data
    ws.predictions(variant).parent.mkdir(parents=True, exist_ok=True)
    if not ws.processed.is_dir():
        with tarfile.open((carry or CARRY) / "data.tar.xz") as tar:
            tar.extractall(ws.root, filter=lambda m, dest: tarfile.data_filter(m, dest)
                           if m.name.startswith("data/processed") else None)
    shutil.copytree(pred, ws.predictions(variant), dirs_exist_ok=True)
    # the base's per-instance terms (the hybrid's by-name-match table subsets them): the call's own evaluation
    # (the device evaluated the carried data), else an evaluation here
    brought = {s: call_dir / "evaluation" / s / f"{variant}.npz" for s in ("val", "tst")}
    if all(f.is_file() for f in brought.values()):
        for s, f in brought.items():
            ws.contributions(variant, s).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, ws.contributions(variant, s))
    else:
        evaluate_and_write(ws, variant, load_processed(ws.processed), ("val", "tst"), params)
    hybrid = variant + SUFFIX
    summary = fuse(params, hybrid, [variant], ws, valtuned=entry["fusion"] == "valtuned", splits=("val", "tst"),
                   with_package=False)
    return {"variant": hybrid, "fusion": summary,
            "metrics": json.loads(ws.metrics(hybrid, "tst").read_text()),
            "metrics_val": json.loads(ws.metrics(hybrid, "val").read_text()),
            "evaluation": ws.root / "evaluation"}


def _record(v: str, row: dict[str, Any], device: str, tst: dict[str, Any], val: dict[str, Any], evaluation: Path,
            **extra: Any) -> None:
    """``v``'s metrics (tagged with the run's epochs and device) and per-instance files -> :func:`gpu_results`."""
    out = gpu_results()
    for split, m in (("tst", tst), ("val", val)):
        dest = out.metrics(v, split)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps({**m, "epochs": row["epochs"], "profile_epochs": row["profile_epochs"],
                                    "device": device, **extra}, indent=2) + "\n")
        npz = out.contributions(v, split)
        npz.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(evaluation / split / f"{v}.npz", npz)


def _pair_against(v: str, row: dict[str, Any], mine_npz: Path, versus: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """Paired bootstrap of ``v`` against each peer whose per-instance file is here (same test instances)."""
    from xmc.metrics.bootstrap import InstanceContributions, paired_bootstrap

    mine, out = InstanceContributions.load(mine_npz), []
    for peer, peer_npz in versus:
        if not peer_npz.exists():
            continue
        for metric in ("P@1", "P@5", "PSP@5", "R@100"):
            out.append({"variant": v, "epochs": row["epochs"], "call": row["call"], "peer": peer,
                        **paired_bootstrap(mine, InstanceContributions.load(peer_npz), metric)})
    return out


def _hybrid_of(row: dict[str, Any], v: str, call_dir: Path, device: str,
               peers: tuple[str, ...]) -> tuple[str, list[dict[str, Any]]] | None:
    """The GPU run ``v`` of ``row`` fused with the label names, as the CPU runs' hybrids are: its metrics and
    per-instance files recorded, the fusion noted in ``row["hybrids"]``; returns the hybrid's name and its paired
    tests against the GPU run alone (what the names add) and the CPU ``peers`` (its own CPU hybrid among them)."""
    fused = _fuse_with_label_names(call_dir, v)
    if fused is None:
        return None
    h = fused["variant"]
    row.setdefault("hybrids", {})[h] = {"fusion": fused["fusion"]["fusion"],
                                        "candidates_per_text": fused["fusion"]["candidates_per_text"]}
    _record(h, row, device, fused["metrics"], fused["metrics_val"], fused["evaluation"], base=v)
    versus = [(f"{v} (GPU)", gpu_results().contributions(v, "tst"))]
    versus += [(p, cpu_contributions(p)) for p in dict.fromkeys((*peers, h))]
    return h, _pair_against(h, row, fused["evaluation"] / "tst" / f"{h}.npz", versus)


def _print_pairs(paired: list[dict[str, Any]], against: list[dict[str, Any]]) -> None:
    for x in paired:
        print(f"  {x['variant']} {x['a_epochs']} vs {x['b_epochs']} epochs: {x['metric']} {x['diff']:+.2f} "
              f"{x['ci95']} p={x['p_value']:.3f}")
    for x in against:
        side = "" if x["peer"].endswith("(GPU)") else " (CPU)"
        print(f"  {x['variant']} (GPU, {x['epochs']} epochs) vs {x['peer']}{side}: {x['metric']} {x['a']:.2f} vs "
              f"{x['b']:.2f}, {x['diff']:+.2f} {x['ci95']} p={x['p_value']:.3f}")


def epoch_seconds(log: str) -> list[int]:
    """The seconds of each finished epoch in a run's log, from its progress bars ("epoch 3/75: 100%|...| 28/28
    [00:16<00:00, ...]"); a repeated final bar counts once."""
    out: dict[int, int] = {}
    for m in re.finditer(r"epoch (\d+)/\d+: 100%\|[^|]*\|[^\[]*\[(?:(\d+):)?(\d+):(\d+)<", log):
        h, mi, se = (int(x) if x else 0 for x in m.group(2, 3, 4))
        out[int(m.group(1))] = h * 3600 + mi * 60 + se
    return [out[k] for k in sorted(out)]


def collect(dirs: list[Path], peers: tuple[str, ...] = ("xr_linear",), keep: bool = True) -> dict[str, Any]:
    """The files of one or more device calls (in order) -> ``lab/bench/gpu_profiles.json`` (every row, less its
    metrics, with the call it came from), ``lab/bench/gpu/metrics/<variant>.json`` and ``metrics_val/<variant>.json``
    (per variant, the row that trained most epochs), ``lab/bench/gpu/evaluation/{tst,val}/<variant>.npz``, paired
    bootstrap tests between the calls' runs of one variant (more epochs vs fewer, same test instances), and
    paired tests of each variant collected now against the CPU runs ``peers`` whose per-instance test file is here
    (the product's ``evaluation/tst/<peer>.npz`` after ``make run``, or a lab run's under ``lab/runs/<peer>/``).

    With ``keep``, the calls and rows already in ``lab/bench/gpu_profiles.json`` (earlier leases) stay, the new
    calls are numbered after them, and a variant's metrics files are replaced only by a row of at least as many
    epochs as they record."""
    from xmc.metrics.bootstrap import InstanceContributions, paired_bootstrap

    out_json = bench_json()
    old = json.loads(out_json.read_text()) if keep and out_json.exists() else {}
    calls, rows = list(old.get("calls", [])), list(old.get("rows", []))
    paired, against = list(old.get("paired_more_epochs", [])), list(old.get("paired_against_cpu", []))
    first = len(calls) + 1
    new_rows, best = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for c, d in enumerate(dirs, first):
            part = json.loads((d / "gpu_profiles.json").read_text())
            with tarfile.open(d / "gpu_outputs.tar.gz") as tar:
                tar.extractall(Path(tmp) / str(c), filter="data")
            calls.append({k: v for k, v in part.items() if k != "rows"} | {"call": c})
            log = d / "gpu_profiles.log"
            for row in part["rows"]:
                row["call"] = c
                if not row.get("ok") and log.exists():   # what a run stopped at its limit got through
                    row["epoch_seconds_before_stop"] = epoch_seconds(log.read_text(errors="replace"))
                new_rows.append(row)
                for v in row.get("metrics") or {}:
                    if v not in best or row["epochs"] >= best[v]["epochs"]:
                        best[v] = row

        def npz(row: dict[str, Any], v: str) -> Path:
            return Path(tmp) / str(row["call"]) / "evaluation" / "tst" / f"{v}.npz"

        def device(row: dict[str, Any]) -> str:
            return calls[row["call"] - 1]["device"]

        written: set[str] = set()
        for v, row in best.items():
            kept = gpu_results().metrics(v, "tst")
            if kept.exists() and int(json.loads(kept.read_text()).get("epochs", 0)) > row["epochs"]:
                continue   # an earlier lease trained this variant longer
            written.add(v)
            _record(v, row, device(row), row["metrics"][v], row["metrics_val"][v],
                    Path(tmp) / str(row["call"]) / "evaluation")
            for other in new_rows:   # the same variant from another call, fewer epochs: does training longer help?
                if other is row or v not in (other.get("metrics") or {}) or other["epochs"] >= row["epochs"]:
                    continue
                for metric in ("P@1", "P@5"):
                    paired.append({"variant": v, "a_epochs": row["epochs"], "b_epochs": other["epochs"],
                                   **paired_bootstrap(InstanceContributions.load(npz(row, v)),
                                                      InstanceContributions.load(npz(other, v)), metric)})
            against += _pair_against(v, row, npz(row, v), [(p, cpu_contributions(p)) for p in peers])
        for v, row in best.items():   # the GPU run fused with the label names, as the CPU runs' hybrids are
            if v in written:
                fused = _hybrid_of(row, v, Path(tmp) / str(row["call"]), device(row), peers)
                against += fused[1] if fused else []
    for row in new_rows:
        row.pop("metrics", None)
        row.pop("metrics_val", None)
    result = {"calls": calls, "rows": rows + new_rows, "paired_more_epochs": paired, "paired_against_cpu": against}
    out_json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"{len(new_rows)} rows from {len(dirs)} calls (calls {first}-{len(calls)}) -> lab/bench/gpu_profiles.json, "
          f"lab/bench/gpu/")
    _print_pairs(paired[len(old.get("paired_more_epochs", [])):], against[len(old.get("paired_against_cpu", [])):])
    return result


def _recorded_call(rows: list[dict[str, Any]], method: str) -> int | None:
    """The call whose run of ``method`` ``lab/bench/gpu`` records: collect keeps the run of most epochs, the later
    call among equals (``None``: no run of it completed)."""
    done = [r for r in rows if r.get("method") == method and r.get("ok") and r.get("epochs")]
    if not done:
        return None
    most = max(r["epochs"] for r in done)
    return max(r["call"] for r in done if r["epochs"] == most)


def refuse(dirs: list[Path], calls: list[int], peers: tuple[str, ...] = ("xr_linear",)) -> dict[str, Any]:
    """Calls already collected (``dirs``, numbered ``calls`` in ``lab/bench/gpu_profiles.json``) fused again with the
    label names by the current fusion (params' ``hybrid`` section): when the fusion changes, the GPU runs' hybrids
    follow without a new lease. Only the runs that ``lab/bench/gpu/metrics`` records (``_recorded_call``) are re-fused;
    their hybrid metrics, per-instance files, the rows' fusion notes and their paired tests are replaced; the
    runs' own rows and metrics stay as they are."""
    out_json = bench_json()
    result = json.loads(out_json.read_text())
    if len(dirs) != len(calls):
        raise SystemExit(f"{len(dirs)} folders for {len(calls)} call numbers")
    new_pairs: list[dict[str, Any]] = []
    redone: set[tuple[str, int]] = set()   # (hybrid, call)
    with tempfile.TemporaryDirectory() as tmp:
        for d, c in zip(dirs, calls):
            if not 1 <= c <= len(result["calls"]):
                raise SystemExit(f"{out_json}: no call {c} (it has {len(result['calls'])})")
            part = json.loads((d / "gpu_profiles.json").read_text())
            kept = {(r["method"], r.get("epochs")): r for r in result["rows"] if r.get("call") == c}
            if part.get("device") != result["calls"][c - 1]["device"] or not all(
                    (r["method"], r.get("epochs")) in kept for r in part["rows"]):
                raise SystemExit(f"{d}: its rows are not those of call {c} in {out_json}")
            with tarfile.open(d / "gpu_outputs.tar.gz") as tar:
                tar.extractall(Path(tmp) / str(c), filter="data")
            for r in part["rows"]:
                row = kept[(r["method"], r.get("epochs"))]
                if _recorded_call(result["rows"], r["method"]) != c:
                    continue   # another call's run of this method is the one lab/bench/gpu records
                for v in r.get("metrics") or {}:
                    fused = _hybrid_of(row, v, Path(tmp) / str(c), part["device"], peers)
                    if fused:
                        redone.add((fused[0], c))
                        new_pairs += fused[1]
    result["paired_against_cpu"] = [x for x in result["paired_against_cpu"]
                                    if (x["variant"], x["call"]) not in redone] + new_pairs
    out_json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"re-fused {sorted(h for h, _ in redone)} from calls {calls} -> lab/bench/gpu_profiles.json, lab/bench/gpu/")
    _print_pairs([], new_pairs)
    return result


if __name__ == "__main__":
    main()
