"""Windows: the gradient of a slice or of basic indexing (`unindex`) is read in place by the
map kernels that use it, 0 outside the window, with the reference interpreter's bits; views
of it that no window expresses, reductions, contractions and results read a copy made by a
kernel."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend.loops import to_text
from backend.schedule import ContractStep, HostStep, KernelStep, ViewStep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cpu import SPECIAL, f32, run_both, run_both_any, same_bits  # noqa: E402
from ir.ops.shape import SliceSpec  # noqa: E402

ALL = SliceSpec()


def steps(exe) -> set[str]:
    return {type(s).__name__ for s in exe.plan.steps}


def windowed_loads(exe) -> list:
    return [i.load for k in exe.plan.kernels for i in k.body if i.load is not None and i.load.window]


@pytest.mark.parametrize("items, shape, x_shape", [
    ((ALL, 2), (4, 3, 5), (4, 5)),                           # ints, and the trailing axis
    ((SliceSpec(1, 3), SliceSpec(2, None)), (5, 7), (2, 5)),  # slices that start inside
    ((Ellipsis, SliceSpec(-3, -1), 0), (3, 6, 2), (3, 2)),    # from the end, and an Ellipsis
])
def test_an_unindex_added_to_a_value_is_read_in_place(items, shape, x_shape):
    x = f32(*x_shape)
    x.flat[:SPECIAL.size] = SPECIAL[:x.size]                  # 0 + -0.0 is +0.0, as in NumPy
    got, want, exe = run_both(
        lambda b, x, y: [b.emit("add", b.emit("unindex", x, items=items, shape=shape), y)],
        x, f32(*shape))
    same_bits(got, want)
    assert steps(exe) == {"KernelStep"} and windowed_loads(exe)


def test_the_three_gradients_of_qkv_added_make_no_zeros():
    # attention's dq, dk, dv into the gradient of qkv [B, T, 3, D], as reverse mode makes it
    def build(b, dq, dk, dv):
        parts = [b.emit("unindex", d, items=(ALL, ALL, i), shape=(2, 5, 3, 8)) for i, d in
                 enumerate((dq, dk, b.emit("transpose", dv, perm=(1, 0, 2))))]
        total = b.emit("add", b.emit("add", parts[0], parts[1]), parts[2])
        return [b.emit("reshape", total, shape=(2, 5, 24))]
    got, want, exe = run_both(build, f32(2, 5, 8), f32(2, 5, 8), f32(5, 2, 8))
    same_bits(got, want)
    assert "HostStep" not in steps(exe) and len(windowed_loads(exe)) == 3


@pytest.mark.parametrize("slices, cut", [(3, True), (4, True), (9, False)])
def test_a_maps_loops_are_cut_where_windows_begin_and_end(slices, cut, monkeypatch):
    """Gates' gradients side by side (an LSTM's four, qkv's three): each piece of the axis
    reads one gradient and the others' zeros, decided where the loops are made, not by a test
    and a select at each element; more pieces than MAX_CUTS are tested per element. The
    interpreter's bits either way, -0.0 and NaN included, on 1 to 3 threads."""
    from backend import cpu, llvm
    width = 5

    def build(b, *gates):
        parts = [b.emit("unindex", g, items=(ALL, SliceSpec(i * width, (i + 1) * width)),
                        shape=(7, slices * width)) for i, g in enumerate(gates)]
        total = parts[0]
        for part in parts[1:]:
            total = b.emit("add", total, part)
        return [b.emit("mul", total, b.constant(2.0, "f32"))]
    gates = [f32(7, width) for _ in range(slices)]
    gates[0].flat[:SPECIAL.size] = SPECIAL[:gates[0].size]
    assert (llvm.MAX_CUTS >= slices) == cut
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("DSLC_THREADS", threads)
        got, want, exe = run_both(build, *gates)
        same_bits(got, want)
    (kernel,) = exe.plan.kernels
    assert len(windowed_loads(exe)) == slices
    text = str(cpu.module_ir([kernel]))
    assert ("select" not in text) == cut


