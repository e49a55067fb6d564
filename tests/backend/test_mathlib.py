"""The exact-mode math library: accuracy against NumPy, IEEE special values, the same bits from
the scalar and vector variants and at every optimisation level, and PTX that has no calls and
that ptxas accepts.

The kernels are compiled once per session by benchmarks/mathlib_ulps.py (MCJIT, O3, host CPU,
no fast-math). Float32 is measured against float64 NumPy; float64 against long double NumPy
(x87 80-bit: its own error is about 2^-11 of a double ulp), which the last test checks against
mpmath on a sample.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from conftest import benchmark

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
bench = benchmark("mathlib_ulps")

from backend import mathlib  # noqa: E402

F32, F64 = np.float32, np.float64
DTYPES = [F32, F64]
NAMES = bench.FUNCTIONS
UNARY = [n for n in NAMES if n not in mathlib.BINARY]

# The documented bounds (docs/numerics.md), in ulps.
BOUND = {
    F32: dict(exp=1, exp2=1, log=1, log2=1, sin=1, cos=1, rsqrt=1, tanh=2, sigmoid=2, pow=2,
              tan=1, atan=1, asin=1, acos=1, atan2=1,
              log1p=1, expm1=1, erf=1, erfc=1, sinh=2, cosh=2, fmod=0),
    F64: dict(exp=1, exp2=1, log=1, log2=1, sin=1, cos=1, rsqrt=1, tanh=2, sigmoid=2, pow=3,
              tan=1, atan=1, asin=1, acos=1, atan2=1,
              log1p=1, expm1=1, erf=1, erfc=1, sinh=2, cosh=2, fmod=0),
}
SAMPLES = {F32: 2_000_000, F64: 500_000}
INF, NAN = np.inf, np.nan


@pytest.fixture(scope="module")
def k():
    return bench.host_kernels(3)


def bits(a):
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def canonical_nan(dtype):
    return np.array([mathlib.F32.qnan if dtype == F32 else mathlib.F64.qnan],
                    np.uint32 if dtype == F32 else np.uint64).view(dtype)[0]


def assert_same_bits(got, want, what, canonical=True):
    """Bit-for-bit equality, every NaN being the canonical NaN (or want's own, where not
    `canonical`: compiled code against compiled code, or fmod against the C library's)."""
    if canonical:
        want = np.where(np.isnan(want), canonical_nan(got.dtype), want).astype(got.dtype)
    bad = np.flatnonzero(bits(got) != bits(want))
    assert bad.size == 0, f"{what}: at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}"


# ---------------------------------------------------------------------------------------------
# Accuracy

@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_max_ulp_error_within_documented_bound(k, name, dtype):
    worst, _, where, *_ = bench.measure(name, dtype, SAMPLES[dtype], seed=1)
    assert worst <= BOUND[dtype][name], f"{name}({where}) is {worst:.3f} ulp off"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_sincos_at_the_floats_closest_to_multiples_of_pi_over_2(k, name, dtype):
    """Where the reduced argument cancels the most: the nearest floats (and their neighbours)
    to k*pi/2, for k over the whole Cody-Waite range."""
    top = float(mathlib._format(bench.TYPES[dtype]).cody_waite_max)
    pio2 = np.longdouble("1.57079632679489661923132169163975144")
    if dtype == F32:            # every k
        kk = np.arange(1, int(top / 1.5707963267948966), dtype=np.longdouble)
    else:                       # a log-uniform sample of k
        e = np.random.default_rng(2).uniform(0, np.log2(top), 300_000)
        kk = np.unique(np.round(np.exp2(e))).astype(np.longdouble)
    x = (kk * pio2).astype(dtype)
    xs = np.concatenate([x, np.nextafter(x, dtype(INF)), np.nextafter(x, dtype(0))])
    xs = xs[np.abs(xs) <= top]
    xs = np.concatenate([xs, -xs])
    err = bench.ulp_error(k(name, xs), bench.reference(name, xs))
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"{name}({xs[i]!r}) is {err[i]:.3f} ulp off"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name, lo, hi", [
    ("exp", 88.0, 89.0), ("exp", -104.5, -86.0), ("exp2", 127.5, 128.5), ("exp2", -151.0, -125.0),
    ("sigmoid", -105.0, -86.0), ("tanh", 8.0, 10.0), ("pow", 0.0, 0.0)])
