"""Counter-based randomness (Philox 4x32-10, §9): keys and the draws made from them.

A key is a value like any other: `split` and `fold_in` derive new keys, and a draw is a
function of its key and shape alone. docs/random.md defines every bit; `evaluate` is its
NumPy reference (the block function and counters are in ir.philox)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ir import philox
from ir.dims import Dim
from ir.ops.base import (Kind, OpError, Param, Primitive, check_shape, np_dtype, primitive,
                         type_of)
from ir.types import FLOAT_DTYPES, KeyType, ListType, TensorType

TWO_PI = {np.float32: np.float32(2 * np.pi), np.float64: np.float64(2 * np.pi)}


def _unit(w: np.ndarray, plus_one: bool = False) -> np.ndarray:
    """A word as a float32 in [0, 1): (w >> 8) * 2**-24; with plus_one, in (0, 1]."""
    return ((w >> 8) + int(plus_one)).astype(np.float32) * np.float32(2.0 ** -24)


def _unit64(lo: np.ndarray, hi: np.ndarray, plus_one: bool = False) -> np.ndarray:
    """Two words as a float64 in [0, 1): ((hi << 32 | lo) >> 11) * 2**-53; plus_one: (0, 1]."""
    v = (hi.astype(np.uint64) << np.uint64(32) | lo) >> np.uint64(11)
    return (v + np.uint64(int(plus_one))).astype(np.float64) * 2.0 ** -53


def _dims(shape: tuple[int, ...]) -> tuple[Dim, ...]:
    return tuple(Dim.const(int(d)) for d in shape)


class Random(Primitive):
    """A primitive of keys and draws; nothing flows back through it."""
    random, host = True, "Philox counters in NumPy (docs/random.md)"
    differentiable = False


@primitive
class Key(Random):
    """The key of a static seed in [0, 2**64)."""
    name = surface = "key"
    params = (Param("seed", Kind.INT),)

    def infer(self, seed: int) -> KeyType:
        if not 0 <= seed < 2 ** 64:
            raise OpError(f"a seed is an integer in [0, 2**64), got {seed}", "seed")
        return KeyType()

    def evaluate(self, seed: int) -> np.ndarray:
        self.infer(seed)
        return philox.seed_key(seed)


@primitive
class KeySplit(Random):
    """n new independent keys from k, as a list."""
    name, surface = "key_split", "split"
    params = (Param("k", Kind.KEY), Param("n", Kind.DIM, Dim.const(2)))

    def infer(self, k: KeyType, n: Dim = Dim.const(2)) -> ListType:
        if n.value is not None and n.value < 1:
            raise OpError(f"split makes at least 1 key, got n = {n}", "n")
        return ListType(KeyType(), n)

    def evaluate(self, k: np.ndarray, n: int = 2) -> list[np.ndarray]:
        """Key i is words 0, 1 of the block for counter i + 2**96 * SPLIT."""
        self.infer(KeyType(), Dim.const(n))
        w0, w1, _, _ = philox.block(k, np.arange(n, dtype=np.uint64), philox.SPLIT)
        return [np.array([a, b], np.uint32) for a, b in zip(w0, w1)]


@primitive
class FoldIn(Random):
    """A new key from k and an integer (a static int or an integer scalar tensor, such as a
    step counter)."""
    name = surface = "fold_in"
    params = (Param("k", Kind.KEY), Param("i", Kind.TENSOR))

    def infer(self, k: KeyType, i: TensorType) -> KeyType:
        if not i.is_int or i.rank:
            raise OpError(f"fold_in needs an integer scalar, got {i}", "i")
        return KeyType()

    def evaluate(self, k: np.ndarray, i: Any) -> np.ndarray:
        """Words 0, 1 of the block for counter (i mod 2**64) + 2**96 * FOLD_IN."""
        self.infer(KeyType(), type_of(i))
        return philox.derive(k, int(i), philox.FOLD_IN)


class Draw(Random):
    """A float tensor of `shape` drawn from k."""

    def check(self, shape: tuple[Dim, ...], dtype: str) -> TensorType:
        check_shape(shape, "shape")
        if dtype not in FLOAT_DTYPES:
            raise OpError(f"{self.name} draws floats, not {dtype}", "dtype")
        return TensorType(dtype, tuple(shape))


@primitive
class Uniform(Draw):
    """Uniform on [low, high)."""
    name = surface = "uniform"
    params = (Param("k", Kind.KEY), Param("shape", Kind.SHAPE), Param("low", Kind.NUMBER, 0.0),
              Param("high", Kind.NUMBER, 1.0), Param("dtype", Kind.DTYPE, "f32"))

    def infer(self, k: KeyType, shape: tuple[Dim, ...], low: float = 0.0, high: float = 1.0,
              dtype: str = "f32") -> TensorType:
        return self.check(shape, dtype)

    def evaluate(self, k: np.ndarray, shape: tuple[int, ...], low: float = 0.0,
                 high: float = 1.0, dtype: str = "f32") -> np.ndarray:
        """low + (high - low) * u in f64 for f64, else in f32 then rounded to dtype; a result
        that rounded up to high becomes the largest value below it."""
        self.infer(KeyType(), _dims(shape), low, high, dtype)
        out, n = np_dtype(dtype), int(np.prod(shape))
        if dtype == "f64":
            s = philox.stream(k, 2 * n)
            u, lo, hi = _unit64(s[0::2], s[1::2]), np.float64(low), np.float64(high)
        else:
            u, lo, hi = _unit(philox.stream(k, n)), np.float32(low), np.float32(high)
        x = (lo + (hi - lo) * u).astype(out)
        return np.minimum(x, self.top(low, high, dtype)).reshape(shape)

    @staticmethod
    def top(low: float, high: float, dtype: str) -> np.floating:
        """The largest value a draw takes: the largest of the dtype below high where
        low < high (both rounded to the dtype), else +inf (nothing is clamped)."""
        out, computed = np_dtype(dtype), np.float64 if dtype == "f64" else np.float32
        lo, hi = (out.type(computed(v)) for v in (low, high))
        return np.nextafter(hi, lo) if lo < hi else out.type(np.inf)


@primitive
class Normal(Draw):
    """Standard normal: mean 0, variance 1."""
    name = surface = "normal"
    params = (Param("k", Kind.KEY), Param("shape", Kind.SHAPE), Param("dtype", Kind.DTYPE, "f32"))

    def infer(self, k: KeyType, shape: tuple[Dim, ...], dtype: str = "f32") -> TensorType:
        return self.check(shape, dtype)

    def evaluate(self, k: np.ndarray, shape: tuple[int, ...], dtype: str = "f32") -> np.ndarray:
        """Box-Muller on pairs: elements 2m, 2m+1 are r cos(t), r sin(t) with
        r = sqrt(-2 log u1), t = 2pi u2; in f64 for f64, else in f32 then rounded to dtype."""
        self.infer(KeyType(), _dims(shape), dtype)
        out, n = np_dtype(dtype), int(np.prod(shape))
        pairs = (n + 1) // 2
        if dtype == "f64":
            s, ft = philox.stream(k, 4 * pairs), np.float64
            u1, u2 = _unit64(s[0::4], s[1::4], True), _unit64(s[2::4], s[3::4])
        else:
            s, ft = philox.stream(k, 2 * pairs), np.float32
            u1, u2 = _unit(s[0::2], True), _unit(s[1::2])
        r = np.sqrt(ft(-2) * np.log(u1))
        t = TWO_PI[ft] * u2
        z = np.stack([r * np.cos(t), r * np.sin(t)], axis=-1).reshape(-1)[:n]
        return z.astype(out).reshape(shape)


@primitive
class Bernoulli(Random):
    """A bool tensor of `shape`, each element True with probability p (a float scalar)."""
    name = surface = "bernoulli"
    params = (Param("k", Kind.KEY), Param("p", Kind.TENSOR), Param("shape", Kind.SHAPE))

    def infer(self, k: KeyType, p: TensorType, shape: tuple[Dim, ...]) -> TensorType:
        if p.rank or not (p.is_float or (p.weak and p.is_int)):
            raise OpError(f"bernoulli needs a float scalar probability, got {p}", "p")
        check_shape(shape, "shape")
        return TensorType("bool", tuple(shape))

    def evaluate(self, k: np.ndarray, p: Any, shape: tuple[int, ...]) -> np.ndarray:
        """u < p, with u as in uniform (f32) and p rounded to f32."""
        self.infer(KeyType(), type_of(p), _dims(shape))
        u = _unit(philox.stream(k, int(np.prod(shape))))
        return (u < np.float32(p)).reshape(shape)
