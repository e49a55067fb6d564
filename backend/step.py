"""A plan's native steps as one function per segment: the runs of kernels, the products and
the scatters between two host steps, called in order by `segment(i64 *frame, i64 threads)`,
one call from Python instead of one per step.

The frame is an array of i64 words that the runtime (runtime/step.py) fills: the thread
team's entry and box, the functions' and tables' addresses, and the buffers' base addresses
(an argument's, a result's, the arena's: a value is a base plus a fixed offset, a view's
included). No address is in the code, so a module is the same in every process and comes
from the compile cache. A segment returns 0, or 1 where a scatter or a gather met an index
out of range (then the runtime runs the call again step by step, for the interpreter's
diagnostic).

A fold over a tensor whose body is native throughout is a loop here: each step writes the
body's frame (its parameters: the states, the step's slices, the constants; its results: the
next states, the step's slices of the emits) and runs the body's calls on that frame."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace

from llvmlite import ir

from backend import cpu
from backend.contract import ARGUMENTS
from backend.llvm import loop
from runtime import cache

I8P = ir.IntType(8).as_pointer()
I64 = ir.IntType(64)
# the frame's first words: team.run's address and its box, and copy_rows's address
TEAM_RUN, TEAM_BOX, COPY_ROWS = 0, 1, 2
HEADER = 3

_TASK = ir.FunctionType(ir.VoidType(), [I8P, I64, I64])
# backend/contract.py's kernel: A, B, C, 11 sizes and strides, scratch, next_job, epilogue,
# its table, thread_index, thread_count
_KERNEL = ir.FunctionType(ir.VoidType(), [I8P] * 3 + [I64] * 11 + [I8P, I64.as_pointer(), I8P,
                                                                     I8P, I64, I64])
KERNEL = ARGUMENTS + 1             # a product block's word for the kernel's address (outer)
OUTER = ARGUMENTS + 8              # its words from here on: each outer axis's count and steps
# copy_rows(destination, source, count, source stride, destination stride, row bytes)
_COPY_ROWS = ir.FunctionType(ir.VoidType(), [I8P, I8P] + [I64] * 4)
# rows of these bytes (a transpose's elements) are copied by a load and a store, not by memcpy
ELEMENT_ROWS = (1, 2, 4, 8)
_TEAM_RUN = ir.FunctionType(ir.VoidType(), [I64.as_pointer(), _TASK.as_pointer(), I8P, I64])


@dataclass(frozen=True)
class Ref:
    """An address: the base in frame word `word` plus `offset` bytes (a Size once sized)."""
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
    the product does not call it.

    A batched product whose operands' batch axes do not step through memory as one (q @ kᵀ
    of heads sliced from one qkv array) keeps its `outer` leading batch axes: one product a
    point of them, the kernel read in place, the points shared among the threads (each runs
    its points' products alone). Each axis's count, and the bytes A, B and C move along it,
    are in the block from word OUTER on, not in the code: they change with the batch size."""
    task: int                               # frame words: the task's address,
    block: int                              # and its block's (the job counter at ARGUMENTS)
    operands: tuple[Ref, Ref, Ref]
    parts: int
    epilogue: RunCall | None
    fused: bool
    outer: int = 0
    kernel: int = 0                         # a frame word: the kernel's own address, for outer


@dataclass(frozen=True)
class RoutineCall:
    """A routine compiled for the process, called with addresses and sizes: it returns -1, or
    at least 0 where an index is out of range, which ends the segment."""
    function: int
    operands: tuple[Ref, ...]
    sizes: tuple[int, ...]


class ScatterCall(RoutineCall):
    """A scatter_add (backend/scatter.py): out, x, indices and updates, and its sizes
    (outer, n, size, inner)."""


class TakeCall(RoutineCall):
    """A take (backend/scatter.py): out, x and indices, and its sizes (outer, n, size,
    row_bytes, from_end)."""


class DrawCall(RoutineCall):
    """A draw or a key's split or fold_in (backend/draws.py): its inputs and out, and its
    sizes (n, and a uniform draw's bounds)."""


class ExtremeCall(RoutineCall):
    """An argmax or an argmin (backend/extreme.py): x and out, and its sizes (outer, n,
    inner)."""


