"""Observing a running program: `debug` prints a summary of a value, `assert_finite` stops the
run when a value holds a NaN or an infinity. Both are effects (ir/ops/base.py): kept though
their result is unused, run in program order on the host, and given the op's origin (where
the source wrote them) by the interpreter, which they print or report.

In MLIR (device="iree"), assert_finite is a check in the module (cf.assert), which stops the
call with an error status and this op's message; debug passes x on and prints nothing, for
upstream MLIR has no operation that prints, and IREE's own (a trace) is outside it."""
from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from ir.mlir import S, string, tensor_type
from ir.ops.base import EvalError, Kind, Param, Primitive, is_float, primitive, statics, type_of
from ir.ops.elementwise import IsFinite
from ir.types import FLOAT_DTYPES, TensorType


class Effect(Primitive):
    """x passed on unchanged, once the effect has happened."""
    params = (Param("x", Kind.TENSOR), Param("label", Kind.STR))
    differentiable = False
    effect = True
    host = "it acts on the host when the program reaches it"

    def infer(self, x: TensorType, label: str) -> TensorType:
        return x

    def mlir(self, w: Any, op: Any) -> list[str]:
        return [w[op.inputs[0]]]


@primitive
class Debug(Effect):
    """Prints `SITE: LABEL: TYPE min=… max=… mean=… nan=…` to stderr; min, max and mean are
    of the values that are not NaN."""
    name = surface = "debug"

    def evaluate(self, x: np.ndarray, label: str, origin: Any = None) -> np.ndarray:
        print(f"{origin}: " * (origin is not None) + f"{label}: {summary(x)}", file=sys.stderr,
              flush=True)
        return x


@primitive
class AssertFinite(Effect):
    """x, when no value of it is NaN or infinite; else the run stops with an error at the op."""
    name = surface = "assert_finite"

    def evaluate(self, x: np.ndarray, label: str, origin: Any = None) -> np.ndarray:
        if is_float(x.dtype) and not np.isfinite(x).all():
            nan = int(np.isnan(x).sum())
            raise EvalError(f"assert_finite failed: '{label}' has {_count(nan, 'NaN')} and "
                            f"{_count(int(np.isinf(x).sum()), 'infinity', 'infinities')} among "
                            f"its {x.size} values", origin)
        return x

    def mlir(self, w: Any, op: Any) -> list[str]:
        """cf.assert that every element is finite (a linalg.generic reducing x to an i1), with
        the interpreter's message but for the counts, which the module does not keep."""
        (x,), label = op.inputs, statics(op)["label"]
        if x.dtype not in FLOAT_DTYPES:
            return [w[x]]
        rank = len(x.shape)

        def finite(args: list[S]) -> list[S]:
            value, so_far = args
            return [w.body.and_(IsFinite().scalar(w.body, [value], [x.dtype], "bool", {}), so_far)]
        every = w.generic(x.shape, ["bool"], [(w[x], tensor_type(x.shape, x.dtype),
                                               ", ".join(f"d{i}" for i in range(rank)))],
                          finite, reduced=range(rank), inits=[w.filled(True, (), "bool", "all")],
                          hint="finite")[0]
        ok = w.fresh("ok")
        w.line(f"{ok} = tensor.extract {every}[] : tensor<i1>")
        where = f"{op.origin}: " * (op.origin is not None)
        values = _count(math.prod(x.shape), "value", "values")
        w.line(f"cf.assert {ok}, " + string(f"{where}assert_finite failed: '{label}' has a NaN or "
                                            f"an infinity among its {values}"))
        return [w[x]]


def summary(x: np.ndarray) -> str:
    """A value's type and the min, max and mean of its values that are not NaN, each the
    shortest text that reads back as the same number of its dtype, and its count of NaNs."""
    kind = "f" if is_float(x.dtype) else x.dtype.kind
    nan = np.isnan(x) if kind == "f" else np.zeros(x.shape, bool)
    values = x[~nan]
    text = str(type_of(x))
    if values.size == 0:
        return f"{text} nan={int(nan.sum())}" + (" (empty)" if x.size == 0 else "")
    shown = x.dtype if kind == "f" else np.dtype(np.float32)
    mean = np.mean(values, dtype=np.float64).astype(shown)
    lo, hi = (v.astype(np.int64) if kind == "b" else v for v in (values.min(), values.max()))
    return f"{text} min={str(lo)} max={str(hi)} mean={str(mean)} nan={int(nan.sum())}"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one}"
