"""The host target: every kernel of a program in one LLVM module, optimised at O3 for the
host CPU (no fast-math: the bits are the definition's), JIT-compiled with MCJIT."""
from __future__ import annotations

import ctypes
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from backend.llvm import kernel_function
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


def module_ir(kernels: list[LoopKernel]) -> ir.Module:
    module = ir.Module(name="dslc")
    module.triple = llvm.get_default_triple()
    for k in kernels:
        kernel_function(module, k)
    return module


def optimise(mod: llvm.ModuleRef) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    machine = target_machine()
    pb = llvm.create_pass_builder(machine, pto)
    pb.getModulePassManager().run(mod, pb)


class Compiled:
    """A JIT-compiled module; kernels are looked up by name. Object code comes from the
    on-disk cache when an entry for exactly this IR and machine exists."""

    def __init__(self, kernels: list[LoopKernel]):
        self.llvm_ir = str(module_ir(kernels))
        machine = target_machine()
        k = cache.key(self.llvm_ir, machine.triple, llvm.get_host_cpu_name(),
                      llvm.get_host_cpu_features().flatten(), "O3")
        cached = cache.load(k)
        mod = llvm.parse_assembly(self.llvm_ir)
        mod.verify()
        if cached is None:
            optimise(mod)
        self.engine = llvm.create_mcjit_compiler(mod, machine)
        self.engine.set_object_cache(lambda _, data: cache.store(k, data),
                                     lambda _: cached)
        self.engine.finalize_object()
        self.functions = {k.name: KernelFn(self.engine.get_function_address(k.name)) for k in kernels}
