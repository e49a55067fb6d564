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
