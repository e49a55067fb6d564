"""The NVPTX target: the kernels of the CPU backend's loop IR as PTX for NVIDIA GPUs.

Each kernel's function (backend/llvm.py) becomes a device function, called by a `__global__`
wrapper once per thread with the range [t, t+1) of the kernel's outer extent: a map's first
axis, or a reduction's result points. Every thread runs exactly the CPU's code for its part,
so the results are the CPU's bits (the reductions keep their canonical lanes and tree). The
math library is the CPU's; no call LLVM cannot select on NVPTX is emitted (ARCHITECTURE.md).
This mapping is correct first; tiling across threads and warps comes with the GPU runtime.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from backend.llvm import I8, I32, I64, kernel_function
from backend.loops import LoopKernel

TRIPLE = "nvptx64-nvidia-cuda"
ARCHES = {"sm_80": "+ptx70", "sm_90": "+ptx80"}
BLOCK = 256                                  # threads per block
MAX_GRID_X = 2 ** 31 - 1
_lock = threading.Lock()


@dataclass(frozen=True)
class Launch:
    """How a kernel is launched: its entry name, the extent its threads cover, and the grid."""
    entry: str
    extent: int
    block: int
    grid: int


def extent(k: LoopKernel) -> int:
    if not k.shape:
        return 1
    if k.is_reduction:
        total = 1
        for n in k.shape:
            total *= n
        return total
    return k.shape[0]


def launch(k: LoopKernel) -> Launch:
    n = extent(k)
    return Launch(f"{k.name}_gpu", n, BLOCK, max(1, -(-n // BLOCK)))


def _sreg(b: ir.IRBuilder, module: ir.Module, name: str) -> ir.Value:
    fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(I32, []), name=name)
    return b.zext(b.call(fn, []), I64)


def module_ir(kernels: list[LoopKernel]) -> ir.Module:
    """One NVPTX module holding a global wrapper per kernel."""
    module = ir.Module(name="dslc_gpu")
    module.triple = TRIPLE
    annotations = module.add_named_metadata("nvvm.annotations")
    for k in kernels:
        body = kernel_function(module, k)
        body.linkage = "internal"
        body.attributes.add("alwaysinline")         # (its loops function is already inlined)
        entry = launch(k).entry
        fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64])
        wrapper = ir.Function(module, fnty, name=entry)
        buffers, n = wrapper.args
        b = ir.IRBuilder(wrapper.append_basic_block("entry"))
        t = b.add(b.mul(_sreg(b, module, "llvm.nvvm.read.ptx.sreg.ctaid.x"),
                        _sreg(b, module, "llvm.nvvm.read.ptx.sreg.ntid.x")),
                  _sreg(b, module, "llvm.nvvm.read.ptx.sreg.tid.x"))
        with b.if_then(b.icmp_unsigned("<", t, n)):
            b.call(body, [buffers, t, b.add(t, ir.Constant(I64, 1))])
        b.ret_void()
        annotations.add(module.add_metadata([wrapper, "kernel", ir.Constant(I32, 1)]))
    return module


def ptx(kernels: list[LoopKernel], arch: str = "sm_90") -> str:
    """The PTX of the kernels for an architecture (sm_80 or sm_90)."""
    with _lock:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
    text = str(module_ir(kernels))
    machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, features=ARCHES[arch],
                                                                    opt=3)
    mod = llvm.parse_assembly(text)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(machine, pto)
    pb.getModulePassManager().run(mod, pb)
    return machine.emit_assembly(mod)


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
