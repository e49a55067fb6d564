"""The CPU backend against the reference interpreter (the definition): the same bits wherever
the operations are the same (arithmetic, comparisons, casts, sqrt, reductions in the
canonical order, whole programs without transcendental functions); within the math library's
documented ulps where the interpreter's NumPy exp, log, tanh… differ from the compiled ones
(docs/numerics.md); and the same bits whatever the number of threads."""
from __future__ import annotations

import os
import sys
from math import prod
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend.schedule import KernelStep
from conftest import isolated
from ir import interp
from ir.core import Builder, tensor_type
from ir.ops.base import np_dtype
from ir.ops.shape import SliceSpec
from runtime.cpu import Executable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import test_programs as programs  # noqa: E402

rng = np.random.default_rng(3)
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3.4e38,
                    -3.4e38, 0.5, 2.5], np.float32)

PROGRAMS = {
    "mlp": (programs.mlp_inputs, ("p", "x")),
    "layer_norm": (programs.layer_norm_inputs, ("p", "x")),
    "attention": (programs.attention_inputs, ("q", "k", "v")),
    "lstm": (programs.lstm_inputs, ("p", "xs", "h0", "c0")),
    "conv2d": (programs.conv_inputs, ("x", "w", "b")),
}


def leaves(v) -> list:
    if isinstance(v, dict):
        return [x for k in sorted(v) for x in leaves(v[k])]
    if isinstance(v, (tuple, list)):
        return [x for i in v for x in leaves(i)]
    return [np.asarray(v)]


def same_bits(got, want) -> None:
    for g, w in zip(leaves(got), leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes(), f"max difference {np.nanmax(np.abs(g - w))}"


TRANSCENDENTAL = {"mlp", "attention", "lstm"}     # tanh, exp, log, sigmoid: the math library's


def close(got, want) -> None:
    """Agreement a few ulps of the math library allow after propagation through a program."""
    for g, w in zip(leaves(got), leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7 * max(1.0, float(np.abs(w).max())))


@pytest.mark.parametrize("name", PROGRAMS)
def test_programs_forward_and_backward_match_the_reference(name):
    make, wrt = PROGRAMS[name]
    path = str(programs.PROGRAMS / f"{name}.bend")
    cpu, ref = dsl.load(path, device="cpu"), dsl.load(path, device="reference")
    args = make(0)
    check = close if name in TRANSCENDENTAL else same_bits
    check(cpu.loss(**args), ref.loss(**args))
    check(cpu.value_and_grad("loss", wrt=wrt)(**args), ref.value_and_grad("loss", wrt=wrt)(**args))


@pytest.mark.parametrize("prim, bound", [("exp", 1), ("exp2", 1), ("log", 1), ("log2", 1),
                                         ("tanh", 2), ("sigmoid", 2), ("sin", 1), ("cos", 1)])
def test_math_kernels_are_within_their_documented_ulps(prim, bound):
    x = np.concatenate([rng.standard_normal(5000) * 10, rng.uniform(1e-3, 80, 5000)]).astype(np.float32)
    if prim.startswith("log"):
        x = np.abs(x) + np.float32(1e-30)
    got, want, _ = run_both(lambda b, v: [b.emit(prim, v)], x)
    exact = getattr(np, prim)(x.astype(np.float64)) if prim != "sigmoid" else 1 / (1 + np.exp(-x.astype(np.float64)))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[0].astype(np.float64) - exact) / ulp) <= bound


