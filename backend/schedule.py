"""Scheduling: an IR function cut into kernels (fused loop nests) and host steps.

Consecutive elementwise ops of one shape fuse into one map kernel: their intermediate values
never touch memory, and only values used later are stored (the ops are taken in fusion_order,
which brings together those that join and could run together: an optimizer's updates of one
parameter, written map after map over all of them). A float reduction over
contiguous-compatible axes becomes a reduction kernel, which computes its input itself when
the open map kernel makes it for the reduction alone (the softmax's exp, the variance's
square). A scan (cumsum…) is a scan kernel, which computes its input itself in the same way.
A float `@` is a contraction step for the blocked kernel of backend/contract.py
(ir/passes.py's for_backends rewrites einsums that are matrix products as `@`, and one_hot as
a comparison that fuses, first); a map kernel that reads its result C where it writes (a bias,
an activation, a residual), or a row kernel over C's rows (a layer norm, a softmax), becomes
its epilogue, which the contraction runs on each block of C's rows it has finished.
Transposes, reshapes, broadcasts, slices and the gradients of slices are views
(backend/views.py): read in place by the kernels, contractions and host steps that use them;
a view of a view that no strides express (a reshape of a transpose), a window that
anything but a map kernel reads, and a strided view that a fold reads (its native loop takes
contiguous inputs), are read from a contiguous copy a copy kernel makes.
Everything else — gathers, scatters, concatenation, random numbers, integer division — is a
host step, evaluated by the reference interpreter on NumPy arrays (exact, and mostly cheap
data movement): each primitive says why in its `host`, and an op without such a reason that
the kernels cannot compute is an error. An effect (`debug`, `assert_finite`) is a host step
too, but it does not cut the map or row kernel it meets: it runs, in program order among the
effects, once that kernel has stored its inputs. Every buffer is a contiguous row-major array.

What an op is to the scheduler is its primitive's `role` (ir/ops/base.py), never its name.

The buffer plan (`plan_memory`) places the values the kernels and contractions write in one
arena, reused from call to call: two values share bytes only when one is dead before the
other is written."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod

import numpy as np

from backend.llvm import FLOATS, row_major
from backend.loops import Accumulate, Instr, Load, LoopKernel, Reduce, row_scalar
from backend.views import View, identity, load_strides, load_window, view_of
from ir.core import Function, Op, Value
from ir.ops.base import Role, np_dtype
from ir.passes import products_as_sums
from ir.types import INT_DTYPES


@dataclass(frozen=True)
class KernelStep:
    kernel: LoopKernel
    args: tuple[Value, ...]          # the value bound to each buffer
    writes: tuple[Value, ...]        # the values the kernel produces (a suffix of args)


@dataclass(frozen=True)
class HostStep:
    op: Op


@dataclass(frozen=True)
class ViewStep:
    """op's result as a NumPy view of its input, for the host steps and contractions that
    read it; kernels read the buffer in place through `view` (backend/views.py)."""
    op: Op
    view: View


@dataclass(frozen=True)
class ContractStep:
    """A float `@`, run by the blocked contraction kernel (backend/contract.py), and a kernel
    over its result C's rows that reads C where it writes (its epilogue, if any): the
    contraction runs it on each block of rows it has finished, while they are in cache."""
    op: Op
    epilogue: KernelStep | None = None


Step = KernelStep | HostStep | ViewStep | ContractStep


@dataclass(frozen=True)
class Plan:
    function: Function
    steps: tuple[Step, ...]

    @property
    def kernels(self) -> list[LoopKernel]:
        """Every kernel of the plan, the contractions' epilogues included."""
        return [s.kernel if isinstance(s, KernelStep) else s.epilogue.kernel for s in self.steps
                if isinstance(s, KernelStep) or isinstance(s, ContractStep) and s.epilogue]


def fusible(op: Op) -> bool:
    """Whether op is elementwise with a scalar body for its dtypes; an elementwise op without
    one must have a reason to run on the host."""
    prim = op.primitive
    if prim.role is not Role.ELEMENTWISE:
        return False
    dtypes, dtype = [v.dtype for v in op.inputs], op.outputs[0].dtype
    if prim.compiles(dtypes, dtype):
        return True
    if prim.host is None and "bf16" not in (*dtypes, dtype):
        raise NotImplementedError(f"'{prim.name}' has no scalar body for {dtypes} -> {dtype}, "
                                  "and no reason to run on the host")
    return False


def reduces(op: Op) -> bool:
    return op.primitive.role is Role.REDUCTION


def scans(op: Op) -> bool:
    """Whether op is a scan that the kernels compile for its dtype (else it has a reason to
    run on the host)."""
    prim = op.primitive
    return prim.role is Role.SCAN and prim.compiles([op.inputs[0].dtype], op.outputs[0].dtype)


# the dtypes of the `@`s that a contraction kernel computes (the others run on the host)
PRODUCTS = ("f32", "f64")
# the dtypes of the reductions (sums, products, maxima, minima) that the kernels compute: on
# the CPU every one (integers and bools are exact in any order); the GPU's warp shuffles move
# floats only (backend/gpu_plan.py)
REDUCED = FLOATS + INT_DTYPES + ("bool",)


