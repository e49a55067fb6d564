"""The arithmetic every backend follows, bit for bit (docs/numerics.md), written in NumPy.

A float reduction is not associative, so its order is part of its definition. A reduction
of n elements (several reduced axes count as one, in row-major order) is:

- n ≤ CHUNK: LANES lanes; element i goes to lane i mod LANES, and each lane combines its
  elements left to right. The lane results are then combined by a halving tree: for
  s = LANES/2, …, 2, 1, lane j ← lane j ⊕ lane j+s for j < s. Lane 0 is the result. (An empty
  lane holds the operation's identity: -0.0 for sums, which changes no value, ∓inf for
  max/min.) This is one warp's shuffle-down tree on a GPU, and two AVX-512 registers of 16
  lanes then a horizontal tree on a CPU.
- n > CHUNK: consecutive chunks of CHUNK elements are reduced as above, and their results
  are reduced again by the same rule.

`max`/`min` combine with `maximum`/`minimum` below (NaN wins; of two equal values, the left).
A contraction (`@`, `einsum`) accumulates each output element in the order of its contracted
index (row-major over the contracted letters), starting from -0.0, with a fused
multiply-add: acc = fma(a, b, acc). The reference computes fma exactly for f32 and f16 (the
product is exact in f64; the sum is rounded to odd in f64, then to the target type); for f64
it rounds twice (a * b + acc), which the compiled backends' true fma can beat by an ulp.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

LANES = 32
CHUNK = 4096


def maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a if a ≥ b or a is NaN, else b: NaN propagates, and of -0.0 and 0.0 the left wins."""
    return np.where((a >= b) | np.isnan(a), a, b)


def minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where((a <= b) | np.isnan(a), a, b)


def reduce(x: np.ndarray, axes: tuple[int, ...], combine: Callable, identity: float) -> np.ndarray:
    """x reduced over axes in the canonical order (the reduced axes dropped)."""
    kept = [i for i in range(x.ndim) if i not in axes]
    x = np.transpose(x, kept + list(axes))
    flat = x.reshape(x.shape[:len(kept)] + (math.prod(x.shape[len(kept):]),))   # (-1 fails on 0 rows)
    if flat.shape[-1] == 0:
        return np.full(flat.shape[:-1], identity, dtype=x.dtype)
    while flat.shape[-1] > CHUNK:
        flat = _reduce_chunks(flat, CHUNK, combine, identity)
    return _lanes(flat, combine, identity)


def _pad(x: np.ndarray, multiple: int, identity: float) -> np.ndarray:
    extra = -x.shape[-1] % multiple
    if not extra:
        return x
    pad = np.full(x.shape[:-1] + (extra,), identity, dtype=x.dtype)
    return np.concatenate([x, pad], axis=-1)


def _reduce_chunks(x: np.ndarray, size: int, combine: Callable, identity: float) -> np.ndarray:
    x = _pad(x, size, identity)
    chunks = x.reshape(x.shape[:-1] + (x.shape[-1] // size, size))
    return _lanes(chunks, combine, identity)


def _lanes(x: np.ndarray, combine: Callable, identity: float) -> np.ndarray:
    """Reduce the last axis (at most CHUNK long): lanes left to right, then the halving tree."""
    x = _pad(x, LANES, identity)
    rows = x.reshape(x.shape[:-1] + (x.shape[-1] // LANES, LANES))
    acc = rows[..., 0, :]
    for k in range(1, rows.shape[-2]):
        acc = combine(acc, rows[..., k, :])
    s = LANES // 2
    while s:
        acc = combine(acc[..., :s], acc[..., s:2 * s])
        s //= 2
    return acc[..., 0]


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c rounded once (exactly for f32 and f16; f64 rounds twice, see above)."""
    dtype = np.result_type(a, b, c)
    with np.errstate(all="ignore"):                          # inf and NaN are values here
        return _fma(a, b, c, dtype)


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype) -> np.ndarray:
    if dtype == np.float64:
        return a * b + c
    p = a.astype(np.float64) * b.astype(np.float64)          # exact: 2 * 24 bits < 53
    c64 = np.asarray(c, dtype=np.float64)
    s = p + c64
    v = s - p                                                 # TwoSum: s + e == p + c exactly
    e = (p - (s - v)) + (c64 - v)
    bits = s.view(np.int64)
    inexact_even = (e != 0) & ((bits & 1) == 0) & np.isfinite(s)
    toward = np.where((e > 0) == (s > 0), 1, -1)
    s = np.where(inexact_even, bits + toward, bits).view(np.float64)   # rounded to odd
    return s.astype(dtype)


def contract(operands: list[np.ndarray], n_contracted: int) -> np.ndarray:
    """Operands broadcast to one shape (output axes, then contracted axes) combined as
    acc = fma(x1 * … * x(n-1), xn, acc) over the contracted index in row-major order; a single
    operand is summed: acc = acc + x1."""
    shape = np.broadcast_shapes(*(x.shape for x in operands))
    out_shape, inner = shape[:len(shape) - n_contracted], shape[len(shape) - n_contracted:]
    size = int(np.prod(inner, dtype=np.int64))
    flat = [np.broadcast_to(x, shape).reshape(out_shape + (size,)) for x in operands]
    acc = np.full(out_shape, -0.0, dtype=np.result_type(*operands))
    for k in range(size):
        terms = [x[..., k] for x in flat]
        if len(terms) == 1:
            acc = acc + terms[0]
            continue
        product = terms[0]
        for t in terms[1:-1]:
            product = product * t
        acc = fma(product, terms[-1], acc)
    return acc
