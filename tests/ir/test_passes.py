"""The optimisation passes (ir/passes.py) keep what a program means."""
from __future__ import annotations

import numpy as np
import pytest

import dsl


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_an_empty_tensor_keeps_its_shape(device):
    """Constant folding must not turn zeros([0, 3]) into a literal: a nested tuple of numbers
    cannot say it has 3 columns, and the result came back as f32[0] (a model's empty table of
    learned positions, with RoPE, then no longer fitted its record)."""
    prog = dsl.loads("""
object P { z: f32[N, D], w: f32[D] }
def init(N: int, D: int) -> P:
  return P { z: zeros([N, D]), w: ones([D]) }
def loss(p: P, x: f32[D]) -> f32:
  return sum(p.w * x) + sum(p.z)
""", name="empty.bend", device=device)
    p = prog.init(N=0, D=3)
    assert p["z"].shape == (0, 3)
    g = prog.grad("loss", wrt="p")(p, np.ones(3, np.float32))
    assert g["z"].shape == (0, 3) and np.array_equal(g["w"], np.ones(3, np.float32))


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_a_fold_body_without_ops_is_kept(device):
    """A fold whose new state is the element (s = x) has a body of no ops; the passes took a
    Function of no ops for false (its __len__) and dropped it, and both devices crashed."""
    prog = dsl.loads("""
def last(xs: f32[T, 2]) -> f32[2]:
  fold x in xs with s = zeros([2]):
    s = x
  return s
def each(xs: f32[T, 2]) -> f32[T, 2]:
  ys = fold x in xs with s = zeros([2]):
    s = x
    return s
  return ys
def loss(xs: f32[T, 2]) -> f32:
  return sum(last(xs) * 3.0)
""", name="fold.bend", device=device)
    xs = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(prog.last(xs), xs[-1])
    np.testing.assert_array_equal(prog.each(xs), xs)
    want = np.zeros_like(xs)
    want[-1] = 3.0
    np.testing.assert_array_equal(prog.grad("loss", wrt="xs")(xs), want)
