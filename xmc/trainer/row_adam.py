"""Adam for large embedding tables with sparse (row) gradients, a cache-sized block of the table at a time.

The update is torch's :class:`~torch.optim.SparseAdam` (lazy Adam: only the rows a step touched move, with
the moments and bias correction of that rule), computed on the touched rows directly. torch's implementation builds
three sparse tensors per table per step and masks the dense moments with them (``sparse_mask``), which took most of
a bag-of-words or ASTRA step on a CPU (``bench/bow_training_speed.py``). Here the table is walked in blocks small
enough for the element-wise passes to stay in cache: where few rows of a block moved (a hashed bag-of-words table),
those rows and their moments are gathered, updated and written back; where most did (ASTRA's classifiers, whose
uniform negatives cover most labels every step), the block is updated in place, so each of the rows, moments and
update is read and written once. Both give the same bits (``tests/test_training.py``).

Where the machine has a C compiler, the update is instead one C loop over the touched rows (``xmc/native/row_adam.c``:
each of the rows, their moments and gradient read once and written once, on ``torch.get_num_threads()`` threads).
It keeps this rule and its roundings, except for a correctly rounded square root where torch's vectorised one can be
an ulp off (tested against the torch path). ``native=False`` or ``XMC_NATIVE=0`` keeps the torch path.

``moments="bf16"`` stores both moments in bfloat16: half the optimiser's memory (at 2^19 x 768 buckets, 3.2 GB ->
1.6 GB) and 20 instead of 28 bytes moved per element and step. Each step computes in float32 from the stored moments
and rounds the new ones stochastically (:func:`stochastic_bf16`), so a moment moves in expectation by its float32
update; rounding to nearest would freeze the second moment, whose per-step change (1 - b2 = 0.001 of it) is below
half a bfloat16 ulp (2^-9). The random bits come from :func:`rounding_keys` (a key and a table offset per row and
step) and :data:`ROUNDING_BITS`, so the C kernel and the torch path draw the same bits: m and v agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from xmc.native import row_adam as native_row_adam
from xmc.native import row_adam_bf16m as native_row_adam_bf16m


_BLOCK_ELEMENTS = 1 << 18   # 1 MB of float32 per tensor of a block: the block's m, v, g and update stay in cache
_DENSE_BLOCK_SHARE = 0.25   # a block of the table with at least this share of its rows touched is updated in place
MOMENTS = ("float32", "bf16")
_MASK32 = np.uint64(0xFFFFFFFF)


def _lowbias32(h: np.ndarray) -> np.ndarray:
    """C. Wellons' lowbias32 integer hash of 32-bit words held in uint64 (products of two words fit exactly)."""
    h = h & _MASK32
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x7FEB352D)) & _MASK32
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x846CA68B)) & _MASK32
    h ^= h >> np.uint64(16)
    return h


ROUNDING_WORDS = 4096   # the random table's length: 16 KB, in L1 during the C kernel's row loop
# the random words of the stochastic rounding (xmc/native/row_adam.c reads them through a pointer): a fixed table
ROUNDING_BITS = torch.from_numpy(_lowbias32(np.arange(ROUNDING_WORDS, dtype=np.uint64) + np.uint64(0x2545F491))
                                 .astype(np.int64))
ROUNDING_BITS_U32 = torch.from_numpy(ROUNDING_BITS.numpy().astype(np.uint32).view(np.int32))   # as C reads them


def rounding_keys(rows: torch.Tensor, seed: int) -> torch.Tensor:
    """Per row (int64 ids) its rounding key for a step: the low 32 bits XOR the table words of the row's elements,
    the high bits are the table offset of its element 0 (< :data:`ROUNDING_WORDS`). ``seed``: the step and table."""
    r = rows.detach().cpu().numpy().astype(np.uint64)
    s = _lowbias32(np.full(1, seed, dtype=np.uint64) ^ np.uint64(0x9E3779B9))
    key = _lowbias32(_lowbias32((r & _MASK32) ^ s) ^ (r >> np.uint64(32)))
    off = _lowbias32(key ^ np.uint64(0x85EBCA6B)) & np.uint64(ROUNDING_WORDS - 1)
    return torch.from_numpy(((off << np.uint64(32)) | key).astype(np.int64))


