"""Running compiled code on the CPU: NumPy arrays as buffers, kernels called through ctypes,
split across DSLC_THREADS threads (default: the number of cores)."""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from backend.cpu import Compiled
from backend.schedule import ContractStep, HostStep, KernelStep, Plan, schedule
from ir import interp
from ir.core import Function, Op, Value
from ir.passes import einsum_as_matmul
from ir.ops.base import np_dtype

MIN_WORK_PER_THREAD = 1 << 18          # elements; below this, threads cost more than they save
_pool: ThreadPoolExecutor | None = None


def threads() -> int:
    value = os.environ.get("DSLC_THREADS", "")
    return max(1, int(value)) if value.isdigit() else os.cpu_count() or 1


def pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(threads(), 1), thread_name_prefix="dslc")
    return _pool


class Executable:
    """An IR function compiled for the host: its plan, its kernels, and the executables of
    the scan and checkpoint bodies it holds."""

    def __init__(self, fn: Function, name: str = "k"):
        fn = einsum_as_matmul(fn)
        self.function = fn
        self.plan: Plan = schedule(fn, name)
        self.compiled = Compiled(self.plan.kernels) if self.plan.kernels else None
        self.dead = _last_uses(self.plan)
        self.bodies: dict[int, Executable] = {}
        for i, step in enumerate(self.plan.steps):
            if isinstance(step, HostStep) and step.op.body is not None:
                self.bodies[id(step.op)] = Executable(step.op.body, f"{name}_b{i}")

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        env: dict[Value, np.ndarray] = {p: _buffer(a, p) for p, a in zip(self.function.params, arrays)}
        for step, dead in zip(self.plan.steps, self.dead):
            if isinstance(step, KernelStep):
                self.launch(step, env)
            elif isinstance(step, ContractStep):
                (out,) = step.op.outputs
                env[out] = _buffer(matmul(*[env[v] for v in step.op.inputs], out.dtype), out)
            else:
                outs = self.host(step.op, [env[v] for v in step.op.inputs])
                env.update((v, _buffer(a, v)) for v, a in zip(step.op.outputs, outs))
            for v in dead:                      # memory back as soon as nothing needs it
                del env[v]
        return [env[v] for v in self.function.results]

    def host(self, op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
        body = self.bodies.get(id(op))
        if op.prim == "scan":
            return interp.scan(op, inputs, body.run)
        if op.prim == "checkpoint":
            return body.run(inputs)
        return interp.evaluate(op, inputs)

    def launch(self, step: KernelStep, env: dict[Value, np.ndarray]) -> None:
        k = step.kernel
        for v in step.writes:
            env[v] = np.empty(v.shape, dtype=np_dtype(v.dtype))
        pointers = (ctypes.c_void_p * len(step.args))(*[env[v].ctypes.data for v in step.args])
        fn = self.compiled.functions[k.name]
        extent = (int(np.prod(k.shape)) if k.is_reduction else k.shape[0]) if k.shape else 1
        work = int(np.prod(k.shape)) * max(k.n, 1)
        parts = min(threads(), extent, max(1, work // MIN_WORK_PER_THREAD))
        if parts <= 1:
            fn(pointers, 0, extent)
            return
        bounds = [extent * i // parts for i in range(parts + 1)]
        list(pool().map(lambda i: fn(pointers, bounds[i], bounds[i + 1]), range(parts)))


def _last_uses(plan: Plan) -> list[list[Value]]:
    """For each step, the values no later step (nor the result) reads: freed after it."""
    reads = [step.args if isinstance(step, KernelStep) else step.op.inputs for step in plan.steps]
    keep = set(plan.function.results)
    last: dict[Value, int] = {}
    for i, values in enumerate(reads):
        for v in values:
            last[v] = i
    dead: list[list[Value]] = [[] for _ in plan.steps]
    for v, i in last.items():
        if v not in keep and not (isinstance(plan.steps[i], KernelStep) and v in plan.steps[i].writes):
            dead[i].append(v)
    return dead


_matmuls: dict[str, object] = {}


def matmul(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """a @ b (NumPy's rules for 1-D operands and batch axes) by the contraction kernel, with
    the canonical k order: the reference's bits."""
    if dtype not in _matmuls:
        from backend.contract import Matmul
        _matmuls[dtype] = Matmul(dtype)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    c = _matmuls[dtype](a2, b2, threads=threads())
    if a.ndim == 1:
        c = c[..., 0, :]
    if b.ndim == 1:
        c = c[..., 0]
    return c


def _buffer(a: np.ndarray, v: Value) -> np.ndarray:
    """An array as a kernel buffer: contiguous, row-major, of the value's dtype (0-d stays
    0-d: np.ascontiguousarray would make it 1-d)."""
    return np.asarray(a, dtype=np_dtype(v.dtype), order="C")
