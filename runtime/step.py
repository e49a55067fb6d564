"""An executable's calls in few native calls (backend/step.py): its plan cut into segments of
runs, products, scatters, gathers, splits, concats and folds whose bodies are native
throughout, with the steps that stay in Python between them (sorts, random numbers, other
folds: the host steps of docs/cpu.md). Each value is a base address in the
frame plus an offset fixed by the plan (a view's by NumPy's strides, found once on stand-in
arrays), so a call writes its arguments' and results' addresses and makes one call a segment."""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from itertools import accumulate
from math import prod
from typing import Callable

import numpy as np

from backend import draws, extreme, scatter
from backend.contract import ARGUMENTS, DATA_FIELD, NUMPY, Matmul, aligned
from backend.cpu import address, sync_words
from backend.schedule import ALIGN, ContractStep, HostStep, KernelStep, ViewStep, nbytes
from backend.step import (COPY_ROWS, HEADER, OUTER, TEAM_BOX, TEAM_RUN, AddressCall, Call, CopyCall,
                          DrawCall, ExtremeCall, ProductCall, Ref, RunCall, ScanCall, ScatterCall, State,
                          TakeCall, compile_segments, copy_rows)
from backend.team import MAX_THREADS, team
from ir.core import Value
from ir.ops.base import np_dtype
from ir.ops.control import Scan
from ir.ops.index import Take
from ir.ops.random import KeySplit
from ir.ops.reduce import ArgReduction
from ir.ops.shape import Concat, Split, Stack
from runtime import cpu, executor
from runtime.cpu import (Executable, _Arena, _copy, _Host, _made_once, empty_aligned,
                         _RunLaunch, _View, product, threads)

SegmentFn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
ARENA = HEADER                      # the frame word of the arena's (aligned) base
BYTE = np.dtype(np.uint8)
# CPython's id of an object is its address: the first segment reads each argument's data
# address from the array object itself (backend/step.py's AddressCall)
BY_ID = sys.implementation.name == "cpython"


@dataclass(frozen=True)
class _Placed:
    """A view step: a place in the frame, nothing to do."""
    step: int


@dataclass(frozen=True)
class Native:
    """A segment: the bases of the values Python made before it written to the frame, the
    views Python reads that it makes (NumPy's, cheap), then its call."""
    function: Callable | None
    calls: tuple[Call, ...]
    views: tuple[int, ...]          # steps
    team: bool                      # whether any call in it may share work among threads
    alone: int | None               # the step of a lone run, called as the walk calls it
    bases: tuple[tuple[int, Value], ...] = ()


@dataclass(frozen=True)
class InPython:
    """A step run by Python as the step-by-step walk runs it (while the segments are made);
    the bases it makes, written to the frame by the next segment."""
    step: int
    bases: tuple[tuple[int, Value], ...]


