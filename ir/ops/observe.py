"""Observing a running program: `debug` prints a summary of a value, `assert_finite` stops the
run when a value holds a NaN or an infinity. Both are effects (ir/ops/base.py): kept though
their result is unused, run in program order on the host, and given the op's origin (where
the source wrote them) by the interpreter, which they print or report."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ir.ops.base import EvalError, Kind, Param, Primitive, is_float, primitive, type_of
from ir.types import TensorType


class Effect(Primitive):
    """x passed on unchanged, once the effect has happened."""
    params = (Param("x", Kind.TENSOR), Param("label", Kind.STR))
    differentiable = False
    effect = True
    host = "it acts on the host when the program reaches it"

    def infer(self, x: TensorType, label: str) -> TensorType:
        return x


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
