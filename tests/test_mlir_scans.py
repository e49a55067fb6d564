"""The MLIR of flips and negative steps, scans, float % and //, shifts, and assert_finite and
debug (ir/mlir.py, docs/mlir.md), compiled by IREE and held to NumPy's bits and the CPU backend's:
elements moved, in order; cumsum and cumprod accumulated in the scan order of docs/numerics.md;
% and //, << and >> (by any count) as NumPy's; logcumsumexp within docs/mlir.md's bound (IREE's exp and log). Sizes
0, 1 and primes; inputs with NaN, ±inf and -0.0. One IREE module holds every entry at every size."""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import dsl
from conftest import beyond_iree_bound, raises
from ir.ad import grad_function
from ir.core import Function
from ir.mlir import function, module
from ir.ops.base import np_dtype
from ir.passes import optimize
from runtime import cpu
from test_shifts import numpy_shifts, operands

pytest.importorskip("iree.compiler", reason="IREE is not installed (pip install 'dslc[iree]')")

SOURCE = """\
def flips(x: f32[A, B]):
  return flip(x, 1), flip(x), x[::-1], x[-1:0:-2, ::-3], slice(x, -1, axis=1, step=-2)

def scans(x: f32[A, B], p: f32[A, B], n: i32[A, B], d: f64[A, B], h: f16[A, B]):
  return cumsum(x, 1), cumprod(p, 0), cumsum(n, 0), cumprod(n, 1), cumsum(d, -1), cumprod(h, 1)

def lse(x: f32[A, B]) -> f32[A, B]:
  return logcumsumexp(x, 1)

def floor_division(a: f32[A, B], b: f32[A, B], h: f16[A, B], g: f16[A, B], d: f64[A, B], e: f64[A, B]):
  return a % b, a // b, h % g, h // g, d % e, d // e

def shifts(a: i32[A, B], b: i32[A, B], c: i64[A, B], d: i64[A, B], e: u32[A, B], g: u32[A, B]):
  return a << b, a >> b, c << d, c >> d, e << g, e >> g, a << 31, a >> 40, c >> 63, 5 << c

def strided(x: f32[A, B], w: f32[A, B]) -> f32:
  return sum(x[::-2, ::-1] * w[::-2, ::-1])

def running(x: f32[A, B], w: f32[A, B]) -> f32:
  return sum(cumsum(x, 1) * w)

def checked(x: f32[A, B], n: i32[A, B]):
  return assert_finite(x * 2.0, "doubled"), assert_finite(n, "counts"), debug(x, "x")
"""
CHECKED_LINE = SOURCE.splitlines().index(next(ln for ln in SOURCE.splitlines() if "assert_finite" in ln)) + 1
GRADIENTS = ("strided", "running")             # differentiated with respect to x
SIZES = [(7, 5), (1, 1), (0, 3), (67, 71)]      # (scans go in chunks of 32: ir/ops/scan.py)
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0])


@functools.cache
def compiled() -> tuple[dict[str, Function], object]:
    """Every entry (and the gradients of GRADIENTS, `name.grad`) at each of SIZES, by
    `symbol`, and the one IREE module that holds them all."""
    import iree.runtime
    from runtime.iree import compile_mlir
    prog = dsl.loads(SOURCE, device="reference")
    fns = {}
    for sizes in SIZES:
        for name in prog.functions():
            fn = prog._specialised(prog._def(name), dict(zip("AB", sizes)))[0].function
            fns[symbol(sizes, name)] = fn
            if name in GRADIENTS:
                fns[symbol(sizes, f"{name}.grad")] = optimize(grad_function(fn, [0], with_value=True))
    ctx = iree.runtime.SystemContext(config=iree.runtime.Config("local-task"))
    vmfb = compile_mlir(module([function(fn, name) for name, fn in fns.items()]))
    ctx.add_vm_module(iree.runtime.VmModule.copy_buffer(ctx.instance, vmfb))
    return fns, ctx


def symbol(sizes: tuple[int, int], name: str) -> str:
    return f"{name.replace('.', '_')}_{sizes[0]}x{sizes[1]}"


def run(sizes: tuple[int, int], name: str, *arrays: np.ndarray) -> tuple[list, list]:
    """Entry `name` at sizes A, B on IREE and on the CPU backend."""
    from runtime.iree import _argument, _result
    fns, ctx = compiled()
    fn = fns[symbol(sizes, name)]
    out = ctx.modules.module[symbol(sizes, name)](*(_argument(a, v.dtype) for a, v in zip(arrays, fn.params)))
    got = [_result(o, v.dtype, v.shape) for o, v in zip(out if isinstance(out, (tuple, list)) else (out,),
                                                         fn.results, strict=True)]
    with np.errstate(all="ignore"):
        return got, cpu.Executable(fn, "k").run(list(arrays))


