"""Contractions: `a @ b` (NumPy's matmul) and `einsum`; their VJPs are contractions of the
cotangent with the other operands."""
from __future__ import annotations

import math
import string
from typing import Any

import numpy as np

from frontend.diagnostics import counted, given
from ir import numerics
from ir.dims import Dim
from ir.ops.base import (NUMERIC, Kind, OpError, Param, Primitive, Role, broadcast_shapes,
                         common_dtype, is_float, merge_dims, np_dtype, primitive, type_of, unbroadcast)
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
    # (on the CPU an integer @ is the sum it is, a reduction kernel: passes.products_as_sums)
    role = Role.CONTRACTION
    host = "integer products are evaluated by NumPy where no kernel sums integers"
    name = "matmul"
    params = (Param("a", Kind.TENSOR), Param("b", Kind.TENSOR))
    shares_dtype = ("a", "b")

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype, weak = _numeric("@", [("a", a), ("b", b)])
        mismatch = lambda: OpError(f"shape mismatch in '@': {a} @ {b}")
        if a.rank == 0 or b.rank == 0:
            raise OpError(f"'@' needs operands of rank 1 or more, got {a} @ {b}")
        sa = (Dim.const(1),) * (a.rank == 1) + a.shape
        sb = b.shape + (Dim.const(1),) * (b.rank == 1)
        if not sa[-1].agrees(sb[-2]):
            raise mismatch()
        try:
            batch = broadcast_shapes(a.with_shape(sa[:-2]), b.with_shape(sb[:-2]))
        except OpError:
            raise mismatch() from None
        rows = sa[-2:-1] if a.rank > 1 else ()
        cols = sb[-1:] if b.rank > 1 else ()
        return TensorType(dtype, batch + rows + cols, weak)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """As einsum's letters: batch axes, then m k @ k n (a 1-D operand without m or n)."""
        (a, b), out = op.inputs, op.outputs[0]
        m, n = "m" * (len(a.shape) > 1), "n" * (len(b.shape) > 1)
        batch = string.ascii_lowercase[:len(out.shape) - len(m + n)]
        la = batch[len(batch) - max(len(a.shape) - 2, 0):] + m + "k"
        lb = batch[len(batch) - max(len(b.shape) - 2, 0):] + "k" + n
        result = batch + m + n
        return [w.contract([(a, la), (b, lb)], result, out, "matmul")]

    def evaluate(self, a: Any, b: Any) -> np.ndarray:
        """In the canonical order: acc = fma(a[…, i, k], b[…, k, j], acc) for k = 0, 1, …"""
        out = self.infer(type_of(a), type_of(b))
        dtype = np_dtype(out.dtype)
        if not is_float(dtype):
            return np.asarray(np.matmul(a, b), dtype=dtype)
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        lhs = a2[..., :, None, :]                              # [..., M, 1, K]
        rhs = np.swapaxes(b2, -1, -2)[..., None, :, :]         # [..., 1, N, K]
        result = numerics.contract([lhs.astype(dtype), rhs.astype(dtype)], 1)
        if a.ndim == 1:
            result = result[..., 0, :]
        if b.ndim == 1:
            result = result[..., 0]
        return np.asarray(result, dtype=dtype)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """With 1-D operands made matrices: ct @ rhsᵀ and lhsᵀ @ ct, summed over the batch
        axes each operand was broadcast along (a matrix rhs: one product over all the rows)."""
        (lhs, rhs), (ct,) = op.inputs, cts
        a = lhs if len(lhs.shape) > 1 else _reshaped(b, lhs, (1, *lhs.shape))
        c = rhs if len(rhs.shape) > 1 else _reshaped(b, rhs, (*rhs.shape, 1))
        dropped = (len(lhs.shape) == 1) + (len(rhs.shape) == 1)
        g = _reshaped(b, ct, ct.shape[:len(ct.shape) - 2 + dropped] + (a.shape[-2], c.shape[-1]))
        da = unbroadcast(b, b.emit("matmul", g, _swap_last(b, c)), a.shape)
        if len(c.shape) == 2 < len(a.shape):
            # a matrix shared by a batch (x @ W): one product whose k runs over every row of
            # the batch, not a product per batch entry and then their sum
            rows = lambda v: _reshaped(b, v, (math.prod(v.shape[:-1]), v.shape[-1]))
            dc = b.emit("matmul", _swap_last(b, rows(a)), rows(g))
        else:
            dc = unbroadcast(b, b.emit("matmul", _swap_last(b, a), g), c.shape)
        return _reshaped(b, da, lhs.shape), _reshaped(b, dc, rhs.shape)


def _reshaped(b: Any, v: Any, shape: tuple[int, ...]) -> Any:
    return v if v.shape == tuple(shape) else b.emit("reshape", v, shape=tuple(shape))


