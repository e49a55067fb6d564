"""Data parallelism (docs/distributed.md): a step's batch cut into M micro-batches whose
gradients are summed along one fixed binary tree, whether one process computes them all or R
ranks share them, so that the weights are the same bits for every R that divides M. The ranks
exchange their sums through MPI on the host, or through NCCL from GPU to GPU: two
communicators under one schedule, `reduce`."""
from __future__ import annotations

import contextlib
import functools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from dsl import device_sums
from frontend.diagnostics import DslError

T = TypeVar("T")
Node = tuple[int, int]                 # the micro-batches lo … hi-1 that a node of the tree sums
Partial = list                        # a node's sum: the loss, then the gradient's leaves
                                       # (NumPy arrays, or DeviceArrays under NCCL)

INSTALL = "pip install 'dslc[distributed]' (mpi4py and MPICH)"
NCCL_INSTALL = "pip install 'dslc[nccl]' (CuPy and NCCL for CUDA 12)"
RANK_DIR = "DSLC_RANK_DIR"             # where `--ranks` asks each rank to write its process id


# ---------------------------------------------------------------- the tree

def cut(lo: int, hi: int) -> int:
    """Where the tree splits [lo, hi): after the largest power of two below its length, which
    makes it the pairwise tree (0+1, 2+3, …, then pairs of pairs), an odd node moving up as is."""
    return lo + (1 << ((hi - lo - 1).bit_length() - 1))


def tree_sum(leaf: Callable[[int], T], add: Callable[[T, T], T], lo: int, hi: int,
             known: dict[Node, T] | None = None) -> T:
    """The sum of leaf(lo) … leaf(hi-1) along the tree, taking the nodes in `known` as given."""
    if known and (lo, hi) in known:
        return known[(lo, hi)]
    if hi - lo == 1:
        return leaf(lo)
    mid = cut(lo, hi)
    return add(tree_sum(leaf, add, lo, mid, known), tree_sum(leaf, add, mid, hi, known))


def frontier(lo: int, hi: int, m: int) -> list[Node]:
    """The largest nodes of the tree over [0, m) inside [lo, hi), left to right: the sums a
    rank that holds micro-batches lo … hi-1 computes alone."""
    nodes: list[Node] = []

    def walk(a: int, b: int) -> None:
        if lo <= a and b <= hi:
            nodes.append((a, b))
        elif a < hi and lo < b:
            walk(a, cut(a, b))
            walk(cut(a, b), b)

    walk(0, m)
    return nodes


def add(a: Partial, b: Partial) -> Partial:
    """a + b, leaf by leaf, where the leaves are: on the device or on the host."""
    return [device_sums.add(x, y) if _on_device(x) else x + y for x, y in zip(a, b)]


def mean(total: Partial, m: int) -> Partial:
    return [device_sums.divide(x, m) if _on_device(x) else x / np.asarray(m, x.dtype) for x in total]


def _on_device(x) -> bool:
    cuda = sys.modules.get("runtime.cuda")            # not loaded: no DeviceArray exists
    return cuda is not None and isinstance(x, cuda.DeviceArray)


# ---------------------------------------------------------------- the ranks

class Team(Protocol):
    """The processes that train together, and how they exchange sums; rank 0 writes
    checkpoints, logs and plots."""
    rank: int
    size: int

    def keep(self, x) -> Any:
        """A result of the model where this team sums and exchanges it (host or device)."""

    def gather(self, mine: list[Partial], counts: Sequence[int], step: int) -> list[list[Partial]]:
        """Every rank's node sums (`counts[r]` of them from rank r, each leaf shaped like
        mine[0]'s), on every rank."""


@dataclass(frozen=True)
class Solo:
    """One process: no one to exchange with."""
    rank: int = 0
    size: int = 1

    def keep(self, x) -> np.ndarray:
        return np.asarray(x)

    def gather(self, mine: list[Partial], counts: Sequence[int], step: int) -> list[list[Partial]]:
        return [mine]


