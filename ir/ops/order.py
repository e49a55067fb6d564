"""Ordering and selection along one axis: `sort`, `argsort`, `topk`, and the gather that reads
a tensor in such an order, `take_along_axis`.

One total, stable order serves all of them: NaN is larger than +inf (NumPy's and PyTorch's
ascending sorts put it last, their descending sorts and topk first), -0.0 equals 0.0, and
equal elements keep their input order in either direction, as torch.sort(stable=True) does.
The VJPs of sort, topk and take_along_axis add the cotangent into where each value came from.

In MLIR each is a few linalg.generic ops: an element's place in the order is the number of
elements before it (a count over the axis), the permutation is the index whose place each
position holds, and the values are read at the permutation (docs/mlir.md says why)."""
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


def _precedes_or_ties(e: Any, a: Any, b: Any, dtype: str) -> Any:
    """a <= b in the sorts' order (NaN after everything, -0.0 equal to 0.0), as an i1."""
    if not a.is_float:
        return e.compare("<=", a, b, dtype)
    return e.or_(e.isnan(b), e.compare("<=", a, b, dtype))


def _places(w: Any, x: Any, axis: int, descending: bool) -> str:
    """Each element's place in the stable order along axis (i32, of x's shape): the number of
    elements j that come before it, those less than x[i] and those equal with j < i."""
    from ir.mlir import type_of
    rank, n, e = len(x.shape), x.shape[axis], w.body
    others = ", ".join(f"d{rank}" if d == axis else f"d{d}" for d in range(rank))
    mine = ", ".join(f"d{d}" for d in range(rank))
    zero = w.filled(0, x.shape, "i32", "zero")

    def count(args: list) -> list:
        xi, xj, acc = args
        first, second = (xi, xj) if descending else (xj, xi)
        after = e.compare("<", e.position(rank), e.position(axis), "index")    # j < i
        tied_or_before = _precedes_or_ties(e, first, second, x.dtype)
        strictly_before = e.xor(_precedes_or_ties(e, second, first, x.dtype), e.const(True, "bool"))
        before = e.select(after, tied_or_before, strictly_before)
        return [e.add(acc, e.cast(before, "bool", "i32"))]
    return w.generic(tuple(x.shape) + (n,), ["i32"],
                     [(w[x], type_of(x), mine), (w[x], type_of(x), others)], count,
                     reduced=[rank], inits=[zero], hint="place")[0]


def _permutation(w: Any, x: Any, axis: int, descending: bool, k: int) -> str:
    """The first k of the i32 indices that sort x along axis: for each place r < k, the index
    whose place is r (exactly one is, so the reduction's order does not matter)."""
    from ir.mlir import tensor_type
    rank, n, e = len(x.shape), x.shape[axis], w.body
    places = _places(w, x, axis, descending)
    shape = tuple(k if d == axis else m for d, m in enumerate(x.shape))
    by_index = ", ".join(f"d{rank}" if d == axis else f"d{d}" for d in range(rank))
    zero = w.filled(0, shape, "i32", "zero")

    def pick(args: list) -> list:
        place, acc = args
        here = e.compare("==", place, e.from_index(e.position(axis), "i32"), "i32")
        return [e.select(here, e.from_index(e.position(rank), "i32"), acc)]
    return w.generic(shape + (n,), ["i32"], [(places, tensor_type(x.shape, "i32"), by_index)], pick,
                     reduced=[rank], inits=[zero], hint="order")[0]


def _gather_along(w: Any, x: Any, indices: str, indices_shape: tuple[int, ...], indices_dtype: str,
                  axis: int, shape: tuple[int, ...], hint: str) -> str:
    """take_along_axis(x, indices, axis) of the result's shape: a linalg.generic over the result
    that reads each index (broadcast as NumPy does, a negative one from the end) and extracts
    x there (at 0 along x's axes of length 1)."""
    from ir.mlir import broadcast_map, tensor_type, type_of
    e = w.body

    def body(args: list) -> list:
        j = e.from_end(args[0], x.shape[axis])
        at = [j if d == axis else w.index_here(0) if n == 1 else e.position(d)
              for d, n in enumerate(x.shape)]
        return [e.extract(w[x], type_of(x), x.dtype, at)]
    return w.generic(shape, [x.dtype], [(indices, tensor_type(indices_shape, indices_dtype),
                                         broadcast_map(indices_shape, shape))], body, hint=hint)[0]


class Ordering(Primitive):
    """Orders x along one axis, ascending or descending."""
    host = _SORTS
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.INT, -1),
              Param("descending", Kind.BOOL, False))

    def infer(self, x: TensorType, axis: int = -1, descending: bool = False) -> TensorType:
        normalize_axes(axis, x.rank, x)
        return x

    def permutation(self, w: Any, op: Any) -> tuple[str, int]:
        """The MLIR of the indices that sort op's x, and the axis."""
        (x,), a = op.inputs, statics(op)
        ax = a["axis"] % len(x.shape)
        return _permutation(w, x, ax, a["descending"], x.shape[ax]), ax


@primitive
class Sort(Ordering):
    """x's elements sorted along axis (stably; NaN largest)."""
    name = surface = "sort"

    def evaluate(self, x: np.ndarray, axis: int = -1, descending: bool = False) -> np.ndarray:
        return np.take_along_axis(x, _order(x, axis, descending), axis)

    def mlir(self, w: Any, op: Any) -> list[str]:
        x = op.inputs[0]
        perm, ax = self.permutation(w, op)
        return [_gather_along(w, x, perm, x.shape, "i32", ax, x.shape, "sort")]

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

    def mlir(self, w: Any, op: Any) -> list[str]:
        return [self.permutation(w, op)[0]]


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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """The first k places of the order (descending for the largest), and x read there."""
        (x,), (values, _), a = op.inputs, op.outputs, statics(op)
        ax = a["axis"] % len(x.shape)
        best = _permutation(w, x, ax, a["largest"], a["k"])
        return [_gather_along(w, x, best, values.shape, "i32", ax, values.shape, "topk"), best]

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

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x, indices), out = op.inputs, op.outputs[0]
        return [_gather_along(w, x, w[indices], indices.shape, indices.dtype,
                              statics(op)["axis"] % len(x.shape), out.shape, "take_along_axis")]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (x, indices), (ct,) = op.inputs, cts
        return _scatter_along(b, ct, indices, x.shape, statics(op)["axis"]), None
