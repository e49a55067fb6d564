"""Row kernels: a reduction over trailing axes whose value comes back into the row (softmax,
layer norm, their gradients) is one kernel of stages per row, with the bits of the same
operations done op by op — the reference interpreter, its exp, log, tanh… taken from the
compiled math library (the interpreter's own are NumPy's, docs/numerics.md) — on any
number of threads."""
from __future__ import annotations

import numpy as np
import pytest

import dsl
from ir.ops.elementwise import MathFunction
from backend.loops import to_text
from ir import interp
from ir.core import Builder, Function, tensor_type
from runtime.cpu import Executable

rng = np.random.default_rng(7)

SOURCE = """
from nn import softmax, log_softmax, layer_norm, rms_norm

def sm(x: f32[B, T]) -> f32[B, T]:
  return softmax(x)

def lsm(x: f32[B, T]) -> f32[B, T]:
  return log_softmax(x)

def ln(x: f32[B, T], g: f32[T], b: f32[T]) -> f32[B, T]:
  return layer_norm(x, g, b)

def rms(x: f32[B, T], g: f32[T]) -> f32[B, T]:
  return rms_norm(x, g)

def msm(x: f32[B, T], m: bool[B, T]) -> f32[B, T]:
  return softmax(where(m, x, -1000000000.0))

def sm_loss(x: f32[B, T], w: f32[B, T]) -> f32:
  return sum(softmax(x) * w)

def msm_loss(x: f32[B, T], m: bool[B, T], w: f32[B, T]) -> f32:
  return sum(msm(x, m) * w)

def lsm_loss(x: f32[B, T], w: f32[B, T]) -> f32:
  return sum(log_softmax(x) * w)

def ln_loss(x: f32[B, T], g: f32[T], b: f32[T], w: f32[B, T]) -> f32:
  return sum(layer_norm(x, g, b) * w)

def rms_loss(x: f32[B, T], g: f32[T], w: f32[B, T]) -> f32:
  return sum(rms_norm(x, g) * w)

def sm_grad(x: f32[B, T], w: f32[B, T]) -> f32[B, T]:
  l, g = value_and_grad(sm_loss, wrt=x)(x, w)
  return g

def msm_grad(x: f32[B, T], m: bool[B, T], w: f32[B, T]) -> f32[B, T]:
  l, g = value_and_grad(msm_loss, wrt=x)(x, m, w)
  return g

def lsm_grad(x: f32[B, T], w: f32[B, T]) -> f32[B, T]:
  l, g = value_and_grad(lsm_loss, wrt=x)(x, w)
  return g

def ln_grad(x: f32[B, T], g: f32[T], b: f32[T], w: f32[B, T]) -> (f32[B, T], f32[T], f32[T]):
  l, d = value_and_grad(ln_loss, wrt=(x, g, b))(x, g, b, w)
  return d

def rms_grad(x: f32[B, T], g: f32[T], w: f32[B, T]) -> (f32[B, T], f32[T]):
  l, d = value_and_grad(rms_loss, wrt=(x, g))(x, g, w)
  return d
"""
PROGRAM = dsl.loads(SOURCE, device="reference")

# each entry's arguments besides x: [T] gains and biases, [B, T] masks (an attention's,
# whose lanes a row kernel loads as bytes) and weights of the loss
EXTRA = {"sm": "", "msm": "m", "lsm": "", "ln": "gb", "rms": "g", "sm_grad": "w",
         "msm_grad": "mw", "lsm_grad": "w", "ln_grad": "gbw", "rms_grad": "gw"}


def reference(fn: Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """fn op by op: the interpreter, but exp, log, tanh… by the compiled math library."""
    env = dict(zip(fn.params, arrays))
    for op in fn.ops:
        inputs = [env[v] for v in op.inputs]
        if isinstance(op.primitive, MathFunction):
            b = Builder()
            xs = [b.param(v.type) for v in op.inputs]
            outs = Executable(b.finish([b.emit(op.primitive.name, *xs, **op.attrs)])).run(inputs)
        else:
            outs = interp.evaluate(op, inputs)
        env.update(zip(op.outputs, outs))
    return [env[v] for v in fn.results]


def lowered(name: str, x: np.ndarray) -> tuple[Function, list[np.ndarray]]:
    b_, t = x.shape
    extra = {"g": rng.standard_normal(t).astype(np.float32), "b": rng.standard_normal(t).astype(np.float32),
             "w": rng.standard_normal((b_, t)).astype(np.float32), "m": rng.random((b_, t)) < 0.7}
    low, inputs = PROGRAM.lower(name, (x, *[extra[c] for c in EXTRA[name]]), {})
    return low.function, inputs.arrays


def assert_same_bits(got: list, want: list) -> None:
    """Equal bits, except that a NaN's sign and payload are the compiler's choice (which
    operand of a commutative operation it keeps)."""
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
        assert same.all(), f"{(~same).sum()} differ, by at most {np.nanmax(np.abs(g - w))}"


def row_kernels(exe: Executable) -> list:
    return [k for k in exe.plan.kernels if k.is_rows]


def inputs(rows: int, length: int, special: bool = False) -> np.ndarray:
    x = (rng.standard_normal((rows, length)) * 3).astype(np.float32)
    if special:
        values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e-40], np.float32)
        at = rng.integers(0, x.size, min(x.size, 12))
        x.flat[at] = values[np.arange(at.size) % values.size]
        x[-1] = -np.inf                                  # a row of -inf: NaN from softmax
        x[0] = -0.0
    return x