@dataclass(frozen=True)
class CopyCall:
    """Rows of contiguous bytes copied (a split's parts, a concat's or a stack's inputs):
    `row` bytes at each point of `levels`, nested loops from the outermost, each (its count,
    the bytes between the source's rows along it, between the destination's)."""
    source: Ref
    destination: Ref
    levels: tuple[tuple[int, int, int], ...]
    row: int


@dataclass(frozen=True)
class State:
    """A fold's state: where it starts, where it ends, and a frame word holding a buffer of its
    size. The steps write the end and the spare by turns, so that the last step writes the end."""
    initial: Ref
    final: Ref
    spare: int


@dataclass(frozen=True)
class ScanCall:
    """A fold of `length` steps (at least 1), backwards where `reverse`, whose body's calls run
    on the body's frame (its address in frame word `body`). Before each step the body's
    parameter words get the states, the scanned inputs' slices and the constants; its result
    words get the next states and the emits' slices, or, for a result the body does not write
    itself (a parameter, or a value it returns twice), the step copies it there after."""
    body: int
    calls: tuple[Call, ...]
    length: int
    reverse: bool
    states: tuple[State, ...]
    sequences: tuple[tuple[Ref, int], ...]      # (first slice, bytes between slices)
    constants: tuple[Ref, ...]
    params: tuple[int, ...]                     # the body frame's words: states, slices, constants
    results: tuple[tuple[int, bool, int], ...]  # (body frame's word, copied, bytes): states, emits
    emits: tuple[tuple[Ref, int], ...]


@dataclass(frozen=True)
class AddressCall:
    """Frame words that hold the address of an array object on entry, each replaced by the
    address of the array's data: the object's word `field` bytes in (NumPy's data pointer).
    A call's first segment starts with it, so that Python writes each argument's id, not its
    address, which costs it twenty times more."""
    words: tuple[int, ...]
    field: int


Call = RunCall | ProductCall | RoutineCall | CopyCall | ScanCall | AddressCall


@dataclass(frozen=True)
class Size:
    """Where the code reads a size (an offset, a length, a stride, or whether a run's work is
    worth the team: 1 or 0), frame word `index` past the segments' own. Calls hold these in
    place of the numbers (sized), so that their code, and the key it is cached by, cannot
    depend on a size."""
    index: int


def sized(segments: list[tuple[Call, ...]]) -> tuple[list[tuple[Call, ...]], list[int]]:
    """The segments with each size a Size, and the sizes in order of their indices."""
    sizes: list[int] = []

    def size(n: int) -> Size:
        sizes.append(n)
        return Size(len(sizes) - 1)

    def ref(r: Ref) -> Ref:
        return Ref(r.word, size(r.offset))

    def call(c: Call) -> Call:
        if isinstance(c, RunCall):
            return replace(c, patches=tuple((slot, ref(r)) for slot, r in c.patches),
                           shared=size(int(c.shared)))
        if isinstance(c, ProductCall):
            return replace(c, operands=tuple(map(ref, c.operands)), parts=size(c.parts),
                           epilogue=c.epilogue and call(c.epilogue))
        if isinstance(c, RoutineCall):
            return replace(c, operands=tuple(map(ref, c.operands)), sizes=tuple(map(size, c.sizes)))
        if isinstance(c, CopyCall):
            return CopyCall(ref(c.source), ref(c.destination),
                            tuple(tuple(map(size, level)) for level in c.levels), size(c.row))
        if isinstance(c, ScanCall):
            return replace(c, calls=tuple(map(call, c.calls)), length=size(c.length),
                           states=tuple(State(ref(s.initial), ref(s.final), s.spare)
                                        for s in c.states),
                           sequences=tuple((ref(r), size(n)) for r, n in c.sequences),
                           constants=tuple(map(ref, c.constants)),
                           results=tuple((word, copied, size(n)) for word, copied, n in c.results),
                           emits=tuple((ref(r), size(n)) for r, n in c.emits))
        return c                                    # an AddressCall: frame words alone

    return [tuple(map(call, calls)) for calls in segments], sizes


def module_ir(segments: list[tuple[Call, ...]], sizes_from: int) -> ir.Module:
    """`segment{j}(i64 *frame, i64 threads) -> i64` for each of the sized segments, which read
    their sizes from the frame's words sizes_from on: the module is the same at every batch
    size (and compiled once)."""
    module = ir.Module(name="dslc_step")
    module.triple = cpu.llvm.get_default_triple()
    for j, calls in enumerate(segments):
        fn = ir.Function(module, ir.FunctionType(I64, [I64.as_pointer(), I64]), name=f"segment{j}")
        fn.args[0].add_attribute("noalias")
        _Segment(fn, sizes_from).emit(calls)
    return module


