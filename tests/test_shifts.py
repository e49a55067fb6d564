"""`<<` and `>>` compiled, with NumPy's meaning for every count (npy_lshift, npy_rshift): a
count that is negative or not less than the dtype's bits shifts every bit out, leaving 0, or
-1 where `>>` shifts a negative signed value. The CPU backend and the PTX here; the GPU
runtime in tests/runtime/test_on_device.py, MLIR on IREE in tests/test_mlir_scans.py."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import dsl
from backend import nvptx
from backend.schedule import HostStep
from conftest import on_every_thread_count
from runtime.cpu import Executable

SHIFTS = """
def f(a: i32[N], b: i32[N], c: i64[N], d: i64[N], e: u32[N], g: u32[N]
      ) -> (i32[N], i32[N], i64[N], i64[N], u32[N], u32[N]):
  return a << b, a >> b, c << d, c >> d, e << g, e >> g

def literal(a: i32[N], c: i64[N]) -> (i32[N], i32[N], i64[N], i64[N]):
  return a << 31, a >> 40, c >> 63, 5 << c
"""

COUNTS = [-1, 0, 1, 31, 32, 33, 63, 64, 2 ** 31 - 1, -2 ** 31]


def operands(n: int, seed: int = 0) -> list[np.ndarray]:
    """n values and n counts for each of i32, i64 and u32: the dtype's extremes, 0, ±1 and
    random values, shifted by the counts of COUNTS (as the dtype holds them: -1 is 2³² - 1
    in u32) and random ones in [-70, 70]."""
    rng = np.random.default_rng(seed)
    arrays = []
    for dtype in (np.int32, np.int64, np.uint32):
        info = np.iinfo(dtype)
        values = [0, 1, 5, info.max, info.min, *(() if info.min == 0 else (-1, -5))]
        a = np.resize(np.array(values, dtype), n)
        a[len(values):] = rng.integers(info.min, info.max, max(n - len(values), 0), dtype, endpoint=True)
        counts = np.resize(np.array(COUNTS, np.int64), n)
        counts[len(COUNTS):] = rng.integers(-70, 71, max(n - len(COUNTS), 0))
        arrays += [a, rng.permutation(counts).astype(dtype)]
    return arrays


def numpy_shifts(a, b, c, d, e, g) -> tuple[np.ndarray, ...]:
    return tuple(f(x, n) for x, n in ((a, b), (c, d), (e, g)) for f in (np.left_shift, np.right_shift))


def test_numpy_shifts_every_bit_out_for_a_count_out_of_range():
    """The meaning the kernels follow, as NumPy defines it (not C's undefined behaviour)."""
    a = np.array([5, -5], np.int32)
    for count in (-1, 32, 2 ** 31 - 1, -2 ** 31):
        n = np.full(2, count, np.int32)
        assert np.left_shift(a, n).tolist() == [0, 0]
        assert np.right_shift(a, n).tolist() == [0, -1]
    assert np.right_shift(np.uint32(2 ** 32 - 1), np.uint32(32)) == 0


@pytest.mark.parametrize("n", [0, 1, 13, 10 ** 5])
def test_shifts_are_numpys_bits_on_every_thread_count(n):
    """In a kernel (no host step), bit for bit NumPy's on 1, 2 and 3 threads; a literal
    count, or value, takes the other operand's dtype."""
    args = operands(n)
    prog = dsl.loads(SHIFTS, device="cpu")
    plan = Executable(prog.f.lower(*args).function).plan
    assert not any(isinstance(s, HostStep) for s in plan.steps)
    got = on_every_thread_count(lambda: prog.f(*args))
    for g, w in zip(got, numpy_shifts(*args), strict=True):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
    a, _, c, *_ = args
    want = (np.left_shift(a, np.int32(31)), np.right_shift(a, np.int32(40)),
            np.right_shift(c, np.int64(63)), np.left_shift(np.int64(5), c))
    for g, w in zip(prog.literal(a, c), want, strict=True):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_shifts_are_gpu_kernels_that_ptxas_assembles(arch):
    """The same body in the GPU's kernels: PTX shift instructions, accepted by ptxas."""
    text = dsl.loads(SHIFTS).f.ir(level="ptx", dims={"N": 13}, arch=arch)
    shifts = set(re.findall(r"\bsh[lr]\.[a-z0-9]+", text))
    assert {"shl.b32", "shl.b64", "shr.s32", "shr.s64", "shr.u32"} <= shifts, shifts
    nvptx.ptxas(text, arch)
