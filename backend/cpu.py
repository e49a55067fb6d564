"""The host target: every kernel of a program in one LLVM module, optimised at O3 for the
host CPU (no fast-math: the bits are the definition's), JIT-compiled with MCJIT; runs of
small kernels are called through one function each."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from backend.llvm import I32, I64, kernel_function
from backend.loops import LoopKernel
from runtime import cache

KernelFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64)
_lock = threading.Lock()
_initialised = False


def target_machine() -> llvm.TargetMachine:
    """A new target machine for the host CPU. Each use gets its own: an MCJIT engine takes
    ownership of the one it is given (sharing one crashes the process)."""
    global _initialised
    with _lock:
        if not _initialised:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            # a run's waiting thread yields through libc's sched_yield, named here for the JIT
            llvm.add_symbol("sched_yield", ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value)
            _initialised = True
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, jit=True)


@dataclass(frozen=True)
class Run:
    """Kernels called one after another by one function, `name(i8** table, i64 thread,
    i64 threads)`: kernel i gets the table from offsets[i] on and ranges of [0, extents[i]).
    Thread 0 (the caller) runs the whole run alone if it must; any thread t > 0 started with
    it joins whenever it is ready (`sync` below). One call from Python, not one per kernel."""
    name: str
    kernels: tuple[str, ...]
    offsets: tuple[int, ...]
    extents: tuple[int, ...]
    chunks: tuple[int, ...]         # the most chunks each kernel is worth cutting into
    grains: tuple[int, ...]         # what each kernel's chunks start on a multiple of


# How the threads of a run share it (a call for one thread runs the kernels whole, touching
# nothing else): the table's last slot points at zeroed i64 words, each counter on its own
# cache line. Each kernel's range is cut into chunks (up to 4 a thread, no more than
# Run.chunks) that threads claim by an atomic add on the kernel's `claimed` counter;
# a chunk's points are computed whole by whoever claims it, so the bits do not depend on the
# threads. Nobody starts kernel i + 1 before kernel i's `done` counter reaches its chunks. A
# thread t > 0 registers on `joined`; thread 0, after the last kernel, closes `joined` (a late
# thread then leaves at once) and waits until every thread that joined has `left`: the caller
# never waits for a thread the OS has not woken yet.
LINE = 8                        # i64 words a cache line
JOINED, LEFT = 0, LINE
CLOSED = 1 << 32
SPINS = 1 << 10                 # pauses before a waiting thread yields its core to the others


def sync_words(kernels: int) -> int:
    """i64 words of a run's synchronisation block."""
    return LINE * (2 + 2 * kernels)


def module_ir(kernels: list[LoopKernel], runs: tuple[Run, ...] = ()) -> ir.Module:
    module = ir.Module(name="dslc")
    module.triple = llvm.get_default_triple()
    entries = {k.name: kernel_function(module, k) for k in kernels}
    args = {k.name: len(k.buffers) for k in kernels}
    table_type = ir.IntType(8).as_pointer().as_pointer()
    wait = _wait_function(module) if runs else None
    for run in runs:
        for name in run.kernels:          # called, not copied: a copy would be compiled again
            entries[name].attributes.add("noinline")
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [table_type, I64, I64]), name=run.name)
        _run_body(fn, run, [entries[name] for name in run.kernels],
                  run.offsets[-1] + args[run.kernels[-1]], wait)
    return module