def test_pow_kernels_are_the_math_librarys_within_its_ulps():
    """x ** y is compiled from backend/mathlib.py's pow (2 ulp in float32, docs/numerics.md),
    never libm's; its special values are C99's (NumPy's)."""
    x = np.exp(rng.uniform(-20, 20, 20000)).astype(np.float32) * rng.choice([-1, 1], 20000)
    y = np.where(rng.random(20000) < 0.3, rng.integers(-5, 6, 20000),
                 rng.uniform(-4, 4, 20000)).astype(np.float32)
    x = np.concatenate([x, np.repeat(SPECIAL, len(SPECIAL))]).astype(np.float32)
    y = np.concatenate([y, np.tile(SPECIAL, len(SPECIAL))]).astype(np.float32)
    got, _, _ = run_both(lambda b, u, v: [b.emit("pow", u, v)], x, y)
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), y.astype(np.float64))
        rounded = exact.astype(np.float32)
    # infinities (overflow included), zeros, NaNs and exact ones: the same value and sign
    special = ~np.isfinite(rounded) | (exact == 0) | (np.abs(exact) == 1)
    ulp = np.spacing(np.abs(rounded[~special])).astype(np.float64)     # (subnormal ones too)
    assert np.max(np.abs(got[0][~special] - exact[~special]) / ulp) <= 2
    assert np.array_equal(got[0][special], rounded[special], equal_nan=True)
    signed = special & ~np.isnan(rounded)                   # (a NaN's sign means nothing)
    assert np.array_equal(np.signbit(got[0][signed]), np.signbit(rounded[signed]))


def run_both(build, *arrays):
    b = Builder()
    params = [b.param(tensor_type(str(a.dtype).replace("float", "f").replace("int", "i")
                                  .replace("f32", "f32"), a.shape)) for a in arrays]
    fn = b.finish(list(build(b, *params)))
    exe = Executable(fn)
    assert any(isinstance(s, KernelStep) for s in exe.plan.steps), "nothing was compiled"
    return exe.run(list(arrays)), interp.run(fn, list(arrays)), exe


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("prim", ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne",
                                  "lt", "le", "gt", "ge", "tanh_grad", "sigmoid_grad"])
def test_binary_kernels_on_special_values(prim):
    a = np.repeat(SPECIAL, len(SPECIAL))
    c = np.tile(SPECIAL, len(SPECIAL))
    got, want, _ = run_both(lambda b, x, y: [b.emit(prim, x, y)], a, c)
    same_bits(got, want)


@pytest.mark.parametrize("prim", ["neg", "abs", "sqrt", "rsqrt", "floor"])
def test_unary_kernels_on_special_values(prim):
    got, want, _ = run_both(lambda b, x: [b.emit(prim, x)], SPECIAL)
    same_bits(got, want)


def test_a_fused_chain_with_broadcasting_where_and_casts():
    def build(b, x, y):
        z = b.emit("add", b.emit("mul", x, y), b.constant(1.5, "f32"))
        m = b.emit("where", b.emit("gt", z, b.constant(0.0, "f32")), z, b.emit("neg", z))
        return [m, b.emit("cast", b.emit("lt", m, y), dtype="f32"), b.emit("cast", m, dtype="f64")]
    got, want, exe = run_both(build, f32(33, 17), f32(17))
    same_bits(got, want)
    assert len(exe.plan.kernels) == 1            # one fused loop nest


@pytest.mark.parametrize("shape, axis", [((5000,), None), ((3, 70), 1), ((70, 3), 0),
                                         ((2, 3, 4, 5), (1, 2)), ((9000, 2), 0), ((7,), 0),
                                         ((2, 40000), -1), ((4, 1), (0, 1)), ((7, 70), 0),
                                         ((5000, 40), 0), ((3, 33, 100), 1), ((16, 8, 65), 0)])
@pytest.mark.parametrize("prim", ["sum", "mean", "max", "min"])
def test_reductions_follow_the_canonical_order(prim, shape, axis):
    x = f32(*shape) * np.float32(10.0) ** rng.integers(-3, 4, shape).astype(np.float32)
    got, want, _ = run_both(lambda b, v: [b.emit(prim, v, axis=axis)], x)
    same_bits(got, want)


@pytest.mark.parametrize("shape, axis", [((5000,), None), ((3, 70), 1), ((70, 3), 0),
                                         ((2, 3, 4, 5), (1, 2)), ((9000, 2), 0), ((7,), 0),
                                         ((2, 40000), -1), ((5000, 40), 0), ((3, 33, 100), 1)])