def compile_segments(segments: list[tuple[Call, ...]], sizes_from: int
                     ) -> tuple[object, list[int], list[int]]:
    """The engine that holds the segments' code (keep it alive), each one's address, and the
    sizes the frame holds from word sizes_from on. The code is keyed by the IR's text; the
    text's digest is remembered by the sized calls, so that neither a warm load nor a new
    batch size builds the IR again (0.35 s of the GPT step's warm load; the GPT loss's native
    step at a new batch size took 29 ms, now 6-10)."""
    skeleton, sizes = sized(segments)
    text = functools.cache(lambda: str(module_ir(skeleton, sizes_from)))
    k = cache.key("segments", cache.code_digest("backend", "ir"), repr((skeleton, sizes_from)))
    digest = cache.memo(k, lambda: hashlib.sha256(text().encode()).hexdigest(), str)
    # O0: a segment is glue (loads, stores, calls, a fold's loop) around the kernels, where the
    # time goes. The GPT step's segments: code generation 0.03 s against O1's 0.34 (a loaded
    # machine), and LLVM's passes 0.012 s against O1's 0.085 (a Zen 4); its step, the names
    # MLP's and the LSTM gradient's run in the same time (A/B in one process, 7 runs each)
    engine = cpu.jit(("step", digest), text, opt=0)
    addresses = [engine.get_function_address(f"segment{j}") for j in range(len(segments))]
    return engine, addresses, sizes


