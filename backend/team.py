"""One team of helper threads for all of the host's parallel work: the runs of kernels
(backend/cpu.py) and the contraction kernel (backend/contract.py).

A task is a function `void task(i8 *argument, i64 thread, i64 threads)` that threads
0 … threads-1 may call concurrently, each returning when no work is left for it, and that
any of them can finish alone: work is claimed from counters, so a helper the OS holds up
leaves its share to the others. The caller runs thread 0; helper t is a thread that runs
`serve(box, t)` for the life of the process: generated code that waits for the next task,
spinning SPIN_CYCLES of the time-stamp counter after each one (so that back-to-back tasks
find it awake), then asleep on a futex that the caller's post wakes — as OpenMP's threads
do; no Python runs on the way.

The box holds, each on its own cache line: the task (function, argument, threads) and its
generation, published by a store of GENERATION; ENTRY, the generation shifted up, plus
CLOSED once the caller has finished its share, plus the helpers that joined; LEFT, the helpers
that have finished; SLEEPERS, the helpers asleep or going to sleep; and QUIT, set at exit to
let every helper go before the interpreter frees the code they run. A helper
joins by a compare-and-swap of ENTRY, which fails once the caller has closed the task or
posted another, so no helper ever starts a task that is over (whose code and memory may be
gone). The caller, its share done, closes ENTRY and waits until every helper that joined has
left — never for one that has not joined, which may not even be running."""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import threading

import numpy as np
from llvmlite import ir

I32, I64 = ir.IntType(32), ir.IntType(64)
LINE = 8                                    # i64 words a cache line
GENERATION, FUNCTION, ARGUMENT, THREADS = 0, 1, 2, 3     # the task, written together
ENTRY, LEFT, SLEEPERS, QUIT = LINE, 2 * LINE, 3 * LINE, 4 * LINE
MAX_THREADS = 64
BOX = 5 * LINE
SHIFT = 21                                  # ENTRY = generation << SHIFT | CLOSED? | joined
CLOSED = 1 << (SHIFT - 1)
SPIN_CYCLES = 1 << 20                       # time-stamp counts (~0.3 ms) a helper waits awake
SPINS = 1 << 10                             # pauses before a waiting thread yields its core
SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 128, 129     # x86-64 Linux; process-private futexes

Task = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def wait_function(module: ir.Module) -> ir.Function:
    """`wait(i64* word, i64 value)`: returns once the word holds value (an acquire load),
    spinning a while, then yielding (more threads than free cores must still progress)."""
    name = "dslc.wait"
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64]), name=name)
    fn.linkage = "internal"
    # called, not copied: a run waits once a kernel, and the GPT step's run of 95 kernels
    # compiled in 0.75 s with a copy at each wait, 0.43 s with calls
    fn.attributes.add("noinline")
    word, value = fn.args
    entry = fn.append_basic_block("entry")
    head, body, spin, give, step, done = (fn.append_basic_block(n) for n in
                                          ("test", "wait", "spin", "yield", "again", "done"))
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    spins = b.phi(I64)
    spins.add_incoming(ir.Constant(I64, 0), entry)
    b.cbranch(b.icmp_signed("==", b.load_atomic(word, "acquire", 8), value), done, body)
    b.position_at_end(body)
    b.cbranch(b.icmp_signed("<", spins, ir.Constant(I64, SPINS)), spin, give)
    b.position_at_end(spin)
    _pause(b)
    b.branch(step)
    b.position_at_end(give)
    _sched_yield(b)
    b.branch(step)
    b.position_at_end(step)
    spins.add_incoming(b.add(spins, ir.Constant(I64, 1)), step)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _pause(b: ir.IRBuilder) -> None:
    b.call(b.module.declare_intrinsic("llvm.x86.sse2.pause",
                                      fnty=ir.FunctionType(ir.VoidType(), [])), [])


def _sched_yield(b: ir.IRBuilder) -> None:
    """The core to any other runnable thread (libc's sched_yield, named for the JIT by
    backend/cpu.py's target_machine)."""
    fn = b.module.globals.get("sched_yield") or ir.Function(b.module, ir.FunctionType(I32, []),
                                                            name="sched_yield")
    b.call(fn, [])


def _futex(b: ir.IRBuilder, word: ir.Value, op: int, value: ir.Value) -> None:
    """futex(word's low 32 bits, op, value) through libc's syscall (named for the JIT by
    backend/cpu.py's target_machine)."""
    fn = b.module.globals.get("syscall") or ir.Function(
        b.module, ir.FunctionType(I64, [I64], var_arg=True), name="syscall")
    null = ir.Constant(I64.as_pointer(), None)
    b.call(fn, [ir.Constant(I64, SYS_FUTEX), b.bitcast(word, I32.as_pointer()),
                ir.Constant(I32, op), value, null, null, ir.Constant(I32, 0)])


