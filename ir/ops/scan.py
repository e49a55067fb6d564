"""Scans along one axis: `cumsum cumprod logcumsumexp`, as torch's (x, dim): `axis` is
required, negative counting from the end; the result has x's shape and dtype.

The order of accumulation is part of the definition (docs/numerics.md): along the axis,
y[0] = x[0] and y[i] = y[i-1] ⊕ x[i], one rounding a step, left to right, which every backend
follows bit for bit (a CPU thread, or a GPU thread, walks one line of the axis). ⊕ is `+`
for cumsum, `*` for cumprod (integers wrap around, as sum's), and for logcumsumexp
log(e^a + e^b) computed stably as torch's, by `log_add_exp` below.

A scan is a kernel of its own (Role.SCAN, backend/schedule.py) whose loop is each
primitive's `step`, its ⊕ on one value (or one vector of lanes) of the accumulator and the
next element. The VJPs follow torch: cumsum's is the reverse cumsum of the cotangent;
cumprod's handles zeros exactly (below); logcumsumexp's is torch's stable formula."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from ir import numerics
from ir.mlir import S, Window, broadcast_map, tensor_type
from ir.ops.base import (NUMERIC, Kind, Param, Primitive, Role, need, normalize_axes, np_dtype,
                         primitive, statics, type_of)
from ir.ops.elementwise import MathFunction, Maximum, Minimum
from ir.types import FLOAT_DTYPES, TensorType


# elements of a scan's axis that one linalg.generic accumulates (docs/mlir.md)
CHUNK = 32


class Cumulative(Primitive):
    """y[0] = x[0], y[i] = y[i-1] ⊕ x[i] along `axis`."""
    params = (Param("x", Kind.TENSOR), Param("axis", Kind.INT))
    role = Role.SCAN
    accepts: ClassVar[tuple[str, ...]] = NUMERIC
    needs: ClassVar[str] = "a numeric"
    compiled: ClassVar[tuple[str, ...]] = ("f32", "f64", "f16", "i32", "i64", "u32")
    host = "bf16 is not compiled"
    # ⊕ on NumPy arrays; a ufunc's accumulate is the same left-to-right loop, in C
    reference: ClassVar[Callable[[np.ndarray, np.ndarray], np.ndarray]]

    def infer(self, x: TensorType, axis: int) -> TensorType:
        x = need(x, self.accepts, lambda: f"'{self.name}' needs {self.needs} tensor, got {x}; "
                 "use cast()", "x")
        normalize_axes(axis, x.rank, x)
        return x

    def evaluate(self, x: np.ndarray, axis: int) -> np.ndarray:
        self.infer(type_of(x), axis)
        if isinstance(self.reference, np.ufunc):
            return self.reference.accumulate(x, axis=axis, dtype=x.dtype)
        y = np.moveaxis(np.array(x), axis, 0)
        for i in range(1, len(y)):
            y[i] = self.reference(y[i - 1], y[i])
        return np.moveaxis(y, 0, axis)

    def compiles(self, dtypes: list[str], dtype: str) -> bool:
        return dtype in self.compiled

    def step(self, e: Any, acc: Any, x: Any, dtype: str) -> Any:
        """acc ⊕ x in a kernel, built with a target's scalar emitter e (backend/llvm.py)."""
        raise NotImplementedError

    def mlir(self, w: Any, op: Any) -> list[str]:
        """Chunks of CHUNK elements along the axis, each a linalg.generic whose element j
        accumulates, in an scf.for, the chunk's elements 0..j onto the previous chunk's last
        (for the first chunk, onto its element 0); an scf.for over the chunks carries that last
        line and the result. Each element is the kernels' y[i] = y[i-1] ⊕ x[i] chain, so the
        bits are theirs; the chunks bound the work to CHUNK steps an element and the loop IREE
        runs on its host (slow: about 0.4 ms a step) to n / CHUNK steps."""
        (x,) = op.inputs
        axis, shape, dtype = statics(op)["axis"] % len(x.shape), x.shape, x.dtype
        n, b = shape[axis], w.body
        if n <= 1 or 0 in shape:
            return [w[x]]

        def sized(k: int) -> tuple[int, ...]:
            return tuple(k if i == axis else m for i, m in enumerate(shape))

        def chunk(offset: int | str, size: int, previous: str | None) -> str:
            """x's elements offset..offset + size along the axis, scanned onto `previous`."""
            part = w.extract(w[x], shape, dtype, Window.along(shape, axis, offset, size),
                             sized(size), "chunk")

            def element(args: list[S]) -> list[S]:
                at = [b.position(i) for i in range(len(shape))]

                def read(k: S) -> S:
                    return b.extract(part, tensor_type(sized(size), dtype), dtype,
                                     [k if i == axis else p for i, p in enumerate(at)])
                first = args[0] if previous else read(w.index_here(0))
                start = w.index_here(0 if previous else 1)
                stop = b.add(at[axis], w.index_here(1))
                return [b.repeat(start, stop, first, lambda k, acc: self.step(b, acc, read(k), dtype))]
            ins = [(previous, tensor_type(sized(1), dtype), broadcast_map(sized(1), sized(size)))] \
                if previous else []
            return w.generic(sized(size), [dtype], ins, element, hint=self.name)[0]

        def last(part: str, size: int) -> str:
            return w.extract(part, sized(size), dtype, Window.along(sized(size), axis, size - 1, 1),
                             sized(1), "last")

        whole, tail = divmod(n, CHUNK)
        if not whole:
            return [chunk(0, n, None)]
        head = chunk(0, CHUNK, None)
        y = w.insert(head, sized(CHUNK), w.empty(shape, dtype), shape, dtype,
                     Window.along(shape, axis, 0, CHUNK))

        def step(t: str, carried: list[str]) -> list[str]:
            previous, y = carried
            offset = b.mul(S(t, "index"), w.index_here(CHUNK)).name
            part = chunk(offset, CHUNK, previous)
            return [last(part, CHUNK), w.insert(part, sized(CHUNK), y, shape, dtype,
                                                Window.along(shape, axis, offset, CHUNK))]
        previous, y = w.loop(whole, [(last(head, CHUNK), tensor_type(sized(1), dtype)),
                                     (y, tensor_type(shape, dtype))], step, self.name, start=1)
        if tail:
            y = w.insert(chunk(whole * CHUNK, tail, previous), sized(tail), y, shape, dtype,
                         Window.along(shape, axis, whole * CHUNK, tail))
        return [y]


