"""The method interface and the one run harness.

Every method (the papers' five, their ablation runs, the peers) implements :class:`Method` once:

* ``train(ctx, data)`` writes the trained model into ``ctx.model_dir`` and returns its training summary;
  methods trained by the shared :class:`~xmc.train.Trainer` derive from :class:`TrainerMethod` and only say
  how to *build* their parts (model, sampler, objective, how to save);
* ``prediction_variants`` / ``predictor_source`` / ``predictor_kind`` say what the prediction stage builds
  a predictor (:mod:`xmc.package.predictors`) from, which is also what the model package holds.

:func:`train_run` and :func:`predict_run` are the harness the two uniform stages call
(``stages.train <run>``, ``stages.predict <run> [val] [tst]``): seed → build → train → curves → save →
summary, and build predictor → search each split → top-k files, the same for every method.
"""

from __future__ import annotations

import json
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from xmc.methods.runs import RunSpec, find_run

log = logging.getLogger(__name__)

SUMMARY = "train_summary.json"
PREDICTOR_SECTION = "predictor.json"   # the predictor's manifest section, next to its files in indexes/<name>/


def set_threads() -> None:
    """Use every core the machine (or ``XMC_THREADS``) gives this process: its share, under data parallelism.

    Sets torch's threads now if torch is loaded, else when it loads: a stage that never needs torch (the
    baselines, name matching) does not pay the ~2 s of importing it just to set a thread count. Idle OpenMP
    workers spin briefly before they sleep (:func:`short_openmp_spin`), so they leave the cores to the work."""
    import sys

    short_openmp_spin()
    world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    n = max(1, int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)) // world)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _ThreadsWhenTorchLoads):
            finder.threads = n
            return
    sys.meta_path.insert(0, _ThreadsWhenTorchLoads(n))


# Busy-wait iterations of an idle OpenMP worker before it sleeps. libgomp's default, 300,000 (several ms), keeps
# torch's idle workers (and faiss's: it ships its own libgomp) spinning between a step's operations, on the cores
# that the C kernels' threads (xmc/native) and the other library's pool then need: on 2 cores a bag-of-words step's
# RowAdam update took twice as long (bench/openmp_spin.py times the training loops with either setting).
OPENMP_SPIN_COUNT = 20000