def _task_type() -> ir.PointerType:
    return ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I64, I64]).as_pointer()


def _word(b: ir.IRBuilder, box: ir.Value, i: int | ir.Value) -> ir.Value:
    return b.gep(box, [ir.Constant(I64, i) if isinstance(i, int) else i])


def _build_run(module: ir.Module) -> None:
    """`run(i64* box, task, i8* argument, i64 threads)`: the caller's side. Post the task,
    run thread 0's share, close it, and wait for the helpers that joined."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), _task_type(),
                                                             ir.IntType(8).as_pointer(), I64]),
                     name="team.run")
    box, task, argument, threads = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    word = lambda i: _word(b, box, i)
    generation = b.add(b.load_atomic(word(GENERATION), "monotonic", 8), ir.Constant(I64, 1))
    for i, value in ((LEFT, ir.Constant(I64, 0)), (ENTRY, b.shl(generation, ir.Constant(I64, SHIFT))),
                     (FUNCTION, b.ptrtoint(task, I64)), (ARGUMENT, b.ptrtoint(argument, I64)),
                     (THREADS, threads)):
        b.store_atomic(value, word(i), "monotonic", 8)
    # The task, then its number; then wake the sleepers. Both this store and a helper's count of
    # itself as a sleeper are sequentially consistent, so either it sees the new number and
    # stays awake or this sees it counted and wakes it.
    b.store_atomic(generation, word(GENERATION), "seq_cst", 8)
    with b.if_then(b.icmp_signed(">", b.load_atomic(word(SLEEPERS), "seq_cst", 8), ir.Constant(I64, 0))):
        _futex(b, word(GENERATION), FUTEX_WAKE, ir.Constant(I32, MAX_THREADS))
    b.call(task, [argument, ir.Constant(I64, 0), threads])
    entry = b.atomic_rmw("add", word(ENTRY), ir.Constant(I64, CLOSED), "acq_rel")
    joined = b.and_(entry, ir.Constant(I64, CLOSED - 1))
    b.call(wait_function(module), [word(LEFT), joined])      # acquire: the helpers' writes too
    b.ret_void()


def _build_stop(module: ir.Module) -> None:
    """`stop(i64* box)`: every helper returns from serve (the process is exiting)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer()]), name="team.stop")
    (box,) = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.store_atomic(ir.Constant(I64, 1), _word(b, box, QUIT), "seq_cst", 8)
    b.atomic_rmw("add", _word(b, box, GENERATION), ir.Constant(I64, 1), "seq_cst")
    _futex(b, _word(b, box, GENERATION), FUTEX_WAKE, ir.Constant(I32, MAX_THREADS))
    b.ret_void()


