"""A plan's native steps as one function per segment: the runs of kernels, the products and
the scatters between two host steps, called in order by `segment(i64 *frame, i64 threads)`,
one call from Python instead of one per step.

The frame is an array of i64 words that the runtime (runtime/step.py) fills: the thread
team's entry and box, the functions' and tables' addresses, and the buffers' base addresses
(an argument's, a result's, the arena's: a value is a base plus a fixed offset, a view's
included). No address is in the code, so a module is the same in every process and comes
from the compile cache. A segment returns 0, or 1 where a scatter met an index out of range
(then the runtime runs the call again step by step, for the interpreter's diagnostic).

A fold's loop can become a loop here: the body's own segments called once per step with the
step's slices as bases, its saved states placed by the step's index."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from llvmlite import ir

from backend import cpu
from backend.contract import ARGUMENTS

I8P = ir.IntType(8).as_pointer()
I64 = ir.IntType(64)
TEAM_RUN, TEAM_BOX = 0, 1          # the frame's first words: team.run's address and its box
HEADER = 2

_TASK = ir.FunctionType(ir.VoidType(), [I8P, I64, I64])
_TEAM_RUN = ir.FunctionType(ir.VoidType(), [I64.as_pointer(), _TASK.as_pointer(), I8P, I64])


@dataclass(frozen=True)
class Ref:
    """An address: the base in frame word `word` plus `offset` bytes."""
    word: int
    offset: int = 0


@dataclass(frozen=True)
class RunCall:
    """A run of kernels (backend/cpu.py): the slots of its table that the arena does not fix
    filled, then called alone, or by the team where it is worth sharing."""
    function: int                           # frame words: the run's address,
    table: int                              # its table's,
    words: int                              # and its synchronisation words'
    sync: int                               # how many synchronisation words it has
    patches: tuple[tuple[int, Ref], ...]    # (table slot, address)
    shared: bool


@dataclass(frozen=True)
class ProductCall:
    """A contraction (backend/contract.py's task): A, B and C's addresses written to its
    argument block (the rest fixed there), its job counter zeroed, then called on up to
    `parts` threads; its epilogue's table filled first, and the epilogue run after it where
    the product does not call it."""
    task: int                               # frame words: the task's address,
    block: int                              # and its block's (the job counter at ARGUMENTS)
    operands: tuple[Ref, Ref, Ref]
    parts: int
    epilogue: RunCall | None
    fused: bool


@dataclass(frozen=True)
class ScatterCall:
    """A scatter_add (backend/scatter.py): out, x, indices and updates, and its sizes
    (outer, n, size, inner)."""
    function: int
    operands: tuple[Ref, Ref, Ref, Ref]
    sizes: tuple[int, int, int, int]


@dataclass(frozen=True)
class TakeCall:
    """A take (backend/scatter.py): out, x and indices, and its sizes (outer, n, size,
    row_bytes, from_end)."""
    function: int
    operands: tuple[Ref, Ref, Ref]
    sizes: tuple[int, int, int, int, int]


Call = RunCall | ProductCall | ScatterCall | TakeCall


def module_ir(segments: list[tuple[Call, ...]]) -> ir.Module:
    """`segment{j}(i64 *frame, i64 threads) -> i64` for each segment."""
    module = ir.Module(name="dslc_step")
    module.triple = cpu.llvm.get_default_triple()
    for j, calls in enumerate(segments):
        fn = ir.Function(module, ir.FunctionType(I64, [I64.as_pointer(), I64]), name=f"segment{j}")
        fn.args[0].add_attribute("noalias")
        _Segment(fn).emit(calls)
    return module


def compile_segments(segments: list[tuple[Call, ...]]) -> tuple[object, list[int]]:
    """The engine that holds the segments' code (keep it alive) and each one's address."""
    text = str(module_ir(segments))
    engine = cpu.jit(("step", hashlib.sha256(text.encode()).hexdigest()), lambda: text)
    return engine, [engine.get_function_address(f"segment{j}") for j in range(len(segments))]


class _Segment:
    def __init__(self, fn: ir.Function):
        self.frame, self.threads = fn.args
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.failed = fn.append_basic_block("failed")
        ir.IRBuilder(self.failed).ret(ir.Constant(I64, 1))

    def emit(self, calls: tuple[Call, ...]) -> None:
        for call in calls:
            if isinstance(call, RunCall):
                self.run(call)
            elif isinstance(call, ProductCall):
                self.product(call)
            else:
                self.indexed(call)
        self.b.ret(ir.Constant(I64, 0))

    def word(self, i: int) -> ir.Value:
        return self.b.load(self.b.gep(self.frame, [ir.Constant(I64, i)]))

    def pointer(self, i: int, type_: ir.Type = I8P) -> ir.Value:
        return self.b.inttoptr(self.word(i), type_)

    def address(self, ref: Ref) -> ir.Value:
        return self.b.add(self.word(ref.word), ir.Constant(I64, ref.offset))

    def store(self, value: ir.Value, base: ir.Value, slot: int) -> None:
        self.b.store(value, self.b.gep(base, [ir.Constant(I64, slot)]))

    def on_team(self, task: ir.Value, argument: ir.Value, threads: ir.Value) -> None:
        """The task on `threads` threads (more than 1): this one and the team's helpers."""
        self.b.call(self.pointer(TEAM_RUN, _TEAM_RUN.as_pointer()),
                    [self.pointer(TEAM_BOX, I64.as_pointer()), task, argument, threads])

    def run(self, call: RunCall) -> None:
        b = self.b
        table = self.pointer(call.table, I64.as_pointer())
        for slot, ref in call.patches:
            self.store(self.address(ref), table, slot)
        fn = self.pointer(call.function, _TASK.as_pointer())
        argument = b.bitcast(table, I8P)
        alone = lambda: b.call(fn, [argument, ir.Constant(I64, 0), ir.Constant(I64, 1)])
        if not call.shared:
            alone()
            return
        with b.if_else(b.icmp_signed("<=", self.threads, ir.Constant(I64, 1))) as (one, many):
            with one:
                alone()
            with many:
                words = self.pointer(call.words, I64.as_pointer())
                for i in range(call.sync):          # the counters start at 0 (backend/cpu.py)
                    self.store(ir.Constant(I64, 0), words, i)
                self.on_team(fn, argument, self.threads)

    def product(self, call: ProductCall) -> None:
        b = self.b
        if call.epilogue is not None:
            table = self.pointer(call.epilogue.table, I64.as_pointer())
            for slot, ref in call.epilogue.patches:
                self.store(self.address(ref), table, slot)
        block = self.pointer(call.block, I64.as_pointer())
        for i, ref in enumerate(call.operands):
            self.store(self.address(ref), block, i)
        self.store(ir.Constant(I64, 0), block, ARGUMENTS)         # the job counter
        task = self.pointer(call.task, _TASK.as_pointer())
        argument = b.bitcast(block, I8P)
        parts = ir.Constant(I64, call.parts)
        parts = b.select(b.icmp_signed("<", self.threads, parts), self.threads, parts)
        with b.if_else(b.icmp_signed("<=", parts, ir.Constant(I64, 1))) as (one, many):
            with one:
                b.call(task, [argument, ir.Constant(I64, 0), ir.Constant(I64, 1)])
            with many:
                self.on_team(task, argument, parts)
        if call.epilogue is not None and not call.fused:
            self.run(RunCall(call.epilogue.function, call.epilogue.table, call.epilogue.words,
                             call.epilogue.sync, (), call.epilogue.shared))

    def indexed(self, call: ScatterCall | TakeCall) -> None:
        """A scatter or a gather; a bad index ends the segment."""
        b = self.b
        type_ = ir.FunctionType(I64, [I8P] * len(call.operands) + [I64] * len(call.sizes))
        fn = self.pointer(call.function, type_.as_pointer())
        bad = b.call(fn, [b.inttoptr(self.address(r), I8P) for r in call.operands] +
                     [ir.Constant(I64, n) for n in call.sizes])
        go_on = b.append_basic_block("scattered")
        b.cbranch(b.icmp_signed(">=", bad, ir.Constant(I64, 0)), self.failed, go_on)
        b.position_at_end(go_on)