def values(shape: tuple[int, ...], dtype: str, seed: int, scale: float = 1.0) -> np.ndarray:
    """Normal values, a fifth of them NaN, ±inf, ±0.0 or ±1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * scale
    special = rng.random(shape) < 0.2
    x[special] = rng.choice(SPECIAL, special.sum())
    return x.astype(np_dtype(dtype))


def same_bits(got: list, want: list, nan_bits: bool = True) -> None:
    """Each result the same dtype, shape and bits as want's (a NaN any NaN unless nan_bits:
    NumPy's f16 arithmetic does not keep a NaN's sign as the CPU's f32 does)."""
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        if not nan_bits and g.dtype.kind == "f":
            both = np.isnan(g) & np.isnan(w)
            g, w = np.where(both, 0, g), np.where(both, 0, w)
        assert g.tobytes() == w.tobytes(), (k, g, w)


@pytest.mark.parametrize("sizes", SIZES)
def test_flips_and_negative_steps_on_iree_are_numpys(sizes):
    x = values(sizes, "f32", 0)
    got, want = run(sizes, "flips", x)
    same_bits(got, [np.flip(x, 1), np.flip(x), x[::-1], x[-1:0:-2, ::-3], x[:, ::-2]])
    same_bits(got, want)


@pytest.mark.parametrize("sizes", SIZES)
def test_cumsum_and_cumprod_on_iree_accumulate_in_numpys_order(sizes):
    """NumPy's accumulate is the scan order: y[i] = y[i-1] ⊕ x[i], one rounding a step.
    (Products of factors near 1, so that none is subnormal, which IREE flushes to 0.)"""
    x, d = values(sizes, "f32", 1), values(sizes, "f64", 2)
    p, h = 1 + values(sizes, "f32", 3, scale=0.05), 1 + values(sizes, "f16", 4, scale=0.05)
    n = np.random.default_rng(4).integers(-2 ** 31, 2 ** 31, sizes, dtype=np.int32)   # they wrap
    got, want = run(sizes, "scans", x, p, n, d, h)
    with np.errstate(all="ignore"):
        same_bits(got, [np.cumsum(x, 1), np.cumprod(p, 0), np.cumsum(n, 0, dtype=np.int32),
                        np.cumprod(n, 1, dtype=np.int32), np.cumsum(d, -1), np.cumprod(h, 1)],
                  nan_bits=False)
    same_bits(got, want)


@pytest.mark.parametrize("sizes", SIZES)
def test_gradients_through_negative_steps_and_scans_on_iree_are_numpys(sizes):
    """d/dx sum(cumsum(x) * w) is w's cumsum from the end (slices of step -1); the gradient of
    a strided slice puts w where the slice read x (unindex of negative steps)."""
    x, w = values(sizes, "f32", 5), values(sizes, "f32", 6)
    got, want = run(sizes, "running.grad", x, w)
    with np.errstate(invalid="ignore"):                   # (inf - inf)
        same_bits(got[1:], [np.flip(np.cumsum(np.flip(w, 1), 1), 1)])
    same_bits(got[1:], want[1:])
    got, want = run(sizes, "strided.grad", x, w)
    spread = np.zeros_like(w)
    spread[::-2, ::-1] = w[::-2, ::-1]
    same_bits(got[1:], [spread])
    same_bits(got[1:], want[1:])


@pytest.mark.parametrize("sizes", SIZES)
def test_logcumsumexp_on_iree_agrees_within_the_bound(sizes):
    """Each step is dslc's operations, but exp and log are IREE's (docs/numerics.md)."""
    x = values(sizes, "f32", 7, scale=3.0)
    (got,), (want,) = run(sizes, "lse", x)
    with np.errstate(invalid="ignore"):                   # (inf - inf where both are inf)
        assert not beyond_iree_bound(got, want, np.abs(want)).any(), (got, want)
    assert (np.isnan(got) == np.isnan(want)).all() and (got[np.isinf(want)] == want[np.isinf(want)]).all()


