"""Views: values that are another value's elements read in place, at an affine offset.

A transpose, reshape, expand_dims, squeeze, broadcast_to, basic index or slice computes no
new element: element i of its result is element `offset + Σ i[d] · strides[d]` of a buffer
that already exists. The scheduler reads such values through their View — a kernel loads
from the buffer with the view's strides, a contraction or host step gets a strided NumPy
view — so they cost no copy. A reshape of a view whose axes cannot be regrouped without
copying (as in NumPy) is not a view.

An `unindex` whose items are ints and step-1 slices (the gradient of `x[:, 1:3]`), and a `pad`
with zeros, are views with a window: x's elements where index(·, items) reads, 0 elsewhere, so a map kernel reads x
in place and the zeros are never made. Its transpose or broadcast keeps the window; other
views of it are not views."""
from __future__ import annotations

import math
from dataclasses import dataclass

from backend.llvm import row_major
from ir.core import Op, Value
from ir.dims import Dim
from ir.ops.base import normalize_axes
from ir.ops.shape import (BroadcastTo, ExpandDims, Index, Pad, Reshape, SliceSpec, Slice, Squeeze,
                          Transpose, Unindex, _along, _full)

@dataclass(frozen=True)
class View:
    """Element i of the value is element `offset + Σ i[d] · strides[d]` of `base`'s
    contiguous buffer, or 0 where some lo <= i[d] < hi of `window` (one per axis) fails."""
    base: Value
    offset: int
    strides: tuple[int, ...]
    window: tuple[tuple[int, int], ...] | None = None


def identity(v: Value) -> View:
    return View(v, 0, row_major(v.shape))


def view_of(op: Op, source: View) -> View | None:
    """The view that op's result is of source's base, or None where it is not one."""
    x, out = op.inputs[0], op.outputs[0]
    rule = RULES.get(type(op.primitive))
    if rule is None or 0 in x.shape or 0 in out.shape:
        return None
    if source.window is not None and type(op.primitive) not in KEEP_WINDOWS:
        return None
    return rule(source, x.shape, out.shape, op.attrs)


def _transpose(source: View, shape: tuple[int, ...], out: tuple[int, ...], a: dict) -> View:
    perm = normalize_axes(a.get("perm"), len(shape), "x") if a.get("perm") is not None \
        else tuple(reversed(range(len(shape))))
    window = None if source.window is None else tuple(source.window[p] for p in perm)
    return View(source.base, source.offset, tuple(source.strides[p] for p in perm), window)


def _rearrange(source: View, shape: tuple[int, ...], out: tuple[int, ...], a: dict) -> View | None:
    strides = _regroup(shape, source.strides, out)
    return None if strides is None else View(source.base, source.offset, strides)


def _broadcast(source: View, shape: tuple[int, ...], out: tuple[int, ...], a: dict) -> View:
    lead = len(out) - len(shape)
    strides = (0,) * lead + tuple(s if n == m else 0 for n, m, s in zip(shape, out[lead:], source.strides))
    window = None
    if source.window is not None:   # never empty: a broadcast length-1 axis is whole
        window = tuple((0, m) for m in out[:lead]) + tuple(
            w if n == m else (0, m) for n, m, w in zip(shape, out[lead:], source.window))
    return View(source.base, source.offset, strides, window)


def _slice(source: View, shape: tuple[int, ...], out: tuple[int, ...], a: dict) -> View | None:
    axis = a.get("axis", 0) % len(shape)
    return _index(source, shape, _along(axis, SliceSpec(a["start"], a.get("stop"), a.get("step", 1))))


def _int(d: int | Dim | None) -> int | None:
    return None if d is None else Dim.of(d).value


def _indices(item: SliceSpec, n: int) -> tuple[int, int, int] | None:
    """The slice's start, stop and step on an axis of n, or None where a bound is symbolic."""
    bounds = [_int(item.lo), _int(item.hi)]
    if any(v is None and b is not None for v, b in zip(bounds, (item.lo, item.hi))):
        return None
    return slice(*bounds, item.step).indices(n)


def _index(source: View, shape: tuple[int, ...], items) -> View | None:
    offset, strides = source.offset, []
    for item, n, s in zip(_full(items, len(shape)), shape, source.strides):
        if isinstance(item, SliceSpec):
            indices = _indices(item, n)
            if indices is None:
                return None
            start, _, step = indices
            offset += start * s
            strides.append(s * step)
        else:
            i = _int(item)
            if i is None:
                return None
            offset += (i % n) * s
    return View(source.base, offset, tuple(strides))