def _swap_last(b: Any, v: Any) -> Any:
    rank = len(v.shape)
    return b.emit("transpose", v, perm=(*range(rank - 2), rank - 1, rank - 2))


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
    host = "an einsum that is not a matrix product is evaluated by NumPy"
    name = surface = "einsum"
    params = (Param("spec", Kind.STR), Param("operands", Kind.TENSOR, variadic=True))
    shares_dtype = ("operands",)

    def infer(self, spec: str, operands: tuple[TensorType, ...]) -> TensorType:
        text = spec.replace(" ", "")
        if text.count("->") > 1:
            raise OpError(f"einsum spec '{spec}' has more than one '->'", "spec")
        lhs, arrow, rhs = text.partition("->")
        terms = [_letters(t, spec) for t in lhs.split(",")]
        if len(terms) != len(operands):
            raise OpError(f"einsum spec '{spec}' names {counted(len(terms), 'operand')}, but "
                          f"{given(len(operands))}", "spec")
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
            out = _implicit_output(lhs)
        return TensorType(dtype, tuple(sizes[c][0] for c in out), weak)

    def mlir(self, w: Any, op: Any) -> list[str]:
        lhs, arrow, rhs = op.attrs["spec"].replace(" ", "").partition("->")
        terms = lhs.split(",")
        result = rhs if arrow else _implicit_output(lhs)
        return [w.contract(list(zip(op.inputs, terms)), result, op.outputs[0], "einsum")]

    def evaluate(self, spec: str, operands: tuple[Any, ...]) -> np.ndarray:
        """In the canonical order (ir/numerics.py): each output element accumulates over the
        contracted letters, in row-major order of their first appearance."""
        out = self.infer(spec, tuple(map(type_of, operands)))
        dtype = np_dtype(out.dtype)
        if not is_float(dtype):
            return np.asarray(np.einsum(spec, *operands), dtype=dtype)
        lhs, arrow, rhs = spec.replace(" ", "").partition("->")
        terms = lhs.split(",")
        result = rhs if arrow else _implicit_output(lhs)
        contracted = "".join(dict.fromkeys(c for c in lhs if c.isalpha() and c not in result))
        order = result + contracted
        views = []
        for term, x in zip(terms, operands):
            unique = "".join(dict.fromkeys(term))
            if unique != term:                                 # a repeated letter: the diagonal
                x, term = np.einsum(f"{term}->{unique}", x), unique
            present = [c for c in order if c in term]
            x = np.transpose(x, [term.index(c) for c in present])
            views.append(np.reshape(x, [x.shape[present.index(c)] if c in term else 1 for c in order])
                         .astype(dtype))
        return np.asarray(numerics.contract(views, len(contracted)), dtype=dtype)

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        lhs, arrow, rhs = op.attrs["spec"].replace(" ", "").partition("->")
        terms = lhs.split(",")
        out = rhs if arrow else _implicit_output(lhs)
        return tuple(_einsum_transpose(b, cts[0], out, terms, op.inputs, i)
                     for i in range(len(terms)))


def _implicit_output(lhs: str) -> str:
    """The output letters of a spec without '->': those used once, in alphabetical order."""
    return "".join(sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1))


def _einsum_transpose(b: Any, ct: Any, out: str, terms: list[str], operands: tuple,
                      i: int) -> Any:
    """Operand i's cotangent: the einsum of ct (letters `out`) with the other operands.

    A letter repeated in term i (a diagonal) is renamed at each further use and tied to its
    first use by an identity matrix, so the cotangent lands on the diagonal only. A letter of
    term i alone is summed in the forward pass: its cotangent is broadcast along it."""
    sizes = {c: n for term, x in zip(terms, operands) for c, n in zip(term, x.shape)}
    fresh = (c for c in string.ascii_letters if c not in sizes)
    target, ties = "", []
    for c in terms[i]:
        if c in terms[i][:len(target)]:
            renamed = next(fresh)
            ties.append(c + renamed)
            target += renamed
        else:
            target += c
    others = [j for j in range(len(terms)) if j != i]
    present = set(out + "".join(terms[j] for j in others) + "".join(ties))
    found = "".join(c for c in target if c in present)
    eyes = [b.emit("eye", n=sizes[t[0]], dtype=ct.dtype) for t in ties]
    spec = ",".join([out] + [terms[j] for j in others] + ties) + "->" + found
    g = b.emit("einsum", ct, *(operands[j] for j in others), *eyes, spec=spec)
    x = operands[i]
    if found == target:
        return g
    kept = tuple(n if c in present else 1 for c, n in zip(target, x.shape))
    return b.emit("broadcast_to", _reshaped(b, g, kept), shape=x.shape)