def short_openmp_spin() -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`OPENMP_SPIN_COUNT` for the OpenMP runtimes this process loads from now on
    (libgomp reads it when it loads: torch's, faiss's, scikit-learn's), and for its child processes. A setting of
    the user's (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` in the environment) is kept. True when it was set here."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
    return True


class _ThreadsWhenTorchLoads:
    """An import hook (``sys.meta_path``) that calls ``torch.set_num_threads`` right after torch is imported,
    then removes itself. It finds torch with the other finders and only wraps the loader's ``exec_module``."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        import importlib.util
        import sys

        if name != "torch":
            return None
        sys.meta_path.remove(self)   # one shot, and no recursion in the lookup below
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenSetThreads(spec.loader, self.threads)
        return spec


class _ThenSetThreads:
    def __init__(self, loader: Any, threads: int) -> None:
        self.loader, self.threads = loader, threads

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        module.set_num_threads(self.threads)

    def __getattr__(self, name: str) -> Any:   # anything else a loader offers (get_resource_reader, is_package...)
        return getattr(self.loader, name)


def ranks_of(run: RunSpec) -> int:
    """The data-parallel ranks a run asks for: ``train.nproc_per_node``, or for MACLR's two stages their
    ``stage1.train`` / ``stage2.train`` (one world for the whole run: they must agree); no ``train`` section: 1."""
    from xmc.errors import ConfigError

    found = {}
    for where in ("", "stage1", "stage2"):
        section = run.config.get(where) if where else run.config
        train = section.get("train") if isinstance(section, dict) else None
        if isinstance(train, dict) and "nproc_per_node" in train:
            found[f"{where}.train" if where else "train"] = int(train["nproc_per_node"])
    if len(set(found.values())) > 1:
        raise ConfigError(f"run {run.name!r}: " + ", ".join(f"{k}.nproc_per_node {v}" for k, v in found.items())
                          + " differ: one run trains in one set of ranks")
    return next(iter(found.values()), 1)


@dataclass
class RunContext:
    """Where one run reads its settings and writes its outputs."""

    params: dict[str, Any]   # the whole validated params.yaml (evaluation, index and data settings)
    run: RunSpec
    model_dir: Path          # the (temporary) folder the trained model is written to
    work_dir: Path           # resumable checkpoints (checkpoints/<run>/)
    plots_dir: Path          # the live training record (plots/train/<run>/, DVCLive)
    live: Any = None         # its :class:`~xmc.train.live.TrainingLog`, shared by the run's trainers

    @property
    def config(self) -> dict[str, Any]:
        return self.run.config


class Method(ABC):
    """One way of training a retriever and predicting with it."""

    name: ClassVar[str]
    #: processed splits training reads (``()``: the method reads its own inputs, e.g. MACLR's pseudo pairs)
    train_splits: ClassVar[tuple[str, ...]] = ("trn", "val")
    #: the :mod:`xmc.package.predictors` kind that predicts with a trained model of this method
    predictor_kind: ClassVar[str] = "dense"
    #: False for the peers whose "training" is another stage's output (the TF-IDF features)
    trainable: ClassVar[bool] = True

    @abstractmethod
    def train(self, ctx: RunContext, data: Any) -> dict[str, Any]:
        """Train on ``data`` (the splits in :attr:`train_splits`), write the model into ``ctx.model_dir``
        and return the training summary (``train_seconds`` at least)."""

    def prediction_variants(self, run: RunSpec) -> dict[str, dict[str, Any]]:
        """Prediction name -> predictor options; one per run, except where one model serves several spaces."""
        return {run.name: {}}

    def predictor_source(self, run: RunSpec, params: dict[str, Any]) -> Path:
        """What the predictor is built from: the trained model folder."""
        return Path("models") / run.name

    def train_seconds(self, run: RunSpec, params: dict[str, Any]) -> float:
        path = self.predictor_source(run, params) / SUMMARY
        return float(json.loads(path.read_text())["train_seconds"]) if path.is_file() else 0.0


@dataclass
class TrainingParts:
    """What a :class:`TrainerMethod` builds for the one trainer."""

    model: Any
    sampler: Any
    objective: Any
    fingerprint: dict[str, Any]                     # settings that make a checkpoint resumable by this run
    save: Callable[[Path], None]                    # write the trained model into a folder
    after_fit: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda history: {})  # -> summary fields


class TrainerMethod(Method):
    """A method trained by the shared :class:`~xmc.train.Trainer`: it only builds its parts."""

    @abstractmethod
    def build(self, ctx: RunContext, ds: Any) -> TrainingParts:
        """Model, sampler, objective and how to save, for the run's settings on ``ds``."""

    def train(self, ctx: RunContext, ds: Any) -> dict[str, Any]:
        import torch

        from xmc.train import RetrievalEvaluator, Trainer, TrainConfig

        cfg = ctx.config
        torch.manual_seed(int(cfg["train"]["seed"]))
        parts = self.build(ctx, ds)
        evaluator, every = RetrievalEvaluator.monitoring(ds, cfg["train"], ctx.params["evaluate"])
        trainer = Trainer(parts.model, parts.sampler, parts.objective, TrainConfig.from_params(cfg["train"]),
                          ds.trn.texts, ctx.work_dir, evaluator=evaluator, eval_every_epochs=every,
                          fingerprint_extra=parts.fingerprint, live=ctx.live)
        t0 = time.perf_counter()
        result = trainer.fit()
        extra = parts.after_fit(result["history"])
        wall = time.perf_counter() - t0
        parts.save(ctx.model_dir)
        hist = result["history"]
        return {
            "train_seconds": round(sum(e["seconds"] for e in hist["epochs"]), 2),  # epochs include ANN refreshes
            "wall_seconds_this_run": round(wall, 2),
            "epochs": len(hist["epochs"]),
            "steps": trainer.global_step,
            "final_loss": hist["loss"][-1]["loss"] if hist["loss"] else None,
            "refresh_seconds": [round(s, 2) for s in getattr(parts.sampler, "refresh_seconds", [])],
            "refreshed_at_epochs": list(getattr(parts.sampler, "refreshed_at", [])),
            "mined_queries": list(getattr(parts.sampler, "mined_rows", [])),   # per refresh: the queries it mined
            **extra,   # a method's own fields (and its own refresh record, where its sampler wraps another)
            "device": str(trainer.device),
            "last_validation": hist["val"][-1] if hist["val"] else None,
        }


# ------------------------------------------------------------------------------------------------
# the harness of the two uniform stages
# ------------------------------------------------------------------------------------------------
def load_method(params: dict[str, Any], name: str) -> tuple[RunSpec, Method]:
    from xmc.methods import get_method

    run = find_run(params, name)
    return run, get_method(run.method)


def train_run(params: dict[str, Any], name: str, root: str | Path = ".") -> dict[str, Any]:
    """Train the run ``name`` -> ``models/<name>/`` (atomically, with ``train_summary.json``)."""
    from xmc.data import load_processed
    from xmc.errors import ConfigError
    from xmc.io import atomic_dir

    run, method = load_method(params, name)
    if not method.trainable:
        raise ConfigError(f"{name}: the {run.method} peer has no training stage (it predicts from "
                          f"{method.predictor_source(run, params)})")
    root = Path(root)
    set_threads()
    from xmc.train.distributed import init_from_env

    dist_ctx = init_from_env()
    data = load_processed(root / params["data"]["processed_dir"], splits=method.train_splits) \
        if method.train_splits else None
    if not dist_ctx.is_main:
        # another rank of a data-parallel run: it trains in step with rank 0, which alone writes the outputs
        import tempfile

        with tempfile.TemporaryDirectory(prefix=f"xmc-rank{dist_ctx.rank}-") as scratch:
            ctx = RunContext(params, run, Path(scratch), root / "checkpoints" / name, Path(scratch) / "plots", None)
            return {"run": name, "method": run.method, **method.train(ctx, data)}
    from xmc.train.live import TrainingLog

    live = TrainingLog(root / "plots" / "train" / name)
    with atomic_dir(root / "models" / name) as tmp:
        ctx = RunContext(params, run, tmp, root / "checkpoints" / name, root / "plots" / "train" / name, live)
        try:
            summary = {"run": name, "method": run.method, **method.train(ctx, data)}
        finally:
            live.close()
        from xmc.machine import describe_machine

        summary["machine"] = describe_machine()   # train_seconds compare only on the same hardware (xmc.machine)
        (tmp / SUMMARY).write_text(json.dumps(summary, indent=2, default=str))
        if (tmp / "README.md").is_file():   # a sentence-transformers folder: its generic card gives way to ours
            from xmc.package.card import encoder_card

            (tmp / "README.md").write_text(encoder_card(name, run.method, run.config, summary,
                                                        params["data"]["dataset_dir"]), encoding="utf-8")
    log.info("trained %s (%s) in %.1f s", name, run.method, summary.get("train_seconds", 0.0))
    from xmc.train.memory import release_freed_memory

    release_freed_memory()   # the run's tables are freed now; the trainer's malloc settings would keep them resident
    return summary


def predictor_options(params: dict[str, Any], ds: Any, variant: dict[str, Any]) -> dict[str, Any]:
    """Everything a predictor may need when it is built; each kind reads its own keys."""
    import numpy as np
    import scipy.sparse as sp

    from xmc.config.schema import IndexConfig, filled

    # training queries (never validation or test) on which an approximate index calibrates its search width
    texts = ds.trn.texts
    m = min(filled(IndexConfig, params.get("index"), "index")["calibration_sample"], len(texts))
    sample = [texts[i] for i in np.sort(np.random.default_rng(0).choice(len(texts), m, replace=False))] if m else []
    return {"index": params["index"], "tfidf_knn": params["tfidf_knn"], "tfidf_zeroshot": params.get("tfidf_zeroshot"),
            "train_labels": sp.csr_matrix(ds.trn.Y), "calibration_texts": sample, **variant}


def _shortlist_mode(params: dict[str, Any], kind: str, n_labels: int) -> str | None:
    """``index.shortlist`` where it applies: a dense or UniDEC predictor over more labels than an exact index holds
    (``auto_exact_max``, or an approximate ``index.kind``); None otherwise."""
    from xmc.ann import ANNIndex
    from xmc.config.schema import IndexConfig, filled
    from xmc.errors import ConfigError

    icfg = filled(IndexConfig, params.get("index"), "index")
    mode = icfg["shortlist"]
    if mode == "off" or kind not in ("dense", "unidec") or ANNIndex.from_params(params.get("index")).kind_for(n_labels) == "exact":
        return None
    if _shortlist_ks(icfg)[0] < int(params["evaluate"]["top_k"]):
        raise ConfigError(f"params.yaml: index.shortlist_k ({icfg['shortlist_k']}) is below evaluate.top_k "
                          f"({params['evaluate']['top_k']}): every text would be searched over every label")
    return mode


def _predict_texts(predictor: Any, texts: list[str], k: int, chunk: int) -> tuple[Any, Any]:
    import numpy as np

    parts = [predictor.search(texts[i : i + chunk], k) for i in range(0, len(texts), chunk)]
    D = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, k), np.float32)
    I = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, k), np.int64)
    return D, I


