"""Random programs of exact operations (arithmetic, comparisons and selects, casts,
reductions, views, windows of slices, products) on f32 and f64 give the interpreter's bits on
the CPU backend: whatever the scheduler fuses, reorders or reads in place, no value may
change. NaNs compare equal whatever their payload (docs/gpu.md); products are f32 only (an f64
product may differ from the reference by an ulp a term, docs/numerics.md). DSLC_FUZZ_EXAMPLES
sets how many programs (default 100).
"""
from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest

from ir import interp
from ir.core import Builder, Value, tensor_type
from ir.ops.base import OpError
from ir.ops.shape import SliceSpec
from runtime.cpu import Executable

PROGRAMS = int(os.environ.get("DSLC_FUZZ_EXAMPLES", "100"))
SIZES = [1, 2, 3, 5, 8, 17, 33]
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]


def cast(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    y = b.emit("cast", x, dtype=r.choice(["f32", "f64", "i32", "bool"]))
    return y if y.dtype in ("f32", "f64") else b.emit("cast", y, dtype=r.choice(["f32", "f64"]))


def unary(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    y = b.emit(r.choice(["neg", "abs", "floor"]), x)
    return b.emit("sqrt", b.emit("abs", y)) if r.random() < 0.3 else y


def binary(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    z = r.choice([v for v in pool if _broadcasts(v.shape, x.shape) and v.dtype == x.dtype])
    return b.emit(r.choice(["add", "sub", "mul", "div", "maximum", "minimum"]), x, z)


def select(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    z = r.choice([v for v in pool if v.shape == x.shape and v.dtype == x.dtype])
    return b.emit("where", b.emit("gt", x, z), x, b.emit("neg", z))


def reduce(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    axes = tuple(sorted(r.sample(range(len(x.shape)), r.randint(1, len(x.shape)))))
    return b.emit(r.choice(["sum", "max", "min", "mean"]), x,
                  axis=axes if len(axes) > 1 else axes[0], keepdims=r.random() < 0.5)


def normalize(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    """A softmax's shape without exp: a row kernel where the rows allow."""
    d = b.emit("sub", x, b.emit("max", x, axis=-1, keepdims=True))
    norm = b.emit("sum", b.emit("abs", d), axis=-1, keepdims=True)
    return b.emit("div", d, b.emit("add", norm, b.constant(1.0, x.dtype)))


def transpose(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    perm = list(range(len(x.shape)))
    r.shuffle(perm)
    return b.emit("transpose", x, perm=tuple(perm))


def reshape(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    n = math.prod(x.shape)
    a = r.choice([d for d in range(1, n + 1) if n % d == 0])
    return b.emit("reshape", x, shape=(a, n // a) if r.random() < 0.7 else (n,))


def index(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    items = []
    for n in x.shape:
        lo = r.randint(0, n - 1)
        items.append(SliceSpec(lo, r.randint(lo + 1, n), r.choice([1, 1, 2]))
                     if r.random() < 0.8 else r.randint(0, n - 1))
    return b.emit("index", x, items=tuple(items))


def expand(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    y = b.emit("expand_dims", x, axis=r.randint(0, len(x.shape)))
    shape = [r.choice([2, 3]) if n == 1 and r.random() < 0.5 else n for n in y.shape]
    return b.emit("broadcast_to", y, shape=tuple(shape))


def matmul(r: random.Random, b: Builder, x: Value, pool: list[Value]) -> Value:
    fits = [v for v in pool if 1 <= len(v.shape) <= 2 and v.shape[0] == x.shape[-1]
            and v.dtype == x.dtype == "f32"]
    return b.emit("matmul", x, r.choice(fits))


OPS = [cast, unary, binary, binary, select, reduce, normalize, transpose, reshape, index, expand,
       matmul]


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def program(seed: int):
    """A function of f32 and f64 parameters built by 2 to 14 random ops (those whose shape rules
    refuse their operands are skipped), its last values the results, and its inputs: normals
    with zeros of both signs, infinities, NaNs and subnormals sprinkled in."""
    r = random.Random(seed)
    b = Builder()
    params = [b.param(tensor_type(r.choice(["f32", "f64"]),
                                  tuple(r.choice(SIZES) for _ in range(r.randint(1, 3)))))
              for _ in range(r.randint(1, 3))]
    pool = list(params)
    for _ in range(r.randint(2, 14)):
        try:
            pool.append(r.choice(OPS)(r, b, r.choice(pool), pool))
        except (OpError, IndexError, ValueError):       # no operand fits, or a rule says no
            continue
    fn = b.finish(pool[len(params):][-3:] or [b.emit("neg", params[0])])
    rng = np.random.default_rng(seed)
    arrays = []
    for p in params:
        a = (rng.standard_normal(p.shape) * 4).astype(np.dtype(p.dtype.replace("f", "float")))
        a.flat[rng.integers(0, a.size, max(1, a.size // 10))] = rng.choice(SPECIAL)
        arrays.append(a)
    return fn, arrays


def bits(x) -> bytes:
    x = np.array(x)
    x[np.isnan(x)] = np.nan
    return x.tobytes()


@pytest.mark.parametrize("seed", range(PROGRAMS))
def test_random_programs_give_the_interpreters_bits(seed):
    fn, arrays = program(seed)
    want = interp.run(fn, arrays)
    got = Executable(fn).run(arrays)
    for g, w in zip(got, want, strict=True):
        assert np.shape(g) == np.shape(w) and bits(g) == bits(w), fn
