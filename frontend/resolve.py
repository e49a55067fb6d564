"""Modules and names: loading a file and its imports, and checking that every name means something.

A module's global names are its definitions and what it imports. Inside a function, a name is
local when the function binds it anywhere (Python's rule); dimension names of its annotations
are static ints in its body. Names are checked lexically here, so that an error in a branch
the checker never takes is still reported.
"""
from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field, replace
from typing import Callable
from pathlib import Path

from frontend import ast
from frontend.ast import source_text
from frontend.builtins import BUILTIN_TYPES, builtin_value_names, is_builtin_value, unsupported_dtype
from frontend.diagnostics import DslError, Note, ResolveError, Source, Span, counted
from frontend.limits import MAX_SOURCE_BYTES
from frontend.parser import MAX_EXCERPT_READ, parse, too_large

STDLIB_DIR = Path(__file__).resolve().parent.parent / "dsl" / "lib"


@dataclass(frozen=True)
class Entity:
    """What a global name denotes: a 'def', 'object', 'type', 'module' (node None), or
    'unknown' (node None): a name whose import failed, already reported."""
    kind: str
    node: ast.Def | ast.ObjectDef | ast.TypeDef | None
    module: ModuleInfo


@dataclass(eq=False)
class ModuleInfo:
    path: str
    source: Source
    tree: ast.Module
    names: dict[str, Entity] = field(default_factory=dict)

    def constructor(self, name: str) -> tuple[ast.TypeDef, ast.Ctor] | None:
        """The one `type` of this module's names that has a constructor called `name`."""
        found = [(e.node, c) for e in self.names.values() if e.kind == "type"
                 for c in e.node.ctors if c.name == name]
        return found[0] if len(found) == 1 else None


@dataclass(eq=False)
class Program:
    main: ModuleInfo
    modules: dict[str, ModuleInfo]


def load_program(path: str, text: str | None = None,
                 parse: Callable[[Source], ast.Module] = parse) -> Program:
    """Parse a file and everything it imports (with `parse`), and resolve every name; raises
    DslError."""
    loader = _Loader(parse)
    if text is None:
        try:
            text = read_source(Path(path))
        except (OSError, UnicodeDecodeError) as e:
            raise ResolveError(None, f"cannot read {path}: {getattr(e, 'strerror', None) or e}")
    main = loader.load(path, text, importer=None)
    for mod in loader.modules.values():
        loader.errors.extend(check_names(mod))
    if loader.errors:
        raise DslError.collect(loader.errors)
    return Program(main, loader.modules)


def read_source(path: Path) -> str:
    """A source file's text; one over MAX_SOURCE_BYTES is a ParseError at its start, found
    before it is read."""
    size = path.stat().st_size
    if size > MAX_SOURCE_BYTES:
        with path.open("rb") as f:
            head = f.read(MAX_EXCERPT_READ).decode("utf-8", "replace")
        raise too_large(str(path), head, size)
    return path.read_text(encoding="utf-8")


def search_path(importer_dir: str) -> list[Path]:
    """Where `from m import …` looks: the importing file's folder, DSL_PATH, the standard library."""
    extra = [Path(p) for p in os.environ.get("DSL_PATH", "").split(os.pathsep) if p]
    return [Path(importer_dir), *extra, STDLIB_DIR]