def test_near_overflow_and_underflow_thresholds(k, name, lo, hi, dtype):
    """Dense grids where results overflow to inf or become subnormal or zero (float32; for
    float64 the same places scaled by the exponent range)."""
    if dtype == F64:
        scale = 1024 / 128 if name in ("exp", "exp2", "sigmoid") else 2.0
        lo, hi = lo * scale, hi * scale
    if name == "pow":           # 2^y and 10^y across both ends of the exponent range
        e = 1100 if dtype == F64 else 155
        y = np.linspace(-e, e, 200_001).astype(dtype)
        args = (np.full_like(y, 2.0), y), (np.full_like(y, 10.0), y / dtype(3.3))
    else:
        args = ((np.linspace(lo, hi, 400_001).astype(dtype),),)
    for a in args:
        err = bench.ulp_error(k(name, *a), bench.reference(name, *a))
        i = int(np.argmax(err))
        assert err[i] <= BOUND[dtype][name], f"{name}{tuple(v[i] for v in a)}: {err[i]:.3f} ulp"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name, f32_range, f64_range", [
    ("expm1", (88.0, 89.0), (709.0, 710.0)), ("expm1", (-19.0, -15.0), (-41.0, -35.0)),
    ("sinh", (88.0, 90.0), (709.0, 711.0)), ("cosh", (-90.0, -88.0), (-711.0, -709.0)),
    ("erfc", (9.0, 10.5), (26.0, 27.5)), ("erfc", (-1.0, 1.0), (-1.0, 1.0)),
    ("erf", (0.45, 0.55), (0.45, 0.55)), ("log1p", (-1.0, -0.999), (-1.0, -0.999)),
    ("log1p", (-0.34, -0.32), (-0.34, -0.32)), ("log1p", (0.32, 0.34), (0.32, 0.34))])
def test_dense_grids_where_results_overflow_underflow_or_switch_formula(k, name, f32_range,
                                                                         f64_range, dtype):
    """Overflow of expm1, sinh, cosh (for sinh and cosh also where e^|x| overflows and e^|x|/2
    does not), expm1 reaching -1, erfc's underflow and its formula at 0, erf's switch to
    1 - erfc at 1/2, log1p near -1 and where 1 + x leaves [2/3, 4/3)."""
    lo, hi = f32_range if dtype == F32 else f64_range
    x = np.linspace(lo, hi, 400_001).astype(dtype)
    err = bench.ulp_error(k(name, x), bench.reference(name, x))
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"{name}({x[i]!r}) is {err[i]:.3f} ulp off"


# Payne-Hanek: beyond 2^22 (float) / 2^50 (double) sin and cos reduce by 2/pi's bits.
H = float.fromhex
HUGE = {
    F32: [1e10, 1e30, 3.4e38, np.finfo(F32).max, 2.0 ** 22 * (1 + 2.0 ** -23), 2.0 ** 23 + 1,
          1e22],
    F64: [1e10, 1e22, 1e30, 1e300, np.finfo(F64).max, 2.0 ** 50 * (1 + 2.0 ** -52), 2.0 ** 51 + 1],
}
# The float32 arguments nearest to a multiple of pi/2 for the largest distances of x*2/pi from
# an integer (2^-29.9 … 2^-27): a brute-force search over every mantissa of every exponent above
# 2^22 (Muller's Elementary Functions gives the first, 16367173 * 2^72). For float64 the worst
# of all (x mod pi/2 ~ 2^-61, Muller, after Lefevre), and 1.0e22, the classic test of libms.
HARDEST = {
    F32: [H(h) for h in ("0x1.f37c8ap+95", "0x1.47d0fep+34", "0x1.32ede2p+85", "0x1.628d4cp+40",
                         "0x1.130930p+76", "0x1.b08c4ap+111", "0x1.4665d2p+25", "0x1.abb4b0p+89")],
    F64: [6381956970095103 * 2.0 ** 797, 1e22, 8.0e307],
}


