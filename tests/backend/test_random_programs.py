"""Random programs on the CPU backend against the reference interpreter (the definition), each
in a child process of its own (tests/conftest.py `isolated`), so that a crash (a signal) or a
hang (a timeout) is a finding and not the end of the run.

Every program runs on 1, 2 and 3 threads (DSLC_THREADS) and must give the same bits on each:

- the interpreter's bits, NaNs equal whatever their payload (docs/gpu.md), wherever the
  operations are exact: arithmetic, comparisons and selects, casts, sqrt, reductions in the
  canonical order, views, windows, gathers and scatters, f32 products;
- where the interpreter's bits are not the definition (exp, log, tanh… are NumPy's there, the
  backends' the math library's; an f64 product rounds twice there, once per term on the CPU:
  docs/numerics.md), the bits of the operations done one by one, those ops compiled alone;
  each of those, alone, within its documented bound of the interpreter's value: the ulps of
  docs/numerics.md section 2 against float64 (long double for f64), and for an f64 product
  |cpu − interpreter| ≤ 2·γ(K+1)·Σ|a·b|.

Modes: "small" (axes of 0, 1, primes, powers of two and their neighbours; every primitive family
the generator reaches, all dtypes), "large" (one axis of 10^5 to 10^7 elements, at most
64 MB of values per program), "wide" (the same without reductions of more than 10^5 elements
into one value, so that the other kernels at those sizes are seen past a reduction's crash),
"grad" (smooth f64 programs: ir/ad.py's gradient on the interpreter against central finite
differences, and the gradient program itself through the same comparison as the others) and
"gpu" (programs as the small ones, of two axes at most, on the GPU backend without a GPU: its
runtime on the fake driver, which runs the CPU's kernels, and its own kernels emulated,
tests/gpu/emulator.py running their IR; each against the CPU's bits, NaNs equal whatever their
payload, as docs/gpu.md allows). No run may write its arguments. Outcomes: ok, mismatch,
crash, hang, error (a Python exception in the compiler or the runtime) and invalid (the
interpreter refuses the program).

DSLC_FUZZ_EXAMPLES sets how many small programs (default 60; large, wide, grad and gpu get a
tenth each, at least 4), DSLC_FUZZ_JOBS how many children at a time (default 2). For long
campaigns and reproducers: benchmarks/fuzz_campaign.py.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import traceback
from dataclasses import dataclass, field

import numpy as np
import pytest

from conftest import contents, isolated, written
from ir import interp
from ir.core import Builder, Function, Value, tensor_type
from ir.ops.base import OpError, np_dtype
from ir.ops.shape import SliceSpec
from ir.types import KeyType

PROGRAMS = int(os.environ.get("DSLC_FUZZ_EXAMPLES", "60"))
JOBS = int(os.environ.get("DSLC_FUZZ_JOBS", "2"))
THREADS = (1, 2, 3)
TIMEOUT = {"small": 60.0, "large": 300.0, "wide": 300.0, "grad": 120.0, "gpu": 120.0}

SMALL = [0, 1, 1, 2, 3, 5, 7, 8, 13, 17, 31, 32, 33]
LARGE = [100_000, 131_071, 199_999, 200_000, 262_147, 300_007, 1_000_003, 2_097_152,
         4_194_305, 10_000_000]
BUDGET = 64 << 20                   # bytes of values (inputs and every op's result) per program
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]

# the documented bounds (docs/numerics.md section 2), in ulps of the exact result
ULPS = {"exp": 1, "exp2": 1, "log": 1, "log2": 1, "sin": 1, "cos": 1, "tanh": 2, "sigmoid": 2,
        ("pow", "f32"): 2, ("pow", "f64"): 3}
MATH = ("exp", "exp2", "log", "log2", "tanh", "sigmoid", "sin", "cos", "pow")
FLOATS = ("f32", "f64")


# ---------------------------------------------------------------- generating programs

@dataclass
class Gen:
    """A program being built: the builder, its values so far, and its inputs' makers."""
    r: random.Random
    b: Builder
    mode: str
    pool: list[Value] = field(default_factory=list)
    inputs: list = field(default_factory=list)     # one (kind, shape, dtype, bound) per param

    def param(self, dtype: str, shape: tuple[int, ...], kind: str = "data", bound: int = 0) -> Value:
        self.inputs.append((kind, shape, dtype, bound))
        return self.b.param(tensor_type(dtype, shape))

    def key(self) -> Value:
        """A key parameter (two random words)."""
        self.inputs.append(("key", (2,), "u32", 0))
        return self.b.param(KeyType())

    def indices(self, shape: tuple[int, ...], n: int) -> Value:
        """An i32 parameter of indices into an axis of length n (negative ones too)."""
        return self.param("i32", shape, "indices", n)

    def floats(self) -> list[Value]:
        return [v for v in self.pool if v.dtype in FLOATS]

    def partner(self, fits) -> Value:
        """A value of the pool that fits (IndexError: none)."""
        return self.r.choice([v for v in self.pool if fits(v)])

    def const(self, value: float, like: Value) -> Value:
        return self.b.constant(value, like.dtype)


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _float(g: Gen, x: Value) -> Value:
    return x if x.dtype in FLOATS else g.b.emit("cast", x, dtype=g.r.choice(FLOATS))


