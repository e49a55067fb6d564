"""Running compiled code on the CPU: NumPy arrays as buffers, kernels called through ctypes,
split across DSLC_THREADS threads (default: the number of cores), the thread team of
backend/team.py. Intermediate values live in an arena reused from call to call (the buffer
plan of backend/schedule.py), runs of consecutive kernels are one call each (shared by the
threads when large enough), and plans come from the compile cache when they can."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import mmap
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from itertools import accumulate
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from backend import scatter
from backend.cpu import SYNC_SLOT, Compiled, Run, address, run_function, sync_words
from backend.llvm import grain
from backend.loops import LoopKernel
from backend.objects import kernel_symbols
from backend.schedule import (
    ALIGN,
    ContractStep,
    HostStep,
    KernelStep,
    Memory,
    Plan,
    Step,
    ViewStep,
    last_uses,
    made_once,
    nbytes,
    plan_memory,
    schedule,
)
from backend.team import MAX_THREADS, team
from frontend.diagnostics import DslError
from ir import interp
from ir.core import Function, Op, Value, bind_inputs
from ir.ops.base import Role, np_dtype
from ir.ops.index import ScatterAdd
from ir.passes import for_backends
from runtime import cache, executor

if TYPE_CHECKING:
    from backend.contract import Matmul

ROOT = Path(__file__).resolve().parents[1]
# elements a run's kernels visit, in all: below this, one thread (the GPT step's runs of 2^17
# to 2^19, a layer norm's gradient, a split of q, k and v, took 1.3-1.5 ms on two threads
# against 1.8-3.3 on one; a map and two reductions of 2^16 elements tie)
MIN_RUN_WORK = 1 << 17
MIN_CHUNK_WORK = 1 << 12    # elements of one chunk of a kernel in a run (see backend/cpu.py)
# an element of a kernel that computes exp, log, tanh… counts this many (on a Zen 3 two threads
# beat one at an exp of 16K elements; a GPT step's softmax, 262K, ran on one thread)
COSTLY_WORK = 16


def threads() -> int:
    """$DSLC_THREADS, else the number of cores; at most the team's MAX_THREADS (more would
    only take scratch memory: 30,000 were an out-of-memory error on a 5 x 4 product)."""
    value = os.environ.get("DSLC_THREADS", "")
    if not value:
        return min(_cores(), MAX_THREADS)
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise DslError(None, f"DSLC_THREADS: expected a whole number of at least 1, got {value!r}")
    return min(int(value), MAX_THREADS)


@functools.cache
def _cores() -> int:
    return os.cpu_count() or 1


class Executable:
    """An IR function compiled for the host: its plan, its kernels, its buffer plan, and the
    executables of the scan and checkpoint bodies it holds."""

    def __init__(self, fn: Function, name: str = "k", planned: Planned | None = None):
        planned = planned or _planned(fn, name)
        self.plan, self.memory = planned.plan, planned.memory
        # the first call's arena, faulted in on another core while the rest is built
        self._faulting = ([_Faulting(self.memory.size + ALIGN)]
                          if self.memory.size >= FAULTED_BESIDE else [])
        self.function = fn = self.plan.function
        steps = self.plan.steps
        # what needs no input is made once: constants, zeros, aranges (never written to)
        self.made = {v: _buffer(a, v) for s in steps if _made_once(s)
                     for v, a in zip(s.op.outputs, interp.evaluate(s.op, []))}
        self.views = {s.op.outputs[0] for s in steps if isinstance(s, ViewStep)}
        groups = _runs(steps)
        runs = tuple(_run([steps[i].kernel for i in group]) for group in groups)
        # an epilogue is a run of one kernel too: the contraction calls the kernel on its
        # rows, or the runtime calls the run after the product (backend/contract.py)
        epilogues = {i: _run([s.epilogue.kernel])
                     for i, s in enumerate(steps) if isinstance(s, ContractStep) and s.epilogue}
        self.compiled = Compiled(self.plan.kernels, planned.symbols) if self.plan.kernels else None
        self.launches: list[Callable | None] = [
            _View.of(s) if isinstance(s, ViewStep) else
            _ContractLaunch.of(s, epilogues.get(i), self.memory, self.compiled)
            if isinstance(s, ContractStep) else None for i, s in enumerate(steps)]
        for run, group in zip(runs, groups):
            self.launches[group[0]] = _RunLaunch.of(run, [steps[i] for i in group], self.memory,
                                                    self.compiled)
            for i in group[1:]:
                self.launches[i] = _in_run
        self.dead = [[v for v in dead if v not in self.memory.offsets] for dead in last_uses(self.plan)]
        self.bodies: dict[int, Executable] = {}
        for i, step in enumerate(steps):
            if isinstance(step, HostStep) and step.op.body is not None:
                self.bodies[id(step.op)] = Executable(step.op.body, f"{name}_b{i}")
        self._arenas: list[_Arena] = []
        from runtime.step import NativeStep     # (which builds on this module)
        self.native = NativeStep(self)

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The function's results for these arguments: a native call for each segment of the
        plan between the steps that stay in Python (runtime/step.py)."""
        return self._in_arena(self.native.run, arrays)

    def walk(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The same results, the plan walked step by step from Python."""
        return self._in_arena(self._walk, arrays)

    def _in_arena(self, run: Callable, arrays: list[np.ndarray]) -> list[np.ndarray]:
        # an arena is used by one call at a time; a concurrent or nested call takes another
        arena = self._arenas.pop() if self._arenas else _Arena(self)
        try:
            return run(arena, arrays)
        finally:
            self._arenas.append(arena)

    def _walk(self, arena: _Arena, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return executor.execute(self.plan, self.dead, _Host(self, arena, threads()), arrays)

    def host(self, op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if isinstance(op.primitive, ScatterAdd):    # (an embedding's gradient) compiled
            try:
                outputs = scatter.evaluate(op, inputs)
            except interp.EvalError as e:           # an index out of range, found by the kernel
                raise e.at(op) from None
            if outputs is not None:
                return outputs
        if op.primitive.role is Role.STRUCTURED:   # its body compiled
            return op.primitive.run(op, inputs, self.bodies[id(op)].run)
        return interp.evaluate(op, inputs)


@dataclass(frozen=True)
class _Host:
    """The CPU as the executor's device (runtime/executor.py), for one call: its arena, and
    the threads its runs and products share."""
    exe: Executable
    arena: _Arena
    threads: int

    def arguments(self, arrays: list[np.ndarray]) -> dict[Value, np.ndarray]:
        env: dict[Value, np.ndarray] = dict(self.arena.views)
        env.update(self.exe.made)
        env.update((p, _buffer(a, p)) for p, a in zip(self.exe.function.params, arrays))
        return env

    def launch(self, i: int, step: Step, env: dict[Value, np.ndarray]) -> None:
        self.exe.launches[i](env, self.arena.pointers[i], self.threads)

    def host(self, op: Op, env: dict[Value, np.ndarray]) -> None:
        if op.outputs[0] not in self.exe.made:
            outs = self.exe.host(op, [env[v] for v in op.inputs])
            env.update((v, _buffer(a, v)) for v, a in zip(op.outputs, outs))

    def synchronise(self) -> None:
        """Nothing to wait for: a kernel call returns with its work done."""

    def results(self, env: dict[Value, np.ndarray]) -> list[np.ndarray]:
        # a result never shares memory with a value made once, nor is a strided view
        exe = self.exe
        return [_copy(env[v], v) if v in exe.made or v in exe.views else env[v]
                for v in exe.function.results]


@dataclass(frozen=True)
class Planned:
    """A function as the CPU runs it: its plan (which holds its own copy of the function), its
    buffer plan, and its kernels' symbols (backend/objects.py: digests of their code, 25 ms of
    a GPT step's load to make again)."""
    plan: Plan
    memory: Memory
    symbols: dict[str, str]


def plan(fn: Function, name: str) -> Planned:
    """fn planned for the CPU."""
    fn = for_backends(fn)
    compile_products_beside(fn)
    made = schedule(fn, name)
    return Planned(made, plan_memory(made), kernel_symbols(made.kernels))


def _planned(fn: Function, name: str) -> Planned:
    """plan(fn, name), from the on-disk cache when this scheduler planned exactly this function
    before."""
    k = cache.key("plan", cache.code_digest("backend", "ir"), name, _digest(fn))
    return cache.memo(k, lambda: plan(fn, name), Planned)


def _digest(fn: Function) -> str:
    """A digest of fn's ops, their parameters and types, and how values flow between them —
    not of the values' ids, which differ from one lowering to the next."""
    h = hashlib.sha256()
    number: dict[Value, int] = {}
    types: dict[object, int] = {}               # each distinct type spelled out once

    def walk(f: Function) -> None:
        for v in f.params:
            number[v] = len(number)
            h.update(repr(v.type).encode())
        for op in f.ops:
            for v in op.outputs:
                if v.type not in types:
                    types[v.type] = len(types)
                    h.update(repr(v.type).encode())
            h.update(repr((op.primitive.name, op.params, [number[v] for v in op.inputs],
                           [types[v.type] for v in op.outputs])).encode())
            # the plan runs its own copy of fn, whose ops' origins its diagnostics report
            h.update(getattr(op.origin, "identity", "").encode())
            if op.body is not None:
                walk(op.body)
            for v in op.outputs:
                number[v] = len(number)
        h.update(repr([number[v] for v in f.results]).encode())

    walk(fn)
    return h.hexdigest()


def _made_once(step: Step) -> bool:
    return isinstance(step, HostStep) and made_once(step.op)


def _chunks(k: LoopKernel) -> int:
    """The most chunks a run's threads may cut a kernel into: no chunk under MIN_CHUNK_WORK
    elements, whose claiming would cost more than it saves."""
    return max(1, min(-(-k.extent // grain(k)), _work(k) // MIN_CHUNK_WORK))


def _work(k: LoopKernel) -> int:
    return prod(k.shape) * max(k.n, 1) * (COSTLY_WORK if k.costly else 1)


def _runs(steps: tuple[Step, ...]) -> list[list[int]]:
    """Runs of consecutive kernel steps (one or more), with nothing between them but steps
    made once: each is called as one function."""
    runs: list[list[int]] = [[]]
    for i, step in enumerate(steps):
        if isinstance(step, KernelStep):
            runs[-1].append(i)
        elif not _made_once(step) and runs[-1]:
            runs.append([])
    return [run for run in runs if run]


@dataclass(frozen=True)
class _View:
    """A view step: NumPy's view of the input, with the op's parameters bound once."""
    evaluate: Callable
    source: Value
    value: Value

    @staticmethod
    def of(step: ViewStep) -> _View:
        op = step.op
        params = bind_inputs(op.primitive, (None,), op.attrs)
        del params[op.primitive.params[0].name]
        return _View(functools.partial(op.primitive.evaluate, **params), op.inputs[0], op.outputs[0])

    def __call__(self, env: dict[Value, np.ndarray], pointers: None, threads: int) -> None:
        env[self.value] = self.evaluate(env[self.source])


def _in_run(env: dict, pointers: None, threads: int) -> None:
    """A kernel step called by the run it belongs to."""


def _run(kernels: list[LoopKernel]) -> Run:
    """The run of consecutive kernels, their argument tables laid end to end."""
    return Run(tuple(k.name for k in kernels),
               tuple(accumulate((len(k.buffers) for k in kernels[:-1]), initial=0)),
               tuple(k.extent for k in kernels), tuple(_chunks(k) for k in kernels),
               tuple(grain(k) for k in kernels), tuple(k.n for k in kernels))


class _Arena:
    """One call's memory: the arena's bytes, a view of them for each value planned there,
    and each run's argument table with the arena's addresses filled in."""

    def __init__(self, exe: Executable):
        faulting = exe._faulting.pop() if exe._faulting else None     # (pop: one call takes it)
        self.memory = faulting.pages() if faulting else _pages(exe.memory.size + ALIGN)
        base = -self.memory.ctypes.data % ALIGN
        self.views = {v: self.memory[base + off:base + off + nbytes(v)].view(np_dtype(v.dtype)).reshape(v.shape)
                      for v, off in exe.memory.offsets.items()}
        self.pointers = [launch.pointers(self.views)
                         if isinstance(launch, (_RunLaunch, _ContractLaunch)) else None
                         for launch in exe.launches]
        self.frame = None                   # the native step's (runtime/step.py), made on first use


def _pages(size: int, populate: bool = True) -> np.ndarray:
    """size fresh bytes, their pages mapped at once where the system can (Linux's
    MAP_POPULATE: one call for all of them, where the first touch of each page faults; the
    GPT step's 55 MB arena: a first call 20-25 ms shorter, the faults 1.1 ms a MB here), or,
    with `populate` false, each at its first touch (as _Faulting touches them)."""
    flag = getattr(mmap, "MAP_POPULATE", None)
    if flag is None:
        return np.empty(size, np.uint8)
    try:
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |
                           (flag if populate else 0))
    except OSError as e:        # (ENOMEM: the arena does not fit, as np.empty would have said)
        raise MemoryError(str(e)) from None
    return np.frombuffer(region, np.uint8)      # (which keeps the mapping while it lives)


FAULTED_BESIDE = 4 << 20    # bytes: an arena at least this large is faulted in by a thread


class _Faulting:
    """size fresh bytes whose pages a thread of their own faults in, writing each in C with
    the GIL free, while the executable is built in Python: the GPT step's 55 MB arena took
    20-25 ms of its first call (MAP_POPULATE holds the GIL)."""

    def __init__(self, size: int):
        self.memory = _pages(size, populate=False)
        self.thread = threading.Thread(target=ctypes.memset, args=(self.memory.ctypes.data, 0, size),
                                       name="dslc arena", daemon=True)
        self.thread.start()

    def pages(self) -> np.ndarray:
        self.thread.join()
        return self.memory


@dataclass(frozen=True)
class _RunLaunch:
    """How a run is called: the run function (and its address, for the team), its table's
    header (backend/cpu.py's Run.header), the kernels' arguments end to end, the table's slots
    the arena does not fix (filled each call), the values it allocates, the elements its
    kernels visit in all (whether it is worth sharing) and its kernels' count."""
    fn: Callable
    address: int
    header: tuple[int, ...]
    args: tuple[Value, ...]
    patches: tuple[tuple[int, Value], ...]
    fresh: tuple[Value, ...]
    work: int
    kernels: int

    @staticmethod
    def of(run: Run, steps: list[KernelStep], memory: Memory, compiled: Compiled) -> _RunLaunch:
        args = tuple(v for s in steps for v in s.args)
        fn, at = run_function()
        header = tuple(run.header([compiled.addresses[k] for k in run.kernels]))
        return _RunLaunch(fn, at, header, args,
                          tuple((len(header) + i, v) for i, v in enumerate(args)
                                if v not in memory.offsets),
                          tuple(v for s in steps for v in s.writes if v not in memory.offsets),
                          sum(_work(s.kernel) for s in steps), len(steps))

    def pointers(self, views: dict[Value, np.ndarray]) -> _RunTable:
        return _RunTable(self.header, _table(self.args, views), self.kernels)

    def __call__(self, env: dict[Value, np.ndarray], pointers: _RunTable, threads: int) -> None:
        self.bind(env, pointers)
        self.run(pointers, threads)

    def bind(self, env: dict[Value, np.ndarray], pointers: _RunTable) -> None:
        """The values the run allocates made, and the table's slots the arena does not fix
        filled."""
        for v in self.fresh:
            env[v] = _empty(v)
        self.patch(env, pointers)

    def patch(self, env: dict[Value, np.ndarray], pointers: _RunTable) -> None:
        """The table's slots the arena does not fix filled."""
        table = pointers.table
        for i, v in self.patches:
            table[i] = address(env[v])

    def run(self, pointers: _RunTable, threads: int) -> None:
        table = pointers.table
        if threads <= 1 or self.work < MIN_RUN_WORK:
            self.fn(table, 0, 1)
            return
        pointers.words.fill(0)
        team().run(self.address, pointers.address, threads)   # returns with every chunk done


@dataclass(frozen=True)
class _ContractLaunch:
    """How a contraction step is called: its product, and its epilogue (a run of one kernel,
    and that kernel's address) passed to the contraction kernel, or run after it where the
    kernel's jobs do not cover whole rows."""
    op: Op
    epilogue: _RunLaunch | None
    kernel: int

    @staticmethod
    def of(step: ContractStep, run: Run | None, memory: Memory, compiled: Compiled | None
           ) -> _ContractLaunch:
        if run is None:
            return _ContractLaunch(step.op, None, 0)
        return _ContractLaunch(step.op, _RunLaunch.of(run, [step.epilogue], memory, compiled),
                               compiled.addresses[run.kernels[0]])

    def pointers(self, views: dict[Value, np.ndarray]) -> _RunTable | None:
        return self.epilogue.pointers(views) if self.epilogue else None

    def __call__(self, env: dict[Value, np.ndarray], pointers: _RunTable | None, threads: int) -> None:
        (out,) = self.op.outputs
        if out not in env:
            env[out] = _empty(out)
        a, b = (env[v] for v in self.op.inputs)
        if self.epilogue is None:
            matmul(a, b, env[out], threads)
            return
        self.epilogue.bind(env, pointers)
        if not matmul(a, b, env[out], threads, (self.kernel, pointers.arguments)):
            self.epilogue.run(pointers, threads)


class _RunTable:
    """A run's table in one arena: its header, its synchronisation block's address in it, and
    the kernels' arguments (`arguments`: where they start, an epilogue's table)."""

    def __init__(self, header: tuple[int, ...], args: list[int], kernels: int):
        self.table = (ctypes.c_void_p * (len(header) + len(args)))(*header, *args)
        self.address = ctypes.addressof(self.table)
        self.arguments = self.address + ctypes.sizeof(ctypes.c_void_p) * len(header)
        self.words = np.zeros(sync_words(kernels), np.int64)
        self.table[SYNC_SLOT] = self.words.ctypes.data


def _table(args: tuple[Value, ...], views: dict[Value, np.ndarray]) -> list[int]:
    """Kernel arguments' addresses: the arena's where it holds the value, else 0 (patched)."""
    return [views[v].ctypes.data if v in views else 0 for v in args]


_matmuls: dict[np.dtype, Matmul] = {}
_MATMUL_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
_beside: dict[str, list[subprocess.Popen]] = {}   # compiling product kernels' parts, by dtype


def compile_products_beside(fn: Function) -> None:
    """Start compiling the product kernel of each dtype fn's contractions take, where it is
    neither made nor cached, a process for each of its parts: the largest compilation of a
    program (shared by every program) then goes on while this process plans and compiles the
    program's own kernels, not after them."""
    from backend import contract
    dtypes = {op.outputs[0].dtype for op in _ops(fn) if op.primitive.role is Role.CONTRACTION}
    made = {_MATMUL_DTYPES[d] for d in _matmuls}
    for dtype in sorted(dtypes & set(_MATMUL_DTYPES.values()) - made - _beside.keys()):
        _beside[dtype] = []
        for part in range(contract.PARTS):
            if not contract.cached(dtype, part):
                command = (f"import sys; sys.path[0] = {str(ROOT)!r}; "
                           f"from backend.contract import object_code; object_code({dtype!r}, {part})")
                with contextlib.suppress(OSError):  # then this process compiles it, at its first use
                    _beside[dtype].append(subprocess.Popen(
                        [sys.executable, "-c", command], stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def _ops(fn: Function) -> list[Op]:
    """fn's ops and its bodies', all the way down."""
    return [o for op in fn.ops for o in (op, *(_ops(op.body) if op.body is not None else ()))]


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int,
           epilogue: tuple[int, int] | None = None) -> bool:
    """out = a @ b (NumPy's rules for 1-D operands and batch axes) by the contraction kernel,
    with the canonical k order: the reference's bits (on any number of threads). An epilogue
    (a kernel over out's rows and its table's address) is run by the kernel on each block of
    rows it finishes where it can: returns whether it did (else the caller runs it)."""
    if epilogue is None and _matmul(out.dtype).direct(a, b, out, threads):
        return False
    kernel, a2, b2, parts = product(a, b, out, threads)
    fused = epilogue is not None and kernel.fuses(b2.shape[-1])
    kernel(a2, b2, threads=parts, out=out, epilogue=epilogue if fused else (0, 0))
    return fused


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int, in_step: bool = False
            ) -> tuple[Matmul, np.ndarray, np.ndarray, int]:
    """The contraction kernel for out's dtype, a and b as matrices (a 1-D operand as a row or
    a column), and how many of `threads` the product is worth (in a native step's segment,
    `in_step`: Matmul.worth)."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    kernel = _matmul(out.dtype)
    return kernel, a2, b2, kernel.worth(a2.shape[-2], out.size * a2.shape[-1], threads, in_step)


def _matmul(dtype: np.dtype) -> Matmul:
    """The contraction kernel for arrays of dtype (made on first use)."""
    kernel = _matmuls.get(dtype)
    if kernel is None:
        from backend.contract import Matmul
        for beside in _beside.pop(_MATMUL_DTYPES[dtype], []):
            beside.wait()                   # it stores its part in the cache, or fails: then made here
        kernel = _matmuls[dtype] = Matmul(_MATMUL_DTYPES[dtype])
    return kernel


def _empty(v: Value) -> np.ndarray:
    """A new array for v at an address that is a multiple of ALIGN (64) bytes: a result there
    is one that jax.dlpack.from_dlpack takes without a copy (it copies any other)."""
    return empty_aligned(nbytes(v), np_dtype(v.dtype), v.shape)[0]


def empty_aligned(size: int, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """_empty with v's bytes, dtype and shape found once (a native step's results), and the
    array's address."""
    raw = np.empty(size + ALIGN, np.uint8)
    base = address(raw)
    return np.ndarray(shape, dtype, raw, -base % ALIGN), base + -base % ALIGN


def _copy(a: np.ndarray, v: Value) -> np.ndarray:
    out = _empty(v)
    out[...] = a
    return out


def _buffer(a: np.ndarray, v: Value) -> np.ndarray:
    """An array as a kernel buffer: contiguous, row-major, of the value's dtype (0-d stays
    0-d: np.ascontiguousarray would make it 1-d)."""
    return np.asarray(a, dtype=np_dtype(v.dtype), order="C")
