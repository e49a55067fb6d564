"""Ordering and selection along one axis: `sort`, `argsort`, `topk`, and the gather that reads
a tensor in such an order, `take_along_axis`.

One total, stable order serves all of them: NaN is larger than +inf (NumPy's and PyTorch's
ascending sorts put it last, their descending sorts and topk first), -0.0 equals 0.0, and
equal elements keep their input order in either direction, as torch.sort(stable=True) does.
The VJPs of sort, topk and take_along_axis add the cotangent into where each value came from."""
from __future__ import annotations

from typing import Any

import numpy as np

from ir.dims import Dim
from ir.ops.base import (Kind, OpError, Param, Primitive, merge_dims, normalize_axes, primitive,
                         statics)
from ir.ops.index import need_indices
from ir.types import TensorType, TupleType

_SORTS = "a sort: NumPy's stable argsort (no sort kernel yet)"


def _order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """The stable permutation that sorts x along axis (int64 indices)."""
    if not descending:
        return np.argsort(x, axis, kind="stable")
    # NumPy has no descending sort, and -x would put NaN last and overflow integers: sort the
    # reversed axis and read it backwards, which brings equal elements back to input order
    backwards = np.flip(np.argsort(np.flip(x, axis), axis, kind="stable"), axis)
    return x.shape[axis] - 1 - backwards


def _scatter_along(b: Any, ct: Any, indices: Any, shape: tuple[int, ...], axis: int) -> Any:
    """The cotangent of x: shape through take_along_axis(x, indices, axis): ct added into zeros
    at the positions it was read from (a position read twice, or broadcast, gets the sum)."""
    n = int(np.prod(shape))
    positions = b.emit("reshape", b.emit("arange", start=n, dtype="i32" if n < 2 ** 31 else "i64"),
                       shape=shape)
    read = b.emit("take_along_axis", positions, indices, axis=axis)     # x's flat position of each
    m = int(np.prod(read.shape))
    flat = b.emit("scatter_add", b.emit("zeros", shape=(n,), dtype=ct.dtype),
                  b.emit("reshape", read, shape=(m,)), b.emit("reshape", ct, shape=(m,)))
    return b.emit("reshape", flat, shape=shape)


class Ordering(Primitive):
    """Orders x along one axis, ascending or descending."""
    host = _SORTS
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.INT, -1),
              Param("descending", Kind.BOOL, False))

    def infer(self, x: TensorType, axis: int = -1, descending: bool = False) -> TensorType:
        normalize_axes(axis, x.rank, x)
        return x


@primitive
class Sort(Ordering):
    """x's elements sorted along axis (stably; NaN largest)."""
    name = surface = "sort"

    def evaluate(self, x: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
        return np.take_along_axis(x, _order(x, axis, descending), axis)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """The cotangent moved back through the permutation, found again by argsort."""
        (x,), a = op.inputs, statics(op)
        perm = b.emit("argsort", x, axis=a["axis"], descending=a["descending"])
        return (_scatter_along(b, cts[0], perm, x.shape, a["axis"]),)


@primitive
class ArgSort(Ordering):
    """The i32 indices that sort x along axis: ties keep their input order, also descending."""
    name = surface = "argsort"
    differentiable = False

    def infer(self, x: TensorType, axis: int = -1, descending: bool = False) -> TensorType:
        return super().infer(x, axis, descending).with_dtype("i32")

    def evaluate(self, x: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
        return _order(x, axis, descending).astype(np.int32)


@primitive
class TopK(Primitive):
    """The k largest elements along axis (the k smallest with largest=False), best first, and
    their i32 indices; of equal elements the lower index comes first."""
    host = _SORTS
    name = surface = "topk"
    params = (Param("x", Kind.TENSOR), Param("k", Kind.DIM), Param("axis", Kind.INT, -1),
              Param("largest", Kind.BOOL, True))

    def infer(self, x: TensorType, k: Dim, axis: int = -1, largest: bool = True) -> TupleType:
        ax = normalize_axes(axis, x.rank, x)[0]
        n = x.shape[ax]
        if k.value is not None and (k.value < 0 or n.value is not None and k.value > n.value):
            raise OpError(f"topk needs 0 <= k <= {n}, the length of axis {ax} of {x}; "
                          f"got k = {k}", "k")
        shape = x.shape[:ax] + (k,) + x.shape[ax + 1:]
        return TupleType((x.with_shape(shape), TensorType("i32", shape)))

    def evaluate(self, x: np.ndarray, k: int, axis: int = -1,
                 largest: bool = True) -> tuple[np.ndarray, np.ndarray]:
        best = np.take(_order(x, axis, largest), np.arange(k), axis)
        return np.take_along_axis(x, best, axis), best.astype(np.int32)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """The values' cotangent added into zeros at the chosen indices."""
        (x,), (ct, _) = op.inputs, cts                  # the indices have no cotangent
        return (_scatter_along(b, ct, op.outputs[1], x.shape, statics(op)["axis"]),)


@primitive
class TakeAlongAxis(Primitive):
    """x's elements at integer `indices` along axis, as NumPy's take_along_axis: indices has
    x's rank, its other axes broadcast against x's, and negative indices count from the end."""
    host = "a gather: NumPy's take_along_axis"
    name = surface = "take_along_axis"
    params = (Param("x", Kind.TENSOR), Param("indices", Kind.TENSOR), Param("axis", Kind.INT))

    def infer(self, x: TensorType, indices: TensorType, axis: int) -> TensorType:
        need_indices("take_along_axis", indices)
        if indices.rank != x.rank:
            raise OpError(f"take_along_axis needs indices of the rank of {x}, got {indices}",
                          "indices")
        ax = normalize_axes(axis, x.rank, x)[0]
        shape = []
        for i, (n, m) in enumerate(zip(x.shape, indices.shape)):
            if i == ax or n.value == 1:
                shape.append(m)
            elif m.value == 1 or n.agrees(m):
                shape.append(n if m.value == 1 else merge_dims(n, m))
            else:
                raise OpError(f"take_along_axis cannot broadcast {indices} with {x} on axis {i}",
                              "indices")
        return x.with_shape(tuple(shape))

    def evaluate(self, x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
        return np.take_along_axis(x, indices, axis)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (x, indices), (ct,) = op.inputs, cts
        return _scatter_along(b, ct, indices, x.shape, statics(op)["axis"]), None
