"""Checkpoints without pickle: tensors and plain data only, loaded with ``torch.load(weights_only=True)``.

A trainer's state holds numpy arrays (shortlists, clusters), tuples and numpy scalars next to tensors.
They are encoded into tensors, lists and tagged dicts before saving, so loading never runs code from the
file: a planted checkpoint is at worst refused, never executed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from xmc.errors import DataFormatError
from xmc.io import disk_full_error, fault_point, pid_alive

_NDARRAY, _TUPLE, _OBJECTS, _CSR = "__ndarray__", "__tuple__", "__ndarray_list__", "__csr_matrix__"


def encode_state(obj: Any) -> Any:
    """numpy arrays -> tagged tensors, tuples -> tagged lists, numpy scalars -> Python numbers (recursively)."""
    if isinstance(obj, torch.Tensor | str | bool | int | float) or obj is None:
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:  # ragged rows (e.g. per-chunk index lists)
            return {_OBJECTS: [encode_state(x) for x in obj.tolist()]}
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(obj)), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if sp.issparse(obj):
        m = obj.tocsr()
        return {_CSR: [encode_state(m.data), encode_state(m.indices), encode_state(m.indptr)], "shape": list(m.shape)}
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, int) else k: encode_state(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_state(x) for x in obj]}
    if isinstance(obj, list):
        return [encode_state(x) for x in obj]
    raise TypeError(f"checkpoint state cannot hold a {type(obj).__name__}")


def decode_state(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _NDARRAY in obj:
            return obj[_NDARRAY].numpy().astype(obj["dtype"], copy=False)
        if _TUPLE in obj:
            return tuple(decode_state(x) for x in obj[_TUPLE])
        if _CSR in obj:
            data, indices, indptr = (decode_state(x) for x in obj[_CSR])
            return sp.csr_matrix((data, indices, indptr), shape=tuple(obj["shape"]))
        if _OBJECTS in obj:
            arr = np.empty(len(obj[_OBJECTS]), dtype=object)
            arr[:] = [decode_state(x) for x in obj[_OBJECTS]]
            return arr
        return {k: decode_state(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_state(x) for x in obj]
    return obj


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write atomically: a kill leaves the previous checkpoint (or none), never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(encode_state(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        fault_point("checkpoint.before_replace")
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(e, path)
        if full is not None:   # one line naming the checkpoint; the previous checkpoint stays
            raise full from None
        raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only)."""
    path = Path(path)
    try:
        raw = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle refusals, truncation, foreign formats: all one message
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataFormatError(path, None, f"not a checkpoint this trainer can read safely ({first[:200]}); "
                                          "delete it to start afresh") from None
    if not isinstance(raw, dict):
        raise DataFormatError(path, None, "not a checkpoint (expected a mapping)")
    return decode_state(raw)


def clean_stale_temporaries(path: str | Path) -> None:
    """Temporaries of killed writers next to ``path`` (``.<name>.tmp-<pid>``) whose process is gone."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    for entry in path.parent.glob(f".{path.name}.tmp-*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        entry.unlink(missing_ok=True)