class _Loader:
    def __init__(self, parse: Callable[[Source], ast.Module]):
        self.parse = parse
        self.modules: dict[str, ModuleInfo] = {}
        self.loading: list[str] = []
        self.errors: list[DslError] = []

    def load(self, path: str, text: str, importer: Span | None) -> ModuleInfo:
        key = os.path.abspath(path)
        if key in self.loading:
            cycle = " -> ".join(Path(p).name for p in self.loading[self.loading.index(key):] + [key])
            raise ResolveError(importer, f"import cycle: {cycle}")
        if key in self.modules:
            return self.modules[key]
        tree = self.parse(Source(path, text))
        mod = ModuleInfo(path, tree.span.source, tree)      # a tree from a cache has its own
        self.loading.append(key)
        try:
            self.declare(mod)
        finally:
            self.loading.pop()
        self.modules[key] = mod
        return mod

    def declare(self, mod: ModuleInfo) -> None:
        seen: dict[str, Span] = {}

        def bind(name: str, entity: Entity, span: Span) -> None:
            if name in seen:
                self.errors.append(ResolveError(span, f"'{name}' is defined twice",
                                                [Note("first defined here", seen[name])]))
                return
            seen[name] = span
            mod.names[name] = entity

        for item in mod.tree.items:
            if isinstance(item, (ast.Def, ast.ObjectDef, ast.TypeDef)):
                kind = {ast.Def: "def", ast.ObjectDef: "object", ast.TypeDef: "type"}[type(item)]
                bind(item.name, Entity(kind, item, mod), item.name_span)
                continue
            try:
                target = self.import_module(item.module, item.module_span, mod)
            except DslError as e:
                self.errors.append(e)
                for name in _imported_names(item):    # known to exist, so no further errors
                    mod.names.setdefault(name, Entity("unknown", None, mod))
                continue
            if isinstance(item, ast.Import):
                bind(item.alias or item.module[-1], Entity("module", None, target), item.span)
                continue
            for imp in item.names:
                entity = target.names.get(imp.name)
                if entity is None:
                    self.errors.append(ResolveError(
                        imp.span, f"module '{'/'.join(item.module)}' has no '{imp.name}'"))
                else:
                    bind(imp.alias or imp.name, entity, imp.span)

    def import_module(self, parts: tuple[str, ...], span: Span, importer: ModuleInfo) -> ModuleInfo:
        rel = Path(*parts).with_suffix(".bend")
        importer_dir = os.path.dirname(os.path.abspath(importer.path))
        for folder in search_path(importer_dir):
            candidate = folder / rel
            try:
                found = candidate.is_file()
            except OSError as e:               # a name too long for the file system
                name = "/".join(parts)
                shown = name if len(name) <= 60 else name[:57] + "…"
                raise ResolveError(span, f"cannot import '{shown}': {e.strerror or e}") from None
            if found:
                try:
                    text = read_source(candidate)
                except (OSError, UnicodeDecodeError) as e:
                    raise ResolveError(span, f"cannot read {candidate}: {e}")
                return self.load(str(candidate), text, importer=span)
        raise ResolveError(span, f"no module named '{'/'.join(parts)}'",
                           [Note(f"searched {', '.join(str(f) for f in search_path(importer_dir))}")])


def undefined_name(name: str, known) -> str:
    """The message for an undefined name: the import that defines it when the standard library
    does (`from nn import softmax`), else the closest of the names `known`, builtin or in the
    standard library."""
    library = stdlib_names()
    if name in library:
        return f"undefined name '{name}'; the standard library defines it: from {library[name]} import {name}"
    close = difflib.get_close_matches(name, set(known) | builtin_value_names() | library.keys(), n=1)
    if not close:
        return f"undefined name '{name}'"
    where = f"? from {library[close[0]]} import {close[0]}" if close[0] in library and close[0] not in known else "?"
    return f"undefined name '{name}' (did you mean '{close[0]}'{where})"


@functools.cache
def stdlib_names() -> dict[str, str]:
    """The top-level names of the standard library's modules, each with its module's name."""
    names: dict[str, str] = {}
    for path in sorted(STDLIB_DIR.glob("*.bend")):
        tree = parse(Source(str(path), path.read_text(encoding="utf-8")))
        for item in tree.items:
            if isinstance(item, (ast.Def, ast.ObjectDef, ast.TypeDef)):
                names.setdefault(item.name, path.stem)
    return names


def _imported_names(item: ast.FromImport | ast.Import) -> list[str]:
    if isinstance(item, ast.Import):
        return [item.alias or item.module[-1]]
    return [n.alias or n.name for n in item.names]


# ---------------------------------------------------------------- Bend's qualified names

