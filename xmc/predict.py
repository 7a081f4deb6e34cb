"""Batch prediction with a trained encoder and its ANN index: texts -> top-k labels with scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xmc.ann import ANNIndex
from xmc.data.formats import read_json_lines, read_text_lines
from xmc.encoders import load_encoder
from xmc.errors import ConfigError, DataFormatError
from xmc.io import atomic_file


PREDICTED_SPLITS = ("val", "tst")
MAX_K = 10_000  # most labels returned per text


def run_and_splits(argv: list[str], usage: str) -> tuple[str, tuple[str, ...]]:
    """``<run> [val] [tst]`` of a prediction stage's command line (default: both splits)."""
    if not argv:
        raise ConfigError(f"usage: {usage}")
    name, splits = argv[0], tuple(argv[1:]) or PREDICTED_SPLITS
    if set(splits) - set(PREDICTED_SPLITS):
        raise ConfigError(f"splits to predict must be val and/or tst, not {' '.join(splits)}")
    return name, splits


def load_retrieval_model(model_dir: str | Path, label_texts: list[str]) -> Any:
    """Any saved model whose labels are searched by inner product: an ASTRA model (encoder +
    classifier vectors), or a dual encoder (label vectors = encoded label texts)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: model folder not found (train it first)")
    if (model_dir / "astra.json").exists():
        from xmc.methods.astra import ASTRAModel

        return ASTRAModel.load(model_dir, label_texts)
    if (model_dir / "unidec.json").exists():
        raise ConfigError(f"{model_dir}: a UniDEC model has three retrieval spaces: use stages.predict_unidec")
    from xmc.models import DualEncoderModel

    return DualEncoderModel(load_encoder(model_dir), label_texts)


def read_input_texts(path: str | Path) -> list[tuple[str, str]]:
    """(id, text) pairs from a ``.txt`` (one text per line) or ``.jsonl`` (``{"id"?, "text"}``) file."""
    path = Path(path)
    out = []
    if path.suffix == ".jsonl":
        for n, rec in read_json_lines(path):
            text = rec.get("text")
            if not isinstance(text, str) or not text.strip():
                raise DataFormatError(path, n, "missing or empty 'text'")
            out.append((str(rec.get("id", n - 1)), text.strip()))
    else:
        uids, texts = read_text_lines(path)
        out = list(zip(uids, texts))
    return out


def predict_file(model_dir: str | Path, index_dir: str | Path, label_file: str | Path, input_path: str | Path,
                 output_path: str | Path, k: int = 10, batch_size: int = 256) -> int:
    """Write one JSON line per input text: ``{"id", "text", "labels": [{"label", "uid", "text", "score"}]}``."""
    from xmc.data.dataset import _read_jsonl

    out = Path(output_path).resolve()
    for name, p in (("input", input_path), ("model", model_dir), ("index", index_dir), ("label file", label_file)):
        q = Path(p).resolve()
        if out == q or q in out.parents or out in q.parents:
            raise ConfigError(f"{output_path}: the output would overwrite the {name} {p}")
    if not Path(model_dir).is_dir():
        raise ConfigError(f"{model_dir}: model folder not found (train it first)")
    if not Path(index_dir).is_dir():
        raise ConfigError(f"{index_dir}: index folder not found (run the index stage)")
    labels = _read_jsonl(Path(label_file))
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"k must be an integer in [1, {MAX_K}] (got {k!r})")
    k = min(k, len(labels))  # a small label set: all of its labels, ranked
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 65536:
        raise ConfigError(f"batch_size must be an integer in [1, 65536] (got {batch_size!r})")
    items = read_input_texts(input_path)
    encoder = load_encoder(model_dir)
    index = ANNIndex.load(Path(index_dir) / "ann" if (Path(index_dir) / "ann").exists() else index_dir)
    if index.ntotal != len(labels):
        raise ConfigError(f"{index_dir}: the index holds {index.ntotal} vectors but {label_file} has {len(labels)} labels")
    q = encoder.encode([t for _, t in items], "query", batch_size)
    D, I = index.search(q, k)
    with atomic_file(output_path) as fh:
        for (uid, text), ids, scores in zip(items, I, D):
            preds = [{"label": int(i), "uid": labels[i]["uid"], "text": labels[i]["text"], "score": round(float(s), 6)}
                     for i, s in zip(ids, scores) if i >= 0]
            fh.write(json.dumps({"id": uid, "text": text, "labels": preds}, ensure_ascii=False) + "\n")
    return len(items)


__all__ = ["load_retrieval_model", "predict_file", "read_input_texts", "run_and_splits"]


def main(argv: list[str] | None = None) -> None:
    """``python -m xmc.predict --model models/dexml --index indexes/dexml --input texts.txt --output out.jsonl``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m xmc.predict", description="Top-k labels for a file of texts "
                                 "(.txt: one per line; .jsonl: {\"id\"?, \"text\"}) -> JSON lines.")
    ap.add_argument("--model", required=True, help="a trained model folder (models/<run>)")
    ap.add_argument("--index", required=True, help="its label index folder (indexes/<run>)")
    ap.add_argument("--labels", default="data/processed/lbl.jsonl", help="the label file the index was built from")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args(argv)
    n = predict_file(a.model, a.index, a.labels, a.input, a.output, a.k, a.batch_size)
    print(f"wrote top-{a.k} labels for {n} texts to {a.output}")


if __name__ == "__main__":
    from xmc.config import run_entry_point

    run_entry_point(main)