def _backwards(b: Any, v: Any, axis: int) -> Any:
    """v[::-1] along axis: a slice, which the kernels read in place (negative strides)."""
    return b.emit("slice", v, start=-1, axis=axis, step=-1)


def _reverse(b: Any, prim: str, v: Any, axis: int) -> Any:
    """prim scanned from the end of the axis back to its start."""
    return _backwards(b, b.emit(prim, _backwards(b, v, axis), axis=axis), axis)


@primitive
class CumSum(Cumulative):
    """The running sum: y[i] = y[i-1] + x[i]."""
    name = surface = "cumsum"
    reference = np.add

    def step(self, e: Any, acc: Any, x: Any, dtype: str) -> Any:
        return e.add(acc, x)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (_reverse(b, "cumsum", cts[0], statics(op)["axis"]),)


@primitive
class CumProd(Cumulative):
    """The running product: y[i] = y[i-1] * x[i]."""
    name = surface = "cumprod"
    reference = np.multiply

    def step(self, e: Any, acc: Any, x: Any, dtype: str) -> Any:
        return e.mul(acc, x)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """dx[j] = Σ_{i≥j} ct[i] · y[i] / x[j] before a line's first zero k; at k, the same
        sum over the products that skip x[k] (the cumprod of x with x[k] made 1); after k, 0:
        every product there holds two zeros or skips none."""
        (x,), (y,), (ct,) = op.inputs, op.outputs, cts
        axis = statics(op)["axis"]
        zero, one = b.constant(0.0, x.dtype), b.constant(1.0, x.dtype)
        is_zero = b.emit("eq", x, zero)
        seen = b.emit("cumsum", b.emit("cast", is_zero, dtype=x.dtype), axis=axis)
        first = b.emit("and", is_zero, b.emit("eq", seen, one))
        skipping = b.emit("cumprod", b.emit("where", first, one, x), axis=axis)
        before = b.emit("div", _reverse(b, "cumsum", b.emit("mul", ct, y), axis), x)
        at = _reverse(b, "cumsum", b.emit("mul", ct, skipping), axis)
        return (b.emit("where", b.emit("eq", seen, zero), before,
                       b.emit("where", first, at, zero)),)


