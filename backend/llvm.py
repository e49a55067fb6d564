"""Loop IR to LLVM IR through llvmlite: shared by every target.

A kernel becomes `void name(i8** buffers, i64 lo, i64 hi, i64 n)`: a map visits the points
whose first index is in [lo, hi); a reduction or a scan, the kept points whose flattened index
is in [lo, hi) (a reduction's each of n elements); a row kernel, the rows whose flattened index
is in [lo, hi), each row's stages in order, the values one per row in registers. Threads split [lo, hi) between them; each point is computed the same way whoever
computes it, so results do not depend on the thread count. Scalar operations are emitted by
`Emitter`, on scalars or on vectors of LANES values alike; transcendental functions come
from the exact-mode math library (backend/mathlib.py), never from LLVM intrinsics or libm."""
from __future__ import annotations

import dataclasses
from math import prod
from typing import Any, Callable

from llvmlite import ir

from backend.loops import Instr, Load, LoopKernel
from ir.numerics import CHUNK, LANES
from ir.ops.elementwise import Add, Maximum, Minimum, Mul
from ir.ops.reduce import identity

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
SCALAR = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "f16": ir.HalfType(),
          "i32": I32, "i64": I64, "u32": I32, "bool": I1}
FLOATS = ("f32", "f64", "f16")
KERNEL_TYPE = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64, I64])
ROW_BLOCK = 8                      # rows a row kernel's stage runs for at a time (see rows)
# vectors a trip of a costly kernel's long innermost loop computes (exp, tanh…: chains of
# dependent operations, a polynomial and a division, that one vector a trip leaves the core
# waiting on; LLVM's cost model chose one). On a Zen 4, 1024 x 512 on one thread (A/B in one
# process): GELU 0.80 of the time, its gradient 0.82-0.92, exp(x) * sigmoid(x) 0.83, softmax
# 0.87-0.90 (two vectors: 0.87, 0.98, 0.92, 0.97); the steps of benchmarks/peers.py, whose
# such kernels are small, in the same time; the same bits
INTERLEAVE = 4
INTERLEAVED_LANES = 16             # lanes of a vector of f32 with AVX-512, the most a host has
MAX_CUTS = 8                       # copies of a map's loops that cutting them at windows makes, at most
# the primitives whose bodies combine partial results so (backend/loops.py's Reduce)
COMBINERS = {"add": Add(), "mul": Mul(), "max": Maximum(), "min": Minimum()}


def memory_type(dtype: str) -> ir.Type:
    """How a dtype is stored: bools as bytes, like NumPy."""
    return I8 if dtype == "bool" else SCALAR[dtype]


def overload_suffix(t: ir.Type) -> str:
    """The suffix an LLVM intrinsic overloaded on type t takes: f32, v16f32… (llvmlite's
    declare_intrinsic names scalar overloads only)."""
    return f"v{t.count}{t.element.intrinsic_name}" if isinstance(t, ir.VectorType) else t.intrinsic_name


def masked_load(b: ir.IRBuilder, vptr: ir.Value, mask: ir.Value, align: int) -> ir.Value:
    """The vector at vptr where mask is set, +0.0 (or 0) elsewhere: those lanes are not read."""
    vec = vptr.type.pointee
    name = f"llvm.masked.load.{overload_suffix(vec)}.p0"
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(vec, [vec.as_pointer(), I32, mask.type, vec]), name)
    return b.call(fn, [vptr, ir.Constant(I32, align), mask, ir.Constant(vec, None)])