class Mpi:
    """The ranks of MPI_COMM_WORLD. A rank that waits longer than `timeout` seconds for
    another's gradients ends the job with a diagnostic that names the ranks it waits for."""

    def __init__(self, comm, timeout: float):
        self.comm, self.timeout = comm, timeout
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.seconds = 0.0                   # spent in gather, waits for the others included
        self.bytes = 0                       # received

    def keep(self, x) -> np.ndarray:
        return np.asarray(x)

    def gather(self, mine: list[Partial], counts: Sequence[int], step: int) -> list[list[Partial]]:
        """The nodes as one array of bytes a rank, exchanged point to point."""
        node = sum(a.nbytes for a in mine[0])
        t0 = time.perf_counter()
        try:
            got = self._exchange(_pack(mine), [node * c for c in counts], step)
        finally:
            self.seconds += time.perf_counter() - t0
            self.bytes += node * (sum(counts) - len(mine))
        return [_unpack(data, mine[0], c) for data, c in zip(got, counts)]

    def _exchange(self, mine: np.ndarray, sizes: Sequence[int], step: int) -> list[np.ndarray]:
        tag = step % 32768                                    # MPI promises tags up to 32767
        out = [mine if r == self.rank else np.empty(sizes[r], np.uint8) for r in range(self.size)]
        others = [r for r in range(self.size) if r != self.rank]
        receiving = {r: self.comm.Irecv(out[r], source=r, tag=tag) for r in others}
        sending = {r: self.comm.Isend(mine, dest=r, tag=tag) for r in others}
        deadline, pause = time.monotonic() + self.timeout, 1e-5
        while receiving or sending:
            # polled with growing pauses, not waited on: a blocked MPI wait spins on a core the
            # ranks on this machine need, and never gives up on a rank that died or hangs
            receiving = {r: q for r, q in receiving.items() if not q.Test()}
            sending = {r: q for r, q in sending.items() if not q.Test()}
            if (receiving or sending) and time.monotonic() > deadline:
                silent = sorted(set(receiving) | set(sending))
                raise silence(self.rank, silent, step, self.timeout)
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        return out

    def abort(self) -> None:
        self.comm.Abort(1)
        os._exit(1)                      # MPICH's Abort may return before mpiexec kills us


class Nccl:
    """The ranks of an MPI job, each on its GPU, exchanging their sums from device to device
    through NCCL (`lib`: cupy.cuda.nccl): grouped sends and receives, on the stream the
    runtime computes on. MPI still starts the job, introduces the ranks and aborts it."""

    def __init__(self, job: Mpi, lib, comm):
        self.job, self.lib, self.comm = job, lib, comm
        self.rank, self.size, self.timeout = job.rank, job.size, job.timeout
        self.seconds, self.bytes = 0.0, 0

    def keep(self, x):
        return x                                        # a DeviceArray: it stays on the GPU

    def gather(self, mine: list[Partial], counts: Sequence[int], step: int) -> list[list[Partial]]:
        t0 = time.perf_counter()
        out = [mine if r == self.rank else [[a.blank("a rank's gradient") for a in mine[0]]
                                             for _ in range(counts[r])] for r in range(self.size)]
        byte = self.lib.NCCL_UINT8
        self.lib.groupStart()
        for r in range(self.size):
            if r != self.rank:
                for a in (a for node in mine for a in node):
                    self.comm.send(a.ptr, a.nbytes, byte, r, 0)
                for a in (a for node in out[r] for a in node):
                    self.comm.recv(a.ptr, a.nbytes, byte, r, 0)
        self.lib.groupEnd()
        self._wait(mine[0][0].buffer.memory.drv, step)
        self.seconds += time.perf_counter() - t0
        self.bytes += sum(a.nbytes for a in mine[0]) * (sum(counts) - len(mine))
        return out

    def _wait(self, drv, step: int) -> None:
        """Until the exchange is done: a peer that never sends would block NCCL for ever."""
        event, deadline, pause = drv.record(), time.monotonic() + self.timeout, 1e-5
        while not drv.done(event):
            if time.monotonic() > deadline:
                raise silence(self.rank, [r for r in range(self.size) if r != self.rank], step,
                              self.timeout)
            time.sleep(pause)
            pause = min(2 * pause, 0.005)

    def abort(self) -> None:
        self.job.abort()