class _Segment:
    def __init__(self, fn: ir.Function, sizes_from: int):
        self.frame, self.threads = fn.args
        self.top = self.frame                   # the segment's frame, where the sizes are
        self.sizes_from = sizes_from
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.failed = fn.append_basic_block("failed")
        ir.IRBuilder(self.failed).ret(ir.Constant(I64, 1))
        self.memcpy = fn.module.declare_intrinsic("llvm.memcpy", [I8P, I8P, I64])
        self.memset = fn.module.declare_intrinsic("llvm.memset", [I8P, I64])

    def emit(self, calls: tuple[Call, ...]) -> None:
        self.calls(calls)
        self.b.ret(ir.Constant(I64, 0))

    def calls(self, calls: tuple[Call, ...]) -> None:
        for call in calls:
            if isinstance(call, RunCall):
                self.run(call)
            elif isinstance(call, ProductCall):
                self.product(call)
            elif isinstance(call, CopyCall):
                self.copy(call)
            elif isinstance(call, ScanCall):
                self.scan(call)
            elif isinstance(call, AddressCall):
                self.addresses(call)
            else:
                self.routine(call)

    def word(self, i: int) -> ir.Value:
        return self.b.load(self.b.gep(self.frame, [ir.Constant(I64, i)]))

    def size(self, n: Size) -> ir.Value:
        """n, read from the segment's frame: a size, which the code does not hold."""
        if not isinstance(n, Size):             # (a number here would be code of one size)
            raise TypeError(f"a size in the code of a segment: {n!r}")
        at = ir.Constant(I64, self.sizes_from + n.index)
        return self.b.load(self.b.gep(self.top, [at]))

    def pointer(self, i: int, type_: ir.Type = I8P) -> ir.Value:
        return self.b.inttoptr(self.word(i), type_)

    def address(self, ref: Ref) -> ir.Value:
        return self.b.add(self.word(ref.word), self.size(ref.offset))

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
        alone = b.or_(b.icmp_signed("<=", self.threads, ir.Constant(I64, 1)),
                      b.icmp_signed("==", self.size(call.shared), ir.Constant(I64, 0)))
        with b.if_else(alone) as (one, many):
            with one:
                b.call(fn, [argument, ir.Constant(I64, 0), ir.Constant(I64, 1)])
            with many:
                # the counters start at 0 (backend/cpu.py): one memset, not a store a word
                b.call(self.memset, [self.pointer(call.words), ir.Constant(ir.IntType(8), 0),
                                     ir.Constant(I64, 8 * call.sync), ir.Constant(ir.IntType(1), 0)])
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
        if call.outer:                     # the points' counter, and the kernel for the task
            self.store(self.word(call.kernel), block, KERNEL)
            task = _points_task(self.b.module, call.outer)
        else:
            task = self.pointer(call.task, _TASK.as_pointer())
        argument = b.bitcast(block, I8P)
        parts = self.size(call.parts)
        parts = b.select(b.icmp_signed("<", self.threads, parts), self.threads, parts)
        with b.if_else(b.icmp_signed("<=", parts, ir.Constant(I64, 1))) as (one, many):
            with one:
                b.call(task, [argument, ir.Constant(I64, 0), ir.Constant(I64, 1)])
            with many:
                self.on_team(task, argument, parts)
        if call.epilogue is not None and not call.fused:
            self.run(RunCall(call.epilogue.function, call.epilogue.table, call.epilogue.words,
                             call.epilogue.sync, (), call.epilogue.shared))

    def addresses(self, call: AddressCall) -> None:
        for word in call.words:
            field = self.b.add(self.word(word), ir.Constant(I64, call.field))
            data = self.b.load(self.b.inttoptr(field, I64.as_pointer()))
            self.store(data, self.frame, word)

    def routine(self, call: RoutineCall) -> None:
        """A routine's call; an index out of range ends the segment."""
        b = self.b
        type_ = ir.FunctionType(I64, [I8P] * len(call.operands) + [I64] * len(call.sizes))
        fn = self.pointer(call.function, type_.as_pointer())
        bad = b.call(fn, [b.inttoptr(self.address(r), I8P) for r in call.operands] +
                     [self.size(n) for n in call.sizes])
        go_on = b.append_basic_block("routine_done")
        b.cbranch(b.icmp_signed(">=", bad, ir.Constant(I64, 0)), self.failed, go_on)
        b.position_at_end(go_on)

    def copy_bytes(self, destination: ir.Value, source: ir.Value, size: ir.Value) -> None:
        b = self.b
        b.call(self.memcpy, [b.inttoptr(destination, I8P), b.inttoptr(source, I8P),
                             size, ir.Constant(ir.IntType(1), 0)])

    def copy(self, call: CopyCall) -> None:
        """The rows by nested loops, the innermost level's by copy_rows."""
        b = self.b
        levels, row = [[self.size(s) for s in level] for level in call.levels], self.size(call.row)

        def rows(level: int, source: ir.Value, destination: ir.Value) -> None:
            count, from_, to = levels[level]
            if level == len(levels) - 1:
                b.call(self.pointer(COPY_ROWS, _COPY_ROWS.as_pointer()),
                       [b.inttoptr(destination, I8P), b.inttoptr(source, I8P), count, from_, to, row])
                return
            loop(b, ir.Constant(I64, 0), count, lambda r: rows(
                level + 1, b.add(source, b.mul(r, from_)), b.add(destination, b.mul(r, to))))

        source, destination = self.address(call.source), self.address(call.destination)
        if levels:
            rows(0, source, destination)
        else:
            self.copy_bytes(destination, source, row)

    def scan(self, call: ScanCall) -> None:
        b = self.b
        outer, body = self.frame, self.pointer(call.body, I64.as_pointer())
        length = self.size(call.length)
        last = b.sub(length, ir.Constant(I64, 1))
        zero = ir.Constant(I64, 0)
        sequences = [(ref, self.size(stride)) for ref, stride in call.sequences]
        emits = [(ref, self.size(stride)) for ref, stride in call.emits]
        copies = [self.size(size) for _, _, size in call.results]

        def even(n: ir.Value) -> ir.Value:
            return b.icmp_signed("==", b.and_(n, ir.Constant(I64, 1)), zero)

        def step(k: ir.Value) -> None:
            t = b.sub(last, k) if call.reverse else k
            at = lambda ref, stride: b.add(self.address(ref), b.mul(t, stride))
            finals = [self.address(s.final) for s in call.states]
            spares = [self.word(s.spare) for s in call.states]
            # step k writes the final buffer where length - 1 - k is even, and reads what step
            # k - 1 wrote
            writing, read = even(b.sub(last, k)), even(b.sub(last, b.sub(k, ir.Constant(I64, 1))))
            first = b.icmp_signed("==", k, zero)
            values = [b.select(first, self.address(s.initial), b.select(read, f, x))
                      for s, f, x in zip(call.states, finals, spares)]
            values += [at(ref, stride) for ref, stride in sequences]
            values += [self.address(ref) for ref in call.constants]
            destinations = [b.select(writing, f, x) for f, x in zip(finals, spares)]
            destinations += [at(ref, stride) for ref, stride in emits]
            self.frame = body
            for word, value in zip(call.params, values):
                self.store(value, body, word)
            for (word, copied, _), destination in zip(call.results, destinations):
                if not copied:
                    self.store(destination, body, word)
            self.calls(call.calls)
            for (word, copied, _), size, destination in zip(call.results, copies, destinations):
                if copied:
                    self.copy_bytes(destination, self.word(word), size)
            self.frame = outer

        loop(b, zero, length, step)


