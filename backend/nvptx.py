"""The NVPTX target: the loop IR's kernels, and the contraction kernel, as PTX for NVIDIA GPUs.

Every kernel computes exactly the bits the CPU backend computes (docs/numerics.md):

- A map kernel gives each thread one element (a grid-stride loop over the flattened space), so
  neighbouring threads read and write neighbouring addresses: coalesced accesses.
- A reduction kernel follows the canonical order of ir/numerics.py with warp shuffles: lane l
  of a warp combines elements l, l+32, l+64, … left to right, then `shfl.down` by 16, 8, 4, 2,
  1 is the halving tree (lane j ← lane j ⊕ lane j+s). Up to CHUNK elements, one warp reduces
  one result; beyond, one block does: its warps reduce the chunks, whose results wait in shared
  memory and are reduced again by the same rule (twice where there are more than CHUNK chunks).
- A scan kernel gives each thread one line of the scanned axis (one kept point, as a map
  gives it an element), which it walks in order: the CPU's sequence of steps, so its bits.
- A row kernel gives each row a warp (rows up to CHUNK long) or a block (longer ones), which
  runs its stages in order: a reduction stage as above, its value then in every thread's
  registers (`shfl.sync.idx` from lane 0, or through shared memory); a map stage over the
  row with the warp's lanes (the block's threads) striding the row; a per-row stage in every
  thread. A map stage's stores are seen by the later stages after `bar.warp.sync` (a barrier).
- The contraction kernel (C[b] = A[b] @ B[b]) is tiled through shared memory, double buffered:
  each thread owns an 8 × 8 block of C for the whole K loop and accumulates
  acc = fma(A[i, k], B[k, j], acc) from -0.0 in increasing k, the definition's order.
- The gather kernels (take and scatter_add) give each thread one element of the result, as a
  map does, with the indices prepared on the host: take copies out[o, p, j] = x[o, rows[p], j];
  scatter_add starts out[o, r, j] from x[o, r, j] and adds the slices of row r in index order,
  one rounding each (np.add.at's order, the CPU's backend/scatter.py), without atomics.
- A concatenation is one launch of the concat kernel per input, a thread per element of the
  input, each copying its element to its place in the result; a split of a tensor likewise
  copies each result from its place.
- The extreme kernels (argmax, argmin) give each thread one result, which walks its line of
  the axis in order, keeping the first extreme (the first NaN, as NumPy).
- The draw kernels (uniform, bernoulli, and split's keys) give each thread one element, which
  computes the Philox block its words are in and the element from them (docs/random.md): the
  reference's bits, with no fma (NVPTX fuses no multiply and add unless asked to).

The math library is the CPU's (backend/mathlib.py): no call LLVM cannot select on NVPTX is
emitted (ARCHITECTURE.md). Static shared memory stays under 48 KiB, blocks at 256 threads.
"""
from __future__ import annotations

import copy
import math
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import llvmlite.binding as llvm
from llvmlite import ir

from backend import draws
from backend.llvm import I8, I32, I64, SCALAR, Emitter, evaluate_body, memory_type, row_major, windowed
from backend.loops import Instr, LoopKernel
from ir.ops.base import Primitive
from ir.ops.index import Take
from ir.ops.reduce import ArgReduction, identity
from ir.ops.shape import Concat, Split
from ir.numerics import CHUNK, LANES

TRIPLE = "nvptx64-nvidia-cuda"
# The architectures PTX is built for, each with the first PTX ISA version that has it (the
# oldest driver that can load it); a GPU between two of them runs the older one's PTX.
ARCHES = {"sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78", "sm_90": "+ptx78",
          "sm_100": "+ptx86", "sm_120": "+ptx87"}
BLOCK = 256                                  # threads per block, every kernel
WARP = 32
MAX_BLOCKS = 65535 * 32                      # grids are grid-stride loops: more blocks add nothing
MAX_GRID_X = 2 ** 31 - 1
MAX_GRID_YZ = 65535
SHARED_LIMIT = 48 * 1024                     # static shared memory per block, every arch
MAX_SECOND_LEVEL = 1024                      # chunk-of-chunk results one block keeps
_lock = threading.Lock()

assert LANES == WARP, "the canonical lanes are one warp"


@dataclass(frozen=True)
class Launch:
    """How a kernel is launched: its entry name, the work items its grid covers (elements of
    a map, results of a reduction, lines of a scan), threads per block, blocks, and static
    shared memory."""
    entry: str
    extent: int
    block: int
    grid: int
    shared: int = 0


def extent(k: LoopKernel) -> int:
    return math.prod(k.shape) if k.shape else 1


def launch(k: LoopKernel) -> Launch:
    """The launch shape of a loop kernel's GPU entry (see the module docstring)."""
    n = extent(k)
    if not (k.is_reduction or k.is_rows):
        per_block = BLOCK                             # a thread per element
    elif k.n <= CHUNK:
        per_block = BLOCK // WARP                     # a warp per result
    else:
        per_block = 1                                 # a block per result
    return Launch(f"{k.name}_gpu", n, BLOCK, _grid(n, per_block), _shared_bytes(k))


