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


def _rounded(f: Any, x: np.ndarray) -> np.ndarray:
    """f(x) correctly rounded for the float32 x a normal draw feeds it: f in float64, rounded
    (docs/random.md §5; float64 x as NumPy computes it)."""
    return f(x.astype(np.float64)).astype(x.dtype) if x.dtype == np.float32 else f(x)


def _dims(shape: tuple[int, ...]) -> tuple[Dim, ...]:
    return tuple(Dim.const(int(d)) for d in shape)


# ---------------------------------------------------------------- Philox in MLIR (ir/mlir.py's
# region vocabulary, `b`): the words of docs/random.md computed per element, bit for bit

def _philox(b: Any, c: list, k0: Any, k1: Any) -> list:
    """The Philox 4x32-10 block of counter words c under key (k0, k1), as philox4x32."""
    m0, m1 = b.const(philox.M0, "u32"), b.const(philox.M1, "u32")
    for r in range(philox.ROUNDS):
        if r:
            k0, k1 = b.add(k0, b.const(philox.W0, "u32")), b.add(k1, b.const(philox.W1, "u32"))
        hi0, lo0 = b.mul_wide(m0, c[0])
        hi1, lo1 = b.mul_wide(m1, c[2])
        c = [b.xor(b.xor(hi1, c[1]), k0), lo1, b.xor(b.xor(hi0, c[3]), k1), lo0]
    return c


def _block(w: Any, key: Any, index: Any, domain: int) -> list:
    """The block for counter index + 2**96 * domain (index an i64) under the key tensor `key`."""
    b = w.body
    k0, k1 = (b.extract(w[key], "tensor<2xi32>", "u32", [w.index_here(i)]) for i in (0, 1))
    lo, hi = b.cast(index, "i64", "u32"), b.cast(b.shift_right(index, 32), "i64", "u32")
    return _philox(b, [lo, hi, b.const(0, "u32"), b.const(domain, "u32")], k0, k1)


def _pick(b: Any, words: list, r: Any) -> Any:
    """words[r] for an i64 r in [0, len(words))."""
    out = words[0]
    for i, word in enumerate(words[1:], 1):
        out = b.select(b.compare("==", r, b.const(i, "i64"), "i64"), word, out)
    return out


def _stream(w: Any, key: Any, q: Any, count: int) -> list:
    """Words q … q + count - 1 of key's draw stream (q an i64 whose words share one block)."""
    b = w.body
    words = _block(w, key, b.shift_right(q, 2), philox.DRAW)
    r = b.and_(q, b.const(3, "i64"))
    if count == 4:
        return words
    return [_pick(b, words, b.add(r, b.const(i, "i64"))) for i in range(count)]


def _flat_index(w: Any, shape: tuple[int, ...]) -> Any:
    """The iteration's row-major element number, as an i64."""
    b, j = w.body, None
    for axis, n in enumerate(shape):
        at = b.position(axis)
        j = at if j is None else b.add(b.mul(j, w.index_here(n)), at)
    return b.from_index(j, "i64") if j is not None else b.const(0, "i64")


def _unit_mlir(b: Any, word: Any, plus_one: bool = False) -> Any:
    """unit32 (unit32⁺) of a word, as _unit."""
    v = b.shift_right(word, 8)
    if plus_one:
        v = b.add(v, b.const(1, "u32"))
    return b.mul(b.cast(v, "u32", "f32"), b.const(2.0 ** -24, "f32"))


def _unit64_mlir(b: Any, lo: Any, hi: Any, plus_one: bool = False) -> Any:
    """unit64 (unit64⁺) of two words, as _unit64."""
    v = b.or_(b.shift_left(b.cast(hi, "u32", "i64"), 32), b.cast(lo, "u32", "i64"))
    v = b.shift_right(v, 11)
    if plus_one:
        v = b.add(v, b.const(1, "i64"))
    return b.mul(b.cast(v, "i64", "f64"), b.const(2.0 ** -53, "f64"))


def _scalar_input(w: Any, v: Any) -> Any:
    """A scalar tensor input's value inside a region (a literal is a constant there)."""
    if v in w.scalars:
        return w.body.const(*w.scalars[v])
    from ir.mlir import type_of
    return w.body.extract(w[v], type_of(v), v.dtype, [])


def _draw(w: Any, op: Any, element: Any) -> list[str]:
    """A linalg.generic over op's result, each element element(j) of its number j (an i64)."""
    out = op.outputs[0]
    return w.generic(out.shape, [out.dtype], [], lambda args: [element(_flat_index(w, out.shape))],
                     hint=op.primitive.name)


