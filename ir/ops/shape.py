"""Shape primitives: they move, copy or select elements without computing new values.

Also `index`, the internal primitive behind Python-style basic indexing `x[1, a:b, ..., ::2]`,
its transpose `unindex` (IR only, for reverse mode), and `SliceSpec`, the static description
of one `lo:hi:step` item. Each VJP is the natural transpose: the cotangent moved back."""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import mul
from types import EllipsisType
from typing import Any, ClassVar

import numpy as np

from ir.dims import Dim
from ir.ops.base import (Kind, OpError, Param, Primitive, Role, check_fill, check_shape,
                         common_dtype, format_shape, merge_dims, normalize_axes, np_dtype,
                         primitive, range_length, statics, type_of, unbroadcast)
from ir.mlir import Window, type_of as mlir_type
from ir.types import TensorType, TupleType, Type, UnknownType

Axes = None | int | tuple[int, ...]


def _product(dims: Any) -> Dim:
    return reduce(mul, dims, Dim.const(1))


def _replace(shape: tuple[Dim, ...], axis: int, *dims: Dim) -> tuple[Dim, ...]:
    return shape[:axis] + dims + shape[axis + 1:]


def _axis(axis: int, x: TensorType) -> int:
    return normalize_axes(axis, x.rank, x)[0]


_NOT_A_VIEW = "a view that no strides express is copied by NumPy"


class Rearrange(Primitive):
    """A primitive that only reshapes x (its result is x's bytes in row-major order): its VJP
    reshapes the cotangent back."""
    role, host = Role.VIEW, _NOT_A_VIEW

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (b.emit("reshape", cts[0], shape=op.inputs[0].shape),)

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,), out = op.inputs, op.outputs[0]
        return [w.reshape(w[x], x.shape, out.shape, x.dtype, self.name)]


