"""The canonical arithmetic (ir/numerics.py) against its definition written out the slow,
obvious way: the reduction order, exact fma, contraction order, max/min of ties and NaN."""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from ir import numerics
from ir.ops import REGISTRY

rng = np.random.default_rng(7)


def slow_reduce(values: list, combine, identity):
    """The definition of ir/numerics.py, element by element."""
    if len(values) > numerics.CHUNK:
        chunks = [values[i:i + numerics.CHUNK] for i in range(0, len(values), numerics.CHUNK)]
        return slow_reduce([slow_reduce(c, combine, identity) for c in chunks], combine, identity)
    lanes = [identity] * numerics.LANES
    seen = [False] * numerics.LANES
    for i, v in enumerate(values):
        j = i % numerics.LANES
        lanes[j] = combine(lanes[j], v) if seen[j] else v
        seen[j] = True
    s = numerics.LANES // 2
    while s:
        for j in range(s):
            lanes[j] = combine(lanes[j], lanes[j + s])
        s //= 2
    return lanes[0]


@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 100, 4096, 4097, 9000])
def test_sum_follows_the_canonical_order(n):
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    got = numerics.reduce(x[None, :], (1,), np.add, -0.0)[0]
    want = slow_reduce(list(x), lambda a, b: np.float32(a + b), np.float32(-0.0))
    assert got.tobytes() == np.float32(want).tobytes()


def test_sum_primitive_reduces_several_axes_in_row_major_order():
    x = rng.standard_normal((3, 40, 50)).astype(np.float32)
    got = REGISTRY["sum"].evaluate(x, axis=(0, 2))
    for j in range(40):
        want = slow_reduce(list(x[:, j, :].reshape(-1)), lambda a, b: np.float32(a + b), -0.0)
        assert got[j].tobytes() == np.float32(want).tobytes()


def test_max_ties_and_nan():
    a = np.array([-0.0, 0.0, np.nan, 1.0, 2.0], np.float32)
    b = np.array([0.0, -0.0, 1.0, np.nan, 2.0], np.float32)
    got = numerics.maximum(a, b)
    assert [str(v) for v in got] == ["-0.0", "0.0", "nan", "nan", "2.0"]
    assert np.isnan(REGISTRY["max"].evaluate(np.array([1.0, np.nan, 3.0], np.float32)))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_fma_is_correctly_rounded(dtype):
    a, b, c = ((rng.standard_normal(3000) * 2.0 ** rng.integers(-20, 20, 3000)).astype(dtype)
               for _ in range(3))
    got = numerics.fma(a, b, c)
    assert got.dtype == dtype
    for x, y, z, r in zip(a, b, c, got):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        err = abs(Fraction(float(r)) - exact)
        for neighbour in (np.nextafter(r, dtype(np.inf)), np.nextafter(r, dtype(-np.inf))):
            assert err <= abs(Fraction(float(neighbour)) - exact)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_matmul_accumulates_with_fma_in_k_order(dtype):
    a = rng.standard_normal((4, 37)).astype(dtype)
    b = rng.standard_normal((37, 3)).astype(dtype)
    got = REGISTRY["matmul"].evaluate(a, b)
    assert got.dtype == dtype
    for i in range(4):
        for j in range(3):
            acc = dtype(-0.0)
            for k in range(37):
                acc = numerics.fma(a[i, k:k + 1], b[k, j:j + 1], np.array([acc]))[0]
            assert got[i, j].tobytes() == acc.tobytes()


BF16 = np.array([0.0, -0.0, 1.0, -1.5, 3.0, 1 / 3, 1 + 2 ** -7, 2 ** -133, -(2.0 ** 120), 3e38, np.inf,
                 -np.inf, np.nan] + list(rng.standard_normal(40) * 2.0 ** rng.integers(-30, 30, 40)),
                ml_dtypes.bfloat16)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_bf16_arithmetic_is_correctly_rounded(name):
    """bf16 + - * / round the exact result once: the float64 result, exact or rounded to 53
    bits, rounds to bf16's 8 as the exact one would (53 ≥ 2·8 + 2)."""
    a, b = (g.ravel() for g in np.meshgrid(BF16, BF16))
    with np.errstate(all="ignore"):
        got = REGISTRY[name].evaluate(a=a, b=b)
        want = getattr(np, {"sub": "subtract", "mul": "multiply", "div": "divide"}.get(name, name))(
            a.astype(np.float64), b.astype(np.float64)).astype(ml_dtypes.bfloat16)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(want)].tobytes() == want[~np.isnan(want)].tobytes()


def test_bf16_sum_follows_the_canonical_order():
    x = (rng.standard_normal(5000) * 10.0 ** rng.integers(-3, 4, 5000)).astype(ml_dtypes.bfloat16)
    got = REGISTRY["sum"].evaluate(x)
    want = slow_reduce(list(x), lambda a, b: (a + b).astype(ml_dtypes.bfloat16), ml_dtypes.bfloat16(-0.0))
    assert got.dtype == x.dtype and got.tobytes() == want.tobytes()


def test_einsum_is_matmul_when_it_spells_one():
    a = rng.standard_normal((2, 5, 7)).astype(np.float32)
    b = rng.standard_normal((2, 7, 3)).astype(np.float32)
    assert np.array_equal(REGISTRY["einsum"].evaluate("bik,bkj->bij", (a, b)),
                          REGISTRY["matmul"].evaluate(a, b))


@pytest.mark.parametrize("spec, sa, sb", [("bhtd,bhsd->bhts", (2, 3, 4, 5), (2, 3, 6, 5)),
                                          ("ij,jk->ki", (3, 4), (4, 5)),
                                          ("bhtd,bhts->bhsd", (2, 3, 4, 5), (2, 3, 4, 6)),
                                          ("bikjlc,klco->bijo", (2, 3, 2, 3, 2, 4), (2, 2, 4, 5))])
def test_einsum_rewritten_as_matmul_keeps_every_bit(spec, sa, sb):
    from ir import interp
    from ir.core import Builder, tensor_type
    from ir.passes import for_backends
    b = Builder()
    x, y = b.param(tensor_type("f32", sa)), b.param(tensor_type("f32", sb))
    f = b.finish([b.emit("einsum", x, y, spec=spec)])
    g = for_backends(f)
    names = [op.primitive.name for op in g.ops]
    assert "einsum" not in names and "matmul" in names
    # a result whose rows are b's letters (attention's dV) is b's product with a, in place:
    # not a's with b, transposed after
    assert names[-1] == "matmul" or spec == "bikjlc,klco->bijo"
    a, c = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    assert interp.run(f, [a, c])[0].tobytes() == interp.run(g, [a, c])[0].tobytes()