def _build_serve(module: ir.Module) -> None:
    """`serve(i64* box, i64 t)`, helper t's loop until the process exits: join each task
    posted to at least t + 1 threads, spinning SPIN_CYCLES after each, then asleep until the
    next."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64]),
                     name="team.serve")
    box, t = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    word = lambda i: _word(b, box, i)
    c = lambda v: ir.Constant(I64, v)
    clock = lambda: b.call(module.declare_intrinsic("llvm.readcyclecounter",
                                                    fnty=ir.FunctionType(I64, [])), [])
    start, spin, idle, pause, got, join, claim, work, sleep = (
        fn.append_basic_block(s) for s in ("start", "spin", "idle", "pause", "got", "join",
                                           "claim", "work", "sleep"))
    b.branch(start)

    b.position_at_end(start)
    seen = b.phi(I64, "seen")           # generations start at 1: the first look finds a task
    seen.add_incoming(c(0), entry)
    since = clock()
    b.branch(spin)

    b.position_at_end(spin)
    generation = b.load_atomic(word(GENERATION), "acquire", 8)
    with b.if_then(b.icmp_signed("!=", b.load_atomic(word(QUIT), "monotonic", 8), c(0))):
        b.ret_void()                                    # the process is exiting
    b.cbranch(b.icmp_signed("!=", generation, seen), got, idle)
    b.position_at_end(idle)
    b.cbranch(b.icmp_signed(">", b.sub(clock(), since), c(SPIN_CYCLES)), sleep, pause)
    b.position_at_end(pause)
    _pause(b)
    b.branch(spin)

    # A task for fewer threads, one closed, or one already replaced is passed over.
    b.position_at_end(got)
    seen.add_incoming(generation, got)
    wanted = b.icmp_signed("<", t, b.load_atomic(word(THREADS), "monotonic", 8))
    b.cbranch(wanted, join, start)
    b.position_at_end(join)
    now = b.load_atomic(word(ENTRY), "monotonic", 8)
    open_ = b.icmp_signed("==", b.ashr(now, c(SHIFT - 1)), b.shl(generation, c(1)))
    seen.add_incoming(generation, join)
    b.cbranch(open_, claim, start)
    b.position_at_end(claim)
    joined = b.extract_value(b.cmpxchg(word(ENTRY), now, b.add(now, c(1)), "acq_rel",
                                       "monotonic"), 1)
    b.cbranch(joined, work, join)

    # Joined: the caller posts nothing new until this helper has left, so the task is stable.
    b.position_at_end(work)
    task = b.inttoptr(b.load_atomic(word(FUNCTION), "monotonic", 8), _task_type())
    argument = b.inttoptr(b.load_atomic(word(ARGUMENT), "monotonic", 8), ir.IntType(8).as_pointer())
    b.call(task, [argument, t, b.load_atomic(word(THREADS), "monotonic", 8)])
    b.atomic_rmw("add", word(LEFT), c(1), "release")
    seen.add_incoming(generation, work)
    b.branch(start)

    # Asleep: counted as a sleeper, one more look, then the futex, which returns at once if
    # the generation's low bits have moved on (and after a wake, or spuriously).
    b.position_at_end(sleep)
    b.atomic_rmw("add", word(SLEEPERS), c(1), "seq_cst")
    now_generation = b.load_atomic(word(GENERATION), "seq_cst", 8)
    with b.if_then(b.icmp_signed("==", now_generation, seen)):
        _futex(b, word(GENERATION), FUTEX_WAIT, b.trunc(seen, I32))
    b.atomic_rmw("sub", word(SLEEPERS), c(1), "seq_cst")
    seen.add_incoming(seen, b.block)
    b.branch(start)


class Team:
    """The helper threads of this process and their box: `run(task, argument, threads)`."""

    def __init__(self):
        from backend import cpu      # imported here: backend/cpu.py imports this module
        module = ir.Module(name="dslc_team")
        module.triple = cpu.llvm.get_default_triple()
        _build_run(module)
        _build_serve(module)
        _build_stop(module)
        self.engine = cpu.jit(("team",), lambda: module)
        self.run_address = self.engine.get_function_address("team.run")   # for native steps
        self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64)(self.run_address)
        self._serve = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("team.serve"))
        self._stop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(
            self.engine.get_function_address("team.stop"))
        raw = np.zeros(BOX + LINE, dtype=np.int64)
        skip = -raw.ctypes.data % 64 // 8
        self.box = raw[skip:skip + BOX]
        self.address = self.box.ctypes.data
        self.helpers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._tasks: dict[int, Task] = {}

    def run(self, task: int, argument: int, threads: int) -> None:
        """Call the task at address `task` on `threads` threads: this one, and helpers. A call
        while another is running (from another Python thread) runs it on this thread alone."""
        threads = self.hold(threads)
        if threads <= 1:
            call = self._tasks.get(task)
            if call is None:                     # (a ctypes function is made once per task)
                call = self._tasks[task] = Task(task)
            call(argument, 0, 1)
            return
        try:
            self._run(self.address, task, argument, threads)
        finally:
            self._lock.release()

    def hold(self, threads: int) -> int:
        """The team for up to `threads` threads, its helpers started: how many this caller may
        use (1 while another Python thread holds it). Held where more than 1: release() after."""
        threads = min(threads, MAX_THREADS)
        if threads <= 1 or not self._lock.acquire(blocking=False):
            return 1
        try:
            while len(self.helpers) < threads - 1:
                t = len(self.helpers) + 1
                self.helpers.append(threading.Thread(target=self._serve, args=(self.address, t),
                                                     name=f"dslc-{t}", daemon=True))
                self.helpers[-1].start()
        except BaseException:
            self._lock.release()
            raise
        return threads

    def release(self) -> None:
        self._lock.release()

    def stop(self) -> None:
        """Let the helpers go (at exit: before the interpreter frees the code they run)."""
        self._stop(self.address)
        for helper in self.helpers:
            helper.join()
        self.helpers = []
        self.box[:] = 0

    def forget_helpers(self) -> None:
        """In a forked child: the parent's helper threads do not exist here."""
        self.helpers = []
        self.box[:] = 0
        self._lock = threading.Lock()


@functools.cache
def team() -> Team:
    """This process's team (made on first use)."""
    made = Team()
    os.register_at_fork(after_in_child=made.forget_helpers)
    atexit.register(made.stop)
    return made