def silence(rank: int, silent: list[int], step: int, timeout: float) -> DslError:
    return DslError(None, f"rank {rank}: {_ranks(silent)} exchanged no gradients for step {step} "
                          f"within {timeout:g} s: {'it' if len(silent) == 1 else 'they'} died or "
                          "hang (--rank-timeout sets the wait)")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def launched_size() -> int:
    """How many ranks the mpiexec that started this process started (1 without one)."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


@functools.cache
def world(timeout: float) -> Team:
    """The team of this process: Mpi under an mpiexec of several ranks, else Solo."""
    n = launched_size()
    if n <= 1:
        return Solo()
    try:
        from mpi4py import MPI
    except ImportError:
        raise DslError(None, f"this process is one of {n} ranks that mpiexec started, but "
                             f"mpi4py is not installed: {INSTALL}") from None
    team = Mpi(MPI.COMM_WORLD, timeout)
    if os.environ.get(RANK_DIR):                              # for `--ranks`' report of a death
        (Path(os.environ[RANK_DIR]) / str(os.getpid())).write_text(str(team.rank))
    return team


@functools.cache
def on_device(team: Team, device: str) -> Team:
    """The team that exchanges a run's sums: through NCCL where the ranks compute on GPUs."""
    if device != "cuda" or not isinstance(team, Mpi):
        return team
    try:
        from cupy.cuda import nccl
    except ImportError:
        raise DslError(None, f"--device cuda on {team.size} ranks combines the gradients with "
                             f"NCCL, but CuPy is not installed: {NCCL_INSTALL}") from None
    unique = team.comm.bcast(nccl.get_unique_id() if team.rank == 0 else None, root=0)
    try:
        comm = nccl.NcclCommunicator(team.size, unique, team.rank)
    except nccl.NcclError as e:
        raise DslError(None, f"rank {team.rank}: NCCL could not join the ranks' GPUs ({e}); "
                             "each rank needs a GPU of its own (CUDA_VISIBLE_DEVICES)") from None
    return Nccl(team, nccl, comm)


def fail(team: Team, error: DslError) -> None:
    """A diagnostic on one rank of several: printed, then the whole job ended, so that no
    other rank waits for this one."""
    if isinstance(team, (Mpi, Nccl)) and team.size > 1:
        sys.stderr.write(f"{error}\n")              # one write: ranks' lines do not interleave
        sys.stderr.flush()
        # MPICH's proxy relays a rank's stderr on its own time, and an abort kills it, maybe
        # before it has (seen once in CI: the job ended without rank 0's diagnostic)
        time.sleep(0.5)
        team.abort()


# ---------------------------------------------------------------- a step

def reduce(leaf: Callable[[int], Partial], m: int, team: Team, step: int) -> Partial:
    """The mean over micro-batches 0 … m-1 of leaf(i), summed along the tree: this rank
    computes the leaves of its share (m / R consecutive micro-batches) and its frontier's
    sums, the ranks gather every frontier, and every rank sums the rest of the tree alike."""
    share = m // team.size
    lo, hi = team.rank * share, (team.rank + 1) * share
    mine = [tree_sum(leaf, add, a, b) for a, b in frontier(lo, hi, m)]
    known = dict(zip(frontier(lo, hi, m), mine))
    if team.size > 1:
        fronts = [frontier(r * share, (r + 1) * share, m) for r in range(team.size)]
        for nodes, sums in zip(fronts, team.gather(mine, [len(f) for f in fronts], step)):
            known.update(zip(nodes, sums))
    return mean(tree_sum(leaf, add, 0, m, known), m)


def _pack(partials: list[Partial]) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                           for p in partials for a in p])


def _unpack(data: np.ndarray, like: Partial, count: int) -> list[Partial]:
    out, at = [], 0
    for _ in range(count):
        part = []
        for a in like:
            part.append(np.frombuffer(data, a.dtype, a.size, at).reshape(a.shape))
            at += a.nbytes
        out.append(part)
    return out


def check(micro_batches: int, team: Team, batch: int) -> None:
    """The configurations a run of `micro_batches` on `team` cannot take, as diagnostics."""
    if micro_batches < 1:
        raise DslError(None, f"--micro-batches must be at least 1, got {micro_batches}")
    if micro_batches % team.size:
        raise DslError(None, f"{micro_batches} micro-batches do not share out over {team.size} "
                             f"ranks: give --micro-batches a multiple of {team.size}")
    if batch % micro_batches:
        raise DslError(None, f"the batch of {batch} examples does not split into {micro_batches} "
                             f"equal micro-batches: give a --batch-size that {micro_batches} divides")


# ---------------------------------------------------------------- `dslc train --ranks R`