class Emitter:
    """Scalar (or lane-vector) operations for the dtypes of the language."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module):
        self.b, self.module = b, module

    def intrinsic(self, name: str, value: ir.Value, *more: ir.Value) -> ir.Value:
        """name.T(value, *more) for an LLVM intrinsic overloaded on value's type T."""
        t = value.type
        full = f"{name}.{overload_suffix(t)}"
        fn = self.module.globals.get(full) or ir.Function(
            self.module, ir.FunctionType(t, [t] + [m.type for m in more]), full)
        return self.b.call(fn, [value, *more])

    def const(self, value: Any, dtype: str, like: ir.Value | None = None) -> ir.Value:
        c = ir.Constant(SCALAR[dtype], bool(value) if dtype == "bool" else value)
        return self.splat(c, like.type.count) if like is not None and isinstance(like.type, ir.VectorType) else c

    def splat(self, c: ir.Value, n: int) -> ir.Value:
        vec = ir.Constant(ir.VectorType(c.type, n), ir.Undefined)
        vec = self.b.insert_element(vec, c, ir.Constant(I32, 0))
        return self.b.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(I32, n), [0] * n))

    # The operations primitives' scalar bodies are built from (ir/ops: `Primitive.scalar`);
    # each works on scalars and lane vectors alike, and on floats or integers by x's type.

    def add(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fadd(x, y) if _is_float(x) else self.b.add(x, y)

    def sub(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fsub(x, y) if _is_float(x) else self.b.sub(x, y)

    def mul(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fmul(x, y) if _is_float(x) else self.b.mul(x, y)

    def div(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fdiv(x, y)

    def quotient(self, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
        """x / y of integers rounded toward zero; y is never 0, nor -1 with x the least value."""
        return self.b.udiv(x, y) if dtype == "u32" else self.b.sdiv(x, y)

    def remainder(self, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
        """x - y * quotient(x, y): the sign of x; y as for quotient. Of floats, C's fmod (exact,
        from the math library: LLVM's frem is a call to libm on the CPU, inexact on NVPTX)."""
        if _is_float(x):
            return self.math("fmod", x, y)
        return self.b.urem(x, y) if dtype == "u32" else self.b.srem(x, y)

    def neg(self, x: ir.Value) -> ir.Value:
        return self.b.fneg(x) if _is_float(x) else self.b.neg(x)

    def abs(self, x: ir.Value, dtype: str) -> ir.Value:
        if _is_float(x):
            return self.intrinsic("llvm.fabs", x)
        return self.b.select(self.compare("<", x, self.const(0, dtype, x), dtype), self.b.neg(x), x)

    def compare(self, symbol: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
        """x symbol y (== != < <= > >=) for operands of dtype: ordered for floats, but for !=
        (NaN != NaN); unsigned for u32 and bool (an i1 True is -1 signed)."""
        if dtype in FLOATS:
            return (self.b.fcmp_unordered if symbol == "!=" else self.b.fcmp_ordered)(symbol, x, y)
        unsigned = dtype in ("u32", "bool")
        return (self.b.icmp_unsigned if unsigned else self.b.icmp_signed)(symbol, x, y)

    def isnan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def and_(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.and_(x, y)

    def or_(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.or_(x, y)

    def xor(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.xor(x, y)

    def shl(self, x: ir.Value, n: ir.Value) -> ir.Value:
        """x << n of integers; n is less than x's bits (LLVM makes a larger count poison)."""
        return self.b.shl(x, n)

    def shr(self, x: ir.Value, n: ir.Value, dtype: str) -> ir.Value:
        """x >> n, arithmetic but for u32; n as for shl."""
        return self.b.lshr(x, n) if dtype == "u32" else self.b.ashr(x, n)

    def select(self, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.select(cond, x, y)

    def sqrt(self, x: ir.Value) -> ir.Value:
        return self.intrinsic("llvm.sqrt", x)

    def math(self, function: str, *args: ir.Value) -> ir.Value:
        """A function of the exact-mode math library (backend/mathlib.py) by its name there."""
        from backend import mathlib
        return (mathlib.BINARY.get(function) or mathlib.UNARY[function])(self.b, *args)

    def apply(self, ins: Instr, args: list[ir.Value], dtypes: list[str]) -> ir.Value:
        """The value of an instruction's primitive from its operands' values (of dtypes)."""
        return ins.prim.scalar(self, args, dtypes, ins.dtype, dict(ins.attrs))

    def combine(self, how: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
        """Two partial results of a reduction combined by the loop IR's `how` (backend/loops.py)."""
        return COMBINERS[how].scalar(self, [x, y], [dtype, dtype], dtype, {})

    def cast(self, x: ir.Value, src: str, dst: str) -> ir.Value:
        b = self.b
        vec = isinstance(x.type, ir.VectorType)
        to = ir.VectorType(SCALAR[dst], x.type.count) if vec else SCALAR[dst]
        if src == dst:
            return x
        if dst == "bool":
            zero = self.const(0.0 if src in FLOATS else 0, src, x)
            return b.fcmp_unordered("!=", x, zero) if src in FLOATS else b.icmp_unsigned("!=", x, zero)
        if src == "bool":
            return b.uitofp(x, to) if dst in FLOATS else b.zext(x, to)
        if src == "f64" and dst == "f16":
            return b.fptrunc(self.to_f32_rounded_to_odd(x), to)
        if src in FLOATS and dst in FLOATS:
            return b.fpext(x, to) if _bits(dst) > _bits(src) else b.fptrunc(x, to)
        if dst in FLOATS:
            return b.uitofp(x, to) if src == "u32" else b.sitofp(x, to)
        if src in FLOATS:                                 # to i32 or i64
            return self.truncated(self.cast(x, src, "f32"), "f32", dst) if src == "f16" else \
                self.truncated(x, src, dst)
        if _bits(dst) > _bits(src):
            return b.zext(x, to) if src == "u32" else b.sext(x, to)
        return b.trunc(x, to) if _bits(dst) < _bits(src) else x


    def truncated(self, x: ir.Value, src: str, dst: str) -> ir.Value:
        """An f32 or f64 rounded toward zero to i32 or i64; NaN and values out of range give
        the least value, as x86's conversion does (LLVM's leaves them undefined)."""
        b, bits = self.b, _bits(dst)
        inside = b.and_(b.fcmp_ordered(">=", x, self.const(-2.0 ** (bits - 1), src, x)),
                        b.fcmp_ordered("<", x, self.const(2.0 ** (bits - 1), src, x)))
        to = ir.VectorType(SCALAR[dst], x.type.count) if isinstance(x.type, ir.VectorType) else SCALAR[dst]
        whole = b.fptosi(b.select(inside, x, self.const(0.0, src, x)), to)
        return b.select(inside, whole, self.const(-2 ** (bits - 1), dst, x))

    def to_f32_rounded_to_odd(self, x: ir.Value) -> ir.Value:
        """A double as a float rounded to odd (toward zero, the last bit set where inexact):
        rounded again to half, it is the double rounded once. x86 has no instruction from
        double to half, and LLVM's call of compiler-rt's for it is a null pointer in a JIT."""
        b = self.b
        vec = isinstance(x.type, ir.VectorType)
        f32, i32 = (ir.VectorType(t, x.type.count) if vec else t for t in (SCALAR["f32"], I32))
        t = b.fptrunc(x, f32)
        back = b.fpext(t, x.type)
        bits = b.bitcast(t, i32)
        away = b.fcmp_ordered(">", self.intrinsic("llvm.fabs", back), self.intrinsic("llvm.fabs", x))
        bits = b.select(away, b.sub(bits, self.const(1, "i32", bits)), bits)   # one ulp toward 0
        inexact = b.fcmp_ordered("!=", back, x)                                   # (NaN is exact)
        return b.bitcast(b.select(inexact, b.or_(bits, self.const(1, "i32", bits)), bits), f32)


def _is_float(x: ir.Value) -> bool:
    t = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    return isinstance(t, (ir.HalfType, ir.FloatType, ir.DoubleType))


def _bits(dtype: str) -> int:
    return {"f16": 16, "f32": 32, "f64": 64, "i32": 32, "u32": 32, "i64": 64, "bool": 1}[dtype]


# ---------------------------------------------------------------- kernels

def kernel_function(module: ir.Module, k: LoopKernel) -> ir.Function:
    """Emit one kernel into module: `name(i8** buffers, i64 lo, i64 hi, i64 n)`, which calls
    the loops with each buffer as its own `noalias` pointer. The buffers never overlap (outputs
    are fresh arrays), and saying so lets LLVM vectorise loops that read and write several of
    them. n is a reduction's length (LoopKernel.reads_length), which other kernels ignore."""
    types = [memory_type(dt).as_pointer() for dt, _ in k.buffers]
    body = ir.Function(module, ir.FunctionType(ir.VoidType(), types + [I64, I64, I64]),
                       name=f"{k.name}.loops")
    body.linkage = "internal"
    body.attributes.add("alwaysinline")
    for arg in body.args[:len(types)]:
        arg.add_attribute("noalias")
    *ptrs, lo, hi, n = body.args
    gen = _KernelGen(ir.IRBuilder(body.append_basic_block("entry")), module, k, ptrs,
                     length=n if k.reads_length else None)
    if k.is_rows:
        gen.rows(lo, hi)
    elif k.is_reduction:
        gen.reduction(lo, hi)
    elif k.is_scan:
        gen.scan(lo, hi)
    else:
        gen.map(lo, hi)
    gen.b.ret_void()

    fn = ir.Function(module, KERNEL_TYPE, name=k.name)
    bufs_arg, lo, hi, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    loaded = [b.bitcast(b.load(b.gep(bufs_arg, [ir.Constant(I64, i)])), t) for i, t in enumerate(types)]
    b.call(body, loaded + [lo, hi, n])
    b.ret_void()
    return fn


def size_free(k: LoopKernel) -> LoopKernel:
    """k less what kernel_function does not read: its buffers' shapes; where the caller's
    range [lo, hi) bounds it, its first axis's extent (1 here); and a reduction's length,
    which it is passed (the largest of its class here, a mean's count alike: see levels). So
    the kernels of a program at two batch sizes are one piece of code. A reduction's or a
    scan's single kept axis stays: grain reads it."""
    bounded = len(k.shape) > 1 or len(k.shape) == 1 and not (k.is_reduction or k.is_scan)
    buffers = tuple((dtype, ()) for dtype, _ in k.buffers)
    shape = lambda kernel: (1,) + kernel.shape[1:] if bounded else kernel.shape
    stages = tuple(dataclasses.replace(s, shape=shape(s), buffers=buffers) for s in k.stages)
    k = dataclasses.replace(k, shape=shape(k), buffers=buffers, stages=stages)
    if k.reads_length:         # (its class of lengths stays: the code's levels of chunks)
        n = CHUNK ** levels(k.n)
        count = None if k.reduce.count is None else n
        k = dataclasses.replace(k, n=n, reduce=dataclasses.replace(k.reduce, count=count))
    return k


def levels(n: int) -> int:
    """The levels of chunks in the canonical order of a reduction of n elements
    (ir/numerics.py): 1 up to CHUNK elements, 2 up to CHUNK², and so on. A reduction's code
    serves every length of its class."""
    count = 1
    while n > CHUNK ** count:
        count += 1
    return count


def grain(k: LoopKernel) -> int:
    """What the start of a thread's range should be a multiple of, for speed alone: LANES
    for a reduction whose result points are reduced LANES at a time side by side (where its
    reduced axis is strided), or a scan whose kept points are scanned so (where consecutive
    ones are consecutive in its result)."""
    if not (k.is_reduction or k.is_scan) or not k.shape or k.shape[-1] < LANES:
        return 1
    loads = [ins.load for ins in k.body if ins.load is not None]
    across = all(l.strides[-2] in (0, 1) for l in loads)
    if k.is_scan:          # a costly step is worth gathering lines that are not neighbours
        return LANES if across and k.scan.strides[-2] == 1 or k.scan.prim.costly else 1
    return LANES if across and any(l.strides[-1] != 1 for l in loads) else 1


def unravel(b: ir.IRBuilder, flat: ir.Value, shape: tuple[int, ...]) -> list[ir.Value]:
    """The index of position `flat` (< the space's size) in a row-major space of `shape`; the
    first axis's extent is not read (see size_free)."""
    index, rest = [], flat
    for d in reversed(shape[1:]):
        index.append(b.urem(rest, ir.Constant(I64, d)))
        rest = b.udiv(rest, ir.Constant(I64, d))
    return [rest] + index[::-1] if shape else []


def merged_axes(k: LoopKernel) -> tuple[LoopKernel, int]:
    """The map k over fewer axes: neighbours that every load walks as one (its stride on the
    outer is the inner's times the inner's extent) made one, so that a loop's trips are many
    and few are left to the scalar loop after the vectors (AdamW on a 200 x 27 weight ran 27
    trips a row, 11 of them scalar); and how many times longer the first axis grew, by which
    the caller's range is scaled. Not where a load has a window (it bounds its own axis), nor
    where the space is empty."""
    loads = [ins.load for ins in k.body if ins.load is not None]
    if len(k.shape) < 2 or 0 in k.shape[1:] or any(load.window for load in loads):
        return k, 1
    extents, strides, grown = [k.shape[0]], [[load.strides[0]] for load in loads], 1
    for d, n in enumerate(k.shape[1:], 1):
        if n == 1:                              # (an axis of one point walks nowhere)
            continue
        if all(s[-1] == load.strides[d] * n for s, load in zip(strides, loads)):
            if len(extents) == 1:
                grown *= n
            extents[-1] *= n
            for s, load in zip(strides, loads):
                s[-1] = load.strides[d]
        else:
            extents.append(n)
            for s, load in zip(strides, loads):
                s.append(load.strides[d])
    if len(extents) == len(k.shape):
        return k, 1
    walks = iter(strides)
    body = tuple(ins if ins.load is None else
                 dataclasses.replace(ins, load=dataclasses.replace(ins.load, strides=tuple(next(walks))))
                 for ins in k.body)
    return dataclasses.replace(k, shape=tuple(extents), body=body), grown


def window_cuts(k: LoopKernel) -> dict[int, list[tuple[int, int]]]:
    """The axes of a map (past the first, the caller's range) whose loops are cut where a
    load's window on them begins or ends, with their pieces: in each piece every such window
    holds throughout or nowhere, decided where the loops are made rather than by a test and a
    select at each element (the gradient of qkv's three slices in the GPT step: 2.4% of its
    samples, 0.3% cut; four gates' gradients side by side 0.5-0.7 of the time). Each cut
    copies the loops inside it, so axes are cut innermost first while the copies number at
    most MAX_CUTS (a 5-D padding's gradient, 81 copies, compiled in 0.45 s against 0.18)."""
    cuts, copies = {}, 1
    for axis in reversed(range(1, len(k.shape))):
        extent = k.shape[axis]
        bounds = {min(max(b, 0), extent) for ins in k.body if ins.load is not None
                  for a, lo, hi in ins.load.window if a == axis for b in (lo, hi)}
        points = sorted(bounds | {0, extent})
        pieces = list(zip(points, points[1:]))
        if len(pieces) > 1 and copies * len(pieces) <= MAX_CUTS:
            cuts[axis], copies = pieces, copies * len(pieces)
    return cuts


def decided(k: LoopKernel, axis: int, start: int, stop: int) -> LoopKernel:
    """k where the index on `axis` lies in [start, stop), inside or outside each load's window
    there throughout (window_cuts): a load outside is the constant 0 it reads, a load inside
    loses the bound, which holds."""
    def settled(ins: Instr) -> Instr:
        load = ins.load
        if load is None or not any(a == axis for a, _, _ in load.window):
            return ins
        if not all(lo <= start and stop <= hi for a, lo, hi in load.window if a == axis):
            return Instr.constant(0, ins.dtype)
        return Instr.read(Load(load.buffer, load.strides, load.offset,
                               tuple(w for w in load.window if w[0] != axis)), ins.dtype)
    if start == 0 and stop == k.shape[axis]:
        return k
    return dataclasses.replace(k, body=tuple(settled(ins) for ins in k.body))


def loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value], None],
         step: int = 1, interleave: int = 1) -> None:
    """for i in range(start, stop, step): body(i) — as basic blocks, leaving b after the loop;
    its vectorised form `interleave` vectors a trip where that is more than 1."""
    pre = b.block
    head = b.append_basic_block("loop")
    inner = b.append_basic_block("body")
    after = b.append_basic_block("after")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, stop), inner, after)
    b.position_at_end(inner)
    body(i)
    nxt = b.add(i, ir.Constant(I64, step))
    i.add_incoming(nxt, b.block)
    back = b.branch(head)
    if interleave > 1:
        back.set_metadata("llvm.loop", _loop_hint(b.module, "llvm.loop.interleave.count", interleave))
    b.position_at_end(after)


def _loop_hint(module: ir.Module, name: str, value: int) -> ir.MDValue:
    """A loop's identity (a node that names itself, LLVM's convention) carrying one hint."""
    hint = module.add_metadata([ir.MetaDataString(module, name), ir.Constant(I32, value)])
    # (made with a stand-in third operand that no other node has, or llvmlite would hand back
    # another loop's node, its cache keyed by operands; then made to name itself)
    identity = module.add_metadata([hint, hint, ir.MetaDataString(module, str(len(module.metadata)))])
    identity.operands = (identity, hint)
    return identity


def evaluate_body(e: Emitter, k: LoopKernel, load: Callable[[Instr], ir.Value],
                  widen: Callable[[ir.Value], ir.Value] = lambda c: c) -> list[ir.Value]:
    """The values of k's body in order, on any target: each load by load(instr), each constant
    widened as the loads are (a splat across vector lanes), each operation by the Emitter."""
    values: list[ir.Value] = []
    for ins in k.body:
        if ins.load is not None:
            values.append(load(ins))
        elif ins.prim is None:
            values.append(widen(e.const(dict(ins.attrs)["value"], ins.dtype)))
        else:
            args = [values[a] for a in ins.args]
            values.append(e.apply(ins, args, [k.body[a].dtype for a in ins.args]))
    return values


def windowed(e: Emitter, ins: Instr, index: list[ir.Value],
             offset: Callable[[list[ir.Value]], ir.Value], read: Callable[[ir.Value], ir.Value]
             ) -> ir.Value:
    """read(offset(index)), or 0 where index lies outside the load's window, on any target.
    There each bounded index is clamped to its lo, so that the address stays in the buffer
    (while the axes it does not bound still walk memory as before, in vectors), and the value
    is dropped. Each bound lo <= i < hi is one unsigned compare, i - lo < hi - lo."""
    b = e.b
    inside, clamped = None, list(index)
    for axis, lo, hi in ins.load.window:
        i = index[axis]
        bound = b.icmp_unsigned("<", b.sub(i, ir.Constant(i.type, lo)), ir.Constant(i.type, hi - lo))
        clamped[axis] = b.select(bound, i, ir.Constant(i.type, lo))
        inside = bound if inside is None else b.and_(inside, bound)
    value = read(offset(clamped))
    return value if inside is None else b.select(inside, value, e.const(0, ins.dtype))


class _KernelGen:
    def __init__(self, b: ir.IRBuilder, module: ir.Module, k: LoopKernel, ptrs: list[ir.Value],
                 known: dict[int, ir.Value] | None = None, length: ir.Value | None = None):
        self.b, self.k, self.ptrs = b, k, ptrs
        self.length = length                            # a reduction's n, where passed
        self.e = Emitter(b, module)
        self.known = {} if known is None else known     # a row kernel's values of this row, by buffer

    def interleave(self, trips: int | None) -> int:
        """Vectors a trip of an innermost loop of `trips` trips (None: as many as a chunk of
        the kernel's range) computes: INTERLEAVE for a costly kernel's long loop, else 1 (a
        short one would be left to the scalar loop after it: the CNN's step took 6% longer)."""
        long = trips is None or trips >= INTERLEAVE * INTERLEAVED_LANES
        return INTERLEAVE if self.k.costly and long else 1

    def load(self, ins: Instr, offset: ir.Value, lanes: int = 0, lane_stride: int = 0,
             mask: ir.Value | None = None) -> ir.Value:
        """The element at offset (or `lanes` elements lane_stride apart) of a buffer; with a
        mask (of lanes), only the lanes it sets are read (the others hold some value)."""
        b = self.b
        if ins.load.buffer in self.known:
            value = self.known[ins.load.buffer]
            return self.e.splat(value, lanes) if lanes else value
        ptr = self.ptrs[ins.load.buffer]
        mem = memory_type(ins.dtype)
        if not lanes:
            v = b.load(b.gep(ptr, [offset]))
            return b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if ins.dtype == "bool" else v
        if lane_stride == 0:
            return self.e.splat(self.load(ins, offset), lanes)
        if lane_stride == 1:
            vptr = b.bitcast(b.gep(ptr, [offset]), ir.VectorType(mem, lanes).as_pointer())
            align = mem.width // 8 if hasattr(mem, "width") else 4
            v = b.load(vptr, align=align) if mask is None else masked_load(b, vptr, mask, align)
            # (a mask's lanes one load and one compare: element by element, a softmax's
            # causal mask cost as much as the rest of its row kernel)
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, None)) if ins.dtype == "bool" else v
        vec = ir.Constant(ir.VectorType(SCALAR[ins.dtype], lanes), ir.Undefined)
        for j in range(lanes):
            step = ir.Constant(I64, j * lane_stride)
            if mask is not None:            # (a lane masked off reads the first lane's element)
                step = b.select(b.extract_element(mask, ir.Constant(I32, j)), step, ir.Constant(I64, 0))
            vec = b.insert_element(vec, self.load(ins, b.add(offset, step)), ir.Constant(I32, j))
        return vec

    def body(self, offset_of: Callable[[Instr], ir.Value], lanes: int = 0,
             lane_stride_of: Callable[[Instr], int] = lambda ins: 0,
             mask: ir.Value | None = None) -> list[ir.Value]:
        """Evaluate the kernel body; loads at offset_of(load) (of the lanes mask sets)."""
        return evaluate_body(self.e, self.k,
                             lambda ins: self.load(ins, offset_of(ins), lanes, lane_stride_of(ins), mask),
                             lambda c: self.e.splat(c, lanes) if lanes else c)

    def store(self, buffer: int, offset: ir.Value, value: ir.Value, dtype: str,
              lane_stride: int = 1) -> None:
        """value at offset, or a vector of values at offset, offset + lane_stride, …"""
        b = self.b
        vector = isinstance(value.type, ir.VectorType)
        if dtype == "bool":             # a byte each (a reduction's points are a vector of them)
            value = b.zext(value, ir.VectorType(I8, value.type.count) if vector else I8)
        ptr = b.gep(self.ptrs[buffer], [offset])
        if not vector:
            b.store(value, ptr)
        elif lane_stride == 1:
            b.store(value, b.bitcast(ptr, value.type.as_pointer()), align=max(1, _bits(dtype) // 8))
        else:
            for j in range(value.type.count):
                at = b.gep(ptr, [ir.Constant(I64, j * lane_stride)])
                b.store(b.extract_element(value, ir.Constant(I32, j)), at)

    # -------------------------------------------------------- maps

    def map(self, lo: ir.Value, hi: ir.Value) -> None:
        """The loop nest over [lo, hi) of the first axis: over fewer axes where the loads allow
        (merged_axes), its loops cut where windows begin and end (window_cuts)."""
        self.k, grown = merged_axes(self.k)
        if grown > 1:
            lo, hi = (self.b.mul(x, ir.Constant(I64, grown)) for x in (lo, hi))
        shape = self.k.shape
        out_strides = row_major(shape)
        if not shape:
            zero = ir.Constant(I64, 0)
            self.point([], zero)
            return
        cuts = window_cuts(self.k)

        def level(d: int, index: list[ir.Value]) -> None:
            if d == len(shape):
                offset = self.offset(index, out_strides)
                self.point(index, offset)
                return
            if d == 0:
                loop(self.b, lo, hi, lambda i: level(1, [i]),
                     interleave=self.interleave(None) if len(shape) == 1 else 1)
                return
            whole = self.k          # (point() reads self.k: each piece's, its windows decided)
            for start, stop in cuts.get(d, [(0, shape[d])]):
                self.k = decided(whole, d, start, stop)
                loop(self.b, ir.Constant(I64, start), ir.Constant(I64, stop),
                     lambda i: level(d + 1, index + [i]),
                     interleave=self.interleave(stop - start) if d == len(shape) - 1 else 1)
            self.k = whole

        level(0, [])

    def offset(self, index: list[ir.Value], strides: tuple[int, ...], start: int = 0) -> ir.Value:
        total = ir.Constant(I64, start)
        for i, s in zip(index, strides):
            if s:
                total = self.b.add(total, self.b.mul(i, ir.Constant(I64, s)))
        return total

    def point(self, index: list[ir.Value], out_offset: ir.Value) -> list[ir.Value]:
        def load(ins: Instr) -> ir.Value:
            return windowed(self.e, ins, index,
                            lambda clamped: self.offset(clamped, ins.load.strides, ins.load.offset),
                            lambda offset: self.load(ins, offset))

        values = evaluate_body(self.e, self.k, load)
        for buf, ins in self.k.stores:
            self.store(buf, out_offset, values[ins], self.k.body[ins].dtype)
        return values

    # -------------------------------------------------------- row kernels

    def rows(self, lo: ir.Value, hi: ir.Value) -> None:
        """The rows in [lo, hi), each row's stages in order. A row's values stay in registers
        for its later stages; but where a stage computes exp, log, tanh…, whose latency a
        row's reduction tree would leave the core waiting on, ROW_BLOCK rows at a time run
        each stage, independent rows side by side, and later stages read back the row's
        values the earlier ones stored (measured on the GPT step: softmax forward -10%,
        layer-norm backward +13% when blocked)."""
        b, k = self.b, self.k
        block = max(1, min(ROW_BLOCK, CHUNK // max(k.n, 1))) if k.costly else 1

        def rows_from(o: ir.Value) -> None:
            known: dict[int, ir.Value] = {}
            end = b.add(o, ir.Constant(I64, block))
            end = b.select(b.icmp_signed("<", end, hi), end, hi)
            for stage in k.stages:
                gen = _KernelGen(b, self.e.module, stage, self.ptrs, known if block == 1 else {})

                def row(r: ir.Value, gen: _KernelGen = gen) -> None:
                    if gen.k.is_reduction:
                        gen.known[gen.k.reduce.buffer] = gen.reduce_points(r, 0)
                    else:
                        gen.row_points(r, k.shape)

                row(o) if block == 1 else loop(b, o, end, row)

        loop(b, lo, hi, rows_from, block)

    def row_points(self, o: ir.Value, rows: tuple[int, ...]) -> None:
        """A map stage's points of row o: the row's axes in row-major order, or one point."""
        b, shape = self.b, self.k.shape
        along = shape[len(rows):]
        index = unravel(b, o, rows)
        if prod(along) == 1:                               # one value per row
            values = self.point(index + [ir.Constant(I64, 0)] * len(along), o)
            self.known.update((buf, values[ins]) for buf, ins in self.k.stores)
            return
        start = b.mul(o, ir.Constant(I64, prod(along)))
        strides = row_major(along)

        def level(d: int, at: list[ir.Value]) -> None:
            if d == len(along):
                self.point(index + at, b.add(start, self.offset(at, strides)))
                return
            loop(b, ir.Constant(I64, 0), ir.Constant(I64, along[d]), lambda i: level(d + 1, at + [i]),
                 interleave=self.interleave(along[d]) if d == len(along) - 1 else 1)

        level(0, [])

    # -------------------------------------------------------- reductions

    def reduction(self, lo: ir.Value, hi: ir.Value) -> None:
        """For each result point o in [lo, hi): the reduced value in the canonical order.
        Where the reduced axis is strided and consecutive result points are consecutive in
        memory (a sum over a leading axis), LANES result points at a time are reduced side by
        side, each in its own canonical order, with vector loads across them."""
        self.each_point(lo, hi, self.reduce_points)

    def each_point(self, lo: ir.Value, hi: ir.Value, each: Callable[[ir.Value, int], Any]) -> None:
        """each(o, 0) for the kept points o in [lo, hi), or, where grain is LANES,
        each(o, LANES) for the runs of LANES of them within a row of the last kept axis."""
        outer = self.k.shape
        if grain(self.k) == 1:
            loop(self.b, lo, hi, lambda o: each(o, 0))
            return
        b = self.b
        at = self.slot(I64)
        b.store(lo, at)
        head, body, after = (b.append_basic_block(n) for n in ("points", "point", "points_done"))
        b.branch(head)
        b.position_at_end(head)
        o = b.load(at)
        b.cbranch(b.icmp_signed("<", o, hi), body, after)
        b.position_at_end(body)
        width = ir.Constant(I64, LANES)
        in_row = b.icmp_signed("<=", b.add(b.urem(o, ir.Constant(I64, outer[-1])), width),
                               ir.Constant(I64, outer[-1]))
        whole = b.and_(in_row, b.icmp_signed("<=", b.add(o, width), hi))
        with b.if_else(whole) as (vector, scalar):
            with vector:
                each(o, LANES)
                b.store(b.add(o, width), at)
            with scalar:
                each(o, 0)
                b.store(b.add(o, ir.Constant(I64, 1)), at)
        b.branch(head)
        b.position_at_end(after)

    def reduce_points(self, o: ir.Value, points: int) -> ir.Value:
        """Reduce result point o (points = 0), or the `points` consecutive ones from o, each in
        the canonical order."""
        r = self.k.reduce
        dtype = self.k.body[r.value].dtype
        b = self.b
        _, value_at = self.walk(o, r.value, points)
        # n passed (the kernel's own is then the largest of its class: size_free), or known
        n = ir.Constant(I64, self.k.n) if self.length is None else self.length
        result = self.reduce(n, value_at, dtype, r.combine, points, not points, levels(self.k.n))
        if r.count is not None:        # a mean (its count is n), also of nothing: 0 / 0 is NaN
            # (n converted as it runs, rounded as the constant float(n) would be)
            count = b.uitofp(n, SCALAR[dtype])
            result = b.fdiv(result, self.e.splat(count, points) if points else count)
        self.store(r.buffer, o, result, dtype)
        return result

    def walk(self, o: ir.Value, value: int, points: int) -> tuple[list[ir.Value], Callable]:
        """The index of a reduction's (or scan's) kept point o, and value_at(j, lanes, mask):
        the body's instruction `value` there at index j of the walked axis (lanes: the LANES
        consecutive j from it, those of the lanes mask sets where given); with `points`, of
        the `points` consecutive kept points from o."""
        b = self.b
        index = unravel(b, o, self.k.shape)
        base = {id(ins): self.offset(index, ins.load.strides[:-1], ins.load.offset)
                for ins in self.k.body if ins.load is not None}

        def value_at(j: ir.Value, lanes: int = 0, mask: ir.Value | None = None) -> ir.Value:
            offsets = lambda ins: b.add(base[id(ins)], b.mul(j, ir.Constant(I64, ins.load.strides[-1])))
            if points:          # one value for each of the points, at the same j
                return self.body(offsets, points, lambda ins: ins.load.strides[-2])[value]
            return self.body(offsets, lanes, lambda ins: ins.load.strides[-1], mask)[value]

        return index, value_at

    # -------------------------------------------------------- scans

    def scan(self, lo: ir.Value, hi: ir.Value) -> None:
        """For each kept point in [lo, hi), its line of the scanned axis in order (LANES
        consecutive points side by side where grain says so, each in its own order: with
        vector loads and stores where they are neighbours in memory, else element by
        element, where the step is long enough that its latency outweighs them)."""
        self.each_point(lo, hi, self.scan_points)

    def scan_points(self, o: ir.Value, points: int) -> None:
        """The scan of kept point o (points = 0), or of the `points` consecutive ones from o:
        y[0] = v[0], then y[j] = step(y[j-1], v[j]), each stored as it is made."""
        a, b, n = self.k.scan, self.b, self.k.n
        if not n:
            return
        dtype = self.k.body[a.value].dtype
        index, value_at = self.walk(o, a.value, points)
        out = self.offset(index, a.strides[:-1])
        acc = self.slot(ir.VectorType(SCALAR[dtype], points) if points else SCALAR[dtype])

        def put(j: ir.Value, y: ir.Value) -> None:
            at = b.add(out, b.mul(j, ir.Constant(I64, a.strides[-1])))
            self.store(a.buffer, at, y, dtype, a.strides[-2] if points else 1)
            b.store(y, acc)

        put(ir.Constant(I64, 0), value_at(ir.Constant(I64, 0)))
        loop(b, ir.Constant(I64, 1), ir.Constant(I64, n),
             lambda j: put(j, a.prim.step(self.e, b.load(acc), value_at(j), dtype)))

    def slot(self, ty: ir.Type, count: int = 1) -> ir.Value:
        """Stack memory allocated once at the function's entry, not once per loop iteration."""
        block = self.b.block
        entry = self.b.function.entry_basic_block
        self.b.position_at_start(entry)
        ptr = self.b.alloca(ty, size=ir.Constant(I64, count) if count != 1 else None)
        self.b.position_at_end(block)
        return ptr

    def combine(self, how: str, a: ir.Value, c: ir.Value, dtype: str) -> ir.Value:
        return self.e.combine(how, a, c, dtype)

    def identity(self, how: str, dtype: str) -> ir.Value:
        return self.e.const(identity(how, dtype), dtype)

    def reduce(self, n: ir.Value, value_at: Callable, dtype: str, how: str, points: int,
               whole: bool, depth: int) -> ir.Value:
        """Combine value_at(0 … n-1), n below CHUNK**depth, in the canonical order
        (ir/numerics.py): at most CHUNK values by lanes, else chunks of CHUNK (the last one
        shorter) by lanes, their results combined one at a time by this rule again. With
        `points`, value_at gives vectors of that many independent values, each combined in that
        order; where `whole`, value_at(j, LANES) gives LANES consecutive values at once. Each
        chunk's result is combined as soon as it is made, never stored: the stack a reduction
        needs does not grow with n. n may be known only at run time."""
        b = self.b

        def within(length: ir.Value, at: Callable, whole: bool) -> ir.Value:
            return self.lanes(length, at, dtype, how) if whole else \
                self.streamed(length, at, dtype, how, points)

        if depth == 1:
            return within(n, value_at, whole)
        chunk_size = ir.Constant(I64, CHUNK)
        result = self.slot(ir.VectorType(SCALAR[dtype], points) if points else SCALAR[dtype])
        with b.if_else(b.icmp_unsigned("<=", n, chunk_size)) as (short, long_):
            with short:
                b.store(within(n, value_at, whole), result)
            with long_:
                def chunk(c: ir.Value, _lanes: int = 0) -> ir.Value:
                    start = b.mul(c, chunk_size)
                    rest = b.sub(n, start)
                    length = b.select(b.icmp_unsigned("<", rest, chunk_size), rest, chunk_size)
                    return within(length, lambda j, *lanes: value_at(b.add(start, j), *lanes), whole)

                chunks = b.udiv(b.add(n, ir.Constant(I64, CHUNK - 1)), chunk_size)
                b.store(self.reduce(chunks, chunk, dtype, how, points, False, depth - 1), result)
        return b.load(result)

    def streamed(self, n: ir.Value, value_at: Callable, dtype: str, how: str,
                 points: int = 0) -> ir.Value:
        """lanes() one value at a time: element j goes to lane j mod LANES (a slot of LANES
        scalars, or of LANES vectors of `points` independent values), then the halving tree."""
        b = self.b
        ty = ir.VectorType(SCALAR[dtype], points) if points else SCALAR[dtype]
        acc = self.slot(ty, LANES)
        start = self.e.splat(self.identity(how, dtype), points) if points else self.identity(how, dtype)
        for lane in range(LANES):
            b.store(start, b.gep(acc, [ir.Constant(I64, lane)]))

        def element(j: ir.Value) -> None:
            ptr = b.gep(acc, [b.urem(j, ir.Constant(I64, LANES))])
            b.store(self.combine(how, b.load(ptr), value_at(j), dtype), ptr)

        loop(b, ir.Constant(I64, 0), n, element)
        lanes = [b.load(b.gep(acc, [ir.Constant(I64, lane)])) for lane in range(LANES)]
        width = LANES // 2
        while width:
            lanes = [self.combine(how, lanes[j], lanes[j + width], dtype) for j in range(width)]
            width //= 2
        return lanes[0]

    def lanes(self, n: ir.Value, value_at: Callable, dtype: str, how: str) -> ir.Value:
        """At most CHUNK values: LANES lanes left to right, then the halving tree."""
        b = self.b
        vty = ir.VectorType(SCALAR[dtype], LANES)
        acc_slot = self.slot(vty)
        b.store(self.e.splat(self.identity(how, dtype), LANES), acc_slot)
        lanes = ir.Constant(I64, LANES)
        full, rest = b.udiv(n, lanes), b.urem(n, lanes)
        start = b.mul(full, lanes)

        def block(k: ir.Value) -> None:
            j = b.mul(k, lanes)
            b.store(self.combine(how, b.load(acc_slot), value_at(j, LANES), dtype), acc_slot)

        loop(b, ir.Constant(I64, 0), full, block)
        # the rest as one block whose lanes past it read nothing past the row and combine the
        # identity, which leaves a lane as it was (x + -0.0, max(x, -inf)… are x): element by
        # element, through a vector in memory, the names MLP's loss (32 rows of 27) took
        # 10 µs on a Zen 4, and its training step 111 µs, 90 as one block
        with b.if_then(b.icmp_unsigned(">", rest, ir.Constant(I64, 0))):
            index = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
            inside = b.icmp_unsigned("<", index, self.e.splat(rest, LANES))
            v = b.select(inside, value_at(start, LANES, inside),
                         self.e.splat(self.identity(how, dtype), LANES))
            b.store(self.combine(how, b.load(acc_slot), v, dtype), acc_slot)
        acc = b.load(acc_slot)
        width = LANES // 2
        while width:
            low = b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(I32, width), list(range(width))))
            high = b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(I32, width),
                                                          list(range(width, 2 * width))))
            acc = self.combine(how, low, high, dtype)
            width //= 2
        return b.extract_element(acc, ir.Constant(I32, 0))


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a contiguous row-major array."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))
