"""The loop IR of one kernel: an iteration space, a body of scalar instructions evaluated at
each point, and what is stored (a map) or reduced (a reduction) — shared by every target.

A map kernel evaluates its body at every point of `shape` and stores values into buffers of
that shape. A reduction kernel's space is its result's axes followed by the reduced axes
(collapsed into one, `n` long); it combines the body's value over the reduced index in the
canonical order of ir/numerics.py and stores one value per result point. Buffers are read
through affine accesses: an element offset that is a constant plus a sum of index × stride per
axis (stride 0 where the buffer is broadcast), so transposes, broadcasts and slices cost
nothing. A map's load may have a window: outside it the load is 0 and reads no memory, so
that zeros around a buffer (the gradient of a slice) are never made."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Load:
    """buffer[offset + Σ index[d] * strides[d]]; for a reduction, the last stride is the
    reduced axis's. Where lo <= index[axis] < hi fails for an (axis, lo, hi) of `window`
    (maps only), the load is 0 of its dtype instead (+0.0 for floats)."""
    buffer: int
    strides: tuple[int, ...]
    offset: int = 0
    window: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class Instr:
    """%i = prim(args…; attrs) of dtype, or a load (prim 'load'), or a scalar 'const'."""
    prim: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    dtype: str
    load: Load | None = None


@dataclass(frozen=True)
class Reduce:
    """The body's instruction `value` combined over the reduced axis ('add', 'max' or 'min'),
    divided by `count` afterwards when count is set (mean), stored into `buffer`."""
    combine: str
    value: int
    buffer: int
    count: int | None = None


@dataclass(frozen=True)
class LoopKernel:
    name: str
    shape: tuple[int, ...]                         # a map's space, or a reduction's result axes
    buffers: tuple[tuple[str, tuple[int, ...]], ...]   # (dtype, shape) of each argument
    body: tuple[Instr, ...]
    stores: tuple[tuple[int, int], ...] = ()       # a map's (buffer, instruction) pairs
    reduce: Reduce | None = None
    n: int = 0                                     # a reduction's reduced length

    def __post_init__(self) -> None:
        if self.reduce and any(ins.load and ins.load.window for ins in self.body):
            raise ValueError(f"kernel {self.name}: a reduction's loads have no window")

    @property
    def is_reduction(self) -> bool:
        return self.reduce is not None


def to_text(k: LoopKernel) -> str:
    """A kernel as readable text (dslc ir --level loops)."""
    args = ", ".join(f"b{i}: {dt}{list(shape)}" for i, (dt, shape) in enumerate(k.buffers))
    space = f"for {list(k.shape)}" + (f" reduce {k.n}" if k.is_reduction else "")
    lines = [f"kernel {k.name}({args}) {space}:"]
    for i, ins in enumerate(k.body):
        if ins.prim == "load":
            load = ins.load
            at = f" {'-' if load.offset < 0 else '+'} {abs(load.offset)}" if load.offset else ""
            inside = " and ".join(f"{lo} <= i{axis} < {hi}" for axis, lo, hi in load.window)
            where = f" if {inside} else 0" if inside else ""
            lines.append(f"  %{i} = load b{load.buffer}{list(load.strides)}{at}{where} : {ins.dtype}")
        else:
            attrs = "".join(f", {a}={v!r}" for a, v in ins.attrs)
            args = ", ".join(f"%{a}" for a in ins.args)
            lines.append(f"  %{i} = {ins.prim}({args}{attrs}) : {ins.dtype}")
    for buf, ins in k.stores:
        lines.append(f"  store b{buf} <- %{ins}")
    if k.reduce:
        r = k.reduce
        mean = f" / {r.count}" if r.count else ""
        lines.append(f"  b{r.buffer} <- {r.combine} over {k.n} of %{r.value}{mean}")
    return "\n".join(lines)