class NativeStep:
    """How an executable runs: which steps are native and in which segment, the frame's words
    and what fills them, and the values Python needs to see. `items` is the order of the
    executor's walk: the numbers of the steps Python runs, and the segments."""

    def __init__(self, exe: Executable):
        self.exe = exe
        self.size = ARENA + 1
        self.statics: list[tuple[int, Callable[[_Arena, _Frame], int]]] = [
            (ARENA, lambda arena, frame: aligned(arena.memory))]
        self._stand_in = _StandIns()
        self.places: dict[Value, tuple[Ref, np.ndarray]] = {}   # with a stand-in array
        self._runs: dict[RunCall, int] = {}                      # the step of each
        self.params = [(self._base(p), p, np_dtype(p.dtype)) for p in exe.function.params]
        # made each call before any segment: (word, value, bytes, dtype, shape)
        self.fresh: list[tuple[int, Value, int, np.dtype, tuple[int, ...]]] = []
        self.kept: list[tuple[int, Value, int, np.dtype, tuple[int, ...]]] = []   # made per frame
        self.escaping = _escaping(exe)
        # a result never shares memory with a value made once, nor is a strided view
        self.results = [(v, v in exe.made or v in exe.views) for v in exe.function.results]
        self.products: list[tuple[int, np.ndarray, Matmul, int]] = []   # (word, words, kernel, step)
        for v, a in exe.made.items():
            self.places[v] = (Ref(self._static(lambda arena, frame, a=a: address(a))), a)
        for v, offset in exe.memory.offsets.items():
            self.places[v] = (Ref(ARENA, offset), self._stand_in(v))
        items: list[InPython | list[Call | _Placed]] = [[]]
        for i, step in enumerate(exe.plan.steps):
            native = self._native(i, step)
            if native is None:
                items += [InPython(i, tuple((self._base(v), v) for v in _written(step)
                                           if v not in self.places)), []]
            else:
                items[-1] += native
        views = self._python_views(items)
        self.items = self._segments(items, views)
        self.bases = np.array([w for w, _, _ in self.params], np.intp)
        self.param_values = [p for _, p, _ in self.params]
        self.param_dtypes = [dtype for _, _, dtype in self.params]
        # what a call makes lies in one block of memory, each value on a cache line of its own:
        # one allocation a call, not one a value
        self.fresh_words = np.array([w for w, *_ in self.fresh], np.intp)
        sizes = [-(-size // ALIGN) * ALIGN for _, _, size, _, _ in self.fresh]
        *offsets, self.fresh_size = accumulate(sizes, initial=0)
        self.fresh_offsets = np.array(offsets, np.int64)
        self.fresh_values = [v for _, v, _, _, _ in self.fresh]
        self.fresh_arrays = [(shape, dtype, at) for (_, _, _, dtype, shape), at in zip(self.fresh, offsets)]
        self.places.clear()         # the stand-ins' memory back
        self._stand_in = None
        kept = {v for _, v, _, _, _ in self.kept}
        self.needed = tuple(v for v in self._read_by_python()
                            if v in exe.memory.offsets or v in exe.made or v in kept)

    # -- building ----------------------------------------------------------------------------

    def _word(self) -> int:
        self.size += 1
        return self.size - 1

    def _static(self, fill: Callable[[_Arena, _Frame], int]) -> int:
        word = self._word()
        self.statics.append((word, fill))
        return word

    def _base(self, v: Value) -> int:
        """A word for a value made each call, its own base."""
        word = self._word()
        self.places[v] = (Ref(word), self._stand_in(v))
        return word

    def _ref(self, v: Value) -> Ref:
        return self.places[v][0]

    def _native(self, i: int, step) -> list[Call | _Placed] | None:
        """Step i as native calls (none for a kernel its run calls, a value made once, or a
        view: a place, no work), or None where Python runs it."""
        launch = self.exe.launches[i]
        if isinstance(step, KernelStep):
            return [self._run(launch, i)] if isinstance(launch, _RunLaunch) else []
        if isinstance(step, ViewStep):
            return [_Placed(i)] if self._view(launch) else None
        if isinstance(step, ContractStep):
            call = self._product(i, step, launch)
        elif _made_once(step):
            return []
        else:
            call = (self._scatter(step.op) or self._take(step.op) or self._extreme(step.op)
                    or self._random(step.op) or self._pieces(step.op) or self._scan(step.op))
        return None if call is None else call if isinstance(call, list) else [call]

    def _fresh(self, values) -> None:
        """Places for what native calls write outside the arena: made each call where the
        caller may see it, else once for the frame."""
        for v in values:
            if v not in self.places:
                made = self.fresh if v in self.escaping else self.kept
                made.append((self._base(v), v, nbytes(v), np_dtype(v.dtype), tuple(v.shape)))

    def _run(self, launch: _RunLaunch, i: int) -> RunCall:
        self._fresh(launch.fresh)
        call = RunCall(self._static(lambda arena, frame: launch.address),
                       self._static(lambda arena, frame: arena.pointers[i].address),
                       self._static(lambda arena, frame: arena.pointers[i].words.ctypes.data),
                       sync_words(launch.kernels),
                       tuple((slot, self._ref(v)) for slot, v in launch.patches),
                       launch.work >= cpu.MIN_RUN_WORK)          # (read now: tests lower it)
        self._runs[call] = i
        return call

    def _view(self, view: _View) -> bool:
        """Whether NumPy's view of the source's stand-in is a view (it is placed) or a copy."""
        ref, source = self.places[view.source]
        made = view.evaluate(source)
        if made.size and not np.may_share_memory(made, source):
            return False
        self.places[view.value] = (Ref(ref.word, ref.offset + _pointer(made) - _pointer(source)), made)
        return True

    def _product(self, i: int, step: ContractStep, launch) -> ProductCall | None:
        (out,) = step.op.outputs
        if any(v not in self.places for v in step.op.inputs):
            return None
        (a_ref, a), (b_ref, b) = (self.places[v] for v in step.op.inputs)
        c = self.places[out][1] if out in self.places else self._stand_in(out)
        kernel, a2, b2, parts = product(a, b, c, MAX_THREADS, in_step=True)
        outer, operands = (), kernel.operands(a2, b2, c, copy=False)
        for points in range(1, c.ndim - 2):    # batch axes that are not one: a loop of products
            if operands is not None and _in_place(operands[:3], (a, b, c)):
                break
            outer, inner = _outer_axes(a2, b2, c, points)
            operands = kernel.operands(*inner, copy=False)
            parts = min(parts, prod(n for n, *_ in outer))
        if operands is None or not _in_place(operands[:3], (a, b, c)):
            return None                        # a copy made per call: the walk's business
        a3, b3, c3 = operands[:3]
        self._fresh([out])
        c_ref = self._ref(out)
        refs = tuple(Ref(r.word, r.offset + _pointer(x) - _pointer(y))
                     for r, x, y in ((a_ref, a3, a), (b_ref, b3, b), (c_ref, c3, c)))
        epilogue = None
        fused = launch.epilogue is not None and kernel.fuses(b2.shape[-1]) and not outer
        if launch.epilogue is not None:
            epilogue = self._run(launch.epilogue, i)
        words = np.zeros(OUTER + 4 * len(outer) if outer else ARGUMENTS, np.int64)
        words[3:ARGUMENTS - 4] = kernel.arguments(a3, b3, c3)[3:]
        words[OUTER:] = [w for axis in outer for w in axis]
        if fused:
            words[ARGUMENTS - 2] = launch.kernel
        block = self._word()
        self.products.append((block, words, kernel, i if fused else -1))
        return ProductCall(self._static(lambda arena, frame: kernel.task), block, refs, parts,
                           epilogue, fused, len(outer), self._static(
                               lambda arena, frame: ctypes.cast(kernel.fn, ctypes.c_void_p).value)
                           if outer else 0)

    def _scatter(self, op) -> list[CopyCall | ScatterCall] | None:
        if not scatter.compiles(op):
            return None
        x, indices, _ = op.inputs
        (out,) = op.outputs
        if not x.shape or any(v not in self.places for v in op.inputs):
            return None
        copies, refs = self._contiguous(op.inputs)
        self._fresh([out])
        fn = scatter.scatter_function(out.dtype, indices.dtype)
        axis = op.attrs.get("axis", 0) % len(x.shape)
        outer, size, inner = scatter.around(x.shape, axis)
        return [*copies, ScatterCall(self._static(lambda arena, frame: fn), (self._ref(out), *refs),
                                     (outer, prod(indices.shape), size, inner))]

    def _take(self, op) -> list[CopyCall | TakeCall] | None:
        if not isinstance(op.primitive, Take):
            return None
        x, indices = op.inputs
        (out,) = op.outputs
        if indices.dtype not in scatter.INDICES or not x.shape \
                or any(v not in self.places for v in op.inputs):
            return None
        copies, refs = self._contiguous(op.inputs)
        self._fresh([out])
        axis = op.attrs.get("axis", 0) % len(x.shape)
        outer, size, inner = scatter.around(x.shape, axis)
        fn = scatter.take_function(indices.dtype)
        return [*copies, TakeCall(self._static(lambda arena, frame: fn), (self._ref(out), *refs),
                                  (outer, prod(indices.shape), size, inner * np_dtype(x.dtype).itemsize,
                                   int(op.attrs.get("from_end", True))))]

    def _extreme(self, op) -> list[CopyCall | ExtremeCall] | None:
        if not isinstance(op.primitive, ArgReduction):
            return None
        (x,), (out,) = op.inputs, op.outputs
        if x.dtype not in extreme.DTYPES or x not in self.places:
            return None
        copies, (x_ref,) = self._contiguous([x])
        self._fresh([out])
        fn = extreme.function(op.primitive, x.dtype)
        return [*copies, ExtremeCall(self._static(lambda arena, frame: fn), (x_ref, self._ref(out)),
                                     extreme.around(op))]

    def _random(self, op) -> list[CopyCall | DrawCall] | None:
        """A draw, or a key's split or fold_in, by its function; a split's keys written into a
        buffer the frame holds, then copied to their places."""
        if not op.primitive.random or (dtype := draws.dtype_of(op)) is None \
                or any(v not in self.places for v in op.inputs):
            return None
        copies, refs = self._contiguous(op.inputs)
        self._fresh(op.outputs)
        fn = self._static(lambda arena, frame, fn=draws.function(op.primitive, dtype): fn)
        if not isinstance(op.primitive, KeySplit):
            (out,) = op.outputs
            return [*copies, DrawCall(fn, (*refs, self._ref(out)), (prod(out.shape), *draws.bounds(op)))]
        keys = Ref(self._static(lambda arena, frame, size=8 * len(op.outputs): frame.hold(size)))
        return [*copies, DrawCall(fn, (*refs, keys), (len(op.outputs),)),
                *(CopyCall(Ref(keys.word, 8 * j), self._ref(v), (), 8) for j, v in enumerate(op.outputs))]

    def _contiguous(self, values) -> tuple[list[CopyCall], list[Ref]]:
        """Where each value is read contiguously: where it lies, or (a strided view: an LSTM's
        outputs, batch-major, of its time-major fold) a buffer the frame holds that the call
        copies it into first, with those copies."""
        copies, refs = [], []
        for v in values:
            placed = self.places[v][1]
            if placed.flags.c_contiguous:
                refs.append(self._ref(v))
                continue
            copy = _copied(placed, self._stand_in(v))
            held = Ref(self._static(lambda arena, frame, size=nbytes(v): frame.hold(size)))
            copies.append(CopyCall(self._ref(v), held, *copy))
            refs.append(held)
        return copies, refs

    def _pieces(self, op) -> list[CopyCall] | None:
        """A split's parts, or a concat's or a stack's inputs (contiguous or not: halves of
        a GPT's rotary embedding are views), copied as rows of bytes (each part a view of the
        whole on the stand-ins, NumPy's own split; a stacked part one slice along the new
        axis)."""
        if isinstance(op.primitive, Split):
            (whole,), parts, into = op.inputs, op.outputs, False
        elif isinstance(op.primitive, (Concat, Stack)):
            parts, (whole,), into = op.inputs, op.outputs, True
        else:
            return None
        if any(v not in self.places for v in op.inputs) or \
                not into and not self.places[whole][1].flags.c_contiguous:
            return None
        axis = op.attrs.get("axis", 0) % len(whole.shape)
        stand_in = self._stand_in(whole)            # (only offsets are read from it)
        sizes = (1,) * len(parts) if isinstance(op.primitive, Stack) else tuple(v.shape[axis] for v in parts)
        views = Split().evaluate(stand_in, sizes, axis)
        # each copy's rows, read from the part where it lies (a concat's), or written into a
        # part made contiguous (a split's)
        copies = [None if view.size == 0 else _copied(self.places[part][1], view) if into
                  else _copied(view, self._stand_in(part)) for part, view in zip(parts, views)]
        self._fresh(op.outputs)
        whole_ref = self._ref(whole)
        calls = []
        for part, view, copy in zip(parts, views, copies):
            if copy is None:
                continue
            ref = Ref(whole_ref.word, whole_ref.offset + _pointer(view) - _pointer(stand_in))
            calls.append(CopyCall(*((self._ref(part), ref) if into else (ref, self._ref(part))), *copy))
        return calls

    def _scan(self, op) -> ScanCall | None:
        """A fold whose body is native throughout, as a loop: its body's calls on a frame of
        the body's own."""
        if not isinstance(op.primitive, Scan) or op.attrs["length"] < 1:
            return None
        body = self.exe.bodies[id(op)]
        items = body.native.items
        if len(items) > 1 or items and (not isinstance(items[0], Native) or items[0].views):
            return None
        n_state, n_xs = op.attrs["n_state"], op.attrs["n_xs"]
        if any(v not in self.places or not self.places[v][1].flags.c_contiguous
               or np_dtype(v.dtype) != dtype for v, (_, _, dtype) in zip(
                   op.inputs, body.native.params)):
            return None
        results = body.native.writes()
        if results is None:
            return None
        self._fresh(op.outputs)
        ins, outs = op.inputs, op.outputs
        states = tuple(State(self._ref(a), self._ref(b), self._static(
            lambda arena, frame, size=nbytes(b): frame.hold(size))) for a, b in zip(ins[:n_state], outs[:n_state]))
        return ScanCall(self._static(lambda arena, frame: frame.body(body)),
                        items[0].calls if items else (), op.attrs["length"],
                        bool(op.attrs.get("reverse")), states,
                        tuple((self._ref(v), nbytes(v) // op.attrs["length"])
                              for v in ins[n_state:n_state + n_xs]),
                        tuple(self._ref(v) for v in ins[n_state + n_xs:]),
                        tuple(w for w, _, _ in body.native.params), results,
                        tuple((self._ref(v), nbytes(v) // op.attrs["length"])
                              for v in outs[n_state:]))

    def writes(self) -> tuple[tuple[int, bool, int], ...] | None:
        """For each result, as a fold's loop fills it: the frame word that holds it, whether
        it is copied from there after the call (a parameter, or a value already returned),
        and its bytes; None where a result is neither made each call nor a parameter."""
        made = {v: w for w, v, *_ in self.fresh}
        params = {p: w for w, p, _ in self.params}
        seen, writes = set(), []
        for v in self.exe.function.results:
            if v in made and v not in seen:
                writes.append((made[v], False, nbytes(v)))
            elif v in made or v in params:
                writes.append((made.get(v, params.get(v)), True, nbytes(v)))
            else:
                return None
            seen.add(v)
        return tuple(writes)

    def _python_views(self, items: list) -> set[int]:
        """The placed views that Python reads (a host step's inputs, the results), which it
        makes too, NumPy's way."""
        steps = self.exe.plan.steps
        read = set(self.exe.function.results)
        read.update(v for x in items if isinstance(x, InPython) for v in steps[x.step].op.inputs)
        views = set()
        for x in reversed([c for x in items if not isinstance(x, InPython) for c in x]):
            if isinstance(x, _Placed) and steps[x.step].op.outputs[0] in read:
                views.add(x.step)
                read.update(steps[x.step].op.inputs)
        return views

    def _read_by_python(self) -> set[Value]:
        """The values Python reads or writes: the steps it runs, the views it makes, the lone
        runs it calls, and the results."""
        exe = self.exe
        steps = exe.plan.steps
        python = [x for x in self.items if isinstance(x, int)]
        views = [i for x in self.items if isinstance(x, Native) for i in x.views]
        alone = [x.alone for x in self.items if isinstance(x, Native) and x.alone is not None]
        return ({v for i in python + views for v in steps[i].op.inputs}
                | {v for i in python for v in _written(steps[i])}
                | {v for i in alone for _, v in exe.launches[i].patches} | set(exe.function.results))

    def _segments(self, items: list, views: set[int]) -> list[Native | int]:
        """The native calls between Python steps compiled, one function each, with the views
        Python makes before each."""
        native = [c for x in items if not isinstance(x, InPython)
                  if len(c := tuple(c for c in x if not isinstance(c, _Placed))) > 1
                  or c and not isinstance(c[0], RunCall)]
        first = [(AddressCall(tuple(w for w, _, _ in self.params), DATA_FIELD),) + native[0]
                 ] if native and BY_ID else native[:1]
        self.engine, addresses, sizes = (compile_segments(first + native[1:], self.size) if native
                                         else (None, [], []))
        for n in sizes:                         # (the words from self.size on, in order)
            self._static(lambda arena, frame, n=n: n)
        functions = dict(zip(native, map(SegmentFn, addresses)))
        made: list[Native | int] = []
        bases: tuple[tuple[int, Value], ...] = ()       # Python's since the last segment
        for x in items:
            if isinstance(x, InPython):
                made.append(x.step)
                bases += x.bases
                continue
            calls = tuple(c for c in x if not isinstance(c, _Placed))
            if calls or any(c.step in views for c in x):
                made.append(Native(functions.get(calls), calls,
                                   tuple(c.step for c in x if isinstance(c, _Placed) and c.step in views),
                                   any(_shares(c) for c in calls),
                                   self._runs[calls[0]] if calls and calls not in functions else None,
                                   bases))
                bases = ()
        return made

    # -- calling -----------------------------------------------------------------------------

    def run(self, arena: _Arena, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The executor's walk of the steps and segments, on the CPU with this arena's frame."""
        frame = arena.frame if arena.frame is not None else self._frame(arena)
        n = threads()
        if n > frame.threads:
            frame.scratch(n)
        try:
            return executor.execute(self.exe.plan, None, _Segments(self.exe, arena, n, self, frame),
                                    arrays, self.items)
        except _OutOfRange:             # the walk finds the index and reports it
            return self.exe.walk(arrays)

    def _frame(self, arena: _Arena) -> _Frame:
        frame = arena.frame = _Frame(self.size, self.products)
        words = frame.words
        if any(isinstance(x, Native) and x.team for x in self.items):    # (made on first use)
            words[TEAM_RUN], words[TEAM_BOX] = team().run_address, team().address
        words[COPY_ROWS] = copy_rows()
        for word, fill in self.statics:
            words[word] = fill(arena, frame)
        for (word, _, _, step), block in zip(self.products, frame.blocks):
            words[word] = address(block)
            if step >= 0:                       # the fused epilogue's table
                block[ARGUMENTS - 1] = arena.pointers[step].arguments
        frame.scratch(threads())
        for word, v, size, dtype, shape in self.kept:
            frame.kept[v], words[word] = empty_aligned(size, dtype, shape)
        everything = {**arena.views, **self.exe.made, **frame.kept}
        frame.seen = {v: everything[v] for v in self.needed}
        return frame


class _OutOfRange(Exception):
    """A segment's scatter or gather met an index out of range."""


@dataclass(frozen=True)
class _Segments(_Host):
    """The CPU as the executor's device with a native step's frame: the arguments' and the
    results' bases written to it, and its segments called."""
    native: NativeStep
    frame: _Frame

    def arguments(self, arrays: list[np.ndarray]) -> dict[Value, np.ndarray]:
        native, words = self.native, self.frame.words
        given = [np.asarray(a, dtype, order="C")            # (runtime/cpu.py's _buffer)
                 for a, dtype in zip(arrays, native.param_dtypes)]
        words[native.bases] = [*map(id, given)] if BY_ID else [*map(address, given)]
        block, base = empty_aligned(native.fresh_size, BYTE, (native.fresh_size,))
        words[native.fresh_words] = native.fresh_offsets + base
        env = dict(self.frame.seen)
        env.update(zip(native.param_values, given))
        env.update(zip(native.fresh_values, [np.ndarray(shape, dtype, block, at)
                                             for shape, dtype, at in native.fresh_arrays]))
        return env

    def segment(self, segment: Native, env: dict[Value, np.ndarray]) -> None:
        exe, words, n = self.exe, self.frame.words, self.threads
        for word, v in segment.bases:
            words[word] = address(env[v])
        for i in segment.views:
            exe.launches[i](env, None, n)
        if segment.alone is not None:           # (a module for one call would not pay)
            exe.launches[segment.alone].patch(env, self.arena.pointers[segment.alone])
            exe.launches[segment.alone].run(self.arena.pointers[segment.alone], n)
        elif segment.function is not None:
            held = team().hold(n) if segment.team else 1
            try:
                failed = segment.function(self.frame.address, held)
            finally:
                if held > 1:
                    team().release()
            if failed:
                raise _OutOfRange

    def results(self, env: dict[Value, np.ndarray]) -> list[np.ndarray]:
        return [_copy(env[v], v) if copied else env[v] for v, copied in self.native.results]


class _Frame:
    """One arena's frame: its words, the products' argument blocks, and their scratch."""

    def __init__(self, size: int, products: list[tuple[int, np.ndarray, Matmul, int]]):
        self.words = np.zeros(size, np.int64)
        self.address = address(self.words)
        self.blocks = []
        for _, words, _, _ in products:
            # the job counter in the line after the arguments, the outer axes' words after it
            block = np.zeros(max(ARGUMENTS + 8, len(words)), np.int64)
            block[:len(words)] = words
            block[ARGUMENTS - 3] = address(block) + 8 * ARGUMENTS
            self.blocks.append(block)
        self.kernels = [kernel for _, _, kernel, _ in products]
        self.threads = 0
        self._scratch: dict[str, np.ndarray] = {}
        self.kept: dict[Value, np.ndarray] = {}    # what native calls write that no caller sees
        self.held: list[object] = []               # the folds' spare states and arenas
        self.bodies: list[_Frame] = []             # the folds' bodies' frames
        self.seen: dict[Value, np.ndarray] = {}    # the arena's, made and kept values Python reads

    def hold(self, size: int) -> int:
        """The address of `size` new bytes this frame keeps."""
        held, base = empty_aligned(size, np.dtype(np.uint8), (size,))
        self.held.append(held)
        return base

    def body(self, exe: Executable) -> int:
        """The address of a new frame for a fold's body, with an arena of its own."""
        arena = _Arena(exe)
        body = exe.native._frame(arena)
        self.bodies.append(body)
        self.held.append(arena)                    # (its tables are the frame's)
        # what the body makes each call but the loop does not place (a concat's inputs, which
        # may be views of a result, are made each call), made once for the frame
        placed = {word for word, copied, _ in exe.native.writes() if not copied}
        for word, _, size, dtype, shape in exe.native.fresh:
            if word not in placed:
                made, body.words[word] = empty_aligned(size, dtype, shape)
                self.held.append(made)
        return body.address

    def scratch(self, threads: int) -> None:
        """Each product's scratch for `threads` threads (the products run one at a time), the
        folds' bodies' too."""
        self.threads = threads
        for body in self.bodies:
            body.scratch(threads)
        for kernel, block in zip(self.kernels, self.blocks):
            have = self._scratch.get(kernel.dtype)
            if have is None or have.size < kernel.tiles.scratch_size(threads):
                have = self._scratch[kernel.dtype] = np.empty(kernel.tiles.scratch_size(threads),
                                                              NUMPY[kernel.dtype])
            block[ARGUMENTS - 4] = aligned(have)


def _escaping(exe: Executable) -> set[Value]:
    """The results, and what they may be views of: a host step's outputs may be views of its
    inputs, a view step's are (as backend/schedule.py's plan_memory reckons)."""
    escaping = set(exe.function.results)
    for step in reversed(exe.plan.steps):
        if isinstance(step, (HostStep, ViewStep)) and escaping.intersection(step.op.outputs):
            escaping.update(step.op.inputs)
    return escaping


def _written(step) -> tuple[Value, ...]:
    if isinstance(step, ContractStep) and step.epilogue:
        return step.op.outputs + step.epilogue.writes
    return step.op.outputs


def _shares(call: Call) -> bool:
    return (isinstance(call, RunCall) and call.shared or isinstance(call, ProductCall)
            and (call.parts > 1 or call.epilogue is not None and call.epilogue.shared)
            or isinstance(call, ScanCall) and any(map(_shares, call.calls)))


def _in_place(operands: tuple[np.ndarray, ...], arrays: tuple[np.ndarray, ...]) -> bool:
    """Whether the product's operands, as its kernel takes them, are the arrays in place."""
    return all(x.size == 0 or np.may_share_memory(x, y) for x, y in zip(operands, arrays))


def _outer_axes(a: np.ndarray, b: np.ndarray, c: np.ndarray, points: int
                ) -> tuple[tuple[tuple[int, int, int, int], ...], tuple[np.ndarray, ...]]:
    """A batched product c = a @ b split at its first `points` batch axes: each axis's
    (count, and the bytes a, b and c move along it), and the product at the first point."""
    shape = c.shape[:-2]
    a, b = (np.broadcast_to(x, shape + x.shape[-2:]) for x in (a, b))
    first = (0,) * points
    return (tuple((n, *(x.strides[k] for x in (a, b, c))) for k, n in enumerate(shape[:points])),
            (a[first], b[first], c[first]))


def _copied(source: np.ndarray, destination: np.ndarray
            ) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """A copy of source's elements to destination's (of one shape, but for axes of one) as
    backend/step.py's CopyCall makes it: the levels of its loops and the bytes of its rows,
    their axes merged where both sides step through them as one."""
    levels = [(n, a, b) for (n, a), b in zip(
        [(n, a) for n, a in zip(source.shape, source.strides) if n != 1],
        [b for n, b in zip(destination.shape, destination.strides) if n != 1])]
    row = source.itemsize
    while levels and levels[-1][1] == levels[-1][2] == row:
        row *= levels.pop()[0]
    merged: list[tuple[int, int, int]] = []
    for n, a, b in levels:
        if merged and merged[-1][1] == a * n and merged[-1][2] == b * n:
            merged[-1] = (merged[-1][0] * n, a, b)
        else:
            merged.append((n, a, b))
    return tuple(merged), row


class _StandIns:
    """Contiguous arrays of values' shapes and dtypes whose contents are never read, for
    finding a view's offset and strides: all at the start of one zeroed region (its pages not
    touched until written), grown to the largest, since a view is compared only with its own
    source (an array each cost an allocation of its own: 15 ms of a GPT step's load)."""

    def __init__(self):
        self.region = np.zeros(0, np.uint8)

    def __call__(self, v: Value) -> np.ndarray:
        size = nbytes(v)
        if size > self.region.size:
            self.region = np.zeros(max(size, 2 * self.region.size), np.uint8)
        return np.ndarray(v.shape, np_dtype(v.dtype), self.region)


def _pointer(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]
