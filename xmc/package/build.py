"""From a trained model folder to its model package, with its predictions and metrics: what the pipeline's
``package@<run>`` stage and ``xmc train`` do after training.

1. the predictor (:mod:`xmc.package.predictors`) is built straight into the package folder: the encoder or model
   files as hard links of the trained model's (one copy on disk), the label index over its label vectors;
2. it predicts the validation and test splits (``predictions/<name>/``) — what the package serves is what is
   evaluated;
3. the predictions are scored (:mod:`xmc.evaluation`): ``metrics_val/``, ``metrics/``, ``evaluation/``;
4. the manifest (method, settings, data and label-set hashes, code version, both splits' metrics, every file's
   hash) and the model card complete the package, which appears atomically.

Above ``index.auto_exact_max`` labels a dense model may rank a TF-IDF shortlist instead of an approximate index,
chosen on the validation split (:func:`_shortlist_or_index`). Nothing here imports training code: the model
folder's ``model.json`` says which predictor serves it.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from xmc.ann import ANNIndex
from xmc.ann.index import recall_of
from xmc.config.schema import IndexConfig, filled
from xmc.data import load_processed
from xmc.data.dataset import XMCDataset
from xmc.errors import ConfigError, DataFormatError
from xmc.evaluation import evaluate_split, write_evaluation
from xmc.io import atomic_dir, read_json_file, sha256_files, write_json
from xmc.metrics.bootstrap import (bootstrap_settings, document_codes, instance_contributions, paired_bootstrap,
                                   verdict)
from xmc.cards import dataset_licence, training_record
from xmc.package.package import finish_package
from xmc.package.predictor import Predictor, predictor_class
from xmc.predictions import TopK
from xmc.workspace import Workspace

log = logging.getLogger(__name__)

MODEL_INFO = "model.json"        # written by the training harness: {"run", "method", "predictor"}
SUMMARY = "train_summary.json"
DATA_FILES = ("trn.jsonl", "trn_Y.npz", "val.jsonl", "val_Y.npz", "lbl.jsonl")
PREDICTED_SPLITS = ("val", "tst")


def model_info(model_dir: Path) -> dict[str, Any]:
    """``model.json`` of a trained model folder: its run, method and the predictor kind that serves it."""
    path = model_dir / MODEL_INFO
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: trained model folder not found (train the run first)")
    info = read_json_file(path, "a trained model's description")
    if not isinstance(info, dict) or not isinstance(info.get("predictor"), str) or not isinstance(info.get("method"), str):
        raise DataFormatError(path, None, "expected {\"run\", \"method\", \"predictor\"}")
    return info


def training_summary(model_dir: Path) -> dict[str, Any]:
    path = model_dir / SUMMARY
    return read_json_file(path, "a training summary") if path.is_file() else {}


def predictor_options(params: dict[str, Any], ds: XMCDataset, config: dict[str, Any]) -> dict[str, Any]:
    """Everything a predictor's ``build`` may read: the index settings, the training queries an approximate index
    calibrates its search width on (never validation or test), and the run's own settings."""
    texts = ds.trn.texts
    m = min(filled(IndexConfig, params.get("index"), "index")["calibration_sample"], len(texts))
    sample = [texts[i] for i in np.sort(np.random.default_rng(0).choice(len(texts), m, replace=False))] if m else []
    return {"index": params["index"], "calibration_texts": sample, "config": config}


def _shortlist_mode(params: dict[str, Any], kind: str, n_labels: int) -> str | None:
    """``index.shortlist`` where it applies: a dense or UniDEC predictor over more labels than an exact index holds
    (``auto_exact_max``, or an approximate ``index.kind``); None otherwise."""
    icfg = filled(IndexConfig, params.get("index"), "index")
    mode = icfg["shortlist"]
    if mode == "off" or kind not in ("dense", "unidec") or ANNIndex.from_params(params.get("index")).kind_for(n_labels) == "exact":
        return None
    if _shortlist_ks(icfg)[0] < int(params["evaluate"]["top_k"]):
        raise ConfigError(f"params.yaml: index.shortlist_k ({icfg['shortlist_k']}) is below evaluate.top_k "
                          f"({params['evaluate']['top_k']}): every text would be searched over every label")
    return mode