def test_products_follow_the_canonical_order(shape, axis):
    # near ±1, so that a product of thousands of terms stays finite and rounds at every step
    x = (rng.uniform(0.999, 1.001, shape) * rng.choice([-1, 1], shape)).astype(np.float32)
    got, want, _ = run_both(lambda b, v: [b.emit("prod", v, axis=axis),
                                          b.emit("prod", b.emit("mul", v, v), axis=axis)], x)
    same_bits(got, want)


def test_products_of_nan_infinities_and_signed_zeros():
    """Signed zeros and infinities as the canonical order makes them; NaN where it makes one
    (0 * inf: its sign and payload are the hardware's, docs/numerics.md)."""
    x = np.tile(np.array([[-0.0], [0.0], [np.nan], [-np.inf], [1.0]], np.float32), (1, 70))
    x[2, ::3] = -0.0
    x[3, ::6] = 3.0
    for axis in (0, 1):
        (got,), (want,), _ = run_both(lambda b, v: [b.emit("prod", v, axis=axis)], x)
        nan = np.isnan(want)
        assert np.array_equal(got, want, equal_nan=True) and nan.any() and (~nan).any()
        assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_products_do_not_depend_on_the_thread_count(monkeypatch, threads):
    monkeypatch.setenv("DSLC_THREADS", threads)
    x = rng.uniform(0.99, 1.01, (2048, 300)).astype(np.float32)
    got, want, _ = run_both(lambda b, v: [b.emit("prod", v, axis=1), b.emit("prod", v, axis=0)], x)
    same_bits(got, want)


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("shape, axis, rows", [((2048, 300), -1, True), ((2048, 300), 0, False),
                                               ((5, 7, 9), (1, 2), True), ((3, 1), 1, True),
                                               ((4, 0), 1, False)])
def test_variances_are_their_operations_compiled(monkeypatch, threads, shape, axis, rows):
    """var and std are mean, sub, mul, sum and div: the same bits (NaN's sign aside, where
    there is one term and a correction of 1), one row kernel over rows."""
    monkeypatch.setenv("DSLC_THREADS", threads)
    x = f32(*shape) * 5 + 2
    got, want, exe = run_both(lambda b, v: [b.emit("var", v, axis=axis),
                                            b.emit("std", v, axis=axis, correction=1)], x)
    for g, w in zip(got, want):
        assert np.array_equal(g, w, equal_nan=True)
    assert rows == any(k.is_rows for k in exe.plan.kernels)


# Reductions longer than a chunk combine each chunk's result as it comes (ir/numerics.py's
# tree over chunks of chunks): 4096² + 5 has three levels. Each shape runs in a child process,
# so that a crash (a stack overflowed by partial results, a misaligned vector load: both
# happened) fails this test instead of ending the run.
LONG = [((200_000,), None), ((1_000_000,), None), ((4096 * 4096 + 5,), None),
        ((300_000, 3), 0), ((3, 300_000), 1), ((2, 4096 * 33 + 1, 2), 1), ((40, 40_000), 0)]


def long_reductions(case) -> None:
    shape, axis = case
    x = f32(*shape)
    for threads in ("1", "2", "3"):
        os.environ["DSLC_THREADS"] = threads
        for prim in ("sum", "mean", "max", "min"):
            got, want, _ = run_both(lambda b, v: [b.emit(prim, v, axis=axis)], x)
            same_bits(got, want)


@pytest.mark.parametrize("shape, axis", LONG)
def test_long_reductions_follow_the_canonical_order_on_any_thread_count(shape, axis):
    [(_, outcome, value)] = isolated(long_reductions, [(shape, axis)], timeout=600)
    assert outcome == "ok", value


@pytest.mark.parametrize("shape, axis", [((0,), None), ((0, 5), 0), ((5, 0), 1), ((3, 0, 4), (0, 1)),
                                         ((0, 5), 1), ((0, 3, 0), 2)])
