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

from backend.llvm import I64, kernel_function
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
            _initialised = True
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, jit=True)


@dataclass(frozen=True)
class Run:
    """Kernels called one after another by one function, `name(i8** table, i64, i64)` (the
    kernels' own signature; the range is not used): kernel i gets the table from offsets[i] on
    and its whole range [0, extents[i]). One call from Python instead of one per kernel."""
    name: str
    kernels: tuple[str, ...]
    offsets: tuple[int, ...]
    extents: tuple[int, ...]


def module_ir(kernels: list[LoopKernel], runs: tuple[Run, ...] = ()) -> ir.Module:
    module = ir.Module(name="dslc")
    module.triple = llvm.get_default_triple()
    entries = {k.name: kernel_function(module, k) for k in kernels}
    table_type = ir.IntType(8).as_pointer().as_pointer()
    for run in runs:
        for name in run.kernels:          # called, not copied: a copy would be compiled again
            entries[name].attributes.add("noinline")
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [table_type, I64, I64]), name=run.name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        for name, offset, extent in zip(run.kernels, run.offsets, run.extents):
            b.call(entries[name], [b.gep(fn.args[0], [ir.Constant(I64, offset)]),
                                   ir.Constant(I64, 0), ir.Constant(I64, extent)])
        b.ret_void()
    return module


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
