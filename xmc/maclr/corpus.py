"""The only input of the zero-shot (EZ-XMC) path: instance texts and label texts, no label matrix.

:func:`load_texts_only` reads ``trn.jsonl`` and ``lbl.jsonl`` of a processed directory and nothing
else (never ``trn_Y.npz``), so the zero-shot stages cannot see an (instance, label) pair even by
accident; the ``pseudo_pairs`` stage copies these texts into its own output, which is all that the
Stage I/II training stage reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xmc.data.formats import read_json_lines
from xmc.errors import DataFormatError


@dataclass
class ZeroShotCorpus:
    """Training instance texts (with optional document ids) and the whole label set's texts."""

    uids: list[str]
    texts: list[str]
    groups: list[str | None] | None
    label_texts: list[str]

    def __len__(self) -> int:
        return len(self.texts)


def _read_jsonl(path: Path, fields: tuple[str, ...]) -> list[dict]:
    if not path.exists():
        raise DataFormatError(path, None, "missing (run the ingest stage)")
    rows = []
    for i, rec in read_json_lines(path, empty=None):   # the dataset readers' checks: errors name the line
        if "text" not in rec:
            raise DataFormatError(path, i, "record has no 'text'")
        rows.append({f: rec.get(f) for f in fields})  # keep only the text fields
    return rows


def load_texts_only(processed_dir: str | Path) -> ZeroShotCorpus:
    """Instance and label texts of a processed dataset; reads no label matrix."""
    d = Path(processed_dir)
    inst = _read_jsonl(d / "trn.jsonl", ("uid", "text", "group"))
    lbl = _read_jsonl(d / "lbl.jsonl", ("text",))
    groups = [r["group"] for r in inst]
    return ZeroShotCorpus(uids=[str(r["uid"]) for r in inst], texts=[r["text"] for r in inst],
                          groups=None if all(g is None for g in groups) else groups,
                          label_texts=[r["text"] for r in lbl])