def qualified(e: ast.BinOp, mod: ModuleInfo, is_local: Callable[[str], bool]) -> ast.Expr | None:
    """`Act/Relu`, `Tree/Node(l, r)`, `nn/linear(x)`, `Shape/Rect { … }`: a division whose left
    side names a type or module (not shadowed by a local) qualifies the leftmost name of its
    right side. Returns the expression with that name qualified, or None for a division."""
    head = _qualifier(e.left, mod, is_local)
    return None if head is None else _qualify_leftmost(e.right, head, e.left.span)


def _qualifier(x: ast.Expr, mod: ModuleInfo, is_local: Callable[[str], bool]) -> tuple[str, ...] | None:
    if isinstance(x, ast.Name):
        entity = None if is_local(x.id) else mod.names.get(x.id)
        qualifies = ("type", "object", "module", "unknown")      # unknown: a failed import
        return (x.id,) if entity is not None and entity.kind in qualifies else None
    if isinstance(x, ast.BinOp) and x.op == "/" and isinstance(x.right, ast.Name):
        head = _qualifier(x.left, mod, is_local)
        if head is not None and len(head) == 1 and mod.names[head[0]].kind == "module":
            inner = mod.names[head[0]].module.names.get(x.right.id)
            if inner is not None and inner.kind in ("type", "object"):
                return head + (x.right.id,)
    return None


def _qualify_leftmost(x: ast.Expr, head: tuple[str, ...], start: Span) -> ast.Expr | None:
    match x:
        case ast.Name():
            return ast.QualName(head + (x.id,), start.to(x.span))
        case ast.RecordLit():
            return replace(x, type=head + x.type, type_span=start.to(x.type_span), span=start.to(x.span))
        case ast.Call() | ast.Index() | ast.Attr():
            field = "func" if isinstance(x, ast.Call) else "value"
            inner = _qualify_leftmost(getattr(x, field), head, start)
            return None if inner is None else replace(x, **{field: inner, "span": start.to(x.span)})
        case ast.BinOp():
            inner = _qualify_leftmost(x.left, head, start)
            return None if inner is None else replace(x, left=inner, span=start.to(x.span))
    return None


# ---------------------------------------------------------------- lexical name checks

def check_names(mod: ModuleInfo) -> list[DslError]:
    """Every name in the module's definitions refers to something; returns the errors found."""
    checker = _Names(mod)
    for item in mod.tree.items:
        if isinstance(item, ast.ObjectDef):
            checker.record_cycle(item)
    if checker.errors:                       # every later walk of a record's fields would not end
        return checker.errors
    for item in mod.tree.items:
        if isinstance(item, ast.Def):
            checker.function(item, frozenset())
        elif isinstance(item, ast.ObjectDef):
            checker.unique([f.name for f in item.fields], [f.span for f in item.fields], "field")
            for f in item.fields:
                checker.type_expr(f.type, params=frozenset(item.params))
            checker.record_parameters(item)
        elif isinstance(item, ast.TypeDef):
            checker.unique([c.name for c in item.ctors], [c.span for c in item.ctors], "constructor")
            for c in item.ctors:
                checker.unique([f.name for f in c.fields], [f.span for f in c.fields], "field")
                for f in c.fields:
                    if f.type is not None:
                        checker.type_expr(f.type, params=frozenset(item.params) | {item.name})
    return checker.errors


def dim_names(t: ast.TypeExpr | None, mod: ModuleInfo) -> set[str]:
    """The dimension variables an annotation binds, including those of the records it names."""
    if isinstance(t, ast.TensorTypeExpr):
        return set().union(*(_dim_expr_names(d) for d in t.dims))
    if isinstance(t, ast.TupleTypeExpr):
        return set().union(*(dim_names(i, mod) for i in t.items))
    if isinstance(t, ast.NamedType):
        out = set().union(*(dim_names(a, mod) for a in t.args), *(_dim_expr_names(d) for d in t.dims))
        entity = lookup_type(t.name, mod)
        if entity is not None and entity.kind == "object":
            given = set(entity.node.dims) if t.dims else set()      # bare, they are the function's
            out |= record_dim_names(entity) - given
        return out
    return set()


