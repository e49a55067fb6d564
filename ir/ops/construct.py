"""Tensors made from nothing: `zeros ones full arange eye`."""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ir.dims import Dim
from ir.ops.base import (Kind, OpError, Param, Primitive, Role, check_fill, check_shape, np_dtype,
                         primitive, range_length, statics)
from ir.types import FLOAT_DTYPES, TensorType


class Filled(Primitive):
    """A tensor of `shape` holding one value everywhere."""
    host = "made once per executable"
    params = (Param("shape", Kind.SHAPE), Param("dtype", Kind.DTYPE, "f32"))
    fill: ClassVar[int]
    differentiable = False

    def infer(self, shape: tuple[Dim, ...], dtype: str = "f32") -> TensorType:
        check_shape(shape, "shape")
        return TensorType(dtype, tuple(shape))

    def evaluate(self, shape: tuple[int, ...], dtype: str = "f32") -> np.ndarray:
        return np.full(shape, self.fill, np_dtype(dtype))

    def mlir(self, w: Any, op: Any) -> list[str]:
        out = op.outputs[0]
        return [w.filled(op.attrs["value"] if "value" in op.attrs else self.fill, out.shape, out.dtype, self.name)]


@primitive
class Zeros(Filled):
    """Zeros (False for bool)."""
    name = surface = "zeros"
    fill = 0


@primitive
class Ones(Filled):
    """Ones (True for bool)."""
    name = surface = "ones"
    fill = 1


@primitive
class Full(Filled):
    """`value` everywhere; a float value needs a float dtype."""
    name = surface = "full"
    params = (Param("shape", Kind.SHAPE), Param("value", Kind.NUMBER),
              Param("dtype", Kind.DTYPE, "f32"))

    def infer(self, shape: tuple[Dim, ...], value: int | float,
              dtype: str = "f32") -> TensorType:
        check_fill(value, dtype, "value")
        return super().infer(shape, dtype)

    def evaluate(self, shape: tuple[int, ...], value: int | float,
                 dtype: str = "f32") -> np.ndarray:
        return np.full(shape, value, np_dtype(dtype))


def _range(start: Dim | int, stop: Dim | int | None) -> tuple[Dim | int, Dim | int]:
    """arange's bounds: arange(n) is arange(0, n)."""
    return (0, start) if stop is None else (start, stop)


@primitive
class Arange(Primitive):
    """The integers start, start + step, … before stop, as in range(); arange(n) counts 0 to
    n - 1. The bounds are static ints; dtype may be a float dtype."""
    host = "made once per executable"
    name = surface = "arange"
    params = (Param("start", Kind.DIM), Param("stop", Kind.DIM, None), Param("step", Kind.INT, 1),
              Param("dtype", Kind.DTYPE, "i32"))
    differentiable = False

    def infer(self, start: Dim, stop: Dim | None = None, step: int = 1,
              dtype: str = "i32") -> TensorType:
        if step == 0:
            raise OpError("arange's step cannot be zero", "step")
        if dtype == "bool":
            raise OpError("arange makes numbers, not bool; compare them to get bools", "dtype")
        lo, hi = map(Dim.of, _range(start, stop))
        return TensorType(dtype, (range_length(lo, hi, step),))

    def evaluate(self, start: int, stop: int | None = None, step: int = 1,
                 dtype: str = "i32") -> np.ndarray:
        return np.arange(*_range(start, stop), step, dtype=np_dtype(dtype))

    def mlir(self, w: Any, op: Any) -> list[str]:
        """Element i of a linalg.generic as NumPy fills it: an integer start + i * step in i64
        (wrapping to dtype); a float start + i * (second - start) in f32 (f64 for f64) from the
        first two elements rounded to dtype, and those two as they are."""
        a, b = statics(op), w.body
        (start, _), step, dtype = map(int, _range(a["start"], a["stop"])), a["step"], a["dtype"]

        def element(args: list) -> list:
            i = b.from_index(b.position(0), "i64")
            if dtype not in FLOAT_DTYPES:
                return [b.cast(b.add(b.const(start, "i64"), b.mul(i, b.const(step, "i64"))), "i64", dtype)]
            ft = np_dtype("f64" if dtype == "f64" else "f32").type
            with np.errstate(all="ignore"):          # (f16's may be inf, and inf - inf NaN)
                first, second = (np_dtype(dtype).type(v) for v in (start, start + step))
                delta = ft(second) - ft(first)
            t = "f64" if dtype == "f64" else "f32"
            x = b.cast(b.add(b.const(ft(first), t), b.mul(b.cast(i, "i64", t), b.const(delta, t))), t, dtype)
            for k, value in ((1, second), (0, first)):
                x = b.select(b.compare("==", i, b.const(k, "i64"), "i64"), b.const(value, dtype), x)
            return [x]
        return w.generic(op.outputs[0].shape, [dtype], [], element, hint=self.name)


@primitive
class Eye(Primitive):
    """The n × m identity matrix (m defaults to n)."""
    host = "made once per executable"
    name = surface = "eye"
    params = (Param("n", Kind.DIM), Param("m", Kind.DIM, None), Param("dtype", Kind.DTYPE, "f32"))
    differentiable = False

    def infer(self, n: Dim, m: Dim | None = None, dtype: str = "f32") -> TensorType:
        m = n if m is None else m
        check_shape((n,), "n")
        check_shape((m,), "m")
        return TensorType(dtype, (n, m))

    def evaluate(self, n: int, m: int | None = None, dtype: str = "f32") -> np.ndarray:
        return np.eye(n, m, dtype=np_dtype(dtype))

    def mlir(self, w: Any, op: Any) -> list[str]:
        """1 where the row's index is the column's, else 0: a linalg.generic."""
        b, out = w.body, op.outputs[0]

        def element(args: list) -> list:
            diagonal = b.compare("==", b.position(0), b.position(1), "index")
            return [b.select(diagonal, b.const(1, out.dtype), b.const(0, out.dtype))]
        return w.generic(out.shape, [out.dtype], [], element, hint=self.name)


@primitive
class Constant(Primitive):
    """A literal tensor: a number or a nested tuple of numbers, in the given dtype (IR only)."""
    role, host = Role.CONSTANT, "a literal that is not a scalar is made once per executable"
    name = "constant"
    params = (Param("value", Kind.STATIC), Param("dtype", Kind.DTYPE))
    differentiable = False

    def infer(self, value: Any, dtype: str) -> TensorType:
        return TensorType(dtype, tuple(Dim.const(n) for n in np.shape(value)))

    def evaluate(self, value: Any, dtype: str) -> np.ndarray:
        return np.array(value, dtype=np_dtype(dtype))

    def mlir(self, w: Any, op: Any) -> list[str] | None:
        """A scalar is written where it is used (a region's arith.constant, mostly); a literal
        tensor is an arith.constant of a dense attribute."""
        from ir.mlir import literal, type_of
        value, dtype = op.attrs["value"], op.attrs["dtype"]
        out = op.outputs[0]
        if not out.shape:
            w.scalars[out] = (value, dtype)
            return None
        flat = np.asarray(value, dtype=object).reshape(-1)
        if len(set(flat.tolist())) == 1:
            dense = literal(flat[0], dtype)
        else:
            dense = repr(np.vectorize(lambda x: literal(x, dtype), otypes=[object])(
                np.asarray(value, dtype=object)).tolist()).replace("'", "")
        name = w.fresh("cst")
        w.line(f"{name} = arith.constant dense<{dense}> : {type_of(out)}")
        return [name]