def _run_body(fn: ir.Function, run: Run, entries: list[ir.Function], sync_slot: int,
              wait: ir.Function) -> None:
    table, thread, threads = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c = lambda n: ir.Constant(I64, n)
    words = b.bitcast(b.load(b.gep(table, [c(sync_slot)])), I64.as_pointer())
    word = lambda i: b.gep(words, [c(i)])
    with b.if_then(b.icmp_signed("==", threads, c(1))):      # alone: no counters, no waits
        for entry, offset, extent in zip(entries, run.offsets, run.extents):
            b.call(entry, [b.gep(table, [c(offset)]), c(0), c(extent)])
        b.ret_void()
    helper = b.icmp_signed("!=", thread, c(0))
    with b.if_then(helper):
        joined = b.atomic_rmw("add", word(JOINED), c(1), "acq_rel")
        with b.if_then(b.icmp_signed(">=", joined, c(CLOSED))):
            b.ret_void()
    per_thread = b.mul(threads, c(4))
    for j, (entry, offset, extent, most, grain) in enumerate(zip(entries, run.offsets, run.extents,
                                                                  run.chunks, run.grains)):
        claimed, done = word(LINE * (2 + 2 * j)), word(LINE * (3 + 2 * j))
        units = c(-(-extent // grain))
        chunks = _min(b, c(most), per_thread)
        head, body, after = (b.append_basic_block(f"k{j}_{x}") for x in ("claim", "chunk", "done"))
        b.branch(head)
        b.position_at_end(head)
        chunk = b.atomic_rmw("add", claimed, c(1), "monotonic")
        b.cbranch(b.icmp_signed("<", chunk, chunks), body, after)
        b.position_at_end(body)
        lo, hi = (_min(b, b.mul(b.sdiv(b.mul(units, at), chunks), c(grain)), c(extent))
                  for at in (chunk, b.add(chunk, c(1))))
        b.call(entry, [b.gep(table, [c(offset)]), lo, hi])
        b.atomic_rmw("add", done, c(1), "release")
        b.branch(head)
        b.position_at_end(after)
        b.call(wait, [done, chunks])
    with b.if_then(helper):
        b.atomic_rmw("add", word(LEFT), c(1), "release")
        b.ret_void()
    joined = b.atomic_rmw("add", word(JOINED), c(CLOSED), "acq_rel")
    b.call(wait, [word(LEFT), joined])
    b.ret_void()


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _wait_function(module: ir.Module) -> ir.Function:
    """`wait(i64* word, i64 value)`: returns once the word holds value (an acquire load),
    spinning a while, then yielding (more threads than free cores must still progress)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64]), name="dslc.wait")
    fn.linkage = "internal"
    word, value = fn.args
    entry = fn.append_basic_block("entry")
    head, body, spin, give, step, done = (fn.append_basic_block(n) for n in
                                          ("test", "wait", "spin", "yield", "again", "done"))
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    spins = b.phi(I64)
    spins.add_incoming(ir.Constant(I64, 0), entry)
    b.cbranch(b.icmp_signed("==", b.load_atomic(word, "acquire", 8), value), done, body)
    b.position_at_end(body)
    b.cbranch(b.icmp_signed("<", spins, ir.Constant(I64, SPINS)), spin, give)
    b.position_at_end(spin)
    b.call(module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), [])), [])
    b.branch(step)
    b.position_at_end(give)
    b.call(ir.Function(module, ir.FunctionType(I32, []), name="sched_yield"), [])
    b.branch(step)
    b.position_at_end(step)
    spins.add_incoming(b.add(spins, ir.Constant(I64, 1)), step)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn


def optimise(mod: llvm.ModuleRef) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    machine = target_machine()
    pb = llvm.create_pass_builder(machine, pto)
    pb.getModulePassManager().run(mod, pb)


def address(a) -> int:
    """The address of a NumPy array's first element, the fast way where the array is a
    writable contiguous block (ctypes' own route is three times slower)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):          # read-only, strided or empty
        return a.ctypes.data


class Compiled:
    """A JIT-compiled module; kernels are looked up by name. Object code comes from the
    on-disk cache when an entry exists for exactly these kernels, this code generator and this
    machine: then no LLVM IR is even built."""

    def __init__(self, kernels: list[LoopKernel], runs: tuple[Run, ...] = ()):
        machine = target_machine()
        k = cache.key(repr(kernels), repr(runs), _generator_digest(), machine.triple,
                      llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), "O3")
        cached = cache.load(k)
        if cached is not None:
            self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(cached))
        else:
            mod = llvm.parse_assembly(str(module_ir(kernels, runs)))
            mod.verify()
            optimise(mod)
            self.engine = llvm.create_mcjit_compiler(mod, machine)
            self.engine.set_object_cache(lambda _, data: cache.store(k, data), lambda _: None)
        self.engine.finalize_object()
        self.functions = {name: KernelFn(self.engine.get_function_address(name))
                          for name in [k.name for k in kernels] + [r.name for r in runs]}


@functools.cache
def _generator_digest() -> str:
    """A digest of the code that turns loop IR into LLVM IR: a change to it must not reuse
    object code the old one made."""
    folder = Path(__file__).parent
    return hashlib.sha256(b"".join((folder / f).read_bytes() for f in
                                   ("cpu.py", "llvm.py", "loops.py", "mathlib.py"))).hexdigest()
