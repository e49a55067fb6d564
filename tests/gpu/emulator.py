"""The GPU kernels' own LLVM IR (backend/nvptx.py) run on the host, to test their logic where
there is no GPU: the module is built for the host with each NVVM intrinsic a callback, and
each thread of a block is a Python thread calling the JIT-compiled kernel. Barriers are
threading.Barriers; a warp shuffle is an exchange through the warp's slots between two waits,
and so is a tensor-core `mma`: each lane gives its fragments, and each computes its part of D
from the whole A, B and C, which it reads through the PTX ISA's fragment layouts (written out
here, apart from backend/tensorcore.py's). Only the NVPTX code generation and the hardware are
left out."""
from __future__ import annotations

import ctypes
import threading

import llvmlite.binding as llvm
import ml_dtypes
import numpy as np

from backend import nvptx, persistent, tensorcore
from backend.cpu import optimise, target_machine

SREGS = ("tid.x", "ntid.x", "ctaid.x", "nctaid.x", "ctaid.y", "nctaid.y", "ctaid.z", "nctaid.z")
WAIT = 30.0                              # seconds: a barrier not all threads reach is a bug
_state = threading.local()
_errors: list[str] = []


def _sreg(name: str):
    return ctypes.CFUNCTYPE(ctypes.c_int32)(lambda: _state.regs[name])


def _barrier() -> None:
    try:
        _state.block.wait(WAIT)
    except threading.BrokenBarrierError:
        _errors.append(f"a barrier of block {_state.regs['ctaid.x']} was not reached by every thread")


def _shfl_down(mask: int, value: int, delta: int, clamp: int) -> int:
    lane, slots, wait = _state.lane, _state.slots, _state.warp
    slots[lane] = value
    try:
        wait.wait(WAIT)
        out = slots[lane + delta] if lane + delta <= clamp else value
        wait.wait(WAIT)
    except threading.BrokenBarrierError:
        _errors.append("a shuffle was not reached by every lane of its warp")
        return value
    return out


def _shfl_idx(mask: int, value: int, source: int, clamp: int) -> int:
    lane, slots, wait = _state.lane, _state.slots, _state.warp
    slots[lane] = value
    try:
        wait.wait(WAIT)
        out = slots[source]
        wait.wait(WAIT)
    except threading.BrokenBarrierError:
        _errors.append("a shuffle was not reached by every lane of its warp")
        return value
    return out


def _warp_barrier(mask: int) -> None:
    try:
        _state.warp.wait(WAIT)
    except threading.BrokenBarrierError:
        _errors.append("a warp barrier was not reached by every lane of its warp")


_CALLBACKS = {f"emulated.llvm.nvvm.read.ptx.sreg.{r}": _sreg(r) for r in SREGS}
_CALLBACKS["emulated.llvm.nvvm.shfl.sync.idx.i32"] = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)(_shfl_idx)
_CALLBACKS["emulated.llvm.nvvm.bar.warp.sync"] = ctypes.CFUNCTYPE(None, ctypes.c_int32)(_warp_barrier)
_CALLBACKS["emulated.llvm.nvvm.barrier0"] = ctypes.CFUNCTYPE(None)(_barrier)
_CALLBACKS["emulated.llvm.nvvm.shfl.sync.down.i32"] = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)(_shfl_down)


def _exchange(value):
    """Every lane's value, in lane order, once all 32 have given theirs."""
    lane, slots, wait = _state.lane, _state.slots, _state.warp
    slots[lane] = value
    try:
        wait.wait(WAIT)
        out = list(slots)
        wait.wait(WAIT)
    except threading.BrokenBarrierError:
        _errors.append("an mma was not reached by every lane of its warp")
        return [value] * nvptx.WARP
    return out


def _halves(register: int, dtype) -> list[float]:
    """A register's two 16-bit elements, the low half first."""
    return [float(np.array([register >> s & 0xFFFF], np.uint16).view(dtype)[0]) for s in (0, 16)]