def launch(ranks: int, argv: list[str]) -> int:
    """`mpiexec -n ranks python -m dsl ARGV`, its exit status; a rank that dies is reported by
    its rank (MPICH names only its process id)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise DslError(None, f"--ranks needs mpi4py and an MPI implementation: {INSTALL}") from None
    here = str(Path(sys.executable).parent)
    mpiexec = shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is None:
        raise DslError(None, f"--ranks needs an mpiexec (none beside {sys.executable} or on "
                             f"PATH): {INSTALL}")
    with tempfile.TemporaryDirectory(prefix="dslc-ranks-") as pids:
        child = subprocess.Popen([mpiexec, "-n", str(ranks), sys.executable, "-m", "dsl", *argv],
                                 env={**os.environ, RANK_DIR: pids}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, bufsize=1)
        errors = threading.Thread(target=_relay_errors, args=(child.stderr,))
        errors.start()
        ends = Ends(Path(pids), ranks)
        try:
            _relay(child.stdout, ends)
            return _status(child.wait())
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)               # mpiexec passes it on to the ranks
            _relay(child.stdout, ends)
            child.wait()
            raise
        finally:
            ends.close()
            errors.join()


class Ends:
    """The order in which the ranks' processes end, each watched through a pidfd (Linux): once
    one rank dies, mpiexec kills the others, and MPICH's banner may name one of those."""

    def __init__(self, pids: Path, ranks: int):
        self.pids, self.ranks = pids, ranks
        self.order: list[list[int]] = []           # the processes seen to end, a poll at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def rank(self, pid: int) -> str | None:
        """The rank that process `pid` was, as it wrote it at its start."""
        where = self.pids / str(pid)
        return where.read_text() if where.exists() else None

    def first(self) -> int | None:
        """The process id of the rank that ended first, if it was seen to end alone."""
        return self.order[0][0] if self.order and len(self.order[0]) == 1 else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        if not hasattr(os, "pidfd_open"):                # not Linux: the banner alone names
            return
        poller, watched = select.poll(), {}
        try:
            while not self._stop.is_set():
                if len(watched) < self.ranks:             # ranks write their pid as they start
                    for name in os.listdir(self.pids):
                        if int(name) not in watched.values():
                            with contextlib.suppress(OSError):    # gone already
                                fd = os.pidfd_open(int(name))
                                watched[fd] = int(name)
                                poller.register(fd, select.POLLIN)
                ended = poller.poll(10)
                if ended:
                    self.order.append([watched[fd] for fd, _ in ended])
                for fd, _ in ended:
                    poller.unregister(fd)
        finally:
            for fd in watched:
                os.close(fd)


MPI_ABORT = re.compile(r"Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): application called MPI_Abort")


def _relay_errors(stream) -> None:
    """Copy the ranks' stderr, less MPICH's line about each rank that called MPI_Abort (after
    printing its own diagnostic)."""
    after_abort = False
    for line in stream:
        if not MPI_ABORT.match(line) and not (after_abort and line == "\n"):
            sys.stderr.write(line)
            sys.stderr.flush()
        after_abort = bool(MPI_ABORT.match(line))


def _relay(stream, ends: Ends) -> None:
    """Copy the ranks' stdout, replacing the banner MPICH prints there about a process that
    ended badly with a diagnostic on stderr that names its rank."""
    banner: list[str] = []
    for line in stream:
        if line.startswith("=====") or banner:
            banner.append(line)
            if line.startswith("Please see the FAQ"):
                print(_death(banner, ends) or "".join(banner), file=sys.stderr, flush=True)
                banner = []
        else:
            sys.stdout.write(line)
            sys.stdout.flush()
    if banner:
        sys.stderr.write("".join(banner))


def _death(banner: list[str], ends: Ends) -> str | None:
    """The banner as a line naming the rank that died first: the banner's own process, or,
    where that one ended after another, the other (whose cause MPICH does not print)."""
    text = "".join(banner)
    pid, why = re.search(r"PID (\d+)", text), re.search(r"EXIT STRING: (.*)", text)
    named = int(pid.group(1)) if pid else None
    first = ends.first()
    if first is not None and first != named and ends.rank(first) is not None:
        return (f"dslc: rank {ends.rank(first)} (process {first}) ended first, unexpectedly; "
                "mpiexec stopped the other ranks")
    if named is None or ends.rank(named) is None:
        return None
    cause = why.group(1).strip() if why else "an error"
    return (f"dslc: rank {ends.rank(named)} (process {named}) ended with {cause}; "
            "mpiexec stopped the other ranks")


def _status(code: int) -> int:
    """mpiexec's status as dslc's: 0, 130 for Ctrl-C, else 1 (a rank's diagnostic said why)."""
    return code if code in (0, 130) else 1