def schedule(fn: Function, name: str = "k", products: tuple[str, ...] = PRODUCTS,
             reduced: tuple[str, ...] = REDUCED) -> Plan:
    """Cut fn into kernels and host steps, in an order that respects its data flow; the `@`s
    of the dtypes in `products` are contraction steps, the reductions of those in `reduced`
    kernels (and an integer `@` of those, as the sum it is: ir/passes.py's products_as_sums)."""
    fn = products_as_sums(fn, tuple(d for d in reduced if d in INT_DTYPES))
    users: dict[Value, int] = {}
    for op in fn.ops:
        for v in op.inputs:
            users[v] = users.get(v, 0) + 1
    results = set(fn.results)
    # scalar constants are written into the kernels that use them (and made on the host for
    # anything else that does)
    constants = {op.outputs[0]: op.attrs["value"] for op in fn.ops
                 if op.primitive.role is Role.CONSTANT and op.outputs[0].shape == ()
                 and op.outputs[0].dtype != "bf16"}
    views: dict[Value, tuple[Op, View]] = {}
    made: set[Value] = set()                  # views a ViewStep has made
    steps: list[Step] = []
    group: list[Op] = []
    in_group: set[Value] = set()
    space: tuple[int, ...] | None = None       # the shape of the group's elementwise ops
    rows: tuple[int, ...] | None = None        # a row group's rows (it has reductions)
    back = _broadcast_back(fn)
    names = (f"{name}_{i}" for i in range(10 ** 9))
    effects: list[Op] = []                     # effects waiting for the group to store their inputs

    # (the flush of a group finds the stages its last join searched, unless a copy between
    # changed what their loads read: the group's shape is another then)
    row_stages = _RowSearch(users, results, constants, views).stages

    def row_kernel(ops: list[Op], outer: tuple[int, ...], name: str) -> KernelStep | None:
        found = row_stages(ops, outer)
        return None if found is None else _row_kernel(name, found, outer)

    def rows_join(ops: list[Op], outer: tuple[int, ...]) -> bool:
        """Whether ops make one row kernel: its stages are found, the kernel made at the flush
        (made at every op that joined, the kernels dropped took the GPT step's schedule from
        128 to 152 ms)."""
        return row_stages(ops, outer) is not None

    def flush() -> None:
        nonlocal rows, space
        if group:
            step = (row_kernel(group, rows, next(names)) if rows is not None else
                    _map_kernel(next(names), group, users, results, constants, views))
            if step.writes:                 # (all it made may have gone into reductions)
                steps.append(step)
            group.clear()
            in_group.clear()
        rows = space = None
        for op in effects:                      # in program order, once their inputs are stored
            for v in op.inputs:
                need(v)
            steps.append(HostStep(op))
        effects.clear()

    def copy(v: Value) -> None:
        """Kernels read the view v from a contiguous copy from here on, which a copy kernel
        makes: of v itself, or, where a view step has made v already (for a host step or a
        contraction), of a value of its own that v is then a view of. A value is one buffer:
        a copy kernel writing v after its view step wrote into the view's memory (an argument
        transposed, then sorted and reduced), or left a native step reading the copy's buffer
        before the kernel made it."""
        op, view = views.pop(v)
        if view.base in in_group:
            flush()
        if v in made:
            copied = Value(v.type)
            steps.append(_copy_kernel(next(names), copied, view))
            views[v] = (op, identity(copied))
        else:
            steps.append(_copy_kernel(next(names), v, view))

    def need(v: Value) -> None:
        """A host step or contraction reads v: make it if it is a view (a window by a copy
        kernel, where NumPy would write x into zeros)."""
        if v in views and v not in made:
            op, view = views[v]
            if view.window is not None:
                copy(v)
                return
            need(op.inputs[0])
            steps.append(ViewStep(op, view))
            made.add(v)

    elementwise = {id(op): fusible(op) for op in fn.ops}     # (fusion_order reads it too)
    for op in fusion_order(fn.ops, elementwise):
        x = op.inputs[0] if op.inputs else None
        source = views[x][1] if x in views else None
        view = None
        if op.primitive.role in (Role.VIEW, Role.WINDOW):
            view = view_of(op, source or identity(x))
            if view is None and source is not None and x not in made:
                view = view_of(op, identity(x))
                if view is not None:            # a view of x once contiguous: copy x
                    copy(x)
        if op.outputs[0] in constants:
            steps.append(HostStep(op))     # needs nothing, so it may run before the group
        elif view is not None:
            views[op.outputs[0]] = (op, view)
        elif elementwise[id(op)]:
            joins = rows is not None and _over_rows(op, rows, space) and rows_join(group + [op], rows)
            # a view of a value the group computes is read at other points: store it first
            if not joins and group and (rows is not None or space != _shape(op) or
                                        any(views[v][1].base in in_group for v in op.inputs if v in views)):
                flush()
            if not group:
                space = _shape(op)
            group.append(op)
            in_group.update(op.outputs)
        elif reduces(op) and _reducible(op, reduced) or scans(op):
            x = op.inputs[0]
            # a reduction over a row that comes back into the row, or one more over the rows of
            # a row group: a stage of the group's row kernel
            outer = _rows(op) if reduces(op) else None
            if outer is not None and (id(op) in back or rows == outer and space == x.shape):
                if group and not (space == x.shape and rows in (None, outer)):
                    flush()
                if rows_join(group + [op], outer):
                    group.append(op)
                    in_group.update(op.outputs)
                    rows, space = outer, x.shape
                    continue
            # read only by this reduction (or scan): the ops of the group that make x are
            # computed in its loop instead, and x is never stored
            fused = (rows is None and x in in_group and users[x] == 1 and x not in results and
                     _reduction_kernel(next(names), op, _cone(group, [x]), views, constants))
            if fused:
                users[x] -= 1
                steps.append(fused)
                continue
            if x in in_group or x in views and views[x][1].base in in_group:
                flush()
            kernel = _reduction_kernel(next(names), op, [], views, constants)
            if kernel is None:                          # axes that do not read as one, or a window
                copy(x)
                kernel = _reduction_kernel(next(names), op, [], views, constants)
            steps.append(kernel)
        elif op.primitive.effect:
            # the group goes on past it: it runs when the group has stored its inputs
            effects.append(op)
            if not group:
                flush()
        else:
            flush()
            for v in op.inputs:
                # a fold's body runs natively on contiguous inputs (a hoisted transpose)
                if op.body is not None and v in views and v not in made \
                        and not _dense(views[v][1].strides, v.shape):
                    copy(v)
                need(v)
            is_matmul = op.primitive.role is Role.CONTRACTION and op.outputs[0].dtype in products
            steps.append(ContractStep(op) if is_matmul else HostStep(op))
    flush()
    for v in fn.results:
        need(v)
    return Plan(fn, _with_epilogues(steps))