def _tf32(register: int) -> float:
    return float(np.array([register & 0xFFFFFFFF], np.uint32).view(np.float32)[0])


def _fragments(lanes, k: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [16, k], B [k, 8] and C [16, 8] from every lane's (a, b, c) registers: the PTX ISA's
    layouts of mma.m16n8k16 (16-bit elements, two a register) and mma.m16n8k8 (tf32)."""
    a, b, c = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
    for lane, (ra, rb, rc) in enumerate(lanes):
        g, t = lane // 4, lane % 4
        for e, v in enumerate(rc):                      # c0, c1: row g; c2, c3: row g + 8
            c[g + 8 * (e // 2), 2 * t + e % 2] = v
        if k == 16:
            for r, reg in enumerate(ra):                # a0..a7: rows g, g+8, g, g+8; k 2t(+1), +8
                a[g + 8 * (r % 2), 2 * t + 8 * (r // 2):2 * t + 8 * (r // 2) + 2] = _halves(reg, dtype)
            for r, reg in enumerate(rb):                # b0..b3: k 2t(+1), 2t + 8(+1); column g
                b[2 * t + 8 * r:2 * t + 8 * r + 2, g] = _halves(reg, dtype)
        else:
            for r, reg in enumerate(ra):                # a0..a3: (g, t), (g+8, t), (g, t+4), (g+8, t+4)
                a[g + 8 * (r % 2), t + 4 * (r // 2)] = _tf32(reg)
            for r, reg in enumerate(rb):                # b0, b1: (t, g), (t + 4, g)
                b[t + 4 * r, g] = _tf32(reg)
    return a, b, c


def _mma(k: int, dtype):
    """D = A @ B + C for the warp, each element the exact sum rounded once to f32 (the hardware
    may round more often: docs/numerics.md's bound allows for it); this lane's D in d."""
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, d) -> None:
        lanes = _exchange(((a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3)))
        a, b, c = _fragments(lanes, k, dtype)
        out = (a @ b + c).astype(np.float32)          # products exact in f64; sums of 17 terms nearly
        g, t = _state.lane // 4, _state.lane % 4
        for e in range(4):
            d[e] = out[g + 8 * (e // 2), 2 * t + e % 2]
    return ctypes.CFUNCTYPE(None, *[ctypes.c_uint32] * 6, *[ctypes.c_float] * 4,
                            ctypes.POINTER(ctypes.c_float))(mma)


def _f2tf32(x: float) -> int:
    """cvt.rna.tf32.f32: to 10 fraction bits, ties away from zero; inf and NaN as they are."""
    bits = int(np.array([x], np.float32).view(np.uint32)[0])
    if bits & 0x7F800000 == 0x7F800000:
        return bits
    return (bits + 0x1000) & 0xFFFFE000


_MMA_FUNCTIONS = {"llvm.nvvm.mma.m16n8k16.row.col.bf16": _mma(16, ml_dtypes.bfloat16),
                  "llvm.nvvm.mma.m16n8k16.row.col.f32.f32": _mma(16, np.float16),
                  "llvm.nvvm.mma.m16n8k8.row.col.tf32": _mma(8, None)}
for _name, _fn in _MMA_FUNCTIONS.items():
    _CALLBACKS[f"emulated.mma.{_name}"] = _fn
_CALLBACKS["emulated.llvm.nvvm.f2tf32.rna"] = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_float)(_f2tf32)


def _mma_bridges() -> str:
    """LLVM IR that defines each emulated mma intrinsic (a struct of 4 floats from vector or
    integer registers) as a call of its callback, which takes integers and writes D through a
    pointer, as ctypes can."""
    out = []
    for name, mma in tensorcore.MMAS.items():
        reg, intrinsic = str(mma.register), mma.intrinsic
        params = ", ".join([f"{reg} %r{i}" for i in range(6)] + [f"float %c{i}" for i in range(4)])
        casts = "\n".join(f"  %i{i} = bitcast {reg} %r{i} to i32" for i in range(6))
        args = ", ".join([f"i32 %i{i}" for i in range(6)] + [f"float %c{i}" for i in range(4)])
        loads = "\n".join(f"  %p{e} = getelementptr [4 x float], ptr %d, i32 0, i32 {e}\n"
                          f"  %v{e} = load float, ptr %p{e}\n"
                          f"  %s{e + 1} = insertvalue {{float, float, float, float}} %s{e}, float %v{e}, {e}"
                          for e in range(4))
        out.append(f"""
declare void @"emulated.mma.{intrinsic}"({", ".join(["i32"] * 6 + ["float"] * 4)}, ptr)
define {{float, float, float, float}} @"emulated.{intrinsic}"({params}) {{
  %d = alloca [4 x float]
{casts}
  call void @"emulated.mma.{intrinsic}"({args}, ptr %d)
  %s0 = insertvalue {{float, float, float, float}} undef, float 0.0, 0
{loads}
  ret {{float, float, float, float}} %s4
}}""")
    return "\n".join(out)


for _name, _fn in _CALLBACKS.items():
    llvm.add_symbol(_name, ctypes.cast(_fn, ctypes.c_void_p).value)


class Emulator:
    """The kernels, contraction, gather, tensor-core and persistent fold kernels of one module,
    JIT-compiled for the host."""

    def __init__(self, kernels, matmuls: tuple[str, ...] = (), gathers: tuple[tuple[str, str], ...] = (),
                 mmas: tuple[str, ...] = (), folds: tuple = ()):
        module = nvptx.module_ir(kernels, matmuls, nvptx.emulator(), gathers)
        mod = llvm.parse_assembly(str(persistent.module_ir(folds, nvptx.emulator(), module)))
        if mmas:
            mod.link_in(llvm.parse_assembly(str(tensorcore.module_ir(mmas, nvptx.emulator()))))
            mod.link_in(llvm.parse_assembly(_mma_bridges()))
        mod.verify()
        optimise(mod)
        self.engine = llvm.create_mcjit_compiler(mod, target_machine())
        self.engine.finalize_object()

    def launch(self, entry: str, grid: tuple[int, int, int], block: int, pointers: list[int],
               integers: list[int] = ()) -> None:
        """Run every block of the grid, one after another (shared memory is one global per
        module), each as `block` threads; raises if a barrier or shuffle was left hanging."""
        types = [ctypes.c_void_p] * len(pointers) + [ctypes.c_int64] * len(integers)
        fn = ctypes.CFUNCTYPE(None, *types)(self.engine.get_function_address(entry))
        _errors.clear()
        for z in range(grid[2]):
            for y in range(grid[1]):
                for x in range(grid[0]):
                    self._block(fn, (x, y, z), grid, block, [*pointers, *integers])
        if _errors:
            raise AssertionError(_errors[0])

    @staticmethod
    def _block(fn, at, grid, block, args) -> None:
        barrier = threading.Barrier(block)
        warps = [(threading.Barrier(nvptx.WARP), [0] * nvptx.WARP) for _ in range(block // nvptx.WARP)]

        def thread(t: int) -> None:
            _state.regs = {"tid.x": t, "ntid.x": block, "ctaid.x": at[0], "nctaid.x": grid[0],
                           "ctaid.y": at[1], "nctaid.y": grid[1], "ctaid.z": at[2], "nctaid.z": grid[2]}
            _state.block = barrier
            _state.warp, _state.slots = warps[t // nvptx.WARP]
            _state.lane = t % nvptx.WARP
            fn(*args)

        threads = [threading.Thread(target=thread, args=(t,)) for t in range(block)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


def address(a: np.ndarray) -> int:
    return a.ctypes.data
