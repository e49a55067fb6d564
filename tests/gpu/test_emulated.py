"""The GPU kernels' logic without a GPU: their LLVM IR, run on the host by tests/gpu/emulator.py
with real barriers and warp shuffles between threads, gives the CPU backend's bits. What this
leaves to a GPU (tests/gpu/test_gpu.py) is NVPTX code generation and the hardware."""
from __future__ import annotations

import ctypes
import functools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from backend import nvptx, schedule, scatter
from backend.contract import Matmul
from backend.cpu import Compiled
from backend.loops import LoopKernel
from ir import numerics
from ir.ad import grad_function
from ir.core import Builder, tensor_type
from ir.ops.base import Primitive
from ir.ops.index import ScatterAdd, Take
from ir.passes import optimize
from backend.gpu_plan import copy_kernel, gather_rows, segments

sys.path.insert(0, str(Path(__file__).parent))
from emulator import Emulator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "backend"))
import test_programs as programs  # noqa: E402
from test_nvptx import reduction, row_kernels, window_kernels  # noqa: E402  (the same kernels, run here)

NUMPY = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64,
         "u32": np.uint32, "bool": np.bool_}


def random_buffer(rng, dtype: str, shape) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("i32", "i64", "u32"):
        return rng.integers(0 if dtype == "u32" else -5, 6, shape).astype(NUMPY[dtype])
    x = rng.standard_normal(shape).astype(NUMPY[dtype])
    flat = x.reshape(-1)
    if flat.size > 8:
        flat[rng.integers(0, flat.size, 6)] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.5], NUMPY[dtype])
    return x


def same_as_cpu(kernels: list[LoopKernel], blocks: int = 3) -> None:
    """Run every kernel on the emulated GPU (at most `blocks` blocks: the grid-stride loops
    cover the rest) and on the CPU backend, on the same random inputs; compare all buffers."""
    gpu, cpu = Emulator(kernels), Compiled(kernels)
    rng = np.random.default_rng(0)
    for k in kernels:
        inputs = [random_buffer(rng, dt, shape) for dt, shape in k.buffers]
        ours, theirs = [a.copy() for a in inputs], [a.copy() for a in inputs]
        shape = nvptx.launch(k)
        gpu.launch(shape.entry, (min(shape.grid, blocks), 1, 1), shape.block, [a.ctypes.data for a in ours])
        table = (ctypes.c_void_p * len(theirs))(*[a.ctypes.data for a in theirs])
        cpu.function(k.name)(table, 0, k.extent, k.n)
        for i, (g, c) in enumerate(zip(ours, theirs)):
            assert same_bits(g, c), f"kernel {k.name}: buffer {i} differs from the CPU's"


def same_bits(g: np.ndarray, c: np.ndarray) -> bool:
    """Bit-identical, except that NaNs may differ in payload: which operand's payload an
    arithmetic NaN carries is the compiler's choice (it may commute an fadd)."""
    as_bits = lambda a: np.ascontiguousarray(a).view(f"u{a.itemsize}")
    same = as_bits(g) == as_bits(c)
    if g.dtype.kind == "f":
        same |= np.isnan(g) & np.isnan(c)
    return bool(np.all(same))


def test_reductions_follow_the_canonical_order():
    same_as_cpu([
        reduction("empty", "f32", (3,), 0),
        reduction("one", "f32", (5,), 1),
        reduction("rows", "f32", (37,), 100),
        reduction("cols", "f32", (9,), 75, "max", columns=True),
        reduction("scalar", "f32", (), 33),
        reduction("mean", "f64", (4,), 300, count=300),
        reduction("half", "f16", (6,), 70, "min"),
        reduction("chunks", "f32", (3,), 3 * numerics.CHUNK + 5),
        reduction("chunk_cols", "f64", (4,), numerics.CHUNK + 1, "max", columns=True),
    ])


def test_reductions_of_chunks_of_chunks(monkeypatch):
    """The second level (more than CHUNK chunks), with CHUNK made small on both sides."""
    monkeypatch.setattr(numerics, "CHUNK", 64)
    monkeypatch.setattr(nvptx, "CHUNK", 64)
    n = 64 * 64 * 3 + 5
    k = reduction("levels", "f32", (2,), n)
    x = np.random.default_rng(1).standard_normal((2, n)).astype(np.float32)
    out = np.empty(2, np.float32)
    shape = nvptx.launch(k)
    Emulator([k]).launch(shape.entry, (1, 1, 1), shape.block, [x.ctypes.data, out.ctypes.data])
    assert same_bits(out, numerics.reduce(x, (1,), np.add, -0.0))


def test_row_kernels_give_the_cpus_bits():
    same_as_cpu(row_kernels(), blocks=2)


def test_windowed_loads_read_what_the_cpu_reads():
    same_as_cpu(window_kernels())


