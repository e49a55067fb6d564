"""The loop IR of one kernel: an iteration space, a body of scalar instructions evaluated at
each point, and what is stored (a map) or reduced (a reduction) — shared by every target.

A map kernel evaluates its body at every point of `shape` and stores values into buffers of
that shape. A reduction kernel's space is its result's axes followed by the reduced axes
(collapsed into one, `n` long); it combines the body's value over the reduced index in the
canonical order of ir/numerics.py and stores one value per result point. Buffers are read
through affine accesses: an element offset that is a constant plus a sum of index × stride per
axis (stride 0 where the buffer is broadcast), so transposes, broadcasts and slices cost
nothing. A map's load may have a window: outside it the load is 0 and reads no memory, so
that zeros around a buffer (the gradient of a slice) are never made.

A scan kernel's space is, like a reduction's, the kept axes followed by the scanned one (`n`
long): at each kept point it walks the scanned axis in order, accumulating the body's value
by its primitive's `step` (ir/ops/scan.py), and stores every partial result.

A row kernel (softmax, layer norm) keeps a reduction over trailing axes, the elementwise ops
around it and those that use its result broadcast back in one kernel. Its `shape` is the rows
(the outer axes, which threads split) and `n` the row length; for each row it runs its
`stages` in order, each a kernel of the same buffers: a reduction stage (space: the rows)
gives one value per row in the canonical order; a map stage over rows + the row's axes
stores elements; a map stage whose space is the rows and length-1 axes computes values per
row. A stage reads the row's value of an earlier reduction or per-row stage through a load
that broadcasts it along the row (`row_scalar`): the value that stage stored (a target may
keep it in a register instead), and an element an earlier map stage stored at the same
point. Nothing else an earlier stage writes is read."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from ir.ops.base import Primitive


@dataclass(frozen=True)
class Load:
    """buffer[offset + Σ index[d] * strides[d]]; for a reduction, the last stride is the
    reduced axis's. Where lo <= index[axis] < hi fails for an (axis, lo, hi) of `window`
    (maps only), the load is 0 of its dtype instead (+0.0 for floats)."""
    buffer: int
    strides: tuple[int, ...]
    offset: int = 0
    window: tuple[tuple[int, int, int], ...] = ()

    def of(self, buffer: int) -> Load:
        """The same load from another buffer (made directly: dataclasses.replace, called for
        every load the scheduler tries, took a tenth of its time; the GPT step's schedule
        170 -> 152 ms)."""
        return Load(buffer, self.strides, self.offset, self.window)


@dataclass(frozen=True)
class Instr:
    """%i = prim(args…; attrs) of dtype, the primitive's scalar body; with no primitive, a
    load (where `load` is set) or a scalar constant (the attribute `value`)."""
    prim: Primitive | None
    args: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    dtype: str
    load: Load | None = None

    @staticmethod
    def constant(value: Any, dtype: str) -> Instr:
        return Instr(None, (), (("value", value),), dtype)

    @staticmethod
    def read(load: Load, dtype: str) -> Instr:
        return Instr(None, (), (), dtype, load)


@dataclass(frozen=True)
class Reduce:
    """The body's instruction `value` combined over the reduced axis by add, mul, max or min,
    divided by `count` afterwards when count is set (mean), stored into `buffer`."""
    combine: str
    value: int
    buffer: int
    count: int | None = None


@dataclass(frozen=True)
class Accumulate:
    """The body's instruction `value` scanned along the last axis of the space by `prim`'s
    step: y[0] = v[0], y[j] = step(y[j-1], v[j]), each y[j] stored into `buffer` at
    Σ index[d] * strides[d] over the kept axes and the scanned one."""
    prim: Primitive
    value: int
    buffer: int
    strides: tuple[int, ...]


@dataclass(frozen=True)
class LoopKernel:
    name: str
    shape: tuple[int, ...]                         # a map's space, or the kept axes (reduce, scan)
    buffers: tuple[tuple[str, tuple[int, ...]], ...]   # (dtype, shape) of each argument
    body: tuple[Instr, ...]
    stores: tuple[tuple[int, int], ...] = ()       # a map's (buffer, instruction) pairs
    reduce: Reduce | None = None
    n: int = 0                                     # a reduced or scanned length, a row's length
    stages: tuple[LoopKernel, ...] = ()            # a row kernel's stages, in order
    scan: Accumulate | None = None

    def __post_init__(self) -> None:
        if (self.reduce or self.scan) and any(ins.load and ins.load.window for ins in self.body):
            raise ValueError(f"kernel {self.name}: the loads of a reduction or a scan have "
                             "no window")
        per_row: set[int] = set()
        for stage in self.stages:
            if stage.shape[:len(self.shape)] != self.shape or stage.is_reduction and stage.n != self.n:
                raise ValueError(f"kernel {self.name}: stage {stage.name} is not over its rows")
            for ins in stage.body:
                if ins.load and ins.load.buffer in per_row and not row_scalar(ins.load, self.shape, self.n):
                    raise ValueError(f"kernel {self.name}: stage {stage.name} reads a row's value "
                                     f"b{ins.load.buffer} at other rows")
            per_row.update(row_values(stage, self.shape))

    @property
    def costly(self) -> bool:
        """Whether it computes a costly primitive (exp, log, tanh…): many instructions an element."""
        return any(ins.prim is not None and ins.prim.costly
                   for kernel in (self, *self.stages) for ins in kernel.body)

    @property
    def is_reduction(self) -> bool:
        return self.reduce is not None

    @property
    def is_rows(self) -> bool:
        return bool(self.stages)

    @property
    def is_scan(self) -> bool:
        return self.scan is not None

    @property
    def reads_length(self) -> bool:
        """Whether its code takes its reduced length n at run time (backend/llvm.py): a
        reduction's, whose n is often a batch's (a loss's mean over the tokens, a bias's
        gradient summed over them), not a row kernel's (its rows' length, a model's width)."""
        return self.is_reduction and not self.is_rows

    @property
    def extent(self) -> int:
        """The range [0, extent) that the kernel function's (lo, hi) cut (backend/llvm.py): a
        map's first axis, a reduction's result points or a scan's, a row kernel's rows."""
        if not self.shape:
            return 1
        points = self.is_reduction or self.is_rows or self.is_scan
        return prod(self.shape) if points else self.shape[0]


