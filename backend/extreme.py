"""argmax and argmin as compiled code for the host, for the native step (runtime/step.py):
the index of the first extreme along an axis, or of the first NaN, NumPy's (the primitive's
`wins`, which the GPU's extreme kernel walks by too). The generated function, in C:

    int64_t argmax(const T *x, int32_t *out, int64_t outer, int64_t n, int64_t inner);

x is [outer, n, inner] with n at least 1 (the checker rejects an empty axis where it
specialises), and out [outer, inner], both contiguous; each result walks its line of the axis
in order. The result is -1 (a routine's, backend/step.py's RoutineCall: nothing fails)."""
from __future__ import annotations

from math import prod

from llvmlite import ir

from backend import cpu, scatter
from backend.llvm import I32, I64, Emitter, loop, memory_type
from ir.core import Op
from ir.ops.reduce import ArgReduction

DTYPES = ("f32", "f64", "i32", "i64", "u32", "bool")


def around(op: Op) -> tuple[int, int, int]:
    """op's x as [outer, n, inner] about its axis (the flattened tensor for None): the sizes
    this routine and the GPU's extreme kernel take."""
    (x,), axis = op.inputs, op.attrs.get("axis")
    return (1, prod(x.shape), 1) if axis is None else scatter.around(x.shape, axis % len(x.shape))


def function(prim: ArgReduction, dtype: str) -> int:
    """The address of prim's routine for x of dtype (one of DTYPES)."""
    return cpu.routine(prim.name, lambda module: _build(module, prim, dtype), dtype)


def _build(module: ir.Module, prim: ArgReduction, dtype: str) -> None:
    t = memory_type(dtype)
    fn = ir.Function(module, ir.FunctionType(I64, [t.as_pointer(), I32.as_pointer()] + [I64] * 3),
                     name=prim.name)
    x, out, outer, n, inner = fn.args
    for arg in (x, out):
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    e, c = Emitter(b, module), lambda v: ir.Constant(I64, v)
    best, where = b.alloca(t), b.alloca(I64)

    def result(o: ir.Value, j: ir.Value) -> None:
        at = lambda p: b.load(b.gep(x, [b.add(b.mul(b.add(b.mul(o, n), p), inner), j)]))
        b.store(at(c(0)), best)
        b.store(c(0), where)

        def step(p: ir.Value) -> None:
            v = at(p)
            wins = prim.wins(e, v, b.load(best), dtype)
            b.store(b.select(wins, v, b.load(best)), best)
            b.store(b.select(wins, p, b.load(where)), where)

        loop(b, c(1), n, step)
        b.store(b.trunc(b.load(where), I32), b.gep(out, [b.add(b.mul(o, inner), j)]))

    loop(b, c(0), outer, lambda o: loop(b, c(0), inner, lambda j: result(o, j)))
    b.ret(c(-1))
