"""Reductions over axes: `sum mean max min argmax argmin`.

`axis` is None (all axes), an int or a tuple of ints, negative counting from the end;
`keepdims=True` keeps each reduced axis with length 1."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from ir.dims import Dim
from ir.ops.base import (NUMERIC, Kind, OpError, Param, Primitive, need, normalize_axes,
                         np_dtype, primitive, type_of)
from ir.types import DTYPES, FLOAT_DTYPES, TensorType

Axes = None | int | tuple[int, ...]


class Reduction(Primitive):
    """Combines the elements along axes; the result keeps the dtype unless `result_dtype`."""
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.AXES, None),
              Param("keepdims", Kind.BOOL, False))
    numpy: ClassVar[Callable[..., Any]]
    accepts: ClassVar[tuple[str, ...]] = DTYPES
    needs: ClassVar[str] = "any"             # said when accepts is narrower
    result_dtype: ClassVar[str | None] = None

    def infer(self, x: TensorType, axis: Axes = None, keepdims: bool = False) -> TensorType:
        x = need(x, self.accepts, f"'{self.name}' needs {self.needs} tensor, got {x}; "
                 "use cast()", "x")
        axes = normalize_axes(self.check_axis(axis), x.rank, str(x))
        shape = tuple(Dim.const(1) if i in axes else d for i, d in enumerate(x.shape)
                      if keepdims or i not in axes)
        if self.result_dtype:
            return TensorType(self.result_dtype, shape)
        return x.with_shape(shape)

    def check_axis(self, axis: Axes) -> Axes:
        return axis

    def evaluate(self, x: Any, axis: Axes = None, keepdims: bool = False) -> np.ndarray:
        out = self.infer(type_of(x), axis, keepdims)
        return np.asarray(self.numpy(x, axis=axis, keepdims=keepdims), dtype=np_dtype(out.dtype))


@primitive
class Sum(Reduction):
    """The sum; integers keep their dtype (and wrap around)."""
    name = surface = "sum"
    numpy = staticmethod(np.sum)
    accepts = NUMERIC
    needs = "a numeric"


@primitive
class Mean(Reduction):
    """The arithmetic mean, of floats."""
    name = surface = "mean"
    numpy = staticmethod(np.mean)
    accepts = FLOAT_DTYPES
    needs = "a float"


@primitive
class Max(Reduction):
    """The largest element (NaN if any is NaN); on bool tensors, any."""
    name = surface = "max"
    numpy = staticmethod(np.max)


@primitive
class Min(Reduction):
    """The smallest element (NaN if any is NaN); on bool tensors, all."""
    name = surface = "min"
    numpy = staticmethod(np.min)


class ArgReduction(Reduction):
    """The i32 index of an extreme along one axis, or in the flattened tensor (axis=None);
    ties pick the first."""
    result_dtype = "i32"
    differentiable = False

    def check_axis(self, axis: Axes) -> Axes:
        if isinstance(axis, tuple):
            raise OpError(f"'{self.name}' takes one axis or None, got {axis}", "axis")
        return axis


@primitive
class ArgMax(ArgReduction):
    """The index of the first largest element."""
    name = surface = "argmax"
    numpy = staticmethod(np.argmax)


@primitive
class ArgMin(ArgReduction):
    """The index of the first smallest element."""
    name = surface = "argmin"
    numpy = staticmethod(np.argmin)
