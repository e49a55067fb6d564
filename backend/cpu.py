"""The host target: kernels as MCJIT object code for the host CPU (no fast-math: the bits are
the definition's), one piece for each distinct kernel (backend/objects.py); runs of small
kernels are called through one function each."""
from __future__ import annotations

import ctypes
import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable

import llvmlite.binding as llvm
from llvmlite import ir

from backend.llvm import I64, KERNEL_TYPE, kernel_function
from backend.loops import LoopKernel
from backend.team import LINE, wait_function
from runtime import cache

KernelFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64)         # (buffers, lo, hi, n): backend/llvm.py
RunFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64)
_lock = threading.Lock()
_initialised = False


def target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A new target machine for the host CPU, generating code at level `opt`. Each use gets
    its own: an MCJIT engine takes ownership of the one it is given (sharing one crashes the
    process)."""
    global _initialised
    with _lock:
        if not _initialised:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            # waiting threads yield through libc's sched_yield, and the team's helpers sleep on
            # futexes through its syscall (backend/team.py): named here for the JIT
            libc = ctypes.CDLL(None)
            for name in ("sched_yield", "syscall"):
                llvm.add_symbol(name, ctypes.cast(getattr(libc, name), ctypes.c_void_p).value)
            _initialised = True
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=opt, jit=True)


def machine_key(opt: int) -> tuple[str, ...]:
    """What object code made at level `opt` depends on besides its IR: the code that makes the
    IR (the backend's and the IR's, where the primitives' scalar bodies are) and this machine
    (read once: LLVM's CPU features take 0.8 ms, and each piece of object code asks)."""
    return cache.code_digest("backend", "ir"), cache.host(), f"O{opt}"


@dataclass(frozen=True)
class Run:
    """Kernels called one after another by one function, `name(i8** table, i64 thread,
    i64 threads)`, a task of backend/team.py: kernel i gets the table from offsets[i] on,
    ranges of [0, extents[i]) and its n, lengths[i]. One call from Python, not one per kernel.
    The extents, the chunks and the lengths are read from the table (size_words), not built
    into the code: a run's code serves every batch size."""
    name: str
    kernels: tuple[str, ...]
    offsets: tuple[int, ...]
    extents: tuple[int, ...]
    chunks: tuple[int, ...]         # the most chunks each kernel is worth cutting into
    grains: tuple[int, ...]         # what each kernel's chunks start on a multiple of
    lengths: tuple[int, ...]        # each kernel's n (backend/llvm.py's kernel_function)

    def size_words(self) -> tuple[int, ...]:
        """The table's words after its synchronisation slot: each kernel's extent, chunks
        and length."""
        return tuple(word for words in zip(self.extents, self.chunks, self.lengths)
                     for word in words)

    def size_free(self) -> Run:
        """The run less what its code reads from the table."""
        return dataclasses.replace(self, extents=(), chunks=(), lengths=())


# How the threads of a run share it (a call for one thread runs the kernels whole, touching
# nothing else): the table's slot after the kernels' points at zeroed i64 words, each counter
# on its own cache line. Each kernel's range is cut into chunks (up to 4 a thread, no more than
# Run.chunks) that threads claim by an atomic add on the kernel's `claimed` counter;
# a chunk's points are computed whole by whoever claims it, so the bits do not depend on the
# threads. Nobody starts kernel i + 1 before kernel i's `done` counter reaches its chunks.
# Which threads join, and when the caller may go on, is the team's business (backend/team.py).
def sync_words(kernels: int) -> int:
    """i64 words of a run's synchronisation block."""
    return LINE * 2 * kernels


def module_ir(kernels: list[LoopKernel], runs: tuple[Run, ...] = ()) -> ir.Module:
    module = new_module("dslc")
    entries = {k.name: kernel_function(module, k) for k in kernels}
    args = {k.name: len(k.buffers) for k in kernels}
    for run in runs:
        for name in run.kernels:          # called, not copied: a copy would be compiled again
            entries[name].attributes.add("noinline")
        run_function(module, run, [entries[name] for name in run.kernels],
                     run.offsets[-1] + args[run.kernels[-1]])
    return module


def new_module(name: str) -> ir.Module:
    module = ir.Module(name=name)
    module.triple = llvm.get_default_triple()
    return module


def declare_kernel(module: ir.Module, name: str) -> ir.Function:
    """A kernel function (backend/llvm.py's signature) defined in another module."""
    return ir.Function(module, KERNEL_TYPE, name=name)


def run_function(module: ir.Module, run: Run, entries: list[ir.Function], sync_slot: int) -> None:
    """The run's function, calling the kernels `entries`; its synchronisation block's address
    is in the table's slot sync_slot."""
    table_type = ir.IntType(8).as_pointer().as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [table_type, I64, I64]), name=run.name)
    _run_body(fn, run, entries, sync_slot)