# elementwise

def cast(g: Gen, x: Value) -> Value:
    y = g.b.emit("cast", x, dtype=g.r.choice(["f32", "f64", "f16", "i32", "bool"]))
    return y if y.dtype in FLOATS or g.r.random() < 0.3 else g.b.emit("cast", y, dtype=g.r.choice(FLOATS))


def unary(g: Gen, x: Value) -> Value:
    x = _float(g, x)
    prim = g.r.choice(["neg", "abs", "floor", "ceil", "trunc", "round", "sign", "sqrt", "rsqrt",
                       "isnan", "isinf", "isfinite", "clip"])
    if prim == "clip":
        return g.b.emit(prim, x, g.const(g.r.choice([-1.0, 0.0]), x), g.const(g.r.choice([0.0, 2.5]), x))
    return g.b.emit(prim, g.b.emit("abs", x) if prim in ("sqrt", "rsqrt") and g.r.random() < 0.7 else x)


def transcendental(g: Gen, x: Value) -> Value:
    x = _float(g, x)
    prim = g.r.choice(MATH)
    if prim == "pow":
        if g.r.random() < 0.5:
            return g.b.emit("pow", x, g.const(g.r.choice([2.0, 3.0, -1.0, 0.5, 1.5, -2.5]), x))
        y = g.partner(lambda v: v.dtype == x.dtype and _broadcasts(v.shape, x.shape))
        return g.b.emit("pow", g.b.emit("abs", x) if g.r.random() < 0.7 else x, y)
    if prim.startswith("log") and g.r.random() < 0.7:
        x = g.b.emit("abs", x)
    return g.b.emit(prim, x)


def binary(g: Gen, x: Value) -> Value:
    z = g.partner(lambda v: _broadcasts(v.shape, x.shape) and v.dtype == x.dtype)
    if x.dtype in FLOATS:
        prims = ["add", "sub", "mul", "div", "floordiv", "mod", "maximum", "minimum", "tanh_grad",
                 "sigmoid_grad"]
    elif x.dtype == "bool":
        prims = ["and", "or", "xor", "eq", "ne"]
    else:
        prims = ["add", "sub", "mul", "maximum", "minimum", "floordiv", "mod", "and", "xor"]
    return g.b.emit(g.r.choice(prims), x, z)


def select(g: Gen, x: Value) -> Value:
    z = g.partner(lambda v: v.shape == x.shape and v.dtype == x.dtype)
    cmp = g.r.choice(["gt", "ge", "lt", "le", "eq", "ne"])
    other = g.b.emit("neg", z) if x.dtype in FLOATS else z
    return g.b.emit("where", g.b.emit(cmp, x, z), x, other)


# reductions and rows

def _axes(g: Gen, x: Value):
    rank = len(x.shape)
    if g.r.random() < 0.15:
        return None
    axes = tuple(sorted(g.r.sample(range(rank), g.r.randint(1, rank))))
    axes = tuple(a - rank if g.r.random() < 0.3 else a for a in axes)
    return axes if len(axes) > 1 else axes[0]


def reduce(g: Gen, x: Value) -> Value:
    prim = g.r.choice(["sum", "max", "min", "mean", "sum", "mean", "argmax", "argmin", "prod",
                       "any", "all"])
    if prim.startswith("arg"):
        axis = None if g.r.random() < 0.3 else g.r.randrange(len(x.shape))
        return g.b.emit(prim, x, axis=axis, keepdims=g.r.random() < 0.3)
    if x.dtype == "bool" and prim not in ("any", "all") or (prim == "mean" and x.dtype not in FLOATS):
        x = _float(g, x)
    return g.b.emit(prim, x, axis=_axes(g, x), keepdims=g.r.random() < 0.5)


def scan(g: Gen, x: Value) -> Value:
    """A running sum or product along one axis (integers too)."""
    if x.dtype == "bool":
        x = _float(g, x)
    if not x.shape:
        x = g.b.emit("reshape", x, shape=(1,))
    axis = g.r.randrange(-len(x.shape), len(x.shape))
    return g.b.emit(g.r.choice(["cumsum", "cumprod"]), x, axis=axis)


def _rows(g: Gen) -> int | tuple[int, int]:
    return -1 if g.r.random() < 0.8 else (-2, -1)


def softmax(g: Gen, x: Value) -> Value:
    x, b, axis = _float(g, x), g.b, _rows(g)
    d = b.emit("sub", x, b.emit("max", x, axis=axis, keepdims=True))
    e = b.emit("exp", d)
    s = b.emit("sum", e, axis=axis, keepdims=True)
    if g.r.random() < 0.3:                                      # log-softmax
        return b.emit("sub", d, b.emit("log", s))
    return b.emit("div", e, s)


def layer_norm(g: Gen, x: Value) -> Value:
    x, b, axis = _float(g, x), g.b, _rows(g)
    d = b.emit("sub", x, b.emit("mean", x, axis=axis, keepdims=True))
    rms = g.r.random() < 0.3                                    # RMS norm: no centring
    v = d if not rms else x
    var = b.emit("mean", b.emit("mul", v, v), axis=axis, keepdims=True)
    y = b.emit("mul", v, b.emit("rsqrt", b.emit("add", var, g.const(1e-5, x))))
    if x.shape and g.r.random() < 0.5:
        gain = g.param(x.dtype, x.shape[-1:])
        y = b.emit("add", b.emit("mul", y, gain), g.param(x.dtype, x.shape[-1:]))
    return y