def program_kernels(name: str) -> list[LoopKernel]:
    """The kernels of a test program's loss and its gradient, and the strided copies the GPU
    runtime makes for their transposes and broadcasts."""
    prog = programs.load(name)
    inputs = getattr(programs, f"{'conv' if name == 'conv2d' else name}_inputs")(0)
    low, _ = prog.lower("loss", (), inputs)
    out = []
    for tag, fn in (("f", low.function), ("g", optimize(grad_function(low.function, [0])))):
        plan = schedule.schedule(fn, f"{name}_{tag}")
        out += plan.kernels
        out += [k for i, s in enumerate(plan.steps)
                if not isinstance(s, (schedule.KernelStep, schedule.ContractStep))
                and (k := copy_kernel(f"{name}_{tag}_copy{i}", s.op)) is not None]
    return out


@pytest.mark.parametrize("name", ["mlp", "layer_norm", "attention", "conv2d"])
def test_program_kernels_match_the_cpu(name):
    same_as_cpu(program_kernels(name))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("tiles", nvptx.TILES, ids=lambda t: t.name)
@pytest.mark.parametrize("batch, m, k, n, broadcast", [(1, 70, 9, 130, False), (2, 33, 20, 17, True),
                                                       (1, 5, 0, 3, False), (1, 129, 1, 65, False)])
def test_contraction_keeps_the_k_order(dtype, tiles, batch, m, k, n, broadcast):
    rng = np.random.default_rng(m + k)
    t = NUMPY[dtype]
    a = random_buffer(rng, dtype, (batch, m, k))
    b = random_buffer(rng, dtype, (1 if broadcast else batch, k, n))
    c = np.empty((batch, m, n), t)
    grid = (-(-n // tiles.bn), -(-m // tiles.bm), batch)
    Emulator([], (dtype,)).launch(nvptx.matmul_entry(dtype, tiles), grid, tiles.threads,
                                  [a.ctypes.data, b.ctypes.data, c.ctypes.data],
                                  [m, n, k, m * k, 0 if broadcast else k * n, m * n, batch])
    assert same_bits(c, Matmul(dtype)(a, b))


# (x's shape, axis, the indices' shape): rows, a middle axis, the last axis (one column), no
# indices, a scalar index; the indices in [-size, size), so repeated and negative ones.
GATHERS = [((65, 33), 0, (300,)), ((3, 7, 5), 1, (4, 6)), ((4, 9), -1, (30,)), ((5, 3), 0, (0,)),
           ((6,), 0, ())]
TAKEN = ("f32", "f64", "f16", "i32", "bool")
TAKE, SCATTER_ADD = Take(), ScatterAdd()


@functools.cache
def gather_emulator() -> Emulator:
    return Emulator([], (), tuple((TAKE, d) for d in TAKEN) + ((SCATTER_ADD, "f32"), (SCATTER_ADD, "f64")))


def run_gather(emulator: Emulator, prim: Primitive, dtype: str, x: np.ndarray, indices: np.ndarray,
               axis: int, updates: np.ndarray | None = None) -> np.ndarray:
    """take or scatter_add by the emulated gather kernel, its arrays prepared as the runtime
    prepares them."""
    ax = axis % x.ndim
    outer, size, inner = math.prod(x.shape[:ax]), x.shape[ax], math.prod(x.shape[ax + 1:])
    rows = gather_rows(prim, indices, ax, size)
    ints = [rows] if prim == TAKE else list(segments(rows, size))
    out = np.empty(x.shape[:ax] + indices.shape + x.shape[ax + 1:] if prim == TAKE else x.shape, x.dtype)
    shape = nvptx.gather_launch(prim, dtype, out.size)
    arrays = [x, *ints, *([] if updates is None else [updates]), out]
    emulator.launch(shape.entry, (min(shape.grid, 2), 1, 1), shape.block, [a.ctypes.data for a in arrays],
                    [outer, rows.size, size, inner])
    return out


@pytest.mark.parametrize("x_shape, axis, index_shape", GATHERS)
def test_gather_kernels_give_the_cpus_bits(x_shape, axis, index_shape):
    """take against NumPy's (the CPU runtime's host step), scatter_add against the CPU's
    compiled backend/scatter.py, on values of many magnitudes (so any other order of the
    adds would round differently)."""
    emulator = gather_emulator()
    rng = np.random.default_rng(len(index_shape) + x_shape[0])
    size = x_shape[axis]
    indices = rng.integers(-size, size, index_shape).astype(np.int32)
    for dtype in TAKEN:
        x = random_buffer(rng, dtype, x_shape)
        assert same_bits(run_gather(emulator, TAKE, dtype, x, indices, axis), np.take(x, indices, axis))
    for dtype in ("f32", "f64"):
        ax = axis % len(x_shape)
        u_shape = x_shape[:ax] + index_shape + x_shape[ax + 1:]
        b = Builder()
        b.emit("scatter_add", *(b.param(tensor_type(t, s)) for t, s in
                                ((dtype, x_shape), ("i32", index_shape), (dtype, u_shape))), axis=axis)
        (op,) = b.ops
        x = random_buffer(rng, dtype, x_shape)
        updates = np.asarray(rng.standard_normal(u_shape) * 10.0 ** rng.uniform(-4, 4, u_shape), NUMPY[dtype])
        (want,) = scatter.evaluate(op, [x, indices, updates])
        assert same_bits(run_gather(emulator, SCATTER_ADD, dtype, x, indices, axis, updates), want)