def fusion_order(ops: list[Op], elementwise: dict[int, bool] | None = None) -> list[Op]:
    """ops in an order that keeps their data flow, each elementwise op followed at once by the
    later ones of its shape that are joined to it by a value of that shape and could run now,
    where all their results are the program's or used among them alone. The scheduler fuses
    neighbours only, and an optimizer's updates are written map after map over the parameters
    (AdamW: every m, then every v, then every parameter): so each parameter's three updates
    become one kernel, one pass over its gradient and state. Ops that feed later work stay
    where they are: moved, they would be stored for it instead of fused into it. `elementwise`
    says by id whether each op is fusible, where the caller has it already."""
    producer = {v: op for op in ops for v in op.outputs}
    users: dict[Value, list[Op]] = {}
    for op in ops:
        for v in op.inputs:
            users.setdefault(v, []).append(op)
    if elementwise is None:
        elementwise = {id(op): fusible(op) for op in ops}
    # an op that may move: elementwise, its results going only into such ops of its shape
    movable: dict[int, bool] = {}
    for op in reversed(ops):
        movable[id(op)] = elementwise[id(op)] and all(
            movable[id(w)] and _shape(w) == _shape(op) for v in op.outputs for w in users.get(v, []))
    # the movable ops each value joins: its producer and its users, of its shape
    near: dict[Value, list[Op]] = {}
    for op in ops:
        if movable[id(op)]:
            for v in op.inputs + op.outputs:
                if v.shape == _shape(op):
                    near.setdefault(v, []).append(op)
    position = {id(op): i for i, op in enumerate(ops)}
    placed: set[int] = set()
    order: list[Op] = []

    def joined(seed: Op) -> list[Op]:
        """The unplaced movable ops of seed's shape that values of that shape join to it and
        that could run now, with the constants they need first."""
        shape, found, frontier = _shape(seed), {}, [seed]
        while frontier:
            for v in (x := frontier.pop()).inputs + x.outputs:
                for u in near.get(v, ()):
                    if id(u) not in placed and id(u) not in found and v.shape == shape:
                        found[id(u)] = u
                        frontier.append(u)

        def runs_now(u: Op) -> bool:
            made = lambda v: (v not in producer or id(producer[v]) in placed
                              or id(producer[v]) in found or _constant(producer[v]))
            return all(map(made, u.inputs)) and all(id(w) in found for v in u.outputs
                                                     for w in users.get(v, []))
        check = list(found.values())
        while check:                 # drop what cannot run now, and what it makes wait
            u = check.pop()
            if id(u) in found and not runs_now(u):
                del found[id(u)]
                check += [producer[v] for v in u.inputs if v in producer and id(producer[v]) in found]
                check += [w for v in u.outputs for w in users.get(v, []) if id(w) in found]
        constants = {id(producer[v]): producer[v] for u in found.values() for v in u.inputs
                     if v in producer and id(producer[v]) not in placed and _constant(producer[v])}
        return sorted([*constants.values(), *found.values()], key=lambda u: position[id(u)])

    for op in ops:
        if id(op) in placed:
            continue
        placed.add(id(op))
        order.append(op)
        for u in joined(op) if elementwise[id(op)] else []:
            placed.add(id(u))
            order.append(u)
    return order