def _shortlist_ks(icfg: dict[str, Any]) -> list[int]:
    """``index.shortlist_k`` as the sorted candidate sizes (one int, or a list the validation split chooses from)."""
    ks = icfg["shortlist_k"]
    return sorted({int(x) for x in (ks if isinstance(ks, list) else [ks])})


def _build_shortlist_or_index(cls: Any, source: Path, out: Path, ds: Any, options: dict[str, Any],
                              params: dict[str, Any], mode: str, k: int, root: Path, chunk: int,
                              has_val: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], Any]:
    """Build into ``out`` either a :class:`~xmc.package.predictors.ShortlistPredictor` over the run's predictor
    with an exact index, or (where validation rejects the shortlist) the run's predictor with the index that
    ``index`` asks for. Both choices are made on the validation split only, by ``selection.metric`` with a
    paired bootstrap at ``selection.alpha``:

    * the shortlist size: the smallest of ``index.shortlist_k`` unless a larger one is significantly better
      (each larger size against the best so far; a smaller shortlist is cheaper);
    * shortlist or index: the shortlist is kept unless it is significantly below exact search over every label
      on a fixed random sample of ``index.shortlist_decision_texts`` validation texts. Ties go to the shortlist,
      whose cost per text does not grow with the labels; exact search is O(labels) per text, hence the sample.

    Returns (section, the choices' record, {split: (scores, ids, seconds)} predictions already made, the kept
    shortlist predictor as loaded for the choice or None). Its files are read into memory, so it stays valid
    when ``out`` is renamed."""
    import shutil

    import numpy as np
    import torch

    from xmc.ann.index import recall_of
    from xmc.config.schema import IndexConfig, filled
    from xmc.metrics.bootstrap import bootstrap_settings, instance_contributions, paired_bootstrap, verdict
    from xmc.package.predictors import ShortlistPredictor
    from xmc.predictions import TopK

    icfg = filled(IndexConfig, params.get("index"), "index")
    ks = _shortlist_ks(icfg)
    exact_dir = out / "exact"
    base = cls.build(source, exact_dir, ds.label_texts, {**options, "index": {**icfg, "kind": "exact", "storage": "float32"}})
    (exact_dir / PREDICTOR_SECTION).write_text(json.dumps(base, indent=2) + "\n")
    section = ShortlistPredictor.build(exact_dir, out, ds.label_texts, {
        "tfidf_dir": root / "data" / "tfidf", "shortlist_k": ks[0],
        "max_postings_per_term": icfg["shortlist_max_postings_per_term"]})
    shutil.rmtree(exact_dir)
    record: dict[str, Any] = {"mode": mode, "shortlist_k": ks[0], "shortlist_k_candidates": ks,
                              "max_postings_per_term": icfg["shortlist_max_postings_per_term"]}
    done: dict[str, Any] = {}
    keep = mode == "tfidf"
    shortlist = None
    if mode == "auto" and not has_val:
        record["why"] = "no validation split predicted: nothing to decide on, the index is built"
    elif mode == "auto":
        shortlist = ShortlistPredictor.load(out, section, ds.label_texts)
        texts = ds.val.texts
        metric = params.get("selection", {}).get("metric", "P@5")
        alpha = float(params.get("selection", {}).get("alpha", 0.05))
        bs = bootstrap_settings(params)
        freq = np.asarray(ds.trn.Y.sum(axis=0)).ravel()

        Y_val = ds.val.Y.tocsr()

        def contributions(D: np.ndarray, I: np.ndarray, rows: Any = slice(None)) -> Any:
            return instance_contributions(TopK(I.astype(np.int32), D.astype(np.float32)), Y_val[rows], freq,
                                          ds.trn.Y.shape[0], recall_ks=(min(10, k), min(100, k)))

        def paired(a: Any, b: Any, names: tuple[str, str]) -> dict[str, Any]:
            test = paired_bootstrap(a, b, metric, bs["n_resamples"], bs["seed"], bs["level"])
            test["verdict"] = verdict(test["p_value"], test["diff"], alpha).replace(
                "A ", f"{names[0]} ").replace("B ", f"{names[1]} ")
            return test

        def shown(c: Any) -> dict[str, float]:
            return {m: round(v, 2) for m, v in c.values().items()}

        # every size from one candidate list: the shortlist of size K is the first K of the largest (TF-IDF order)
        t0 = time.perf_counter()
        cand, q = [], []
        for i in range(0, len(texts), chunk):
            cand.append(shortlist.shortlist.candidates(texts[i : i + chunk], ks[-1]))
            with torch.inference_mode():
                q.append(shortlist.query_vectors(texts[i : i + chunk]))
        C, Q = np.concatenate(cand), np.concatenate(q)
        shared_s = time.perf_counter() - t0
        by_k: dict[int, Any] = {}
        sizes: dict[str, Any] = {}
        for K in ks:
            shortlist.full_searches = 0
            t0 = time.perf_counter()
            D, I = shortlist.rank(Q, C[:, :K], k)
            secs = shared_s + time.perf_counter() - t0
            by_k[K] = (D, I, secs, contributions(D, I))
            sizes[str(K)] = {"val_metrics": shown(by_k[K][3]), "seconds_per_1000": round(1000 * secs / max(len(texts), 1), 3),
                             "full_searches": shortlist.full_searches}
        best = ks[0]
        for K in ks[1:]:
            test = paired(by_k[K][3], by_k[best][3], (f"k{K}", f"k{best}"))
            sizes[str(K)][f"test_against_k{best}"] = test
            if test["verdict"] == f"k{K} better":
                best = K
        shortlist.shortlist.shortlist_k = best
        section = {**section, "shortlist_k": best}
        D_s, I_s, t_s, _ = by_k[best]
        m = min(int(icfg["shortlist_decision_texts"]), len(texts))
        rows = np.sort(np.random.default_rng(0).choice(len(texts), m, replace=False))   # a fixed random sample
        t0 = time.perf_counter()
        D_e, I_e = _predict_texts(shortlist.base, [texts[i] for i in rows], k, chunk)
        t_e = time.perf_counter() - t0
        c_s, c_e = contributions(D_s[rows], I_s[rows], rows), contributions(D_e, I_e, rows)
        test = paired(c_s, c_e, ("shortlist", "exact"))
        keep = test["verdict"] != "exact better"
        kk = min(100, k)
        record.update({
            "decided_on": "val", "texts": len(texts), "shortlist_k": best, "sizes": sizes,
            "exact_texts": m, "test": test,
            "val_metrics_on_exact_texts": {"shortlist": shown(c_s), "exact": shown(c_e)},
            "seconds_per_1000": {"shortlist": round(1000 * t_s / max(len(texts), 1), 3),
                                 "exact": round(1000 * t_e / max(m, 1), 3)},
            "recall_at": kk, "recall_against_exact": round(recall_of(I_s[rows, :kk], I_e[:, :kk]), 4),
            "full_searches": {"val": sizes[str(best)]["full_searches"]}})
        log.info("shortlist of %d (of %s) by TF-IDF, re-ranked, against exact search on %d validation texts: %s "
                 "%.2f vs %.2f (diff %+.2f %s, p %.3g) -> %s", best, ks, m, metric, test["a"], test["b"],
                 test["diff"], test["ci95"], test["p_value"], "shortlist" if keep else "index")
        if keep:
            done["val"] = (D_s, I_s, t_s)
    record["kept"] = bool(keep)
    if not keep:
        for child in ("base", "tfidf"):
            shutil.rmtree(out / child)
        section = cls.build(source, out, ds.label_texts, options)
        shortlist = None
    return section, record, done, shortlist