def test_cuts_on_several_axes_are_bounded_innermost_first():
    """Each cut copies the loops inside it: a padding's gradient windowed on three axes (3
    pieces each, 27 copies) is cut on its last axis alone (3 × 3 would pass MAX_CUTS), the
    others tested per element; the interpreter's bits."""
    from backend import llvm
    inner = (SliceSpec(1, 5), SliceSpec(1, 6), SliceSpec(1, 7))
    got, want, exe = run_both(
        lambda b, x, y: [b.emit("add", b.emit("unindex", x, items=(ALL,) + inner, shape=(2, 6, 7, 8)), y)],
        f32(2, 4, 5, 6), f32(2, 6, 7, 8))
    same_bits(got, want)
    (kernel,) = exe.plan.kernels
    assert {axis for load in windowed_loads(exe) for axis, _, _ in load.window} == {1, 2, 3}
    assert llvm.window_cuts(kernel) == {3: [(0, 1), (1, 7), (7, 8)]}


@pytest.mark.parametrize("view", ["transpose", "broadcast_to"])
def test_a_transpose_or_broadcast_of_a_window_keeps_the_window(view):
    def build(b, x, y):
        u = b.emit("unindex", x, items=(SliceSpec(1, 4), 0), shape=(6, 1))       # [6, 1]
        v = (b.emit("transpose", u, perm=(1, 0)) if view == "transpose"
             else b.emit("broadcast_to", u, shape=(2, 6, 5)))
        return [b.emit("mul", v, y)]
    y = f32(1, 6) if view == "transpose" else f32(2, 6, 5)
    got, want, exe = run_both(build, f32(3), y)
    same_bits(got, want)
    assert steps(exe) == {"KernelStep"} and windowed_loads(exe)


@pytest.mark.parametrize("use", ["reshape", "index", "sum", "matmul", "result"])
def test_a_window_read_otherwise_is_made_with_the_same_bits(use):
    def build(b, x, y):
        u = b.emit("unindex", x, items=(SliceSpec(2, 5), ALL), shape=(6, 4))
        if use == "reshape":
            return [b.emit("add", b.emit("reshape", u, shape=(3, 8)), y)]
        if use == "index":
            return [b.emit("add", b.emit("index", u, items=(SliceSpec(1, 4),)), y)]
        if use == "sum":
            return [b.emit("sum", u, axis=0)]
        if use == "matmul":
            return [b.emit("matmul", u, y)]
        return [u]
    y = {"reshape": f32(3, 8), "index": f32(3, 4), "matmul": f32(4, 3)}.get(use, f32(1))
    got, want, exe = run_both_any(build, f32(3, 4), y)
    same_bits(got, want)
    assert steps(exe) == ({"KernelStep", "ContractStep"} if use == "matmul" else {"KernelStep"})


def test_a_reshape_of_a_transpose_is_a_compiled_copy():
    def build(b, x):
        return [b.emit("reshape", b.emit("transpose", x, perm=(1, 0, 2)), shape=(6, 20))]
    got, want, exe = run_both(build, f32(4, 6, 5))
    same_bits(got, want)
    assert steps(exe) == {"KernelStep", "ViewStep"}     # the copy; the reshape of the copy


def test_the_loop_text_shows_the_window():
    _, _, exe = run_both(lambda b, x, y: [b.emit("add", b.emit(
        "unindex", x, items=(SliceSpec(1, 3),), shape=(4, 2)), y)], f32(2, 2), f32(4, 2))
    assert "load b0[2, 1] - 2 if 1 <= i0 < 3 else 0 : f32" in to_text(exe.plan.kernels[0])


SOURCE = """
def loss(x: f32[4, 6], qkv: f32[2, 5, 3, 8]) -> f32:
  a = x[:, 1:3]
  q = qkv[:, :, 0]
  k = qkv[:, :, 1]
  v = qkv[:, :, 2]
  return sum(a * a) + sum(q * k - v)
"""


def test_slices_and_their_gradients_in_a_program_match_the_reference():
    name = str(Path(__file__).parent / "windows.bend")
    cpu, ref = dsl.loads(SOURCE, name=name, device="cpu"), dsl.loads(SOURCE, name=name, device="reference")
    rng = np.random.default_rng(5)
    args = {"x": rng.standard_normal((4, 6)).astype(np.float32),
            "qkv": rng.standard_normal((2, 5, 3, 8)).astype(np.float32)}
    same_bits(cpu.loss(**args), ref.loss(**args))
    same_bits(cpu.value_and_grad("loss", wrt=("x", "qkv"))(**args),
              ref.value_and_grad("loss", wrt=("x", "qkv"))(**args))