@pytest.mark.parametrize("sizes", SIZES)
def test_float_floor_division_and_modulo_on_iree_are_numpys(sizes):
    """Python's rules by NumPy's algorithm: the remainder has the divisor's sign, ±0.0 and
    ±inf and NaN as NumPy gives them, a divisor of 0 gives ±inf or NaN; f16 through f32, f64
    with ratios up to 10^600 (IREE links no f64 fmod: dslc's own, exact)."""
    a, b = values(sizes, "f32", 8, scale=8.0), values(sizes, "f32", 9, scale=3.0)
    h, g = a.astype(np.float16), b.astype(np.float16)
    powers = 10.0 ** np.random.default_rng(10).integers(-300, 300, (2, *sizes))
    d, e = a * powers[0], b * powers[1]
    got, want = run(sizes, "floor_division", a, b, h, g, d, e)
    with np.errstate(all="ignore"):
        same_bits(got, [np.mod(a, b), np.floor_divide(a, b), np.mod(h, g), np.floor_divide(h, g),
                        np.mod(d, e), np.floor_divide(d, e)])
    same_bits(got, want)


def test_float_floor_division_on_iree_is_numpys_at_the_edges():
    """Every pair of edge values: signed zeros, infinities, NaN, exact and inexact ratios, and
    ratios whose quotient (a - a % b) / b rounds below its integer (130.40001 / 1.8778121 is
    68.99999), which NumPy snaps up."""
    edges = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 0.1, 7.0, 1e30, -1e30, 2.5, np.inf,
             -np.inf, np.nan, 6.0, -2.0, 130.40001, 1.8778121, -45.772583, 1.6906437]
    wide = [1e300, -3e-300, 1.7976931348623157e308, 1e-290, 0.1, -7.0, np.nan]
    pairs = np.array([(p, q, p, q) for p in edges for q in edges] +
                     [(1, 1, p, q) for p in wide for q in wide])
    pairs = np.concatenate([pairs, np.ones((-len(pairs) % 35, 4))])
    for a, b, d, e in pairs.reshape(-1, 7, 5, 4).transpose(0, 3, 1, 2):
        a, b, ones = a.astype(np.float32), b.astype(np.float32), np.ones_like(a, np.float16)
        got, _ = run((7, 5), "floor_division", a, b, ones, ones, d, e)
        with np.errstate(all="ignore"):
            same_bits(got[:2] + got[4:], [np.mod(a, b), np.floor_divide(a, b), np.mod(d, e),
                                          np.floor_divide(d, e)])


@pytest.mark.parametrize("sizes", SIZES)
def test_shifts_on_iree_are_numpys_for_every_count(sizes):
    """Counts negative and out of range too shift every bit out (tests/test_shifts.py); a
    literal takes the other operand's dtype."""
    args = [x.reshape(sizes) for x in operands(sizes[0] * sizes[1], seed=sizes[0])]
    got, want = run(sizes, "shifts", *args)
    a, _, c, *_ = args
    same_bits(got, [*numpy_shifts(*args), np.left_shift(a, np.int32(31)), np.right_shift(a, np.int32(40)),
                    np.right_shift(c, np.int64(63)), np.left_shift(np.int64(5), c)])
    same_bits(got, want)


@pytest.mark.parametrize("sizes", [(7, 5), (0, 3)])
def test_assert_finite_on_iree_passes_finite_values_and_debug_passes_its_value_on(sizes):
    x = np.random.default_rng(10).standard_normal(sizes).astype(np.float32)
    n = np.arange(x.size, dtype=np.int32).reshape(sizes)
    got, want = run(sizes, "checked", x, n)
    same_bits(got, [x * 2, n, x])
    same_bits(got, want)


def test_assert_finite_on_iree_stops_the_call_with_its_message():
    x = np.ones((7, 5), np.float32)
    x[3, 2] = np.inf
    message = (f"<string>:{CHECKED_LINE}:10: assert_finite failed: 'doubled' has a NaN or an "
               f"infinity among its 35 values")
    with pytest.raises(Exception, match=re.escape(message)):
        run((7, 5), "checked", x, np.zeros((7, 5), np.int32))


def test_a_failed_assert_finite_on_device_iree_is_a_dsl_error_naming_the_entry():
    x = np.ones((2, 3), np.float32)
    x[1, 1] = np.nan
    raises(lambda: dsl.loads(SOURCE, device="iree").checked(x, np.zeros((2, 3), np.int32)),
           f"while running 'checked': <string>:{CHECKED_LINE}:10: assert_finite failed: 'doubled' "
           "has a NaN or an infinity among its 6 values")