def _with_neighbours(x, dtype):
    """x, the floats either side of each (finite ones), and their negatives."""
    x = np.array(x, dtype)
    with np.errstate(over="ignore"):
        x = np.concatenate([x, np.nextafter(x, dtype(INF)), np.nextafter(x, dtype(0))])
    x = x[np.isfinite(x)]
    return np.concatenate([x, -x])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_sincos_at_huge_arguments(k, name, dtype):
    """Beyond the Cody-Waite range: within the bound of NumPy (float64 / long double)."""
    x = _with_neighbours(HUGE[dtype] + HARDEST[dtype], dtype)
    err = bench.ulp_error(k(name, x), bench.reference(name, x))
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"{name}({x[i]!r}) is {err[i]:.3f} ulp off"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_sincos_of_huge_arguments_against_mpmath(k, name, dtype):
    """Independent of NumPy's reduction: mpmath at 600 digits. Where x is nearest a multiple of
    pi/2 the result is x mod pi/2 itself (about 2^-30 or 2^-61), which needs every digit of
    the window."""
    mp = pytest.importorskip("mpmath")
    x = _with_neighbours(HUGE[dtype] + HARDEST[dtype], dtype)
    got = k(name, x)
    with mp.workdps(600):
        fn = getattr(mp, name)
        want = np.array([float(fn(mp.mpf(float(v)))) for v in x], np.float64)
    if dtype == F32:
        err = bench.ulp_error(got, want)
    else:   # the exact value, rounded: a bound of 1 ulp minus the rounding's 1/2
        err = bench.ulp_error(got, want) + 0.5 * (got != want)
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"{name}({x[i]!r}) = {got[i]!r}, want {want[i]!r}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_a_huge_lane_among_small_ones_gives_the_scalar_bits(k, name, dtype):
    """The vector variant branches to Payne-Hanek when any lane needs it: every lane, slow or
    fast, must still give its scalar bits, wherever the huge one sits."""
    width = bench.WIDTH[dtype]
    small = np.linspace(-3, 3, width).astype(dtype)
    x = np.tile(small, width)
    x[np.arange(width) * (width + 1)] = np.array(HUGE[dtype] * width, dtype)[:width]
    assert_same_bits(k(name, x, width=width), k(name, x), f"{name} x{width}", canonical=False)


