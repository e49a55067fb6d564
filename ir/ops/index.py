"""Indexing by integer tensors: `take` (a gather, also written `E[idx]`), its transpose
`scatter_add`, and `one_hot`.

Indices count from 0; take, like NumPy, also counts negative ones from the end unless
`from_end=False` (a label or a token id is never negative), and every one raises on an index
out of range (one_hot gives a zero row for those)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ir.dims import Dim
from ir.ops.base import (NUMERIC, Kind, OpError, Param, Primitive, check_shape, common_dtype,
                         format_shape, normalize_axes, np_dtype, primitive, statics, type_of)
from ir.types import TensorType


def need_indices(op: str, indices: TensorType) -> None:
    if not indices.is_int:
        raise OpError(f"{op} needs integer indices, got {indices}; use cast(i, i32)", "indices")


def _gathered(x: TensorType, indices: TensorType, axis: int) -> tuple[Dim, ...]:
    """The shape of take(x, indices, axis)."""
    ax = normalize_axes(axis, x.rank, x)[0]
    return x.shape[:ax] + indices.shape + x.shape[ax + 1:]


@primitive
class Take(Primitive):
    """The slices of x at `indices` along axis: x.shape[:axis] + indices.shape +
    x.shape[axis + 1:]."""
    host = "a gather: NumPy's take (a gather kernel on the GPU)"
    name = surface = "take"
    params = (Param("x", Kind.TENSOR), Param("indices", Kind.TENSOR), Param("axis", Kind.INT, 0),
              Param("from_end", Kind.BOOL, True))

    def infer(self, x: TensorType, indices: TensorType, axis: int = 0,
              from_end: bool = True) -> TensorType:
        need_indices("take", indices)
        return x.with_shape(_gathered(x, indices, axis))

    def evaluate(self, x: np.ndarray, indices: Any, axis: int = 0,
                 from_end: bool = True) -> np.ndarray:
        if not from_end and (negative := np.asarray(indices) < 0).any():   # NumPy's words
            raise IndexError(f"index {np.asarray(indices)[negative].flat[0]} is out of bounds for "
                             f"axis {axis % x.ndim} with size {x.shape[axis]}")
        return np.take(x, indices, axis)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """The cotangent added into zeros at the indices; repeated indices accumulate."""
        (x, indices), (ct,) = op.inputs, cts
        zeros = b.emit("zeros", shape=x.shape, dtype=ct.dtype)
        return b.emit("scatter_add", zeros, indices, ct, axis=statics(op)["axis"]), None


@primitive
class OneHot(Primitive):
    """indices.shape + [n]: 1 at each index's position, 0 elsewhere."""
    host = "for_backends rewrites it as a comparison, which fuses"
    name = surface = "one_hot"
    params = (Param("indices", Kind.TENSOR), Param("n", Kind.DIM),
              Param("dtype", Kind.DTYPE, "f32"))
    differentiable = False

    def infer(self, indices: TensorType, n: Dim, dtype: str = "f32") -> TensorType:
        need_indices("one_hot", indices)
        check_shape((n,), "n")
        return TensorType(dtype, indices.shape + (n,))

    def evaluate(self, indices: Any, n: int, dtype: str = "f32") -> np.ndarray:
        return (np.asarray(indices)[..., None] == np.arange(n)).astype(np_dtype(dtype))


@primitive
class ScatterAdd(Primitive):
    """A copy of x with each slice of `updates` added at its index along axis; repeated
    indices accumulate. The transpose of take: updates has take(x, indices, axis)'s shape."""
    host = "compiled by backend/scatter.py for floats; NumPy's add.at otherwise"
    name = surface = "scatter_add"
    params = (Param("x", Kind.TENSOR), Param("indices", Kind.TENSOR), Param("updates", Kind.TENSOR),
              Param("axis", Kind.INT, 0))

    def infer(self, x: TensorType, indices: TensorType, updates: TensorType,
              axis: int = 0) -> TensorType:
        need_indices("scatter_add", indices)
        dtype, weak = common_dtype("scatter_add", [("x", x), ("updates", updates)])
        if dtype not in NUMERIC:
            raise OpError(f"scatter_add needs numeric tensors, got {x}; use cast()", "x")
        want = _gathered(x, indices, axis)
        if updates.rank != len(want) or not all(map(Dim.agrees, updates.shape, want)):
            raise OpError(f"scatter_add needs updates of shape {format_shape(want)} "
                          f"(x.shape[:axis] + indices.shape + x.shape[axis + 1:]), got {updates}",
                          "updates")
        return TensorType(dtype, x.shape, weak)

    def evaluate(self, x: Any, indices: Any, updates: Any, axis: int = 0) -> np.ndarray:
        t = self.infer(type_of(x), type_of(indices), type_of(updates), axis)
        out = np.array(x, dtype=np_dtype(t.dtype))
        np.add.at(out, (slice(None),) * (axis % out.ndim) + (np.asarray(indices),), updates)
        return out

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (_, indices, _), (ct,) = op.inputs, cts
        return ct, None, b.emit("take", ct, indices, axis=statics(op)["axis"])
