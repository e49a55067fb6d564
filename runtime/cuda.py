"""Running compiled code on an NVIDIA GPU: the plan of backend/schedule.py walked by the one
executor of runtime/executor.py, as the CPU runtime's is, with device memory for buffers and
the PTX kernels that backend/gpu_plan.py lowers it to (which kernel runs each step, its
launch shape and integer arguments).

The PTX is loaded through pycuda (`module_from_buffer`) where it is installed, else through
NVIDIA's `cuda.bindings`; both sit behind one small driver interface. Tensors stay on the
GPU between the steps of a program, and a call returns `DeviceArray`s, which stay there
until `np.asarray(x)` or `x.numpy()` copies them to the host; passing one back in (the
parameters of a training loop) copies nothing. Other frameworks' CUDA tensors come in and
DeviceArrays go out by DLPack or the CUDA array interface, sharing device memory (`borrow`,
`DeviceArray.__dlpack__`). Kernel steps and contractions run on the GPU.
Transposes, broadcasts, indexing and slices run as strided-copy kernels, reshapes only
re-label the device buffer. `take` and `scatter_add` run as gather kernels: only their
integer indices come to the host, to be checked there as the interpreter checks them and
made into the kernels' int64 arrays. A concatenation (a split) is a launch of the concat
(split) kernel for each input (result); a uniform, bernoulli or normal draw, a key, or a
key's split or fold_in, a launch of its Philox kernel; an argmax or argmin a launch of its
extreme kernel. A fold whose body is small runs as one launch of its persistent kernel
(backend/persistent.py); another runs its body's kernels step by step, its state and slices
on the device. The other host steps (an f64 normal draw…) still run on the host, with a copy each
way. A failed allocation or launch
is a DslError naming the kernel, and a wait for the GPU gives up after DSLC_CUDA_TIMEOUT seconds (default
120) rather than hang.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import time
from typing import Any

import numpy as np

from backend import draws, extreme, nvptx, scatter
from backend.gpu_plan import (
    Product,
    compile_ptx,
    gather_rows,
    gpu_kernels,
    gpu_schedule,
    made_once_ops,
    segments,
)
from backend.loops import LoopKernel
from backend.schedule import ContractStep, HostStep, KernelStep, Plan, Step, last_uses, made_once
from frontend.diagnostics import DslError
from ir import interp
from ir.core import Function, Op, Value
from ir.interp import EvalError
from ir.ops.base import NUMPY_DTYPES, np_dtype
from ir.ops.control import Checkpoint, Scan
from ir.ops.index import ScatterAdd, Take
from ir.ops.random import Key, KeySplit
from ir.ops.reduce import ArgReduction
from ir.ops.shape import Concat, Rearrange, Split
from ir.passes import for_backends
from runtime import dlpack, executor


class DriverError(Exception):
    """A CUDA driver call that failed: which call, and the driver's words for why."""


DEVICE = 0          # the ordinal of the GPU the runtime opens, and whose memory it shares


# ---------------------------------------------------------------------------------------------
# Drivers: the few CUDA calls the runtime makes, through pycuda or cuda.bindings


