"""Atomic output helpers: a stage either writes all of its outputs or none.

Outputs are written into a temporary sibling and moved into place with ``os.replace``,
so a crash or a bad input never leaves a half-written file for DVC to cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file that replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        kwargs = {} if "b" in mode else {"encoding": encoding}
        with open(tmp, mode, **kwargs) as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically, pretty-printed and with a trailing newline (diff-friendly)."""
    with atomic_file(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=False)
        fh.write("\n")


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def sha256_files(paths: list[Path]) -> str:
    """Content hash over files in the given order (names included, so a rename changes it)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def save_npz_deterministic(path: str | Path, compress: bool = True, **arrays: Any) -> None:
    """Like ``np.savez_compressed`` but byte-identical for identical arrays.

    numpy stamps each zip entry with the current time, so the same content hashes
    differently on every run and DVC would rerun everything downstream.
    """
    import zipfile

    import numpy as np

    with atomic_file(path, "wb") as fh:
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
            for name, arr in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
                with zf.open(info, "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, np.asanyarray(arr), allow_pickle=False)


def save_csr(path: str | Path, matrix: Any) -> None:
    """Deterministic CSR writer readable by ``scipy.sparse.load_npz``."""
    import numpy as np

    m = matrix.tocsr()
    m.sort_indices()
    save_npz_deterministic(path, indices=m.indices, indptr=m.indptr, format=np.array(b"csr"),
                           shape=np.array(m.shape), data=m.data)