@pytest.mark.parametrize("name", list(EXTRA))
@pytest.mark.parametrize("length", [1, 31, 32, 33, 1000, 5000])
def test_norms_and_softmaxes_match_the_operations_done_one_by_one(name, length):
    fn, arrays = lowered(name, inputs(3 if length == 5000 else 7, length))
    exe = Executable(fn)
    assert row_kernels(exe), "no row kernel"
    assert_same_bits(exe.run(arrays), reference(fn, arrays))


@pytest.mark.parametrize("name", list(EXTRA))
def test_nan_inf_and_negative_zero_in_rows(name):
    fn, arrays = lowered(name, inputs(6, 45, special=True))
    assert_same_bits(Executable(fn).run(arrays), reference(fn, arrays))


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("name", ["sm_grad", "ln_grad"])
def test_bits_do_not_depend_on_the_threads(monkeypatch, name, threads):
    monkeypatch.setenv("DSLC_THREADS", threads)
    fn, arrays = lowered(name, inputs(2048, 300))
    exe = Executable(fn)
    assert row_kernels(exe)
    assert_same_bits(exe.run(arrays), reference(fn, arrays))


def test_softmax_forward_is_one_kernel():
    fn, arrays = lowered("sm", inputs(4, 50))
    exe = Executable(fn)
    (k,) = exe.plan.kernels
    assert k.is_rows and [s.is_reduction for s in k.stages] == [True, False, False, True, False]
    assert "rows [4] of 50" in to_text(k)


def test_layer_norm_forward_is_one_kernel_that_reads_x_in_each_stage():
    fn, arrays = lowered("ln", inputs(4, 50))
    (k,) = Executable(fn).plan.kernels
    assert [s.is_reduction for s in k.stages] == [True, True, False, False]


def build(body, *arrays):
    b = Builder()
    params = [b.param(tensor_type("f32", a.shape)) for a in arrays]
    return b.finish(list(body(b, *params)))


def test_a_row_whose_input_is_also_used_elsewhere():
    # y = x * 2 is the row's reduction's input and is divided by it; a sum over the leading
    # axis (another kernel) reads y too, so the row kernel must store it
    def body(b, x):
        y = b.emit("mul", x, b.constant(2.0, "f32"))
        s = b.emit("sum", y, axis=-1, keepdims=True)
        return [b.emit("div", y, s), b.emit("sum", y, axis=0)]
    x = inputs(9, 40)
    fn = build(body, x)
    exe = Executable(fn)
    assert row_kernels(exe)
    assert_same_bits(exe.run([x]), reference(fn, [x]))


def test_a_reduction_over_a_middle_axis_is_not_a_row():
    def body(b, x):
        m = b.emit("max", x, axis=1, keepdims=True)
        return [b.emit("sub", x, m)]
    x = rng.standard_normal((3, 17, 5)).astype(np.float32)
    fn = build(body, x)
    exe = Executable(fn)
    assert not row_kernels(exe)
    assert_same_bits(exe.run([x]), reference(fn, [x]))


def test_rows_over_two_trailing_axes_and_a_broadcast_row_value():
    def body(b, x, y):
        m = b.emit("mean", x, axis=(1, 2), keepdims=True)
        d = b.emit("sub", x, m)
        v = b.emit("sum", b.emit("mul", d, y), axis=(1, 2))         # not kept: [4]
        return [b.emit("mul", d, b.emit("reshape", v, shape=(4, 1, 1))), v]
    x, y = inputs(4, 24).reshape(4, 3, 8), rng.standard_normal((3, 8)).astype(np.float32)
    fn = build(body, x, y)
    exe = Executable(fn)
    assert row_kernels(exe)
    assert_same_bits(exe.run([x, y]), reference(fn, [x, y]))


def test_groups_of_one_shape_but_other_constants_views_or_users_keep_their_own_stages():
    """A schedule searches each shape of row group once (backend/schedule.py's _RowSearch):
    groups alike but for a constant's bits (2 and 3; 0.0 and -0.0, whose products' signs
    differ), a view's strides, or a value also read after the kernel are other shapes, each with
    stages of its own. (Each group reads a product, which ends the group before.)"""
    def body(b, x, w):
        def normalized(z):
            return b.emit("div", z, b.emit("sum", z, axis=-1, keepdims=True))
        out = []
        for c in (2.0, 2.0, 3.0):
            z = b.emit("add", b.emit("mul", x, b.constant(c, "f32")), x)
            out.append(normalized(z))
            x = b.emit("matmul", out[-1], w)
        for c in (0.0, -0.0):
            m = b.emit("max", x, axis=-1, keepdims=True)
            out.append(b.emit("mul", b.emit("sub", x, m), b.constant(c, "f32")))   # signed zeros
            x = b.emit("matmul", b.emit("add", out[-1], x), w)
        for view in ([("reshape", (40, 6)), ("transpose", None)], [("reshape", (40, 6)), ("reshape", (6, 40))]):
            v = x
            for prim, shape in view:
                v = b.emit(prim, v, shape=shape) if shape else b.emit(prim, v)
            out.append(normalized(b.emit("mul", v, v)))
            x = b.emit("matmul", out[-1], w)
        for read_after in (False, True):
            z = b.emit("mul", x, x)
            out.append(normalized(z))
            out += [b.emit("sum", z, axis=0)] if read_after else []
            x = b.emit("matmul", out[-1 - read_after], w)
        return out + [x]
    x, w = inputs(6, 40), (np.eye(40) + rng.standard_normal((40, 40)) * 0.01).astype(np.float32)
    fn = build(body, x, w)
    exe = Executable(fn)
    assert len(row_kernels(exe)) == 9
    assert_same_bits(exe.run([x, w]), reference(fn, [x, w]))