def test_empty_reductions_are_their_identity_and_a_mean_of_nothing_is_nan(shape, axis):
    x = np.zeros(shape, np.float32)
    for prim in ("sum", "prod", "mean", "max", "min"):
        (got,), (want,), _ = run_both(lambda b, v: [b.emit(prim, v, axis=axis)], x)
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
        assert np.array_equal(np.signbit(got), np.signbit(want)) or prim == "mean"  # a NaN's sign
        assert got.size == 0 or np.all(np.isnan(got)) == (prim == "mean")


def test_reductions_of_nan_and_signed_zeros():
    x = np.array([[-0.0, -0.0, -0.0], [0.0, -0.0, np.nan], [-np.inf, -np.inf, 1.0]], np.float32)
    for prim in ("sum", "max", "min"):
        got, want, _ = run_both(lambda b, v: [b.emit(prim, v, axis=1)], x)
        same_bits(got, want)


def test_column_reductions_of_nan_and_signed_zeros():
    # reduced over a strided axis, 32 result points side by side (and the rest one by one)
    x = np.tile(np.array([[-0.0], [0.0], [np.nan], [-np.inf], [1.0]], np.float32), (1, 70))
    x[2, ::3] = -0.0
    for prim in ("sum", "max", "min", "mean"):
        got, want, _ = run_both(lambda b, v: [b.emit(prim, v, axis=0)], x)
        same_bits(got, want)


def test_results_do_not_depend_on_the_thread_count(monkeypatch):
    x = f32(512, 300)
    got = {}
    for n in ("1", "2", "3"):
        monkeypatch.setenv("DSLC_THREADS", n)
        out, want, _ = run_both(lambda b, v: [b.emit("sum", b.emit("mul", v, v), axis=1),
                                              b.emit("max", v, axis=0)], x)
        got[n] = out
        same_bits(out, want)
    same_bits(got["1"], got["3"])


@pytest.mark.parametrize("sa, sb", [((7, 13), (13, 29)), ((13,), (13, 5)), ((4, 13), (13,)),
                                    ((2, 3, 8, 16), (16, 5)), ((3, 1, 9, 4), (2, 4, 6))])
def test_matmul_runs_on_the_contraction_kernel_with_the_reference_bits(sa, sb):
    from backend.schedule import ContractStep
    got, want, exe = run_both_any(lambda b, x, y: [b.emit("matmul", x, y)], f32(*sa), f32(*sb))
    assert any(isinstance(s, ContractStep) for s in exe.plan.steps)
    same_bits(got, want)


def test_attention_einsums_become_matrix_products():
    from backend.schedule import ContractStep
    q, k = f32(2, 3, 5, 8), f32(2, 3, 6, 8)
    got, want, exe = run_both_any(lambda b, x, y: [b.emit("einsum", x, y, spec="bhtd,bhsd->bhts")], q, k)
    assert any(isinstance(s, ContractStep) for s in exe.plan.steps)
    same_bits(got, want)


def run_both_any(build, *arrays):
    """Like run_both, without requiring a loop kernel."""
    b = Builder()
    params = [b.param(tensor_type("f32", a.shape)) for a in arrays]
    fn = b.finish(list(build(b, *params)))
    exe = Executable(fn)
    return exe.run(list(arrays)), interp.run(fn, list(arrays)), exe


@pytest.mark.parametrize("name", PROGRAMS)
def test_programs_give_the_same_bits_on_every_run_and_thread_count(name, monkeypatch):
    make, wrt = PROGRAMS[name]
    prog = dsl.load(str(programs.PROGRAMS / f"{name}.bend"), device="cpu")
    args = make(1)
    runs = []
    for threads in ("1", "2", "2", "1", "2"):
        monkeypatch.setenv("DSLC_THREADS", threads)
        runs.append(prog.value_and_grad("loss", wrt=wrt)(**args))
    for other in runs[1:]:
        same_bits(other, runs[0])