def _constant(op: Op) -> bool:
    """An op that may run anywhere before its users: made once, no draw of random numbers."""
    return made_once(op) and not op.primitive.random and not op.primitive.effect


def _with_epilogues(steps: list[Step]) -> tuple[Step, ...]:
    """The steps, each kernel that can be the epilogue of the contraction it follows (past
    views and constants of other values only) moved into it. A kernel further back stays:
    moved past other kernels, epilogues made the GPT step 3-5% slower (docs/cpu.md)."""
    out: list[Step] = []
    for step in steps:
        at = len(out) - 1
        while at >= 0 and _free(out[at]) and not set(writes(out[at])) & set(reads(step)):
            at -= 1
        epilogue = (_epilogue(out[at], step) if at >= 0 and isinstance(out[at], ContractStep)
                    and out[at].epilogue is None else None)
        if epilogue is not None:
            out[at] = replace(out[at], epilogue=epilogue)
        else:
            out.append(step)
    return tuple(out)


def _free(step: Step) -> bool:
    """Whether a step costs nothing when a run is called: a view, or a value made once."""
    return isinstance(step, ViewStep) or isinstance(step, HostStep) and made_once(step.op)


def _epilogue(contract: ContractStep, step: Step) -> KernelStep | None:
    """step as the epilogue of the contraction: a map kernel over the points of C (its result)
    that reads C where it writes, rebuilt over C's rows (batch × M, flattened) × N, or a row
    kernel over C's rows whose stages read C at their own row and point; None where step is
    neither, or a map's load's leading axes do not step through memory as one."""
    (c,), b = contract.op.outputs, contract.op.inputs[1]
    k = step.kernel if isinstance(step, KernelStep) else None
    if k is None or k.is_reduction or k.is_scan or c not in step.args or not c.shape:
        return None
    at = step.args.index(c)
    if k.is_rows:
        over_c = len(b.shape) > 1 and k.shape == c.shape[:-1] and k.n == c.shape[-1]
        reads_c = [ins.load for stage in k.stages for ins in stage.body
                   if ins.load and ins.load.buffer == at]
        return step if over_c and all(
            len(load.strides) == len(c.shape) and _dense(load.strides, c.shape)
            and load.offset == 0 and not load.window for load in reads_c) else None
    if k.shape != c.shape:
        return None
    # the kernel's C is [batch, M, N]; a 1-D b gives columns of one element
    space = c.shape if len(b.shape) > 1 else c.shape + (1,)
    body = []
    for ins in k.body:
        load = ins.load
        if load is not None:
            reads_c_elsewhere = load.buffer == at and not (_dense(load.strides, c.shape)
                                                           and load.offset == 0)
            if load.window or reads_c_elsewhere:
                return None
            strides = load.strides if len(b.shape) > 1 else load.strides + (0,)
            leading = [(s, n) for s, n in zip(strides[:-1], space[:-1]) if n != 1]
            if any(s != t * m for (s, _), (t, m) in zip(leading, leading[1:])):
                return None
            rows = leading[-1][0] if leading else 0
            ins = replace(ins, load=replace(load, strides=(rows, strides[-1])))
        body.append(ins)
    return replace(step, kernel=replace(k, shape=(prod(space[:-1]), space[-1]), body=tuple(body)))


def _shape(op: Op) -> tuple[int, ...]:
    return op.outputs[0].shape


class _Body:
    """A kernel body being built from ops: its instructions, the one that computes each value,
    and the kernel's buffers (`args`, shared by a row kernel's stages)."""

    def __init__(self, constants: dict[Value, object], views: dict[Value, tuple[Op, View]],
                 args: list[Value]):
        self.constants, self.views, self.args = constants, views, args
        self.body: list[Instr] = []
        self.where: dict[Value, int] = {}

    def operand(self, v: Value, load: Callable[[Value, View], Load | None]) -> int | None:
        """The instruction that gives v: a constant, or a load through v's view built by
        `load` (None where the kernel cannot read v so)."""
        if v not in self.where:
            if v in self.constants:
                self.emit(v, Instr.constant(self.constants[v], v.dtype))
                return self.where[v]
            view = self.views[v][1] if v in self.views else identity(v)
            read = load(v, view)
            if read is None:
                return None
            if view.base not in self.args:
                self.args.append(view.base)
            self.emit(v, Instr.read(read.of(self.args.index(view.base)), v.dtype))
        return self.where[v]

    def compute(self, op: Op, load: Callable[[Value, View], Load | None]) -> bool:
        """op's instruction after its operands'; False where an operand cannot be read."""
        inputs = [self.operand(v, load) for v in op.inputs]
        if None in inputs:
            return False
        self.emit(op.outputs[0], Instr(op.primitive, tuple(inputs), op.params, op.outputs[0].dtype))
        return True

    def emit(self, v: Value, ins: Instr) -> None:
        self.body.append(ins)
        self.where[v] = len(self.body) - 1


