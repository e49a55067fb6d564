"""Counter-based randomness (Philox 4x32-10, §9): keys and the draws made from them.

A key is a value like any other: `split` and `fold_in` derive new keys, and a draw is a
function of its key and shape alone. The bit-exact definitions, and with them the reference
evaluations, belong to the stage that implements Philox; here are the signatures and rules."""
from __future__ import annotations

from ir.dims import Dim
from ir.ops.base import Kind, OpError, Param, Primitive, check_shape, primitive
from ir.types import FLOAT_DTYPES, KeyType, ListType, TensorType


class Random(Primitive):
    """A primitive of keys and draws; nothing flows back through it."""
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


@primitive
class KeySplit(Random):
    """n new independent keys from k, as a list."""
    name, surface = "key_split", "split"
    params = (Param("k", Kind.KEY), Param("n", Kind.DIM, Dim.const(2)))

    def infer(self, k: KeyType, n: Dim = Dim.const(2)) -> ListType:
        if n.value is not None and n.value < 1:
            raise OpError(f"split makes at least 1 key, got n = {n}", "n")
        return ListType(KeyType(), n)


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


@primitive
class Normal(Draw):
    """Standard normal: mean 0, variance 1."""
    name = surface = "normal"
    params = (Param("k", Kind.KEY), Param("shape", Kind.SHAPE), Param("dtype", Kind.DTYPE, "f32"))

    def infer(self, k: KeyType, shape: tuple[Dim, ...], dtype: str = "f32") -> TensorType:
        return self.check(shape, dtype)


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
