"""IREE's math library (device="iree"), each function as dslc exports it, held to the bounds
docs/numerics.md gives it ("IREE's math library"): in ulps, where the arguments and the exact
result are normal numbers, on a fixed sample of benchmarks/mathlib_ulps.py's inputs."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import benchmark

pytest.importorskip("iree.compiler", reason="IREE is not installed (pip install 'dslc[iree]')")

bench = benchmark("mathlib_ulps")
F32, F64 = np.float32, np.float64
# The documented bounds; the functions without one are absent (numerics.md says why).
BOUND = {
    F32: dict(exp=6, log=1, log2=2, tanh=5, sigmoid=3, rsqrt=2, pow=160, atan=41, asin=8, acos=2,
              log1p=3, expm1=6, erf=5, sqrt=0.5),
    F64: dict(exp=1, exp2=750, log=1, sigmoid=3, rsqrt=2, pow=1200, sqrt=0.5),
}
CASES = [(name, dtype) for dtype, bounds in BOUND.items() for name in bounds]
SAMPLE = 1 << 14


@pytest.fixture(scope="module")
def kernels():
    return bench.IreeKernels(SAMPLE, together=CASES)       # one IREE compile for all


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{np.dtype(d).name}" for n, d in CASES])
def test_iree_math_within_its_documented_bound(kernels, name, dtype):
    args = bench.inputs(name, SAMPLE, np.random.default_rng(1), dtype)
    ref = bench.reference(name, *args)
    err = np.where(bench.normal_in_out(args, ref), bench.ulp_error(kernels(name, *args), ref), 0.0)
    i = int(np.argmax(err))
    assert err[i] <= BOUND[dtype][name], f"IREE's {name}{tuple(a[i] for a in args)} is {err[i]:.3f} ulp off"