@primitive
class Reshape(Rearrange):
    """x with a new shape of as many elements; one -1 in `shape` is inferred."""
    name = surface = "reshape"
    params = (Param("x", Kind.TENSOR), Param("shape", Kind.SHAPE))

    def infer(self, x: TensorType, shape: tuple[Dim, ...]) -> TensorType:
        holes = [i for i, d in enumerate(shape) if d.value == -1]
        if len(holes) > 1:
            raise OpError(f"reshape allows one -1 in its shape, got {format_shape(shape)}",
                          "shape")
        if any(d.value is not None and d.value < -1 for d in shape):
            raise OpError(f"shape {format_shape(shape)} has a negative dimension", "shape")
        total = _product(x.shape)
        if holes:
            rest = _product(d for d in shape if d.value != -1)
            if total.value is not None and rest.value is not None and (
                    rest.value == 0 or total.value % rest.value):
                raise OpError(f"cannot reshape {x} ({total} elements) to "
                              f"{format_shape(shape)}", "shape")
            shape = _replace(shape, holes[0], total // rest)
        elif not _product(shape).agrees(total):
            raise OpError(f"cannot reshape {x} ({total} elements) to {format_shape(shape)} "
                          f"({_product(shape)} elements)", "shape")
        return x.with_shape(shape)

    def evaluate(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.reshape(x, shape)


@primitive
class Transpose(Primitive):
    """x with its axes permuted: result axis i is x's axis perm[i]; by default reversed."""
    role, host = Role.VIEW, _NOT_A_VIEW
    name = surface = "transpose"
    params = (Param("x", Kind.TENSOR), Param("perm", Kind.AXES, None))

    def infer(self, x: TensorType, perm: Axes = None) -> TensorType:
        axes = (tuple(reversed(range(x.rank))) if perm is None
                else normalize_axes(perm, x.rank, x, "perm"))
        if len(axes) != x.rank:
            raise OpError(f"perm {perm} must name each of the {x.rank} axes of {x} once",
                          "perm")
        return x.with_shape(tuple(x.shape[i] for i in axes))

    def evaluate(self, x: np.ndarray, perm: Axes = None) -> np.ndarray:
        return np.transpose(x, perm)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        rank, perm = len(op.inputs[0].shape), statics(op)["perm"]
        axes = tuple(reversed(range(rank))) if perm is None else normalize_axes(perm, rank, "x")
        return (b.emit("transpose", cts[0], perm=tuple(int(i) for i in np.argsort(axes))),)

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,) = op.inputs
        perm = statics(op)["perm"]
        perm = tuple(reversed(range(len(x.shape)))) if perm is None else \
            normalize_axes(perm, len(x.shape), "x")
        return [w.transpose(w[x], x.shape, perm, x.dtype)]


@primitive
class BroadcastTo(Primitive):
    """x repeated along new leading axes and along its length-1 axes to `shape`."""
    role, host = Role.VIEW, _NOT_A_VIEW
    name = surface = "broadcast_to"
    params = (Param("x", Kind.TENSOR), Param("shape", Kind.SHAPE))

    def infer(self, x: TensorType, shape: tuple[Dim, ...]) -> TensorType:
        check_shape(shape, "shape")
        lead = len(shape) - x.rank
        if lead < 0 or not all(d.value == 1 or d.agrees(t)
                               for d, t in zip(x.shape, shape[lead:])):
            raise OpError(f"cannot broadcast {x} to {format_shape(shape)}", "shape")
        return x.with_shape(shape[:lead] + tuple(
            t if d.value == 1 else merge_dims(t, d) for d, t in zip(x.shape, shape[lead:])))

    def evaluate(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(x, shape).copy()

    def mlir(self, w: Any, op: Any) -> list[str]:
        return [w.map(op, lambda args: args[0], "broadcast")]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (unbroadcast(b, cts[0], op.inputs[0].shape),)


@primitive
class ExpandDims(Rearrange):
    """x with new length-1 axes at `axis` (an int or a tuple, positions in the result)."""
    name = surface = "expand_dims"
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.AXES))

    def infer(self, x: TensorType, axis: int | tuple[int, ...]) -> TensorType:
        if axis is None:
            raise OpError("expand_dims needs an axis", "axis")
        rank = x.rank + (1 if isinstance(axis, int) else len(axis))
        axes = normalize_axes(axis, rank, f"the result of expand_dims({x})")
        dims = iter(x.shape)
        return x.with_shape(tuple(Dim.const(1) if i in axes else next(dims)
                                  for i in range(rank)))

    def evaluate(self, x: np.ndarray, axis: int | tuple[int, ...]) -> np.ndarray:
        return np.expand_dims(x, axis)


@primitive
class Squeeze(Rearrange):
    """x without the length-1 axes named (by default every axis known to have length 1)."""
    name = surface = "squeeze"
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.AXES, None))

    def infer(self, x: TensorType, axis: Axes = None) -> Type:
        if axis is None:
            if any(d.is_unknown for d in x.shape):
                return UnknownType()
            return x.with_shape(tuple(d for d in x.shape if d.value != 1))
        axes = normalize_axes(axis, x.rank, x)
        for a in axes:
            if not (x.shape[a].value == 1 or x.shape[a].is_unknown):
                raise OpError(f"cannot squeeze axis {a} of {x}: its length is {x.shape[a]}, "
                              "not 1", "axis")
        return x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes))

    def evaluate(self, x: np.ndarray, axis: Axes = None) -> np.ndarray:
        return np.squeeze(x, axis)


def _same_rank(op: str, xs: tuple[TensorType, ...]) -> tuple[TensorType, str, bool]:
    """The first of xs, and the dtype they share; xs is nonempty and of one rank."""
    if not xs:
        raise OpError(f"{op} needs at least one tensor", "xs")
    for t in xs[1:]:
        if t.rank != xs[0].rank:
            raise OpError(f"{op} needs tensors of one rank, got {xs[0]} and {t}", "xs")
    dtype, weak = common_dtype(op, [("xs", t) for t in xs])
    return xs[0], dtype, weak