class BindingsDriver:
    """The CUDA driver API through NVIDIA's cuda.bindings (cuda-python)."""
    name = "cuda.bindings"
    graphs = True                     # it can capture and replay CUDA graphs
    stream: Any = 0                   # where launches go: the legacy stream, or one capturing
    capture_stream: Any = None

    def __init__(self):
        from cuda.bindings import driver as cu
        self.cu = cu
        self._call("cuInit", 0)
        if self._call("cuDeviceGetCount") < 1:
            raise DriverError("the CUDA driver sees no GPU")
        self.device = self._call("cuDeviceGet", DEVICE)
        self.context = self._call("cuDevicePrimaryCtxRetain", self.device)
        self._call("cuCtxSetCurrent", self.context)
        attr = cu.CUdevice_attribute
        self.capability = (self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device),
                           self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device))
        self.device_name = self._call("cuDeviceGetName", 256, self.device).split(b"\0")[0].decode()

    def _call(self, name: str, *args: Any) -> Any:
        err, *out = getattr(self.cu, name)(*args)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            _, text = self.cu.cuGetErrorString(err)
            raise DriverError(f"{name}: {text.decode() if text else err}")
        return out[0] if len(out) == 1 else out or None

    def load(self, ptx: str) -> Any:
        image = ctypes.create_string_buffer(ptx.encode())
        return self._call("cuModuleLoadData", ctypes.addressof(image))

    def function(self, module: Any, name: str) -> Any:
        return self._call("cuModuleGetFunction", module, name.encode())

    def alloc(self, nbytes: int) -> int:
        return int(self._call("cuMemAlloc", nbytes))

    def free(self, ptr: int) -> None:
        self._call("cuMemFree", ptr)

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self._call("cuMemcpyHtoD", ptr, array.ctypes.data, array.nbytes)

    def download(self, array: np.ndarray, ptr: int) -> None:
        self._call("cuMemcpyDtoH", array.ctypes.data, ptr, array.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._call("cuMemcpyDtoD", dst, src, nbytes)

    def launch(self, fn: Any, grid: tuple[int, int, int], block: int, pointers: list[int],
               integers: list[int]) -> None:
        values = [ctypes.c_void_p(p) for p in pointers] + [ctypes.c_int64(i) for i in integers]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self._call("cuLaunchKernel", fn, *grid, block, 1, 1, 0, self.stream, ctypes.addressof(params), 0)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def begin_capture(self) -> None:
        """Launches from now on are recorded into a graph instead of run, on a stream of our
        own (the legacy stream cannot capture; ours is blocking, so it keeps the legacy
        stream's order). Relaxed: an allocation while capturing is allowed."""
        if self.capture_stream is None:
            self.capture_stream = self._call("cuStreamCreate", 0)
        self._call("cuStreamBeginCapture", self.capture_stream,
                   self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
        self.stream = self.capture_stream

    def end_capture(self) -> Any:
        """The launches recorded since begin_capture, as an executable graph."""
        self.stream = 0
        graph = self._call("cuStreamEndCapture", self.capture_stream)
        try:
            return self._call("cuGraphInstantiate", graph, 0)
        finally:
            self._call("cuGraphDestroy", graph)

    def replay(self, graph: Any) -> None:
        self._call("cuGraphLaunch", graph, self.capture_stream)

    def free_graph(self, graph: Any) -> None:
        self._call("cuGraphExecDestroy", graph)

    def record(self) -> Any:
        event = self._call("cuEventCreate", 2)            # CU_EVENT_DISABLE_TIMING
        self._call("cuEventRecord", event, 0)
        return event

    def done(self, event: Any) -> bool:
        err, = self.cu.cuEventQuery(event)
        if err == self.cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        self._call("cuEventDestroy", event)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            _, text = self.cu.cuGetErrorString(err)
            raise DriverError(f"cuEventQuery: {text.decode() if text else err}")
        return True


class PycudaDriver:
    """The CUDA driver API through pycuda (without CUDA graphs: every call walks its plan)."""
    name = "pycuda"
    graphs = False

    def __init__(self):
        import pycuda.driver as drv
        self.drv = drv
        try:
            drv.init()
            if drv.Device.count() < 1:
                raise DriverError("the CUDA driver sees no GPU")
            dev = drv.Device(DEVICE)
            self.context = dev.retain_primary_context()
            self.context.push()
            self.capability = dev.compute_capability()
            self.device_name = dev.name()
        except drv.Error as e:
            raise DriverError(f"pycuda: {e}") from None
        self._live: dict[int, Any] = {}

    def _guard(self, what: str, fn, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except self.drv.Error as e:
            raise DriverError(f"{what}: {e}") from None

    def load(self, ptx: str) -> Any:
        return self._guard("module_from_buffer", self.drv.module_from_buffer, ptx.encode())

    def function(self, module: Any, name: str) -> Any:
        return self._guard("get_function", module.get_function, name)

    def alloc(self, nbytes: int) -> int:
        allocation = self._guard("mem_alloc", self.drv.mem_alloc, nbytes)
        self._live[int(allocation)] = allocation
        return int(allocation)

    def free(self, ptr: int) -> None:
        self._guard("free", self._live.pop(ptr).free)

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self._guard("memcpy_htod", self.drv.memcpy_htod, ptr, array)

    def download(self, array: np.ndarray, ptr: int) -> None:
        self._guard("memcpy_dtoh", self.drv.memcpy_dtoh, array, ptr)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._guard("memcpy_dtod", self.drv.memcpy_dtod, dst, src, nbytes)

    def launch(self, fn: Any, grid: tuple[int, int, int], block: int, pointers: list[int],
               integers: list[int]) -> None:
        args = [np.uintp(p) for p in pointers] + [np.int64(i) for i in integers]
        self._guard("launch", fn, *args, grid=grid, block=(block, 1, 1))

    def synchronize(self) -> None:
        self._guard("Context.synchronize", self.drv.Context.synchronize)

    def record(self) -> Any:
        event = self._guard("Event", self.drv.Event)
        self._guard("Event.record", event.record)
        return event

    def done(self, event: Any) -> bool:
        return self._guard("Event.query", event.query)


def _open_driver():
    """The first loader that works: DSLC_CUDA_LOADER ('pycuda' or 'cuda.bindings') if set,
    else pycuda, else cuda.bindings. Raises DslError saying why none did."""
    wanted = os.environ.get("DSLC_CUDA_LOADER")
    loaders = [d for d in (PycudaDriver, BindingsDriver) if wanted in (None, "", d.name)]
    reasons = []
    for loader in loaders:
        try:
            drv = loader()
        except ImportError:
            reasons.append(f"{loader.name} is not installed")
            continue
        except Exception as e:     # the edge: a missing libcuda shows up as any exception
            reasons.append(f"{loader.name}: {e}")
            continue
        if drv.capability < (8, 0):
            reasons.append(f"{drv.device_name} is sm_{drv.capability[0]}{drv.capability[1]}; "
                           "dslc needs sm_80 or newer")
            continue
        return drv
    installed = not reasons or any(not r.endswith("is not installed") for r in reasons)
    raise DslError(None, "device 'cuda' is not usable: " + ("; ".join(reasons) or
                                                           f"unknown loader {wanted!r}") +
                   ("" if installed else " (pip install cuda-bindings, or 'dslc[cuda]' for pycuda)"))


@functools.cache
def driver():
    """The process's CUDA driver (opened once); DslError where no GPU is usable."""
    return _open_driver()


def usable() -> bool:
    """Whether a GPU can run programs here: a loader imports, the driver loads, a device exists."""
    try:
        driver()
        return True
    except DslError:
        return False


def arch(drv) -> str:
    """The PTX target for the device: its own architecture (sm_86 on an RTX 3090, sm_90 on an
    H100), or the newest one nvptx.ARCHES has before it."""
    return nvptx.arch_for(drv.capability)


# ---------------------------------------------------------------------------------------------
# Device memory


class Memory:
    """Device allocations, reused: a freed block waits in a free list for a request of the same
    size (a program asks for the same sizes every call), and cached blocks are given back to
    the driver only when an allocation fails."""

    def __init__(self, drv):
        self.drv = drv
        self.free_lists: dict[int, list[int]] = {}

    def take(self, nbytes: int, purpose: str) -> int:
        if nbytes == 0:
            return 0
        blocks = self.free_lists.get(nbytes)
        if blocks:
            return blocks.pop()
        try:
            return self.drv.alloc(nbytes)
        except DriverError:
            self.release()
        try:
            return self.drv.alloc(nbytes)
        except DriverError as e:
            raise DslError(None, f"GPU memory: cannot allocate {nbytes} bytes for {purpose} ({e})") from None

    def give(self, ptr: int, nbytes: int) -> None:
        if nbytes:
            self.free_lists.setdefault(nbytes, []).append(ptr)

    def release(self) -> None:
        """Return every cached block to the driver (after the GPU has finished with them)."""
        wait(self.drv, "freeing memory")
        for blocks in self.free_lists.values():
            for ptr in blocks:
                self.drv.free(ptr)
        self.free_lists.clear()


class _Buffer:
    """One allocation; it goes back to the free list when the last array using it goes."""

    def __init__(self, memory: Memory, nbytes: int, purpose: str):
        self.memory, self.nbytes = memory, nbytes
        self.ptr = memory.take(nbytes, purpose)

    def __del__(self):
        try:
            self.memory.give(self.ptr, self.nbytes)
        except Exception:            # at interpreter exit the free lists may be gone already
            pass


class _Borrowed:
    """Device memory another framework owns, lent for as long as an array uses it: `owner`
    (the producer's array, or the DLPack tensor whose deleter gives it back) is kept alive."""

    def __init__(self, memory: Memory, nbytes: int, ptr: int, owner: Any):
        self.memory, self.nbytes, self.ptr, self.owner = memory, nbytes, ptr, owner


class DeviceArray:
    """A tensor in GPU memory. `np.asarray(x)` or `x.numpy()` copies it to the host;
    `torch.from_dlpack(x)` or `cupy.asarray(x)` shares it."""

    def __init__(self, buffer: _Buffer | _Borrowed, shape: tuple[int, ...], dtype: np.dtype):
        self.buffer, self.shape, self.dtype = buffer, tuple(shape), np.dtype(dtype)

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            try:
                self.buffer.memory.drv.download(out, self.ptr)
            except DriverError as e:
                raise DslError(None, f"copying a result from the GPU failed ({e}); a kernel "
                                     "before it failed (DSLC_CUDA_SYNC=1 names which)") from None
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def __dlpack__(self, *, stream: int | None = None, max_version=None, dl_device=None,
                   copy: bool | None = None) -> Any:
        """A DLPack capsule of this array's device memory, kept alive until the consumer is
        done with it. No stream is waited on: a call has finished its kernels when it returns."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__() or copy is True:
            raise BufferError(f"a DeviceArray is exported in place, on cuda:{DEVICE} only")
        return dlpack.export(self.ptr, self.shape, self.dtype, (_CUDA, DEVICE), owner=self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _CUDA, DEVICE

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": None}

    def blank(self, purpose: str) -> DeviceArray:
        """A new array of this one's shape and dtype in the same memory, its contents undefined."""
        return DeviceArray(_Buffer(self.buffer.memory, self.nbytes, purpose), self.shape, self.dtype)

    def view(self, shape: tuple[int, ...]) -> DeviceArray:
        """The same bytes with another shape of as many elements (a reshape)."""
        assert math.prod(shape) == self.size, (shape, self.shape)
        return DeviceArray(self.buffer, shape, self.dtype)

    def part(self, start: int, shape: tuple[int, ...]) -> DeviceArray:
        """The elements from `start` on, as many as `shape` holds, in place (this array is
        kept alive while the part is)."""
        nbytes = math.prod(shape) * self.dtype.itemsize
        assert start * self.dtype.itemsize + nbytes <= self.nbytes, (start, shape, self.shape)
        ptr = self.ptr + start * self.dtype.itemsize if nbytes else 0
        return DeviceArray(_Borrowed(self.buffer.memory, nbytes, ptr, self), shape, self.dtype)

    def tobytes(self) -> bytes:
        return self.numpy().tobytes()

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        return self.numpy()[index]

    def __float__(self) -> float:
        return float(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __repr__(self) -> str:
        return f"DeviceArray({self.numpy()!r})"


_CUDA = 2                     # DLPack's kDLCUDA


class NotShareable(Exception):
    """Why another framework's CUDA array cannot be used in place (inputs.py names the argument)."""


def borrow(value: Any) -> DeviceArray:
    """A CUDA-resident array of another framework (DLPack with a CUDA device, else the CUDA
    array interface) as a DeviceArray of the same device memory; NotShareable where it
    cannot be one: on another GPU, of a dtype NumPy lacks, not C-contiguous, or misaligned."""
    memory = _memory(driver())
    if hasattr(value, "__dlpack__"):
        # stream 1 is the legacy default stream the runtime launches on: the producer orders
        # its pending work before it (DLPack's stream contract)
        owner = dlpack.Imported(value.__dlpack__(stream=1))
        device, ptr, shape, strides, dtype = owner.device, owner.ptr, owner.shape, owner.strides, owner.dtype
    else:
        owner, face = value, value.__cuda_array_interface__
        if face.get("mask") is not None:
            raise NotShareable("is a masked array (its __cuda_array_interface__ has a mask), which dslc "
                               "cannot read")
        device = value.__dlpack_device__() if hasattr(value, "__dlpack_device__") else (_CUDA, DEVICE)
        dtype, shape, ptr = np.dtype(face["typestr"]), tuple(face["shape"]), face["data"][0] or 0
        strides = None if face.get("strides") is None else tuple(s // dtype.itemsize for s in face["strides"])
        if face.get("stream") not in (None, 1):       # its work is on a stream not ordered with ours
            try:
                memory.drv.synchronize()
            except DriverError as e:
                raise DslError(None, f"waiting for another framework's GPU work failed: {e}") from None
    if tuple(device) != (_CUDA, DEVICE):
        raise NotShareable(f"is in the memory of cuda:{device[1]}, and dslc runs on cuda:{DEVICE}: "
                           f"copy it there first (.to('cuda:{DEVICE}') in PyTorch)")
    if isinstance(dtype, str):
        raise NotShareable(f"must be an array of a dslc dtype ({', '.join(NUMPY_DTYPES)}), got {dtype}")
    if strides is not None and any(n > 1 and s != c for n, s, c in
                                   zip(shape, strides, dlpack.row_major(shape))):
        raise NotShareable(f"is not contiguous (strides of {[s * dtype.itemsize for s in strides]} "
                           f"bytes for shape {list(shape)}), and dslc uses GPU tensors in place: "
                           "pass a contiguous copy (.contiguous() in PyTorch)")
    if ptr % dtype.itemsize:
        raise NotShareable(f"starts at an address that is not a multiple of its {dtype.itemsize}-byte items")
    return DeviceArray(_Borrowed(memory, math.prod(shape) * dtype.itemsize, ptr, owner), shape, dtype)


def wait(drv, after: str, timeout: float | None = None) -> None:
    """Block until the GPU has finished all work so far; DslError if it failed or took longer
    than the timeout (DSLC_CUDA_TIMEOUT seconds, default 120)."""
    limit = timeout if timeout is not None else float(os.environ.get("DSLC_CUDA_TIMEOUT", "120"))
    try:
        event = drv.record()
        start = time.perf_counter()
        while not drv.done(event):
            elapsed = time.perf_counter() - start
            if elapsed > limit:
                raise DslError(None, f"the GPU did not finish {after} within {limit:g} s "
                                     "(DSLC_CUDA_TIMEOUT)")
            time.sleep(0 if elapsed < 1e-3 else 1e-4)
    except DriverError as e:
        raise DslError(None, f"the GPU failed in {after}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Executables


class Executable:
    """An IR function compiled for the GPU: its plan, the loaded PTX module, and the
    executables of the scan and checkpoint bodies it holds. Same interface as the CPU's:
    `run(arrays)` takes NumPy or device arrays and returns DeviceArrays; in fast `numerics`
    its products run on tensor cores (gpu_kernels). It is the executor's device for its plan."""

    def __init__(self, fn: Function, name: str = "k", drv=None, numerics: str = "exact",
                 fold: Op | None = None):
        self.drv = drv or driver()
        self.memory = _memory(self.drv)
        fn = for_backends(fn)
        self.function = fn
        self.plan: Plan = gpu_schedule(fn, name, numerics)
        gpu = gpu_kernels(self.plan, name, numerics, fold)
        self.persistent = gpu.folds[0] if gpu.folds else None     # (a fold's body: its kernel)
        self.matmuls, self.copies, self.launches = gpu.matmuls, gpu.copies, gpu.launches
        self.gathers = gpu.gathers
        self.functions: dict[str, Any] = {}
        if gpu.kernels or self.matmuls or gpu.mmas or self.gathers or gpu.folds:
            text = compile_ptx(gpu.kernels, self.matmuls, gpu.gather_kernels, arch(self.drv), gpu.mmas,
                               gpu.folds)
            try:
                module = self.drv.load(text)
                self.functions = {e: self.drv.function(module, e) for e in gpu.entries}
            except DriverError as e:
                raise DslError(None, f"loading the GPU kernels of '{name}' failed: {e}") from None
        self.layouts: dict[Value, tuple[int, tuple[int, ...], np.dtype]] = {}
        self.products = {id(s): Product.of(s.op, s.op.outputs[0].dtype in gpu.mmas)
                         for s in self.plan.steps if isinstance(s, ContractStep)}
        self.dead = last_uses(self.plan)
        self.bodies: dict[int, Executable] = {}
        for i, step in enumerate(self.plan.steps):
            if isinstance(step, HostStep) and step.op.body is not None:
                fold = step.op if isinstance(step.op.primitive, Scan) else None
                self.bodies[id(step.op)] = Executable(step.op.body, f"{name}_b{i}", self.drv, numerics, fold)
        self.constants: dict[int, list[DeviceArray]] = {}    # host ops of no inputs, made once
        self.sync = os.environ.get("DSLC_CUDA_SYNC") == "1"
        self.graphs = self.drv.graphs and os.environ.get("DSLC_CUDA_GRAPHS", "1") != "0" and \
            not self.sync and all(self.capturable(s) for s in self.plan.steps)
        self.graph: Graph | None = None
        self.capturing = False
        self.calls = 0
        self.first_launches = 0             # kernels launched by the first call
    def run(self, arrays: list) -> list[DeviceArray]:
        """The plan walked (at the first call, and at every call of a plan that cannot be a
        CUDA graph or gains nothing from one), else its CUDA graph: captured at the second
        call, replayed from then on. A replay costs a copy of each argument and result and
        a launch of the graph, each about a kernel launch's time: it gains when the plan
        launches more kernels than that."""
        self.calls += 1
        if self.graphs and self.calls > 1 and self.first_launches > len(arrays) + len(self.function.results) + 2:
            if self.graph is None:
                self.graph = self.capture(arrays)
            return self.replay(arrays)
        return executor.execute(self.plan, self.dead, self, arrays)

    # -------------------------------------------------------- CUDA graphs

    def capturable(self, step: Step) -> bool:
        """Whether a step only launches kernels, once its values made once are made: no
        index, no value of the host, no copy a capture would forbid (a stepped fold's)."""
        if isinstance(step, KernelStep):
            return True
        if isinstance(step, ContractStep):
            return not any(self.products[id(step)].expand)
        op = step.op
        if isinstance(op.primitive, Scan):
            return self.bodies[id(op)].persistent is not None
        gathered = id(op) in self.gathers and not isinstance(op.primitive, (Take, ScatterAdd))
        return isinstance(op.primitive, Rearrange) or id(op) in self.copies or gathered or made_once(op)

    def capture(self, arrays: list) -> Graph:
        """The plan's launches recorded (not run) as a CUDA graph, on buffers of its own: its
        inputs, which each replay fills, and every value the walk makes, kept for as long as
        the graph is."""
        inputs = [self.empty(p, "an input of a CUDA graph") for p in self.function.params]
        env = dict(zip(self.function.params, inputs))
        self.launched = []
        self.capturing = True
        self.drv.begin_capture()
        try:
            for i, s in enumerate(self.plan.steps):
                executor.step(i, s, self, env)
        finally:
            self.capturing = False
            handle = self.drv.end_capture()          # (after a failure too: the stream stops capturing)
        return Graph(self.drv, handle, inputs, self.results(env), list(env.values()), self.launched)

    def replay(self, arrays: list) -> list[DeviceArray]:
        """The graph run on this call's arguments (copied into its inputs), its results
        copied out, so that they outlive the next replay."""
        g = self.graph
        for x, a, p in zip(g.inputs, arrays, self.function.params):
            if isinstance(a, DeviceArray):
                self.copy(x, self.to_device(a, p))
            elif x.nbytes:
                self.drv.upload(x.ptr, np.ascontiguousarray(np.asarray(a, dtype=x.dtype)).reshape(x.shape))
        try:
            self.drv.replay(g.handle)
        except DriverError as e:
            raise DslError(None, f"replaying the CUDA graph of '{self.function.name}' failed: {e}") from None
        results = []
        for r in g.results:
            results.append(out := DeviceArray(_Buffer(self.memory, r.nbytes, "a result of a CUDA graph"), r.shape, r.dtype))
            self.copy(out, r)
        self.launched = list(g.entries)
        self.wait()
        return results

    # -------------------------------------------------------- the executor's device

    def arguments(self, arrays: list) -> dict[Value, DeviceArray]:
        self.launched: list[str] = []
        return {p: self.to_device(a, p) for p, a in zip(self.function.params, arrays)}

    def launch(self, i: int, step: Step, env: dict[Value, DeviceArray]) -> None:
        if isinstance(step, KernelStep):
            self.kernel(step, env)
        elif isinstance(step, ContractStep):
            self.contract(step, env)
        else:                                   # a view: a copy kernel, or a reshape's label
            self.host(step.op, env)

    def synchronise(self) -> None:
        if self.calls == 1:
            self.first_launches = len(self.launched)
        if self.launched and not self.capturing:
            self.wait()

    def results(self, env: dict[Value, DeviceArray]) -> list[DeviceArray]:
        return [env[v] for v in self.function.results]

    def wait(self) -> None:
        names = list(dict.fromkeys(self.launched))
        listed = ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:2])}, … {names[-1]}"
        wait(self.drv, f"kernel {names[0]}" if len(names) == 1 else
             f"one of the {len(names)} kernels {listed} (DSLC_CUDA_SYNC=1 names which)")
        self.launched = []

    # -------------------------------------------------------- memory

    def layout(self, v: Value) -> tuple[int, tuple[int, ...], np.dtype]:
        """v's bytes, shape and dtype, worked out once (Value.shape is computed at each use)."""
        known = self.layouts.get(v)
        if known is None:
            dtype = np_dtype(v.dtype)
            known = self.layouts[v] = (math.prod(v.shape) * dtype.itemsize, v.shape, dtype)
        return known

    def empty(self, v: Value, purpose: str) -> DeviceArray:
        nbytes, shape, dtype = self.layout(v)
        return DeviceArray(_Buffer(self.memory, nbytes, purpose), shape, dtype)

    def to_device(self, a, v: Value) -> DeviceArray:
        """An input as a device buffer of v's dtype and shape (a DeviceArray as it is)."""
        _, shape, dtype = self.layout(v)
        if isinstance(a, DeviceArray) and a.dtype == dtype and a.shape == shape:
            return a
        host = np.ascontiguousarray(np.asarray(a, dtype=dtype)).reshape(shape)
        return self.upload(host, f"an input of shape {list(v.shape)}")

    def upload(self, host: np.ndarray, purpose: str) -> DeviceArray:
        """A contiguous host array copied into a new device buffer."""
        out = DeviceArray(_Buffer(self.memory, host.nbytes, purpose), host.shape, host.dtype)
        if host.nbytes:
            try:
                self.drv.upload(out.ptr, host)
            except DriverError as e:
                raise DslError(None, f"copying {purpose} to the GPU failed: {e}") from None
        return out

    # -------------------------------------------------------- steps

    def _launch(self, entry: str, grid: tuple[int, int, int], block: int, pointers: list[int],
                integers: list[int] = (), function: Any = None) -> None:
        """Launch an entry of this module (or `function`, another module's)."""
        try:
            self.drv.launch(function or self.functions[entry], grid, block, pointers, list(integers))
        except DriverError as e:
            raise DslError(None, f"GPU kernel {entry} failed to launch: {e}") from None
        self.launched.append(entry)
        if self.sync and not self.capturing:
            self.wait()

    def kernel(self, step: KernelStep, env: dict[Value, DeviceArray]) -> None:
        self.run_kernel(step.kernel, step.args, step.writes, env)

    def run_kernel(self, k: LoopKernel, args: tuple[Value, ...], writes: tuple[Value, ...],
                   env: dict[Value, DeviceArray]) -> None:
        shape = self.launches[k.name]
        for v in writes:
            env[v] = self.empty(v, f"the result of kernel {shape.entry}")
        if shape.extent == 0:
            return
        self._launch(shape.entry, (shape.grid, 1, 1), shape.block, [env[v].ptr for v in args])

    def contract(self, step: ContractStep, env: dict[Value, DeviceArray]) -> None:
        """out = a @ b by the tiled contraction kernel (its shapes worked out once, Product),
        then its epilogue, if any, as a kernel of its own."""
        p = self.products[id(step)]
        (out,) = step.op.outputs
        a, b = (self.to_device(env[v], v) for v in step.op.inputs)
        if p.expand[0]:
            a = self.expanded(a, p.shapes[0], p.batch_shape)
        if p.expand[1]:
            b = self.expanded(b, p.shapes[1], p.batch_shape)
        env[out] = c = self.empty(out, p.purpose)
        if p.launch:
            self._launch(p.launch.entry, p.launch.grid, p.launch.block, [a.ptr, b.ptr, c.ptr],
                         p.integers)
        if step.epilogue:                 # its own launch, after the product's in the stream
            self.kernel(step.epilogue, env)

    def expanded(self, x: DeviceArray, shape: tuple[int, ...], batch_shape: tuple[int, ...]
                 ) -> DeviceArray:
        """An operand broadcast along some batch axes only, expanded on the host."""
        full = np.broadcast_to(x.numpy().reshape(shape), batch_shape + shape[-2:])
        return self.upload(np.ascontiguousarray(full), "a broadcast operand of @")

    def host(self, op: Op, env: dict[Value, DeviceArray]) -> None:
        """A host step: its inputs copied to the host, evaluated as the CPU runtime does, its
        outputs copied back; reshapes re-label the buffer instead; ops of no inputs run once."""
        if isinstance(op.primitive, Rearrange):           # the same bytes
            env[op.outputs[0]] = env[op.inputs[0]].view(self.layout(op.outputs[0])[1])
            return
        if id(op) in self.copies:
            self.run_kernel(self.copies[id(op)], op.inputs + op.outputs, op.outputs, env)
            return
        if isinstance(op.primitive, (Concat, Split)) and id(op) in self.gathers:
            self.slabs(op, env)
            return
        if id(op) in self.constants:
            env.update(zip(op.outputs, self.constants[id(op)]))
            return
        if isinstance(op.primitive, draws.KEYS):
            self.make_key(op, env)
            return
        if isinstance(op.primitive, ArgReduction) and id(op) in self.gathers:
            try:
                self.extreme(op, env)
            except EvalError as e:                  # of an empty axis, found on the host
                raise e.at(op) from None
            return
        if op.primitive.random and id(op) in self.gathers:
            self.draw(op, env)
            return
        if id(op) in self.gathers:
            try:
                self.gather(op, env)
            except EvalError as e:                  # an index out of range, found on the host
                raise e.at(op) from None
            return
        body = self.bodies.get(id(op))
        if isinstance(op.primitive, Scan):
            self.fold(op, body, env)
            return
        if isinstance(op.primitive, Checkpoint):          # its body's values stay on the GPU
            outs = body.run([env[v] for v in op.inputs])
        else:
            outs = interp.evaluate(op, [env[v].numpy() for v in op.inputs])
        outs = [self.to_device(a, v) for a, v in zip(outs, op.outputs)]
        env.update(zip(op.outputs, outs))
        if made_once(op):
            self.constants[id(op)] = outs

    def gather(self, op: Op, env: dict[Value, DeviceArray]) -> None:
        """take or scatter_add by its gather kernel (nvptx.gather_launch): the indices come to
        the host, are checked and become the kernel's int64 arrays; x, the updates and the
        result stay on the GPU."""
        prim, dtype = self.gathers[id(op)]
        x, indices, *updates = op.inputs
        (out,) = op.outputs
        axis = op.attrs.get("axis", 0) % len(x.shape)
        outer, size, inner = scatter.around(x.shape, axis)
        rows = gather_rows(prim, env[indices].numpy(), axis, size, op.attrs.get("from_end", True))
        ints = [rows] if isinstance(prim, Take) else list(segments(rows, size))
        ints = [self.upload(a, f"the indices of {prim.name}") for a in ints]
        shape = nvptx.gather_launch(prim, dtype, math.prod(out.shape))
        env[out] = result = self.empty(out, f"the result of {shape.entry}")
        if shape.extent:
            self._launch(shape.entry, (shape.grid, 1, 1), shape.block,
                         [a.ptr for a in [env[x], *ints, *(env[u] for u in updates), result]],
                         [outer, rows.size, size, inner])

    def slabs(self, op: Op, env: dict[Value, DeviceArray]) -> None:
        """A concat (split) by its kernel: each input (result) copied to (from) its place along
        the axis in the result (input)."""
        concat = isinstance(op.primitive, Concat)
        whole, parts = (op.outputs[0], op.inputs) if concat else (op.inputs[0], op.outputs)
        axis = op.attrs.get("axis", 0) % len(whole.shape)
        outer, size, inner = scatter.around(whole.shape, axis)
        entry = nvptx.gather_entry(*self.gathers[id(op)])
        env.update((v, self.empty(v, f"a result of {entry}")) for v in op.outputs)
        start = 0
        for part in parts:
            n = part.shape[axis]
            shape = nvptx.gather_launch(*self.gathers[id(op)], outer * n * inner)
            if shape.extent:
                x, out = (env[part], env[whole]) if concat else (env[whole], env[part])
                self._launch(shape.entry, (shape.grid, 1, 1), shape.block, [x.ptr, out.ptr],
                             [outer, n, size, inner, start])
            start += n

    def draw(self, op: Op, env: dict[Value, DeviceArray]) -> None:
        """A uniform, bernoulli or normal draw by its draw kernel, from the key on the device."""
        prim, dtype = self.gathers[id(op)]
        (out,) = op.outputs
        n = math.prod(out.shape)
        shape = nvptx.gather_launch(prim, dtype, n)
        env[out] = result = self.empty(out, f"the result of {shape.entry}")
        if shape.extent:
            self._launch(shape.entry, (shape.grid, 1, 1), shape.block,
                         [env[v].ptr for v in op.inputs] + [result.ptr], [n, *draws.bounds(op)])

    def fold(self, op: Op, body: Executable, env: dict[Value, DeviceArray]) -> None:
        """A scan (Scan.run's meaning) on the device: its body's executable run step by step
        on the state's DeviceArrays and each step's slices of the scanned inputs, read in
        place; each step's emitted values copied into their place in the stacked results."""
        if body.persistent:
            self.persistent_fold(op, body, env)
            return
        a = op.attrs
        n_state, n_xs, length = a["n_state"], a["n_xs"], a["length"]
        inputs = [env[v] for v in op.inputs]
        state, xs, consts = inputs[:n_state], inputs[n_state:n_state + n_xs], inputs[n_state + n_xs:]
        stacked = [self.empty(v, "the stacked results of a fold") for v in op.outputs[n_state:]]
        for t in (range(length - 1, -1, -1) if a.get("reverse") else range(length)):
            outs = body.run(state + [x.part(t * (x.size // length), x.shape[1:]) for x in xs] + consts)
            state = outs[:n_state]
            for into, y in zip(stacked, outs[n_state:]):
                self.copy(into.part(t * y.size, y.shape), y)
        env.update(zip(op.outputs, state + stacked))

    def persistent_fold(self, op: Op, body: Executable, env: dict[Value, DeviceArray]) -> None:
        """A fold whose body is small by its persistent kernel (backend/persistent.py): one
        launch of one block for the whole scan."""
        shape = body.persistent.launch
        outs = [self.empty(v, f"a result of {shape.entry}") for v in op.outputs]
        made = [a for c in made_once_ops(body.plan) for a in body.once(c)]
        self._launch(shape.entry, (shape.grid, 1, 1), shape.block,
                     [a.ptr for a in [env[v] for v in op.inputs] + outs + made], (), body.functions[shape.entry])
        env.update(zip(op.outputs, outs))

    def once(self, op: Op) -> list[DeviceArray]:
        """The values of an op made once (of no inputs), made at the first call."""
        if id(op) not in self.constants:
            outs = interp.evaluate(op, [])
            self.constants[id(op)] = [self.to_device(a, v) for a, v in zip(outs, op.outputs)]
        return self.constants[id(op)]

    def copy(self, dst: DeviceArray, src: DeviceArray) -> None:
        if src.nbytes:
            try:
                self.drv.copy(dst.ptr, src.ptr, src.nbytes)
            except DriverError as e:
                raise DslError(None, f"a copy on the GPU failed: {e}") from None

    def extreme(self, op: Op, env: dict[Value, DeviceArray]) -> None:
        """argmax or argmin by its kernel; of an empty axis, the interpreter's error."""
        (x,), (out,) = op.inputs, op.outputs
        outer, n, inner = extreme.around(op)
        if n == 0 and outer * inner:
            interp.evaluate(op, [np.empty(x.shape, np_dtype(x.dtype))])     # (raises its EvalError)
        shape = nvptx.gather_launch(*self.gathers[id(op)], outer * inner)
        env[out] = result = self.empty(out, f"the result of {shape.entry}")
        if shape.extent:
            self._launch(shape.entry, (shape.grid, 1, 1), shape.block, [env[x].ptr, result.ptr],
                         [outer, n, inner])

    def make_key(self, op: Op, env: dict[Value, DeviceArray]) -> None:
        """split(k, n), fold_in(k, i) or key(seed) by its key kernel: the keys made in one
        buffer, each output a part of it; key(seed)'s made once."""
        prim, dtype = self.gathers[id(op)]
        n = len(op.outputs) if isinstance(prim, KeySplit) else 1
        shape = nvptx.gather_launch(prim, dtype, n)
        keys = DeviceArray(_Buffer(self.memory, 8 * n, f"the keys of {shape.entry}"), (n, 2), np.uint32)
        seed = op.attrs.get("seed", 0)
        integers = [n, seed & 0xFFFFFFFF, seed >> 32] if isinstance(prim, Key) else [n]
        self._launch(shape.entry, (shape.grid, 1, 1), shape.block,
                     [env[v].ptr for v in op.inputs] + [keys.ptr], integers)
        outs = [keys.part(2 * i, (2,)) for i in range(n)]
        env.update(zip(op.outputs, outs))
        if made_once(op):
            self.constants[id(op)] = outs


class Graph:
    """A plan's launches captured once as a CUDA graph, and the device buffers it reads and
    writes: its inputs, its results and every value in between."""

    def __init__(self, drv, handle: Any, inputs: list[DeviceArray], results: list[DeviceArray],
                 values: list[DeviceArray], entries: list[str]):
        self.drv, self.handle, self.inputs, self.results = drv, handle, inputs, results
        self.values, self.entries = values, entries

    def __del__(self):
        try:
            self.drv.free_graph(self.handle)
        except Exception:            # at interpreter exit the driver may be gone already
            pass


_memories: dict[int, Memory] = {}


def _memory(drv) -> Memory:
    """One memory pool per driver."""
    return _memories.setdefault(id(drv), Memory(drv))


