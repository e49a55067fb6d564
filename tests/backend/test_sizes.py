"""Every kernel class at every size, from 1 to 10^7 elements, on 1, 2 and 3 threads, each case
in a child process (a crash or a hang is the case's failure, not the run's end).

Each case is checked twice:

- the CPU's bits against the definition's, on every thread count (the comparison of
  tests/backend/test_random_programs.py: the interpreter's bits, the math functions compiled
  alone where the interpreter's are NumPy's), and the same bits on every thread count;
- the interpreter's value (the definition, so also the CPU's) against NumPy in float64, within
  the error the documented order allows (docs/numerics.md): a sum in the canonical order adds
  each element through at most d = L·(⌈4096/32⌉ + 5) additions, L = the chunk levels, so
  |error| ≤ γ(d)·Σ|x| with γ(d) = d·u/(1 − d·u) — 264·u·Σ|x| at 10^7 elements in float32,
  where a plain n·u·Σ|x| would allow 0.6·Σ|x|; an fma product chain over K terms is within
  γ(K)·Σ|a·b|; gathers, maxima and windows are exact.

The default run is a representative sample (DEFAULT: every kind at 1 and 4097 elements, the
empty reductions, sum at 200,000 and 1,000,000, long rows and axes, degenerate products);
DSLC_SLOW=1 adds every kind at every size up to 10^7 (marked slow).
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import full_range, isolated, slow

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_random_programs as fuzz  # noqa: E402

from ir import interp  # noqa: E402
from ir.core import Builder, tensor_type  # noqa: E402
from ir.ops.base import dtype_name  # noqa: E402
from ir.ops.shape import SliceSpec  # noqa: E402

U32 = 2.0 ** -24
SLOW = 10 ** 6                   # rows at least this long: one row, not two

SIZES = [1, 2, 3, 31, 4096, 4097, 65_537, 200_000, 1_000_000, 10_000_000]


def gamma(d: int, u: float = U32) -> float:
    return d * u / (1 - d * u)


def depth(n: int) -> int:
    """The most additions on one element's way to a canonical sum of n (docs/numerics.md)."""
    levels, m = 1, n
    while m > 4096:
        m, levels = math.ceil(m / 4096), levels + 1
    return levels * (4096 // 32 + 5)


def split(n: int) -> tuple[int, int]:
    """n as rows × columns, both as near √n as n's divisors allow."""
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return a, n // a


# ---------------------------------------------------------------- the cases

def build(shapes_dtypes, body):
    b = Builder()
    params = [b.param(tensor_type(dt, s)) for s, dt in shapes_dtypes]
    return b.finish(list(body(b, *params)))


def normals(rng, *shape, dtype=np.float32):
    return (rng.standard_normal(shape) * 3).astype(dtype)


# the integer and bool reductions' kinds, and any and all: (reduction, NumPy dtype, shape at
# size n, axis)
EXACT_REDUCTIONS = {"isum": ("sum", "int32", lambda n: (n,), None),
                    "imax_rows": ("max", "int64", lambda n: (3, n), 1),
                    "uprod_columns": ("prod", "uint32", lambda n: (n, 3), 0),
                    "bmin": ("min", "bool", lambda n: (n,), None),
                    "fany": ("any", "float32", lambda n: (n,), None),
                    "iall_rows": ("all", "int64", lambda n: (3, n), 1)}


def case(kind: str, n: int):
    """(function, inputs, check of the interpreter's results against NumPy in float64)."""
    rng = np.random.default_rng(n)
    if kind == "map":
        x = normals(rng, n)
        fn = build([((n,), "f32")], lambda b, x: [b.emit("add", b.emit("mul", x, x), b.emit("sqrt", b.emit("abs", x)))])
        x64 = x.astype(np.float64)                          # three roundings of positive terms
        return fn, [x], lambda y: _close(y[0], x64 ** 2 + np.sqrt(np.abs(x64)), 3 * U32, 0)
    if kind == "tanh":
        x = normals(rng, n)
        fn = build([((n,), "f32")], lambda b, x: [b.emit("tanh", x)])
        return fn, [x], lambda y: _close(y[0], np.tanh(x.astype(np.float64)), 4 * U32, 0)   # 2 ulp
    if kind in ("sum", "mean", "max"):
        x = normals(rng, n)
        fn = build([((n,), "f32")], lambda b, x: [b.emit(kind, x)])
        x64 = x.astype(np.float64)
        if kind == "max":
            return fn, [x], lambda y: _close(y[0], x64.max(initial=-np.inf), 0, 0)
        total = np.abs(x64).sum()
        want = x64.sum() / (n if kind == "mean" else 1)
        tol = gamma(depth(n) + (kind == "mean")) * total / (n if kind == "mean" else 1)
        return fn, [x], lambda y: _close(y[0], want, 0, tol)
    if "_axis" in kind:                  # sum_axis0: [n, 3] over 0; _axis1: [3, n] over 1;
        red, _, where = kind.partition("_axis")                # _axis1of3: [2, n, 3] over 1;
        shape, axis = {"0": ((n, 3), 0), "1": ((3, n), 1), "1of3": ((2, n, 3), 1),   # _axis0and2:
                       "0and2": ((n, 3, 5), (0, 2))}[where]                         # [n, 3, 5] over 0, 2
        reduced = math.prod(shape[a] for a in np.atleast_1d(axis))
        x = normals(rng, *shape)
        keep = where == "1of3"
        fn = build([(shape, "f32")], lambda b, x: [b.emit(red, x, axis=axis, keepdims=keep)])
        x64 = x.astype(np.float64)
        if red == "max":
            return fn, [x], lambda y: _close(y[0], x64.max(axis=axis, keepdims=keep), 0, 0)
        scale = 1 / reduced if red == "mean" else 1
        tol = gamma(depth(reduced) + (red == "mean")) * np.abs(x64).sum(axis=axis, keepdims=keep) * scale
        return fn, [x], lambda y: _close(y[0], x64.sum(axis=axis, keepdims=keep) * scale, 0, tol)
    if kind == "imatmul":                # i64 [3, n] @ [n, 2]: a sum of n products, wrapping
        a, w = full_range(rng, "int64", 3, n), full_range(rng, "int64", n, 2)
        fn = build([((3, n), "i64"), ((n, 2), "i64")], lambda b, x, y: [b.emit("matmul", x, y)])
        want = np.matmul(a, w)
        return fn, [a, w], lambda y: [] if np.array_equal(y[0], want) else ["not NumPy's product"]
    if kind in ("divmod", "divmod64"):   # floats' // and %: NumPy's, exactly
        dtype = np.float32 if kind == "divmod" else np.float64
        a = normals(rng, n, dtype=dtype) * np.exp2(rng.integers(-30, 30, n)).astype(dtype)
        d = normals(rng, n, dtype=dtype)
        d[::97] = 0.0                                       # and x / 0's NaN and infinities
        name = dtype_name(np.dtype(dtype))
        fn = build([((n,), name), ((n,), name)],
                   lambda b, x, y: [b.emit("floordiv", x, y), b.emit("mod", x, y)])
        with np.errstate(all="ignore"):
            want = np.floor_divide(a, d), np.mod(a, d)
        return fn, [a, d], lambda y: _close(y[0], want[0], 0, 0) + _close(y[1], want[1], 0, 0)
    if kind in EXACT_REDUCTIONS:         # of integers or bools: exact in any order (wrapping)
        red, dtype, shape_at, axis = EXACT_REDUCTIONS[kind]
        shape = shape_at(n)
        if dtype == "bool":
            x = rng.random(shape) < 0.9999                  # a False or two among the Trues
        elif red == "any":                                  # zeros, signed, and one NaN
            x = np.where(rng.random(shape) < 0.5, np.float32(-0.0), np.float32(0.0))
            x.reshape(-1)[rng.integers(x.size)] = np.nan
        elif red == "all":                                  # nonzeros, and one 0 in row 1
            x = rng.integers(1, 2 ** 40, shape) * rng.choice([-1, 1], shape)
            x[1, rng.integers(shape[1])] = 0
        else:
            x = full_range(rng, dtype, *shape)
        fn = build([(shape, dtype_name(np.dtype(dtype)))], lambda b, x: [b.emit(red, x, axis=axis)])
        want = getattr(np, red)(x, axis=axis, **({"dtype": x.dtype} if red in ("sum", "prod") else {}))
        return fn, [x], lambda y: [] if np.array_equal(y[0], want) and y[0].dtype == want.dtype else \
            [f"against NumPy: {y[0]!r} vs {want!r}"]
    if kind in ("softmax", "log_softmax", "layer_norm"):
        rows, length = (2 if n <= SLOW else 1), n
        x = normals(rng, rows, length)
        fn = build([((rows, length), "f32")], lambda b, x: [_row(b, kind, x)])
        x64 = x.astype(np.float64)
        d = depth(length)
        if kind == "layer_norm":
            c = x64 - x64.mean(-1, keepdims=True)
            want = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
            # mean and variance each within γ(d+1) relatively; the centring adds u·|x|
            tol = (4 * gamma(d + 2) + 4 * U32) * (1 + np.abs(want)) * (1 + np.abs(x64).max())
            return fn, [x], lambda y: _close(y[0], want, 0, tol)
        m = x64.max(-1, keepdims=True)
        e = np.exp(x64 - m)
        s = e.sum(-1, keepdims=True)
        spread = float(np.max(m - x64, initial=0))             # |x − max|: its rounding reaches exp
        if kind == "softmax":
            return fn, [x], lambda y: _close(y[0], e / s, gamma(d + 4) + (spread + 1) * U32, 1e-45)
        want = x64 - m - np.log(s)          # (and log's 1 ulp and the last subtraction's)
        return fn, [x], lambda y: _close(y[0], want, 0, gamma(d + 4) + (spread + 4) * U32
                                         + 4 * U32 * np.abs(want))
    if kind.startswith("matmul"):                            # matmul_M_N (K = n)
        m_, n_ = (int(v) for v in kind.split("_")[1:])
        a, bm = normals(rng, m_, n), normals(rng, n, n_)
        fn = build([((m_, n), "f32"), ((n, n_), "f32")], lambda b, x, y: [b.emit("matmul", x, y)])
        want = a.astype(np.float64) @ bm.astype(np.float64)
        tol = gamma(max(n, 1) + 1) * (np.abs(a).astype(np.float64) @ np.abs(bm).astype(np.float64))
        return fn, [a, bm], lambda y: _close(y[0], want, 0, tol)
    if kind == "take":
        vocab, width = max(1, n // 64), 64 if n >= 64 else 1
        rows = n // width
        e = normals(rng, vocab, width)
        idx = rng.integers(-vocab, vocab, rows).astype(np.int32)
        fn = build([((vocab, width), "f32"), ((rows,), "i32")], lambda b, x, i: [b.emit("take", x, i)])
        return fn, [e, idx], lambda y: _close(y[0], e[idx].astype(np.float64), 0, 0)
    if kind == "scatter_add":
        vocab, width = max(1, n // 640), 64 if n >= 64 else 1
        rows = max(1, n // width)
        idx = rng.integers(0, vocab, rows).astype(np.int32)
        up = normals(rng, rows, width)
        fn = build([((vocab, width), "f32"), ((rows,), "i32"), ((rows, width), "f32")],
                   lambda b, z, i, u: [b.emit("scatter_add", z, i, u)])
        zeros = np.zeros((vocab, width), np.float32)
        want, mag = np.zeros((vocab, width)), np.zeros((vocab, width))
        np.add.at(want, idx, up.astype(np.float64))
        np.add.at(mag, idx, np.abs(up).astype(np.float64))
        most = int(np.bincount(idx).max())
        return fn, [zeros, idx, up], lambda y: _close(y[0], want, 0, gamma(most) * mag)
    if kind == "window":
        x = normals(rng, n)
        items = (SliceSpec(1, 1 + 2 * (n - 1) + 1, 2),)
        fn = build([((n,), "f32")], lambda b, x: [b.emit("mul", b.emit(
            "unindex", x, items=items, shape=(2 * n + 1,)), b.constant(2.0, "f32"))])
        want = np.zeros(2 * n + 1)
        want[1::2] = 2 * x.astype(np.float64)
        return fn, [x], lambda y: _close(y[0], want, 0, 0)
    raise ValueError(kind)


def _row(b, kind: str, x):
    if kind == "layer_norm":
        d = b.emit("sub", x, b.emit("mean", x, axis=-1, keepdims=True))
        var = b.emit("mean", b.emit("mul", d, d), axis=-1, keepdims=True)
        return b.emit("mul", d, b.emit("rsqrt", b.emit("add", var, b.constant(1e-5, "f32"))))
    d = b.emit("sub", x, b.emit("max", x, axis=-1, keepdims=True))
    e = b.emit("exp", d)
    s = b.emit("sum", e, axis=-1, keepdims=True)
    return b.emit("sub", d, b.emit("log", s)) if kind == "log_softmax" else b.emit("div", e, s)


def _close(got, want, rtol: float, atol) -> list[str]:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return [f"shape {got.shape}, want {want.shape}"]
    with np.errstate(invalid="ignore"):
        bad = ~((got == want) | (np.isnan(got) & np.isnan(want))
                | (np.abs(got - want) <= rtol * np.abs(want) + atol))
    if not bad.any():
        return []
    at = tuple(np.argwhere(bad)[0])
    lim = rtol * abs(want[at]) + np.broadcast_to(atol, bad.shape)[at]
    return [f"against NumPy f64: {bad.sum()} of {bad.size} beyond the bound; at {at} "
            f"{got[at]!r} vs {want[at]!r} (|diff| {abs(got[at] - want[at]):.3g} > {lim:.3g})"]


def run_case(key: tuple[str, int]) -> list[str]:
    """In the child: what is wrong with case(*key) on the CPU and in the definition."""
    kind, n = key
    fn, arrays, against_numpy = case(kind, n)
    exact_k = not (kind.startswith("matmul") and n > 32768)   # (the interpreter's fma: a pass per term)
    want = interp.run(fn, arrays) if exact_k else None
    if want is None:                        # the CPU on every thread count against NumPy alone
        from runtime.cpu import Executable
        exe, runs = Executable(fn), {}
        for t in fuzz.THREADS:
            os.environ["DSLC_THREADS"] = str(t)
            runs[t] = exe.run(list(arrays))
        problems = [f"threads={t} vs 1: {d}" for t in fuzz.THREADS[1:]
                    for d in fuzz.differences(runs[t], runs[1])]
        return problems + [f"cpu {p}" for p in against_numpy(runs[1])]
    return fuzz.compare(fn, arrays, want) + [f"interpreter {p}" for p in against_numpy(want)]


KINDS = ["map", "tanh", "sum", "mean", "max", "sum_axis0", "sum_axis1", "sum_axis1of3",
         "mean_axis0", "max_axis1", "sum_axis0and2", "mean_axis0and2", "max_axis0and2", "softmax", "log_softmax", "layer_norm", "matmul_1_1",
         "matmul_3_5", "matmul_17_13", "take", "scatter_add", "window", "isum", "imax_rows",
         "uprod_columns", "bmin", "fany", "iall_rows", "divmod", "divmod64", "imatmul"]
# the default run's representative sample; DSLC_SLOW=1 runs every kind at every size
DEFAULT = {(k, n) for k in KINDS for n in (1, 4097)} | {
    ("sum", 0), ("mean", 0), ("max", 0), ("sum", 31), ("sum", 200_000), ("sum", 1_000_000),
    ("mean", 200_000), ("max", 200_000), ("map", 1_000_000), ("tanh", 200_000),
    ("sum_axis0", 300_000), ("sum_axis1of3", 65_537), ("max_axis1", 300_000), ("softmax", 65_537),
    ("softmax", 200_000), ("layer_norm", 200_000), ("matmul_1_1", 65_537), ("matmul_0_3", 5),
    ("matmul_3_0", 5), ("matmul_3_5", 0), ("matmul_17_13", 65_537), ("take", 200_000), ("scatter_add", 200_000),
    ("window", 200_000), ("isum", 0), ("isum", 1_000_000), ("imax_rows", 300_000),
    ("uprod_columns", 65_537), ("bmin", 200_000), ("fany", 1_000_000), ("iall_rows", 65_537),
    ("sum_axis0and2", 65_537), ("mean_axis0and2", 200_000), ("max_axis0and2", 65_537),
    ("divmod", 1_000_000), ("divmod64", 200_000), ("imatmul", 0), ("imatmul", 1_000_000)}
CASES = sorted({(k, n) for k in KINDS for n in SIZES} | DEFAULT)


@pytest.fixture(scope="module")
def outcomes(request) -> dict:
    """The outcome of every selected case that runs, `jobs` children at a time."""
    keys = [item.callspec.params["key"] for item in request.session.items
            if item.module.__name__ == __name__ and hasattr(item, "callspec")]
    keys = [k for k in keys if k in DEFAULT or os.environ.get("DSLC_SLOW")]
    return {k: (o, v) for k, o, v in isolated(run_case, keys, 600.0, fuzz.JOBS)}


@pytest.mark.parametrize("key", [pytest.param(c, marks=[] if c in DEFAULT else
                                              [pytest.mark.slow, slow], id=f"{c[0]}-{c[1]}")
                                 for c in CASES])
def test_every_kernel_class_at_every_size_on_every_thread_count(key, outcomes):
    o, v = outcomes[key]
    if o == "ok":
        o = "mismatch" if v else "ok"
    assert o == "ok", f"{key}: {o}: {v if isinstance(v, str) else chr(10).join(v or [])}"
