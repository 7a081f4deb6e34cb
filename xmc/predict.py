"""Batch prediction with a trained encoder and its ANN index: texts -> top-k labels with scores."""

from __future__ import annotations

import json
from pathlib import Path

from xmc.ann import ANNIndex
from xmc.data.formats import read_json_lines, read_text_lines
from xmc.encoders import load_encoder
from xmc.errors import DataFormatError
from xmc.io import atomic_file


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
    items = read_input_texts(input_path)
    labels = [json.loads(line) for line in Path(label_file).read_text(encoding="utf-8").splitlines()]
    encoder = load_encoder(model_dir)
    index = ANNIndex.load(Path(index_dir) / "ann" if (Path(index_dir) / "ann").exists() else index_dir)
    q = encoder.encode([t for _, t in items], "query", batch_size)
    D, I = index.search(q, k)
    with atomic_file(output_path) as fh:
        for (uid, text), ids, scores in zip(items, I, D):
            preds = [{"label": int(i), "uid": labels[i]["uid"], "text": labels[i]["text"], "score": round(float(s), 6)}
                     for i, s in zip(ids, scores) if i >= 0]
            fh.write(json.dumps({"id": uid, "text": text, "labels": preds}, ensure_ascii=False) + "\n")
    return len(items)


__all__ = ["predict_file", "read_input_texts"]
