"""Reductions over axes: `sum mean max min argmax argmin`.

`axis` is None (all axes), an int or a tuple of ints, negative counting from the end;
`keepdims=True` keeps each reduced axis with length 1. The VJPs of `max` and `min` divide the
cotangent equally among the elements that tie for the extreme, as `torch.amax` does."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from ir import numerics
from ir.dims import Dim
from ir.ops.base import (NUMERIC, Kind, OpError, Param, Primitive, Role, need, normalize_axes,
                         np_dtype, primitive, statics, type_of)
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
    integer_identity: ClassVar[bool] = False   # 0 for a sum; max and min of no integers have none
    role = Role.REDUCTION
    combine: ClassVar[str]                     # the kernels' combining operation: add, max, min
    averages: ClassVar[bool] = False           # the combination is divided by the count (mean)
    host = "integer and bool reductions (exact in any order) are evaluated by NumPy"

    def infer(self, x: TensorType, axis: Axes = None, keepdims: bool = False) -> TensorType:
        x = need(x, self.accepts, lambda: f"'{self.name}' needs {self.needs} tensor, got {x}; "
                 "use cast()", "x")
        axes = normalize_axes(self.check_axis(axis), x.rank, x)
        if not self.has_identity(x.dtype) and any(x.shape[a].value == 0 for a in axes):
            raise OpError(f"'{self.name}' of an empty axis has no value: {x} has length 0 "
                          f"on axis {next(a for a in axes if x.shape[a].value == 0)}", "x")
        shape = tuple(Dim.const(1) if i in axes else d for i, d in enumerate(x.shape)
                      if keepdims or i not in axes)
        if self.result_dtype:
            return TensorType(self.result_dtype, shape)
        return x.with_shape(shape)

    def check_axis(self, axis: Axes) -> Axes:
        return axis

    def has_identity(self, dtype: str) -> bool:
        """Whether a reduction of nothing has a value (docs/numerics.md: the identity)."""
        return self.canonical is not None and (dtype in FLOAT_DTYPES or self.integer_identity)

    # a float reduction in the canonical order of ir/numerics.py: (combine, identity)
    canonical: ClassVar[tuple[Callable, float] | None] = None

    def evaluate(self, x: Any, axis: Axes = None, keepdims: bool = False) -> np.ndarray:
        out = self.infer(type_of(x), axis, keepdims)
        dtype = np_dtype(out.dtype)
        if self.canonical is None or x.dtype.kind != "f":        # exact: any order will do
            return np.asarray(self.numpy(x, axis=axis, keepdims=keepdims), dtype=dtype)
        axes = normalize_axes(axis, x.ndim, "x")
        result = self.finish(numerics.reduce(x, axes, *self.canonical), x, axes)
        shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else None
        return np.asarray(result if shape is None else np.reshape(result, shape), dtype=dtype)

    def finish(self, reduced: np.ndarray, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return reduced

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (x,), (ct,) = op.inputs, cts
        axes = normalize_axes(statics(op)["axis"], len(x.shape), "x")
        return (self.backward(b, _kept(b, ct, x, axes), x, _kept(b, op.outputs[0], x, axes),
                              axes),)

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        """x's cotangent, given the result y and its cotangent ct with the reduced axes kept."""
        raise NotImplementedError(f"no VJP rule for '{self.name}'")


def _kept(b: Any, v: Any, x: Any, axes: tuple[int, ...]) -> Any:
    """v, a reduction of x over axes, with the reduced axes kept as length 1."""
    shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    return v if v.shape == shape else b.emit("reshape", v, shape=shape)


def _spread(b: Any, ct: Any, x: Any) -> Any:
    return ct if ct.shape == x.shape else b.emit("broadcast_to", ct, shape=x.shape)


@primitive
class Sum(Reduction):
    """The sum; integers keep their dtype (and wrap around)."""
    name = surface = "sum"
    numpy = staticmethod(np.sum)
    canonical = (np.add, -0.0)
    accepts = NUMERIC
    needs = "a numeric"
    integer_identity = True
    combine = "add"

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        return _spread(b, ct, x)


@primitive
class Mean(Reduction):
    """The arithmetic mean, of floats."""
    name = surface = "mean"
    numpy = staticmethod(np.mean)
    canonical = (np.add, -0.0)
    combine, averages = "add", True

    def finish(self, reduced: np.ndarray, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """The canonical sum divided by the count (in the tensor's dtype)."""
        return reduced / np.asarray(np.prod([x.shape[a] for a in axes]), dtype=x.dtype)
    accepts = FLOAT_DTYPES
    needs = "a float"

    def backward(self, b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
        count = b.constant(float(np.prod([x.shape[a] for a in axes])), ct.dtype)
        return _spread(b, b.emit("div", ct, count), x)     # divide before spreading: fewer ops


def _ties_share(b: Any, ct: Any, x: Any, y: Any, axes: tuple[int, ...]) -> Any:
    """max's and min's VJP: ct divided equally among the elements of x equal to the result."""
    hit = b.emit("cast", b.emit("eq", x, y), dtype=ct.dtype)
    count = b.emit("sum", hit, axis=axes, keepdims=True)
    return b.emit("mul", b.emit("div", ct, count), hit)


@primitive
class Max(Reduction):
    """The largest element (NaN if any is NaN); on bool tensors, any."""
    name = surface = "max"
    numpy = staticmethod(np.max)
    canonical = (numerics.maximum, -np.inf)
    combine = "max"
    backward = staticmethod(_ties_share)


@primitive
class Min(Reduction):
    """The smallest element (NaN if any is NaN); on bool tensors, all."""
    name = surface = "min"
    numpy = staticmethod(np.min)
    canonical = (numerics.minimum, np.inf)
    combine = "min"
    backward = staticmethod(_ties_share)


class ArgReduction(Reduction):
    """The i32 index of an extreme along one axis, or in the flattened tensor (axis=None);
    ties pick the first."""
    result_dtype = "i32"
    differentiable = False
    role = Role.HOST
    host = "an index of an extreme is not compiled yet"

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
