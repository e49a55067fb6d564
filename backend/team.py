"""One team of helper threads for all of the host's parallel work: the runs of kernels
(backend/cpu.py) and the contraction kernel (backend/contract.py).

A task is a function `void task(i8 *argument, i64 thread, i64 threads)` that threads
0 … threads-1 may call concurrently, each returning when no work is left for it, and that
any of them can finish alone: work is claimed from counters, so a helper the OS holds up
leaves its share to the others. The caller runs thread 0; helper t runs `serve(box, t)`,
generated code that waits for the next task, spinning SPIN_CYCLES of the time-stamp counter
after each one (so that back-to-back tasks need not wake it), then goes to sleep (serve
returns, and the caller starts it again when it next wants the helper).

The box holds, each on its own cache line: the task (function, argument, threads) and its
generation, published by a release store of GENERATION; ENTRY, the generation shifted up,
plus CLOSED once the caller has finished its share, plus the helpers that joined; LEFT, the
helpers that have finished; and each helper's state. A helper joins by a compare-and-swap of
ENTRY, which fails once the caller has closed the task or posted another, so no helper ever
starts a task that is over (whose code and memory may be gone). The caller, its share done,
closes ENTRY and waits until every helper that joined has left — never for one that has not
joined, which may not even be running."""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from llvmlite import ir

I32, I64 = ir.IntType(32), ir.IntType(64)
LINE = 8                                    # i64 words a cache line
GENERATION, FUNCTION, ARGUMENT, THREADS = 0, 1, 2, 3     # the task, written together
ENTRY, LEFT, STATE = LINE, 2 * LINE, 3 * LINE
MAX_THREADS = 64
BOX = STATE + LINE * MAX_THREADS
SHIFT = 21                                  # ENTRY = generation << SHIFT | CLOSED? | joined
CLOSED = 1 << (SHIFT - 1)
SPIN_CYCLES = 1 << 20                       # time-stamp counts (~0.3 ms) a helper waits awake
SPINS = 1 << 10                             # pauses before a waiting thread yields its core
ASLEEP, AWAKE = 0, 1

Task = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def wait_function(module: ir.Module) -> ir.Function:
    """`wait(i64* word, i64 value)`: returns once the word holds value (an acquire load),
    spinning a while, then yielding (more threads than free cores must still progress)."""
    name = "dslc.wait"
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64]), name=name)
    fn.linkage = "internal"
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
    b.store_atomic(generation, word(GENERATION), "release", 8)      # the task, then its number
    b.call(task, [argument, ir.Constant(I64, 0), threads])
    entry = b.atomic_rmw("add", word(ENTRY), ir.Constant(I64, CLOSED), "acq_rel")
    joined = b.and_(entry, ir.Constant(I64, CLOSED - 1))
    b.call(wait_function(module), [word(LEFT), joined])      # acquire: the helpers' writes too
    b.ret_void()


def _build_serve(module: ir.Module) -> None:
    """`serve(i64* box, i64 t)`: helper t's loop: join each task posted to at least t + 1
    threads, spinning SPIN_CYCLES between tasks; then ASLEEP, and return."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64]),
                     name="team.serve")
    box, t = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    word = lambda i: _word(b, box, i)
    c = lambda v: ir.Constant(I64, v)
    state = _word(b, box, b.add(c(STATE), b.mul(t, c(LINE))))
    clock = lambda: b.call(module.declare_intrinsic("llvm.readcyclecounter",
                                                    fnty=ir.FunctionType(I64, [])), [])
    start, spin, idle, pause, got, join, claim, work, sleep, late, leave = (
        fn.append_basic_block(s) for s in ("start", "spin", "idle", "pause", "got", "join",
                                           "claim", "work", "sleep", "late", "leave"))
    b.branch(start)

    b.position_at_end(start)
    seen = b.phi(I64, "seen")           # generations start at 1: the first look finds a task
    seen.add_incoming(c(0), entry)
    since = clock()
    b.branch(spin)

    b.position_at_end(spin)
    generation = b.load_atomic(word(GENERATION), "acquire", 8)
    b.cbranch(b.icmp_signed("!=", generation, seen), got, idle)
    b.position_at_end(idle)
    b.cbranch(b.icmp_signed(">", b.sub(clock(), since), c(SPIN_CYCLES)), sleep, pause)
    b.position_at_end(pause)
    _pause(b)
    _sched_yield(b)
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

    # Asleep, then one more look: a task posted before the caller could see the new state
    # is served after all (or, if the caller has already started another serve, left to it).
    b.position_at_end(sleep)
    b.store_atomic(c(ASLEEP), state, "seq_cst", 8)
    posted = b.icmp_signed("!=", b.load_atomic(word(GENERATION), "seq_cst", 8), seen)
    b.cbranch(posted, late, leave)
    b.position_at_end(late)
    awake = b.extract_value(b.cmpxchg(state, c(ASLEEP), c(AWAKE), "seq_cst", "seq_cst"), 1)
    seen.add_incoming(seen, late)
    b.cbranch(awake, start, leave)
    b.position_at_end(leave)
    b.ret_void()


class Team:
    """The helper threads of this process and their box: `run(task, argument, threads)`."""

    def __init__(self):
        from backend import cpu      # imported here: backend/cpu.py imports this module
        module = ir.Module(name="dslc_team")
        module.triple = cpu.llvm.get_default_triple()
        _build_run(module)
        _build_serve(module)
        self.engine = cpu.jit(("team",), lambda: module)
        self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64)(self.engine.get_function_address("team.run"))
        self._serve = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address("team.serve"))
        raw = np.zeros(BOX + LINE, dtype=np.int64)
        skip = -raw.ctypes.data % 64 // 8
        self.box = raw[skip:skip + BOX]
        self._address = self.box.ctypes.data
        self._helpers: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def run(self, task: int, argument: int, threads: int) -> None:
        """Call the task at address `task` on `threads` threads: this one, and helpers. A call
        while another is running (from another Python thread) runs it on this thread alone."""
        threads = min(threads, MAX_THREADS)
        if threads <= 1 or not self._lock.acquire(blocking=False):
            Task(task)(argument, 0, 1)
            return
        try:
            self._wake(threads)
            self._run(self._address, task, argument, threads)
        finally:
            self._lock.release()

    def _wake(self, threads: int) -> None:
        """Start serve for each helper below `threads` that is asleep. (A helper going to sleep
        just as it is read awake misses the next task: that task runs on fewer threads.)"""
        while len(self._helpers) < threads - 1:
            self._helpers.append(ThreadPoolExecutor(1, thread_name_prefix="dslc"))
        for t in range(1, threads):
            if self.box[STATE + LINE * t] == ASLEEP:
                self.box[STATE + LINE * t] = AWAKE
                self._helpers[t - 1].submit(self._serve, self._address, t)

    def forget_helpers(self) -> None:
        """In a forked child: the parent's helper threads do not exist here."""
        self._helpers = []
        self.box[STATE::LINE] = ASLEEP
        self._lock = threading.Lock()


@functools.cache
def team() -> Team:
    """This process's team (made on first use)."""
    made = Team()
    os.register_at_fork(after_in_child=made.forget_helpers)
    return made
