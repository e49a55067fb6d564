"""Scans (cumsum, cumprod, logcumsumexp): their meaning against NumPy, PyTorch and the
sequential definition y[i] = y[i-1] ⊕ x[i]; the CPU's scan kernels against the interpreter,
bit for bit, on 1, 2 and 3 threads (logcumsumexp's against its step done op by op with the
compiled math library); the GPU's kernels through ptxas and the emulator; and their errors.
Their VJPs are among tests/ir/test_vjp.py's cases, against torch and finite differences."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend import nvptx
from backend.loops import to_text
from backend.schedule import HostStep
from frontend.diagnostics import DslError
from ir import interp
from ir.core import Builder, tensor_type
from ir.ops import REGISTRY
from ir.ops.base import OpError
from ir.ops.scan import log_add_exp
from ir.ops.shape import SliceSpec
from runtime.cpu import Executable

torch = pytest.importorskip("torch")
rng = np.random.default_rng(11)
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32,
          "i64": np.int64}
# sizes of the scanned axis: none, one, primes around the lanes, and a long one
SHAPES = [((0,), 0), ((1,), 0), ((7,), 0), ((31,), -1), ((97,), 0), ((100_000,), 0),
          ((0, 5), 1), ((3, 0), 0), ((5, 1), 1), ((2, 3, 5), 0), ((2, 3, 5), 1), ((2, 3, 5), 2),
          ((4, 37, 3), -2), ((33, 7), 0), ((70, 3), 0)]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30], np.float32)


def values(shape, dtype: str, name: str) -> np.ndarray:
    """Inputs that keep a product of 10^5 terms finite; integers that overflow a product."""
    if dtype in ("i32", "i64"):
        return rng.integers(-3, 4, shape).astype(DTYPES[dtype])
    x = rng.uniform(0.99, 1.01, shape) * rng.choice([-1, 1], shape) if name == "cumprod" else \
        rng.standard_normal(shape) * 10
    return x.astype(DTYPES[dtype])


def sequential(x: np.ndarray, axis: int, step) -> np.ndarray:
    """The definition, one step at a time in Python: y[0] = x[0], y[i] = step(y[i-1], x[i])."""
    y = np.moveaxis(x.copy(), axis, 0)
    with np.errstate(all="ignore"):
        for i in range(1, len(y)):
            y[i] = step(y[i - 1], y[i])
    return np.moveaxis(y, 0, axis)


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """The same dtype, shape and bits (a NaN's payload and sign are the compiler's choice)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    as_bits = lambda a: np.ascontiguousarray(a).view(f"u{a.itemsize}")
    same = as_bits(got) == as_bits(want)
    if got.dtype.kind == "f":
        same |= np.isnan(got) & np.isnan(want)
    assert same.all(), f"{(~same).sum()} of {same.size} differ"


def scan_function(name: str, dtype: str, shape, axis: int, square: bool = False):
    """x -> name(x, axis), or name(x * x, axis): the square computed in the scan's own loop."""
    b = Builder()
    x = b.param(tensor_type(dtype, shape))
    return b.finish([b.emit(name, b.emit("mul", x, x) if square else x, axis=axis)])


# ---------------------------------------------------------------- meaning

@pytest.mark.parametrize("shape, axis", SHAPES)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
@pytest.mark.parametrize("name, step", [("cumsum", np.add), ("cumprod", np.multiply)])
def test_cumsum_and_cumprod_are_the_sequential_loop(name, step, dtype, shape, axis):
    x = values(shape, dtype, name)
    got = REGISTRY[name].evaluate(x, axis)
    if x.shape[axis] <= 100:
        same_bits(got, sequential(x, axis, step))
    same_bits(got, getattr(np, name)(x, axis, dtype=x.dtype))
    t = getattr(torch, name)(torch.from_numpy(x), axis)
    if dtype == "i32":                    # torch accumulates in int64: the same bits, wrapped
        same_bits(got, t.numpy().astype(np.int32))
    else:
        np.testing.assert_allclose(got, t.numpy(), rtol=1e-4 if name == "cumprod" else 1e-5,
                                   atol=1e-3 * np.sqrt(x.shape[axis]))


def test_integer_scans_wrap_around():
    x = np.full((3, 40), 7, np.int32)
    same_bits(REGISTRY["cumprod"].evaluate(x, 1), np.cumprod(x.astype(np.int64), 1).astype(np.int32))
    big = np.full(5, 2 ** 30, np.int32)
    same_bits(REGISTRY["cumsum"].evaluate(big, 0), np.array([2 ** 30, -2 ** 31, -2 ** 30, 0, 2 ** 30],
                                                             np.int32))


