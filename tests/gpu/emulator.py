"""The GPU kernels' own LLVM IR (backend/nvptx.py) run on the host, to test their logic where
there is no GPU: the module is built for the host with each NVVM intrinsic a callback, and
each thread of a block is a Python thread calling the JIT-compiled kernel. Barriers are
threading.Barriers; a warp shuffle is an exchange through the warp's slots between two waits.
Only the NVPTX code generation and the hardware are left out."""
from __future__ import annotations

import ctypes
import threading

import llvmlite.binding as llvm
import numpy as np

from backend import nvptx
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
for _name, _fn in _CALLBACKS.items():
    llvm.add_symbol(_name, ctypes.cast(_fn, ctypes.c_void_p).value)


class Emulator:
    """The kernels, contraction and gather kernels of one module, JIT-compiled for the host."""

    def __init__(self, kernels, matmuls: tuple[str, ...] = (), gathers: tuple[tuple[str, str], ...] = ()):
        mod = llvm.parse_assembly(str(nvptx.module_ir(kernels, matmuls, nvptx.emulator(), gathers)))
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
