"""Views: values that are another value's elements read in place, at an affine offset.

A transpose, reshape, expand_dims, squeeze, broadcast_to, basic index or slice computes no
new element: element i of its result is element `offset + Σ i[d] · strides[d]` of a buffer
that already exists. The scheduler reads such values through their View — a kernel loads
from the buffer with the view's strides, a contraction or host step gets a strided NumPy
view — so they cost no copy. A reshape of a view whose axes cannot be regrouped without
copying (as in NumPy) is not a view."""
from __future__ import annotations

from dataclasses import dataclass

from backend.llvm import row_major
from ir.core import Op, Value
from ir.dims import Dim
from ir.ops.base import normalize_axes
from ir.ops.shape import SliceSpec, _along, _full

VIEWS = {"transpose", "reshape", "expand_dims", "squeeze", "broadcast_to", "index", "slice"}


@dataclass(frozen=True)
class View:
    """Element i of the value is element `offset + Σ i[d] · strides[d]` of `base`'s
    contiguous buffer."""
    base: Value
    offset: int
    strides: tuple[int, ...]


def identity(v: Value) -> View:
    return View(v, 0, row_major(v.shape))


def view_of(op: Op, source: View) -> View | None:
    """The view that op's result is of source's base, or None where it is not one."""
    x, out = op.inputs[0], op.outputs[0]
    if 0 in x.shape or 0 in out.shape:
        return None
    a = op.attrs
    if op.prim == "transpose":
        perm = normalize_axes(a.get("perm"), len(x.shape), x) if a.get("perm") is not None \
            else tuple(reversed(range(len(x.shape))))
        return View(source.base, source.offset, tuple(source.strides[p] for p in perm))
    if op.prim in ("reshape", "expand_dims", "squeeze"):
        strides = _regroup(x.shape, source.strides, out.shape)
        return None if strides is None else View(source.base, source.offset, strides)
    if op.prim == "broadcast_to":
        lead = len(out.shape) - len(x.shape)
        return View(source.base, source.offset, (0,) * lead + tuple(
            s if n == m else 0 for n, m, s in zip(x.shape, out.shape[lead:], source.strides)))
    if op.prim == "index":
        return _index(source, x.shape, a["items"])
    if op.prim == "slice":
        axis = a.get("axis", 0) % len(x.shape)
        return _index(source, x.shape, _along(axis, SliceSpec(a["start"], a.get("stop"),
                                                               a.get("step", 1))))
    return None


def _int(d: int | Dim | None) -> int | None:
    return None if d is None else Dim.of(d).value


def _index(source: View, shape: tuple[int, ...], items) -> View | None:
    offset, strides = source.offset, []
    for item, n, s in zip(_full(items, len(shape)), shape, source.strides):
        if isinstance(item, SliceSpec):
            bounds = [_int(item.lo), _int(item.hi)]
            if any(v is None and b is not None for v, b in zip(bounds, (item.lo, item.hi))):
                return None
            start, _, step = slice(*bounds, item.step).indices(n)
            offset += start * s
            strides.append(s * step)
        else:
            i = _int(item)
            if i is None:
                return None
            offset += (i % n) * s
    return View(source.base, offset, tuple(strides))


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
