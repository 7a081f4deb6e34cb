"""Atomic output helpers: a stage either writes all of its outputs or none.

Outputs are written into a temporary sibling and moved into place with ``os.replace``,
so a crash or a bad input never leaves a half-written file for DVC to cache.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile
import zipfile
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from xmc.errors import ConfigError, DataFormatError
from xmc.yaml12 import fast_yaml_loader

try:   # optional (a dependency of prefect): the parser of large JSON files where it is installed
    import orjson
except ImportError:
    orjson = None  # type: ignore[assignment]

_protected_inputs: set[Path] = set()


def protect_inputs(*paths: str | Path | None) -> None:
    """Declare input paths no output may be, contain or lie inside (the dataset directory, graph sources)."""
    for p in paths:
        if p:
            _protected_inputs.add(Path(p).resolve())


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


_fault_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Fault injection for the kill tests: ``XMC_KILL_AT=<name>[:<n>]`` kills the process with SIGKILL the
    n-th time (default: first) it reaches this point."""
    want = os.environ.get("XMC_KILL_AT")
    if not want or not want.startswith(name):
        return
    target, _, nth = want.partition(":")
    if target != name:
        return
    _fault_hits[name] = _fault_hits.get(name, 0) + 1
    if _fault_hits[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def pipeline_files(repo: Path) -> list[Path]:
    """The product's DVC pipeline file (``dvc.yaml``), whose declared inputs and outputs an output must respect."""
    return [p for p in [repo / "dvc.yaml"] if p.is_file()]


def stage_from_address(address: str) -> str:
    """A stage's name without its pipeline file: ``lab/dvc.yaml:run@astra_sgd`` -> ``run@astra_sgd`` (DVC prints
    and runs addresses)."""
    return address.rsplit(":", 1)[-1]


def _pipeline_stamp(repo: Path) -> tuple[tuple[str, float], ...]:
    return tuple((str(p), p.stat().st_mtime) for p in pipeline_files(repo))


@lru_cache(maxsize=8)
def _declared_paths(repo: Path, stamp: tuple[tuple[str, float], ...]
                    ) -> tuple[frozenset[Path], tuple[tuple[Path, str], ...]]:
    """(external inputs, (out, stage) pairs) declared in the pipeline files (``stamp``: their paths and mtimes),
    ``${...}`` resolved from params.yaml and foreach keys, paths taken from each stage's ``wdir``.

    Only what can be resolved cheaply is kept: paths with unresolved templates are dropped."""
    def load(path: Path) -> dict:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=fast_yaml_loader()) or {}

    try:
        files = [(Path(f), load(Path(f)).get("stages") or {}) for f, _ in stamp]
        params = load(repo / "params.yaml")
    except (OSError, yaml.YAMLError):
        return frozenset(), ()

    def lookup(expr: str) -> Any:
        node: Any = params
        for part in expr.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def resolve(text: str, key: str | None) -> str | None:
        def sub(m: re.Match) -> str:
            expr = m.group(1).strip()
            v = key if expr in ("key", "item") else lookup(expr)
            if v is None or isinstance(v, dict | list):
                raise KeyError(expr)
            return str(v)
        try:
            return re.sub(r"\$\{([^}]*)\}", sub, text)
        except KeyError:
            return None

    deps: set[Path] = set()
    outs: set[tuple[Path, str]] = set()
    for path, stages in files:
        for name, st in stages.items():
            if not isinstance(st, dict):
                continue
            body, keys = st, [None]
            if "foreach" in st:
                fe = st["foreach"]
                fe = lookup(fe[2:-1]) if isinstance(fe, str) and fe.startswith("${") else fe
                keys = list(fe) if isinstance(fe, dict | list) else []
                body = st.get("do") or {}
            wdir = path.parent / str(body.get("wdir") or ".")
            for key in keys:
                for field in ("deps", "outs", "metrics", "plots"):
                    for entry in body.get(field) or []:
                        raw = next(iter(entry)) if isinstance(entry, dict) else entry
                        if isinstance(raw, str) and (r := resolve(raw, None if key is None else str(key))):
                            p = (wdir / r).resolve()
                            if field == "deps":
                                deps.add(p)
                            else:
                                outs.add((p, f"{name}@{key}" if key is not None else name))
    # an external input: a dep no stage writes (not an output, not inside one, not a folder of outputs); by set
    # lookups over path prefixes, not a scan of every (dep, out) pair
    out_paths = {o for o, _ in outs}
    out_folders = {a for o in out_paths for a in o.parents}
    inputs = frozenset(d for d in deps if d not in out_folders and not ({d, *d.parents} & out_paths))
    return inputs, tuple(sorted(outs))


