"""What the compact bag-of-words table costs: package predictions with untouched buckets as a zero row against the
table exactly as trained, on the validation split.

A bag-of-words encoder is saved with only the rows training moved (``bow_encoder.pt``: the touched buckets and their
rows, ``xmc_encoder.json`` ``"storage": "touched_rows"`` with the seed of the initial rows). Loaded as saved
(``HashedBagOfWordsEncoder.load(path)``, ``untouched="zero"``) a bucket no training text or label text hashed to
maps to a zero row, so an n-gram unseen in training adds nothing to a text's vector; loaded with
``untouched="init"`` those rows are rebuilt from the seed, the random initial rows training left alone: the
encoder exactly as trained. For each trained model folder of the product (``models/<run>/``: DEXML-BoW, RAMEN and
ASTRA hold their encoder in ``<folder>/`` or ``<folder>/encoder/``, UniDEC in ``<folder>/encoder/``) this builds
the run's predictor both ways into scratch folders (:mod:`xmc.package.predictors`, ``DensePredictor`` or
``UniDECPredictor`` with the predictor option ``untouched``; the index settings of params.yaml ``index``), ranks
the validation split with each and reports P@1 / P@5 / PSP@5 / R@100 of both (params.yaml ``evaluate``), the
paired bootstrap of zero − init on the same sentences (:func:`xmc.metrics.bootstrap.paired_bootstrap` over
:func:`~xmc.metrics.bootstrap.instance_contributions`, params.yaml ``evaluate.bootstrap``; the verdict on P@5 at
alpha 0.05) and the stored table against the full one, in bytes. The test split is not read.

    make run    # or any workspace with models/<run>/ and data/processed
    python -m lab.bench.bow_table_storage --runs dexml_bow,ramen,unidec,astra [--root .] \\
        [--out lab/bench/bow_table_storage.json]

A run whose model has no bag-of-words encoder (a transformer run) is reported as skipped. Building the ``init``
side rebuilds the whole table in memory (1.6 GB at 2^19 x 768, about 8 s). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ("P@1", "P@5", "PSP@5", "R@100")
VARIANTS = ("zero", "init")        # untouched buckets: a zero row (as saved) | the initial rows (as trained)
ALPHA = 0.05


def bow_encoder_dir(model_dir: Path) -> Path | None:
    """The bag-of-words encoder folder of a trained model: the folder itself or its ``encoder/`` (None: none)."""
    for d in (model_dir, model_dir / "encoder"):
        cfg = d / "xmc_encoder.json"
        if cfg.is_file() and json.loads(cfg.read_text(encoding="utf-8")).get("kind") == "bow":
            return d
    return None


def table_sizes(encoder_dir: Path) -> dict[str, Any]:
    """The stored table (its rows and bucket ids, and ``bow_encoder.pt`` on disk) against the full one the encoder
    trained (n_buckets x dim float32 per table: one tied, two untied)."""
    from xmc.io import load_tensors

    cfg = json.loads((encoder_dir / "xmc_encoder.json").read_text(encoding="utf-8"))
    st = load_tensors(encoder_dir / "bow_encoder.pt")
    n, dim, tied = int(cfg["n_buckets"]), int(cfg["dim"]), bool(cfg["tied"])
    tables = 1 if tied else 2
    full = n * dim * 4 * tables
    if cfg.get("storage") != "touched_rows":   # a whole table, saved before touched-row storage
        stored = sum(t.numel() * t.element_size() for t in st.values())
        rows = n * tables
    else:
        stored = sum(t.numel() * t.element_size() for k, t in st.items() if k.endswith(("_rows", "_buckets")))
        rows = sum(int(t.shape[0]) for k, t in st.items() if k.endswith("_rows"))
    return {"storage": cfg.get("storage", "full_table"), "n_buckets": n, "dim": dim, "tied": tied,
            "stored_rows": rows, "stored_row_share": round(rows / (n * tables), 4),
            "stored_table_bytes": int(stored),
            "stored_file_bytes": int((encoder_dir / "bow_encoder.pt").stat().st_size),
            "full_table_bytes": int(full), "stored_over_full": round(stored / full, 4)}


def run_config(params: dict[str, Any], run: str) -> dict[str, Any]:
    """The run's settings in params.yaml ``runs`` (the predictors read the index settings, not these), or {}."""
    from xmc.config.runs import resolve_runs

    specs, _ = resolve_runs(params.get("runs") or {}, params)
    return specs[run].config if run in specs else {}


