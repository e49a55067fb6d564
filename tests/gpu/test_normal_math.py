"""normal's log, cos and sin (docs/random.md §5) are correctly rounded to float32 on every
input a draw can feed them, so that the GPU's kernel (the math library's float64 functions,
rounded) and the NumPy reference (NumPy's, rounded) give the same bits. Checked on every
input with DSLC_SLOW=1 (2^24 each), else on every 251st."""
from __future__ import annotations

import os

import numpy as np
import pytest

import dsl
from ir.ops.random import TWO_PI

STRIDE = 1 if os.environ.get("DSLC_SLOW") else 251
CHUNK = 2 ** 20
MARGIN = 8            # f64 ulps between each value and the nearest f32 rounding boundary, at least

MATH = """
def f(x: f64[N]) -> (f32[N], f32[N], f32[N]):
  return cast(log(x), f32), cast(cos(x), f32), cast(sin(x), f32)
"""


def inputs() -> dict[str, np.ndarray]:
    """u1 = unit32⁺(w) and t = TWO_PI · unit32(w) for every w >> 8 (or every STRIDE-th)."""
    k = np.arange(0, 2 ** 24, STRIDE, dtype=np.uint32)
    unit = lambda v: v.astype(np.float32) * np.float32(2.0 ** -24)
    return {"log": unit(k + 1), "cos": TWO_PI[np.float32] * unit(k), "sin": TWO_PI[np.float32] * unit(k)}


def math_library(x: np.ndarray) -> list[np.ndarray]:
    """log, cos and sin of x by the CPU backend's exact-mode math library (backend/mathlib.py,
    the GPU's too) in float64, each rounded to float32."""
    f = dsl.loads(MATH.replace("N", str(CHUNK)), device="cpu").f
    padded = np.resize(x.astype(np.float64), -(-x.size // CHUNK) * CHUNK).reshape(-1, CHUNK)
    parts = [f(row) for row in padded]
    return [np.concatenate([np.asarray(p[i]) for p in parts])[:x.size] for i in range(3)]


def margin(y: np.ndarray) -> np.ndarray:
    """How far each float64 y lies from the midpoint between the two float32 values around
    it, in float64 ulps of y (inf where y is a float32)."""
    a = y.astype(np.float32)
    toward = np.nextafter(a, np.where(y > a, np.float32(np.inf), np.float32(-np.inf)))
    mid = (a.astype(np.float64) + toward.astype(np.float64)) / 2
    out = np.abs(y - mid) / np.spacing(np.abs(y))
    return np.where(y == a, np.inf, out)


@pytest.mark.parametrize("name", ["log", "cos", "sin"])
def test_normals_transcendentals_round_the_same_on_every_backend(name):
    """The math library's value rounds as NumPy's does, and both are far enough from a
    rounding boundary that any float64 function within MARGIN ulps gives these bits."""
    x = inputs()[name]
    ours = math_library(x)[("log", "cos", "sin").index(name)]
    exact = getattr(np, name)(x.astype(np.float64))
    assert np.array_equal(ours.view(np.uint32), exact.astype(np.float32).view(np.uint32))
    assert margin(exact).min() >= MARGIN