def row_values(stage: LoopKernel, rows: tuple[int, ...]) -> tuple[int, ...]:
    """The buffers a stage of a row kernel writes one value per row of."""
    if stage.is_reduction:
        return (stage.reduce.buffer,)
    return tuple(buf for buf, _ in stage.stores) if prod(stage.shape) == prod(rows) else ()


def row_scalar(load: Load, rows: tuple[int, ...], n: int) -> bool:
    """Whether a load, at each point of rows + a row's axes (n elements), reads the value of
    a buffer of one value per row (row-major over the rows) that belongs to that row."""
    dense = [1] * len(rows)
    for d in reversed(range(len(rows) - 1)):
        dense[d] = dense[d + 1] * rows[d + 1]
    over_rows = all(s == r or n == 1 for s, r, n in zip(load.strides, dense, rows))
    along = n == 1 or not any(load.strides[len(rows):])
    return over_rows and along and load.offset == 0 and not load.window


def to_text(k: LoopKernel) -> str:
    """A kernel as readable text (dslc ir --level loops)."""
    args = ", ".join(f"b{i}: {dt}{list(shape)}" for i, (dt, shape) in enumerate(k.buffers))
    if k.is_rows:
        lines = [f"kernel {k.name}({args}) rows {list(k.shape)} of {k.n}:"]
        for stage in k.stages:
            lines += ["  " + line for line in _stage_text(stage)]
        return "\n".join(lines)
    return "\n".join([f"kernel {k.name}({args}) {_space(k)}:"] + _body_text(k))


def _space(k: LoopKernel) -> str:
    return f"for {list(k.shape)}" + (f" reduce {k.n}" if k.is_reduction else
                                     f" scan {k.n}" if k.is_scan else "")


def _stage_text(k: LoopKernel) -> list[str]:
    return [f"stage {k.name.rsplit('.', 1)[-1]} {_space(k)}:"] + _body_text(k)


def _body_text(k: LoopKernel) -> list[str]:
    lines = []
    for i, ins in enumerate(k.body):
        if ins.load is not None:
            load = ins.load
            at = f" {'-' if load.offset < 0 else '+'} {abs(load.offset)}" if load.offset else ""
            inside = " and ".join(f"{lo} <= i{axis} < {hi}" for axis, lo, hi in load.window)
            where = f" if {inside} else 0" if inside else ""
            lines.append(f"  %{i} = load b{load.buffer}{list(load.strides)}{at}{where} : {ins.dtype}")
        else:
            attrs = "".join(f", {a}={v!r}" for a, v in ins.attrs)
            args = ", ".join(f"%{a}" for a in ins.args)
            lines.append(f"  %{i} = {ins.prim.name if ins.prim else 'const'}({args}{attrs}) : {ins.dtype}")
    for buf, ins in k.stores:
        lines.append(f"  store b{buf} <- %{ins}")
    if k.reduce:
        r = k.reduce
        mean = f" / {r.count}" if r.count is not None else ""
        lines.append(f"  b{r.buffer} <- {r.combine} over {k.n} of %{r.value}{mean}")
    if k.scan:
        a = k.scan
        lines.append(f"  b{a.buffer}{list(a.strides)} <- {a.prim.name} along {k.n} of %{a.value}")
    return lines