@pytest.mark.parametrize("shape, axis", SHAPES)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_logcumsumexp_matches_torch_and_is_its_step_done_in_order(dtype, shape, axis):
    x = values(shape, dtype, "logcumsumexp")
    got = REGISTRY["logcumsumexp"].evaluate(x, axis)
    want = torch.logcumsumexp(torch.from_numpy(x), axis).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "f32" else 1e-12, atol=0)
    if x.shape[axis] <= 100:
        same_bits(got, sequential(x, axis, log_add_exp))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_logcumsumexp_of_large_infinite_and_nan_values_is_torchs(dtype):
    big = np.array([[1e4, 1e4 + 1, -1e4, 1e4], [-1e30, -1e30, -1e30, 3e4],
                    [-np.inf, -np.inf, 2.0, -np.inf], [np.inf, np.inf, 1.0, -np.inf],
                    [1.0, np.nan, 2.0, 3.0], [-np.inf, np.inf, -np.inf, 0.0]], DTYPES[dtype])
    got = REGISTRY["logcumsumexp"].evaluate(big, 1)
    want = torch.logcumsumexp(torch.from_numpy(big), 1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    noise = rng.standard_normal((4, 200)) * 1e3
    np.testing.assert_allclose(REGISTRY["logcumsumexp"].evaluate(noise, 1),
                               torch.logcumsumexp(torch.from_numpy(noise), 1).numpy(), rtol=1e-13)


def test_log_add_exp_keeps_tiny_terms_that_log_of_one_plus_would_lose():
    """log1p(t) for a t below half an ulp of 1: t itself, not log(1) = 0."""
    a = np.array([0.0, 0.0, -20.0], np.float32)
    b = np.array([-23.0, -80.0, -20.0], np.float32)
    want = np.logaddexp(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(log_add_exp(a, b), want, rtol=2e-7)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("name, x, axis, message", [
    ("cumsum", tensor_type("f32", (3, 4)), 2, "axis 2 is out of range for f32[3, 4] of rank 2"),
    ("cumprod", tensor_type("f32", (3, 4)), -3, "axis -3 is out of range"),
    ("cumsum", tensor_type("f32", ()), 0, "axis 0 is out of range for f32 of rank 0"),
    ("cumsum", tensor_type("bool", (3,)), 0, "'cumsum' needs a numeric tensor, got bool[3]"),
    ("logcumsumexp", tensor_type("i32", (3,)), 0,
     "'logcumsumexp' needs a float tensor, got i32[3]; use cast()"),
])
def test_bad_axes_and_dtypes_are_op_errors(name, x, axis, message):
    with pytest.raises(OpError, match=re.escape(message)):
        REGISTRY[name].infer(x=x, axis=axis)


@pytest.mark.parametrize("call, message", [
    ("cumsum(x)", "'cumsum' is missing the argument 'axis'"),
    ("cumsum(x, axis=(0, 1))", "'axis' of 'cumsum' must be a known static int"),
    ("logcumsumexp(x, 2)", "axis 2 is out of range for f32[2, 3] of rank 2"),
])
def test_the_front_end_reports_a_scans_errors(call, message):
    with pytest.raises(DslError, match=re.escape(message)):
        dsl.loads(f"def f(x: f32[B, T]) -> f32[B, T]:\n  return {call}\n").f(np.zeros((2, 3), np.float32))


# ---------------------------------------------------------------- the CPU's scan kernels

@pytest.mark.parametrize("shape, axis", SHAPES)
@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "i32", "i64"])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scan_kernels_give_the_interpreters_bits(name, dtype, shape, axis):
    fn = scan_function(name, dtype, shape, axis, square=dtype == "f32")
    exe = Executable(fn)
    (kernel,) = exe.plan.kernels
    assert kernel.is_scan and f"scan {shape[axis]}" in to_text(kernel)
    x = values(shape, dtype, name)
    if dtype == "f32" and x.size > 8:
        x.flat[rng.integers(0, x.size, 7)] = SPECIAL
    same_bits(exe.run([x])[0], interp.run(fn, [x])[0])


def step_by_step(dtype: str, shape, axis: int):
    """logcumsumexp along axis as its step's elementwise ops, one slice of the axis at a time:
    the kernels' exp and log (the math library) in the order the definition says."""
    b = Builder()
    x = b.param(tensor_type(dtype, shape))
    at = lambda i: b.emit("index", x, items=(SliceSpec(),) * (axis % len(shape)) + (i,))
    c = lambda v: b.constant(v, dtype)
    ys = [at(0)]
    for i in range(1, shape[axis]):
        y, xi = ys[-1], at(i)
        m, low = b.emit("maximum", y, xi), b.emit("minimum", y, xi)
        t = b.emit("exp", b.emit("sub", low, m))
        u = b.emit("add", c(1.0), t)
        log1p = b.emit("add", b.emit("log", u),
                       b.emit("div", b.emit("sub", t, b.emit("sub", u, c(1.0))), u))
        infinite = b.emit("eq", b.emit("abs", m), c(float("inf")))
        ys.append(b.emit("where", infinite, m, b.emit("add", m, log1p)))
    return b.finish([b.emit("stack", *ys, axis=axis)])


