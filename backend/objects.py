"""A program's object code, made once for each distinct piece: a kernel is named by a digest
of its loop IR less its name and the sizes its code does not read (the layers of a model
repeat the same kernels; so does a new batch size; the runs that call them are one function,
backend/cpu.py's run_function); each piece is cached on disk on its own, so that a changed
program recompiles only what changed; the pieces not cached are compiled by worker processes
beside this one (llvmlite holds one lock over every call into LLVM: threads would take turns),
then linked in one MCJIT engine; a piece this process has linked already is used there."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import subprocess
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from backend import cpu
from backend.llvm import kernel_function, size_free
from backend.loops import LoopKernel
from runtime import cache

# LLVM's level for kernels (its passes and its code generator), the one that pays:
# the 4-layer GPT step's 76 distinct pieces (benchmarks/train_step.py) take 2.4-2.7 CPU s to
# compile at O1, 2.8-3.1 at O2, 3.2-3.6 at O3, and its step runs in the same time at all
# three (80.5, 82.3 and 80.0 ms, 1 thread; an elementwise program 3.24, 3.11 and 3.15 ms);
# at O0 the step is 2.3x slower. The vectorisers run at every level (cpu.optimise).
OPT_LEVEL = 1
PIECES_PER_WORKER = 8      # fewer pieces than this a worker are not worth a process's start
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class KernelPiece:
    """A kernel (as its plan names it), compiled as its symbol."""
    kernel: LoopKernel
    symbol: str
    level = OPT_LEVEL

    @property
    def slp(self) -> bool:
        """Whether LLVM's SLP vectoriser runs on it: not on a reduction, whose loops are the
        loop vectoriser's (the GPT step's four column sums, 128 columns of 1,024 rows, took it
        0.08-0.18 s each, two fifths of the pieces' passes, for code no faster: that step's,
        the names MLP's and the LSTMs' in the same time, A/B in one process). Elsewhere it
        pays: without it the CNN's step took 5% longer."""
        return self.kernel.reduce is None

    def module(self) -> ir.Module:
        module = cpu.new_module(self.symbol)
        kernel_function(module, dataclasses.replace(_anonymous(self.kernel), name=self.symbol))
        return module


def kernel_symbols(kernels: list[LoopKernel]) -> dict[str, str]:
    """The symbol of each kernel's name: a digest of its code, the same for kernels that differ
    in their names alone (or in sizes their code does not read)."""
    return {k.name: "k" + _digest(repr(_anonymous(k))) for k in kernels}


def pieces(kernels: list[LoopKernel], symbols: dict[str, str]) -> list[KernelPiece]:
    """The distinct pieces of these kernels, whose symbols are given."""
    distinct: dict[str, KernelPiece] = {}
    for k in kernels:
        distinct.setdefault(symbols[k.name], KernelPiece(k, symbols[k.name]))
    return list(distinct.values())