def _str_within(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/")


def _is_within(a: Path, b: Path) -> bool:
    """a == b or a lies inside b."""
    return _str_within(str(a), str(b))


def check_output_path(path: str | Path) -> Path:
    """Refuse an output path that would overwrite or swallow something it must not (before anything is deleted):
    the repository root or an ancestor of it, a directory holding a repository, a declared input (or a path
    containing one or inside one), or a directory that holds other declared outputs."""
    target = Path(path).resolve()
    repo = Path.cwd().resolve()
    why = None
    if target == Path(target.anchor) or target == Path.home().resolve() or _is_within(repo, target):
        why = "it is the repository root, or contains it"
    elif target.is_dir() and any((target / m).exists() for m in (".git", "dvc.yaml", ".dvc")):
        why = "it holds a repository"
    else:
        deps: frozenset[Path] = frozenset()
        outs: tuple[tuple[Path, str], ...] = ()
        if (repo / "dvc.yaml").is_file():
            deps, outs = _declared_paths(repo, _pipeline_stamp(repo))
        inputs = set(deps) | _protected_inputs
        hit = next((i for i in sorted(inputs) if _is_within(target, i) or _is_within(i, target)), None)
        if hit is not None:
            why = f"it is, contains or lies inside the input {hit}"
        else:
            # a folder holding the outputs of several stages (data/, models/): replacing it deletes theirs
            t = str(target)
            inner = sorted({st for o, st in outs if str(o) != t and _str_within(str(o), t)})
            if len(inner) > 1:
                why = f"it holds the outputs of other stages ({', '.join(inner[:3])}{', ...' if len(inner) > 3 else ''})"
    if why:
        raise ConfigError(f"{path}: refusing to write an output here: {why} (check the output paths in params.yaml)")
    return target


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _recover_interrupted(path: Path) -> None:
    """Clean up after a writer that was killed: remove its temporaries; if it died between its two renames
    (the old output moved aside, the new one not yet in place), put the old output back."""
    parent = path.parent
    if not parent.is_dir():
        return
    pat = re.compile(rf"^\.{re.escape(path.name)}\.(tmp|old)-(\d+)-")
    for entry in sorted(parent.iterdir()):
        m = pat.match(entry.name)
        if not m or pid_alive(int(m.group(2))):
            continue
        if m.group(1) == "old" and not path.exists() and not path.is_symlink():
            os.replace(entry, path)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full_error(e: BaseException, path: str | Path) -> OSError | None:
    """The error to report when writing ``path`` failed for want of space: an ``OSError`` naming ``path`` (a write
    error carries no file name of its own), also for torch's writer, which reports a full disk as a RuntimeError
    ("file write failed", "unexpected pos ..."): then the disk's free space decides. None for any other failure."""
    if isinstance(e, OSError) and e.errno in _DISK_FULL:
        # an inner writer's error (a checkpoint written inside a model's folder block) keeps the file it names
        return e if e.filename else OSError(e.errno, os.strerror(e.errno), str(path))
    if isinstance(e, RuntimeError | OSError):
        try:
            full = shutil.disk_usage(Path(path).parent).free < (1 << 20)
        except OSError:
            full = False
        if full:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block succeeds.

    The path is checked first (:func:`check_output_path`); leftovers of a killed earlier writer are cleaned
    up; the directory gets the umask's permissions like any ``mkdir``."""
    path = Path(path)
    check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover_interrupted(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: refusing to replace a file with a directory")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full_error(e, path)
        if full is not None:   # one line naming what could not be written; the previous output is untouched
            raise full from None
        raise
    fault_point("atomic_dir.before_replace")
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}-x")
        os.replace(path, old)
        fault_point("atomic_dir.between_renames")
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file that replaces ``path`` only if the block succeeds (umask permissions)."""
    path = Path(path)
    check_output_path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: refusing to replace a directory with a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover_interrupted(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    try:
        kwargs = {} if "b" in mode else {"encoding": encoding}
        with open(tmp, mode, **kwargs) as fh:
            yield fh
        fault_point("atomic_file.before_replace")
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        full = disk_full_error(e, path)
        if full is not None:
            raise full from None
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
    with atomic_file(path, "wb") as fh:
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
            for name, arr in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
                with zf.open(info, "w", force_zip64=True) as entry:
                    np.lib.format.write_array(entry, np.asanyarray(arr), allow_pickle=False)


def save_csr(path: str | Path, matrix: Any) -> None:
    """Deterministic CSR writer readable by ``scipy.sparse.load_npz``."""
    m = matrix.tocsr()
    m.sort_indices()
    save_npz_deterministic(path, indices=m.indices, indptr=m.indptr, format=np.array(b"csr"),
                           shape=np.array(m.shape), data=m.data)


def load_tensors(path: str | Path, map_location: str = "cpu", mmap: bool = False) -> Any:
    """A saved state dict (tensors and plain data) with ``weights_only=True``; a corrupt, truncated or
    pickled-object file is a one-line :class:`~xmc.errors.DataFormatError`, never code that runs. ``mmap``: the
    tensors are views of the memory-mapped file (read-only use: pages are read when touched, so a cold load of a
    large table costs what a prediction reads of it)."""
    import torch   # imported here: xmc.io serves the stages that never load torch (ingest, validate, tfidf, ...)

    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "missing from the model folder")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - unpickling refusals, zip errors, truncation
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise DataFormatError(path, None, f"not a tensor file this package can load safely ({first})") from None


# Above this size a JSON file is parsed with orjson where it is installed (a dependency of prefect): a TF-IDF
# vocabulary of 19.3 million terms (509 MB) takes 14.8 s instead of 23.0 s. What orjson refuses (NaN, huge ints,
# malformed text) goes through json, which accepts the first two and names the line of the third.
_LARGE_JSON = 16 << 20
_UNPARSED = object()


def _fast_json(path: Path) -> Any:
    if orjson is None:
        return _UNPARSED
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        return _UNPARSED


def read_json_file(path: str | Path, what: str = "a JSON file") -> Any:
    """JSON from ``path`` with a one-line error naming the file (and line) when it is missing or malformed."""
    path = Path(path)
    try:
        if path.stat().st_size > _LARGE_JSON:
            parsed = _fast_json(path)
            if parsed is not _UNPARSED:
                return parsed
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFormatError(path, None, f"missing ({what})") from None
    except (IsADirectoryError, UnicodeDecodeError) as e:
        raise DataFormatError(path, None, f"not {what} ({type(e).__name__})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFormatError(path, e.lineno, f"malformed JSON ({e.msg}); not {what}") from None
    except (RecursionError, ValueError) as e:
        raise DataFormatError(path, None, f"not {what} ({type(e).__name__})") from None
