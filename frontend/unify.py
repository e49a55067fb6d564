"""Annotations meet values: dimension variables bound by unification, weak literals given dtypes.

One `Binder` serves one function call (or one record construction): its dimension names form
one namespace, so `x: f32[B, T]` and `y: i32[B]` must agree on B. Constraints that cannot be
solved at once (`T * E` before E is known) wait until the others have bound what they need.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from frontend import ast
from frontend.ast import source_text
from frontend.builtins import unsupported_dtype
from frontend.diagnostics import LIST_BY_MAP, CheckError
from frontend.lower import materialize
from frontend.resolve import ModuleInfo, lookup_type, walk_names
from frontend.values import (UNKNOWN, AdtV, KeyV, ListV, RecordV, StaticV, TensorV, TupleV, literal_shape,
                             UnknownV, describe)
from ir.dims import Dim, solve
from ir.types import DTYPES, FLOAT_DTYPES, TensorType


class Mismatch(Exception):
    """A value does not fit an annotation; the caller says which argument or field: the one
    matched, or `owner` where set: the earlier one whose dimensions the match contradicted."""

    def __init__(self, message: str, owner: str | None = None):
        super().__init__(message)
        self.owner = owner


_DIMS: dict[int, tuple[ast.Expr, Dim]] = {}     # id(node) -> (node, its Dim), bounded below



@dataclass(frozen=True)
class Params:
    """What one use of a record gives its parameters: dimensions (`Conv1D[D, 3 * D]`), and types
    (`AdamW(Params)`: each an annotation with the module and Params it is read in). A dimension
    the use does not give is absent (a name of the function); a type not given is None (any
    value fits it)."""
    dims: Mapping[str, Dim] = field(default_factory=dict)
    types: Mapping[str, tuple[ast.TypeExpr, ModuleInfo, Params] | None] = field(default_factory=dict)

    def type_argument(self, t: ast.TypeExpr) -> tuple[bool, tuple | None]:
        """(whether t names a type parameter, what the use gives it)."""
        if isinstance(t, ast.NamedType) and len(t.name) == 1 and t.name[0] in self.types:
            return True, self.types[t.name[0]]
        return False, None


NO_PARAMS = Params()


def record_params(t: ast.NamedType | None, decl: ast.ObjectDef, mod: ModuleInfo,
                  outer: Params = NO_PARAMS) -> Params:
    """What a use of a record (t, read in mod and outer; None for a record literal) gives its
    parameters; a bare use gives none."""
    dims, args = (t.dims, t.args) if t is not None else ((), ())
    return Params({p: eval_size(d, outer.dims) for p, d in zip(decl.dims, dims)},
                  {p: (args[i], mod, outer) if i < len(args) else None for i, p in enumerate(decl.params)})


def eval_dim(e: ast.Expr, params: Mapping[str, Dim] = NO_PARAMS.dims) -> Dim:
    """A dimension expression of an annotation, over its (unbound) dimension names; `params`
    replaces a record's dimension parameters by the dimensions its use gives."""
    if params and not params.keys().isdisjoint(n.id for n in walk_names(e)):
        return _eval_dim(e, params)
    cached = _DIMS.get(id(e))
    if cached is None or cached[0] is not e:
        if len(_DIMS) > 100_000:
            _DIMS.clear()
        dim = _eval_dim(e)
        if isinstance(e, ast.BinOp):
            dim = dim.spelled(" ".join(e.span.source.text[e.span.start:e.span.end].split()))
        cached = _DIMS[id(e)] = (e, dim)
    return cached[1]


def eval_size(e: ast.Expr, params: Mapping[str, Dim] = NO_PARAMS.dims) -> Dim:
    """eval_dim of a size an annotation declares: one that is a negative number is refused
    where it is written, before any call."""
    dim = eval_dim(e, params)
    if dim.value is not None and dim.value < 0:
        raise CheckError(e.span, f"the size '{source_text(e)}' is {dim.value}: a dimension cannot be negative")
    return dim


def _eval_dim(e: ast.Expr, params: Mapping[str, Dim] = NO_PARAMS.dims) -> Dim:
    match e:
        case ast.Int(value=v):
            return Dim.const(v)
        case ast.Name(id=n):
            return params.get(n, Dim.var(n))
        case ast.UnaryOp(op="-"):
            return -eval_dim(e.operand, params)
        case ast.BinOp(op="+" | "-" | "*" | "//" as op):
            a, b = eval_dim(e.left, params), eval_dim(e.right, params)
            if op == "//" and b.value == 0:
                raise CheckError(e.right.span, "division by zero in a dimension")
            return {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "//": a.__floordiv__}[op](b)
        case ast.QualName(parts=parts):
            out = params.get(parts[0], Dim.var(parts[0]))
            for p in parts[1:]:
                out = out // params.get(p, Dim.var(p))
            return out
    raise CheckError(e.span, "a dimension is an integer or a name, combined with + - * //")


