"""The host target: kernels as MCJIT object code for the host CPU (no fast-math: the bits are
the definition's), one piece for each distinct kernel (backend/objects.py); runs of small
kernels are called through one run function, which their tables describe to it."""
from __future__ import annotations

import ctypes
import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import llvmlite.binding as llvm
from llvmlite import ir

from backend.llvm import I64, KERNEL_TYPE, kernel_function, loop
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


# A run's table, which runtime/cpu.py fills: RUN_HEADER words (its kernels' count and the
# address of its synchronisation block), then DESCRIPTOR words a kernel (its address, the slot
# of its first argument among the arguments, its extent, the most chunks it is cut into, its n
# and its grain), then the kernels' arguments end to end.
RUN_HEADER, DESCRIPTOR = 2, 6
SYNC_SLOT = 1
RUN_NAME = "dslc.run"


@dataclass(frozen=True)
class Run:
    """Kernels called one after another by one call of the run function (`dslc.run(i8**
    table, i64 thread, i64 threads)`, a task of backend/team.py): kernel i gets the arguments
    from offsets[i] on, ranges of [0, extents[i]) and its n, lengths[i]. One call from Python,
    not one per kernel. Everything is read from the table, nothing built into the code: one
    function runs every run of every program, at every batch size."""
    kernels: tuple[str, ...]
    offsets: tuple[int, ...]
    extents: tuple[int, ...]
    chunks: tuple[int, ...]         # the most chunks each kernel is worth cutting into
    grains: tuple[int, ...]         # what each kernel's chunks start on a multiple of
    lengths: tuple[int, ...]        # each kernel's n (backend/llvm.py's kernel_function)

    def header(self, addresses: list[int]) -> list[int]:
        """The table's words before the arguments, for kernels at these addresses (the
        synchronisation block's address 0, for the caller to fill)."""
        words = [len(self.kernels), 0]
        for j, at in enumerate(addresses):
            words += [at, self.offsets[j], self.extents[j], self.chunks[j], self.lengths[j],
                      self.grains[j]]
        return words


# How the threads of a run share it (a call for one thread runs the kernels whole, touching
# nothing else): the table's second word points at zeroed i64 words, each counter on its own
# cache line. Each kernel's range is cut into chunks (up to 4 a thread, no more than
# Run.chunks) that threads claim by an atomic add on the kernel's `claimed` counter;
# a chunk's points are computed whole by whoever claims it, so the bits do not depend on the
# threads. Nobody starts kernel i + 1 before kernel i's `done` counter reaches its chunks.
# Which threads join, and when the caller may go on, is the team's business (backend/team.py).
def sync_words(kernels: int) -> int:
    """i64 words of a run's synchronisation block."""
    return LINE * 2 * kernels


def module_ir(kernels: list[LoopKernel]) -> ir.Module:
    module = new_module("dslc")
    for k in kernels:
        kernel_function(module, k)
    return module


def new_module(name: str) -> ir.Module:
    module = ir.Module(name=name)
    module.triple = llvm.get_default_triple()
    return module


@functools.cache
def run_function() -> tuple[RunFn, int]:
    """The run function (callable from Python) and its address, compiled once per machine
    (each run was a piece of code of its own: a fifth of the GPT step's compile time)."""
    engine = jit((RUN_NAME,), _run_module, opt=1)
    _kept.append(engine)                    # (its code lives as long as the process)
    at = engine.get_function_address(RUN_NAME)
    return RunFn(at), at


_kept: list[llvm.ExecutionEngine] = []