def test_table_holds_the_digits_of_two_over_pi():
    mp = pytest.importorskip("mpmath")
    digits = mathlib.TWO_OVER_PI
    n = len(digits) - mathlib.LEAD
    with mp.workdps(n * mathlib.DIGIT // 3 + 50):
        want = int(mp.floor(2 / mp.pi * mp.mpf(2) ** (n * mathlib.DIGIT)))
    got = 0
    for d in digits:
        got = (got << mathlib.DIGIT) | d
    assert digits[:mathlib.LEAD] == [0] * mathlib.LEAD and got == want


def test_long_double_reference_agrees_with_mpmath():
    """The float64 references are long double NumPy; check a sample against mpmath."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    rng = np.random.default_rng(3)
    x = rng.uniform(-20, 20, 200)
    exact = {"exp": mp.exp, "log": lambda v: mp.log(abs(v)), "tanh": mp.tanh, "sin": mp.sin,
             "cos": mp.cos, "log1p": mp.log1p, "expm1": mp.expm1, "sinh": mp.sinh,
             "cosh": mp.cosh}
    for name, fn in exact.items():
        arg = np.abs(x) if name in ("log", "log1p") else x
        ref = bench.reference(name, arg)
        for a, r in zip(arg, ref):
            want = fn(mp.mpf(float(a)))
            got = mp.mpf(float(r)) + mp.mpf(float(r - np.longdouble(float(r))))   # all 64 bits
            assert abs(got - want) <= abs(want) * 2.0 ** -52 / 256, (name, a)


def test_erf_reference_agrees_with_mpmath():
    """NumPy has no long double erf: the float64 reference is the benchmark's own (erfcx's Taylor
    expansions); check it over the whole range against mpmath."""
    mp = pytest.importorskip("mpmath")
    rng = np.random.default_rng(6)
    x = np.concatenate([bench.log_uniform(rng, 300, 1e-300, 27.3, F64),
                        rng.uniform(-6, 27.3, 300), np.arange(-2, 27.3, 1 / 32)])
    with mp.workdps(40):
        for name, fn in (("erf", mp.erf), ("erfc", mp.erfc)):
            ref = bench.reference(name, x)
            for a, r in zip(x, ref):
                want = fn(mp.mpf(float(a)))
                assert abs(mp.mpf(str(r)) - want) <= abs(want) * 2.0 ** -60, (name, a)


# ---------------------------------------------------------------------------------------------
# Special values: exactly IEEE / NumPy.

def _specials(dtype):
    fi = np.finfo(dtype)
    return np.array([0.0, -0.0, INF, -INF, NAN, -NAN, 1.0, -1.0, 0.5, 2.0, fi.max, -fi.max,
                     fi.smallest_normal, fi.smallest_subnormal, -fi.smallest_subnormal,
                     fi.smallest_subnormal * 3, 1e-30, -1e-30], dtype)


EXACT = {  # name: [(x, f(x))] that must come out bit for bit
    "exp": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (1e4, INF), (-1e4, 0.0)],
    "exp2": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (1.0, 2.0),
             (-1.0, 0.5), (10.0, 1024.0), (1e4, INF), (-1e4, 0.0)],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN),
            (1.0, 0.0)],
    "log2": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN),
             (1.0, 0.0), (2.0, 1.0), (0.5, -1.0), (1024.0, 10.0)],
    "tanh": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (30.0, 1.0),
             (-30.0, -1.0), (1e-30, 1e-30), (-1e-30, -1e-30)],
    "sigmoid": [(0.0, 0.5), (-0.0, 0.5), (INF, 1.0), (-INF, 0.0), (NAN, NAN), (1e4, 1.0),
                (-1e4, 0.0)],
    "sin": [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-30, 1e-30),
            (-1e-30, -1e-30)],
    "cos": [(0.0, 1.0), (-0.0, 1.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-30, 1.0)],
    "rsqrt": [(0.0, INF), (-0.0, -INF), (INF, 0.0), (-INF, NAN), (-1.0, NAN), (NAN, NAN),
              (4.0, 0.5), (0.25, 2.0), (1.0, 1.0)],
    "tan": [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-30, 1e-30),
            (-1e-30, -1e-30)],
    "atan": [(0.0, 0.0), (-0.0, -0.0), (INF, np.pi / 2), (-INF, -np.pi / 2), (NAN, NAN),
             (1e30, np.pi / 2), (-1e30, -np.pi / 2), (1e-30, 1e-30), (-1e-30, -1e-30)],
    "asin": [(0.0, 0.0), (-0.0, -0.0), (1.0, np.pi / 2), (-1.0, -np.pi / 2), (1.5, NAN),
             (-1.5, NAN), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-30, 1e-30), (-1e-30, -1e-30)],
    "acos": [(1.0, 0.0), (-1.0, np.pi), (0.0, np.pi / 2), (-0.0, np.pi / 2), (1.5, NAN),
             (-1.5, NAN), (INF, NAN), (-INF, NAN), (NAN, NAN), (1e-30, np.pi / 2)],
    "log1p": [(0.0, 0.0), (-0.0, -0.0), (-1.0, -INF), (-2.0, NAN), (-INF, NAN), (INF, INF),
              (NAN, NAN), (1e-30, 1e-30), (-1e-30, -1e-30)],
    "expm1": [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -1.0), (NAN, NAN), (1e4, INF),
              (-50.0, -1.0), (-1e4, -1.0), (1e-30, 1e-30), (-1e-30, -1e-30)],
    "sinh": [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN), (1e4, INF),
             (-1e4, -INF), (1e-30, 1e-30), (-1e-30, -1e-30)],
    "cosh": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, INF), (NAN, NAN), (1e4, INF),
             (-1e4, INF), (1e-30, 1.0), (-1e-30, 1.0)],
    "erf": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (10.0, 1.0),
            (-10.0, -1.0), (1e4, 1.0)],
    "erfc": [(0.0, 1.0), (-0.0, 1.0), (INF, 0.0), (-INF, 2.0), (NAN, NAN), (30.0, 0.0),
             (-30.0, 2.0), (1e4, 0.0), (-1e4, 2.0)],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", UNARY)
def test_special_values_exact(k, name, dtype):
    x, want = (np.array(v, dtype) for v in zip(*EXACT[name]))
    assert_same_bits(k(name, x), want, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", UNARY)
def test_subnormal_and_extreme_arguments(k, name, dtype):
    x = _specials(dtype)
    x = x[np.isfinite(x)]
    err = bench.ulp_error(k(name, x), bench.reference(name, x))
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"{name}({x[i]!r}) is {err[i]:.3f} ulp off"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_powers_of_two_are_exact(k, dtype):
    fi = np.finfo(dtype)
    e = np.arange(fi.minexp - fi.nmant, fi.maxexp, dtype=np.int64)
    p = np.ldexp(np.ones(len(e), dtype), e.astype(np.int32))
    assert_same_bits(k("exp2", e.astype(dtype)), p, "exp2")
    assert_same_bits(k("log2", p), e.astype(dtype), "log2")
    beyond = np.array([fi.maxexp, fi.minexp - fi.nmant - 1], dtype)   # inf; a tie, to 0
    assert_same_bits(k("exp2", beyond), np.array([INF, 0.0], dtype), "exp2")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_pow_special_cases_match_numpy(k, dtype):
    """C99 Annex F / NumPy `power`: every pairing of the special operands, bit for bit where the
    result is 0, inf, NaN or exactly representable, within the bound elsewhere."""
    big_odd = 2.0 ** (24 if dtype == F32 else 53) - 1
    vals = np.array([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5,
                     -2.5, 10.0, big_odd, -big_odd, 2 * big_odd, 1e-30, 1e30], dtype)
    x, y = (a.ravel() for a in np.meshgrid(vals, vals, indexing="ij"))
    got = k("pow", x, y)
    with np.errstate(all="ignore"):
        want = np.power(x, y)
    exact = ~np.isfinite(want) | (want == 0) | (np.abs(x) == 1) | (y == 0) | (x == 2) | (y == 1)
    exact &= ~((np.abs(x) == 2) & (np.abs(y) > 1e6))     # 2^(2^53-1): finite rounding elsewhere
    assert_same_bits(got[exact], want[exact], "pow specials")
    err = bench.ulp_error(got[~exact], bench.reference("pow", x[~exact], y[~exact]))
    assert err.max() <= BOUND[dtype]["pow"], list(zip(x[~exact][err > 2], y[~exact][err > 2]))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_pow_negative_base(k, dtype):
    rng = np.random.default_rng(4)
    x = -rng.uniform(0.1, 10, 10_000).astype(dtype)
    y = np.round(rng.uniform(-30, 30, 10_000)).astype(dtype)           # integers: odd flips sign
    err = bench.ulp_error(k("pow", x, y), bench.reference("pow", x, y))
    assert err.max() <= BOUND[dtype]["pow"]
    frac = (y + dtype(0.5))
    assert np.isnan(k("pow", x, frac)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_atan2_special_cases(k, dtype):
    """C99 Annex F: every pairing of signed zeros, infinities, NaN and finite operands, bit for
    bit (the sign included) where an operand is 0 or infinite, within the bound elsewhere."""
    fi = np.finfo(dtype)
    vals = np.array([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -3.0, fi.max, -fi.max,
                     fi.smallest_subnormal, -fi.smallest_subnormal, 1e-30, -1e30], dtype)
    y, x = (a.ravel() for a in np.meshgrid(vals, vals, indexing="ij"))
    got, want = k("atan2", y, x), bench.reference("atan2", y, x)
    exact = np.isin(y, [0.0, INF, -INF]) | np.isin(x, [0.0, INF, -INF]) | np.isnan(want)
    assert_same_bits(got[exact], want[exact], "atan2 specials")
    err = bench.ulp_error(got[~exact], want[~exact])
    assert err.max() <= BOUND[dtype]["atan2"], list(zip(y[~exact][err > 1], x[~exact][err > 1]))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_atan2_where_y_over_x_underflows_or_overflows(k, dtype):
    """Every pair of exponents (float64: a sample), subnormals included, in all four quadrants:
    y/x is never formed, so a quotient beyond the exponent range costs no accuracy."""
    fi = np.finfo(dtype)
    e = np.arange(fi.minexp - fi.nmant, fi.maxexp, 1 if dtype == F32 else 7)
    ey, ex = (a.ravel() for a in np.meshgrid(e, e))
    rng = np.random.default_rng(6)
    y, x = (np.ldexp(rng.uniform(1, 2, len(ey)), v).astype(dtype) for v in (ey, ex))
    y, x = np.concatenate([y, -y, y, -y]), np.concatenate([x, x, -x, -x])
    err = bench.ulp_error(k("atan2", y, x), bench.reference("atan2", y, x))
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype]["atan2"], f"atan2({y[i]!r}, {x[i]!r}) is {err[i]:.3f} ulp off"


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["asin", "acos"])
def test_asin_acos_at_consecutive_floats_near_one_and_one_half(k, name, dtype):
    """Where asin's reduction changes (|x| = 1/2) and where sqrt((1 - |x|)/2) is tiny (|x| near
    1): the 2^16 floats on either side, of both signs."""
    ints = np.uint32 if dtype == F32 else np.uint64
    at = np.array([0.5, 1.0], dtype).view(ints)
    x = np.concatenate([np.arange(a - 2 ** 16, a + 2 ** 16, dtype=ints) for a in at]).view(dtype)
    x = np.concatenate([x, -x])
    err = bench.ulp_error(k(name, x), bench.reference(name, x))
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"{name}({x[i]!r}) is {err[i]:.3f} ulp off"


def test_long_double_references_of_tan_and_the_inverse_functions_agree_with_mpmath():
    """As the test above, for tan, atan, asin, acos and atan2."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    rng = np.random.default_rng(7)
    x, t = rng.uniform(-20, 20, 200), rng.uniform(-1, 1, 200)
    cases = [("tan", mp.tan, (x,)), ("atan", mp.atan, (x,)), ("asin", mp.asin, (t,)),
             ("acos", mp.acos, (t,)), ("atan2", mp.atan2, (t, x))]
    for name, fn, args in cases:
        ref = bench.reference(name, *args)
        for *a, r in zip(*args, ref):
            want = fn(*(mp.mpf(float(v)) for v in a))
            got = mp.mpf(float(r)) + mp.mpf(float(r - np.longdouble(float(r))))
            assert abs(got - want) <= abs(want) * 2.0 ** -52 / 256, (name, a)


