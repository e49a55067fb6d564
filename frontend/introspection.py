"""What a program may ask of a value at compile time: a tensor's `shape`, `ndim` and `dtype`,
and a dtype's limits, `finfo(f32).eps` and `iinfo(i32).max`, with NumPy's values."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from frontend.diagnostics import CheckError, Span, did_you_mean
from frontend.values import DTypeV, StaticV, TensorV, TupleV, describe, static_value
from ir.dims import Dim
from ir.ops.base import np_dtype
from ir.types import FLOAT_DTYPES, INT_DTYPES

TENSOR_ATTRIBUTES = ("shape", "ndim", "dtype")


def tensor_attribute(v: TensorV, name: str, span: Span):
    """x.shape (a tuple of static ints, symbolic where the dimension is), x.ndim, x.dtype."""
    if name == "shape":
        return TupleV(tuple(StaticV("int", d) for d in v.type.shape))
    if name == "ndim":
        return StaticV("int", Dim.const(v.type.rank))
    if name == "dtype":
        return DTypeV(v.type.dtype)
    raise CheckError(span, f"a value of type {v.type} has no field '{name}'"
                           f"{did_you_mean(name, TENSOR_ATTRIBUTES)}; a tensor has shape, ndim and dtype")


@dataclass(frozen=True)
class LimitsV:
    """finfo(dtype) or iinfo(dtype): a static value whose fields are the dtype's limits."""
    query: str
    dtype: str

    def field(self, name: str, span: Span) -> StaticV:
        fields = _limits(self.dtype)
        if name not in fields:
            raise CheckError(span, f"{self.query}({self.dtype}) has no field '{name}'"
                                   f"{did_you_mean(name, fields)}; it has {', '.join(fields)}")
        value = fields[name]
        return static_value("int" if isinstance(value, int) else "float", value)


def dtype_limits(query: str, args: list, span: Span) -> LimitsV:
    """finfo(d) for a float dtype d, iinfo(d) for an integer one."""
    wanted, other, kinds = ((FLOAT_DTYPES, "iinfo", "a float") if query == "finfo" else
                            (INT_DTYPES, "finfo", "an integer"))
    if len(args) != 1 or not isinstance(args[0], DTypeV):
        got = describe(args[0]) if len(args) == 1 else f"{len(args)} arguments"
        raise CheckError(span, f"{query} takes {kinds} dtype ({', '.join(wanted)}), got {got}")
    dtype = args[0].name
    if dtype not in wanted:
        hint = f"; for {dtype} use {other}({dtype})" if dtype != "bool" else ""
        raise CheckError(span, f"{query} takes {kinds} dtype ({', '.join(wanted)}), got {dtype}{hint}")
    return LimitsV(query, dtype)


def _limits(dtype: str) -> dict:
    """finfo's or iinfo's fields for a dslc dtype (bf16's from ml_dtypes, loaded only then)."""
    if dtype in INT_DTYPES:
        info = np.iinfo(np_dtype(dtype))
        return {"min": int(info.min), "max": int(info.max), "bits": int(info.bits)}
    if dtype == "bf16":
        import ml_dtypes                # (NumPy has no bfloat16; ml_dtypes takes 0.7 s to load)
        info = ml_dtypes.finfo(np_dtype(dtype))
    else:
        info = np.finfo(np_dtype(dtype))
    return {"min": float(info.min), "max": float(info.max), "eps": float(info.eps),
            "tiny": float(info.tiny), "bits": int(info.bits)}