def predict_run(params: dict[str, Any], name: str, splits: tuple[str, ...], root: str | Path = ".",
                chunk: int = 8192, all_variants: bool = True) -> dict[str, dict[str, Any]]:
    """Build the run's predictor(s) into ``indexes/<variant>/`` and write ``predictions/<variant>/<split>_topk.npz``
    (+ ``timing.json``) for each split, through the same :class:`~xmc.package.predictors.Predictor` that the
    model package loads: what the pipeline evaluates is what ``xmc predict`` serves. ``all_variants=False``: only
    the prediction named as the run (UniDEC: its main space, without the DE-only and classifier-only ones).
    Above ``index.auto_exact_max`` a dense run may rank a TF-IDF shortlist instead (``index.shortlist``)."""
    import numpy as np

    from xmc.data import load_processed
    from xmc.io import atomic_dir, write_json
    from xmc.package.predictors import predictor_class
    from xmc.predictions import TopK

    run, method = load_method(params, name)
    root = Path(root)
    set_threads()
    ds = load_processed(root / params["data"]["processed_dir"], splits=("trn", *splits))
    k = int(params["evaluate"]["top_k"])
    source = root / method.predictor_source(run, params)
    cls = predictor_class(method.predictor_kind, source)
    shortlist_mode = _shortlist_mode(params, method.predictor_kind, len(ds.label_texts))
    timings = {}
    variants = method.prediction_variants(run)
    if not all_variants:
        variants = {run.name: variants[run.name]}
    for variant, options in variants.items():
        t0 = time.perf_counter()
        shortlist: dict[str, Any] = {}
        done: dict[str, Any] = {}
        predictor = None
        with atomic_dir(root / "indexes" / variant) as tmp:
            opts = predictor_options(params, ds, options)
            if shortlist_mode:
                section, shortlist, done, predictor = _build_shortlist_or_index(
                    cls, source, tmp, ds, opts, params, shortlist_mode, k, root, chunk, "val" in splits)
            else:
                section = cls.build(source, tmp, ds.label_texts, opts)
            (tmp / PREDICTOR_SECTION).write_text(json.dumps(section, indent=2) + "\n")
        index_seconds = time.perf_counter() - t0
        if predictor is None:   # (a shortlist chosen on validation is used as loaded for the choice)
            predictor = predictor_class(section["kind"], source).load(root / "indexes" / variant, section, ds.label_texts)
        is_shortlist = section["kind"] == "shortlist"
        by_split: dict[str, float] = {}
        index_recall: dict[str, Any] = {}
        if is_shortlist and "recall_against_exact" in shortlist:
            index_recall = {"index_recall_at": shortlist["recall_at"], "index_recall_queries": shortlist["exact_texts"],
                            "index_recall": shortlist["recall_against_exact"], "index_recall_split": "val"}
        for split in splits:
            t0 = time.perf_counter()
            texts = ds.split(split).texts
            if split in done:   # predicted while the shortlist was chosen
                D, I, seconds = done[split]
            else:
                if is_shortlist:
                    predictor.full_searches = 0
                D, I = _predict_texts(predictor, texts, k, chunk)
                seconds = time.perf_counter() - t0
                if is_shortlist:
                    shortlist.setdefault("full_searches", {})[split] = predictor.full_searches
            TopK(I.astype(np.int32), D.astype(np.float32)).save(root / "predictions" / variant / f"{split}_topk.npz")
            by_split[split] = round(seconds, 2)
            index = getattr(predictor, "index", None)
            if not index_recall and index is not None and (index.kind != "exact" or is_shortlist) \
                    and hasattr(predictor, "query_vectors"):
                # an approximate index (index.kind, or auto above auto_exact_max) or a shortlist: its recall against
                # exact search
                m, kk = min(1000, len(texts)), min(100, k)
                index_recall = {"index_recall_at": kk, "index_recall_queries": m, "index_recall": round(
                    index.recall_against_exact(predictor.query_vectors(texts[:m]), I[:m], kk), 4)}
                log.info("%s: %s recall@%d against exact search %.4f (%d %s queries)", variant,
                         "shortlist" if is_shortlist else f"{index.kind} index", kk, index_recall["index_recall"], m, split)
        timing = {"train_seconds": method.train_seconds(run, params), "index_seconds": round(index_seconds, 2),
                  "predict_seconds": by_split.get("tst", by_split.get("val")), "predict_seconds_by_split": by_split,
                  "predictor": section["kind"], **{k_: v for k_, v in options.items()},
                  **({"index_kind": "tfidf_shortlist" if is_shortlist else predictor.index.kind,
                      "on_gpu": predictor.index.on_gpu} if hasattr(predictor, "index") else {}), **index_recall,
                  **({"shortlist": shortlist} if shortlist else {}),
                  **({"index_calibration": predictor.index.calibration}
                     if not is_shortlist and getattr(getattr(predictor, "index", None), "calibration", None) else {})}
        write_json(root / "predictions" / variant / "timing.json", timing)
        timings[variant] = timing
        log.info("predicted %s on %s (%s)", variant, " ".join(splits), section["kind"])
    return timings


