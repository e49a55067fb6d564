"""A persistent kernel for a fold whose body is small: the whole scan in one launch of one
block, instead of a launch per kernel of the body at every step.

The block runs the body's steps in order at every step of the scan, each a loop kernel called
as a device function (backend/nvptx.py's kernel_function, its grid-stride loops covering the
work with the block's threads) or a product computed by the block, element by element with
the contraction's fma order; a barrier (`bar.sync`) after each step makes its results seen by
the next. The state and every value the body makes live in shared memory: the state twice, an
iteration reading one copy and writing the next, so that a state result may be any value of
the body, a parameter included. The scanned slices are read in place, and what a step emits
is copied into its place in the stacked results.

The rule (backend/gpu_plan.py's fold_kernel, docs/gpu.md): a fold's body is small when
every step of its plan is a loop kernel without shared memory of its own, an exact f32 or
f64 product of operands not broadcast along batch axes, a reshape, a strided copy or a value
made once (an argument of the kernel); when the state twice and the body's values fit in
ARENA bytes of shared memory; and when a step of the scan is at most WORK elements and
multiply-adds, so that one block does it at least as fast as the launches it saves cost.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from backend import nvptx
from backend.llvm import I8, I64, SCALAR, memory_type
from backend.loops import LoopKernel
from backend.nvptx import BLOCK, GPU, Launch, Target, _Builder, _entry, kernel_module

ARENA = 32 * 1024           # bytes of shared memory for the state (twice) and the body's values
WORK = 1 << 18              # elements and multiply-adds of one step of the scan, at most
ALIGN = 16                  # bytes: each value's place in the arena starts at a multiple


@dataclass(frozen=True)
class Place:
    """Where a value is at step t of the scan (iteration i): argument `arg`'s memory, or the
    shared arena (arg = -1), at offset + t · per_step bytes, and, for the state
    (parity 0 or 1), in the copy of parity (i + parity) % 2, state_bytes further on."""
    arg: int
    offset: int = 0
    per_step: int = 0
    parity: int | None = None


@dataclass(frozen=True)
class Call:
    """A loop kernel of the body on its buffers."""
    kernel: LoopKernel
    places: tuple[Place, ...]


@dataclass(frozen=True)
class Product:
    """c[z] = a[z] @ b[z] ([m, k] @ [k, n]; a_stride, b_stride elements between batch entries)."""
    dtype: str
    m: int
    n: int
    k: int
    a_stride: int
    b_stride: int
    batch: int
    places: tuple[Place, Place, Place]


@dataclass(frozen=True)
class Copy:
    """count elements of dtype from one place to another."""
    source: Place
    target: Place
    dtype: str
    count: int


@dataclass(frozen=True)
class FoldKernel:
    """One fold's persistent kernel: its entry takes a pointer for each of the fold's inputs
    (state, scanned, constants) and outputs (state, stacked), then for each value its body
    makes once (gpu_plan.made_once_ops), in that order."""
    entry: str
    length: int
    reverse: bool
    pointers: int
    state_bytes: int
    arena: int
    start: tuple[Copy, ...]            # the initial state into copy 0
    steps: tuple[Call | Product, ...]
    results: tuple[Copy, ...]          # the body's results into the next state and the stacked slots
    end: tuple[Copy, ...]              # the last state out

    @property
    def launch(self) -> Launch:
        return Launch(self.entry, 1, BLOCK, 1, self.arena)


# ---------------------------------------------------------------------------------------------
# The kernel


def module_ir(folds: tuple[FoldKernel, ...], target: Target = GPU, module: ir.Module | None = None) -> ir.Module:
    """A module of these persistent kernels: `module` with them added, else a new one."""
    module, annotations = kernel_module("dslc_folds", target, module)
    for fold in folds:
        _fold_entry(module, fold, annotations, target)
    return module


def _fold_entry(module: ir.Module, fold: FoldKernel, annotations, target: Target) -> None:
    """void NAME_fold(i8 *inputs and outputs…), launched as one block of BLOCK threads."""
    fn = _entry(module, fold.entry, [I8.as_pointer()] * fold.pointers, annotations, BLOCK)
    g = _Builder(fn, I64, target)
    b, c = g.b, g.c
    arena = b.gep(g.shared(f"{fold.entry}.arena", I8, fold.arena), [c(0), c(0)], inbounds=True)
    if target.shared:                      # a generic pointer to it, as the kernels take
        arena = b.addrspacecast(arena, I8.as_pointer())
    kernels: dict[str, ir.Function] = {}

    def at(place: Place, i: ir.Value, t: ir.Value, dtype: str) -> ir.Value:
        offset = b.add(c(place.offset), b.mul(t, c(place.per_step)))
        if place.parity is not None:
            half = b.urem(b.add(i, c(place.parity)), c(2))
            offset = b.add(offset, b.mul(half, c(fold.state_bytes)))
        base = arena if place.arg < 0 else fn.args[place.arg]
        return b.bitcast(b.gep(base, [offset], inbounds=True), memory_type(dtype).as_pointer())

    def copy(copies: tuple[Copy, ...], i: ir.Value, t: ir.Value) -> None:
        for cp in copies:
            source, target_ = at(cp.source, i, t, cp.dtype), at(cp.target, i, t, cp.dtype)
            g.each_element(c(cp.count), lambda e: b.store(
                b.load(b.gep(source, [e], inbounds=True)), b.gep(target_, [e], inbounds=True)))
        g.barrier()

    def run(step: Call | Product, i: ir.Value, t: ir.Value) -> None:
        if isinstance(step, Product):
            _multiply(g, step, *(at(p, i, t, step.dtype) for p in step.places))
        else:
            k = step.kernel
            if k.name not in kernels:
                kernels[k.name] = nvptx.kernel_function(module, k, target)
            b.call(kernels[k.name], [at(p, i, t, dt) for p, (dt, _) in zip(step.places, k.buffers)])
        g.barrier()

    def iteration(i: ir.Value) -> None:
        t = b.sub(c(fold.length - 1), i) if fold.reverse else i
        for step in fold.steps:
            run(step, i, t)
        copy(fold.results, i, t)

    copy(fold.start, c(0), c(0))
    g.loop(c(0), c(fold.length), c(1), iteration, "step")
    copy(fold.end, c(fold.length), c(0))
    b.ret_void()


def _multiply(g: _Builder, p: Product, a: ir.Value, bm: ir.Value, out: ir.Value) -> None:
    """out[z, i, j] = fma(a[z, i, k], b[z, k, j], …) over increasing k from -0.0, a thread per
    element: the contraction's order, so its bits (docs/numerics.md)."""
    b, c = g.b, g.c
    scalar = SCALAR[p.dtype]
    fma = g._declare(f"llvm.fma.{p.dtype}", scalar, [scalar] * 3)
    load = lambda ptr, e: b.load(b.gep(ptr, [e], inbounds=True))

    def element(e: ir.Value) -> None:
        j, rest = b.urem(e, c(p.n)), b.udiv(e, c(p.n))
        i, z = b.urem(rest, c(p.m)), b.udiv(rest, c(p.m))
        row = b.add(b.mul(z, c(p.a_stride)), b.mul(i, c(p.k)))
        column = b.add(b.mul(z, c(p.b_stride)), j)
        acc = g.slot(scalar)
        b.store(ir.Constant(scalar, -0.0), acc)
        g.loop(c(0), c(p.k), c(1), lambda k: b.store(b.call(fma, [
            load(a, b.add(row, k)), load(bm, b.add(column, b.mul(k, c(p.n)))), b.load(acc)]), acc), "k")
        b.store(b.load(acc), b.gep(out, [e], inbounds=True))

    g.each_element(c(p.batch * p.m * p.n), element)