@primitive
class Concat(Primitive):
    """xs joined along an existing axis; the other axes must agree."""
    host = "copies of whole inputs: NumPy's concatenate"
    name = surface = "concat"
    params = (Param("xs", Kind.TENSORS), Param("axis", Kind.INT, 0))

    def infer(self, xs: tuple[TensorType, ...], axis: int = 0) -> TensorType:
        first, dtype, weak = _same_rank("concat", xs)
        ax = _axis(axis, first)
        shape = list(first.shape)
        for t in xs[1:]:
            for i, d in enumerate(t.shape):
                if i == ax:
                    shape[i] = shape[i] + d
                elif not shape[i].agrees(d):
                    raise OpError(f"cannot concat {first} and {t} along axis {ax}: "
                                  f"axis {i} differs", "xs")
                else:
                    shape[i] = merge_dims(shape[i], d)
        return TensorType(dtype, tuple(shape), weak)

    def evaluate(self, xs: tuple[Any, ...], axis: int = 0) -> np.ndarray:
        return np.concatenate(_arrays(self, xs, axis), axis)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """Each input inserted at its offset along the axis, into one empty tensor."""
        out = op.outputs[0]
        ax, name, at = statics(op)["axis"] % len(out.shape), w.empty(out.shape, out.dtype), 0
        for x in op.inputs:
            window = Window.along(out.shape, ax, at, x.shape[ax])
            name = w.insert(w[x], x.shape, name, out.shape, out.dtype, window, "concat")
            at += x.shape[ax]
        return [name]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        axis = statics(op)["axis"]
        sizes = tuple(x.shape[axis] for x in op.inputs)
        return tuple(b.emit("split", cts[0], sections=sizes, axis=axis))


@primitive
class Stack(Primitive):
    """xs, all of one shape, stacked along a new axis."""
    host = "copies of whole inputs: NumPy's stack"
    name = surface = "stack"
    params = (Param("xs", Kind.TENSORS), Param("axis", Kind.INT, 0))

    def infer(self, xs: tuple[TensorType, ...], axis: int = 0) -> TensorType:
        first, dtype, weak = _same_rank("stack", xs)
        shape = first.shape
        for t in xs[1:]:
            if not all(a.agrees(b) for a, b in zip(shape, t.shape)):
                raise OpError(f"stack needs tensors of one shape, got {first} and {t}", "xs")
            shape = tuple(map(merge_dims, shape, t.shape))
        ax = normalize_axes(axis, first.rank + 1, f"the result of stacking {first}")[0]
        return TensorType(dtype, shape[:ax] + (Dim.const(len(xs)),) + shape[ax:], weak)

    def evaluate(self, xs: tuple[Any, ...], axis: int = 0) -> np.ndarray:
        return np.stack(_arrays(self, xs, axis), axis)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """Each input inserted as slice k along the new axis, into one empty tensor."""
        out = op.outputs[0]
        ax, name = statics(op)["axis"] % len(out.shape), w.empty(out.shape, out.dtype)
        for k, x in enumerate(op.inputs):
            window = Window.along(out.shape, ax, k, 1)
            name = w.insert(w[x], x.shape, name, out.shape, out.dtype, window, "stack")
        return [name]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        (ct,) = cts
        axis = statics(op)["axis"] % len(ct.shape)
        return tuple(b.emit("index", ct, items=(SliceSpec(),) * axis + (i,))
                     for i in range(len(op.inputs)))


def _arrays(op: Primitive, xs: tuple[Any, ...], axis: int) -> list[np.ndarray]:
    """xs as arrays of the dtype `op`'s rule gives them (weak literals converted)."""
    dtype = np_dtype(op.infer(tuple(map(type_of, xs)), axis).dtype)
    return [np.asarray(x, dtype=dtype) for x in xs]