def test_a_transpose_feeding_a_kernel_is_a_strided_load():
    from backend.schedule import HostStep
    def build(b, x, y):
        t = b.emit("transpose", x, perm=(1, 0))
        return [b.emit("add", b.emit("mul", t, y), b.constant(1.0, "f32"))]
    got, want, exe = run_both(build, f32(17, 33), f32(33, 17))
    same_bits(got, want)
    assert not any(isinstance(s, HostStep) and s.op.primitive.name == "transpose" for s in exe.plan.steps)
    (load,) = [i.load for k in exe.plan.kernels for i in k.body if i.load is not None and i.load.buffer == 0]
    assert load.strides == (1, 33)


def test_slices_reshapes_and_broadcasts_are_read_in_place():
    def build(b, x, y):
        s = b.emit("index", x, items=(1, SliceSpec(2, 14, 3), SliceSpec()))     # [4, 6]
        r = b.emit("reshape", b.emit("transpose", s, perm=(1, 0)), shape=(6, 2, 2))
        e = b.emit("expand_dims", b.emit("broadcast_to", y, shape=(2, 2)), axis=0)
        return [b.emit("sub", r, e), r]
    got, want, exe = run_both(build, f32(3, 15, 6), f32(2))
    same_bits(got, want)
    assert {type(s).__name__ for s in exe.plan.steps} <= {"KernelStep", "ViewStep"}


@pytest.mark.parametrize("perm, axis", [((1, 0, 2), (1, 2)), ((2, 0, 1), (1, 2)), ((0, 2, 1), 1)])
def test_reductions_of_views_follow_the_canonical_order(perm, axis):
    # a transposed input whose reduced axes read as one stride is reduced in place; one whose
    # axes do not is first copied by a kernel
    got, want, _ = run_both(lambda b, v: [b.emit("sum", b.emit("transpose", v, perm=perm), axis=axis)],
                            f32(5, 40, 70))
    same_bits(got, want)


def test_a_contraction_reads_a_transposed_operand_in_place():
    from backend.schedule import ContractStep, ViewStep
    def build(b, x, y):
        return [b.emit("matmul", b.emit("transpose", x, perm=(0, 2, 1)), b.emit("transpose", y))]
    got, want, exe = run_both_any(build, f32(3, 40, 24), f32(50, 40))
    same_bits(got, want)
    assert sum(isinstance(s, ViewStep) for s in exe.plan.steps) == 2
    assert any(isinstance(s, ContractStep) for s in exe.plan.steps)


def test_a_run_of_small_kernels_is_one_call_with_the_same_bits():
    from runtime.cpu import _in_run
    def build(b, x, w):
        h = b.emit("sum", b.emit("mul", x, w), axis=1, keepdims=True)        # map, reduction
        y = b.emit("sub", x, h)                                              # map
        m = b.emit("max", y, axis=0)                                         # reduction
        return [m, b.emit("mul", y, m)]                                      # map, result
    got, want, exe = run_both(build, f32(40, 30), f32(30))
    same_bits(got, want)
    assert sum(launch is _in_run for launch in exe.launches) >= 2


def test_a_reduction_computes_its_input_in_its_own_loop():
    # the variance of layer norm: (x - mean)^2 is made inside the reduction, never stored
    def build(b, x, g):
        mu = b.emit("mean", x, axis=-1, keepdims=True)
        d = b.emit("sub", x, mu)
        square = b.emit("mul", d, d)
        var = b.emit("mean", square, axis=-1, keepdims=True)
        y = b.emit("mul", b.emit("mul", d, b.emit("rsqrt", b.emit("add", var, b.constant(1e-5, "f32")))), g)
        return [y, b.emit("sum", b.emit("mul", y, g), axis=0)]
    got, want, exe = run_both(build, f32(6, 50, 70), f32(70))
    same_bits(got, want)
    written = {v for s in exe.plan.steps if isinstance(s, KernelStep) for v in s.writes}
    (square,) = [op.outputs[0] for op in exe.function.ops if op.primitive.name == "mul"][:1]
    assert square not in written
    stages = [s for k in exe.plan.kernels for s in k.stages or (k,)]
    assert any(s.is_reduction and len(s.body) > 1 for s in stages)


