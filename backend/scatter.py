"""scatter_add as compiled code for the host: a copy of x with each slice of `updates` added
at its index along an axis, every destination accumulating its slices in index order — the
order of the definition (np.add.at in ir/ops/index.py), so the bits are the interpreter's.
The generated function, in C:

    int64_t NAME(T *out, const T *x, const I *indices, const T *updates,
                 int64_t outer, int64_t n, int64_t size, int64_t inner);

x and out are [outer, size, inner], updates [outer, n, inner] and indices [n], all contiguous
and not overlapping. An index may count from the end (-size … -1). The result is -1, or the
position of the first index outside [-size, size), in which case out is left as it was.

And its transpose, take (a gather), for the native step (runtime/step.py), which copies rows
of bytes and so serves every dtype:

    int64_t take(char *out, const char *x, const I *indices, int64_t outer, int64_t n,
                 int64_t size, int64_t row_bytes, int64_t from_end);

out is [outer, n, row_bytes], x [outer, size, row_bytes]; an index counts from the end only
where from_end is not 0. The result is -1, or the position of an index out of range, in which
case out is left partly written."""
from __future__ import annotations

import ctypes
import functools
from math import prod
from typing import Callable

import numpy as np
from llvmlite import ir

from backend import cpu
from backend.llvm import I64, SCALAR, loop
from ir.core import Op
from ir.interp import EvalError
from ir.ops.index import ScatterAdd

FLOATS = ("f32", "f64")
INDICES = ("i32", "i64")


def _build(module: ir.Module, dtype: str, index: str) -> None:
    t, i_t = SCALAR[dtype], SCALAR[index]
    p = t.as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [p, p, i_t.as_pointer(), p, I64, I64, I64, I64]),
                     name="scatter_add")
    out, x, indices, updates, outer, n, size, inner = fn.args
    for arg in (out, x, indices, updates):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c = lambda v: ir.Constant(I64, v)

    def row(i):                       # indices[i] as a row in [0, size), or -1 outside
        r = b.sext(b.load(b.gep(indices, [i])), I64) if index != "i64" else b.load(b.gep(indices, [i]))
        r = b.select(b.icmp_signed("<", r, c(0)), b.add(r, size), r)
        inside = b.and_(b.icmp_signed(">=", r, c(0)), b.icmp_signed("<", r, size))
        return b.select(inside, r, c(-1))

    bad = b.alloca(I64)
    b.store(c(-1), bad)

    def check(i):
        with b.if_then(b.and_(b.icmp_signed("==", row(i), c(-1)),
                              b.icmp_signed("<", b.load(bad), c(0)))):
            b.store(i, bad)

    loop(b, c(0), n, check)
    with b.if_then(b.icmp_signed(">=", b.load(bad), c(0)), likely=False):
        b.ret(b.load(bad))

    total = b.mul(outer, b.mul(size, inner))
    loop(b, c(0), total, lambda j: b.store(b.load(b.gep(x, [j])), b.gep(out, [j])))

    def slab(o):
        def at(i):                    # ORDER: slices in index order, each added to its row
            dst = b.gep(out, [b.mul(b.add(b.mul(o, size), row(i)), inner)])
            src = b.gep(updates, [b.mul(b.add(b.mul(o, n), i), inner)])
            loop(b, c(0), inner, lambda j: b.store(
                b.fadd(b.load(b.gep(dst, [j])), b.load(b.gep(src, [j]))), b.gep(dst, [j])))
        loop(b, c(0), n, at)

    loop(b, c(0), outer, slab)
    b.ret(c(-1))


def _build_take(module: ir.Module, index: str) -> None:
    i_t, p = SCALAR[index], ir.IntType(8).as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [p, p, i_t.as_pointer()] + [I64] * 5), name="take")
    out, x, indices, outer, n, size, row, from_end = fn.args
    for arg in (out, x, indices):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c = lambda v: ir.Constant(I64, v)
    copy = b.module.declare_intrinsic("llvm.memcpy", [p, p, I64])

    def slab(o):
        def at(i):
            r = b.sext(b.load(b.gep(indices, [i])), I64) if index != "i64" else b.load(b.gep(indices, [i]))
            wraps = b.and_(b.icmp_signed("<", r, c(0)), b.icmp_signed("!=", from_end, c(0)))
            r = b.select(wraps, b.add(r, size), r)
            with b.if_then(b.or_(b.icmp_signed("<", r, c(0)), b.icmp_signed(">=", r, size)),
                           likely=False):
                b.ret(i)
            b.call(copy, [b.gep(out, [b.mul(b.add(b.mul(o, n), i), row)]),
                          b.gep(x, [b.mul(b.add(b.mul(o, size), r), row)]), row,
                          ir.Constant(ir.IntType(1), 0)])
        loop(b, c(0), n, at)

    loop(b, c(0), outer, slab)
    b.ret(c(-1))


def scatter_function(dtype: str, index: str) -> int:
    """The address of scatter_add for values and indices of these dtypes."""
    return cpu.routine("scatter_add", lambda module: _build(module, dtype, index), dtype, index)


@functools.cache
def _callable(dtype: str, index: str) -> Callable:
    return ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 4)(
        scatter_function(dtype, index))


def take_function(index: str) -> int:
    """The address of take for indices of this dtype."""
    return cpu.routine("take", lambda module: _build_take(module, index), index)


def compiles(op: Op) -> bool:
    """Whether op is a scatter_add this module compiles: float values of one dtype, i32 or i64
    indices."""
    if not isinstance(op.primitive, ScatterAdd):
        return False
    x, indices, updates = op.inputs
    return op.outputs[0].dtype in FLOATS and indices.dtype in INDICES \
        and x.dtype == updates.dtype == op.outputs[0].dtype


def evaluate(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """op's outputs where this module compiles it, else None. An index out of range is the
    interpreter's EvalError."""
    if not compiles(op):
        return None
    (out,) = op.outputs
    fn = _callable(out.dtype, op.inputs[1].dtype)
    x, indices, updates = (np.ascontiguousarray(a) for a in inputs)
    axis = op.attrs.get("axis", 0) % x.ndim
    result = np.empty_like(x)
    outer, size, inner = around(x.shape, axis)
    bad = fn(result.ctypes.data, x.ctypes.data, indices.ctypes.data, updates.ctypes.data,
             outer, indices.size, size, inner)
    if bad >= 0:
        raise out_of_range("scatter_add", indices.reshape(-1)[bad], axis, size)
    return [result]


def around(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """shape as [outer, size, inner] about axis: the form gathers and scatters index (here and
    on the GPU, backend/nvptx.py)."""
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def out_of_range(prim: str, index: int, axis: int, size: int) -> EvalError:
    """The interpreter's error for an index outside [-size, size), in its words (NumPy's)."""
    return EvalError(f"'{prim}' failed at run time: index {index} is out of bounds for axis "
                     f"{axis} with size {size}")
