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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """A linalg.generic over the result that reads each index and extracts x there."""
        from ir.mlir import type_of
        (x, indices), out, a = op.inputs, op.outputs[0], statics(op)
        ax, rank = a["axis"] % len(x.shape), len(indices.shape)
        by_index = ", ".join(f"d{ax + i}" for i in range(rank))

        def body(args: list) -> list:
            e = w.body
            j = e.from_end(args[0], x.shape[ax]) if a["from_end"] else e.index_of(args[0])
            at = [e.position(i) for i in range(ax)] + [j] + \
                 [e.position(ax + rank + i) for i in range(len(x.shape) - ax - 1)]
            return [e.extract(w[x], type_of(x), x.dtype, at)]
        return w.generic(out.shape, [out.dtype], [(w[indices], type_of(indices), by_index)], body,
                         hint="take")

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

    def mlir(self, w: Any, op: Any) -> list[str]:
        from ir.mlir import type_of
        (indices,), out = op.inputs, op.outputs[0]
        rank = len(indices.shape)

        def body(args: list) -> list:
            e = w.body
            hit = e.compare("==", e.index_of(args[0]), e.position(rank), "index")
            return [e.cast(hit, "bool", out.dtype)]
        by_index = ", ".join(f"d{i}" for i in range(rank))
        return w.generic(out.shape, [out.dtype], [(w[indices], type_of(indices), by_index)], body,
                         hint="one_hot")


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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """An scf.for over the indices in order (as NumPy's add.at, so the sums' bits agree):
        x and updates seen as [P, N, Q] and [P, n, Q], step k adds slice k of updates into
        slice indices[k] of the running tensor."""
        from ir.mlir import S, Window, tensor_type
        (x, indices, updates), out = op.inputs, op.outputs[0]
        ax, dtype = statics(op)["axis"] % len(x.shape), x.dtype
        P, N, Q = int(np.prod(x.shape[:ax])), x.shape[ax], int(np.prod(x.shape[ax + 1:]))
        n = int(np.prod(indices.shape))
        x3 = w.reshape(w[x], x.shape, (P, N, Q), dtype)
        u3 = w.reshape(w[updates], updates.shape, (P, n, Q), dtype)
        flat = w.reshape(w[indices], indices.shape, (n,), indices.dtype)

        def step(k: str, acc: list[str]) -> list[str]:
            e = w.body
            i = e.extract(flat, tensor_type((n,), indices.dtype), indices.dtype, [S(k, "index")])
            j = e.from_end(i, N).name
            row = w.extract(u3, (P, n, Q), dtype, Window((0, k, 0), (P, 1, Q), (1, 1, 1)), (P, Q), "row")
            at = Window((0, j, 0), (P, 1, Q), (1, 1, 1))
            cur = w.extract(acc[0], (P, N, Q), dtype, at, (P, Q), "cur")
            t = tensor_type((P, Q), dtype)
            added = w.generic((P, Q), [dtype], [(cur, t, "d0, d1"), (row, t, "d0, d1")],
                              lambda s: [e.add(s[0], s[1])], hint="added")[0]
            return [w.insert(added, (P, Q), acc[0], (P, N, Q), dtype, at)]
        (result,) = w.loop(n, [(x3, tensor_type((P, N, Q), dtype))], step, "scatter")
        return [w.reshape(result, (P, N, Q), out.shape, dtype)]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (_, indices, _), (ct,) = op.inputs, cts
        return ct, None, b.emit("take", ct, indices, axis=statics(op)["axis"])