@pytest.mark.parametrize("prim", ["abs", "sqrt", "floor"])
def test_a_reduction_computes_intrinsics_of_its_input_in_its_lanes(prim):
    """sum(abs(x)) (an L1 norm): the reduction computes abs in its loop, on lane vectors,
    whose LLVM intrinsics (llvm.fabs.v8f32…) are named by hand."""
    got, want, exe = run_both(lambda b, v: [b.emit("sum", b.emit(prim, b.emit("abs", v)), axis=-1)],
                              f32(8, 333))
    same_bits(got, want)
    assert len(exe.plan.steps) == 1


def test_a_reduction_not_broadcast_back_computes_its_input_in_its_own_loop():
    def build(b, x, y):
        return [b.emit("sum", b.emit("exp", b.emit("mul", x, y)), axis=-1)]
    got, want, exe = run_both(build, f32(6, 50, 70), f32(70))
    close(got, want)
    (k,) = exe.plan.kernels
    assert k.is_reduction and not k.is_rows and len(k.body) == 4


@pytest.mark.parametrize("dtype", ["i32", "i64", "u32"])
def test_one_hot_is_a_comparison_fused_into_its_kernel(dtype):
    """one_hot(y, n) runs as cast(y[..., None] == arange(n)) inside the kernel that uses it
    (the target pick of a cross-entropy), not on the host: the interpreter's bits, indices out
    of range (a zero row) included."""
    from backend.schedule import HostStep
    def build(b, z, y):
        pick = b.emit("mul", z, b.emit("one_hot", y, n=7, dtype="f32"))
        return [b.emit("sum", pick, axis=-1)]
    arrays = [f32(2, 3, 7), np.array([[0, 6, 7], [-1, 3, 3]]).astype(np_dtype(dtype))]
    b = Builder()
    z, y = b.param(tensor_type("f32", (2, 3, 7))), b.param(tensor_type(dtype, (2, 3)))
    fn = b.finish(build(b, z, y))
    exe = Executable(fn)
    same_bits(exe.run(arrays), interp.run(fn, arrays))
    assert not any(isinstance(s, HostStep) and s.op.primitive.name in ("one_hot", "eq", "cast") for s in exe.plan.steps)


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_an_integer_to_a_negative_power_is_a_run_time_error(device):
    prog = dsl.loads("def f(x: i32[N], y: i32[N]) -> i32[N]:\n  return x ** y\n", device=device)
    x = np.array([2, 3, 4], np.int32)
    np.testing.assert_array_equal(prog.f(x, np.array([0, 2, 3], np.int32)), [1, 9, 64])
    with pytest.raises(dsl.DslError, match="an integer to a negative integer power"):
        prog.f(x, np.array([1, -1, 2], np.int32))


