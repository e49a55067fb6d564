"""Running the tensor IR through IREE (the optional extra `iree`): the function exported as MLIR
(ir/mlir.py), compiled by IREE's compiler for the host CPU (llvm-cpu, the host's features) and
run by IREE's runtime on NumPy buffers. Compiled modules live in the compile cache, keyed by
the MLIR text and IREE's version."""
from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

import numpy as np

from frontend.diagnostics import DslError
from ir.core import Function
from ir.mlir import to_mlir
from ir.ops.base import np_dtype
from runtime import cache

# IREE demotes f64 to f32 by default: its functions would then refuse f64 arguments
FLAGS = ("--iree-llvmcpu-target-cpu=host", "--iree-input-demote-f64-to-f32=false")
MISSING = ("device='iree' needs IREE's compiler and runtime: pip install 'dslc[iree]' "
           "(iree-base-compiler and iree-base-runtime)")


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


def compile_mlir(text: str) -> bytes:
    """An MLIR module compiled by IREE for this machine's CPU (a VM flatbuffer), cached; a
    DslError with IREE's first error where IREE cannot compile it."""
    k = cache.key("iree", version(), " ".join(FLAGS), text)
    found = cache.load(k, "vmfb")
    if found is not None:
        return found
    import iree.compiler
    try:
        vmfb = iree.compiler.compile_str(text, target_backends=["llvm-cpu"], extra_args=list(FLAGS))
    except iree.compiler.CompilerToolError as e:
        raise Refused(_first_error(str(e))) from None
    cache.store(k, vmfb, "vmfb")
    return vmfb


class Refused(DslError):
    """IREE's compiler failed on a module; `why` is its first error."""

    def __init__(self, why: str):
        super().__init__(None, f"IREE's compiler failed (target llvm-cpu): {why} (IREE's math "
                               "library lacks some functions: docs/numerics.md)")
        self.why = why


def _first_error(log: str) -> str:
    """The message of the first `error:` line of IREE's log, without the operation it prints."""
    line = next((ln for ln in log.splitlines() if "error: " in ln), log.strip())
    return line.split("error: ", 1)[-1].split(": %", 1)[0]


class Executable:
    """An IR function compiled by IREE, called on NumPy arrays as runtime/cpu.py's is."""

    def __init__(self, fn: Function, name: str = "k", params: list[str] | None = None):
        import iree.runtime
        self.function = fn
        self.mlir = to_mlir(fn, name, params)
        config = iree.runtime.Config("local-task")
        self.context = iree.runtime.SystemContext(config=config)
        module = iree.runtime.VmModule.copy_buffer(self.context.instance, compile_mlir(self.mlir))
        self.context.add_vm_module(module)
        self.entry = self.context.modules.module[name]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = [_argument(a, v.dtype) for a, v in zip(arrays, self.function.params, strict=True)]
        out = self.entry(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [_result(o, v.dtype, v.shape) for o, v in zip(outs, self.function.results, strict=True)]


def _argument(a: Any, dtype: str) -> np.ndarray:
    a = np.asarray(a, dtype=np_dtype(dtype), order="C")      # (ascontiguousarray makes 0-d 1-d)
    return a.view(np.int32) if dtype == "u32" else a          # MLIR's integers are signless


def _result(o: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(o.to_host() if hasattr(o, "to_host") else o)
    return np.array(a.view(np.uint32) if dtype == "u32" else a, dtype=np_dtype(dtype)).reshape(shape)