def _grid(n: int, per_block: int) -> int:
    """Blocks for n work items, per_block to a block (grid-stride loops cover any beyond)."""
    return max(1, min(-(-n // per_block), MAX_BLOCKS))


def _levels(k: LoopKernel) -> tuple[int, int]:
    """A long reduction's (or row's) chunk count and chunk-of-chunks count (0, 0 when
    n ≤ CHUNK)."""
    if not (k.is_reduction or k.is_rows) or k.n <= CHUNK:
        return 0, 0
    chunks = -(-k.n // CHUNK)
    groups = -(-chunks // CHUNK)
    if groups > MAX_SECOND_LEVEL:
        raise ValueError(f"kernel {k.name}: a reduction of {k.n} elements is longer than the GPU "
                         f"kernel reduces in one block ({CHUNK * CHUNK * MAX_SECOND_LEVEL})")
    return chunks, groups


def _shared_bytes(k: LoopKernel) -> int:
    chunks, groups = _levels(k)
    if not chunks:
        return 0
    if k.is_rows:                  # each reduction stage's levels, and a slot for its value
        return sum(_shared_bytes(s) + _bytes(s.body[s.reduce.value].dtype)
                   for s in k.stages if s.is_reduction)
    size = _bytes(k.body[k.reduce.value].dtype)
    return size * (min(chunks, CHUNK) + (groups if groups > 1 else 0))


def _bytes(dtype: str) -> int:
    return {"bool": 1, "f16": 2, "f32": 4, "i32": 4, "u32": 4, "f64": 8, "i64": 8}[dtype]


# ---------------------------------------------------------------------------------------------
# Shared helpers: special registers, barriers, shuffles, loops


@dataclass(frozen=True)
class Target:
    """Where the kernels run: an NVIDIA GPU, or, to test the kernels' logic without one, the
    host, where each NVVM intrinsic becomes a call of the same type to `emulated.<name>` (a
    test provides them) and shared memory is ordinary memory."""
    triple: str
    shared: int                      # the address space of shared memory
    prefix: str = ""                 # before each NVVM intrinsic's name


GPU = Target(TRIPLE, 3)


def emulator() -> Target:
    return Target(llvm.get_default_triple(), 0, "emulated.")


class _Builder:
    """An IRBuilder for one GPU entry, with the NVPTX idioms the kernels are written in."""

    def __init__(self, fn: ir.Function, index: ir.IntType, target: Target):
        self.fn, self.module, self.ity, self.target = fn, fn.module, index, target
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.e = Emitter(self.b, self.module)

    def c(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, v)

    def _declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(ret, args), name)

    def nvvm(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return self._declare(self.target.prefix + name, ret, args)

    def sreg(self, name: str) -> ir.Value:
        """A special register (tid.x, ntid.x, ctaid.y, nctaid.z…) in the index type."""
        value = self.b.call(self.nvvm(f"llvm.nvvm.read.ptx.sreg.{name}", I32, []), [])
        return self.b.zext(value, self.ity) if self.ity.width > 32 else value

    def barrier(self) -> None:
        self.b.call(self.nvvm("llvm.nvvm.barrier0", ir.VoidType(), []), [])

    def shfl_down(self, value: ir.Value, delta: int) -> ir.Value:
        """The value of lane + delta of this warp (all 32 lanes take part)."""
        return self.shuffle("down", value, delta)

    def shfl_first(self, value: ir.Value) -> ir.Value:
        """Lane 0's value, in every lane of the warp (all 32 lanes take part)."""
        return self.shuffle("idx", value, 0)

    def warp_barrier(self) -> None:
        """The warp's lanes wait for each other; their memory accesses before it are seen after."""
        self.b.call(self.nvvm("llvm.nvvm.bar.warp.sync", ir.VoidType(), [I32]), [ir.Constant(I32, -1)])

    def shuffle(self, mode: str, value: ir.Value, lane: int) -> ir.Value:
        b = self.b
        shfl = self.nvvm(f"llvm.nvvm.shfl.sync.{mode}.i32", I32, [I32] * 4)
        call = lambda v: b.call(shfl, [ir.Constant(I32, -1), v, ir.Constant(I32, lane),
                                       ir.Constant(I32, WARP - 1)])
        width = {"half": 16, "float": 32, "double": 64}[str(value.type)]
        bits = b.bitcast(value, ir.IntType(width))
        if width == 16:
            out = b.trunc(call(b.zext(bits, I32)), ir.IntType(16))
        elif width == 32:
            out = call(bits)
        else:
            lo = call(b.trunc(bits, I32))
            hi = call(b.trunc(b.lshr(bits, ir.Constant(I64, 32)), I32))
            out = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
        return b.bitcast(out, value.type)

    def each_element(self, count: ir.Value, body: Callable[[ir.Value], None]) -> None:
        """body(i) for i in 0 … count-1, grid-stride: consecutive threads, consecutive i."""
        b = self.b
        first = b.add(b.mul(self.sreg("ctaid.x"), self.sreg("ntid.x")), self.sreg("tid.x"))
        step = b.mul(self.sreg("nctaid.x"), self.sreg("ntid.x"))
        self.loop(first, count, step, body, "elem")

    def loop(self, start: ir.Value, stop: ir.Value, step: ir.Value, body: Callable[[ir.Value], None],
             name: str = "i") -> None:
        """for (i = start; i < stop; i += step) body(i), signed compare."""
        b = self.b
        before = b.block
        head, inner, done = (self.fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(start.type, name)
        i.add_incoming(start, before)
        b.cbranch(b.icmp_signed("<", i, stop), inner, done)
        b.position_at_end(inner)
        body(i)
        i.add_incoming(b.add(i, step), b.block)
        b.branch(head)
        b.position_at_end(done)

    def shared(self, name: str, ty: ir.Type, count: int) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.module, ir.ArrayType(ty, count), name, addrspace=self.target.shared)
        g.linkage = "internal"
        g.initializer = ir.Constant(g.value_type, ir.Undefined)
        g.align = 16
        return g

    def slot(self, ty: ir.Type) -> ir.Value:
        """A local variable, allocated in the entry block (where LLVM turns it into registers)."""
        block = self.b.block
        self.b.position_at_start(self.fn.entry_basic_block)
        ptr = self.b.alloca(ty)
        self.b.position_at_end(block)
        return ptr

    def at(self, array: ir.Value, index: ir.Value) -> ir.Value:
        """&array[index] for a shared-memory array."""
        return self.b.gep(array, [ir.Constant(I32, 0), index], inbounds=True)


def _entry(module: ir.Module, name: str, params: list[ir.Type], annotations, max_threads: int
           ) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name=name)
    for arg in fn.args:
        if isinstance(arg.type, ir.PointerType):
            arg.add_attribute("noalias")
    annotations.add(module.add_metadata([fn, "kernel", ir.Constant(I32, 1)]))
    annotations.add(module.add_metadata([fn, "maxntidx", ir.Constant(I32, max_threads)]))
    return fn


# ---------------------------------------------------------------------------------------------
# Loop-IR kernels: maps and reductions


def _index_type(k: LoopKernel) -> ir.IntType:
    """32-bit index arithmetic where every offset and thread number fits (the GPU's integer
    units are 32-bit), else 64-bit."""
    largest = max([extent(k) * max(k.n, 1)] + [math.prod(s) for _, s in k.buffers])
    return I32 if largest < 2 ** 30 else I64


class _LoopKernelGen(_Builder):
    def __init__(self, fn: ir.Function, k: LoopKernel, target: Target):
        super().__init__(fn, _index_type(k), target)
        self.k, self.ptrs = k, list(fn.args)
        self.known: dict[int, ir.Value] = {}

    def body(self, offset_of: Callable) -> list[ir.Value]:
        """The kernel body's values, its loads at offset_of(load instruction)."""
        return evaluate_body(self.e, self.k, lambda ins: self.load(ins, offset_of(ins)))

    def load(self, ins: Instr, at: ir.Value) -> ir.Value:
        b = self.b
        if ins.load.buffer in self.known:             # a row kernel's value of this row
            return self.known[ins.load.buffer]
        if getattr(ins.load, "offset", 0):            # a view that starts inside its buffer
            at = b.add(at, self.c(ins.load.offset))
        v = b.load(b.gep(self.ptrs[ins.load.buffer], [at], inbounds=True))
        return b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if ins.dtype == "bool" else v

    def store(self, buffer: int, offset: ir.Value, value: ir.Value, dtype: str) -> None:
        if dtype == "bool":
            value = self.b.zext(value, I8)
        self.b.store(value, self.b.gep(self.ptrs[buffer], [offset], inbounds=True))

    def unravel(self, flat: ir.Value, shape: tuple[int, ...]) -> list[ir.Value]:
        index, rest = [], flat
        for d in reversed(shape):
            index.append(self.b.urem(rest, self.c(d)) if d != 1 else self.c(0))
            rest = self.b.udiv(rest, self.c(d)) if d != 1 else rest
        return index[::-1]

    def offset(self, index: list[ir.Value], strides: tuple[int, ...]) -> ir.Value:
        total = self.c(0)
        for i, s in zip(index, strides):
            if s:
                total = self.b.add(total, self.b.mul(i, self.c(s)))
        return total

    # -------------------------------------------------------- maps

    def map(self) -> None:
        """One element per thread, grid-stride: consecutive threads, consecutive elements."""
        shape = self.k.shape
        dense = row_major(shape)

        def point(i: ir.Value) -> None:
            index = self.unravel(i, shape)

            def load(ins: Instr) -> ir.Value:
                same = not ins.load.window and all(
                    s == r or n == 1 for s, r, n in zip(ins.load.strides, dense, shape))
                return windowed(self.e, ins, index,
                                lambda clamped: i if same else self.offset(clamped, ins.load.strides),
                                lambda offset: self.load(ins, offset))

            values = evaluate_body(self.e, self.k, load)
            for buf, ins in self.k.stores:
                self.store(buf, i, values[ins], self.k.body[ins].dtype)

        self.each_element(self.c(extent(self.k)), point)

    # -------------------------------------------------------- reductions

    def combine(self, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.e.combine(self.k.reduce.combine, a, c, self.dtype)

    @property
    def dtype(self) -> str:
        return self.k.body[self.k.reduce.value].dtype

    def warp_reduce(self, lane: ir.Value, count: ir.Value, value_at: Callable) -> ir.Value:
        """value_at(0 … count-1) combined in the canonical order by the 32 lanes of a warp:
        lane l takes l, l+32, … left to right, then the shuffle-down tree. Valid in lane 0."""
        b = self.b
        acc = self.slot(SCALAR[self.dtype])
        b.store(self.e.const(identity(self.k.reduce.combine, self.dtype), self.dtype), acc)
        self.loop(lane, count, self.c(WARP),
                  lambda j: b.store(self.combine(b.load(acc), value_at(j)), acc), "lane")
        value = b.load(acc)
        s = WARP // 2
        while s:
            value = self.combine(value, self.shfl_down(value, s))
            s //= 2
        return value

    def values_of(self, o: ir.Value, value: int | None = None) -> Callable[[ir.Value], ir.Value]:
        """Element j of the reduction (or scan) of kept point o: the body's instruction
        `value` (the reduced one by default) at the j-th index of the walked axis."""
        b, k = self.b, self.k
        index = self.unravel(o, k.shape)
        loads = [ins for ins in k.body if ins.load is not None]
        base = {id(ins): self.offset(index, ins.load.strides[:-1]) for ins in loads}
        value = k.reduce.value if value is None else value
        return lambda j: self.body(
            lambda ins: b.add(base[id(ins)], b.mul(j, self.c(ins.load.strides[-1]))))[value]

    def divided(self, value: ir.Value) -> ir.Value:
        """A mean's sum divided by its count."""
        count = self.k.reduce.count
        return self.b.fdiv(value, self.e.const(float(count), self.dtype)) if count is not None else value

    def warp_result(self, o: ir.Value, lane: ir.Value) -> ir.Value:
        """Result point o reduced by this warp; valid in lane 0."""
        return self.divided(self.warp_reduce(lane, self.c(self.k.n), self.values_of(o)))

    def block_result(self, o: ir.Value, lane: ir.Value, warp: ir.Value, done: Callable[[ir.Value], None]
                     ) -> None:
        """Result point o reduced by this block: its warps reduce chunks into `part`, warp 0
        reduces `part` (into `group` when there are more than CHUNK chunks, then reduces
        `group`) and calls done(result) in its branch, valid in lane 0. Ends with a barrier."""
        b, k = self.b, self.k
        chunks, groups = _levels(k)
        part = self.shared(f"{k.name}.part", SCALAR[self.dtype], min(chunks, CHUNK))
        group = self.shared(f"{k.name}.group", SCALAR[self.dtype], groups) if groups > 1 else None
        warp0 = b.icmp_unsigned("==", warp, self.c(0))
        is_lane0 = b.icmp_unsigned("==", lane, self.c(0))
        from_shared = lambda array: lambda j: b.load(self.at(array, j))
        value_at = self.values_of(o)

        def chunk(c: ir.Value, first: ir.Value) -> None:
            start = b.mul(c, self.c(CHUNK))
            size = b.sub(self.c(k.n), start)
            size = b.select(b.icmp_signed("<", size, self.c(CHUNK)), size, self.c(CHUNK))
            v = self.warp_reduce(lane, size, lambda j: value_at(b.add(start, j)))
            with b.if_then(is_lane0):
                b.store(v, self.at(part, b.sub(c, first)))

        def one_group(g: ir.Value) -> ir.Value:
            first = b.mul(g, self.c(CHUNK))
            stop = b.add(first, self.c(CHUNK))
            stop = b.select(b.icmp_signed("<", stop, self.c(chunks)), stop, self.c(chunks))
            self.loop(b.add(first, warp), stop, self.c(BLOCK // WARP), lambda c: chunk(c, first), "chunk")
            self.barrier()
            return b.sub(stop, first)

        if groups == 1:
            count = one_group(self.c(0))
            with b.if_then(warp0):
                done(self.divided(self.warp_reduce(lane, count, from_shared(part))))
        else:
            def each_group(g: ir.Value) -> None:
                count = one_group(g)
                with b.if_then(warp0):
                    v = self.warp_reduce(lane, count, from_shared(part))
                    with b.if_then(is_lane0):
                        b.store(v, self.at(group, g))
                self.barrier()
            self.loop(self.c(0), self.c(groups), self.c(1), each_group, "group")
            with b.if_then(warp0):
                done(self.divided(self.warp_reduce(lane, self.c(groups), from_shared(group))))
        self.barrier()                                # `part` is free for the next result

    def lanes(self) -> tuple[ir.Value, ir.Value, ir.Value]:
        """This thread's lane, warp in its block, and whether it is lane 0."""
        tid = self.sreg("tid.x")
        lane = self.b.urem(tid, self.c(WARP))
        return lane, self.b.udiv(tid, self.c(WARP)), self.b.icmp_unsigned("==", lane, self.c(0))

    def each_result(self, body: Callable[[ir.Value], None]) -> None:
        """body(o) for the result points (rows) of this warp, or of this block beyond CHUNK."""
        b = self.b
        if not _levels(self.k)[0]:
            warps = b.udiv(b.mul(self.sreg("nctaid.x"), self.sreg("ntid.x")), self.c(WARP))
            warp = b.udiv(b.add(b.mul(self.sreg("ctaid.x"), self.sreg("ntid.x")), self.sreg("tid.x")),
                          self.c(WARP))
            self.loop(warp, self.c(extent(self.k)), warps, body, "result")
        else:
            self.loop(self.sreg("ctaid.x"), self.c(extent(self.k)), self.sreg("nctaid.x"), body, "result")

    def reduction(self) -> None:
        b, r = self.b, self.k.reduce
        lane, warp, is_lane0 = self.lanes()

        def store(o: ir.Value, leader: ir.Value) -> Callable[[ir.Value], None]:
            def done(value: ir.Value) -> None:
                with b.if_then(leader):
                    self.store(r.buffer, o, value, self.dtype)
            return done

        if not _levels(self.k)[0]:                       # a warp per result
            self.each_result(lambda o: store(o, is_lane0)(self.warp_result(o, lane)))
        else:                                            # a block per result
            self.each_result(lambda o: self.block_result(o, lane, warp, store(o, is_lane0)))

    # -------------------------------------------------------- scans

    def scan(self) -> None:
        """A thread per kept point, grid-stride (so along a leading axis, coalesced), walking
        its line of the scanned axis in order: y[0] = v[0], y[j] = step(y[j-1], v[j])."""
        b, k, a = self.b, self.k, self.k.scan
        dtype = k.body[a.value].dtype
        acc = self.slot(SCALAR[dtype])

        def line(o: ir.Value) -> None:
            value_at = self.values_of(o, a.value)
            out = self.offset(self.unravel(o, k.shape), a.strides[:-1])

            def put(j: ir.Value, y: ir.Value) -> None:
                self.store(a.buffer, b.add(out, b.mul(j, self.c(a.strides[-1]))), y, dtype)
                b.store(y, acc)

            put(self.c(0), value_at(self.c(0)))
            step = lambda j: put(j, a.prim.step(self.e, b.load(acc), value_at(j), dtype))
            self.loop(self.c(1), self.c(k.n), self.c(1), step, "along")

        if k.n:
            self.each_element(self.c(extent(k)), line)

    # -------------------------------------------------------- row kernels

    def rows(self) -> None:
        """Each row's stages in order, by its warp (or block): see the module docstring."""
        b, k = self.b, self.k
        lane, warp, is_lane0 = self.lanes()
        by_block = bool(_levels(k)[0])
        first = b.icmp_unsigned("==", self.sreg("tid.x"), self.c(0)) if by_block else is_lane0
        sync = self.barrier if by_block else self.warp_barrier

        def row(o: ir.Value) -> None:
            known: dict[int, ir.Value] = {}
            for i, stage in enumerate(k.stages):
                gen = copy.copy(self)
                gen.k, gen.known = stage, known
                if stage.is_reduction:
                    known[stage.reduce.buffer] = gen.row_result(o, lane, warp, is_lane0, by_block)
                elif math.prod(stage.shape) == extent(k):       # one value per row, in every thread
                    values = gen.row_point(self.unravel(o, stage.shape))
                    with b.if_then(first):
                        for buf, at in stage.stores:
                            gen.store(buf, o, values[at], stage.body[at].dtype)
                    known.update((buf, values[at]) for buf, at in stage.stores)
                else:
                    step = BLOCK if by_block else WARP
                    at = self.unravel(o, k.shape)
                    along = stage.shape[len(k.shape):]

                    def element(j: ir.Value, gen: _LoopKernelGen = gen) -> None:
                        values = gen.row_point(at + gen.unravel(j, along))
                        offset = b.add(b.mul(o, self.c(k.n)), j)
                        for buf, ins in gen.k.stores:
                            gen.store(buf, offset, values[ins], gen.k.body[ins].dtype)

                    gen.loop(self.sreg("tid.x") if by_block else lane, self.c(k.n), self.c(step),
                             element, "element")
                    if i + 1 < len(k.stages):
                        sync()

        self.each_result(row)

    def row_result(self, o: ir.Value, lane: ir.Value, warp: ir.Value, is_lane0: ir.Value,
                   by_block: bool) -> ir.Value:
        """A reduction stage's value of row o, stored, and in every thread of the row."""
        b, r = self.b, self.k.reduce
        if not by_block:
            value = self.warp_result(o, lane)
            with b.if_then(is_lane0):
                self.store(r.buffer, o, value, self.dtype)
            return self.shfl_first(value)
        slot = self.shared(f"{self.k.name}.value", SCALAR[self.dtype], 1)
        leader = b.and_(b.icmp_unsigned("==", warp, self.c(0)), is_lane0)

        def done(value: ir.Value) -> None:
            with b.if_then(leader):
                self.store(r.buffer, o, value, self.dtype)
                b.store(value, self.at(slot, self.c(0)))

        self.block_result(o, lane, warp, done)                # (ends with a barrier)
        return b.load(self.at(slot, self.c(0)))

    def row_point(self, index: list[ir.Value]) -> list[ir.Value]:
        """A map stage's body at a point (of its space) of a row."""
        def load(ins: Instr) -> ir.Value:
            return windowed(self.e, ins, index, lambda clamped: self.offset(clamped, ins.load.strides),
                            lambda offset: self.load(ins, offset))

        return evaluate_body(self.e, self.k, load)


def _kernel_entry(module: ir.Module, k: LoopKernel, annotations, target: Target) -> None:
    params = [memory_type(dt).as_pointer() for dt, _ in k.buffers]
    _loop_kernel(_entry(module, launch(k).entry, params, annotations, BLOCK), k, target)


def kernel_function(module: ir.Module, k: LoopKernel, target: Target) -> ir.Function:
    """A loop kernel as a device function of its buffers, for a kernel that runs it inside
    (backend/persistent.py): every thread of the block calls it, its grid one block."""
    params = [memory_type(dt).as_pointer() for dt, _ in k.buffers]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name=f"{k.name}_step")
    fn.linkage = "internal"
    _loop_kernel(fn, k, target)
    return fn


def _loop_kernel(fn: ir.Function, k: LoopKernel, target: Target) -> None:
    gen = _LoopKernelGen(fn, k, target)
    if k.is_rows:
        gen.rows()
    elif k.is_reduction:
        gen.reduction()
    elif k.is_scan:
        gen.scan()
    else:
        gen.map()
    gen.b.ret_void()


# ---------------------------------------------------------------------------------------------
# The contraction kernel


@dataclass(frozen=True)
class MatmulTiles:
    """A block computes bm × bn of C, k in steps of bk through shared memory; each of its
    (bm/tm)·(bn/tn) threads owns tm × tn elements in 4-vectors: rows ty·4 + {0…3} (and, for
    tm = 8, bm/2 + ty·4 + {0…3}), columns likewise, so that its shared-memory reads are
    4-vectors without bank conflicts."""
    name: str
    bm: int
    bn: int
    tm: int
    tn: int
    bk: int = 8
    pad: int = 4                       # A is stored k-major with rows of bm + pad

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def shared_bytes(self, dtype: str) -> int:
        return 2 * self.bk * (self.bm + self.pad + self.bn) * _bytes(dtype)


# Large products take 128 × 128 tiles (8 × 8 per thread); products too small to give the GPU
# a few hundred such blocks take 64 × 64 tiles (4 × 4 per thread). The bits are the same.
TILES = (MatmulTiles("large", 128, 128, 8, 8), MatmulTiles("small", 64, 64, 4, 4))
ENOUGH_BLOCKS = 256


@dataclass(frozen=True)
class MatmulLaunch:
    entry: str
    grid: tuple[int, int, int]
    block: int
    shared: int


def matmul_entry(dtype: str, t: MatmulTiles) -> str:
    return f"dslc_matmul_{dtype}_{t.name}"


def matmul_launch(dtype: str, batch: int, m: int, n: int) -> MatmulLaunch:
    """The contraction kernel and launch shape for C [batch, m, n]."""
    grids = [(-(-n // t.bn), -(-m // t.bm), min(batch, MAX_GRID_YZ)) for t in TILES]
    large = grids[0][0] * grids[0][1] * grids[0][2] >= ENOUGH_BLOCKS
    t, grid = (TILES[0], grids[0]) if large else (TILES[1], grids[1])
    if grid[1] > MAX_GRID_YZ:
        raise ValueError(f"a matrix product of {m} rows is too tall for one launch")
    return MatmulLaunch(matmul_entry(dtype, t), grid, t.threads, t.shared_bytes(dtype))


def _matmul_entry(module: ir.Module, dtype: str, annotations, t: MatmulTiles, target: Target) -> None:
    """void dslc_matmul_T_TILES(const T *A, const T *B, T *C, i64 M, i64 N, i64 K, i64 a_stride,
    i64 b_stride, i64 c_stride, i64 batch): C[z] = A[z] @ B[z], row-major, the strides being
    the elements between batch entries (0 broadcasts). Launched by matmul_launch."""
    scalar = SCALAR[dtype]
    p = scalar.as_pointer()
    fn = _entry(module, matmul_entry(dtype, t), [p, p, p] + [I64] * 7, annotations, t.threads)
    A, B, C, M, N, K, sa, sb, sc, batch = fn.args
    g = _Builder(fn, I64, target)
    b, c = g.b, g.c
    a_row = t.bm + t.pad
    a_size, b_size = t.bk * a_row, t.bk * t.bn
    a_tiles = g.shared(f"{fn.name}.a", scalar, 2 * a_size)      # [buffer][k][row]
    b_tiles = g.shared(f"{fn.name}.b", scalar, 2 * b_size)      # [buffer][k][column]
    vec4 = ir.VectorType(scalar, 4)
    zero = ir.Constant(scalar, 0.0)
    fma = g._declare(f"llvm.fma.{'f32' if dtype == 'f32' else 'f64'}", scalar, [scalar] * 3)

    tid = g.sreg("tid.x")
    tx, ty = b.urem(tid, c(t.bn // t.tn)), b.udiv(tid, c(t.bn // t.tn))
    rows = [b.add(b.mul(ty, c(4)), c(i % 4 + (t.bm // 2) * (i // 4))) for i in range(t.tm)]
    cols = [b.add(b.mul(tx, c(4)), c(j % 4 + (t.bn // 2) * (j // 4))) for j in range(t.tn)]
    # ty·4 + {0…3} covers bm / (tm / 4) rows; with tm = 8 a second group lies bm/2 further on
    assert t.tm in (4, 8) and t.tn in (4, 8) and (t.bm // t.tm) * t.tm == t.bm
    loads_a, loads_b = (t.bm * t.bk) // t.threads, (t.bk * t.bn) // t.threads
    acc = g.slot(ir.ArrayType(scalar, t.tm * t.tn))               # registers once promoted
    staged = g.slot(ir.ArrayType(scalar, loads_a + loads_b))      # the next tile, in flight
    slot = lambda array, i: b.gep(array, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True)

    def one_product(z: ir.Value) -> None:
        a_base = b.gep(A, [b.mul(z, sa)], inbounds=True)
        b_base = b.gep(B, [b.mul(z, sb)], inbounds=True)
        c_base = b.gep(C, [b.mul(z, sc)], inbounds=True)
        i0, j0 = b.mul(g.sreg("ctaid.y"), c(t.bm)), b.mul(g.sreg("ctaid.x"), c(t.bn))
        for i in range(t.tm * t.tn):
            b.store(ir.Constant(scalar, -0.0), slot(acc, i))
        tiles = b.sdiv(b.add(K, c(t.bk - 1)), c(t.bk))

        # Thread tid fetches A[i0 + row, k0 + kk] and B[k0 + kk, j0 + col] for the (row, kk)
        # and (kk, col) below; outside the matrices it fetches 0, which no stored element uses.
        def a_element(q: int) -> tuple[ir.Value, ir.Value]:
            e = b.add(tid, c(q * t.threads))
            return b.udiv(e, c(t.bk)), b.urem(e, c(t.bk))

        def b_element(q: int) -> tuple[ir.Value, ir.Value]:
            e = b.add(tid, c(q * t.threads))
            return b.udiv(e, c(t.bn)), b.urem(e, c(t.bn))

        def fetch(tile: ir.Value) -> None:
            k0 = b.mul(tile, c(t.bk))
            for q in range(loads_a):
                row, kk = a_element(q)
                i, k = b.add(i0, row), b.add(k0, kk)
                inside = b.and_(b.icmp_signed("<", i, M), b.icmp_signed("<", k, K))
                at = b.select(inside, b.add(b.mul(i, K), k), c(0))
                b.store(b.select(inside, b.load(b.gep(a_base, [at], inbounds=True)), zero), slot(staged, q))
            for q in range(loads_b):
                kk, col = b_element(q)
                k, j = b.add(k0, kk), b.add(j0, col)
                inside = b.and_(b.icmp_signed("<", k, K), b.icmp_signed("<", j, N))
                at = b.select(inside, b.add(b.mul(k, N), j), c(0))
                b.store(b.select(inside, b.load(b.gep(b_base, [at], inbounds=True)), zero),
                        slot(staged, loads_a + q))

        def stage(buffer: ir.Value) -> None:
            for q in range(loads_a):
                row, kk = a_element(q)
                at = b.add(b.mul(buffer, c(a_size)), b.add(b.mul(kk, c(a_row)), row))
                b.store(b.load(slot(staged, q)), g.at(a_tiles, at))
            for q in range(loads_b):
                kk, col = b_element(q)
                at = b.add(b.mul(buffer, c(b_size)), b.add(b.mul(kk, c(t.bn)), col))
                b.store(b.load(slot(staged, loads_a + q)), g.at(b_tiles, at))

        def vectors(tiles_, base: ir.Value, first: list[ir.Value]) -> list[ir.Value]:
            """The 4-vectors at base + first[0] (and base + first[4]), as scalars."""
            out = []
            for start in first[::4]:
                ptr = b.bitcast(g.at(tiles_, b.add(base, start)), vec4.as_pointer(target.shared))
                v = b.load(ptr, align=16)
                out += [b.extract_element(v, ir.Constant(I32, x)) for x in range(4)]
            return out

        def step(buffer: ir.Value, kk: ir.Value) -> None:
            # ORDER: every element of this thread's block gains its k = k0 + kk term; the k
            # loop is outermost, so each element's fmas run in increasing k.
            a = vectors(a_tiles, b.add(b.mul(buffer, c(a_size)), b.mul(kk, c(a_row))), rows)
            bv = vectors(b_tiles, b.add(b.mul(buffer, c(b_size)), b.mul(kk, c(t.bn))), cols)
            for i in range(t.tm):
                for j in range(t.tn):
                    s = slot(acc, i * t.tn + j)
                    b.store(b.call(fma, [a[i], bv[j], b.load(s)]), s)

        def compute(tile: ir.Value) -> None:
            buffer = b.urem(tile, c(2))
            ahead = b.icmp_signed("<", b.add(tile, c(1)), tiles)
            with b.if_then(ahead):
                fetch(b.add(tile, c(1)))               # global loads in flight during the fmas
            kc = b.sub(K, b.mul(tile, c(t.bk)))
            with b.if_else(b.icmp_signed(">=", kc, c(t.bk))) as (whole, tail):
                with whole:
                    for kk in range(t.bk):
                        step(buffer, c(kk))
                with tail:                              # ORDER: K is never padded
                    g.loop(c(0), kc, c(1), lambda kk: step(buffer, kk), "kk")
            with b.if_then(ahead):
                stage(b.sub(c(1), buffer))
            g.barrier()

        with b.if_then(b.icmp_signed(">", tiles, c(0))):
            fetch(c(0))
            stage(c(0))
            g.barrier()
        g.loop(c(0), tiles, c(1), compute, "tile")
        for i in range(t.tm):
            for j in range(t.tn):
                row, col = b.add(i0, rows[i]), b.add(j0, cols[j])
                inside = b.and_(b.icmp_signed("<", row, M), b.icmp_signed("<", col, N))
                with b.if_then(inside):
                    b.store(b.load(slot(acc, i * t.tn + j)),
                            b.gep(c_base, [b.add(b.mul(row, N), col)], inbounds=True))

    g.loop(g.sreg("ctaid.z"), batch, g.sreg("nctaid.z"), one_product, "batch")
    b.ret_void()


# ---------------------------------------------------------------------------------------------
# The gather kernels: take and scatter_add (and concat's and split's, which copy slabs)


def gather_entry(prim: Primitive, dtype: str) -> str:
    return f"dslc_{prim.name}_{dtype}"


def gather_launch(prim: Primitive, dtype: str, n: int) -> Launch:
    """The gather kernel and launch shape for n elements (of the result; of one input for
    concat): a thread per element."""
    return Launch(gather_entry(prim, dtype), n, BLOCK, _grid(n, BLOCK))


def _gather_entry(module: ir.Module, prim: Primitive, dtype: str, annotations, target: Target) -> None:
    """With x [outer, size, inner], updates and take's result [outer, n, inner]:

    void dslc_take_T(const T *x, const i64 *rows, T *out, i64 outer, i64 n, i64 size, i64 inner):
        out[o, p, j] = x[o, rows[p], j]
    void dslc_scatter_add_T(const T *x, const i64 *order, const i64 *bounds, const T *updates,
                            T *out, i64 outer, i64 n, i64 size, i64 inner):
        out[o, r, j] = x[o, r, j] + updates[o, order[s], j] + …  for s = bounds[r] … bounds[r+1]-1

    rows in [0, size); order lists the slices of updates by destination row, in index order
    within a row, row r's being order[bounds[r] … bounds[r+1]-1]. Launched by gather_launch."""
    t = memory_type(dtype)
    data, ints = t.as_pointer(), I64.as_pointer()
    take = isinstance(prim, Take)                     # else scatter_add
    params = [data, ints, data] if take else [data, ints, ints, data, data]
    fn = _entry(module, gather_entry(prim, dtype), params + [I64] * 4, annotations, BLOCK)
    *pointers, outer, n, size, inner = fn.args
    g = _Builder(fn, I64, target)
    b = g.b
    # aligned to the element: without a data layout LLVM takes i64s as 4-aligned and splits them
    load = lambda array, i, of="i64": b.load(b.gep(array, [i], inbounds=True), align=_bytes(of))
    middle = n if take else size            # the result's own axis

    def element(e: ir.Value) -> None:
        j, rest = b.urem(e, inner), b.udiv(e, inner)
        m, o = b.urem(rest, middle), b.udiv(rest, middle)
        at = lambda count, row: b.add(b.mul(b.add(b.mul(o, count), row), inner), j)   # [o, row, j]
        if take:
            x, rows, out = pointers
            value = load(x, at(size, load(rows, m)), dtype)
        else:
            x, order, bounds, updates, out = pointers
            acc = g.slot(t)
            b.store(load(x, e, dtype), acc)
            # ORDER: row m's slices in index order, each added and rounded (np.add.at's order)
            g.loop(load(bounds, m), load(bounds, b.add(m, g.c(1))), g.c(1), lambda s: b.store(
                b.fadd(b.load(acc), load(updates, at(n, load(order, s)), dtype)), acc), "slice")
            value = b.load(acc)
        b.store(value, b.gep(out, [e], inbounds=True), align=_bytes(dtype))

    g.each_element(b.mul(outer, b.mul(middle, inner)), element)
    b.ret_void()


def _slab_entry(module: ir.Module, prim: Primitive, dtype: str, annotations, target: Target) -> None:
    """A slab [outer, n, inner] copied to (concat) or from (split) its place along the middle
    axis of a whole [outer, size, inner], a thread per element of the slab:

    void dslc_concat_T(const T *x, T *out, i64 outer, i64 n, i64 size, i64 inner, i64 start):
        out[o, start + p, j] = x[o, p, j]        (x an input, out the result)
    void dslc_split_T(const T *x, T *out, i64 outer, i64 n, i64 size, i64 inner, i64 start):
        out[o, p, j] = x[o, start + p, j]        (x the input, out a result)

    Launched by gather_launch for the slab's elements, once per slab with its start."""
    data = memory_type(dtype).as_pointer()
    fn = _entry(module, gather_entry(prim, dtype), [data, data] + [I64] * 5, annotations, BLOCK)
    x, out, outer, n, size, inner, start = fn.args
    g = _Builder(fn, I64, target)
    b = g.b

    def element(e: ir.Value) -> None:
        j, rest = b.urem(e, inner), b.udiv(e, inner)
        p, o = b.urem(rest, n), b.udiv(rest, n)
        placed = b.add(b.mul(b.add(b.mul(o, size), b.add(start, p)), inner), j)
        source, target_ = (e, placed) if isinstance(prim, Concat) else (placed, e)
        value = b.load(b.gep(x, [source], inbounds=True), align=_bytes(dtype))
        b.store(value, b.gep(out, [target_], inbounds=True), align=_bytes(dtype))

    g.each_element(b.mul(outer, b.mul(n, inner)), element)
    b.ret_void()


def _extreme_entry(module: ir.Module, prim: Primitive, dtype: str, annotations, target: Target) -> None:
    """With x [outer, n, inner] (n ≥ 1), a thread per result:

    void dslc_argmax_T(const T *x, i32 *out, i64 outer, i64 n, i64 inner):
        out[o, j] = the first p of the largest x[o, p, j], or of the first NaN   (argmin: smallest)

    Launched by gather_launch for the outer × inner results."""
    t = memory_type(dtype)
    fn = _entry(module, gather_entry(prim, dtype), [t.as_pointer(), I32.as_pointer()] + [I64] * 3,
                annotations, BLOCK)
    x, out, outer, n, inner = fn.args
    g = _Builder(fn, I64, target)
    b = g.b
    best, where = g.slot(t), g.slot(I64)

    def result(e: ir.Value) -> None:
        j, o = b.urem(e, inner), b.udiv(e, inner)
        at = lambda p: b.load(b.gep(x, [b.add(b.mul(b.add(b.mul(o, n), p), inner), j)], inbounds=True),
                              align=_bytes(dtype))
        b.store(at(g.c(0)), best)
        b.store(g.c(0), where)

        def step(p: ir.Value) -> None:
            v = at(p)
            wins = prim.wins(g.e, v, b.load(best), dtype)
            b.store(b.select(wins, v, b.load(best)), best)
            b.store(b.select(wins, p, b.load(where)), where)

        g.loop(g.c(1), n, g.c(1), step, "along")
        b.store(b.trunc(b.load(where), I32), b.gep(out, [e], inbounds=True), align=4)

    g.each_element(b.mul(outer, inner), result)
    b.ret_void()


# ---------------------------------------------------------------------------------------------
# The draw kernels: uniform, bernoulli and normal; the key kernels: split, fold_in and key
# (docs/random.md), a thread per element, each computed as backend/draws.py says


def _random_entry(module: ir.Module, prim: Primitive, dtype: str, annotations, target: Target) -> None:
    """A thread per element of a draw or per key (backend/draws.py's functions, as entries).
    Launched by gather_launch."""
    fn = _entry(module, gather_entry(prim, dtype), draws.params(prim, dtype), annotations, BLOCK)
    g = _Builder(fn, I64, target)
    n, store = draws.elements(g.b, prim, dtype, fn.args)
    g.each_element(n, store)
    g.b.ret_void()


# ---------------------------------------------------------------------------------------------
# Modules and PTX


def kernel_module(name: str, target: Target, module: ir.Module | None = None) -> tuple[ir.Module, Any]:
    """`module` (else a new one named `name` for target) and its nvvm.annotations, where each
    entry is marked a kernel."""
    if module is None:
        module = ir.Module(name=name)
        module.triple = target.triple
    return module, module.add_named_metadata("nvvm.annotations")


def module_ir(kernels: list[LoopKernel], matmuls: tuple[str, ...] = (), target: Target = GPU,
              gathers: tuple[tuple[str, str], ...] = ()) -> ir.Module:
    """One NVPTX module: a GPU entry per loop kernel, the contraction kernels for each dtype
    in `matmuls`, and a gather (or concat) kernel for each (primitive, dtype) in `gathers`."""
    module, annotations = kernel_module("dslc_gpu", target)
    for k in kernels:
        _kernel_entry(module, k, annotations, target)
    for dtype in matmuls:
        for t in TILES:
            _matmul_entry(module, dtype, annotations, t, target)
    for prim, dtype in gathers:
        entry = (_slab_entry if isinstance(prim, (Concat, Split))
                 else _random_entry if prim.random
                 else _extreme_entry if isinstance(prim, ArgReduction) else _gather_entry)
        entry(module, prim, dtype, annotations, target)
    return module


def ptx(kernels: list[LoopKernel], arch: str = "sm_90", matmuls: tuple[str, ...] = (),
        gathers: tuple[tuple[str, str], ...] = ()) -> str:
    """The PTX of the kernels (and contraction and gather kernels) for an architecture of
    ARCHES."""
    return assemble(str(module_ir(kernels, matmuls, gathers=gathers)), arch)


def assemble(module: str, arch: str) -> str:
    """An NVPTX module's LLVM IR (module_ir's text), optimised, as PTX for an architecture of
    ARCHES: the same IR gives each architecture its PTX."""
    if arch not in ARCHES:
        raise ValueError(f"unknown GPU architecture {arch!r}: one of {', '.join(ARCHES)}")
    with _lock:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, features=ARCHES[arch],
                                                                    opt=3)
    mod = llvm.parse_assembly(module)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(machine, pto)
    pb.getModulePassManager().run(mod, pb)
    return machine.emit_assembly(mod)


def arch_for(capability: tuple[int, int]) -> str:
    """The architecture a device of this compute capability runs: its own where ARCHES has it,
    else the newest one before it (the driver compiles PTX for any later GPU)."""
    older = [a for a in ARCHES if capability_of(a) <= capability]
    if not older:
        raise ValueError(f"sm_{capability[0]}{capability[1]} is older than {next(iter(ARCHES))}")
    return max(older, key=capability_of)


def capability_of(arch: str) -> tuple[int, int]:
    """sm_86 → (8, 6), sm_120 → (12, 0)."""
    digits = arch.removeprefix("sm_")
    return int(digits[:-1]), int(digits[-1])


def ptxas(text: str, arch: str = "sm_90") -> str:
    """Assemble PTX with ptxas (on the PATH); returns its report, raises on rejection."""
    exe = shutil.which("ptxas")
    if exe is None:
        raise FileNotFoundError("ptxas is not on the PATH")
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(text)
        r = subprocess.run([exe, f"-arch={arch}", "-v", str(src), "-o", str(Path(d) / "k.cubin")],
                           capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"ptxas rejected the PTX:\n{r.stderr}")
    return r.stderr