def _shortlist_ks(icfg: dict[str, Any]) -> list[int]:
    """``index.shortlist_k`` as the sorted candidate sizes (one int, or a list the validation split chooses from)."""
    ks = icfg["shortlist_k"]
    return sorted({int(x) for x in (ks if isinstance(ks, list) else [ks])})


def predict_texts(predictor: Predictor, texts: Any, k: int, chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(scores, label ids) of every text, ``chunk`` texts at a time."""
    parts = [predictor.search(list(texts[i : i + chunk]), k) for i in range(0, len(texts), chunk)]
    D = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, k), np.float32)
    I = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, k), np.int64)
    return D, I


def _shortlist_or_index(cls: type[Predictor], source: Path, out: Path, ds: XMCDataset, options: dict[str, Any],
                        params: dict[str, Any], mode: str, k: int, tfidf_dir: Path, chunk: int,
                        has_val: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], Any]:
    """Build into ``out`` either a :class:`~xmc.package.shortlist_predictor.ShortlistPredictor` over the run's predictor
    with an exact index, or (where validation rejects the shortlist) the run's predictor with the index that
    ``index`` asks for. Both choices are made on the validation split only, by P@5 with a paired bootstrap at
    alpha 0.05:

    * the shortlist size: the smallest of ``index.shortlist_k`` unless a larger one is significantly better
      (each larger size against the best so far; a smaller shortlist is cheaper);
    * shortlist or index: the shortlist is kept unless it is significantly below exact search over every label
      on a fixed random sample of ``index.shortlist_decision_texts`` validation texts. Ties go to the shortlist,
      whose cost per text does not grow with the labels; exact search is O(labels) per text, hence the sample.

    Returns (section, the choices' record, {split: (scores, ids, seconds)} predictions already made, the kept
    shortlist predictor as loaded for the choice or None)."""
    icfg = filled(IndexConfig, params.get("index"), "index")
    ks = _shortlist_ks(icfg)
    exact_dir = out / "exact"
    base = cls.build(source, exact_dir, ds.label_texts, {**options, "index": {**icfg, "kind": "exact", "storage": "float32"}})
    (exact_dir / "predictor.json").write_text(json.dumps(base, indent=2) + "\n")
    shortlist_cls = predictor_class("shortlist", out)
    section = shortlist_cls.build(exact_dir, out, ds.label_texts, {
        "tfidf_dir": tfidf_dir, "shortlist_k": ks[0], "max_postings_per_term": icfg["shortlist_max_postings_per_term"]})
    shutil.rmtree(exact_dir)
    record: dict[str, Any] = {"mode": mode, "shortlist_k": ks[0], "shortlist_k_candidates": ks,
                              "max_postings_per_term": icfg["shortlist_max_postings_per_term"]}
    done: dict[str, Any] = {}
    keep = mode == "tfidf"
    shortlist = None
    if mode == "auto" and not has_val:
        record["why"] = "no validation split predicted: nothing to decide on, the index is built"
    elif mode == "auto":
        shortlist = shortlist_cls.load(out, section, ds.label_texts)
        texts = ds.val.texts
        metric, alpha = "P@5", 0.05
        bs = bootstrap_settings(params)
        freq = np.asarray(ds.trn.Y.sum(axis=0)).ravel()
        Y_val = ds.val.Y.tocsr()

        def contributions(D: np.ndarray, I: np.ndarray, rows: Any = slice(None)) -> Any:
            filt = ds.val_filter[rows] if ds.val_filter is not None else None
            c = instance_contributions(TopK(I.astype(np.int32), D.astype(np.float32)), Y_val[rows], freq,
                                       ds.trn.Y.shape[0], recall_ks=(min(10, k), min(100, k)), filt=filt)
            groups = ds.val.groups
            if groups is not None:   # the documents of the rows compared (all of them, or a sample)
                groups = list(groups) if isinstance(rows, slice) else [groups[int(i)] for i in np.asarray(rows)]
            return replace(c, groups=document_codes(groups, c.n))

        def paired(a: Any, b: Any, names: tuple[str, str]) -> dict[str, Any]:
            test = paired_bootstrap(a, b, metric, bs["n_resamples"], bs["seed"], bs["level"], unit=bs["unit"])
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
        D_e, I_e = predict_texts(shortlist.base, [texts[i] for i in rows], k, chunk)
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


def dataset_record(ws: Workspace, ds: XMCDataset) -> dict[str, Any]:
    """What a manifest says of the data a package was trained and validated on (hashes of exactly those files)."""
    source = ws.processed / "source.json"
    info = read_json_file(source, "the dataset source") if source.is_file() else {}
    return {"sha256": sha256_files([ws.processed / f for f in DATA_FILES]), "files": list(DATA_FILES),
            "source": info.get("source"), "train_instances": int(ds.trn.Y.shape[0]),
            "licence": dataset_licence(info.get("source"))}   # the model is derived from the data: its licences


def _predict_and_score(ws: Workspace, name: str, predictor: Predictor, ds: XMCDataset, splits: tuple[str, ...],
                       params: dict[str, Any], done: dict[str, Any], chunk: int,
                       full_searches: dict[str, int] | None = None) -> tuple[dict[str, float], dict, dict]:
    """Predict each split (``done``: splits already predicted), save the top-k; returns (seconds per split,
    {split: evaluation result}, {split: predicted ids}). ``full_searches``: a shortlist predictor's count of texts
    searched over every label, per split predicted here (filled in)."""
    k = int(params["evaluate"]["top_k"])
    seconds: dict[str, float] = {}
    results: dict[str, Any] = {}
    ids: dict[str, np.ndarray] = {}
    for split in splits:
        t0 = time.perf_counter()
        if split in done:
            D, I, secs = done[split]
        else:
            if full_searches is not None:
                predictor.full_searches = 0
            D, I = predict_texts(predictor, ds.split(split).texts, k, chunk)
            secs = time.perf_counter() - t0
            if full_searches is not None:
                full_searches[split] = predictor.full_searches
        top = TopK(I.astype(np.int32), D.astype(np.float32))
        top.save(ws.predictions(name) / f"{split}_topk.npz")
        seconds[split] = round(secs, 2)
        results[split] = evaluate_split(top, ds, split, params)
        ids[split] = I
    return seconds, results, ids


def package_run(params: dict[str, Any], name: str, ws: Workspace, model_dir: Path | None = None,
                splits: tuple[str, ...] = PREDICTED_SPLITS, chunk: int = 8192, run_params: dict[str, Any] | None = None,
                ds: XMCDataset | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The package of trained model ``model_dir`` (default ``ws.model(name)``) -> ``ws.package(name)``, with its
    predictions of ``splits`` and their metrics; returns a summary (predictor section, metrics, timing).
    ``options``: more predictor options (``space``: a UniDEC model's retrieval space)."""
    model_dir = model_dir or ws.model(name)
    info = model_info(model_dir)
    config = run_params if run_params is not None else info.get("config") or {}
    kind = info["predictor"]
    cls = predictor_class(kind, model_dir / MODEL_INFO)
    ds = ds or load_processed(ws.processed, splits=("trn", *splits))
    k = int(params["evaluate"]["top_k"])
    summary = training_summary(model_dir)
    options = {**predictor_options(params, ds, config), **(options or {})}
    mode = _shortlist_mode(params, kind, len(ds.label_texts))
    t0 = time.perf_counter()
    with atomic_dir(ws.package(name)) as tmp:
        shortlist: dict[str, Any] = {}
        done: dict[str, Any] = {}
        predictor = None
        if mode:
            section, shortlist, done, predictor = _shortlist_or_index(
                cls, model_dir, tmp, ds, options, params, mode, k, ws.tfidf, chunk, "val" in splits)
        else:
            section = cls.build(model_dir, tmp, ds.label_texts, options)
        index_seconds = time.perf_counter() - t0
        if predictor is None:
            predictor = predictor_class(section["kind"], tmp).load(tmp, section, ds.label_texts)
        searches = shortlist.setdefault("full_searches", {}) if section["kind"] == "shortlist" else None
        seconds, results, ids = _predict_and_score(ws, name, predictor, ds, splits, params, done, chunk, searches)
        timing = _timing(summary, section, predictor, index_seconds, seconds, shortlist, ds, ids)
        write_json(ws.predictions(name) / "timing.json", timing)
        metrics = {split: write_evaluation(ws, name, split, results[split], params, timing) for split in splits}
        finish_package(tmp, section, name=name, method=info["method"], label_uids=ds.label_uids,
                       label_texts=ds.label_texts, params={"run": info.get("run", name), "method": info["method"],
                                                           **config, "index": params["index"]},
                       dataset=dataset_record(ws, ds), training=training_record(summary),
                       metrics={s: {k_: v for k_, v in m.items() if k_ != "ci95"} for s, m in metrics.items()})
    log.info("packaged %s (%s, %d labels) -> %s: %s", name, section["kind"], len(ds.label_texts), ws.package(name),
             ", ".join(f"{s} P@1 {m.get('P@1', 0):.2f} P@5 {m.get('P@5', 0):.2f}" for s, m in metrics.items()))
    return {"name": name, "predictor": section, "metrics": metrics, "timing": timing}


def _timing(summary: dict[str, Any], section: dict[str, Any], predictor: Any, index_seconds: float,
            seconds: dict[str, float], shortlist: dict[str, Any], ds: XMCDataset,
            ids: dict[str, np.ndarray]) -> dict[str, Any]:
    """What ``predictions/<name>/timing.json`` records: training, index and prediction seconds, the index and, for
    an approximate index or a shortlist, its recall@100 against exact search."""
    is_shortlist = section["kind"] == "shortlist"
    timing: dict[str, Any] = {"train_seconds": float(summary.get("train_seconds", 0.0)),
                              "index_seconds": round(index_seconds, 2),
                              "predict_seconds": seconds.get("tst", seconds.get("val")),
                              "predict_seconds_by_split": seconds, "predictor": section["kind"]}
    index = getattr(predictor, "index", None)
    if index is not None:
        timing.update({"index_kind": "tfidf_shortlist" if is_shortlist else index.kind, "on_gpu": index.on_gpu})
        if not is_shortlist and getattr(index, "calibration", None):
            timing["index_calibration"] = index.calibration
        if is_shortlist and "recall_against_exact" in shortlist:
            timing.update({"index_recall_at": shortlist["recall_at"], "index_recall_queries": shortlist["exact_texts"],
                           "index_recall": shortlist["recall_against_exact"], "index_recall_split": "val"})
        elif (index.kind != "exact" or is_shortlist) and hasattr(predictor, "query_vectors") and ids:
            split = next(iter(ids))
            texts = ds.split(split).texts
            m, kk = min(1000, len(texts)), min(100, ids[split].shape[1])
            q = predictor.query_vectors(list(texts[:m]))
            timing.update({"index_recall_at": kk, "index_recall_queries": m, "index_recall_split": split,
                           "index_recall": round(index.recall_against_exact(q, ids[split][:m], kk), 4)})
            log.info("%s index recall@%d against exact search %.4f (%d %s queries)", index.kind, kk,
                     timing["index_recall"], m, split)
    if shortlist:
        timing["shortlist"] = shortlist
    return timing


__all__ = ["DATA_FILES", "MODEL_INFO", "PREDICTED_SPLITS", "dataset_record", "model_info", "package_run",
           "predict_texts", "predictor_options", "training_summary"]