@primitive
class Split(Primitive):
    """x cut along an axis into `sections` equal parts (an int) or parts of the listed sizes."""
    host = "views of its input, by NumPy"
    name, surface = "split", "split"
    params = (Param("x", Kind.TENSOR), Param("sections", Kind.STATIC), Param("axis", Kind.INT, 0))

    def infer(self, x: TensorType, sections: Any, axis: int = 0) -> Type:
        ax = _axis(axis, x)
        n = x.shape[ax]
        if isinstance(sections, (tuple, list)):
            sizes = tuple(map(Dim.of, sections))
            check_shape(sizes, "sections")
            if not sizes or not _sum(sizes).agrees(n):
                raise OpError(f"split sizes {format_shape(sizes)} add up to {_sum(sizes)}, "
                              f"but axis {ax} of {x} has length {n}", "sections")
        else:
            count = Dim.of(sections).value
            if count is None:
                return UnknownType()
            if count < 1 or (n.value is not None and n.value % count):
                raise OpError(f"cannot split axis {ax} of {x} into {count} equal parts",
                              "sections")
            sizes = (n // count,) * count
        return TupleType(tuple(x.with_shape(_replace(x.shape, ax, s)) for s in sizes))

    def evaluate(self, x: np.ndarray, sections: int | tuple[int, ...],
                 axis: int = 0) -> tuple[np.ndarray, ...]:
        cuts = sections if isinstance(sections, int) else np.cumsum(sections)[:-1]
        return tuple(np.split(x, cuts, axis))

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,), names, at = op.inputs, [], 0
        ax = statics(op)["axis"] % len(x.shape)
        for y in op.outputs:
            window = Window.along(x.shape, ax, at, y.shape[ax])
            names.append(w.extract(w[x], x.shape, x.dtype, window, y.shape, "part"))
            at += y.shape[ax]
        return names

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        parts = [b.emit("zeros", shape=y.shape, dtype=y.dtype) if ct is None else ct
                 for ct, y in zip(cts, op.outputs)]
        return (b.emit("concat", *parts, axis=statics(op)["axis"]),)


def _sum(dims: tuple[Dim, ...]) -> Dim:
    return sum(dims, Dim.const(0))


# ---------------------------------------------------------------- slicing and indexing

@dataclass(frozen=True)
class SliceSpec:
    """One `lo:hi:step` item of an index; None marks a part left out."""
    lo: int | Dim | None = None
    hi: int | Dim | None = None
    step: int | None = None

    def __str__(self) -> str:
        text = f"{'' if self.lo is None else self.lo}:{'' if self.hi is None else self.hi}"
        return text if self.step is None else f"{text}:{self.step}"


IndexItem = int | Dim | SliceSpec | EllipsisType


def slice_length(n: Dim, s: SliceSpec, arg: str) -> Dim:
    """The length of a dimension n sliced by s, by Python's rules; symbolic bounds are taken
    to lie within the dimension (no clamping)."""
    step = 1 if s.step is None else s.step
    if isinstance(step, Dim):              # a step from a dimension: known only when specialised
        if step.value is None:
            raise OpError(f"a slice step must be a known integer, not the size {step}", arg)
        step = step.value
    if step == 0:
        raise OpError("a slice step cannot be zero", arg)
    bounds = [None if b is None else Dim.of(b).value for b in (s.lo, s.hi)]
    if n.value is not None and all(v is not None or b is None
                                   for v, b in zip(bounds, (s.lo, s.hi))):
        return Dim.const(len(range(*slice(*bounds, step).indices(n.value))))
    lo = _bound(n, s.lo, Dim.const(0) if step > 0 else n - 1)
    hi = _bound(n, s.hi, n if step > 0 else Dim.const(-1))
    return range_length(lo, hi, step)


def _bound(n: Dim, b: int | Dim | None, default: Dim) -> Dim:
    if b is None:
        return default
    b = Dim.of(b)
    return n + b if b.value is not None and b.value < 0 else b