def rank_variant(model_dir: Path, kind: str, ds: Any, options: dict[str, Any], untouched: str, k: int,
                 ev: dict[str, Any]) -> tuple[dict[str, Any], Any, np.ndarray]:
    """Build the predictor of ``model_dir`` with ``untouched`` into a scratch folder, load it as a package would and
    rank the validation split: (figures, per-sentence contributions, the top-k label ids)."""
    from xmc.metrics.bootstrap import instance_contributions
    from xmc.package.build import predict_texts
    from xmc.package.predictor import predictor_class
    from xmc.predictions import TopK

    cls = predictor_class(kind, model_dir)
    with tempfile.TemporaryDirectory(prefix=f"xmc-bow-table-{untouched}-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        section = cls.build(model_dir, out, list(ds.label_texts), {**options, "untouched": untouched})
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        predictor = cls.load(out, section, list(ds.label_texts))
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        D, I = predict_texts(predictor, list(ds.val.texts), k)
        predict_s = time.perf_counter() - t0
        del predictor
    freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    c = instance_contributions(TopK(I.astype(np.int32), D.astype(np.float32)), ds.val.Y, freq, ds.trn.Y.shape[0],
                               tuple(ev["ks"]), tuple(ev["recall_ks"]), float(ev["propensity_a"]),
                               float(ev["propensity_b"]))
    values = c.values()
    return {"metrics": {m: round(float(values[m]), 2) for m in METRICS},
            "section_untouched": section.get("untouched", "zero"),   # what the package's predictor.json would say
            "build_seconds": round(build_s, 2), "load_seconds": round(load_s, 2),
            "predict_seconds": round(predict_s, 2)}, c, I


def measure(params: dict[str, Any], ws: Any, run: str, ds: Any) -> dict[str, Any]:
    """One run's two variants, their paired test and the table sizes."""
    from xmc.metrics.bootstrap import bootstrap_settings, paired_bootstrap, verdict
    from xmc.package.build import model_info, predictor_options

    model_dir = ws.model(run)
    info = model_info(model_dir)
    enc_dir = bow_encoder_dir(model_dir)
    if enc_dir is None:
        return {"skipped": f"{model_dir}: no bag-of-words encoder (method {info['method']})"}
    if info["predictor"] not in ("dense", "unidec"):
        return {"skipped": f"{model_dir}: predictor {info['predictor']!r} is not a dense or UniDEC one"}
    ev = params["evaluate"]
    k = int(ev["top_k"])
    options = predictor_options(params, ds, run_config(params, run))
    out: dict[str, Any] = {"model": str(model_dir), "encoder": str(enc_dir), "method": info["method"],
                           "predictor": info["predictor"], "table": table_sizes(enc_dir)}
    contrib, ids = {}, {}
    for untouched in VARIANTS:
        out[untouched], contrib[untouched], ids[untouched] = rank_variant(model_dir, info["predictor"], ds, options,
                                                                          untouched, k, ev)
        print(f"{run} untouched={untouched}: {out[untouched]['metrics']} "
              f"(build {out[untouched]['build_seconds']} s, predict {out[untouched]['predict_seconds']} s)", flush=True)
    shipped = ws.predictions(run) / "val_topk.npz"
    if shipped.is_file():   # the zero side is what the run's package serves: its top 10 as package@ predicted it
        from xmc.predictions import TopK

        ref = TopK.load(shipped).indices[:, :10]
        if ref.shape == ids["zero"][:, :10].shape:
            out["zero_top10_same_as_package_predictions"] = round(float((ref == ids["zero"][:, :10]).all(1).mean()), 4)
    bs = bootstrap_settings(params)
    out["zero_minus_init"] = {m: {key: v for key, v in paired_bootstrap(contrib["zero"], contrib["init"], m,
                                                                         int(bs["n_resamples"]), int(bs["seed"]),
                                                                         float(bs["level"])).items()
                                  if key in ("a", "b", "diff", "ci95", "p_value")} for m in METRICS}
    p5 = out["zero_minus_init"]["P@5"]
    out["verdict_P@5"] = verdict(p5["p_value"], p5["diff"], ALPHA).replace("A ", "zero ").replace("B ", "init ")
    print(f"{run} zero - init P@5 {p5['diff']:+.2f} {p5['ci95']} p {p5['p_value']:.3g} ({out['verdict_P@5']}); "
          f"table {out['table']['stored_table_bytes']:,} of {out['table']['full_table_bytes']:,} bytes", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from xmc.config import set_offline_env

    set_offline_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="dexml_bow,ramen,unidec,astra",
                    help="comma-separated trained runs (models/<run>)")
    ap.add_argument("--root", default=".",
                    help="the workspace: models/<run>/ and data/processed (default: the working directory)")
    ap.add_argument("--params", default=None, help="the params file (default: <root>/params.yaml, else params.yaml)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "bow_table_storage.json"))
    a = ap.parse_args(argv)
    from xmc.config import load_params
    from xmc.data import load_processed
    from xmc.machine import set_threads
    from xmc.metrics.bootstrap import bootstrap_settings, split_fingerprint
    from xmc.workspace import Workspace

    set_threads()
    ws = Workspace(Path(a.root))
    params_file = Path(a.params) if a.params else next(
        (p for p in (ws.root / "params.yaml", Path("params.yaml")) if p.is_file()), Path("params.yaml"))
    params = load_params(params_file)
    runs = [r for r in a.runs.split(",") if r]
    missing = [r for r in runs if not ws.model(r).is_dir()]
    if missing:
        raise SystemExit(f"no trained model folder for {', '.join(missing)} under {ws.root / 'models'} "
                         "(make run, or --root a workspace that has them)")
    ds = load_processed(ws.processed, splits=("trn", "val"))
    result: dict[str, Any] = {
        "what": "package predictions of each bag-of-words model with untouched buckets as a zero row (as saved) and "
                "as their initial rows (the table as trained), validation split; zero_minus_init is a paired "
                "bootstrap over the same sentences",
        "command": "python -m lab.bench.bow_table_storage --runs " + ",".join(runs)
                   + (f" --root {a.root}" if a.root != "." else ""),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "split": "val", "n_sentences": int(ds.val.Y.shape[0]), "val_fingerprint": split_fingerprint(ds.val.Y),
        "evaluate": {k: params["evaluate"][k] for k in ("top_k", "ks", "recall_ks", "propensity_a", "propensity_b")},
        "bootstrap": bootstrap_settings(params), "alpha": ALPHA, "index": params["index"], "runs": {}}
    out = Path(a.out)
    for run in runs:
        result["runs"][run] = measure(params, ws, run, ds)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")   # after every run: a cut-short run keeps rows
    print(f"-> {out}")
    return result


if __name__ == "__main__":
    main()