def rounding_words(keys: torch.Tensor, dim: int) -> torch.Tensor:
    """The random word (int64 holding 32 bits) of each element of the rows with these keys: rows x dim."""
    idx = ((keys[:, None] >> 32) + torch.arange(dim)) & (ROUNDING_WORDS - 1)
    return ROUNDING_BITS[idx] ^ (keys[:, None] & 0xFFFFFFFF)


def stochastic_bf16(x: torch.Tensor, random16: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to bfloat16, up with probability (dropped bits) / 2^16: ``random16`` (int64 in [0, 2^16))
    added below the kept bits, then truncated. Finite values (a carry into the exponent is then the right rounding)."""
    u = x.contiguous().view(torch.int32).to(torch.int64)   # sign-extended: the kept bits' int16 is then exact
    return ((u + random16) >> 16).to(torch.int16).view(torch.bfloat16)


def _adam_rows(p: torch.Tensor, m_all: torch.Tensor, v_all: torch.Tensor, g: torch.Tensor, rows: torch.Tensor | None,
               b1: float, b2: float, eps: float, step_size: float) -> None:
    """Lazy Adam on ``rows`` of ``p`` (all rows when None) with their gradient ``g``: the rows and their moments are
    gathered, updated and written back."""
    m = m_all.index_select(0, rows) if rows is not None else m_all
    v = v_all.index_select(0, rows) if rows is not None else v_all
    m.lerp_(g, 1 - b1)                            # m <- b1 m + (1 - b1) g
    v.mul_(b2).addcmul_(g, g, value=1 - b2)       # v <- b2 v + (1 - b2) g^2
    if rows is None:
        p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
        return
    m_all.index_copy_(0, rows, m)
    v_all.index_copy_(0, rows, v)
    update = m.div_(v.sqrt_().add_(eps))          # the block's copies are no longer needed: in place
    p.index_add_(0, rows, update, alpha=-step_size)


def _adam_slice(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, local: torch.Tensor, g_rows: torch.Tensor,
                b1: float, b2: float, eps: float, step_size: float) -> None:
    """Lazy Adam on the rows ``local`` of a contiguous slice of the table (``p``, ``m``, ``v`` are views), computed
    on the whole slice in place: untouched rows get a zero gradient and factors that leave them exactly as they
    were (moment weights 1, step 0), touched rows the same arithmetic as :func:`_adam_rows`. No gather or scatter
    of the moments: each of p, m, v is read and written once."""
    touched = torch.zeros(p.shape[0], 1, dtype=torch.bool, device=p.device)
    touched[local] = True
    g = torch.zeros_like(p)
    g.index_copy_(0, local, g_rows)
    m.lerp_(g, torch.where(touched, 1 - b1, 0.0).to(m.dtype))
    v.mul_(torch.where(touched, b2, 1.0).to(v.dtype)).addcmul_(g, g, value=1 - b2)
    update = torch.sqrt(v, out=g).add_(eps)
    torch.div(m, update, out=update)
    p.add_(update.mul_(touched), alpha=-step_size)


def _lazy_adam_sparse(p: torch.Tensor, m_all: torch.Tensor, v_all: torch.Tensor, rows: torch.Tensor,
                      vals: torch.Tensor, b1: float, b2: float, eps: float, step_size: float) -> None:
    """The update of the touched ``rows`` (increasing), a block of the table at a time: a block where many rows
    moved (ASTRA's classifiers: most of them every step) is updated in place over its slice, one where few did (a
    bag-of-words table) by gathering those rows."""
    block = max(1, _BLOCK_ELEMENTS // max(1, vals[0].numel()))
    bounds = torch.searchsorted(rows, torch.arange(0, p.shape[0] + block, block, device=rows.device)).tolist()
    pending = []   # sparse blocks' row spans, gathered in chunks of about ``block`` rows
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if b - a >= _DENSE_BLOCK_SHARE * block:
            lo, hi = i * block, min((i + 1) * block, p.shape[0])
            _adam_slice(p[lo:hi], m_all[lo:hi], v_all[lo:hi], rows[a:b] - lo, vals[a:b], b1, b2, eps, step_size)
        elif b > a:
            pending.append((a, b))
    start = None
    for j, (a, b) in enumerate(pending):   # consecutive sparse spans merged up to ``block`` rows per gather
        start = a if start is None else start
        last = j + 1 == len(pending)
        if last or pending[j + 1][0] != b or pending[j + 1][1] - start > block:
            _adam_rows(p, m_all, v_all, vals[start:b], rows[start:b], b1, b2, eps, step_size)
            start = None


def _adam_rows_bf16(p: torch.Tensor, m_all: torch.Tensor, v_all: torch.Tensor, g: torch.Tensor, rows: torch.Tensor,
                    keys: torch.Tensor, b1: float, b2: float, eps: float, step_size: float) -> None:
    """Lazy Adam on ``rows`` of a 2-D ``p`` whose moments are bfloat16, a cache-sized chunk of rows at a time: the
    float32 update of :func:`_adam_rows`, the new moments rounded stochastically with the rows' ``keys``, and the step
    taken from the rounded moments (as the C kernel does)."""
    dim = p.shape[1]
    chunk = max(1, _BLOCK_ELEMENTS // max(1, dim))
    for a in range(0, rows.numel(), chunk):
        r, k, gc = rows[a: a + chunk], keys[a: a + chunk], g[a: a + chunk]
        m = m_all.index_select(0, r).float()
        v = v_all.index_select(0, r).float()
        m.lerp_(gc, 1 - b1)
        v.mul_(b2).addcmul_(gc, gc, value=1 - b2)
        words = rounding_words(k, dim)
        mq, vq = stochastic_bf16(m, words & 0xFFFF), stochastic_bf16(v, words >> 16)
        m_all.index_copy_(0, r, mq)
        v_all.index_copy_(0, r, vq)
        update = mq.float().div_(vq.float().sqrt_().add_(eps))
        p.index_add_(0, r, update, alpha=-step_size)


def _dense_rows(p: torch.Tensor) -> int:
    """The rows a dense gradient of ``p`` is updated as (bfloat16 moments draw their rounding bits per row): its first
    dimension, or one row for a scalar or vector."""
    return p.shape[0] if p.dim() >= 2 else 1


def sorted_unique_rows(g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(rows, values) of a sparse row gradient whose rows are already strictly increasing (one per row, as
    :func:`~xmc.trainer.candidate_scores.candidate_scores` makes them; autograd drops the coalesced flag when it
    stores a gradient), else (None, None): then it needs a coalesce (a sort and a copy of the values)."""
    if g.is_coalesced():
        return g.indices()[0], g.values()
    rows = g._indices()[0]
    if rows.numel() and g._values().shape[0] == rows.numel() and bool((rows[1:] > rows[:-1]).all()):
        return rows, g._values()
    return None, None


class RowAdam(torch.optim.Optimizer):
    """Lazy Adam for parameters whose gradients are sparse COO row gradients (``nn.Embedding(sparse=True)``,
    ``nn.EmbeddingBag(sparse=True)``); a dense gradient updates every row (then it is plain Adam).

    ``moments``: ``float32``, or ``bf16`` (stored in bfloat16, rounded stochastically: the module's docstring)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, native: bool = True, moments: str = "float32") -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid RowAdam settings: lr={lr}, betas={betas}, eps={eps}")
        if moments not in MOMENTS:
            raise ValueError(f"RowAdam moments must be one of {', '.join(MOMENTS)} (got {moments!r})")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        self.moments = moments
        self._kernel = self._kernel_bf16m = None
        if native:
            self._kernel = native_row_adam()
            self._kernel_bf16m = native_row_adam_bf16m() if moments == "bf16" else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, which casts the moments to the parameters' dtype; bfloat16 moments are cast back (exactly)."""
        super().load_state_dict(state_dict)
        if self.moments == "bf16":
            for state in self.state.values():
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in state:
                        state[key] = state[key].to(torch.bfloat16).contiguous()

    @property
    def native(self) -> bool:
        """Whether steps run the C kernel (else the torch path)."""
        return self._kernel is not None

    def _native_step(self, p: torch.Tensor, m_all: torch.Tensor, v_all: torch.Tensor, rows: torch.Tensor | None,
                     vals: torch.Tensor, b1: float, b2: float, eps: float, step_size: float,
                     keys: torch.Tensor | None) -> bool:
        """The update through the C kernel; False (nothing done) where it does not apply: not float32 on the CPU,
        or not contiguous. ``keys``: the rows' rounding keys (bfloat16 moments)."""
        kernel = self._kernel if keys is None else self._kernel_bf16m
        if kernel is None or p.dtype != torch.float32 or p.device.type != "cpu" or vals.dtype != torch.float32 \
                or not (p.is_contiguous() and m_all.is_contiguous() and v_all.is_contiguous()):
            return False
        vals = vals.contiguous()
        if rows is None:
            n_rows, dim, rows_ptr = _dense_rows(p), p.numel() // _dense_rows(p), None
        else:
            rows = rows.contiguous().to(torch.int64)
            n_rows, dim, rows_ptr = rows.numel(), vals[0].numel(), rows.data_ptr()
        threads = torch.get_num_threads()
        if keys is None:
            kernel(p.data_ptr(), m_all.data_ptr(), v_all.data_ptr(), rows_ptr, vals.data_ptr(), n_rows, dim,
                   1 - b1, b2, 1 - b2, eps, step_size, threads)
        else:
            kernel(p.data_ptr(), m_all.data_ptr(), v_all.data_ptr(), rows_ptr, vals.data_ptr(), n_rows, dim,
                   1 - b1, b2, 1 - b2, eps, step_size, keys.data_ptr(), ROUNDING_BITS_U32.data_ptr(), threads)
        return True

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        table = 0   # the parameter's place in the optimiser: its own rounding bits
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                table += 1
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    rows, vals = sorted_unique_rows(g)
                    if rows is None:
                        g = g.coalesce()  # duplicate rows summed: the update is non-linear in the gradient
                        rows, vals = g.indices()[0], g.values()
                    if vals.numel() == 0:
                        continue
                else:
                    rows, vals = None, g
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    dtype = torch.bfloat16 if self.moments == "bf16" else p.dtype
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
                state["step"] += 1
                step = state["step"]
                step_size = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
                m_all, v_all = state["exp_avg"], state["exp_avg_sq"]
                keys = None
                if m_all.dtype == torch.bfloat16:
                    seed = (step * 0x9E3779B1 + table * 0x85EBCA77) & 0xFFFFFFFF
                    keys = rounding_keys(rows if rows is not None else torch.arange(_dense_rows(p)), seed)
                if self._native_step(p, m_all, v_all, rows, vals, b1, b2, eps, step_size, keys):
                    continue
                if keys is not None:   # the torch path of bfloat16 moments, on the rows of a 2-D view
                    n = p.shape[0] if rows is not None else _dense_rows(p)
                    _adam_rows_bf16(p.view(n, -1), m_all.view(n, -1), v_all.view(n, -1),
                                    vals.reshape(-1, p.numel() // n), rows if rows is not None else torch.arange(n),
                                    keys, b1, b2, eps, step_size)
                    continue
                if rows is None:
                    _adam_rows(p, m_all, v_all, vals, None, b1, b2, eps, step_size)
                else:
                    # a block at a time, so its moments and update stay in cache between the element-wise passes
                    _lazy_adam_sparse(p, m_all, v_all, rows, vals, b1, b2, eps, step_size)
        return loss
