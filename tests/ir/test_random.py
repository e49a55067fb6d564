"""Philox 4x32-10 and the random primitives' reference evaluations (docs/random.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ir import philox
from ir.ops import REGISTRY
from ir.ops.base import OpError

N = 10 ** 6


def ev(name: str, **args):
    return REGISTRY[name].evaluate(**args)


def key(seed: int) -> np.ndarray:
    return ev("key", seed=seed)


def bits(x: np.ndarray) -> list[str]:
    return [f"{w:0{2 * x.itemsize}x}" for w in x.view(f"u{x.itemsize}").ravel()]


# Random123 tests/kat_vectors, "philox4x32 10" lines (counter[4], key[2] -> output[4]); the
# last two are from the longer table in Random123's manual examples (girving/random123-manual).
KAT = [
    ("00000000 00000000 00000000 00000000", "00000000 00000000",
     "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ("ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff",
     "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ("243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0",
     "d16cfe09 94fdcceb 5001e420 24126ea1"),
    ("00000001 00000000 00000000 00000000", "00000001 00000000",
     "ac08141b dfc5ccbe 79c07a47 a7f66093"),
    ("243f6a88 85a308d3 13198a2e 03707344", "00000000 ffffffff",
     "08f7720c 845ee9e0 502ccd3d a9a00e27"),
]


def words(s: str) -> list[int]:
    return [int(w, 16) for w in s.split()]


@pytest.mark.parametrize("counter, k, want", KAT)
def test_philox_known_answers(counter: str, k: str, want: str) -> None:
    got = philox.philox4x32(*words(counter), *words(k))
    assert [int(w) for w in got] == words(want)


def test_philox_is_vectorised_over_counters() -> None:
    c = np.array([[0, 1], [0, 0]], np.uint32)          # two counters: (0,0,0,0), (1,0,0,0)
    got = np.stack(philox.philox4x32(c[0], c[1], 0, 0, 0, 0), axis=-1)
    assert [int(w) for w in got[0]] == words(KAT[0][2])
    assert [int(w) for w in got[1]] == words("f8e4cca4 5cb200db b1a574eb 097eff67")


# ---------------------------------------------------------------- keys

def test_key_layout() -> None:
    k = key(0x0123456789ABCDEF)
    assert k.dtype == np.uint32 and k.shape == (2,)
    assert [int(w) for w in k] == [0x89ABCDEF, 0x01234567]
    with pytest.raises(OpError):
        key(2 ** 64)


def test_split_and_fold_in_worked_example() -> None:
    assert [bits(k) for k in ev("key_split", k=key(0), n=2)] == [["2dce73e5", "1348e23f"],
                                                                ["e9535be3", "510c4549"]]
    assert bits(ev("fold_in", k=key(0), i=1)) == ["ba98ca8c", "646648d3"]


def test_derived_keys_are_distinct() -> None:
    k = key(42)
    subkeys = ev("key_split", k=k, n=1000)
    folded = [ev("fold_in", k=k, i=i) for i in range(1000)]
    every = {tuple(map(int, x)) for x in [k, *subkeys, *folded]}
    assert len(every) == 2001                    # split and fold_in never use the same counter


def test_split_is_prefix_consistent_and_deterministic() -> None:
    a, b = ev("key_split", k=key(7), n=5), ev("key_split", k=key(7), n=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(x.dtype == np.uint32 and x.shape == (2,) for x in a)


def test_fold_in_takes_the_integer_value_mod_2_64() -> None:
    k = key(3)
    want = ev("fold_in", k=k, i=2 ** 64 - 1)
    assert np.array_equal(ev("fold_in", k=k, i=np.int32(-1)), want)
    assert np.array_equal(ev("fold_in", k=k, i=np.array(-1, np.int64)), want)
    assert not np.array_equal(ev("fold_in", k=k, i=np.uint32(2 ** 32 - 1)), want)
    with pytest.raises(OpError):
        ev("fold_in", k=k, i=np.float32(1))


# ---------------------------------------------------------------- draws

def test_uniform_worked_example() -> None:
    u = ev("uniform", k=key(0), shape=(4,))
    assert bits(u) == ["3ecc4fd0", "3f6169c5", "3f3c57ac", "3f1b00db"]
    assert u.tolist() == [w / 2 ** 24 for w in (0x6627e8, 0xe169c5, 0xbc57ac, 0x9b00db)]
    assert bits(ev("uniform", k=key(0), shape=(4,), low=-1.0, high=1.0)) == [
        "be4ec0c0", "3f42d38a", "3ef15eb0", "3e5806d8"]
    assert bits(ev("uniform", k=key(0), shape=(2,), dtype="f64")) == [
        "3fec2d38b1acc4fd", "3fe3601b7b178af5"]


@pytest.mark.parametrize("name, args, dtype", [
    ("uniform", {}, "f4"), ("uniform", {"low": -3.0, "high": 0.5, "dtype": "f64"}, "f8"),
    ("uniform", {"dtype": "f16"}, "f2"), ("normal", {}, "f4"), ("normal", {"dtype": "f64"}, "f8"),
    ("normal", {"dtype": "f16"}, "f2"), ("bernoulli", {"p": 0.3}, "bool"),
])
def test_draws_are_deterministic_shaped_and_prefix_consistent(name: str, args: dict,
                                                              dtype: str) -> None:
    k = ev("fold_in", k=key(1), i=5)
    small = ev(name, k=k, shape=(7,), **args)
    large = ev(name, k=k, shape=(4, 5), **args)
    assert large.shape == (4, 5) and large.dtype == np.dtype(dtype)
    assert np.array_equal(small, large.ravel()[:7])
    assert np.array_equal(large, ev(name, k=k, shape=(4, 5), **args))
    other = ev(name, k=ev("fold_in", k=key(1), i=6), shape=(4, 5), **args)
    assert not np.array_equal(large, other)


def test_draws_reject_what_the_rules_reject() -> None:
    with pytest.raises(OpError):
        ev("uniform", k=key(0), shape=(3,), dtype="i32")


def test_bf16_draws_are_the_f32_draws_rounded() -> None:
    """docs/random.md: bf16 computes as f32, then rounds to nearest even; uniform's rounding
    up to high is clamped to the largest bf16 below it."""
    k = key(3)
    normal = ev("normal", k=k, shape=(1000,), dtype="bf16")
    assert normal.dtype.name == "bfloat16"
    assert normal.tobytes() == ev("normal", k=k, shape=(1000,)).astype(normal.dtype).tobytes()
    u32, u = ev("uniform", k=k, shape=(1000,)), ev("uniform", k=k, shape=(1000,), dtype="bf16")
    rounded = u32.astype(u.dtype)
    assert (rounded == 1).any()                  # the clamp is exercised
    np.testing.assert_array_equal(u, np.where(rounded == 1, 1 - 2.0 ** -8, rounded).astype(u.dtype))


def within(stat: float, want: float, se: float, z: float = 5.0) -> bool:
    return abs(stat - want) < z * se


@pytest.mark.parametrize("low, high, dtype", [(0.0, 1.0, "f32"), (-2.0, 3.0, "f32"),
                                              (10.0, 10.5, "f64")])
def test_uniform_statistics(low: float, high: float, dtype: str) -> None:
    x = ev("uniform", k=key(11), shape=(N,), low=low, high=high, dtype=dtype).astype(np.float64)
    assert x.min() >= low and x.max() < high
    w = high - low
    assert within(x.mean(), (low + high) / 2, w / math.sqrt(12 * N))
    assert within(x.var(), w * w / 12, math.sqrt((w ** 4 / 80 - (w * w / 12) ** 2) / N))


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16"])
def test_uniform_never_reaches_high(dtype: str) -> None:
    # with high one ulp above low, low + (high - low) * u rounds to high for u > 1/2: the clamp
    # brings those back below high, to low
    t = np.dtype({"f32": "f4", "f64": "f8", "f16": "f2"}[dtype]).type
    high = float(np.nextafter(t(1000), t(np.inf)))
    x = ev("uniform", k=key(12), shape=(1000,), low=1000.0, high=high, dtype=dtype)
    assert (x == 1000).all()


def normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_normal_statistics(dtype: str) -> None:
    x = ev("normal", k=key(13), shape=(N,), dtype=dtype).astype(np.float64)
    assert np.isfinite(x).all()
    assert within(x.mean(), 0.0, 1 / math.sqrt(N))
    assert within(x.var(), 1.0, math.sqrt(2 / N))
    # Kolmogorov-Smirnov: sup |F_n - Phi| against the 0.1% critical value 1.95 / sqrt(n)
    s = np.sort(x[: 10 ** 5])
    n = len(s)
    cdf = np.array([normal_cdf(v) for v in s])
    d = max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max())
    assert d < 1.95 / math.sqrt(n)


def test_normal_follows_the_box_muller_formula() -> None:
    """Each f32 pair against the doc's formula evaluated in double from the same words."""
    z = ev("normal", k=key(0), shape=(1001,))
    s = philox.stream(key(0), 1002)
    u1 = ((s[0::2] >> 8) + 1) / 2 ** 24
    t = np.float32(2 * np.pi) * ((s[1::2] >> 8) / 2 ** 24)
    r = np.sqrt(-2 * np.log(u1))
    want = np.stack([r * np.cos(t), r * np.sin(t)], axis=-1).ravel()[:1001]
    np.testing.assert_allclose(z, want, rtol=2e-6, atol=2e-6)
    assert bits(z[:4]) == ["3f7dbb34", "bf6cb6ad", "bf1e1ba1", "bef6d1ac"]     # docs/random.md §7


def test_bernoulli_rate() -> None:
    p = 0.3
    x = ev("bernoulli", k=key(14), p=np.float32(p), shape=(N,))
    assert x.dtype == np.bool_
    assert within(x.mean(), p, math.sqrt(p * (1 - p) / N))
    assert not ev("bernoulli", k=key(14), p=0.0, shape=(1000,)).any()
    assert ev("bernoulli", k=key(14), p=1.0, shape=(1000,)).all()


def test_bernoulli_is_uniform_below_p() -> None:
    k = key(15)
    assert np.array_equal(ev("bernoulli", k=k, p=0.25, shape=(3, 8)),
                          ev("uniform", k=k, shape=(3, 8)) < np.float32(0.25))