def normalize(g: Gen, x: Value) -> Value:
    """A softmax's shape without exp: a row kernel where the rows allow."""
    x, b = _float(g, x), g.b
    d = b.emit("sub", x, b.emit("max", x, axis=-1, keepdims=True))
    norm = b.emit("sum", b.emit("abs", d), axis=-1, keepdims=True)
    return b.emit("div", d, b.emit("add", norm, g.const(1.0, x)))


# views and windows

def transpose(g: Gen, x: Value) -> Value:
    perm = list(range(len(x.shape)))
    g.r.shuffle(perm)
    return g.b.emit("transpose", x, perm=tuple(perm))


def reshape(g: Gen, x: Value) -> Value:
    n = math.prod(x.shape)
    if n == 0:
        return g.b.emit("reshape", x, shape=g.r.choice([(0,), (0, 3), (2, 0)]))
    a = g.r.choice([d for d in range(1, min(n, 64) + 1) if n % d == 0] + [n])
    return g.b.emit("reshape", x, shape=(a, n // a) if g.r.random() < 0.7 else (n,))


def _slice(r: random.Random, n: int) -> SliceSpec:
    if n == 0 or r.random() < 0.15:
        return SliceSpec()
    step = r.choice([1, 1, 2, 3, -1, -2])
    lo, hi = sorted((r.randint(0, n), r.randint(0, n)))
    return SliceSpec(lo, hi, step) if step > 0 else SliceSpec(hi - 1 if hi else None, lo - 1 if lo else None, step)


def index(g: Gen, x: Value) -> Value:
    items = tuple(g.r.randrange(-n, n) if n and g.r.random() < 0.2 else _slice(g.r, n)
                  for n in x.shape)
    return g.b.emit("index", x, items=items)


def window(g: Gen, x: Value) -> Value:
    """unindex: x placed in zeros at a strided box (the gradient of a slice)."""
    items, shape = [], []
    for n in x.shape:
        lo, step, hi = g.r.randint(0, 2), g.r.choice([1, 1, 2]), g.r.randint(0, 2)
        size = lo + max(n - 1, 0) * step + (n > 0) + hi
        items.append(SliceSpec(lo, lo + max(n - 1, 0) * step + 1 if n else lo, step))
        shape.append(size)
    return g.b.emit("unindex", x, items=tuple(items), shape=tuple(shape))


def expand(g: Gen, x: Value) -> Value:
    y = g.b.emit("expand_dims", x, axis=g.r.randint(0, len(x.shape)))
    shape = [g.r.choice([2, 3]) if n == 1 and g.r.random() < 0.5 else n for n in y.shape]
    return g.b.emit("broadcast_to", y, shape=tuple(shape))


def rearrange(g: Gen, x: Value) -> Value:
    b, r = g.b, g.r
    choice = r.choice(["squeeze", "flip", "pad", "concat", "stack", "tril", "slice"])
    if choice == "squeeze":
        return b.emit("squeeze", x, axis=tuple(i for i, n in enumerate(x.shape) if n == 1))
    if choice == "flip":
        return b.emit("flip", x, axis=_axes(g, x))
    if choice == "pad":
        return b.emit("pad", x, widths=tuple(r.randint(0, 2) for _ in range(2 * len(x.shape))),
                      value=r.choice([0, 1]))
    if choice == "tril":
        return b.emit(r.choice(["tril", "triu"]), x, k=r.randint(-2, 2))
    if choice == "slice":
        n = x.shape[0]
        return b.emit("slice", x, start=r.randint(0, n), stop=None, axis=0)
    axis = r.randrange(len(x.shape))
    z = g.partner(lambda v: v.dtype == x.dtype and len(v.shape) == len(x.shape) and all(
        a == c for i, (a, c) in enumerate(zip(v.shape, x.shape)) if choice == "stack" or i != axis))
    return b.emit(choice, x, z, axis=axis)


# products, gathers, scatters

def matmul(g: Gen, x: Value) -> Value:
    if x.shape[-1] > 32768:             # the interpreter's exact fma takes a NumPy pass per term
        raise ValueError("too long a product for the interpreter")
    y = g.partner(lambda v: 1 <= len(v.shape) <= 3
                  and v.shape[-2 if len(v.shape) > 1 else 0] == x.shape[-1] and v.dtype == x.dtype
                  and x.dtype in FLOATS)
    return g.b.emit("matmul", x, y)


def product(g: Gen, x: Value) -> Value:
    """x as rows of k (a divisor up to 512) @ a new [k, n] parameter: a product large enough
    to be shared by the threads (2^20 multiply-adds each)."""
    if x.dtype not in FLOATS:
        raise ValueError("an integer product")
    size = math.prod(x.shape)
    k = g.r.choice([d for d in (512, 384, 256, 100, 64, 7) if size % d == 0] or [1])
    n = g.r.choice([c for c in (1, 7, 64) if size * c <= 1 << 24] or [1])   # (the interpreter's
    rows = g.b.emit("reshape", x, shape=(size // k, k))                      # exact fma: k passes)
    return g.b.emit("matmul", rows, g.param(x.dtype, (k, n)))


def einsum(g: Gen, x: Value) -> Value:
    bsz, m, k = x.shape
    y = g.partner(lambda v: v.dtype == x.dtype == "f32" and len(v.shape) == 3
                  and v.shape[:2] == (bsz, k))
    return g.b.emit("einsum", x, y, spec="bmk,bkn->bmn")


def take(g: Gen, x: Value) -> Value:
    axis = g.r.randrange(len(x.shape))
    n = x.shape[axis]
    if n == 0:
        raise ValueError("nothing to take")
    shape = tuple(g.r.choice([1, 2, 3, 5, 7]) for _ in range(g.r.randint(0, 2)))
    if g.mode in ("large", "wide") and g.r.random() < 0.5:
        shape = (n,)                                   # a permutation-sized gather
    return g.b.emit("take", x, g.indices(shape, n), axis=axis - len(x.shape) * (g.r.random() < 0.3))


def scatter_add(g: Gen, x: Value) -> Value:
    axis = g.r.randrange(len(x.shape))
    n = x.shape[axis]
    if n == 0 or x.dtype == "bool":
        raise ValueError("nowhere to scatter")
    shape = (g.r.choice([3, n]),) if g.mode in ("large", "wide") else (g.r.choice([1, 2, 5, 2 * n + 1]),)
    idx = g.indices(shape, n)
    updates = g.b.emit("take", x, idx, axis=axis)
    if x.dtype in FLOATS:
        updates = g.b.emit("mul", updates, g.const(g.r.choice([0.5, -3.0]), x))
    return g.b.emit("scatter_add", x, idx, updates, axis=axis)


def order(g: Gen, x: Value) -> Value:
    """A sort, an argsort, a top-k (its values or its indices) or x read in the order of
    another's argsort, along one axis, ascending or descending: host steps on a value that is
    often a view (the NaNs, zeros of both signs and ties of the inputs sort by one order)."""
    if not x.shape:
        raise ValueError("nothing to order")
    axis, r = g.r.randrange(-len(x.shape), len(x.shape)), g.r
    prim = r.choice(["sort", "argsort", "topk", "take_along_axis"])
    if prim == "topk":
        k = r.randint(0, x.shape[axis])
        values, indices = g.b.emit("topk", x, k=k, axis=axis, largest=r.random() < 0.7)
        return r.choice([values, indices])
    if prim == "take_along_axis":
        z = g.partner(lambda v: v.shape == x.shape)
        return g.b.emit(prim, x, g.b.emit("argsort", z, axis=axis, descending=r.random() < 0.5),
                        axis=axis)
    return g.b.emit(prim, x, axis=axis, descending=r.random() < 0.5)


def draw(g: Gen, x: Value) -> Value:
    """Random numbers of x's shape from a key parameter (folded with an integer scalar of the
    pool, at times): uniform on an interval, normal (f32 or f64) or bernoulli."""
    k, r = g.key(), g.r
    counters = [v for v in g.pool if v.dtype == "i32" and not v.shape]
    if counters and r.random() < 0.5:
        k = g.b.emit("fold_in", k, r.choice(counters))
    prim = r.choice(["uniform", "normal", "bernoulli"])
    if prim == "uniform":
        low = r.choice([0.0, -1.0, -3.5])
        return g.b.emit(prim, k, shape=x.shape, low=low, high=low + r.choice([1.0, 2.5]),
                        dtype=r.choice(FLOATS))
    if prim == "normal":
        return g.b.emit(prim, k, shape=x.shape, dtype=r.choice(FLOATS))
    return g.b.emit(prim, k, g.b.constant(r.choice([0.0, 0.3, 1.0]), "f32"), shape=x.shape)


def one_hot(g: Gen, x: Value) -> Value:
    return g.b.emit("one_hot", g.indices(x.shape[:1] or (3,), 7), n=5,
                    dtype=x.dtype if x.dtype in FLOATS else "f32")


SMALL_OPS = [cast, unary, unary, transcendental, transcendental, binary, binary, binary, select,
             reduce, reduce, reduce, softmax, layer_norm, normalize, transpose, reshape, index,
             index, window, expand, rearrange, rearrange, matmul, matmul, einsum, take, scatter_add,
             one_hot, scan, order, draw]
LARGE_OPS = [unary, transcendental, binary, select, reduce, reduce, reduce, reduce, softmax,
             layer_norm, normalize, transpose, reshape, index, window, matmul, product, product,
             take, scatter_add, scan]


def smooth(g: Gen, x: Value) -> Value:
    """An f64 op with no kink, tie or pole near the inputs: finite differences apply."""
    b, r = g.b, g.r
    choice = r.choice(["binary", "unary", "unary", "reduce", "softmax", "layer_norm", "view",
                       "view", "matmul", "take", "window", "pad"])
    if choice == "binary":
        z = g.partner(lambda v: _broadcasts(v.shape, x.shape))
        prim = r.choice(["add", "sub", "mul", "div"])
        if prim == "div":
            z = b.emit("add", b.emit("mul", z, z), g.const(1.0, z))
        return b.emit(prim, x, z)
    if choice == "unary":
        prim = r.choice(["tanh", "sigmoid", "sin", "cos", "exp", "log", "sqrt", "rsqrt", "pow",
                         "neg"])
        if prim == "exp":
            return b.emit("exp", b.emit("tanh", x))
        if prim in ("log", "sqrt", "rsqrt"):
            return b.emit(prim, b.emit("add", b.emit("mul", x, x), g.const(1.0, x)))
        if prim == "pow":
            return b.emit("pow", b.emit("sigmoid", x), g.const(r.choice([2.0, 1.5, -0.5]), x))
        return b.emit(prim, x)
    if choice == "reduce":
        return b.emit(r.choice(["sum", "mean"]), x, axis=_axes(g, x), keepdims=r.random() < 0.5)
    if choice == "softmax":
        return softmax(g, x)
    if choice == "layer_norm":
        return layer_norm(g, x) if x.shape[-1] > 1 else b.emit("neg", x)
    if choice == "view":
        return r.choice([transpose, reshape, index, expand])(g, x)
    if choice == "matmul":
        return matmul(g, x)
    if choice == "take":
        return take(g, x)
    if choice == "window":
        return window(g, x)
    return b.emit("pad", x, widths=tuple(r.randint(0, 1) for _ in range(2 * len(x.shape))))


REDUCTIONS = ("sum", "mean", "max", "min", "argmax", "argmin")


def long_reduction(op) -> bool:
    """A reduction of more than 100,000 elements into each result."""
    return op.primitive.name in REDUCTIONS and math.prod(op.inputs[0].shape) > 100_000 * max(
        1, math.prod(op.outputs[0].shape))


def nbytes(v: Value) -> int:
    return math.prod(v.shape) * np.dtype(np_dtype(v.dtype)).itemsize


def _shape(r: random.Random, mode: str, long: int) -> tuple[int, ...]:
    if mode in ("small", "gpu"):            # (gpu: two axes at most, as the emulator is slow)
        return tuple(r.choice(SMALL) for _ in range(r.randint(1, 3 if mode == "small" else 2)))
    if mode == "grad":
        return tuple(r.choice([1, 2, 3, 4]) for _ in range(r.randint(1, 3)))
    rest = [r.choice([1, 2, 3]) for _ in range(r.randint(0, 2))]
    rest.insert(r.randint(0, len(rest)), long)
    return tuple(rest)


@dataclass
class Program:
    mode: str
    seed: int
    fn: Function
    arrays: list[np.ndarray]
    wrt: list[int]                            # grad mode: the float parameters


def program(mode: str, seed: int) -> Program:
    """A function of random parameters built by random ops (those whose shape rules refuse
    their operands are skipped), the values no op reads its results, and its inputs: normals with
    zeros of both signs, infinities, NaNs and subnormals sprinkled in (grad mode: none)."""
    r = random.Random(f"{mode}-{seed}")
    kind = "small" if mode == "gpu" else mode           # (gpu: its own seeds, small's kind)
    g = Gen(r, Builder(f"{mode}{seed}"), kind)
    long = r.choice(LARGE) if r.random() < 0.5 else int(10 ** r.uniform(5, 7))
    dtypes = {"grad": ["f64"], "small": ["f32", "f32", "f64", "i32", "bool"]}.get(kind, ["f32", "f32", "f64"])
    for _ in range(r.randint(1, 3)):
        shape = _shape(r, mode, long)
        dtype = r.choice(dtypes)
        if mode in ("large", "wide"):
            while math.prod(shape) * np.dtype(np_dtype(dtype)).itemsize > BUDGET // 4:
                shape = tuple(max(1, n // 2) if n >= 100_000 else n for n in shape)
        g.pool.append(g.param(dtype, shape))
    ops = {"small": SMALL_OPS, "large": LARGE_OPS, "wide": LARGE_OPS, "grad": [smooth]}[kind]
    steps = {"small": (2, 14), "large": (1, 5), "wide": (1, 6), "grad": (2, 8)}[kind]
    first, used = len(g.pool), sum(nbytes(p) for p in g.b.params)
    for _ in range(r.randint(*steps)):
        mark, params = len(g.b.ops), len(g.b.params)
        try:
            y = r.choice(ops)(g, r.choice(g.floats() if mode == "grad" else g.pool))
            added = sum(nbytes(v) for op in g.b.ops[mark:] for v in op.outputs)
            added += sum(nbytes(p) for p in g.b.params[params:])
            if used + added > BUDGET:
                raise ValueError("over the memory budget")
            if mode == "wide" and any(long_reduction(op) for op in g.b.ops[mark:]):
                raise ValueError("a long reduction (the large mode has them)")
        except (OpError, IndexError, ValueError, TypeError):   # no operand fits, or a rule says no
            del g.b.ops[mark:], g.b.params[params:], g.inputs[params:]
            continue
        used += added
        g.pool.append(y)
    read = {v for op in g.b.ops for v in op.inputs}            # results: what no op reads,
    results = [v for v in g.pool[first:] if v not in read][-6:] or [   # so that none is dead
        g.b.emit("neg", _float(g, g.pool[0]))]
    if mode == "grad":
        results = [_loss(g, [v for v in results if v.dtype == "f64"] or [g.pool[0]])]
    fn = g.b.finish(results)
    rng = np.random.default_rng([seed, len(mode)])
    arrays = [_input(rng, mode, *spec) for spec in g.inputs]
    wrt = [i for i, spec in enumerate(g.inputs) if spec[0] == "data" and spec[2] in FLOATS]
    return Program(mode, seed, fn, arrays, wrt)


def _loss(g: Gen, values: list[Value]) -> Value:
    """sum over values v of sum(v * w), w fixed weights: a scalar whose gradient sees them all."""
    total = None
    for v in values:
        w = g.param(v.dtype, v.shape, "weights")
        term = g.b.emit("sum", g.b.emit("mul", v, w))
        total = term if total is None else g.b.emit("add", total, term)
    return total


def _input(rng: np.random.Generator, mode: str, kind: str, shape, dtype: str, bound: int) -> np.ndarray:
    if kind == "indices":
        return rng.integers(-bound, bound, shape).astype(np.int32)
    if kind == "key":
        return rng.integers(0, 2 ** 32, shape, dtype=np.uint64).astype(np.uint32)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "i32":
        return rng.integers(-9, 10, shape).astype(np.int32)
    a = (rng.standard_normal(shape) * (1 if mode == "grad" else 4)).astype(np_dtype(dtype))
    if mode != "grad" and kind == "data" and a.size:
        a.flat[rng.integers(0, a.size, max(1, a.size // 10))] = rng.choice(SPECIAL)
    return a


# ---------------------------------------------------------------- checking one program

def check(key: tuple[str, int]) -> dict:
    """In the child: the outcome of program(*key), with the evidence of a mismatch."""
    p = program(*key)
    try:
        want = interp.run(p.fn, p.arrays)
    except Exception as e:                          # noqa: BLE001 — the program is not valid
        return {"outcome": "invalid", "detail": f"{type(e).__name__}: {e}"}
    try:
        problems = on_gpu(p.fn, p.arrays) if p.mode == "gpu" else compare(p.fn, p.arrays, want)
        if p.mode == "grad":
            problems += gradient(p)
    except CompilerError as e:
        return {"outcome": "error", "detail": e.args[0]}
    except Invalid as e:
        return {"outcome": "invalid", "detail": e.args[0]}
    ulps: dict[str, float] = {}
    for prim, dtype, err in ULP_SEEN:
        ulps[f"{prim} {dtype}"] = max(err, ulps.get(f"{prim} {dtype}", 0.0))
    return {"outcome": "mismatch" if problems else "ok", "detail": problems,
            "prims": sorted({op.primitive.name for op in p.fn.ops}), "ulps": ulps}


def compare(fn: Function, arrays: list[np.ndarray], want: list[np.ndarray]) -> list[str]:
    """What differs between the CPU on each thread count and the definition's bits."""
    from runtime.cpu import Executable
    with compiling():
        exe = Executable(fn)
    reference, problems = by_ops(fn, arrays) if inexact(fn) else (want, [])
    given = contents(arrays)
    runs = {}
    for t in THREADS:
        os.environ["DSLC_THREADS"] = str(t)
        with compiling():
            runs[t] = exe.run(list(arrays))
        problems += [f"threads={t}: {w}" for w in written(arrays, given)]
    os.environ.pop("DSLC_THREADS")
    for t, got in runs.items():
        problems += [f"threads={t}: {d}" for d in differences(got, reference)]
    problems += [f"threads={t} vs 1: {d}" for t in THREADS[1:] for d in differences(runs[t], runs[1])]
    return problems


def on_gpu(fn: Function, arrays: list[np.ndarray]) -> list[str]:
    """What differs from the CPU backend's bits (one thread) on the GPU backend: on the fake
    driver (its plan, memory, copies and host steps, around the CPU's kernels) and with its
    own kernels emulated; and any argument either one writes."""
    import runtime.cuda as cuda
    from runtime.cpu import Executable
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.join(tests, "runtime"), os.path.join(tests, "gpu")]
    from test_cuda import EmulatedDriver, FakeDriver, install
    os.environ["DSLC_THREADS"] = "1"
    with compiling():
        want = Executable(fn).run(list(arrays))
    given = contents(arrays)
    problems = []
    for name, drv in (("fake driver", FakeDriver()), ("emulated kernels", EmulatedDriver())):
        install(pytest.MonkeyPatch(), drv)          # (in the program's own child: never undone)
        with compiling():
            got = [np.asarray(x) for x in cuda.Executable(fn, drv=drv).run(list(arrays))]
        problems += [f"{name}: {d}" for d in differences(got, want)]
        problems += [f"{name}: {w}" for w in written(arrays, given)]
    return problems


class Invalid(Exception):
    """The interpreter refuses a program (the definition has no value for it)."""


class CompilerError(Exception):
    """An exception raised by the compiler or the runtime: a finding (its traceback)."""


@contextlib.contextmanager
def compiling():
    try:
        yield
    except Exception as e:                          # noqa: BLE001 — what the compiler raised
        raise CompilerError(traceback.format_exc()) from e


def differences(got: list, want: list) -> list[str]:
    out = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            out.append(f"result {i}: {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}")
            continue
        same = _bits(g) == _bits(w)
        if not same.all():
            at = np.argwhere(~same)[0]
            out.append(f"result {i} {w.dtype}{list(w.shape)}: {(~same).sum()} of {same.size} "
                       f"differ; at {tuple(int(j) for j in at)} got {g[tuple(at)]!r} want {w[tuple(at)]!r}")
    return out


def _bits(x: np.ndarray) -> np.ndarray:
    """x's bits, one integer per element, every NaN the same."""
    x = np.array(x)
    if x.dtype.kind == "f":
        x[np.isnan(x)] = np.nan
        return x.view(np.dtype(f"u{x.dtype.itemsize}"))
    return x


def inexact(fn: Function) -> bool:
    return any(_compiled_alone(op) for op in fn.ops)


def _compiled_alone(op) -> bool:
    """The ops whose bits the interpreter does not define (docs/numerics.md)."""
    return op.primitive.name in MATH or (op.primitive.name in ("matmul", "einsum") and op.outputs[0].dtype == "f64")


def by_ops(fn: Function, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
    """fn op by op on the interpreter, but its math functions and f64 products compiled alone;
    with each of those that strays beyond its documented bound of the interpreter's value."""
    env, problems = dict(zip(fn.params, arrays)), []
    for op in fn.ops:
        inputs = [env[v] for v in op.inputs]
        outs = interp.evaluate(op, inputs)
        if _compiled_alone(op):
            alone = _alone(op, inputs)
            problems += [f"{op.primitive.name} alone: {d}" for d in bound(op, inputs, alone[0], outs[0])]
            outs = alone
        env.update(zip(op.outputs, outs))
    return [env[v] for v in fn.results], problems


_ALONE: dict = {}


def _alone(op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """op compiled on its own; a math function on its operands flattened and padded to a power
    of two (fewer compilations; the lanes do not affect each other)."""
    from runtime.cpu import Executable
    if op.primitive.name not in MATH:
        b = Builder()
        fn = b.finish([b.emit(op.primitive.name, *[b.param(v.type) for v in op.inputs], **op.attrs)])
        with compiling():
            return Executable(fn).run(inputs)
    shape = np.broadcast_shapes(*(np.shape(a) for a in inputs))
    n = math.prod(shape)
    size = max(64, 1 << max(0, n - 1).bit_length())
    flat = [np.concatenate([np.broadcast_to(a, shape).ravel(),
                            np.ones(size - n, np.asarray(a).dtype)]) for a in inputs]
    dtype = op.outputs[0].dtype
    key = (op.primitive.name, dtype, len(inputs), size)
    if key not in _ALONE:
        b = Builder()
        params = [b.param(tensor_type(dtype, (size,))) for _ in inputs]
        with compiling():
            _ALONE[key] = Executable(b.finish([b.emit(op.primitive.name, *params)]))
    with compiling():
        (y,) = _ALONE[key].run(flat)
    return [y[:n].reshape(shape)]


def bound(op, inputs: list[np.ndarray], got: np.ndarray, interp_value: np.ndarray) -> list[str]:
    """Where an op compiled alone is beyond its documented bound."""
    with np.errstate(all="ignore"):
        if op.primitive.name in MATH:
            err, where = ulps(op.primitive.name, inputs, got)
            limit = ULPS.get(op.primitive.name) or ULPS[(op.primitive.name, str(got.dtype).replace("float", "f"))]
            ULP_SEEN.append((op.primitive.name, str(got.dtype), float(np.max(err, initial=0))))
            if err.size and np.max(err) > limit:
                at = np.unravel_index(np.argmax(err), err.shape)
                args = [np.broadcast_to(a, got.shape)[at] for a in inputs]
                return [f"{np.max(err):.3g} ulp > {limit} at x={args!r}: got {got[at]!r}"]
            return [f"{where} special values differ"] if where else []
        a, b = (np.asarray(x, np.float64) for x in inputs)
        k = a.shape[-1]
        gamma = (k + 1) * 2.0 ** -53 / (1 - (k + 1) * 2.0 ** -53)
        scale = np.matmul(np.abs(a), np.abs(b)) if op.primitive.name == "matmul" else np.einsum(
            op.attrs["spec"], np.abs(a), np.abs(b))
        finite = np.isfinite(interp_value) & np.isfinite(got)
        bad = finite & (np.abs(got - interp_value) > 2 * gamma * scale)
        bad |= ~finite & (_bits(got) != _bits(interp_value))
        return [f"{bad.sum()} elements beyond 2·γ(K+1)·Σ|ab|"] if bad.any() else []


ULP_SEEN: list = []


def ulps(prim: str, inputs: list[np.ndarray], got: np.ndarray) -> tuple[np.ndarray, int]:
    """|got − exact| in ulps of the exact result rounded to got's type, where that is finite;
    and how many elements are not finite in one and finite or different in the other."""
    wide = np.float64 if got.dtype == np.float32 else np.longdouble
    # whole arrays of one axis at least: by a scalar exponent (a 0-d one too) NumPy's power is
    # sqrt (x ** 0.5: NaN at -inf), not C99's pow (+inf), as ir/ops/elementwise.py's _power says
    xs = [np.array(np.broadcast_to(a, got.shape), dtype=wide, ndmin=1) for a in inputs]
    exact = (1 / (1 + np.exp(-xs[0])) if prim == "sigmoid" else getattr(np, {"pow": "power"}.get(prim, prim))(*xs))
    exact = exact.reshape(got.shape)
    rounded = exact.astype(got.dtype)
    finite = np.isfinite(rounded)
    ulp = np.spacing(np.abs(rounded[finite])).astype(wide)
    err = (np.abs(got[finite].astype(wide) - exact[finite]) / ulp).astype(np.float64)
    err[~np.isfinite(got[finite])] = np.inf
    g, r = got[~finite], rounded[~finite]
    special = ((_bits(g) != _bits(r)) & ~(np.isnan(g) & np.isnan(r))).sum()   # NaN payloads aside
    return err, int(special)


def gradient(p: Program) -> list[str]:
    """ir/ad.py's gradient on the interpreter against central finite differences, and the
    gradient program on the CPU against its definition like any other program."""
    from ir.ad import grad_function
    g = grad_function(p.fn, wrt=p.wrt)
    try:
        got = interp.run(g, p.arrays)
    except Exception as e:                          # noqa: BLE001 — reported, not a finding here
        raise Invalid(f"gradient: {type(e).__name__}: {e}") from e
    problems = [f"gradient program: {d}" for d in compare(g, p.arrays, got)]
    loss = lambda args: float(interp.run(p.fn, args)[0])
    scale = max(1.0, abs(loss(p.arrays)))
    for i, grad in zip(p.wrt, got):
        x = p.arrays[i]
        fd = np.zeros_like(x)
        for at in np.ndindex(x.shape):
            h = 1e-6 * max(1.0, abs(float(x[at])))
            plus, minus = list(p.arrays), list(p.arrays)
            plus[i], minus[i] = x.copy(), x.copy()
            plus[i][at] += h
            minus[i][at] -= h
            fd[at] = (loss(plus) - loss(minus)) / (2 * h)
        bad = np.abs(grad - fd) > 1e-5 * np.abs(fd) + 1e-6 * scale
        if bad.any():
            at = tuple(int(j) for j in np.argwhere(bad)[0])
            problems.append(f"gradient of parameter {i} at {at}: {grad[at]!r}, finite "
                            f"differences {fd[at]!r}")
    return problems


# ---------------------------------------------------------------- running many

def run_all(keys, jobs: int = JOBS):
    """(key, outcome, detail) for each program, each in a child process; "tool" where this
    file's own code raised (not a finding about the compiler)."""
    for key, outcome, value in isolated(check, keys, TIMEOUT[keys[0][0]] if keys else 60, jobs):
        if outcome == "ok":
            yield key, value["outcome"], value
        else:
            yield key, "tool" if outcome == "error" else outcome, {"detail": value}


def reproducer(key: tuple[str, int]) -> str:
    """The program as .bend (IR text for the large modes, or where a primitive has no
    spelling), its input shapes and the threads; enough to rerun it."""
    from ir.printer import printable, to_bend, to_text
    p = program(*key)
    # (.bend only for small programs: to_bend spells a window as takes whose position lists
    # it builds in quadratic time, hours for an axis of 10^6)
    bend = p.mode in ("small", "grad", "gpu") and all(printable(op.primitive.name) for op in p.fn.ops)
    text = to_bend(p.fn, "f") if bend else to_text(p.fn)
    shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in p.arrays)
    return f"# program{key}: inputs {shapes}; threads {THREADS}\n{text}"


def _assert_all_ok(mode: str, count: int) -> None:
    keys = [(mode, s) for s in range(count)]
    failures = [(k, o, v) for k, o, v in run_all(keys) if o not in ("ok", "invalid")]
    assert not failures, "\n\n".join(
        f"{k} {o}: {v['detail'] if isinstance(v['detail'], str) else chr(10).join(v['detail'])}"
        f"\n{reproducer(k)}" for k, o, v in sorted(failures))


def test_small_random_programs_give_the_definitions_bits_on_every_thread_count():
    _assert_all_ok("small", PROGRAMS)


def test_large_random_programs_give_the_definitions_bits_on_every_thread_count():
    _assert_all_ok("large", max(4, PROGRAMS // 10))


def test_wide_random_programs_give_the_definitions_bits_on_every_thread_count():
    _assert_all_ok("wide", max(4, PROGRAMS // 10))


def test_random_gradients_match_finite_differences_and_the_cpu_gives_their_bits():
    _assert_all_ok("grad", max(4, PROGRAMS // 10))


def test_random_programs_give_the_cpus_bits_on_the_gpu_runtime_and_its_kernels():
    _assert_all_ok("gpu", max(4, PROGRAMS // 10))


def test_a_crash_and_a_hang_are_outcomes_not_the_end_of_the_run():
    import signal
    import time

    def die(how):
        if how == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if how == "hang":
            time.sleep(60)
        if how == "error":
            raise RuntimeError(how)
        return how
    got = {k: o for k, o, _ in isolated(die, ["crash", "hang", "error", "ok"], 1.0, jobs=2)}
    assert got == {"crash": "crash", "hang": "hang", "error": "error", "ok": "ok"}