def _run_body(fn: ir.Function, run: Run, entries: list[ir.Function], sync_slot: int) -> None:
    table, _, threads = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c = lambda n: ir.Constant(I64, n)
    words = b.bitcast(b.load(b.gep(table, [c(sync_slot)])), I64.as_pointer())
    word = lambda i: b.gep(words, [c(i)])
    size = lambda i: b.ptrtoint(b.load(b.gep(table, [c(sync_slot + 1 + i)])), I64)
    extents = [size(3 * j) for j in range(len(entries))]
    lengths = [size(3 * j + 2) for j in range(len(entries))]
    with b.if_then(b.icmp_signed("==", threads, c(1))):      # alone: no counters, no waits
        for entry, offset, extent, n in zip(entries, run.offsets, extents, lengths):
            b.call(entry, [b.gep(table, [c(offset)]), c(0), extent, n])
        b.ret_void()
    per_thread = b.mul(threads, c(4))
    for j, (entry, offset, extent, n, grain) in enumerate(zip(entries, run.offsets, extents,
                                                              lengths, run.grains)):
        claimed, done = word(LINE * 2 * j), word(LINE * (2 * j + 1))
        units = b.sdiv(b.add(extent, c(grain - 1)), c(grain))
        chunks = _min(b, size(3 * j + 1), per_thread)
        head, body, after = (b.append_basic_block(f"k{j}_{x}") for x in ("claim", "chunk", "done"))
        b.branch(head)
        b.position_at_end(head)
        chunk = b.atomic_rmw("add", claimed, c(1), "monotonic")
        b.cbranch(b.icmp_signed("<", chunk, chunks), body, after)
        b.position_at_end(body)
        lo, hi = (_min(b, b.mul(b.sdiv(b.mul(units, at), chunks), c(grain)), extent)
                  for at in (chunk, b.add(chunk, c(1))))
        b.call(entry, [b.gep(table, [c(offset)]), lo, hi, n])
        b.atomic_rmw("add", done, c(1), "release")
        b.branch(head)
        b.position_at_end(after)
        b.call(wait_function(b.module), [done, chunks])
    b.ret_void()


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def optimise(mod: llvm.ModuleRef, opt: int = 3, machine: llvm.TargetMachine | None = None) -> None:
    """LLVM's pipeline at level `opt`, with the loop and SLP vectorisers."""
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    machine = machine or target_machine(opt)
    pb = llvm.create_pass_builder(machine, pto)
    pb.getModulePassManager().run(mod, pb)


def address(a) -> int:
    """The address of a NumPy array's first element, the fast way where the array is a
    writable contiguous block (ctypes' own route is three times slower)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):          # read-only, strided or empty
        return a.ctypes.data


def jit(key: tuple[str, ...], build: Callable[[], ir.Module | str], opt: int = 3,
        codegen: int | None = None) -> llvm.ExecutionEngine:
    """An MCJIT engine for the module build() makes (or its text), optimised at level `opt` for
    the host CPU, its code generated at level `codegen` (opt's unless given). Its object code
    comes from the on-disk cache when there is an entry under key (which must name everything
    the module depends on) for this backend's code, the IR's (where the primitives' scalar
    bodies are) and this machine: then build() is not even called."""
    codegen = opt if codegen is None else codegen
    machine = target_machine(codegen)
    k = jit_key(key if codegen == opt else (*key, f"code generation at O{codegen}"), opt)
    cached = cache.load(k)
    if cached is not None:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        engine.add_object_file(llvm.ObjectFileRef.from_data(cached))
    else:
        mod = llvm.parse_assembly(str(build()))
        mod.verify()
        optimise(mod, opt)
        engine = llvm.create_mcjit_compiler(mod, machine)
        engine.set_object_cache(lambda _, data: cache.store(k, data), lambda _: None)
    engine.finalize_object()
    return engine


def jit_key(key: tuple[str, ...], opt: int = 3) -> str:
    """The compile cache's key of the object code jit(key, …, opt) makes."""
    return cache.key(*key, *machine_key(opt))


class Compiled:
    """Kernels and runs, JIT-compiled, looked up by name: one piece of object code for each
    distinct one (backend/objects.py), the kernels' symbols made here unless given;
    `made` names the pieces compiled, not found cached."""

    def __init__(self, kernels: list[LoopKernel], runs: tuple[Run, ...] = (),
                 symbols: dict[str, str] | None = None):
        from backend import objects      # imported here: backend/objects.py imports this module
        symbols = objects.kernel_symbols(kernels) if symbols is None else symbols
        pieces, symbols = objects.pieces(kernels, runs, symbols)
        self.engine, self.made = objects.link(pieces)
        # (looked up once a symbol: the GPT step's 180 kernels are 50 pieces)
        addresses = {s: self.engine.get_function_address(s) for s in set(symbols.values())}
        kernel_names = {k.name for k in kernels}
        self.functions = {name: (KernelFn if name in kernel_names else RunFn)(addresses[symbol])
                          for name, symbol in symbols.items()}
