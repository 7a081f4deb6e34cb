"""Checked reading of input files, line by line: the limits and the one-line errors every dataset reader shares.

A line is strict UTF-8 without a NUL byte, at most :func:`max_line_bytes` long, and a file expands to at most
:func:`max_input_bytes`; every problem is a :class:`~xmc.errors.DataFormatError` naming the file and line. Used by the
raw-layout readers (:mod:`xmc.data.formats`), the processed form (:mod:`xmc.data.dataset`) and the packages' inputs.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from xmc.errors import DataFormatError


def max_line_bytes() -> int:
    """Longest input line accepted (``XMC_MAX_LINE_BYTES``, default 4 MiB): a bound on memory per record."""
    return int(os.environ.get("XMC_MAX_LINE_BYTES", 4 << 20))


def max_input_bytes() -> int:
    """Most (decompressed) bytes read from one input file (``XMC_MAX_INPUT_BYTES``, default 64 GiB)."""
    return int(os.environ.get("XMC_MAX_INPUT_BYTES", 64 << 30))


def check_regular_file(path: Path) -> None:
    """An input must be a regular file: not a directory, a device (``/dev/zero``), a FIFO or a socket."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DataFormatError(path, None, "file not found") from None
    if stat.S_ISDIR(st.st_mode):
        raise DataFormatError(path, None, "is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise DataFormatError(path, None, "not a regular file (a device, FIFO or socket)")


def checked_lines(fh: BinaryIO, name: str | Path, empty: str | None = "empty file") -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, text without newline) of a binary stream (a file, gzip or standard input);
    strict UTF-8, no NUL byte.

    Lines longer than :func:`max_line_bytes` and streams that expand beyond :func:`max_input_bytes` are refused
    (a small gzip can expand to one line of gigabytes); a corrupt or truncated gzip stream is a one-line error at
    the line it stopped, and a stream without a line raises ``empty`` (None: an empty stream is no error)."""
    limit, total_limit = max_line_bytes(), max_input_bytes()
    n, total = 0, 0
    while True:
        try:
            raw = fh.readline(limit + 1)
        except (OSError, EOFError, zlib.error) as e:  # corrupt or truncated gzip
            what = "compressed data" if isinstance(fh, gzip.GzipFile) else "data"
            raise DataFormatError(name, n + 1, f"unreadable {what} ({e})") from None
        if not raw:
            break
        n += 1
        total += len(raw)
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise DataFormatError(name, n, f"line longer than {limit} bytes (XMC_MAX_LINE_BYTES)")
        if total > total_limit:
            raise DataFormatError(name, n, f"more than {total_limit} bytes (XMC_MAX_INPUT_BYTES)")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataFormatError(name, n, f"not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
        if "\x00" in line:
            raise DataFormatError(name, n, "NUL byte in text (a binary file?)")
        yield n, line.rstrip("\r\n")
    if n == 0 and empty is not None:
        raise DataFormatError(name, None, empty)


def iter_decoded_lines(path: Path, empty: str | None = "empty file") -> Iterator[tuple[int, str]]:
    """:func:`checked_lines` of a regular file, gzip by suffix."""
    check_regular_file(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        yield from checked_lines(fh, path, empty)


def read_json_lines(path: str | Path, empty: str | None = "empty file") -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for every non-blank line of a JSON-lines file; every record must be an object."""
    path = Path(path)
    out = []
    for n, line in iter_decoded_lines(path, empty):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(path, n, f"invalid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise DataFormatError(path, n, "JSON nested too deeply") from None
        except ValueError as e:  # e.g. an integer with thousands of digits
            raise DataFormatError(path, n, f"invalid JSON value ({str(e)[:80]})") from None
        if not isinstance(rec, dict):
            raise DataFormatError(path, n, "expected a JSON object")
        out.append((n, rec))
    return out


__all__ = ["check_regular_file", "checked_lines", "iter_decoded_lines", "max_input_bytes", "max_line_bytes",
           "read_json_lines"]