# one line; lines side by side that are neighbours (37, 6)/0 or not (40, 9)/1, and the rest
@pytest.mark.parametrize("shape, axis", [((1,), 0), ((7,), 0), ((40,), 0), ((5, 9), 1),
                                         ((37, 6), 0), ((40, 9), 1), ((2, 33, 3), 1)])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_logcumsumexp_kernels_are_their_step_done_op_by_op(dtype, shape, axis):
    x = values(shape, dtype, "logcumsumexp")
    x.flat[rng.integers(0, x.size, min(x.size, 5))] = SPECIAL[:min(x.size, 5)]
    exe = Executable(scan_function("logcumsumexp", dtype, shape, axis))
    assert [k.is_scan for k in exe.plan.kernels] == [True]
    same_bits(exe.run([x])[0], Executable(step_by_step(dtype, shape, axis)).run([x])[0])
    np.testing.assert_allclose(exe.run([x])[0], REGISTRY["logcumsumexp"].evaluate(x, axis),
                               rtol=1e-5, equal_nan=True)


# (2048, 300) and (300, 2048): 614,400 elements, past the work a run is shared at
@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("shape, axis", [((2048, 300), 1), ((2048, 300), 0), ((300, 2048), 0)])
def test_bits_do_not_depend_on_the_threads(monkeypatch, threads, shape, axis):
    monkeypatch.setenv("DSLC_THREADS", threads)
    for name in ("cumsum", "cumprod", "logcumsumexp"):
        fn = scan_function(name, "f32", shape, axis, square=True)
        x = values(shape, "f32", name)
        got = Executable(fn).run([x])[0]
        if name == "logcumsumexp":
            monkeypatch.setenv("DSLC_THREADS", "1")
            same_bits(got, Executable(fn).run([x])[0])
            monkeypatch.setenv("DSLC_THREADS", threads)
        else:
            same_bits(got, interp.run(fn, [x])[0])


def test_a_scan_without_a_compiled_step_is_a_host_step():
    fn = scan_function("logcumsumexp", "f16", (3, 5), 1)
    exe = Executable(fn)
    assert not exe.plan.kernels and isinstance(exe.plan.steps[-1], HostStep)
    x = values((3, 5), "f16", "logcumsumexp")
    same_bits(exe.run([x])[0], interp.run(fn, [x])[0])


def test_gradients_of_scans_compile_with_the_reference_bits():
    """cumsum's and cumprod's VJPs (reverse scans of flipped views, a line's first zero) as
    compiled, against the interpreter, on lines with no zero, one and two."""
    src = ("def loss(x: f32[B, T], w: f32[B, T]) -> f32:\n"
           "  return sum(cumprod(x, 1) * w) + sum(cumsum(x * x, 0) * w)\n"
           "def g(x: f32[B, T], w: f32[B, T]) -> f32[B, T]:\n"
           "  return grad(loss)(x, w)\n")
    x, w = values((4, 9), "f32", "cumprod"), values((4, 9), "f32", "cumsum")
    x[1, 3] = 0.0
    x[2, 2] = x[2, 6] = 0.0
    got = np.asarray(dsl.loads(src, device="cpu").g(x, w))
    same_bits(got, np.asarray(dsl.loads(src, device="reference").g(x, w)))
    t = torch.from_numpy(x).requires_grad_(True)
    wt = torch.from_numpy(w)
    ((torch.cumprod(t, 1) * wt).sum() + (torch.cumsum(t * t, 0) * wt).sum()).backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the GPU's scan kernels

def gpu_scans() -> list:
    """Scan kernels of every kind of line: the last axis, a leading one (coalesced), a middle
    one, none long; every dtype the kernels compile."""
    out = []
    from backend import schedule
    for i, (name, dtype, shape, axis) in enumerate([
            ("cumsum", "f32", (5, 70), 1), ("cumsum", "i32", (70, 5), 0),
            ("cumprod", "f64", (3, 9, 4), 1), ("cumprod", "f16", (40,), 0),
            ("logcumsumexp", "f32", (33, 8), 0), ("logcumsumexp", "f64", (6, 50), -1),
            ("cumsum", "f32", (0, 4), 0), ("cumsum", "i64", (2, 1), 1)]):
        fn = scan_function(name, dtype, shape, axis, square=dtype != "f16")
        out += schedule.schedule(fn, f"scan{i}").kernels
    assert all(k.is_scan for k in out)
    return out


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gpu_scan_kernels_assemble(arch):
    ks = gpu_scans()
    text = nvptx.ptx(ks, arch)
    assert " call" not in text
    nvptx.ptxas(text, arch)
    for k in ks:
        shape = nvptx.launch(k)
        assert shape.block == nvptx.BLOCK and shape.shared == 0 and shape.extent == k.extent


def test_gpu_scan_kernels_give_the_cpus_bits():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
    from test_emulated import same_as_cpu
    same_as_cpu(gpu_scans(), blocks=1)