def record_dim_names(entity: Entity) -> set[str]:
    """The dimension names of a record's fields, its dimension parameters included."""
    return set().union(*(dim_names(f.type, entity.module) for f in entity.node.fields))


def _dim_expr_names(e: ast.Expr) -> set[str]:
    return {n.id for n in walk_names(e)}


def lookup_type(name: tuple[str, ...], mod: ModuleInfo) -> Entity | None:
    """The object or type a (possibly module-qualified) type name refers to."""
    entity = mod.names.get(name[0])
    for part in name[1:]:
        if entity is None or entity.kind != "module":
            return None
        entity = entity.module.names.get(part)
    return entity if entity is not None and entity.kind in ("object", "type") else None


def _named_types(t: ast.TypeExpr | None):
    """The named types an annotation mentions, at any depth (`P` and `List(P)` in `List(P)`)."""
    if isinstance(t, ast.TupleTypeExpr):
        for i in t.items:
            yield from _named_types(i)
    elif isinstance(t, ast.NamedType):
        yield t
        for a in t.args:
            yield from _named_types(a)


def _type_names(t: ast.TypeExpr) -> set[str]:
    """The one-part type names an annotation mentions (`P` and `List` in `List(P)`)."""
    if isinstance(t, ast.TupleTypeExpr):
        return set().union(*(_type_names(i) for i in t.items))
    if isinstance(t, ast.NamedType):
        return set(t.name[:1] if len(t.name) == 1 else ()).union(*(_type_names(a) for a in t.args))
    return set()


def walk_names(e: ast.Expr):
    if isinstance(e, ast.Name):
        yield e
    elif isinstance(e, ast.BinOp):
        yield from walk_names(e.left)
        yield from walk_names(e.right)
    elif isinstance(e, ast.UnaryOp):
        yield from walk_names(e.operand)
    elif isinstance(e, ast.QualName):
        yield from (ast.Name(p, e.span) for p in e.parts)


def bound_names(body: tuple[ast.Stmt, ...]) -> set[str]:
    """Names a block binds anywhere (not looking inside local defs or lambdas)."""
    out: set[str] = set()
    for s in body:
        match s:
            case ast.Assign(target=t) | ast.AugAssign(target=t):
                out |= _target_names(t)
            case ast.Use(name=n) | ast.Def(name=n):
                out.add(n)
            case ast.If():
                for b in s.branches:
                    out |= bound_names(b.body)
                out |= bound_names(s.orelse or ())
            case ast.Switch() | ast.Match() | ast.AdtFold():
                out |= {s.bind} - {None}
                out |= {st.name for st in getattr(s, "state", ())}
                for c in s.cases:
                    out |= bound_names(c.body)
            case ast.Fold():
                out |= _target_names(s.var) | {st.name for st in s.state} | bound_names(s.body)
                out |= _target_names(s.result) if s.result else set()
            case ast.Bend():
                out |= {st.name for st in s.state}
                out |= bound_names(s.when_body) | bound_names(s.else_body)
    return out


def _target_names(t: ast.Target) -> set[str]:
    if isinstance(t, ast.NameTarget):
        return {t.name}
    return set().union(*(_target_names(i) for i in t.items))