@pytest.mark.parametrize("prim", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_bool_comparisons_order_false_before_true(prim):
    """As NumPy does; an i1 compared signed takes True for -1 (found by the fuzzer)."""
    a = np.array([False, False, True, True])
    c = np.array([False, True, False, True])
    got, want, _ = run_both(lambda b, u, v: [b.emit(prim, u, v), b.emit("max", u), b.emit("min", u)], a, c)
    same_bits(got, want)


@pytest.mark.parametrize("exponent", [0.5, 2.0, -1.0, 3.0, -0.5])
def test_a_power_by_a_scalar_has_c99s_special_values_on_every_device(exponent):
    """NumPy computes x ** 0.5 by a scalar as sqrt(x), giving -0.0 and NaN at -0.0 and -inf
    where C99's pow (the definition, the math library's, NumPy's for an array of exponents)
    gives +0.0 and +inf (found by the fuzzer's campaign). Special values are compared bit for
    bit, finite ones within pow's documented 2 ulp of pow in float64 (no libm's float32 pow is
    the reference: NumPy 2.4's is 0.56 ulp off at 3.4e38 ** 0.5, the math library 0.59 ulp at
    1e-40 ** -0.5)."""
    with np.errstate(all="ignore"):
        c99 = np.power(SPECIAL.astype(np.float64), np.full(SPECIAL.shape, exponent)).astype(np.float32)
    (got,), (want,), _ = run_both(lambda b, v: [b.emit("pow", v, b.constant(exponent, "f32"))], SPECIAL)
    special = ~np.isfinite(c99) | (c99 == 0)
    for result in (got, want):
        assert np.array_equal(result[special], c99[special], equal_nan=True)
        ordered = ~np.isnan(c99)
        assert np.array_equal(np.signbit(result[ordered]), np.signbit(c99[ordered]))
        np.testing.assert_array_max_ulp(result[~special], c99[~special], maxulp=2)


@pytest.mark.parametrize("shape, interleaved", [((3, 1001), True), ((5000,), True), ((64, 10), False)])
def test_a_costly_maps_long_loops_are_interleaved_with_the_same_bits(shape, interleaved, monkeypatch,
                                                                    tmp_path):
    """tanh's and exp's chains of dependent operations leave the core waiting on one vector a
    trip: a long innermost loop of a costly kernel computes several, each element as it was;
    a short one does not (it would be left to the scalar loop after it). (A row broadcast
    keeps the axes apart: see the next test.)"""
    import weakref
    from backend import cpu, llvm, objects
    b = Builder()
    x, y = b.param(tensor_type("f32", shape)), b.param(tensor_type("f32", shape[-1:]))
    fn = b.finish([b.emit("mul", b.emit("tanh", x), b.emit("exp", b.emit("broadcast_to", y, shape=shape)))])
    args = [f32(*shape), f32(*shape[-1:])]

    def run(interleave: int):
        monkeypatch.setattr(llvm, "INTERLEAVE", interleave)
        monkeypatch.setenv("DSLC_CACHE_DIR", str(tmp_path / str(interleave)))
        monkeypatch.setattr(objects, "_linked", weakref.WeakValueDictionary())
        exe = Executable(fn)
        return exe.run(args), str(cpu.module_ir(exe.plan.kernels))

    (got,), text = run(llvm.INTERLEAVE)
    (want,), plain = run(1)
    same_bits([got], [want])
    assert ("llvm.loop.interleave.count" in text) == interleaved
    assert "llvm.loop.interleave.count" not in plain


@pytest.mark.parametrize("shape, transposed, loops", [((200, 27), False, 1), ((7, 1, 13, 3), False, 1),
                                                      ((200, 27), True, 2), ((6, 5, 4), True, 3),
                                                      ((5, 0, 3), False, 3)])
def test_a_maps_axes_that_its_loads_walk_as_one_are_one_loop(shape, transposed, loops, monkeypatch):
    """AdamW on a 200 x 27 weight: 27 trips a row left 11 to the scalar loop after the vectors;
    as one loop of 5,400 nearly all run as vectors. A transposed operand walks the axes apart,
    and they stay two loops. Either way, the interpreter's bits on 1 to 3 threads."""
    from backend.llvm import merged_axes
    b = Builder()
    x, y = b.param(tensor_type("f32", shape)), b.param(tensor_type("f32", shape[::-1] if transposed else shape))
    y_read = b.emit("transpose", y, perm=tuple(range(len(shape)))[::-1]) if transposed else y
    fn = b.finish([b.emit("div", b.emit("mul", x, b.constant(3.0, "f32")), b.emit("sqrt", y_read))])
    args = [f32(*shape), np.abs(f32(*(shape[::-1] if transposed else shape)))]
    exe = Executable(fn)
    (kernel,) = exe.plan.kernels
    merged, grown = merged_axes(kernel)
    assert len(merged.shape) == loops and prod(merged.shape) == prod(shape)
    assert grown == prod(merged.shape) // shape[0] if loops == 1 else grown == 1
    want = interp.run(fn, args)
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("DSLC_THREADS", threads)
        same_bits(exe.run(args), want)
