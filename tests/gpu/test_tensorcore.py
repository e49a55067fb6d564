"""The tensor-core kernel (backend/tensorcore.py) without a GPU: run by the emulator, whose mma
reads the fragments through the PTX ISA's layouts, it gives the exact product of integer
inputs (exact under any order of accumulation) at shapes that cut every tile, and random
products within the bound of docs/numerics.md; ptxas accepts it for sm_80 and sm_90."""
from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from backend import nvptx, tensorcore

sys.path.insert(0, str(Path(__file__).parent))
from emulator import Emulator  # noqa: E402
from conftest import slow  # noqa: E402

NUMPY = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


@functools.cache
def emulator() -> Emulator:
    return Emulator([], mmas=tensorcore.DTYPES)


def product(dtype: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [batch, m, k] @ b [batch or 1, k, n] by the emulated kernel."""
    batch, m, k = a.shape
    n = b.shape[2]
    c = np.full((batch, m, n), np.nan, NUMPY[dtype])
    shape = tensorcore.launch(dtype, batch, m, n)
    emulator().launch(shape.entry, shape.grid, shape.block, [a.ctypes.data, b.ctypes.data, c.ctypes.data],
                      [m, n, k, m * k, 0 if b.shape[0] == 1 else k * n, m * n, batch])
    return c


# (batch, m, k, n, B broadcast): warp and mma tiles cut, K across two shared tiles, a batch
# with B shared by its products; with DSLC_SLOW=1 also a single mma tile, and block tiles cut
# on every side (several blocks: about 10 s a dtype in the emulator)
SHAPES = [(2, 17, 20, 9, True), pytest.param(1, 16, 16, 8, False, marks=slow),
          pytest.param(1, 70, 40, 37, False, marks=slow), pytest.param(2, 65, 9, 66, True, marks=slow)]


@pytest.mark.parametrize("dtype", tensorcore.DTYPES)
@pytest.mark.parametrize("batch, m, k, n, broadcast", SHAPES)
def test_integer_products_are_exact(dtype, batch, m, k, n, broadcast):
    """Integers in [-3, 3]: every partial sum is an integer below 2^8, exact in f32 and in the
    result's dtype, so any fragment or tile misplaced changes the bits."""
    rng = np.random.default_rng(m * k + n)
    a = rng.integers(-3, 4, (batch, m, k)).astype(NUMPY[dtype])
    b = rng.integers(-3, 4, (1 if broadcast else batch, k, n)).astype(NUMPY[dtype])
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(NUMPY[dtype])
    assert np.abs(want.astype(np.float64)).max() < 2 ** 8
    assert product(dtype, a, b).tobytes() == want.tobytes()


def bound(dtype: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """docs/numerics.md's bound on |fast - exact| for C = A @ B: (2u + K·2^-22)·Σ|a||b| for the
    inputs' rounding u (TF32 for f32: 2^-11; 0 for bf16 and f16, which are their own inputs),
    plus the result's rounding, half an ulp of the dtype (2^-8 bf16, 2^-11 f16) relative."""
    k = a.shape[-1]
    u = {"f32": 2.0 ** -11, "bf16": 0.0, "f16": 0.0}[dtype]
    out = {"f32": 0.0, "bf16": 2.0 ** -8, "f16": 2.0 ** -11}[dtype]
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    return (2 * u + k * 2.0 ** -22) * magnitude * (1 + out) + out * np.abs(exact)


@pytest.mark.parametrize("dtype", tensorcore.DTYPES)
@pytest.mark.parametrize("m, k, n", [(20, 24, 12), pytest.param(70, 48, 40, marks=slow)])
def test_random_products_are_within_the_documented_bound(dtype, m, k, n):
    rng = np.random.default_rng(16)
    a = rng.standard_normal((1, m, k)).astype(NUMPY[dtype])
    b = rng.standard_normal((1, k, n)).astype(NUMPY[dtype])
    got = product(dtype, a, b).astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    error = np.abs(got - exact)
    assert np.all(error <= bound(dtype, a, b))
    if dtype == "f32":                  # TF32 inputs: visibly not the f32 product
        assert error.max() > 1e-5


def test_tf32_rounds_to_nearest_ties_away():
    """A 1 × 1 × 1 product of x and 1 is x rounded to TF32: 1 + 2^-11 (a tie) goes up to
    1 + 2^-10, 1 + 2^-12 down to 1, -(1 + 2^-11) to -(1 + 2^-10)."""
    x = np.array([1 + 2.0 ** -11, 1 + 2.0 ** -12, -(1 + 2.0 ** -11)], np.float32)
    got = product("f32", x.reshape(1, 3, 1), np.ones((1, 1, 1), np.float32)).reshape(-1)
    np.testing.assert_array_equal(got, np.array([1 + 2.0 ** -10, 1.0, -(1 + 2.0 ** -10)], np.float32))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_accepts_the_tensor_core_kernels(arch):
    text = tensorcore.ptx(arch=arch)
    for instruction in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cvt.rna.tf32.f32"):
        assert instruction in text
    report = nvptx.ptxas(text, arch)
    assert "spill" not in report or "0 bytes spill stores" in report
    for dtype in tensorcore.DTYPES:
        assert tensorcore.shared_bytes(dtype) <= nvptx.SHARED_LIMIT