def log_add_exp(a: Any, b: Any) -> Any:
    """log(e^a + e^b) in NumPy, the definition logcumsumexp's step follows: with m = max(a, b)
    and t = e^(min(a, b) - m), m + log1p(t), where log1p(t) = log(u) + (t - (u - 1)) / u for
    u = 1 + t (the rounding error of u, put back); m itself where m is ±inf (e^-inf + e^-inf
    is 0, whose log is -inf; and inf + anything is inf). NaN if a or b is."""
    m, low = numerics.maximum(a, b), numerics.minimum(a, b)
    with np.errstate(invalid="ignore"):          # inf - inf: NaN, where m is the result
        t = np.exp(low - m)
    u = 1 + t
    return np.where(np.isinf(m), m, m + (np.log(u) + (t - (u - 1)) / u))


@primitive
class LogCumSumExp(Cumulative):
    """The running log of the sum of exponentials: y[i] = log(e^y[i-1] + e^x[i]), stably."""
    name = surface = "logcumsumexp"
    reference = staticmethod(log_add_exp)
    accepts = FLOAT_DTYPES
    needs = "a float"
    compiled = ("f32", "f64")
    host = MathFunction.host
    costly = True                                # an exp and a log a step

    def step(self, e: Any, acc: Any, x: Any, dtype: str) -> Any:
        """log_add_exp, operation by operation."""
        pair, kinds = [acc, x], [dtype, dtype]
        m = Maximum().scalar(e, pair, kinds, dtype, {})
        low = Minimum().scalar(e, pair, kinds, dtype, {})
        t = e.math("exp", e.sub(low, m))
        u = e.add(e.const(1.0, dtype, t), t)
        log1p = e.add(e.math("log", u), e.div(e.sub(t, e.sub(u, e.const(1.0, dtype, t))), u))
        infinite = e.compare("==", e.abs(m, dtype), e.const(float("inf"), dtype, m), dtype)
        return e.select(infinite, m, e.add(m, log1p))

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """dx[j] = Σ_{i≥j} ct[i] e^(x[j] - y[i]), with the positive and the negative cotangents
        each summed in log space by a reverse logcumsumexp, as torch does (no e^x overflows)."""
        (x,), (y,), (ct,) = op.inputs, op.outputs, cts
        axis = statics(op)["axis"]
        zero = b.constant(0.0, x.dtype)
        import ml_dtypes            # (loaded where it is needed: see ir/ops/base.py's NUMPY_DTYPES)
        lowest = b.constant(float(ml_dtypes.finfo(np_dtype(x.dtype)).min), x.dtype)
        log_ct = b.emit("log", b.emit("abs", ct))

        def part(sign: str) -> Any:
            logs = b.emit("where", b.emit(sign, ct, zero), log_ct, lowest)
            summed = _reverse(b, "logcumsumexp", b.emit("sub", logs, y), axis)
            return b.emit("exp", b.emit("add", summed, x))

        return (b.emit("sub", part("gt"), part("lt")),)
