"""The abstract syntax tree: small frozen dataclasses, each carrying its source span.

Every node has `span` as its last field. Sequences are tuples so that nodes are hashable.
Dimension expressions in types are ordinary expressions (`Name`, `Int`, `BinOp`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from frontend.diagnostics import Span


# ---------------------------------------------------------------- expressions

@dataclass(frozen=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True)
class QualName:
    """`a/b/c` written without spaces: a qualified name or a chain of divisions.

    The resolver decides: `Act/Relu` (a type's constructor), `nn/linear` (a module's member),
    or `h/d` (a division, when `h` is neither a type nor a module)."""
    parts: tuple[str, ...]
    span: Span


@dataclass(frozen=True)
class Int:
    value: int
    span: Span


@dataclass(frozen=True)
class Float:
    value: float
    span: Span


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span


@dataclass(frozen=True)
class Str:
    value: str
    span: Span


@dataclass(frozen=True)
class BinOp:
    """`left op right`; op is the operator's text: + - * / % // ** @ == != < <= > >= << >> & | ^ and or."""
    op: str
    left: Expr
    right: Expr
    op_span: Span
    span: Span


@dataclass(frozen=True)
class UnaryOp:
    """`-x` or `not x`."""
    op: str
    operand: Expr
    span: Span


@dataclass(frozen=True)
class Keyword:
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class Call:
    func: Expr
    args: tuple[Expr, ...]
    kwargs: tuple[Keyword, ...]
    span: Span


@dataclass(frozen=True)
class Slice:
    """`lo:hi:step` inside an index; absent parts are None."""
    lo: Expr | None
    hi: Expr | None
    step: Expr | None
    span: Span


@dataclass(frozen=True)
class EllipsisIndex:
    span: Span


@dataclass(frozen=True)
class Index:
    """`value[i, a:b, ...]`."""
    value: Expr
    items: tuple[Expr | Slice | EllipsisIndex, ...]
    span: Span


@dataclass(frozen=True)
class Attr:
    """`value.name`: a record field."""
    value: Expr
    name: str
    name_span: Span
    span: Span


@dataclass(frozen=True)
class FieldInit:
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class RecordLit:
    """`Params { W: w, b: b }` or `Shape/Rect { w: 2, h: 3 }` (type is the written name, parts split on '/')."""
    type: tuple[str, ...]
    fields: tuple[FieldInit, ...]
    type_span: Span
    span: Span


@dataclass(frozen=True)
class RecordUpdate:
    """`p with { mean: m, var: v }`: the record p with the fields given replaced."""
    value: Expr
    fields: tuple[FieldInit, ...]
    span: Span


@dataclass(frozen=True)
class Lambda:
    params: tuple[str, ...]
    body: Expr
    span: Span


@dataclass(frozen=True)
class ListLit:
    """`[a, b, c]`: a static list, or a tensor literal where a tensor is expected."""
    items: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class TupleLit:
    """`(a, b)` or `a, b` where a tuple is allowed (return values, right-hand sides)."""
    items: tuple[Expr, ...]
    span: Span


Expr = (Name | QualName | Int | Float | Bool | Str | BinOp | UnaryOp | Call | Index | Attr
        | RecordLit | Lambda | ListLit | TupleLit | RecordUpdate)


# ---------------------------------------------------------------- types

@dataclass(frozen=True)
class TensorTypeExpr:
    """`f32[B, 4 * C]` or `bool[]`; dims are expressions over dimension variables."""
    dtype: str
    dims: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class NamedType:
    """`int`, `f32` (a scalar), `Key`, `Params`, `Shape/Rect`-style qualified names, `List(Block)`,
    and a record at given dimensions, `Conv1D[D, 3 * D]` (dims: its dimension arguments)."""
    name: tuple[str, ...]
    args: tuple[TypeExpr, ...]
    span: Span
    dims: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class TupleTypeExpr:
    items: tuple[TypeExpr, ...]
    span: Span


TypeExpr = TensorTypeExpr | NamedType | TupleTypeExpr


# ---------------------------------------------------------------- statements

@dataclass(frozen=True)
class NameTarget:
    name: str
    span: Span


@dataclass(frozen=True)
class TupleTarget:
    """`a, b = e` or `(a, (b, c)) = e`."""
    items: tuple[Target, ...]
    span: Span


Target = NameTarget | TupleTarget


@dataclass(frozen=True)
class Assign:
    target: Target
    value: Expr
    span: Span


@dataclass(frozen=True)
class AugAssign:
    """`x += e`; op is the binary operator without '=' (+ - * / @)."""
    target: NameTarget
    op: str
    value: Expr
    op_span: Span
    span: Span


@dataclass(frozen=True)
class Use:
    """Bend's `use x = e`: an inlined alias."""
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class Return:
    value: Expr | None
    span: Span


@dataclass(frozen=True)
class ExprStmt:
    value: Expr
    span: Span


@dataclass(frozen=True)
class IfBranch:
    cond: Expr
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class If:
    """`if c: … elif c: … else: …`; orelse is None without an else."""
    branches: tuple[IfBranch, ...]
    orelse: tuple[Stmt, ...] | None
    span: Span


@dataclass(frozen=True)
class SwitchCase:
    """`case 0:` (value 0) or `case _:` (value None)."""
    value: int | None
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class Switch:
    """`switch n:` or Bend's `switch n = e:` (bind is then 'n')."""
    bind: str | None
    subject: Expr
    cases: tuple[SwitchCase, ...]
    span: Span


