"""Running the tensor IR through IREE (the optional extra `iree`): the function exported as MLIR
(ir/mlir.py), compiled by IREE's compiler for a target (the host CPU: llvm-cpu with the host's
features; or a GPU: IREE's CUDA backend for an sm architecture) and run by IREE's runtime on
NumPy buffers. Compiled modules live in the compile cache, keyed by the MLIR text, the target
and IREE's version."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from frontend.diagnostics import DslError
from ir.core import Function
from ir.mlir import to_mlir
from ir.ops.base import EvalError, np_dtype
from runtime import cache

# IREE demotes f64 to f32 by default: its functions would then refuse f64 arguments
KEEP_F64 = "--iree-input-demote-f64-to-f32=false"
MISSING = ("device='iree' needs IREE's compiler and runtime: pip install 'dslc[iree]' "
           "(iree-base-compiler and iree-base-runtime)")


@dataclass(frozen=True)
class Target:
    """What IREE compiles for: its compiler's backend and flags, and the runtime's driver."""
    backend: str
    flags: tuple[str, ...]
    driver: str


HOST = Target("llvm-cpu", ("--iree-llvmcpu-target-cpu=host", KEEP_F64), "local-task")


def cuda_target(arch: str) -> Target:
    """IREE's CUDA backend for the GPU architecture arch (sm_80: PTX the driver runs there
    and on every newer GPU)."""
    return Target("cuda", (f"--iree-cuda-target={arch}", KEEP_F64), "cuda")


@functools.cache
def version() -> str:
    """The versions of IREE's compiler and runtime, or a DslError saying how to install them."""
    try:
        return f"{metadata.version('iree-base-compiler')}/{metadata.version('iree-base-runtime')}"
    except metadata.PackageNotFoundError:
        raise DslError(None, MISSING) from None


def usable() -> bool:
    try:
        version()
    except DslError:
        return False
    return True


def compile_mlir(text: str, target: Target = HOST) -> bytes:
    """An MLIR module compiled by IREE for target (a VM flatbuffer), cached; a DslError with
    IREE's first error where IREE cannot compile it."""
    k = cache.key("iree", version(), target.backend, " ".join(target.flags), text)
    found = cache.load(k, "vmfb")
    if found is not None:
        return found
    import iree.compiler
    try:
        vmfb = iree.compiler.compile_str(text, target_backends=[target.backend],
                                         extra_args=list(target.flags))
    except iree.compiler.CompilerToolError as e:
        raise Refused(_first_error(str(e)), target) from None
    cache.store(k, vmfb, "vmfb")
    return vmfb


class Refused(DslError):
    """IREE's compiler failed on a module; `why` is its first error."""

    def __init__(self, why: str, target: Target = HOST):
        super().__init__(None, f"IREE's compiler failed (target {target.backend}): {why} (IREE's "
                               "math library lacks some functions: docs/numerics.md)")
        self.why = why


def _first_error(log: str) -> str:
    """The message of the first `error:` line of IREE's log, without the operation it prints."""
    line = next((ln for ln in log.splitlines() if "error: " in ln), log.strip())
    return line.split("error: ", 1)[-1].split(": %", 1)[0]


@functools.cache
def gpu_target() -> Target:
    """IREE's CUDA backend for this machine's GPU: its architecture as runtime/cuda.py reads
    it, sm_80 where that cannot (PTX that the driver compiles for any newer GPU); a DslError
    where IREE's runtime finds no GPU."""
    from runtime import cuda
    target = cuda_target(cuda.arch(cuda.driver()) if cuda.usable() else "sm_80")
    runtime_config(target)
    return target


@functools.cache
def runtime_config(target: Target) -> Any:
    """IREE's runtime for target's driver (one a process: it holds the device); a DslError
    where it has no device (a CUDA target on a machine without a GPU)."""
    import iree.runtime
    try:
        return iree.runtime.Config(target.driver)
    except RuntimeError as e:
        raise DslError(None, f"IREE's runtime has no device for target {target.backend} here "
                             f"(driver '{target.driver}': {e})") from None


class Executable:
    """An IR function compiled by IREE for target, called on NumPy arrays as runtime/cpu.py's is."""

    def __init__(self, fn: Function, name: str = "k", params: list[str] | None = None,
                 target: Target = HOST):
        import iree.runtime
        self.function = fn
        self.mlir = to_mlir(fn, name, params)
        config = runtime_config(target)
        self.context = iree.runtime.SystemContext(config=config)
        module = iree.runtime.VmModule.copy_buffer(self.context.instance,
                                                   compile_mlir(self.mlir, target))
        self.context.add_vm_module(module)
        self.entry = self.context.modules.module[name]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = [_argument(a, v.dtype) for a, v in zip(arrays, self.function.params, strict=True)]
        try:
            out = self.entry(*args)
        except RuntimeError as e:                 # a cf.assert that failed: assert_finite's
            failed = re.search(r"FAILED_PRECONDITION; (.*)", str(e), re.S)
            raise EvalError(failed[1].strip() if failed else f"IREE's runtime failed: {e}") from None
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [_result(o, v.dtype, v.shape) for o, v in zip(outs, self.function.results, strict=True)]


def _argument(a: Any, dtype: str) -> np.ndarray:
    a = np.asarray(a, dtype=np_dtype(dtype), order="C")      # (ascontiguousarray makes 0-d 1-d)
    return a.view(np.int32) if dtype == "u32" else a          # MLIR's integers are signless


def _result(o: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(o.to_host() if hasattr(o, "to_host") else o)
    return np.array(a.view(np.uint32) if dtype == "u32" else a, dtype=np_dtype(dtype)).reshape(shape)