@primitive
class Index(Primitive):
    """x[items]: basic indexing. Each item is an int (selects, dropping the axis; negative
    from the end), a SliceSpec, or one Ellipsis standing for the axes not named."""
    role, host = Role.VIEW, _NOT_A_VIEW
    name = "index"
    params = (Param("x", Kind.TENSOR), Param("items", Kind.STATIC))

    def infer(self, x: TensorType, items: tuple[IndexItem, ...]) -> TensorType:
        named = [it for it in items if it is not Ellipsis]
        if len(items) - len(named) > 1:
            raise OpError("an index can hold only one '...'", "items")
        if len(named) > x.rank:
            raise OpError(f"too many indices for {x}: {len(named)} given", "items")
        shape = []
        for axis, (item, n) in enumerate(zip(_full(items, x.rank), x.shape)):
            if isinstance(item, SliceSpec):
                shape.append(slice_length(n, item, "items"))
                continue
            i, size = Dim.of(item).value, n.value
            if i is not None and size is not None and not -size <= i < size:
                raise OpError(f"index {i} is out of range for axis {axis} of {x}", "items")
        return x.with_shape(tuple(shape))

    def evaluate(self, x: np.ndarray, items: tuple[IndexItem, ...]) -> np.ndarray:
        return np.asarray(x[_numpy_index(items)])

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,), out = op.inputs, op.outputs[0]
        window, flipped = _window(x.shape, op.attrs["items"])
        return [w.extract(w.reverse(w[x], x.shape, x.dtype, flipped), x.shape, x.dtype, window,
                          out.shape, "item")]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (b.emit("unindex", cts[0], items=op.attrs["items"], shape=op.inputs[0].shape),)


def _numpy_index(items: tuple[IndexItem, ...]) -> tuple[Any, ...]:
    return tuple(slice(it.lo, it.hi, it.step) if isinstance(it, SliceSpec) else it
                 for it in items)


def _window(shape: tuple[int, ...],
            items: tuple[IndexItem, ...]) -> tuple[Window, tuple[int, ...]]:
    """The window that x[items] reads (an int item: one element, its axis dropped) of x, a
    tensor of `shape`, reversed along the axes returned: those of a negative step, whose
    elements the window then reads forwards (MLIR's strides are positive)."""
    offsets, sizes, strides, flipped = [], [], [], []
    for axis, (item, n) in enumerate(zip(_full(items, len(shape)), shape)):
        if isinstance(item, SliceSpec):
            bounds = [None if b is None else Dim.of(b).value for b in (item.lo, item.hi, item.step)]
            start, stop, step = slice(*bounds).indices(n)
            size = len(range(start, stop, step))
            if step < 0:                           # element i of x is n - 1 - i of reversed x
                flipped.append(axis)
                start, step = n - 1 - start, -step
            offsets.append(start), sizes.append(size), strides.append(step)
        else:
            offsets.append(Dim.of(item).value % n), sizes.append(1), strides.append(1)
    return Window(tuple(offsets), tuple(sizes), tuple(strides)), tuple(flipped)


def _full(items: tuple[IndexItem, ...], rank: int) -> list[IndexItem]:
    """items with the Ellipsis expanded, and full slices for the trailing axes."""
    named = [it for it in items if it is not Ellipsis]
    fill = [SliceSpec()] * (rank - len(named))
    if Ellipsis not in items:
        return named + fill
    at = items.index(Ellipsis)
    return list(items[:at]) + fill + list(items[at + 1:])


INDEX = Index()