@dataclass(frozen=True)
class MatchCase:
    """`case Act/Relu:` (ctor ('Act', 'Relu')), `case Relu:` (('Relu',)) or `case _:` (None)."""
    ctor: tuple[str, ...] | None
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class Match:
    """`match v:` or `match v = e:`."""
    bind: str | None
    subject: Expr
    cases: tuple[MatchCase, ...]
    span: Span


@dataclass(frozen=True)
class StateInit:
    """One `name = e` of a `with` clause or a `bend` header."""
    name: str
    value: Expr
    span: Span


@dataclass(frozen=True)
class Fold:
    """`[target =] fold x in xs with h = e, …: body`: a scan over a tensor's leading axis or a
    static list; `return e` in the body emits one value per step."""
    result: Target | None
    var: Target                     # `x`, or `i, (w, d)` that unpacks each item
    iterable: Expr
    state: tuple[StateInit, ...]
    body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class AdtFold:
    """Bend's recursive fold over a static ADT value: `fold t [= e] [with s = e, …]: case …`;
    inside a case the `~` fields of the subject are already folded."""
    bind: str | None
    subject: Expr
    state: tuple[StateInit, ...]
    cases: tuple[MatchCase, ...]
    span: Span


@dataclass(frozen=True)
class Bend:
    """`bend d = 0, x = x0: when c: … else: …`; `fork(…)` in the `when` branch recurses."""
    state: tuple[StateInit, ...]
    cond: Expr
    when_body: tuple[Stmt, ...]
    else_body: tuple[Stmt, ...]
    span: Span


@dataclass(frozen=True)
class Assert:
    cond: Expr
    message: Expr | None
    span: Span


@dataclass(frozen=True)
class Param:
    name: str
    type: TypeExpr | None
    default: Expr | None
    span: Span


@dataclass(frozen=True)
class Def:
    """A function, at top level or local; doc is the text of a `#{ … #}` comment directly above
    (its common indentation removed)."""
    name: str
    params: tuple[Param, ...]
    ret: TypeExpr | None
    body: tuple[Stmt, ...]
    doc: str | None
    name_span: Span
    span: Span


Stmt = (Assign | AugAssign | Use | Return | ExprStmt | If | Switch | Match | Fold | AdtFold
        | Bend | Assert | Def)


# ---------------------------------------------------------------- top level

@dataclass(frozen=True)
class Field:
    """`name: T`, or `buffer name: T` (buffer True): state that grad and map leave alone."""
    name: str
    type: TypeExpr
    buffer: bool
    span: Span


@dataclass(frozen=True)
class ObjectDef:
    """`object Name(T)[I, O] { field: Type, … }`: params are its type parameters and dims its
    dimension parameters, which each use may give (`Name(Params)[D, 4 * D]`); its other free
    dimension names make it generic too."""
    name: str
    fields: tuple[Field, ...]
    doc: str | None
    name_span: Span
    span: Span
    dims: tuple[str, ...] = ()
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class CtorField:
    """A constructor field: `~left` is recursive; the type is optional."""
    name: str
    type: TypeExpr | None
    recursive: bool
    span: Span


@dataclass(frozen=True)
class Ctor:
    name: str
    fields: tuple[CtorField, ...]
    span: Span


@dataclass(frozen=True)
class TypeDef:
    """`type Name:` (or `type Name(T):`) with one constructor per indented line."""
    name: str
    params: tuple[str, ...]
    ctors: tuple[Ctor, ...]
    doc: str | None
    name_span: Span
    span: Span


@dataclass(frozen=True)
class ImportName:
    name: str
    alias: str | None
    span: Span


@dataclass(frozen=True)
class FromImport:
    """`from nn import linear, relu as r`; module parts split on '/' or '.'."""
    module: tuple[str, ...]
    names: tuple[ImportName, ...]
    module_span: Span
    span: Span


@dataclass(frozen=True)
class Import:
    """`import nn` or `import nn as n`."""
    module: tuple[str, ...]
    alias: str | None
    module_span: Span
    span: Span


Item = Def | ObjectDef | TypeDef | FromImport | Import


@dataclass(frozen=True)
class Module:
    items: tuple[Item, ...]
    span: Span


def names_type_param(t: TypeExpr, decl: TypeDef) -> bool:
    """Whether t is one of decl's type parameters or decl itself."""
    return isinstance(t, NamedType) and len(t.name) == 1 and (t.name[0] in decl.params or t.name[0] == decl.name)


def contains_span(span: Span | None, node) -> bool:
    """Whether span starts inside node's text."""
    return span is not None and span.source is node.span.source and node.span.start <= span.start < node.span.end


def source_text(e) -> str:
    """The text a node was parsed from."""
    return e.span.source.text[e.span.start:e.span.end]


def too_deep(root, limit: int):
    """The first node (in source order) nested more than `limit` levels below root, or None.
    The parts of a node (an if's branches, a call's keywords, a def's parameters) are at its
    level."""
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node
        children = []
        for name in _child_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, tuple):
                children.extend(v for v in value if hasattr(v, "span"))
            elif hasattr(value, "span"):
                children.append(value)
        stack.extend((c, depth + (type(c) not in _PARTS)) for c in reversed(children))
    return None


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    """The fields of a node class that may hold nodes (not its spans, names or values)."""
    found = _CHILD_FIELDS.get(cls)
    if found is None:
        found = _CHILD_FIELDS[cls] = tuple(f.name for f in fields(cls) if not f.name.endswith("span")
                                           and f.type not in ("str", "int", "float", "bool"))
    return found


_PARTS = {IfBranch, SwitchCase, MatchCase, StateInit, Keyword, FieldInit, Param, Field, CtorField,
          Ctor, ImportName, NameTarget, TupleTarget}