# ---------------------------------------------------------------------------------------------
# Same bits: vector vs scalar, O0 vs O3.

def _mixed_inputs(name, dtype, n=1 << 16):
    args = bench.inputs(name, n, np.random.default_rng(5), dtype)
    specials = _specials(dtype)
    if name in mathlib.BINARY:
        sx, sy = np.meshgrid(specials, specials)
        return tuple(np.concatenate([a, s.ravel()]) for a, s in zip(args, (sx, sy)))
    return (np.concatenate([args[0], specials]),)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_vector_variant_gives_the_scalar_bits(k, name, dtype):
    args = _mixed_inputs(name, dtype)
    scalar = k(name, *args)
    vector = k(name, *args, width=bench.WIDTH[dtype])
    assert_same_bits(vector, scalar, f"{name} x{bench.WIDTH[dtype]}", canonical=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fmod_gives_the_c_librarys_bits(k, dtype):
    """fmod is exact: the C library's bits (NumPy's fmod), signed zeros, the widest gaps between
    exponents and its NaNs included, from the scalar and the vector code."""
    x, y = _mixed_inputs("fmod", dtype)
    fi = np.finfo(dtype)
    edges = np.array([fi.max, -fi.max, fi.smallest_subnormal, -fi.smallest_normal,
                      np.nextafter(fi.smallest_normal, 0), 1.0, 3.0, -0.0], dtype)
    ex, ey = np.meshgrid(edges, edges)
    x, y = np.concatenate([x, ex.ravel()]), np.concatenate([y, ey.ravel()])
    with np.errstate(all="ignore"):
        want = np.fmod(x, y)
    for width in (1, bench.WIDTH[dtype]):
        assert_same_bits(k("fmod", x, y, width=width), want, f"fmod x{width}", canonical=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_unoptimised_code_gives_the_same_bits(k, dtype):
    """O3 must not change a result: no contraction, no reassociation, no libm."""
    k0 = bench.host_kernels(0)
    for name in NAMES:
        args = _mixed_inputs(name, dtype, 1 << 12)
        assert_same_bits(k0(name, *args), k(name, *args), f"{name} at O0", canonical=False)


def test_emitted_ir_uses_only_fma_and_sqrt_without_fast_math():
    text = str(bench.host_module())
    called = set(re.findall(r"call [^@]*@\"?([\w.]+)", text))
    assert called, "no fma at all?"
    assert all(re.fullmatch(r"llvm\.(fma|sqrt)\.(v\d+)?f(32|64)", c) for c in called), called
    flags = r"\b(fast|contract|reassoc|nnan|ninf|nsz|arcp|afn)\b"
    assert not re.search(r"= f(add|sub|mul|div|neg|cmp)[^\n]*" + flags, text)


def test_functions_reject_non_float_types():
    b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
                     .append_basic_block())
    with pytest.raises(TypeError, match="float, double"):
        mathlib.exp(b, ir.Constant(ir.IntType(32), 1))


# ---------------------------------------------------------------------------------------------
# NVPTX: no calls (LLVM aborts on llvm.exp & co. there), no approximate instructions, no
# contraction, and ptxas accepts it.

@pytest.fixture(scope="module")
def ptx():
    return bench.emit_ptx()


def test_ptx_has_no_calls_and_only_ieee_rounded_float_ops(ptx):
    assert ".entry exp_float32_x1" in ptx and ".entry pow_float64_x4" in ptx
    assert not re.search(r"^\s*call", ptx, re.M), "a call in the PTX"
    assert ".approx" not in ptx and "ex2" not in ptx and "lg2" not in ptx
    float_ops = set(re.findall(r"^\s+((?:add|sub|mul|fma|div|sqrt|rcp|rsqrt)\.[\w.]*f(?:32|64))",
                               ptx, re.M))
    assert all(re.search(r"\.rn\.", op) for op in float_ops), float_ops


def test_ptx_fma_count_is_the_explicit_ones():
    """Without contract flags NVPTX never fuses mul+add: the scalar kernels hold no more fma.rn
    than the llvm.fma calls the library emitted."""
    for name in NAMES:
        text = bench.emit_ptx([name])
        module = str(bench.nvptx_module([name]))
        for dtype, t in (("float32", "f32"), ("float64", "f64")):
            entry = text.split(f".entry {name}_{dtype}_x1")[1].split(".entry")[0]
            body = module.split(f'@"{name}_{dtype}_x1"')[1].split("define")[0]
            calls = len(re.findall(rf'call \w+ @"llvm\.fma\.{t}"', body))
            assert 0 < entry.count(f"fma.rn.{t}") <= calls, name


def test_ptxas_accepts_the_ptx(ptx, tmp_path):
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas is not on the PATH")
    src = tmp_path / "mathlib.ptx"
    src.write_text(ptx)
    run = subprocess.run([ptxas, "-arch=sm_90", str(src), "-o", str(tmp_path / "mathlib.cubin")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.gpu
def test_gpu_gives_the_cpu_bits(k, ptx, tmp_path):
    """Run every kernel on the GPU (through CuPy) and compare with the host, bit for bit."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no usable CUDA driver")
    path = tmp_path / "mathlib.ptx"
    path.write_text(ptx)
    module = cupy.RawModule(path=str(path))
    for dtype in DTYPES:
        for name in NAMES:
            args = _mixed_inputs(name, dtype)
            want = k(name, *args)
            for width in (1, bench.WIDTH[dtype]):
                n = len(args[0]) - len(args[0]) % width
                dev = [cupy.asarray(a[:n]) for a in args]
                out = cupy.empty(n, dtype)
                threads = n // width
                kern = module.get_function(bench.kernel_name(name, dtype, width))
                kern(((threads + 127) // 128,), (128,), (*dev, out, np.int64(n)))
                assert_same_bits(cupy.asnumpy(out), want[:n], f"{name} {dtype.__name__} on GPU",
                                 canonical=False)