def _map_kernel(name: str, ops: list[Op], users: dict[Value, int], results: set[Value],
                constants: dict[Value, object], views: dict[Value, tuple[Op, View]]) -> KernelStep:
    space = _shape(ops[0])
    uses_inside: dict[Value, int] = {}
    for op in ops:
        for v in op.inputs:
            uses_inside[v] = uses_inside.get(v, 0) + 1
    k = _Body(constants, views, [])
    for op in ops:
        k.compute(op, lambda v, view: _load(0, view, v.shape, space))
    written = [v for op in ops for v in op.outputs
               if v in results or users.get(v, 0) > uses_inside.get(v, 0)]
    stores = tuple((len(k.args) + i, k.where[v]) for i, v in enumerate(written))
    buffers = tuple((v.dtype, v.shape) for v in k.args + written)
    kernel = LoopKernel(name, space, buffers, tuple(k.body), stores)
    return KernelStep(kernel, tuple(k.args + written), tuple(written))


def _load(buffer: int, view: View, shape: tuple[int, ...], space: tuple[int, ...]) -> Load:
    """A map kernel's load of a value of `shape` through its view, at each point of `space`."""
    return Load(buffer, load_strides(view, shape, space), view.offset, load_window(view, shape, space))


def _copy_kernel(name: str, v: Value, view: View) -> KernelStep:
    """v made contiguous from its view."""
    load = _load(0, view, v.shape, v.shape)
    buffers = ((view.base.dtype, view.base.shape), (v.dtype, v.shape))
    kernel = LoopKernel(name, v.shape, buffers, (Instr.read(load, v.dtype),), ((1, 0),))
    return KernelStep(kernel, (view.base, v), (v,))


def _axes(op: Op) -> tuple[int, ...]:
    rank = len(op.inputs[0].shape)
    axis = op.attrs.get("axis")
    given = range(rank) if axis is None else (axis,) if isinstance(axis, int) else axis
    return tuple(sorted(a % rank for a in given))


def _reducible(op: Op, reduced: tuple[str, ...]) -> bool:
    """A reduction of one of the dtypes `reduced`, its result of the same dtype (the kernels
    combine in it), whose reduced axes are adjacent, so that they read as one strided axis
    (others run on the host)."""
    x = op.inputs[0]
    if x.dtype not in reduced or op.outputs[0].dtype != x.dtype:
        return False
    axes = _axes(op)
    return not axes or axes == tuple(range(axes[0], axes[-1] + 1))


def _cone(ops: list[Op], values: list[Value], available: set[Value] = frozenset()) -> list[Op]:
    """The ops that the values depend on, in order, stopping at the values available."""
    wanted, cone = {v for v in values if v not in available}, []
    for op in reversed(ops):
        if wanted.intersection(op.outputs):
            cone.append(op)
            wanted.update(v for v in op.inputs if v not in available)
    return cone[::-1]


