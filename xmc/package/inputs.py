"""Texts to predict, streamed: a ``.txt`` (one text per line) or JSON lines (``{"id"?, "text"}``), from a file
or standard input, with the same limits as the dataset readers (line length, total size, UTF-8, no NUL)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from xmc.data.lines import checked_lines, iter_decoded_lines, parse_json_line   # the dataset readers' limits and errors
from xmc.errors import ConfigError, DataFormatError

FORMATS = ("txt", "jsonl")
EMPTY = "empty input: no texts to predict"


def input_format(path: str, fmt: str = "auto") -> str:
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ConfigError(f"input format must be auto, txt or jsonl (got {fmt!r})")
        return fmt
    return "jsonl" if str(path).endswith((".jsonl", ".jsonl.gz", ".ndjson")) else "txt"


def _records(lines: Iterator[tuple[int, str]], name: str, fmt: str) -> Iterator[tuple[str, str]]:
    for n, line in lines:
        if fmt == "txt":
            if not line.strip():
                raise DataFormatError(name, n, "empty text (one text per line)")
            yield str(n), line.strip()   # the line number, as errors count lines
            continue
        if not line.strip():
            continue  # blank lines between JSON records are harmless
        rec = parse_json_line(name, n, line)   # strict as the dataset readers: no duplicate key, NUL or lone surrogate
        if not isinstance(rec, dict):
            raise DataFormatError(name, n, "expected a JSON object {\"id\"?, \"text\"}")
        text = rec.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DataFormatError(name, n, "missing or empty 'text'")
        uid = rec.get("id", n)
        if not isinstance(uid, (str, int)) or isinstance(uid, bool):
            raise DataFormatError(name, n, "'id' must be a string or an integer")
        yield str(uid), text.strip()


def iter_input(path: str | Path, fmt: str = "auto") -> Iterator[tuple[str, str]]:
    """(id, text) pairs from ``path`` (``-`` = standard input), streamed; ids default to the line number (from 1)."""
    name = str(path)
    fmt = input_format(name, fmt)
    if name == "-":
        yield from _records(checked_lines(sys.stdin.buffer, "<stdin>", EMPTY), "<stdin>", fmt)
    else:
        yield from _records(iter_decoded_lines(Path(name), EMPTY), name, fmt)


__all__ = ["FORMATS", "input_format", "iter_input"]