def _run_module() -> ir.Module:
    module = new_module("dslc_run")
    table_type = ir.IntType(8).as_pointer().as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [table_type, I64, I64]), name=RUN_NAME)
    table, _, threads = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c = lambda n: ir.Constant(I64, n)
    word = lambda i: b.ptrtoint(b.load(b.gep(table, [i])), I64)
    count = word(c(0))
    sync = b.bitcast(b.load(b.gep(table, [c(SYNC_SLOT)])), I64.as_pointer())
    arguments = b.gep(table, [b.add(c(RUN_HEADER), b.mul(count, c(DESCRIPTOR)))])

    def described(j: ir.Value, field: int) -> ir.Value:
        return word(b.add(c(RUN_HEADER + field), b.mul(j, c(DESCRIPTOR))))

    def call(j: ir.Value, lo: ir.Value, hi: ir.Value) -> None:
        kernel = b.inttoptr(described(j, 0), KERNEL_TYPE.as_pointer())
        b.call(kernel, [b.gep(arguments, [described(j, 1)]), lo, hi, described(j, 4)])

    with b.if_then(b.icmp_signed("==", threads, c(1))):      # alone: no counters, no waits
        loop(b, c(0), count, lambda j: call(j, c(0), described(j, 2)))
        b.ret_void()
    per_thread = b.mul(threads, c(4))
    wait = wait_function(module)

    def kernel(j: ir.Value) -> None:
        claimed = b.gep(sync, [b.mul(j, c(2 * LINE))])
        done = b.gep(sync, [b.add(b.mul(j, c(2 * LINE)), c(LINE))])
        extent, grain = described(j, 2), described(j, 5)
        units = b.sdiv(b.add(extent, b.sub(grain, c(1))), grain)
        chunks = _min(b, described(j, 3), per_thread)
        head, body, after = (b.append_basic_block(x) for x in ("claim", "chunk", "done"))
        b.branch(head)
        b.position_at_end(head)
        chunk = b.atomic_rmw("add", claimed, c(1), "monotonic")
        b.cbranch(b.icmp_signed("<", chunk, chunks), body, after)
        b.position_at_end(body)
        lo, hi = (_min(b, b.mul(b.sdiv(b.mul(units, at), chunks), grain), extent)
                  for at in (chunk, b.add(chunk, c(1))))
        call(j, lo, hi)
        b.atomic_rmw("add", done, c(1), "release")
        b.branch(head)
        b.position_at_end(after)
        b.call(wait, [done, chunks])

    loop(b, c(0), count, kernel)
    b.ret_void()
    return module


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def optimise(mod: llvm.ModuleRef, opt: int = 3, machine: llvm.TargetMachine | None = None,
             slp: bool = True) -> None:
    """LLVM's pipeline at level `opt`, with the loop vectoriser, and the SLP vectoriser unless
    told not."""
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = True
    pto.slp_vectorization = slp
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
    the host CPU, its code generated at level `codegen` (opt's unless given): its object_code,
    linked; the engine this process holds already where there is one."""
    k = jit_key(key, opt, codegen)
    engine = _jitted.get(k)
    if engine is None:
        engine = _jitted[k] = link([object_code(key, build, opt, codegen)],
                                  opt if codegen is None else codegen)
    return engine


# each engine jit made, while it is used: a new batch size's native step (its segments' code
# is the same at every size) finds its engine here instead of reading and linking it again
_jitted: weakref.WeakValueDictionary[str, llvm.ExecutionEngine] = weakref.WeakValueDictionary()


def routine(name: str, build: Callable[[ir.Module], None], *dtypes: str) -> int:
    """The address of function `name`, which build adds to a module of its own (a routine the
    runtime calls: a scatter, a gather, a strided copy, an argmax), compiled once for the
    process and its engine kept; dtypes name what build's code depends on."""
    engine = _routines.get((name, dtypes))
    if engine is None:
        def made() -> ir.Module:
            module = ir.Module(name="_".join((name,) + dtypes))
            module.triple = llvm.get_default_triple()
            build(module)
            return module
        engine = _routines[(name, dtypes)] = jit((name,) + dtypes, made)
    return engine.get_function_address(name)


_routines: dict[tuple, llvm.ExecutionEngine] = {}   # kept for the process: called by address


def object_code(key: tuple[str, ...], build: Callable[[], ir.Module | str], opt: int = 3,
                codegen: int | None = None) -> bytes:
    """The host's object code for the module build() makes, as jit describes it: from the
    on-disk cache where there is an entry under key (which must name everything the module
    depends on) for this backend's code, the IR's (where the primitives' scalar bodies are)
    and this machine; then build() is not even called."""
    k = jit_key(key, opt, codegen)
    data = cache.load(k)
    if data is None:
        mod = llvm.parse_assembly(str(build()))
        mod.verify()
        optimise(mod, opt)
        data = target_machine(opt if codegen is None else codegen).emit_object(mod)
        cache.store(k, data)
    return data


def link(objects: list[bytes], codegen: int) -> llvm.ExecutionEngine:
    """One MCJIT engine holding these objects (a symbol one of them declares is the one
    another defines)."""
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine(codegen))
    for data in objects:
        engine.add_object_file(llvm.ObjectFileRef.from_data(data))
    engine.finalize_object()
    return engine


def jit_key(key: tuple[str, ...], opt: int = 3, codegen: int | None = None) -> str:
    """The compile cache's key of the object code jit(key, …, opt, codegen) makes."""
    if codegen is not None and codegen != opt:
        key = (*key, f"code generation at O{codegen}")
    return cache.key(*key, *machine_key(opt))


class Compiled:
    """Kernels, JIT-compiled, their addresses looked up by name: one piece of object code for
    each distinct one (backend/objects.py), their symbols made here unless given; `made` names
    the pieces compiled, neither linked in this process already nor found cached."""

    def __init__(self, kernels: list[LoopKernel], symbols: dict[str, str] | None = None):
        from backend import objects      # imported here: backend/objects.py imports this module
        symbols = objects.kernel_symbols(kernels) if symbols is None else symbols
        pieces = objects.pieces(kernels, symbols)
        self.linked, self.made = objects.link(pieces)       # (held: their engines stay)
        self.addresses = {k.name: self.linked[symbols[k.name]].addresses[symbols[k.name]]
                          for k in kernels}

    def function(self, name: str) -> KernelFn:
        """Kernel `name`, callable from Python (the runtime calls kernels by address, through
        the run function)."""
        return KernelFn(self.addresses[name])
