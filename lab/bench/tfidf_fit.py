"""The TF-IDF stage's fit and save against scikit-learn's stock path, on the same texts, in one process.

The peer is what the stage did before it was tuned for size: ``TfidfVectorizer.fit`` on the training and label
texts, then ``transform`` of each split (every text tokenised twice; scikit-learn's vocabulary sort of (term,
index) tuples and its pruning loop over every term), and the vocabulary written with ``json.dumps(...,
sort_keys=True)``. Ours is ``xmc.baselines.fit_tfidf`` + ``TfidfFeatures.save``. The two alternate ``--repeats``
times; fit and save are timed apart, and the files each writes are compared byte for byte (they must be equal).

    python -m lab.bench.tfidf_fit [--processed data/processed] [--params params.yaml] [--repeats 3]
                                  [--out lab/bench/tfidf_fit.json]

``--processed``/``--params`` may point at a scale workspace (``lab/bench/.scale/repo_<n>``, kept by
``python -m lab.bench.scale --keep``) for the synthetic data at 10^5 or 10^6. ``--merge`` adds the result to ``--out``
under the data's name instead of replacing the file. Not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

BENCH = Path(__file__).resolve().parent


def stock_fit_and_save(trn: list[str], val: list[str], lbl: list[str], params: dict[str, Any], out: Path) -> tuple[float, float, int]:
    """scikit-learn's own fit then transform, saved by the stage's ``TfidfFeatures.save`` with the sorting json dump
    of the vocabulary in place of ``vocabulary_json``."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from xmc.baselines.tfidf import TfidfFeatures, _vectorizer
    from xmc.config.schema import TfidfConfig, filled

    t0 = time.perf_counter()
    vec = TfidfVectorizer(**_vectorizer(params).get_params()).fit(trn + lbl)
    X = [vec.transform(texts).tocsr() for texts in (trn, val, lbl)]
    fit_s = time.perf_counter() - t0
    feats = TfidfFeatures(vec, *X, {k: v for k, v in filled(TfidfConfig, params, "tfidf").items() if v is not None})
    t0 = time.perf_counter()
    with mock.patch("xmc.baselines.tfidf.vocabulary_json",
                    lambda v: json.dumps({t: int(i) for t, i in v.items()}, ensure_ascii=False, sort_keys=True)):
        feats.save(out)
    return fit_s, time.perf_counter() - t0, len(vec.vocabulary_)


def ours_fit_and_save(trn: list[str], val: list[str], lbl: list[str], params: dict[str, Any], out: Path) -> tuple[float, float, int]:
    from xmc.baselines import fit_tfidf

    t0 = time.perf_counter()
    feats = fit_tfidf(trn, val, lbl, params)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    feats.save(out)
    return fit_s, time.perf_counter() - t0, len(feats.vectorizer.vocabulary_)


def digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.md5(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processed", default="data/processed")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default=None, help="the data's name in the JSON (default: the processed folder's parent)")
    ap.add_argument("--out", default=str(BENCH / "tfidf_fit.json"))
    ap.add_argument("--merge", action="store_true")
    a = ap.parse_args(argv)

    from xmc.machine import set_threads

    set_threads()
    from xmc.config import load_params
    from xmc.data import load_processed

    params = load_params(a.params)["tfidf"]
    ds = load_processed(a.processed, splits=("trn", "val"))
    trn, val, lbl = list(ds.trn.texts), list(ds.val.texts), list(ds.label_texts)
    name = a.name or Path(a.processed).resolve().parent.name
    print(f"{name}: {len(trn):,} training, {len(val):,} validation, {len(lbl):,} label texts", flush=True)
    times: dict[str, dict[str, list[float]]] = {s: {"fit": [], "save": []} for s in ("stock", "ours")}
    digests: dict[str, list[dict[str, str]]] = {"stock": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="tfidf_fit_") as tmp:
        for _ in range(a.repeats):
            for side, fn in (("stock", stock_fit_and_save), ("ours", ours_fit_and_save)):
                out = Path(tmp) / side
                shutil.rmtree(out, ignore_errors=True)
                fit_s, save_s, n_terms = fn(trn, val, lbl, params, out)
                times[side]["fit"].append(round(fit_s, 2))
                times[side]["save"].append(round(save_s, 2))
                digests[side].append(digest(out))
                print(f"  {side:5s} fit {fit_s:8.2f} s  save {save_s:8.2f} s", flush=True)
    best = {s: {p: min(v) for p, v in t.items()} for s, t in times.items()}
    total = {s: min(f + v for f, v in zip(t["fit"], t["save"])) for s, t in times.items()}
    identical = all(d == digests["stock"][0] for s in digests for d in digests[s])
    row = {
        "texts": {"trn": len(trn), "val": len(val), "lbl": len(lbl)},
        "vocabulary": n_terms,
        "params": params, "repeats": a.repeats, "seconds": times,
        "stock_over_ours": {"fit": round(best["stock"]["fit"] / best["ours"]["fit"], 2),
                            "save": round(best["stock"]["save"] / best["ours"]["save"], 2),
                            "fit_and_save": round(total["stock"] / total["ours"], 2)},
        "identical_files": identical,
    }
    print(f"stock / ours (best of {a.repeats}): fit {row['stock_over_ours']['fit']}x, save "
          f"{row['stock_over_ours']['save']}x, both {row['stock_over_ours']['fit_and_save']}x; identical files: {identical}")
    out_path = Path(a.out)
    result = json.loads(out_path.read_text()) if a.merge and out_path.is_file() else {}
    result["machine"] = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                         "python": platform.python_version()}
    result.setdefault("data", {})[name] = row
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    if not identical:
        raise SystemExit("the two paths wrote different files")
    return result


if __name__ == "__main__":
    main()