def as_tensor(v) -> TensorType | None:
    """A value where a tensor is expected: tensors, and numbers or number lists as weak literals."""
    if isinstance(v, TensorV):
        return v.type
    if isinstance(v, StaticV) and v.kind == "bool":
        return TensorType("bool", (), weak=False)
    lit = literal_shape(v)
    if lit is None:
        return None
    shape, kind = lit
    return TensorType("f32" if kind == "float" else "i32", tuple(map(Dim.const, shape)), weak=True)


def adopt_dtype(t: TensorType, dtype: str) -> TensorType:
    """A weak literal type taking a tensor's dtype; raises Mismatch when it cannot."""
    if t.dtype == dtype:
        return TensorType(dtype, t.shape)
    if not t.weak:
        raise Mismatch(f"expected {dtype}, got {t.dtype}")
    if dtype == "bool" or t.dtype == "f32" and dtype not in FLOAT_DTYPES:
        raise Mismatch(f"a {'float' if t.dtype == 'f32' else 'number'} literal cannot take the dtype {dtype}")
    return TensorType(dtype, t.shape)


@dataclass
class Binder:
    env: dict[str, Dim] = field(default_factory=dict)
    # (a declared dimension, the actual one, the declared type it is part of, the actual type,
    # the argument or field it comes from)
    pending: list[tuple[Dim, Dim, TensorType, TensorType, str | None]] = field(default_factory=list)
    builder: Any = None        # when lowering: literals given for tensors become constants here

    def match(self, t: ast.TypeExpr, v, mod: ModuleInfo, params: Params = NO_PARAMS,
              owner: str | None = None):
        """v checked against annotation t (dimensions recorded, solved by `finish`); returns v
        with weak literals converted to the declared dtype. `params`: those of the record
        whose field t is; `owner`: the argument or field v is, named by a Mismatch that a later
        match finds in v's dimensions."""
        if isinstance(v, UnknownV):
            return v
        is_param, arg = params.type_argument(t)
        if is_param:
            return v if arg is None else self.match(arg[0], v, arg[1], arg[2], owner)
        match t:
            case ast.TensorTypeExpr():
                return self.tensor(t, t.dtype, t.dims, v, params, owner)
            case ast.TupleTypeExpr():
                if not isinstance(v, TupleV) or len(v.items) != len(t.items):
                    raise Mismatch(f"expected a tuple of {len(t.items)}, got {describe(v)}")
                return TupleV(tuple(self.match(a, b, mod, params, owner) for a, b in zip(t.items, v.items)))
        name = "/".join(t.name)
        if name in DTYPES and name != "bool":
            return self.tensor(t, name, (), v, params, owner)
        if name in ("int", "float", "bool"):
            if isinstance(v, StaticV) and (v.kind == name or name == "float" and v.kind == "int"):
                if name == "float" and v.kind == "int":
                    return StaticV("float", float(v.python) if v.known else None)
                return v
            raise Mismatch(f"expected a static {name}, got {describe(v)}")
        if name == "Key":
            if isinstance(v, KeyV):
                return v
            raise Mismatch(f"expected a Key, got {describe(v)}")
        if name == "List":
            if not isinstance(v, ListV) or len(t.args) != 1:
                stacked = f" (a fold stacks what it emits; {LIST_BY_MAP})" if isinstance(v, (RecordV, TensorV)) else ""
                raise Mismatch(f"expected a List, got {describe(v)}{stacked}")
            if v.items is None:
                return ListV(None, self.match(t.args[0], v.elem, mod, params, owner), v.length)
            return ListV.of(self.match(t.args[0], i, mod, params, owner) for i in v.items)
        entity = lookup_type(t.name, mod)
        if entity is None:
            raise CheckError(t.span, unsupported_dtype(name) or f"unknown type '{name}'")
        if entity.kind == "object":
            if not isinstance(v, RecordV) or v.decl is not entity:
                raise Mismatch(f"expected {name}, got {describe(v)}")
            fields, given = [], record_params(t, entity.node, mod, params)
            for f in entity.node.fields:
                try:
                    fields.append((f.name, self.match(f.type, v.get(f.name), entity.module, given, owner)))
                except Mismatch as m:
                    if m.owner not in (None, owner):    # (another argument's: no path in this one)
                        raise
                    raise Mismatch(f"field '{f.name}' of {name}: {m}", owner) from None
            return RecordV(v.name, tuple(fields), entity)
        if not isinstance(v, AdtV) or v.decl is not entity:
            raise Mismatch(f"expected {name}, got {describe(v)}")
        return v

    def tensor(self, t: ast.TypeExpr, dtype: str, dims: tuple[ast.Expr, ...], v, params: Params,
               owner: str | None):
        if msg := unsupported_dtype(dtype):
            raise CheckError(t.span, msg)
        if dtype not in DTYPES:
            raise CheckError(t.span, f"unknown dtype '{dtype}'")
        got = as_tensor(v)
        declared = TensorType(dtype, tuple(eval_size(d, params.dims) for d in dims))
        if got is None or got.rank != len(dims):
            raise Mismatch(f"expected {self.shown(declared)}, got {describe(v)}")
        try:
            got = adopt_dtype(got, dtype)
        except Mismatch:
            raise Mismatch(f"expected {self.shown(declared)}, got {got}") from None
        for d, actual in zip(declared.shape, got.shape):
            self.pending.append((d, actual, declared, got, owner))
        self.solve()
        if isinstance(v, TensorV):
            return TensorV(got, v.origin, v.ir)
        ir = materialize(self.builder, v, dtype) if self.builder is not None else None
        return TensorV(got, None, ir)

    def bind_static(self, name: str, value: Dim) -> None:
        """A static int parameter: its name is also a dimension of the signature."""
        bound = self.env.setdefault(name, value)
        if not bound.agrees(value):
            raise Mismatch(f"'{name}' is {value} here but the other arguments make it {bound}")

    def solve(self) -> None:
        """Bind what the pending constraints determine; raise Mismatch on a contradiction."""
        progress = True
        while progress:
            progress = False
            for c in list(self.pending):
                declared, actual, whole, got, owner = c
                found = solve(declared, actual, self.env)
                if found is None:
                    continue
                self.pending.remove(c)
                progress = progress or bool(found)
                self.env.update(found)
                size = declared.subst(self.env)
                if size.value is not None and size.value < 0:
                    raise Mismatch(f"{self.shown(whole)} has the size {declared} = {size.value}: "
                                   f"a dimension cannot be negative", owner)
                if not size.agrees(actual):
                    raise Mismatch(f"expected {self.shown(whole)}, got {got}", owner)

    def finish(self) -> None:
        """Give every dimension no constraint could determine an unknown value."""
        for declared, *_ in self.pending:
            for name in declared.free_vars() - self.env.keys():
                self.env[name] = Dim.unknown()
        self.pending.clear()

    def show(self, t: ast.TypeExpr) -> str:
        """An annotation with the dimensions bound so far substituted."""
        if isinstance(t, ast.TensorTypeExpr):
            return self.shown(TensorType(t.dtype, tuple(eval_dim(d) for d in t.dims)))
        if isinstance(t, ast.TupleTypeExpr):
            return "(" + ", ".join(self.show(i) for i in t.items) + ")"
        return source_text(t) if t.dims else "/".join(t.name)

    def shown(self, declared: TensorType) -> str:
        """A declared tensor type with the dimensions bound so far substituted."""
        return str(TensorType(declared.dtype, tuple(d.subst(self.env) for d in declared.shape)))

    def instantiate(self, t: ast.TypeExpr, mod: ModuleInfo, hint: str = "_", params: Params = NO_PARAMS):
        """The abstract value an annotation describes, unbound dimensions left symbolic, and
        unknown where a type parameter is not given."""
        is_param, arg = params.type_argument(t)
        if is_param:
            return UNKNOWN if arg is None else self.instantiate(arg[0], arg[1], hint, arg[2])
        match t:
            case ast.TensorTypeExpr():
                return TensorV(TensorType(t.dtype, tuple(eval_size(d, params.dims).subst(self.env) for d in t.dims)))
            case ast.TupleTypeExpr():
                return TupleV(tuple(self.instantiate(i, mod, f"{hint}[{k}]", params)
                                    for k, i in enumerate(t.items)))
        name = "/".join(t.name)
        if name in DTYPES and name != "bool":
            return TensorV(TensorType(name, ()))
        if name == "int":
            return StaticV("int", self.env.get(hint, Dim.var(hint)))
        if name in ("float", "bool"):
            return StaticV(name, None)
        if name == "Key":
            return KeyV()
        if name == "List" and len(t.args) == 1:
            return ListV(None, self.instantiate(t.args[0], mod, f"{hint}[i]", params), Dim.var(f"len({hint})"))
        entity = lookup_type(t.name, mod)
        if entity is None:
            raise CheckError(t.span, unsupported_dtype(name) or f"unknown type '{name}'")
        if entity.kind == "object":
            given = record_params(t, entity.node, mod, params)
            return RecordV(entity.node.name, tuple(
                (f.name, self.instantiate(f.type, entity.module, f"{hint}.{f.name}", given))
                for f in entity.node.fields), entity)
        return AdtV(entity.node.name, None, (), entity)