class Random(Primitive):
    """A primitive of keys and draws; nothing flows back through it."""
    random, host = True, "Philox counters: backend/draws.py's in the native step, NumPy's in the walk"
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

    def mlir(self, w: Any, op: Any) -> list[str]:
        from ir.mlir import literal
        k0, k1 = (literal(x, "u32") for x in philox.seed_key(op.attrs["seed"]))
        name = w.fresh("key")
        w.line(f"{name} = arith.constant dense<[{k0}, {k1}]> : tensor<2xi32>")
        return [name]


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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """The n keys as the rows of one [n, 2] linalg.generic, sliced apart."""
        from ir.mlir import Window
        b, n = w.body, len(op.outputs)

        def key_word(args: list) -> list:
            words = _block(w, op.inputs[0], b.from_index(b.position(0), "i64"), philox.SPLIT)
            return [_pick(b, words[:2], b.from_index(b.position(1), "i64"))]
        keys = w.generic((n, 2), ["u32"], [], key_word, hint="keys")[0]
        return [w.extract(keys, (n, 2), "u32", Window.along((n, 2), 0, i, 1), (2,), "key")
                for i in range(n)]


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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """i sign-extended to 64 bits (a u32 zero-extended) is the counter's index."""
        b, (k, i) = w.body, op.inputs

        def key_word(args: list) -> list:
            words = _block(w, k, b.cast(_scalar_input(w, i), i.dtype, "i64"), philox.FOLD_IN)
            return [_pick(b, words[:2], b.from_index(b.position(0), "i64"))]
        return w.generic((2,), ["u32"], [], key_word, hint="key")


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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """The same three operations per element, their constants folded as NumPy folds them."""
        b, a, k = w.body, op.attrs, op.inputs[0]
        dtype = a.get("dtype", "f32")
        ft = "f64" if dtype == "f64" else "f32"
        lo, hi = np_dtype(ft).type(a.get("low", 0.0)), np_dtype(ft).type(a.get("high", 1.0))
        out = np_dtype(dtype).type

        def element(j: Any) -> Any:
            if ft == "f64":
                u = _unit64_mlir(b, *_stream(w, k, b.shift_left(j, 1), 2))
            else:
                u = _unit_mlir(b, _stream(w, k, j, 1)[0])
            x = b.cast(b.add(b.const(lo, ft), b.mul(b.const(hi - lo, ft), u)), ft, dtype)
            if out(lo) < out(hi):
                x = b.minimum(x, b.const(np.nextafter(out(hi), out(lo)), dtype))
            return x
        return _draw(w, op, element)


@primitive
class Normal(Draw):
    """Standard normal: mean 0, variance 1."""
    name = surface = "normal"
    params = (Param("k", Kind.KEY), Param("shape", Kind.SHAPE), Param("dtype", Kind.DTYPE, "f32"))

    def infer(self, k: KeyType, shape: tuple[Dim, ...], dtype: str = "f32") -> TensorType:
        return self.check(shape, dtype)

    def evaluate(self, k: np.ndarray, shape: tuple[int, ...], dtype: str = "f32") -> np.ndarray:
        """Box-Muller on pairs: elements 2m, 2m+1 are r cos(t), r sin(t) with
        r = sqrt(-2 log u1), t = 2pi u2; in f64 for f64, else in f32 (log, cos and sin
        correctly rounded) then rounded to dtype."""
        self.infer(KeyType(), _dims(shape), dtype)
        out, n = np_dtype(dtype), int(np.prod(shape))
        pairs = (n + 1) // 2
        if dtype == "f64":
            s, ft = philox.stream(k, 4 * pairs), np.float64
            u1, u2 = _unit64(s[0::4], s[1::4], True), _unit64(s[2::4], s[3::4])
        else:
            s, ft = philox.stream(k, 2 * pairs), np.float32
            u1, u2 = _unit(s[0::2], True), _unit(s[1::2])
        r = np.sqrt(ft(-2) * _rounded(np.log, u1))
        t = TWO_PI[ft] * u2
        z = np.stack([r * _rounded(np.cos, t), r * _rounded(np.sin, t)], axis=-1).reshape(-1)[:n]
        return z.astype(out).reshape(shape)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """Element j of pair m = j >> 1: r cos(t) or r sin(t) as j is even or odd (the
        math dialect's log, cos and sin: IREE's, not NumPy's)."""
        b, k = w.body, op.inputs[0]
        dtype = op.attrs.get("dtype", "f32")
        ft = "f64" if dtype == "f64" else "f32"

        def element(j: Any) -> Any:
            m = b.shift_right(j, 1)
            if ft == "f64":
                s = _stream(w, k, b.shift_left(m, 2), 4)
                u1, u2 = _unit64_mlir(b, s[0], s[1], True), _unit64_mlir(b, s[2], s[3])
            else:
                s = _stream(w, k, b.shift_left(m, 1), 2)
                u1, u2 = _unit_mlir(b, s[0], True), _unit_mlir(b, s[1])
            r = b.sqrt(b.mul(b.const(-2.0, ft), b.math("log", u1)))
            t = b.mul(b.const(TWO_PI[np_dtype(ft).type], ft), u2)
            odd = b.compare("!=", b.and_(j, b.const(1, "i64")), b.const(0, "i64"), "i64")
            z = b.mul(r, b.select(odd, b.math("sin", t), b.math("cos", t)))
            return b.cast(z, ft, dtype)
        return _draw(w, op, element)


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

    def mlir(self, w: Any, op: Any) -> list[str]:
        b, (k, p) = w.body, op.inputs

        def element(j: Any) -> Any:
            u = _unit_mlir(b, _stream(w, k, j, 1)[0])
            return b.compare("<", u, b.cast(_scalar_input(w, p), p.dtype, "f32"), "f32")
        return _draw(w, op, element)
