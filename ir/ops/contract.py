"""Contractions: `a @ b` (NumPy's matmul) and `einsum`."""
from __future__ import annotations

from typing import Any

import numpy as np

from ir.dims import Dim
from ir.ops.base import (NUMERIC, Kind, OpError, Param, Primitive, broadcast_shapes,
                         common_dtype, merge_dims, np_dtype, primitive, type_of)
from ir.types import TensorType


def _numeric(op: str, operands: list[tuple[str, TensorType]]) -> tuple[str, bool]:
    dtype, weak = common_dtype(op, operands)
    if dtype not in NUMERIC:
        raise OpError(f"'{op}' needs numeric tensors, got {dtype}; use cast()")
    return dtype, weak


@primitive
class MatMul(Primitive):
    """a @ b as NumPy does it: contracts a's last axis with b's second to last, broadcasting
    the leading (batch) axes; a 1-D operand gains an axis (a in front, b behind) that the
    result then drops."""
    name = "matmul"
    params = (Param("a", Kind.TENSOR), Param("b", Kind.TENSOR))

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype, weak = _numeric("@", [("a", a), ("b", b)])
        mismatch = OpError(f"shape mismatch in '@': {a} @ {b}")
        if a.rank == 0 or b.rank == 0:
            raise OpError(f"'@' needs operands of rank 1 or more, got {a} @ {b}")
        sa = (Dim.const(1),) * (a.rank == 1) + a.shape
        sb = b.shape + (Dim.const(1),) * (b.rank == 1)
        if not sa[-1].agrees(sb[-2]):
            raise mismatch
        try:
            batch = broadcast_shapes(a.with_shape(sa[:-2]), b.with_shape(sb[:-2]))
        except OpError:
            raise mismatch from None
        rows = sa[-2:-1] if a.rank > 1 else ()
        cols = sb[-1:] if b.rank > 1 else ()
        return TensorType(dtype, batch + rows + cols, weak)

    def evaluate(self, a: Any, b: Any) -> np.ndarray:
        out = self.infer(type_of(a), type_of(b))
        return np.asarray(np.matmul(a, b), dtype=np_dtype(out.dtype))


def _letters(term: str, spec: str) -> str:
    for c in term:
        if not (c.isascii() and c.isalpha()):
            raise OpError(f"einsum spec '{spec}' has {c!r} where a letter belongs "
                          "(letters a-z and A-Z only; '...' is not supported)", "spec")
    return term


@primitive
class Einsum(Primitive):
    """Sums of products over letter-labelled axes, as NumPy's einsum without '...'.

    With `->` the output letters are given (each once, each from an input); without, they are
    the letters that appear exactly once, in alphabetical order (NumPy's implicit mode).
    A letter repeated within one operand takes its diagonal. Every use of a letter must agree
    in length; there is no broadcasting of length-1 axes."""
    name = surface = "einsum"
    params = (Param("spec", Kind.STR), Param("operands", Kind.TENSOR, variadic=True))

    def infer(self, spec: str, operands: tuple[TensorType, ...]) -> TensorType:
        text = spec.replace(" ", "")
        if text.count("->") > 1:
            raise OpError(f"einsum spec '{spec}' has more than one '->'", "spec")
        lhs, arrow, rhs = text.partition("->")
        terms = [_letters(t, spec) for t in lhs.split(",")]
        if len(terms) != len(operands):
            raise OpError(f"einsum spec '{spec}' names {len(terms)} operands, but "
                          f"{len(operands)} were given", "spec")
        dtype, weak = _numeric("einsum", [("operands", t) for t in operands])
        sizes: dict[str, tuple[Dim, TensorType]] = {}
        for i, (term, t) in enumerate(zip(terms, operands)):
            if len(term) != t.rank:
                raise OpError(f"einsum term '{term}' has {len(term)} letters, but operand {i} is "
                              f"{t} of rank {t.rank}", "operands")
            for c, d in zip(term, t.shape):
                known, where = sizes.setdefault(c, (d, t))
                if not known.agrees(d):
                    raise OpError(f"einsum letter '{c}' is {known} in {where} but {d} in {t}",
                                  "operands")
                sizes[c] = (merge_dims(known, d), where)
        if arrow:
            out = _letters(rhs, spec)
            for c in out:
                if out.count(c) > 1 or c not in sizes:
                    raise OpError(f"einsum output '{out}' must name input letters once each, "
                                  f"but has '{c}'", "spec")
        else:
            out = "".join(sorted(c for c in sizes if lhs.count(c) == 1))
        return TensorType(dtype, tuple(sizes[c][0] for c in out), weak)

    def evaluate(self, spec: str, operands: tuple[Any, ...]) -> np.ndarray:
        out = self.infer(spec, tuple(map(type_of, operands)))
        return np.asarray(np.einsum(spec, *operands), dtype=np_dtype(out.dtype))