def find_prediction(params: dict[str, Any], name: str) -> tuple[RunSpec, Method, dict[str, Any]]:
    """The run, method and predictor options behind a prediction name (a run, or one of its variants)."""
    from xmc.errors import ConfigError
    from xmc.methods.runs import all_runs

    from xmc.lexical.fuse import SUFFIX, ZERO_SHOT_SUFFIX, hybrid_base

    for suffix, runs in ((ZERO_SHOT_SUFFIX, params["hybrid"]["zero_shot_runs"]), (SUFFIX, params["hybrid"]["runs"])):
        if name.endswith(suffix) and name[: -len(suffix)] in runs:
            stem = name[: -len(suffix)]
            # a hybrid is the run it fuses (its base), with the fusion's options
            run, method, options = find_prediction(params, stem if suffix == ZERO_SHOT_SUFFIX else hybrid_base(params, stem))
            return run, method, {**options, "hybrid": {**params["hybrid"], "label_names": params["label_names"],
                                                       "zero_shot": suffix == ZERO_SHOT_SUFFIX}}
    for run_name in all_runs(params):
        if not name.startswith(run_name):
            continue
        run, method = load_method(params, run_name)
        variants = method.prediction_variants(run)
        if name in variants:
            return run, method, variants[name]
    raise ConfigError(f"params.yaml: {name!r} is not a run or a prediction of one")