def _anonymous(k: LoopKernel) -> LoopKernel:
    """k without its name or its stages' (which name nothing in its code), nor the sizes its
    code does not read (backend/llvm.py's size_free)."""
    return size_free(dataclasses.replace(
        k, name="", stages=tuple(dataclasses.replace(s, name="") for s in k.stages)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Linked:
    """An engine holding pieces' object code, and their addresses; alive while a program's
    kernels use one of them."""

    def __init__(self, engine: llvm.ExecutionEngine, symbols: list[str]):
        self.engine = engine
        self.addresses = {s: engine.get_function_address(s) for s in symbols}


# each piece this process has linked, while its engine is alive: a new batch size, or another
# function of the program, finds its pieces here instead of reading and linking them again
_linked: weakref.WeakValueDictionary[str, Linked] = weakref.WeakValueDictionary()


def link(pieces: list[KernelPiece]) -> tuple[dict[str, Linked], tuple[str, ...]]:
    """Where each piece is linked (the engines of this process that hold some already, and a
    new one for the rest, their object code from the cache where it is there), and the
    symbols of the pieces compiled."""
    held = {p.symbol: _linked.get(p.symbol) for p in pieces}
    rest = [p for p in pieces if held[p.symbol] is None]
    if not rest:
        return held, ()
    # (a symbol is a digest of its piece's whole IR: the piece's own text, 280 KB for the GPT
    # step's kernels, cost a warm load 15 ms to digest again)
    keys = {p.symbol: cache.key("object", p.symbol, *cpu.machine_key(p.level)) for p in rest}
    objects = {p.symbol: cache.load(keys[p.symbol]) for p in rest}
    missing = [p for p in rest if objects[p.symbol] is None]
    for p, data in zip(missing, compile_all(missing)):
        objects[p.symbol] = data
        cache.store(keys[p.symbol], data)
    linked = Linked(cpu.link(list(objects.values()), OPT_LEVEL), list(objects))
    for symbol in objects:
        held[symbol] = _linked[symbol] = linked
    return held, tuple(p.symbol for p in missing)


def compile_all(pieces: list[KernelPiece]) -> list[bytes]:
    """The object code of each piece: this process compiles a share, and a worker process
    each of the others, the shares balanced by the pieces' sizes."""
    workers = min(_cores() - 1, len(pieces) // PIECES_PER_WORKER)
    shares: list[list[int]] = [[] for _ in range(workers + 1)]
    loads = [0] * (workers + 1)
    for i in sorted(range(len(pieces)), key=lambda i: -_size(pieces[i])):
        j = loads.index(min(loads))
        shares[j].append(i)
        loads[j] += _size(pieces[i])
    started = [_start([pieces[i] for i in share]) for share in shares[1:]]
    out: list[bytes] = [b""] * len(pieces)
    try:
        for i in shares[0]:
            out[i] = object_code(pieces[i])
        for share, worker in zip(shares[1:], started):
            for i, data in zip(share, _finish(worker, [pieces[i] for i in share])):
                out[i] = data
    finally:                        # an interrupt, or an error here: no worker outlives the call
        for worker in started:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()
    return out


def _size(p: KernelPiece) -> int:
    """About how long a piece takes to compile: its instructions."""
    return len(p.kernel.body) + sum(len(s.body) for s in p.kernel.stages)


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def object_code(p: KernelPiece) -> bytes:
    """A piece compiled: its LLVM IR optimised at its level, and the host's object code."""
    mod = llvm.parse_assembly(str(p.module()))
    mod.verify()
    machine = cpu.target_machine(p.level)
    cpu.optimise(mod, p.level, machine, slp=p.slp)
    return machine.emit_object(mod)


# A worker is `python -c` running serve(): pieces in (pickled: they come from this process),
# object code out. Not multiprocessing, whose children import the parent's main script.
def _start(share: list[KernelPiece]) -> subprocess.Popen | None:
    """A worker compiling share, or None where none could be started."""
    # dslc's folder in place of the current one, where another `backend` may be
    command = f"import sys; sys.path[0] = {str(ROOT)!r}; from backend.objects import serve; serve()"
    try:
        worker = subprocess.Popen([sys.executable, "-c", command], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
    except OSError:
        return None
    with contextlib.suppress(OSError), worker.stdin:      # (if it died at once, _finish sees that)
        worker.stdin.write(pickle.dumps(share))
    return worker


def _finish(worker: subprocess.Popen | None, share: list[KernelPiece]) -> list[bytes]:
    """The worker's object code; where it failed, this process compiles its share (and meets
    whatever made it fail)."""
    if worker is not None:
        with worker.stdout:
            data = worker.stdout.read()
        if worker.wait() == 0:
            return pickle.loads(data)
    return [object_code(p) for p in share]


def serve() -> None:
    share = pickle.load(sys.stdin.buffer)
    sys.stdout.buffer.write(pickle.dumps([object_code(p) for p in share]))