def _unindex(source: View, shape: tuple[int, ...], items) -> View | None:
    """unindex(x, items, shape) as a window around x: an int item is an axis of stride 0 and a
    window one long, a step-1 slice is x's next axis, shifted to start at the slice's start."""
    offset, strides, window = source.offset, [], []
    axes = iter(source.strides)
    for item, n in zip(_full(items, len(shape)), shape):
        if isinstance(item, SliceSpec):
            indices = _indices(item, n)
            if indices is None or indices[2] != 1:
                return None
            start, stop, _ = indices
            s = next(axes)
            offset -= start * s
            strides.append(s)
            window.append((start, stop))
        else:
            i = _int(item)
            if i is None:
                return None
            strides.append(0)
            window.append((i % n, i % n + 1))
    return View(source.base, offset, tuple(strides), tuple(window))


def _pad(source: View, shape: tuple[int, ...], out: tuple[int, ...], a: dict) -> View | None:
    """pad(x, widths) with +0 around x: x's unindex into the padded shape; padding with any
    other value (-0.0 too) is not a view."""
    value = a.get("value", 0)
    if value != 0 or math.copysign(1.0, value) < 0:
        return None
    widths = a["widths"]
    return _unindex(source, out, tuple(SliceSpec(lo, lo + n) for n, lo in zip(shape, widths[::2])))


def _regroup(old: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]
             ) -> tuple[int, ...] | None:
    """Strides that read `new` from a view of shape `old`, where its axes regroup without a
    copy: each run of old axes that merges or splits must be contiguous within itself (the
    rule of NumPy's reshape). Length-1 axes carry no stride."""
    olds = [(n, s) for n, s in zip(old, strides) if n != 1]
    news = [i for i, n in enumerate(new) if n != 1]
    out = [0] * len(new)
    oi = ni = 0
    while oi < len(olds) and ni < len(news):
        oj, nj = oi + 1, ni + 1
        o_size, n_size = olds[oi][0], new[news[ni]]
        while o_size != n_size:
            if o_size < n_size:
                o_size *= olds[oj][0]
                oj += 1
            else:
                n_size *= new[news[nj]]
                nj += 1
        if any(olds[k][1] != olds[k + 1][0] * olds[k + 1][1] for k in range(oi, oj - 1)):
            return None
        inner = olds[oj - 1][1]
        for k in reversed(range(ni, nj)):
            out[news[k]] = inner
            inner *= new[news[k]]
        oi, ni = oj, nj
    return tuple(out)


def load_strides(view: View, shape: tuple[int, ...], space: tuple[int, ...]) -> tuple[int, ...]:
    """The view's strides for a value of `shape` read at each point of `space` (NumPy
    broadcasting: missing leading axes and length-1 axes have stride 0)."""
    strides = tuple(0 if n == 1 else s for n, s in zip(shape, view.strides))
    return (0,) * (len(space) - len(shape)) + strides


def load_window(view: View, shape: tuple[int, ...], space: tuple[int, ...]
                ) -> tuple[tuple[int, int, int], ...]:
    """The view's window as (axis, lo, hi) bounds on the axes of `space` where a value of
    `shape` is read (as load_strides), leaving out the axes it does not bound."""
    if view.window is None:
        return ()
    lead = len(space) - len(shape)
    return tuple((lead + d, lo, hi) for d, (lo, hi) in enumerate(view.window)
                 if (lo, hi) != (0, shape[d]))


# How each primitive of role VIEW or WINDOW (ir/ops/shape.py) reads its input in place:
# (source, input shape, result shape, attributes) -> the result's view, or None
RULES = {
    Transpose: _transpose, Reshape: _rearrange, ExpandDims: _rearrange, Squeeze: _rearrange,
    BroadcastTo: _broadcast,
    Index: lambda source, shape, out, a: _index(source, shape, a["items"]),
    Slice: _slice,
    Unindex: lambda source, shape, out, a: _unindex(source, out, a["items"]),
    Pad: _pad,
}
KEEP_WINDOWS = (Transpose, BroadcastTo)         # the views of a window that keep it