def _reduced(op: Op, strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """A load's strides over the reduction's input, as its kept axes' strides and the one
    stride that walks the reduced axes in row-major order; None where they do not read as
    one axis."""
    shape = op.inputs[0].shape
    axes = _axes(op)
    walked = [a for a in axes if shape[a] != 1]
    if any(strides[a] != strides[b] * shape[b] for a, b in zip(walked, walked[1:])):
        return None
    kept = tuple(strides[i] for i in range(len(shape)) if i not in axes)
    return kept + (strides[walked[-1]] if walked else 1,)


def _reduction_kernel(name: str, op: Op, cone: list[Op], views: dict[Value, tuple[Op, View]],
                      constants: dict[Value, object]) -> KernelStep | None:
    """A reduction (or scan) of op's input, computed at each point by the ops of `cone` from
    loads (only a load of the input when the cone is empty); None where a load's reduced axes
    do not read as one axis, or it has a window."""
    x, out = op.inputs[0], op.outputs[0]
    axes = _axes(op)

    def load(v: Value, view: View) -> Load | None:
        strides = _reduced(op, load_strides(view, v.shape, x.shape))
        if strides is None or view.window is not None:      # (maps alone read windows)
            return None
        return Load(0, strides, view.offset)

    k = _Body(constants, views, [])
    if not all(k.compute(c, load) for c in cone) or k.operand(x, load) is None:
        return None
    n = prod(x.shape[a] for a in axes)
    outer = tuple(x.shape[i] for i in range(len(x.shape)) if i not in axes)
    buffers = tuple((v.dtype, v.shape) for v in k.args) + ((out.dtype, out.shape),)
    if op.primitive.role is Role.SCAN:          # stored along the axis as x is laid out
        scan = Accumulate(op.primitive, k.where[x], len(k.args), _reduced(op, row_major(x.shape)))
        kernel = LoopKernel(name, outer, buffers, tuple(k.body), n=n, scan=scan)
    else:
        reduce = _reduce(op, k.where[x], len(k.args), n)
        kernel = LoopKernel(name, outer, buffers, tuple(k.body), reduce=reduce, n=n)
    return KernelStep(kernel, tuple(k.args) + (out,), (out,))


def _reduce(op: Op, value: int, buffer: int, n: int) -> Reduce:
    """The loop IR's reduction of instruction `value` into `buffer` that op's primitive does."""
    prim = op.primitive
    return Reduce(prim.combine, value, buffer, n if prim.averages else None)


# ---------------------------------------------------------------- row kernels


def _rows(op: Op) -> tuple[int, ...] | None:
    """The rows of a reduction over trailing axes (its kept, leading axes), or None."""
    x = op.inputs[0]
    axes = _axes(op)
    first = len(x.shape) - len(axes)
    if not 0 < first or axes != tuple(range(first, len(x.shape))) or 0 in x.shape:
        return None
    return x.shape[:first]


def _over_rows(op: Op, rows: tuple[int, ...], space: tuple[int, ...]) -> bool:
    """Whether an elementwise op computes an element of a row (the row group's space) or one
    value per row."""
    shape = _shape(op)
    return shape == space or (shape[:len(rows)] == rows and prod(shape) == prod(rows))


def _broadcast_back(fn: Function) -> set[int]:
    """The ids of the reductions over trailing axes whose value, through views and ops of one
    value per row, comes back into an elementwise op of the reduced value's shape (softmax,
    layer norm): each starts a row kernel."""
    source: dict[Value, Op] = {}
    back: set[int] = set()
    for op in fn.ops:
        came = [source[v] for v in op.inputs if v in source]
        if reduces(op) and _rows(op) is not None:
            source[op.outputs[0]] = op
        elif came and op.primitive.role is Role.VIEW:
            source[op.outputs[0]] = came[0]
        elif came and fusible(op):
            if _shape(op) == came[0].inputs[0].shape:
                back.update(id(r) for r in came)
            elif _over_rows(op, _rows(came[0]), came[0].inputs[0].shape):
                source[op.outputs[0]] = came[0]
    return back


def _dense(strides: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return all(s == r or n == 1 for s, r, n in zip(strides, row_major(shape), shape))


class _NotRows(Exception):
    """The ops do not make a row kernel (a load no stage can make)."""


@dataclass(frozen=True)
class _RowStages:
    """A row kernel before it is made: each stage's (body, space, stores, reduction), the
    values its buffers hold in order, those its stages store, and the rows' length."""
    stages: tuple[tuple, ...]
    buffers: tuple[Value, ...]
    stored: frozenset[Value]
    n: int


class _RowSearch:
    """_row_stages within one schedule, searched once for each shape of group: a model's layers
    repeat their groups (layer norms, softmaxes, forward and backward), whose stages differ
    only in the values and the reductions they name. A group's shape is its ops (primitives,
    parameters, which values they read and make) and all that the search reads of those
    values: dtype, shape, users, whether a result, a constant's bits, a view's base, offset,
    strides and window."""

    def __init__(self, users: dict[Value, int], results: set[Value],
                 constants: dict[Value, object], views: dict[Value, tuple[Op, View]]):
        self.users, self.results, self.constants, self.views = users, results, constants, views
        self.found: dict[tuple, _RowStages | None] = {}     # by shape, values and ops numbered

    def stages(self, ops: list[Op], rows: tuple[int, ...]) -> _RowStages | None:
        values: list[Value] = []
        shape = self.shape(ops, rows, values)
        try:
            known = shape in self.found
        except TypeError:                       # (a parameter that does not hash: no search kept)
            return _row_stages(ops, rows, self.users, self.results, self.constants, self.views)
        if not known:
            found = _row_stages(ops, rows, self.users, self.results, self.constants, self.views)
            self.found[shape] = None if found is None else _numbered(found, values, ops)
        numbered = self.found[shape]
        return None if numbered is None else _named(numbered, values, ops)

    def shape(self, ops: list[Op], rows: tuple[int, ...], values: list[Value]) -> tuple:
        """The group's shape; `values` gets its values in the order they are numbered."""
        number: dict[Value, int] = {}
        facts: list[tuple] = []

        def numbered(v: Value) -> int:
            n = number.get(v)
            if n is None:
                n = number[v] = len(values)
                values.append(v)
                view = self.views[v][1] if v in self.views else None
                facts.append((n, v.dtype, v.shape, self.users.get(v, 0), v in self.results,
                              _bits(self.constants[v]) if v in self.constants else None,
                              None if view is None else
                              (numbered(view.base), view.offset, view.strides, view.window)))
            return n
        group = tuple((op.primitive, op.params, tuple(map(numbered, op.inputs)),
                       tuple(map(numbered, op.outputs))) for op in ops)
        return rows, group, tuple(facts)


def _bits(constant: object) -> tuple:
    """A constant as the search tells it from another: its type, dtype and bytes (-0.0 is not
    0.0)."""
    a = np.asarray(constant)
    return type(constant), a.dtype.str, a.tobytes()


def _numbered(found: _RowStages, values: list[Value], ops: list[Op]) -> _RowStages:
    """found with each value it names as its number in `values`, each reduction as its index."""
    number = {v: i for i, v in enumerate(values)}
    return _RowStages(tuple((body, space, tuple((at, number[v]) for at, v in stores),
                             None if r is None else ops.index(r))
                            for body, space, stores, r in found.stages),
                      tuple(number[v] for v in found.buffers),
                      frozenset(number[v] for v in found.stored), found.n)


def _named(found: _RowStages, values: list[Value], ops: list[Op]) -> _RowStages:
    """The stages of a numbered search for the group whose values and ops these are."""
    return _RowStages(tuple((body, space, tuple((at, values[n]) for at, n in stores),
                             None if r is None else ops[r])
                            for body, space, stores, r in found.stages),
                      tuple(values[n] for n in found.buffers),
                      frozenset(values[n] for n in found.stored), found.n)


def _row_kernel(name: str, found: _RowStages, rows: tuple[int, ...]) -> KernelStep:
    """The kernel of _row_stages' stages."""
    stages, bufs, stored, n = found.stages, found.buffers, found.stored, found.n
    writes = [v for v in bufs if v in stored]
    args = [v for v in bufs if v not in stored] + writes
    number = {bufs.index(v): args.index(v) for v in bufs}
    kernels = []
    buffers = tuple((v.dtype, v.shape) for v in args)
    for i, (body, stage_space, stores, reduction) in enumerate(stages):
        body = tuple(Instr.read(ins.load.of(number[ins.load.buffer]), ins.dtype) if ins.load else ins
                     for ins in body)
        if reduction is None:
            kernels.append(LoopKernel(f"{name}.s{i}", stage_space, buffers, body,
                                      tuple((args.index(v), at) for at, v in stores)))
        else:
            (at, out), = stores
            reduce = _reduce(reduction, at, args.index(out), n)
            kernels.append(LoopKernel(f"{name}.s{i}", rows, buffers, body, reduce=reduce, n=n))
    kernel = LoopKernel(name, rows, buffers, (), n=n, stages=tuple(kernels))
    return KernelStep(kernel, tuple(args), tuple(writes))


def _row_stages(ops: list[Op], rows: tuple[int, ...], users: dict[Value, int],
                results: set[Value], constants: dict[Value, object],
                views: dict[Value, tuple[Op, View]]) -> _RowStages | None:
    """The stages of one kernel over each row for ops that are elementwise over the rows'
    elements (the space of the first reduction's input), reductions over the row, and
    elementwise ops of one value per row; None where a value would be read other than a stage
    can.

    Before each reduction, a per-row stage computes the pending ops of one value per row
    (one stage for each of their shapes, in order); the reduction stage computes its input
    from loads, the rows' values and the values earlier stages stored; a final map stage
    stores the elements used after the kernel. An element value that more than one stage
    needs is computed again by each (a few cheap operations, no memory) unless it comes from
    a costly op (exp, log, tanh…): then a map stage stores it first, and later stages load it.
    Every row's value a later stage reads is stored (and kept in a register there)."""
    reductions = [op for op in ops if reduces(op)]
    space = reductions[0].inputs[0].shape
    n = prod(space[len(rows):])
    made = {v: op for op in ops for v in op.outputs}
    per_row = {v for op in ops for v in op.outputs if op in reductions or _shape(op) != space}
    uses_inside: dict[Value, int] = {}
    for op in ops:
        for v in op.inputs:
            uses_inside[v] = uses_inside.get(v, 0) + 1
    written = {v for v in made if v in results or users.get(v, 0) > uses_inside.get(v, 0)}

    finals = [v for v in made if v in written and v not in per_row]
    cones = [_cone(ops, [r.inputs[0]], per_row) for r in reductions] + [_cone(ops, finals, per_row)]
    needed = [op for c in cones for op in c]
    materialize = {op.outputs[0] for op in set(needed) if op.primitive.costly and needed.count(op) > 1}

    bufs: list[Value] = []
    stored: set[Value] = set()
    stages: list[tuple[list[Instr], tuple[int, ...], tuple[tuple[int, Value], ...], Op | None]] = []

    def stage(compute: list[Op], stores: list[Value], stage_space: tuple[int, ...],
              reduction: Op | None = None) -> None:
        over = space if reduction is not None else stage_space       # where loads are read

        def load(v: Value, view: View) -> Load:
            base = view.base
            if base in made and base not in stored:
                raise _NotRows                  # (a view of an element no stage stores)
            strides = load_strides(view, v.shape, over)
            read = Load(0, strides, view.offset, load_window(view, v.shape, over))
            if base in per_row and not row_scalar(read, rows, n):
                raise _NotRows                  # a row's value read at other rows
            if base in made and base not in per_row and (v in views or not _dense(strides, over)):
                raise _NotRows                  # a stored element read at other points
            if reduction is None:
                return read
            strides = _reduced(reduction, strides)
            if strides is None or read.window:
                raise _NotRows
            return Load(0, strides, view.offset)

        k = _Body(constants, views, bufs)
        for op in compute:
            k.compute(op, load)
        if reduction is not None:
            k.operand(reduction.inputs[0], load)
            stores = [reduction.outputs[0]]
        for v in stores:
            if v not in bufs:
                bufs.append(v)
        stored.update(stores)
        at = [k.where[reduction.inputs[0]] if reduction else k.where[v] for v in stores]
        stages.append((k.body, stage_space, tuple(zip(at, stores)), reduction))

    done: set[Op] = set()

    def per_row_stages(before: int) -> None:
        pending = [op for op in ops[:before] if op not in reductions and _shape(op) != space
                   and op not in done]
        while pending:
            shape = _shape(pending[0])
            run = [op for op in pending if _shape(op) == shape]
            pending = [op for op in pending if _shape(op) != shape]
            others = [op for op in ops if op not in run]
            read = {w for op in others for w in op.inputs}
            read |= {views[w][1].base for op in others for w in op.inputs if w in views}
            keep = [op.outputs[0] for op in run if op.outputs[0] in written or op.outputs[0] in read]
            if keep:
                stage(run, keep, shape)
            done.update(run)

    try:
        for r in reductions:
            per_row_stages(ops.index(r))
            available = per_row | stored
            inputs = _cone(ops, [r.inputs[0]], available)
            early = [v for v in materialize if v not in stored and made[v] in inputs]
            if early:
                stage(_cone(ops, early, available), sorted(early, key=lambda v: ops.index(made[v])), space)
            stage(_cone(ops, [r.inputs[0]], per_row | stored), [], rows, r)
        per_row_stages(len(ops))
        late = [v for v in finals if v not in stored]
        if late:
            stage(_cone(ops, late, per_row | stored), late, space)
    except _NotRows:
        return None
    return _RowStages(tuple(stages), tuple(bufs), frozenset(stored), n)


# ---------------------------------------------------------------- the buffer plan

ALIGN = 64                                   # bytes: a cache line, and an AVX-512 vector


@dataclass(frozen=True)
class Memory:
    """Where the plan's intermediate values live: `offsets[v]` bytes into an arena of `size`
    bytes. Values not in `offsets` (parameters, results, host outputs and views, and what
    results may alias) get their own arrays."""
    size: int
    offsets: dict[Value, int]


def reads(step: Step) -> tuple[Value, ...]:
    """The values a step reads (a contraction's epilogue's included)."""
    if isinstance(step, KernelStep):
        return tuple(v for v in step.args if v not in step.writes)
    if isinstance(step, ContractStep) and step.epilogue:
        return step.op.inputs + reads(step.epilogue)
    return step.op.inputs


def writes(step: Step) -> tuple[Value, ...]:
    """The values a step writes (a contraction's epilogue's included)."""
    if isinstance(step, KernelStep):
        return step.writes
    if isinstance(step, ContractStep) and step.epilogue:
        return step.op.outputs + step.epilogue.writes
    return step.op.outputs


def made_once(op: Op) -> bool:
    """An op of no inputs and no body (a constant, zeros, an arange): its outputs never change,
    so a runtime makes them once per executable."""
    return not op.inputs and op.body is None


def last_uses(plan: Plan) -> list[list[Value]]:
    """For each step, the values it reads or writes that no later step reads and the function
    does not return: a runtime frees them after it."""
    kept = set(plan.function.results)
    last: dict[Value, int] = {}
    for i, step in enumerate(plan.steps):
        for v in writes(step):
            last.setdefault(v, i)
        for v in reads(step):
            last[v] = i
    dead: list[list[Value]] = [[] for _ in plan.steps]
    for v, i in last.items():
        if v not in kept:
            dead[i].append(v)
    return dead


def nbytes(v: Value) -> int:
    return prod(v.shape) * np_dtype(v.dtype).itemsize


def plan_memory(plan: Plan) -> Memory:
    """Offsets for the values that kernels and contractions write, greedily by size: each
    value takes the lowest offset free of every value whose lifetime meets its own. A host
    step's outputs may be views of its inputs (NumPy reshapes and slices), and a view step's
    are, so such an input lives as long as those outputs, and does not go in the arena if they
    are results."""
    steps = plan.steps
    escaping = set(plan.function.results)
    end: dict[Value, int] = {}
    for i, step in enumerate(steps):
        for v in reads(step):
            end[v] = i
    for i in reversed(range(len(steps))):
        step = steps[i]
        if isinstance(step, (HostStep, ViewStep)):
            outs = step.op.outputs
            for v in reads(step):
                end[v] = max([end.get(v, i)] + [end.get(o, i) for o in outs])
                if escaping.intersection(outs):
                    escaping.add(v)
    lifetimes = [(v, i, end.get(v, i)) for i, step in enumerate(steps)
                 if isinstance(step, (KernelStep, ContractStep))
                 for v in writes(step) if v not in escaping]
    lifetimes.sort(key=lambda t: -nbytes(t[0]))
    placed: list[tuple[int, int, int, int]] = []          # (offset, size, first, last)
    offsets: dict[Value, int] = {}
    size = 0
    for v, first, last in lifetimes:
        need = -(-max(nbytes(v), 1) // ALIGN) * ALIGN
        at = 0
        # a value read at step i and one written at step i overlap: a kernel's buffers never alias
        for off, n, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
            if at + need <= off:
                break
            at = max(at, off + n)
        placed.append((at, need, first, last))
        offsets[v] = at
        size = max(size, at + need)
    return Memory(size, offsets)