def copy_rows() -> int:
    """The address of `copy_rows`, compiled once for the process at O3 (a segment is compiled
    at O0, whose loop of a load and a store an element took 90 µs to concatenate two
    transposed 128 × 128 matrices, where this takes 33): count rows of `row` bytes, each
    `source stride` bytes after the last in the source, `destination stride` in the
    destination."""
    def build(module: ir.Module) -> None:
        fn = ir.Function(module, _COPY_ROWS, name="copy_rows")
        destination, source, count, from_, to, row = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        memcpy = module.declare_intrinsic("llvm.memcpy", [I8P, I8P, I64])

        def rows(copy_row) -> None:
            loop(b, ir.Constant(I64, 0), count, lambda r: copy_row(
                b.gep(destination, [b.mul(r, to)]), b.gep(source, [b.mul(r, from_)])))
            b.ret_void()

        for bytes_ in ELEMENT_ROWS:
            element, other = fn.append_basic_block(f"rows{bytes_}"), fn.append_basic_block()
            b.cbranch(b.icmp_signed("==", row, ir.Constant(I64, bytes_)), element, other)
            b.position_at_end(element)
            pointer = ir.IntType(8 * bytes_).as_pointer()
            rows(lambda to, from_: b.store(b.load(b.bitcast(from_, pointer), align=1),
                                           b.bitcast(to, pointer), align=1))
            b.position_at_end(other)
        rows(lambda to, from_: b.call(memcpy, [to, from_, row, ir.Constant(ir.IntType(1), 0)]))

    return cpu.routine("copy_rows", build)


def _points_task(module: ir.Module, outer: int) -> ir.Function:
    """`task(i64 *block, i64 thread, i64 threads)`: the products at the points of the `outer`
    batch axes (each one's count and steps in the block from word OUTER on), each point
    claimed from the block's job counter and run by the claiming thread alone (thread_count 1,
    its own job counter, its own scratch: the kernel's thread index)."""
    name = f"points{outer}"
    if name in module.globals:
        return module.globals[name]
    fn = ir.Function(module, _TASK, name=name)
    fn.linkage = "internal"
    argument, thread, _ = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    block = b.bitcast(argument, I64.as_pointer())
    word = lambda i: b.load(b.gep(block, [ir.Constant(I64, i)]))
    jobs = b.alloca(I64)
    head, body, done = (fn.append_basic_block(s) for s in ("point", "product", "done"))
    b.branch(head)
    b.position_at_end(head)
    point = b.atomic_rmw("add", b.gep(block, [ir.Constant(I64, ARGUMENTS)]), ir.Constant(I64, 1),
                         "monotonic")
    axes = [[word(OUTER + 4 * axis + i) for i in range(4)] for axis in range(outer)]
    points = ir.Constant(I64, 1)
    for n, *_ in axes:
        points = b.mul(points, n)
    b.cbranch(b.icmp_signed("<", point, points), body, done)
    b.position_at_end(body)
    bases = [word(i) for i in range(3)]
    rest = point
    for n, *steps in reversed(axes):                 # the last outer axis varies fastest
        at = b.srem(rest, n)
        rest = b.sdiv(rest, n)
        bases = [b.add(base, b.mul(at, step)) for base, step in zip(bases, steps)]
    b.store(ir.Constant(I64, 0), jobs)
    kernel = b.inttoptr(word(KERNEL), _KERNEL.as_pointer())
    null = ir.Constant(I8P, None)
    scratch = ARGUMENTS - 4                         # (after the sizes and strides)
    b.call(kernel, [b.inttoptr(v, I8P) for v in bases] + [word(i) for i in range(3, scratch)]
           + [b.inttoptr(word(scratch), I8P), jobs, null, null, thread, ir.Constant(I64, 1)])
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn
