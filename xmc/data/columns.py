"""Memory-mapped string columns: the columnar form of a processed split.

A column of n strings is two files: ``<name>.bin`` (the UTF-8 bytes of every string, concatenated) and
``<name>.off.npy`` (n + 1 int64 byte offsets); a column with missing values (document groups) adds
``<name>.null.npy`` (n bools). :class:`TextColumn` maps both files and decodes a string only when it is read,
so a stage that loads a split of 10^6 instances and reads a few thousand of its texts holds a few pages of it,
not 10^6 Python strings, and a stage that reads only the label matrix never touches the texts at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from xmc.errors import DataFormatError

_CHUNK = 65536   # strings decoded per block when a whole column is iterated


def write_text_column(directory: Path, name: str, values: Iterable[str | None]) -> int:
    """Write ``values`` as the column ``name`` in ``directory``; ``None`` is a missing value. Returns the count."""
    directory.mkdir(parents=True, exist_ok=True)
    offsets = [0]
    nulls: list[bool] = []
    with open(directory / f"{name}.bin", "wb") as fh:
        pos = 0
        for v in values:
            nulls.append(v is None)
            if v is not None:
                b = v.encode("utf-8")
                fh.write(b)
                pos += len(b)
            offsets.append(pos)
    np.save(directory / f"{name}.off.npy", np.asarray(offsets, dtype=np.int64))
    if any(nulls):
        np.save(directory / f"{name}.null.npy", np.asarray(nulls, dtype=bool))
    return len(nulls)


class TextColumn(Sequence):
    """A read-only sequence of strings backed by a memory-mapped column (see the module docstring).

    Indexing by an int gives a ``str`` (or ``None`` where the value is missing); by a slice, a list or an integer
    array gives a ``list``. Pickles as its paths, so worker processes map the same files."""

    def __init__(self, directory: str | Path, name: str) -> None:
        self.directory, self.name = Path(directory), name
        off_path = self.directory / f"{name}.off.npy"
        bin_path = self.directory / f"{name}.bin"
        for p in (off_path, bin_path):
            if not p.is_file():
                raise DataFormatError(p, None, "missing from the processed dataset's columns (rerun the ingest stage)")
        try:
            self._off = np.load(off_path, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise DataFormatError(off_path, None, f"not a column offset array ({e})") from None
        size = bin_path.stat().st_size
        if self._off.ndim != 1 or len(self._off) == 0 or int(self._off[0]) != 0 or int(self._off[-1]) != size:
            raise DataFormatError(off_path, None, f"offsets do not match {bin_path.name} ({size} bytes); rerun the ingest stage")
        # np.memmap refuses an empty file: an empty column (all strings empty) reads from an empty buffer
        self._buf = np.memmap(bin_path, dtype=np.uint8, mode="r") if size else np.zeros(0, dtype=np.uint8)
        null_path = self.directory / f"{name}.null.npy"
        self._null = np.load(null_path, mmap_mode="r") if null_path.is_file() else None
        if self._null is not None and len(self._null) != len(self):
            raise DataFormatError(null_path, None, f"{len(self._null)} flags for {len(self)} values; rerun the ingest stage")

    def __len__(self) -> int:
        return len(self._off) - 1

    def _one(self, i: int) -> str | None:
        if self._null is not None and self._null[i]:
            return None
        return bytes(self._buf[self._off[i]:self._off[i + 1]]).decode("utf-8")

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice | Sequence[int] | np.ndarray) -> list[str]: ...

    def __getitem__(self, i: Any) -> Any:
        n = len(self)
        if isinstance(i, (int, np.integer)):
            j = int(i)
            if j < -n or j >= n:
                raise IndexError(f"index {j} out of range for a column of {n}")
            return self._one(j % n if j < 0 else j)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step == 1:
                return self._block(start, stop)
            return [self._one(j) for j in range(start, stop, step)]
        idx = np.asarray(i)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise TypeError(f"a column is indexed by an int, a slice or a 1-d array of ints, not {type(i).__name__}")
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"index out of range for a column of {n}")
        return self._gather(idx.astype(np.int64) % n if idx.size else idx.astype(np.int64))

    def _gather(self, idx: np.ndarray) -> list[str]:
        """Strings at ``idx`` (in range) from one gather of their bytes: a training step reads its batch's texts
        this way (per-item reads of the memory map cost about as much as the rest of a bag-of-words step)."""
        if not idx.size:
            return []
        off = np.asarray(self._off)
        starts, lengths = off[idx], off[idx + 1] - off[idx]
        ends = np.cumsum(lengths)
        pos = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]))
        raw = np.asarray(self._buf)[pos].tobytes()
        bounds = np.concatenate([[0], ends]).tolist()
        out: list[str] = [raw[a:b].decode("utf-8") for a, b in zip(bounds[:-1], bounds[1:])]
        if self._null is not None:
            for k in np.flatnonzero(np.asarray(self._null)[idx]):
                out[int(k)] = None   # type: ignore[call-overload]
        return out

    def _block(self, start: int, stop: int) -> list[str]:
        """Strings [start, stop) from one contiguous read (one decode per string, no per-item bounds work)."""
        if stop <= start:
            return []
        off = np.asarray(self._off[start:stop + 1]) - int(self._off[start])
        raw = bytes(self._buf[int(self._off[start]):int(self._off[stop])])
        out = [raw[a:b].decode("utf-8") for a, b in zip(off[:-1].tolist(), off[1:].tolist())]
        if self._null is not None:
            for k in np.flatnonzero(self._null[start:stop]):
                out[int(k)] = None
        return out

    def __iter__(self) -> Iterator[str]:
        for a in range(0, len(self), _CHUNK):
            yield from self._block(a, min(a + _CHUNK, len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TextColumn) and other.directory == self.directory and other.name == self.name:
            return True
        if not isinstance(other, Sequence) or isinstance(other, str) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other))

    def __add__(self, other: Sequence[str]) -> list[str]:   # list-like: concatenation gives a list
        return [*self, *other]

    def __radd__(self, other: Sequence[str]) -> list[str]:
        return [*other, *self]

    __hash__ = None   # type: ignore[assignment]   # mutable-compatible equality, like list

    def __repr__(self) -> str:
        return f"TextColumn({str(self.directory)!r}, {self.name!r}, n={len(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TextColumn, (str(self.directory), self.name))

    def to_list(self) -> list[str]:
        return self._block(0, len(self))

    def has_missing(self) -> bool:
        return self._null is not None and bool(np.asarray(self._null).any())

    def all_missing(self) -> bool:
        return self._null is not None and bool(np.asarray(self._null).all())


MANIFEST = "manifest.json"


def take_texts(texts: Sequence[str], idx: Sequence[int] | np.ndarray) -> list[str]:
    """``[texts[i] for i in idx]``; a :class:`TextColumn` answers with one gather of the rows' bytes."""
    if isinstance(texts, TextColumn):
        return texts[np.asarray(idx, dtype=np.int64)]
    return [texts[i] for i in idx]


def write_columns_manifest(directory: Path, sources: dict[str, str], counts: dict[str, int]) -> None:
    """Record which record file (by content hash) each part's columns were made from, and its row count."""
    (directory / MANIFEST).write_text(json.dumps({"sources_sha256": sources, "rows": counts}, indent=2) + "\n")


def read_columns_manifest(directory: Path) -> dict[str, Any] | None:
    p = directory / MANIFEST
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