class _Names:
    def __init__(self, mod: ModuleInfo):
        self.mod = mod
        self.errors: list[DslError] = []

    def error(self, span: Span, message: str, notes=()) -> None:
        self.errors.append(ResolveError(span, message, list(notes)))

    def unique(self, names: list[str], spans: list[Span], what: str) -> None:
        first: dict[str, Span] = {}
        for n, sp in zip(names, spans):
            if n in first:
                self.error(sp, f"duplicate {what} '{n}'", [Note("first here", first[n])])
            first.setdefault(n, sp)

    def function(self, d: ast.Def, outer: frozenset[str]) -> None:
        self.unique([p.name for p in d.params], [p.span for p in d.params], "parameter")
        dims: set[str] = set()
        for p in d.params:
            self.type_expr(p.type)
            dims |= dim_names(p.type, self.mod)
            if p.default is not None:
                self.expr(p.default, outer, in_bend=False)
        self.type_expr(d.ret)      # dimensions only the result names are not known in the body
        for name, span in [(d.name, d.name_span)] + [(p.name, p.span) for p in d.params]:
            if name == "fork":
                self.error(span, "'fork' is a keyword (a bend's recursive call); choose another name")
        if "fork" in bound_names(d.body):
            self.error(d.name_span, f"'{d.name}' assigns to 'fork', a keyword (a bend's recursive "
                                    "call); choose another name")
        scope = outer | {p.name for p in d.params} | dims | bound_names(d.body)
        self.block(d.body, scope, in_bend=False)

    def type_expr(self, t: ast.TypeExpr | None, params: frozenset[str] = frozenset()) -> None:
        if isinstance(t, ast.TensorTypeExpr):
            if msg := unsupported_dtype(t.dtype):
                self.error(t.span, msg)
            elif t.dtype not in BUILTIN_TYPES or t.dtype in ("int", "float", "Key", "List"):
                self.error(t.span, f"unknown dtype '{t.dtype}'")
        elif isinstance(t, ast.TupleTypeExpr):
            for i in t.items:
                self.type_expr(i, params)
        elif isinstance(t, ast.NamedType):
            name = "/".join(t.name)
            if msg := unsupported_dtype(name):
                self.error(t.span, msg)
            elif not (name in BUILTIN_TYPES or name in params or lookup_type(t.name, self.mod)):
                self.error(t.span, f"unknown type '{name}'")
            for a in t.args:
                self.type_expr(a, params)
            if t.dims:
                self.dimension_arguments(t)
            if t.args:
                self.type_arguments(t)

    def type_arguments(self, t: ast.NamedType) -> None:
        """`AdamW(Params)`: a record given as many types as it declares type parameters."""
        entity = lookup_type(t.name, self.mod)
        if entity is None or entity.kind != "object":
            return                                   # List(T), an ADT's, or unknown (reported)
        name, params = "/".join(t.name), entity.node.params
        if len(t.args) != len(params):
            self.error(t.span, f"{name} takes {counted(len(params), 'type argument')}"
                               f"{' (' + ', '.join(params) + ')' if params else ''}, got {len(t.args)}",
                       [Note(f"{name} is declared here", entity.node.name_span)])

    def dimension_arguments(self, t: ast.NamedType) -> None:
        """`Conv1D[D, 3 * D]`: a record declared with as many dimension parameters, given sizes."""
        name = "/".join(t.name)
        entity = lookup_type(t.name, self.mod)
        if entity is None and name not in BUILTIN_TYPES:
            return                                   # unknown, reported
        if entity is None or entity.kind != "object":
            self.error(t.span, f"'{name}' takes no dimension arguments")
        elif not entity.node.dims:
            self.error(t.span, f"'{name}' takes no dimension arguments: its declaration names no "
                               f"dimension parameters (object {t.name[-1]}[I, …] {{ … }})",
                       [Note(f"{name} is declared here", entity.node.name_span)])
        elif len(t.dims) != len(entity.node.dims):
            params = ", ".join(entity.node.dims)
            self.error(t.span, f"{name} takes {counted(len(entity.node.dims), 'dimension argument')} "
                               f"[{params}], got {len(t.dims)}",
                       [Note(f"{name} is declared here", entity.node.name_span)])
        for d in t.dims:
            if (bad := self.not_a_dimension(d)) is not None:
                self.error(bad.span, f"a dimension argument of {name} is a size: an integer or a "
                                     f"dimension name, combined with + - * //; got {source_text(bad)}")

    def not_a_dimension(self, e: ast.Expr) -> ast.Expr | None:
        """The part of a dimension expression that is not one: a float, a call, a type's name."""
        match e:
            case ast.Int():
                return None
            case ast.Name(id=n):
                named = n in BUILTIN_TYPES or lookup_type((n,), self.mod) is not None
                return e if named else None
            case ast.UnaryOp(op="-"):
                return self.not_a_dimension(e.operand)
            case ast.BinOp(op="+" | "-" | "*" | "//"):
                return self.not_a_dimension(e.left) or self.not_a_dimension(e.right)
        return e

    def record_cycle(self, d: ast.ObjectDef) -> None:
        """A record that holds itself, directly or through other records, lists or tuples, has
        no finite value (a recursive structure is a `type`)."""
        def path_back(entity: Entity, seen: set[int]) -> list[str] | None:
            for f in entity.node.fields:
                for t in _named_types(f.type):
                    inner = lookup_type(t.name, entity.module)
                    if inner is None or inner.kind != "object":
                        continue
                    if inner.node is d:
                        return [f.name]
                    if id(inner.node) not in seen:
                        seen.add(id(inner.node))
                        if (rest := path_back(inner, seen)) is not None:
                            return [f.name, *rest]
            return None

        path = path_back(Entity("object", d, self.mod), set())
        if path is not None:
            self.error(d.name_span, f"record {d.name} holds itself (through {d.name}.{'.'.join(path)}), "
                                    "so it has no finite value; a recursive structure is a `type` "
                                    "(an ADT) with `~` fields")

    def record_parameters(self, d: ast.ObjectDef) -> None:
        """An object's type and dimension parameters: distinct, each used by a field, and the
        object capitalised when it has dimensions (`conv[D]` would read as a tensor type)."""
        self.unique(list(d.params), [d.name_span] * len(d.params), "type parameter")
        named = set().union(*(_type_names(f.type) for f in d.fields))
        for p in d.params:
            if p not in named:
                self.error(d.name_span, f"type parameter '{p}' of {d.name} is used by none of its fields")
        if not d.dims:
            return
        self.unique(list(d.dims), [d.name_span] * len(d.dims), "dimension parameter")
        if not d.name[:1].isupper():
            self.error(d.name_span, f"a record with dimension parameters is named with a capital "
                                    f"letter ({d.name[:1].upper()}{d.name[1:]}), since "
                                    f"'{d.name}[…]' reads as a tensor type")
        used = record_dim_names(Entity("object", d, self.mod))
        for p in d.dims:
            if p not in used:
                self.error(d.name_span, f"dimension parameter '{p}' of {d.name} is used by none of its fields")

    def block(self, body: tuple[ast.Stmt, ...], scope: frozenset[str], in_bend: bool) -> None:
        for s in body:
            self.stmt(s, scope, in_bend)

    def stmt(self, s: ast.Stmt, scope: frozenset[str], in_bend: bool) -> None:
        ex = lambda e: self.expr(e, scope, in_bend)
        match s:
            case ast.Assign(value=v) | ast.AugAssign(value=v) | ast.Use(value=v) | ast.ExprStmt(value=v):
                ex(v)
            case ast.Return(value=v):
                if v is not None:
                    ex(v)
            case ast.Assert():
                ex(s.cond)
                if s.message is not None:
                    ex(s.message)
            case ast.If():
                for b in s.branches:
                    ex(b.cond)
                    self.block(b.body, scope, in_bend)
                self.block(s.orelse or (), scope, in_bend)
            case ast.Switch():
                ex(s.subject)
                for c in s.cases:
                    self.block(c.body, scope, in_bend)
            case ast.Match() | ast.AdtFold():
                ex(s.subject)
                for st in getattr(s, "state", ()):
                    ex(st.value)
                for c in s.cases:
                    if c.ctor is not None and len(c.ctor) > 1 and lookup_type(c.ctor[:-1], self.mod) is None:
                        self.error(c.span, f"unknown type '{'/'.join(c.ctor[:-1])}'")
                    self.block(c.body, scope, in_bend)
            case ast.Fold():
                ex(s.iterable)
                for st in s.state:
                    ex(st.value)
                self.block(s.body, scope, in_bend)
            case ast.Bend():
                for st in s.state:
                    ex(st.value)
                ex(s.cond)
                self.block(s.when_body, scope, in_bend=True)
                self.block(s.else_body, scope, in_bend)
            case ast.Def():
                self.function(s, scope)

    def expr(self, e: ast.Expr, scope: frozenset[str], in_bend: bool, as_arg: bool = False) -> None:
        ex = lambda x: self.expr(x, scope, in_bend)
        match e:
            case ast.Name(id=name):
                if name == "fork":
                    if not in_bend and name not in scope:       # a binding of it is reported
                        self.error(e.span, "'fork' is only allowed in the 'when' branch of a bend")
                elif not (name in scope or name in self.mod.names or is_builtin_value(name)):
                    self.error(e.span, undefined_name(name, scope | self.mod.names.keys()))
            case ast.QualName():
                self.qualname(e, scope)
            case ast.BinOp():
                q = qualified(e, self.mod, scope.__contains__) if e.op == "/" else None
                if q is not None:
                    ex(q)
                else:
                    ex(e.left)
                    ex(e.right)
            case ast.UnaryOp():
                ex(e.operand)
            case ast.Call():
                ex(e.func)
                for a in e.args:
                    self.expr(a, scope, in_bend, as_arg=True)
                for k in e.kwargs:
                    if k.name != "wrt":      # wrt names parameters of the differentiated function
                        self.expr(k.value, scope, in_bend, as_arg=True)
            case ast.Index():
                ex(e.value)
                for i in e.items:
                    if isinstance(i, ast.Slice):
                        for part in (i.lo, i.hi, i.step):
                            if part is not None:
                                ex(part)
                    elif not isinstance(i, ast.EllipsisIndex):
                        ex(i)
            case ast.Attr():
                ex(e.value)
            case ast.RecordLit():
                self.record_type(e)
                for f in e.fields:
                    ex(f.value)
            case ast.RecordUpdate():
                ex(e.value)
                for f in e.fields:
                    ex(f.value)
            case ast.Lambda():
                if not as_arg:
                    self.error(e.span, "a lambda can only be passed as an argument to a call")
                self.expr(e.body, scope | set(e.params), in_bend)
            case ast.ListLit() | ast.TupleLit():
                for i in e.items:
                    ex(i)

    def qualname(self, e: ast.QualName, scope: frozenset[str]) -> None:
        head, *rest = e.parts
        if head not in scope:
            entity = self.mod.names.get(head)
            if entity is not None and entity.kind == "unknown":
                return                               # its import failed, already reported
            if entity is not None and entity.kind == "type":
                ctor = rest[0]
                if len(rest) != 1 or all(c.name != ctor for c in entity.node.ctors):
                    self.error(e.span, f"type '{head}' has no constructor '{'/'.join(rest)}'")
                return
            if entity is not None and entity.kind == "module":
                member = rest[0]
                target = entity.module.names.get(member)
                if target is None:
                    self.error(e.span, f"module '{head}' has no '{member}'")
                elif len(rest) > 1 and not (target.kind == "type" and any(c.name == rest[1] for c in target.node.ctors)):
                    self.error(e.span, f"'{head}/{member}' has no '{'/'.join(rest[1:])}'")
                return
        for p in e.parts:     # a chain of divisions
            if not (p in scope or p in self.mod.names or is_builtin_value(p)):
                self.error(e.span, undefined_name(p, scope | self.mod.names.keys()))
                return

    def record_type(self, e: ast.RecordLit) -> None:
        name = "/".join(e.type)
        entity = lookup_type(e.type, self.mod)
        if entity is not None and entity.kind == "object":
            return
        owner = lookup_type(e.type[:-1], self.mod) if len(e.type) > 1 else None
        if owner is not None and owner.kind == "type" and any(c.name == e.type[-1] for c in owner.node.ctors):
            return
        if len(e.type) == 1 and self.mod.constructor(e.type[0]):
            return
        self.error(e.type_span, f"unknown record type or constructor '{name}'")