@primitive
class Unindex(Primitive):
    """Zeros of `shape` holding x at the positions that index(·, items) selects: the
    transpose of `index` (IR only). Basic indexing selects each position at most once."""
    role, host = Role.WINDOW, _NOT_A_VIEW
    name = "unindex"
    params = (Param("x", Kind.TENSOR), Param("items", Kind.STATIC), Param("shape", Kind.SHAPE))

    def infer(self, x: TensorType, items: tuple[IndexItem, ...],
              shape: tuple[Dim, ...]) -> TensorType:
        check_shape(shape, "shape")
        want = INDEX.infer(x.with_shape(shape), items).shape
        if len(want) != x.rank or not all(map(Dim.agrees, want, x.shape)):
            raise OpError(f"unindex into {format_shape(shape)} needs x of shape "
                          f"{format_shape(want)}, got {x}", "x")
        return x.with_shape(shape)

    def evaluate(self, x: Any, items: tuple[IndexItem, ...],
                 shape: tuple[int, ...]) -> np.ndarray:
        x = np.asarray(x)
        out = np.zeros(shape, dtype=x.dtype)
        out[_numpy_index(items)] = x
        return out

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,), out = op.inputs, op.outputs[0]
        zeros = w.filled(0, out.shape, out.dtype, "zeros")
        window, flipped = _window(out.shape, op.attrs["items"])
        inserted = w.insert(w[x], x.shape, zeros, out.shape, out.dtype, window, "unindex")
        return [w.reverse(inserted, out.shape, out.dtype, flipped)]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (b.emit("index", cts[0], items=op.attrs["items"]),)


def _along(axis: int, s: SliceSpec) -> tuple[SliceSpec, ...]:
    return (SliceSpec(),) * axis + (s,)


@primitive
class Slice(Primitive):
    """x[start:stop:step] along one axis, by Python's rules (stop None: to the end)."""
    role, host = Role.VIEW, _NOT_A_VIEW
    name = surface = "slice"
    params = (Param("x", Kind.TENSOR), Param("start", Kind.DIM), Param("stop", Kind.DIM, None),
              Param("axis", Kind.INT, 0), Param("step", Kind.INT, 1))

    def infer(self, x: TensorType, start: Dim, stop: Dim | None = None, axis: int = 0,
              step: int = 1) -> TensorType:
        if step == 0:
            raise OpError("a slice step cannot be zero", "step")
        return INDEX.infer(x, _along(_axis(axis, x), SliceSpec(start, stop, step)))

    def evaluate(self, x: np.ndarray, start: int, stop: int | None = None, axis: int = 0,
                 step: int = 1) -> np.ndarray:
        return INDEX.evaluate(x, _along(axis % x.ndim, SliceSpec(start, stop, step)))

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,), out, a = op.inputs, op.outputs[0], statics(op)
        window, flipped = _window(x.shape, _along(a["axis"] % len(x.shape),
                                                  SliceSpec(a["start"], a["stop"], a["step"])))
        return [w.extract(w.reverse(w[x], x.shape, x.dtype, flipped), x.shape, x.dtype, window,
                          out.shape, "slice")]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        a, x = statics(op), op.inputs[0]
        items = _along(a["axis"] % len(x.shape), SliceSpec(a["start"], a["stop"], a["step"]))
        return (b.emit("unindex", cts[0], items=items, shape=x.shape),)


