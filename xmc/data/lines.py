"""Checked reading of input files, line by line: the limits and the one-line errors every dataset reader shares.

A line is strict UTF-8 without a NUL byte, at most :func:`max_line_bytes` long, and a file expands to at most
:func:`max_input_bytes`; a UTF-8 byte order mark opening the first line (what Windows editors write) is dropped, never
part of the first record. Every problem is a :class:`~xmc.errors.DataFormatError` naming the file and line. Used by the
raw-layout readers (:mod:`xmc.data.formats`), the processed form (:mod:`xmc.data.dataset`) and the packages' inputs.

A JSON-lines record (:func:`parse_json_line`) is one strict JSON value: no ``NaN``/``Infinity`` (nor a number that
overflows to it), no key given twice in an object (``json`` would keep the last silently), and no string holding
``\\u0000`` or a lone surrogate such as ``\\ud800`` (neither is text: a NUL, and a code point UTF-8 cannot encode).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
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
        if n == 1 and line.startswith("\ufeff"):   # a byte order mark is an encoding marker, not the first text
            line = line[1:]
        yield n, line.rstrip("\r\n")
    if n == 0 and empty is not None:
        raise DataFormatError(name, None, empty)


def iter_decoded_lines(path: Path, empty: str | None = "empty file") -> Iterator[tuple[int, str]]:
    """:func:`checked_lines` of a regular file, gzip by suffix."""
    check_regular_file(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        yield from checked_lines(fh, path, empty)


class _Refused(ValueError):
    """Raised from the decoder's hooks: a record that parses but is not strict JSON text (the message says why)."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):   # 1e400: valid JSON syntax that no float holds
        raise _Refused(f"number {text[:40]} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key[:40]!r} in a JSON object")
            seen.add(key)
    return out


# the C scanner runs both; only the strict one pays for a Python call per object (about +40% on a record)
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_STRICT_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float,
                                   object_pairs_hook=_unique_keys)
# every key in JSON text ends with '"' [whitespace] ':' (a value string matches only where it holds '\":')
_KEY_END = re.compile(r'"[ \t\r\n]*:')
# the only way to a NUL or a surrogate in a string of a valid UTF-8 line
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


def _is_plain(line: str, value: Any) -> bool:
    """True when ``line`` provably has no duplicate key and no NUL / surrogate escape, from counts alone.

    A key count of the text equal to the top-level object's size leaves no room for a duplicate at any depth (each
    parsed key comes from at least one key in the text). ``count(":")`` bounds the text's keys from above and is the
    cheapest bound; a line with colons inside its strings takes the exact regex count. A NUL or a surrogate in a
    string of a valid UTF-8 line can only come from a ``\\u`` escape."""
    if type(value) is not dict:
        return False
    if line.count(":") != len(value) and len(_KEY_END.findall(line)) != len(value):
        return False
    return _SUSPECT_ESCAPE.search(line) is None   # a regex's literal-prefix search: 2x faster than "\\u" in line


def _strict_problem(line: str) -> str | None:
    """Why ``line`` is not strict JSON text (a duplicate key, a NUL or a lone surrogate in a string), or None."""
    try:
        stack = [_STRICT_DECODER.decode(line)]
    except _Refused as e:
        return str(e)
    while stack:   # iterative: a record nested as deep as the decoder allows must not overflow the stack here
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and (m := _NOT_TEXT.search(v)):
            ch = m.group()
            if ch == "\x00":
                return "NUL character (\\u0000) in a JSON string: not text"
            return f"lone surrogate (\\u{ord(ch):04x}) in a JSON string: not text, no UTF-8 encoding"
    return None


def parse_json_line(path: str | Path, n: int, line: str) -> Any:
    """The JSON value of line ``n`` of ``path``, strictly (see the module docstring); one-line errors."""
    try:
        value = _DECODER.decode(line)
    except _Refused as e:
        raise DataFormatError(path, n, f"invalid JSON ({e})") from None
    except json.JSONDecodeError as e:
        raise DataFormatError(path, n, f"invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise DataFormatError(path, n, "JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer with thousands of digits
        raise DataFormatError(path, n, f"invalid JSON value ({str(e)[:80]})") from None
    # the exact check (a second decode) only where the cheap counts cannot rule the problems out
    if not _is_plain(line, value) and (problem := _strict_problem(line)) is not None:
        raise DataFormatError(path, n, f"invalid JSON ({problem})")
    return value


def read_json_lines(path: str | Path, empty: str | None = "empty file") -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for every non-blank line of a JSON-lines file; every record must be an object, parsed
    strictly by :func:`parse_json_line`."""
    path = Path(path)
    out = []
    for n, line in iter_decoded_lines(path, empty):
        if not line or line.isspace():   # a blank line (isspace stops at the first other character; strip copies)
            continue
        rec = parse_json_line(path, n, line)
        if not isinstance(rec, dict):
            raise DataFormatError(path, n, "expected a JSON object")
        out.append((n, rec))
    return out


__all__ = ["check_regular_file", "checked_lines", "iter_decoded_lines", "max_input_bytes", "max_line_bytes",
           "parse_json_line", "read_json_lines"]