@primitive
class Pad(Primitive):
    """x surrounded by `value`: widths lists (before, after) for each axis in turn, flat.
    Padding with +0 is a view of x with a window (backend/views.py)."""
    role, host = Role.WINDOW, "padding with a value other than +0 is a copy by NumPy"
    name = surface = "pad"
    params = (Param("x", Kind.TENSOR), Param("widths", Kind.SHAPE),
              Param("value", Kind.NUMBER, 0))

    def infer(self, x: TensorType, widths: tuple[Dim, ...], value: int | float = 0) -> TensorType:
        if len(widths) != 2 * x.rank:
            raise OpError(f"pad needs a (before, after) pair of widths for each axis of {x}: "
                          f"{2 * x.rank} numbers, got {len(widths)}", "widths")
        if any(w.value is not None and w.value < 0 for w in widths):
            raise OpError(f"pad widths cannot be negative: {format_shape(widths)}", "widths")
        check_fill(value, x.dtype, "value")
        return x.with_shape(tuple(d + lo + hi for d, lo, hi in
                                  zip(x.shape, widths[::2], widths[1::2])))

    def evaluate(self, x: np.ndarray, widths: tuple[int, ...],
                 value: int | float = 0) -> np.ndarray:
        if not widths:                          # a 0-d x, which NumPy's pad refuses
            return np.array(x)
        return np.pad(x, list(zip(widths[::2], widths[1::2])), constant_values=value)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """tensor.pad, its region yielding the value."""
        from ir.mlir import ELEMENT
        (x,), out, a = op.inputs, op.outputs[0], statics(op)
        widths = a["widths"]
        name = w.fresh("padded")
        w.line(f"{name} = tensor.pad {w[x]} low[{', '.join(map(str, widths[::2]))}] "
               f"high[{', '.join(map(str, widths[1::2]))}] {{", located=False)
        w.line("^bb0(" + ", ".join(f"{w.fresh('i')}: index" for _ in x.shape) + "):", located=False)
        value = w.region(lambda: w.body.const(a["value"], x.dtype))
        w.line(f"  tensor.yield {value.name} : {ELEMENT[x.dtype]}", located=False)
        w.line(f"}} : {mlir_type(x)} to {mlir_type(out)}")
        return [name]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        x, widths = op.inputs[0], statics(op)["widths"]
        items = tuple(SliceSpec(lo, lo + n) for n, lo in zip(x.shape, widths[::2]))
        return (b.emit("index", cts[0], items=items),)


@primitive
class Flip(Primitive):
    """x with the order of elements reversed along the axes (by default all)."""
    host = "a view of negative strides, by NumPy"
    name = surface = "flip"
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.AXES, None))

    def infer(self, x: TensorType, axis: Axes = None) -> TensorType:
        normalize_axes(axis, x.rank, x)
        return x

    def evaluate(self, x: np.ndarray, axis: Axes = None) -> np.ndarray:
        return np.flip(x, axis)

    def mlir(self, w: Any, op: Any) -> list[str]:
        (x,) = op.inputs
        axes = normalize_axes(statics(op)["axis"], len(x.shape), x)
        return [w.reverse(w[x], x.shape, x.dtype, axes)]

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (b.emit("flip", cts[0], axis=statics(op)["axis"]),)


class Triangle(Primitive):
    """x with the elements on one side of diagonal k of its last two axes set to zero."""
    host = "made by NumPy (a mask is made once)"
    params = (Param("x", Kind.TENSOR), Param("k", Kind.INT, 0))
    keeps: ClassVar[str]                       # how a kept column j compares to i + k: <= or >=

    def infer(self, x: TensorType, k: int = 0) -> TensorType:
        if x.rank < 2:
            raise OpError(f"{self.name} needs a tensor of rank 2 or more, got {x}", "x")
        return x

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (b.emit(self.name, cts[0], k=statics(op)["k"]),)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """x, or 0 where column j and row i are on the other side of j = i + k: a linalg.generic."""
        b, rank, k = w.body, len(op.inputs[0].shape), statics(op)["k"]

        def element(args: list) -> Any:
            i, j = b.position(rank - 2), b.position(rank - 1)
            kept = b.compare(self.keeps, j, b.add(i, w.index_here(k)), "index")
            return b.select(kept, args[0], b.const(0, op.outputs[0].dtype))
        return [w.map(op, element)]


@primitive
class Tril(Triangle):
    """Keeps the elements on and below diagonal k (j <= i + k)."""
    name = surface = "tril"
    keeps = "<="

    def evaluate(self, x: np.ndarray, k: int = 0) -> np.ndarray:
        return np.tril(x, k)


@primitive
class Triu(Triangle):
    """Keeps the elements on and above diagonal k (j >= i + k)."""
    name = surface = "triu"
    keeps = ">="

    def evaluate(self, x: np.ndarray, k: int = 0) -> np.ndarray:
        return np.triu(x, k)
