"""The checker: an abstract interpreter that types, shapes and statically evaluates a program.

Runtime tensors are known by their types; static values (ints, bools, ADT values, lists) by
their values, which are symbolic or unknown when a generic function is checked and concrete
when an entry point is specialised for given inputs. Static `if`, `switch`, `match`, `fold`
over lists and `bend` are evaluated; where the checker cannot decide, every branch is checked.
Calls are checked per argument signature and remembered, so helpers without annotations are
checked at each distinct use (specialisation), and each only once.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

from frontend import ast, structure
from frontend.collector import without_gc
from frontend.ast import source_text
from frontend.builtins import DTYPE_QUERIES, SPECIAL_FORMS
from frontend.calls import Calls, Frame, Spans
from frontend.control import Statements
from frontend.diagnostics import LIST_BY_MAP, CheckError, DslError, Note, Span, did_you_mean
from frontend.introspection import LimitsV, dtype_limits, tensor_attribute
from frontend.lower import emit_primitive
from frontend.resolve import Entity, ModuleInfo, Program, load_program, qualified
from frontend.unify import Binder
from frontend.values import (UNKNOWN, AdtV, CheckpointV, CtorV, DTypeV, FuncV, LambdaV, ListV,
                             ModuleV, Origin, PrimV, RecordV, SpecialV, StaticV, TensorV, TupleV,
                             TypeV, UnknownV, abstract, describe, literal_shape, param_names,
                             static_binary)
from ir import ops
from ir.core import Builder
from ir.dims import Dim
from ir.ops.base import OpError
from ir.types import DTYPES


class Checker(Calls, Statements):
    """Checks a program; with a Builder it also lowers what it checks to IR (frontend/lower.py).
    Its calls are in frontend/calls.py, its statements in frontend/control.py."""

    def __init__(self, program: Program, builder: Builder | None = None):
        self.program = program
        self.builder = builder
        self.errors: list[DslError] = []
        self.memo: dict = {}
        self.active: set = set()
        self.depth = 0
        self.unrolled = 0           # bodies run at compile time by this check of one function
        self.undecided = 0          # how many branches the checker could not choose it is inside
        self.entered: dict = {}     # a function being checked -> `undecided` at each of its calls
        self.calls: list[tuple[ast.Def, Span]] = []    # the calls being checked, innermost last

    def binder(self) -> Binder:
        return Binder(builder=self.builder)

    @contextmanager
    def emitting(self, builder: Builder | None):
        """Emit into another builder for a while (a function being traced), or into none."""
        outer, self.builder = self.builder, builder
        try:
            yield builder
        finally:
            self.builder = outer

    # ------------------------------------------------------------ entry points

    def check_generic(self, d: ast.Def, mod: ModuleInfo) -> None:
        """Check a fully annotated function for symbolic arguments of its declared types."""
        binder = Binder()
        args = [binder.instantiate(p.type, mod, p.name) for p in d.params]
        self.unrolled = 0
        self.guard(lambda: self.call_def(FuncV(d, mod), args, {}, Spans(d.name_span)))

    def specialise(self, d: ast.Def, mod: ModuleInfo, args: list):
        """The result of calling d on concrete abstract arguments (tensors of concrete shapes)."""
        self.unrolled = 0
        return self.guard(lambda: self.call_def(FuncV(d, mod), args, {}, Spans(d.name_span)))

    def guard(self, thunk):
        try:
            return thunk()
        except DslError as e:
            self.errors.append(e)
            return UNKNOWN

    # ------------------------------------------------------------ expressions

    def eval(self, e: ast.Expr, frame: Frame):
        match e:
            case ast.Int(value=v):
                return StaticV("int", Dim.const(v))
            case ast.Float(value=v):
                return StaticV("float", v)
            case ast.Bool(value=v):
                return StaticV("bool", v)
            case ast.Str(value=v):
                return StaticV("str", v)
            case ast.Name(id=n):
                return self.lookup(n, e.span, frame)
            case ast.QualName():
                return self.qualname(e, frame)
            case ast.BinOp():
                if e.op in ("and", "or"):
                    return self.logical(e, frame)
                if e.op == "/":
                    q = qualified(e, frame.module, frame.env.__contains__)
                    if q is not None:
                        return self.eval(q, frame)
                return self.binary(e.op, self.eval(e.left, frame), self.eval(e.right, frame),
                                   e.op_span, e.left.span, e.right.span)
            case ast.UnaryOp():
                return self.unary(e, self.eval(e.operand, frame))
            case ast.Call():
                return self.call(e, frame)
            case ast.Index():
                return self.index(e, frame)
            case ast.Attr():
                return self.attr(e, self.eval(e.value, frame))
            case ast.RecordLit():
                return self.record(e, frame)
            case ast.RecordUpdate():
                return self.record_update(e, frame)
            case ast.Lambda():
                return LambdaV(e, frame.module, frame.env)
            case ast.ListLit():
                return ListV.of(self.eval(i, frame) for i in e.items)
            case ast.TupleLit():
                return TupleV(tuple(self.eval(i, frame) for i in e.items))
        raise CheckError(e.span, "unsupported expression")

    def lookup(self, name: str, span: Span, frame: Frame):
        if name in frame.env:
            return frame.env[name]
        entity = frame.module.names.get(name)
        if entity is not None:
            return entity_value(entity)
        if name in SPECIAL_FORMS or name in DTYPE_QUERIES:
            return SpecialV(name)
        if name in DTYPES:
            return DTypeV(name)
        if ops.lookup(name):
            return PrimV(name)
        if name == "fork":
            raise CheckError(span, "'fork' is only allowed in the 'when' branch of a bend")
        raise CheckError(span, f"undefined name '{name}'")

    def qualname(self, e: ast.QualName, frame: Frame):
        head, *rest = e.parts
        if head not in frame.env:
            entity = frame.module.names.get(head)
            if entity is not None and entity.kind == "unknown":
                return UNKNOWN                       # its import failed, already reported
            while entity is not None and entity.kind == "module" and rest:
                entity = entity.module.names.get(rest[0])
                rest = rest[1:]
                if entity is None:
                    raise CheckError(e.span, f"undefined name '{'/'.join(e.parts)}'")
            if entity is not None and entity.kind == "type" and len(rest) == 1:
                ctor = next((c for c in entity.node.ctors if c.name == rest[0]), None)
                if ctor is None:
                    raise CheckError(e.span, f"type '{entity.node.name}' has no constructor '{rest[0]}'")
                return CtorV(entity, ctor) if ctor.fields else AdtV(entity.node.name, ctor.name, (), entity)
            if entity is not None and not rest:
                return entity_value(entity)
        value = self.lookup(head, e.span, frame)
        for part in e.parts[1:]:
            value = self.binary("/", value, self.lookup(part, e.span, frame), e.span, e.span, e.span)
        return value

    def logical(self, e: ast.BinOp, frame: Frame):
        a = self.eval(e.left, frame)
        if not (isinstance(a, StaticV) and a.kind == "bool") and not isinstance(a, UnknownV):
            raise CheckError(e.op_span, f"'{e.op}' takes static bools, got {describe(a)}; "
                                        f"for bool tensors use '{'&' if e.op == 'and' else '|'}'")
        if isinstance(a, StaticV) and a.known and a.value == (e.op == "or"):
            return a                 # short-circuit, as in Python
        b = self.eval(e.right, frame)
        if not (isinstance(b, StaticV) and b.kind == "bool") and not isinstance(b, UnknownV):
            raise CheckError(e.op_span, f"'{e.op}' takes static bools, got {describe(b)}; "
                                        f"for bool tensors use '{'&' if e.op == 'and' else '|'}'")
        return b if isinstance(a, StaticV) and a.known else StaticV("bool", None)

    def binary(self, op: str, a, b, op_span: Span, a_span: Span, b_span: Span):
        if isinstance(a, UnknownV) or isinstance(b, UnknownV):
            return UNKNOWN
        if isinstance(a, StaticV) and isinstance(b, StaticV):
            return static_binary(op, a, b, op_span)
        if op == "+" and structure.concatenable(a, b):
            return structure.concatenated(a, b)
        if op not in ops.BINARY_OPERATORS:
            raise CheckError(op_span, f"unknown operator '{op}'")
        for v in (a, b):
            if isinstance(v, ListV) and literal_shape(v) is None:
                raise CheckError(op_span, f"'{op}' needs tensors or numbers, got {describe(v)}; {LIST_BY_MAP}")
        return self.call_primitive(ops.BINARY_OPERATORS[op], [a, b], {}, Spans(op_span, (a_span, b_span)),
                                   at_operator=True)

    def unary(self, e: ast.UnaryOp, v):
        if isinstance(v, UnknownV):
            return UNKNOWN
        if e.op == "not":
            if isinstance(v, StaticV) and v.kind == "bool":
                return StaticV("bool", None if v.value is None else not v.value)
            raise CheckError(e.span, f"'not' takes a static bool, got {describe(v)}; "
                                     "for a bool tensor use 'x ^ True'")
        if e.op == "+":
            return v
        if isinstance(v, StaticV) and v.kind in ("int", "float"):
            return StaticV(v.kind, -v.value if v.value is not None else None)
        return self.call_primitive(ops.UNARY_OPERATORS[e.op], [v], {}, Spans(e.span, (e.operand.span,)),
                                   at_operator=True)

    def call(self, e: ast.Call, frame: Frame):
        f = self.eval(e.func, frame)
        if isinstance(f, SpecialV):
            return self.special(f.name, e, frame)
        args = [self.eval(a, frame) for a in e.args]
        kwargs = {k.name: self.eval(k.value, frame) for k in e.kwargs}
        if len(kwargs) != len(e.kwargs):
            raise CheckError(e.span, "a keyword argument is given twice")
        return self.call_value(f, args, kwargs, Spans(e.span, tuple(a.span for a in e.args),
                                                      e.kwargs))

    def special(self, name: str, e: ast.Call, frame: Frame):
        kw = {k.name: k.value for k in e.kwargs}
        if name in ("grad", "value_and_grad"):
            return self.make_grad(name, [self.eval(a, frame) for a in e.args], kw, e, frame)
        if kw:
            raise CheckError(e.span, f"{name} takes no keyword arguments")
        args = [self.eval(a, frame) for a in e.args]
        if name in DTYPE_QUERIES:
            return UNKNOWN if UNKNOWN in args else dtype_limits(name, args, e.span)
        if name in structure.FUNCTIONS:
            return structure.call(name, args, [a.span for a in e.args], e.span)
        if name == "checkpoint":
            if len(args) != 1 or param_names(args[0]) is None:
                raise CheckError(e.span, "checkpoint takes one function")
            return CheckpointV(args[0])
        if len(args) < 2 or param_names(args[0]) is None:
            raise CheckError(e.span, "map takes a function and one or more records, lists or tuples")
        return self.map_values(args[0], args[1:], Spans(e.span, tuple(a.span for a in e.args)))

    def index(self, e: ast.Index, frame: Frame):
        base = self.eval(e.value, frame)
        if isinstance(base, (ListV, TupleV)):
            if len(e.items) == 1 and isinstance(e.items[0], ast.Slice):
                item = e.items[0]
                bounds = [None if p is None else self.static_int(p, frame, "a slice bound")
                          for p in (item.lo, item.hi, item.step)]
                return structure.sliced(base, *bounds, item.span)
            if len(e.items) != 1 or isinstance(e.items[0], ast.EllipsisIndex):
                raise CheckError(e.span, "a list or tuple is indexed by one static int or a slice")
            i = self.eval(e.items[0], frame)
            if not (isinstance(i, StaticV) and i.kind == "int"):
                raise CheckError(e.items[0].span, f"a list index must be a static int, got {describe(i)}")
            if base.items is None or not i.known:
                return base.elem if isinstance(base, ListV) and base.elem is not None else UNKNOWN
            n, k = len(base.items), i.python
            if not -n <= k < n:
                raise CheckError(e.items[0].span, f"index {k} is out of range for a list of {n}")
            return base.items[k]
        if isinstance(base, UnknownV):
            return UNKNOWN
        if not isinstance(base, TensorV):
            raise CheckError(e.value.span, f"cannot index a value of type {describe(base)}")
        items = []
        for item in e.items:
            if isinstance(item, ast.EllipsisIndex):
                items.append(Ellipsis)
            elif isinstance(item, ast.Slice):
                parts = [None if p is None else self.static_int(p, frame, "a slice bound")
                         for p in (item.lo, item.hi, item.step)]
                items.append(UNKNOWN if UNKNOWN in parts else ops.SliceSpec(*parts))
            else:
                v = self.eval(item, frame)
                if isinstance(v, StaticV) and v.kind == "int":
                    items.append(_static_index(v))
                elif isinstance(v, TensorV) or isinstance(v, UnknownV):
                    items.append(v)
                else:
                    raise CheckError(item.span, f"an index must be an int, a slice or an integer "
                                                f"tensor, got {describe(v)}")
        gathers = [k for k, i in enumerate(items) if isinstance(i, (TensorV, UnknownV))]
        if gathers:
            if len(gathers) > 1 or any(i is Ellipsis or not _full_slice(i) for k, i in enumerate(items)
                                       if k != gathers[0]):
                raise CheckError(e.span, "a tensor index gathers along one axis: write x[idx] or "
                                         "x[:, idx] with ':' for the other axes")
            k = gathers[0]
            return self.call_primitive("take", [base, items[k], StaticV("int", Dim.const(k))], {},
                                       Spans(e.span, (e.value.span, e.items[k].span, e.span)))
        if any(i is UNKNOWN for i in items):
            return UNKNOWN
        try:
            result = ops.REGISTRY["index"].infer(x=base.type, items=tuple(items))
            if self.builder is None:
                return abstract(result)
            return emit_primitive(self.builder, ops.REGISTRY["index"], {"x": base},
                                  {"x": base.type, "items": tuple(items)}, result)
        except OpError as err:
            raise CheckError(e.items[0].span.to(e.items[-1].span) if e.items else e.span, err.message) from None

    def static_int(self, e: ast.Expr, frame: Frame, what: str):
        v = self.eval(e, frame)
        if not (isinstance(v, StaticV) and v.kind == "int"):
            raise CheckError(e.span, f"{what} must be a static int, got {describe(v)}")
        return _static_index(v)

    def attr(self, e: ast.Attr, v):
        if isinstance(v, UnknownV):
            return UNKNOWN
        if isinstance(v, RecordV):
            if v.get(e.name) is None:
                raise CheckError(e.name_span, f"'{v.name}' has no field '{e.name}'"
                                              f"{did_you_mean(e.name, dict(v.fields))}",
                                 [Note(f"{v.name} is declared here", v.decl.node.name_span)])
            field_value = v.get(e.name)
            if isinstance(field_value, TensorV):
                decl = next(f for f in v.decl.node.fields if f.name == e.name)
                return TensorV(field_value.type, Origin(source_text(e), decl.type, decl.span), field_value.ir)
            return field_value
        if isinstance(v, AdtV):
            if v.ctor is None:
                return UNKNOWN
            if dict(v.fields).get(e.name) is None:
                raise CheckError(e.name_span, f"'{v.type_name}/{v.ctor}' has no field '{e.name}'")
            return dict(v.fields)[e.name]
        if isinstance(v, TensorV):
            return tensor_attribute(v, e.name, e.name_span)
        if isinstance(v, LimitsV):
            return v.field(e.name, e.name_span)
        if isinstance(v, ModuleV):
            entity = v.module.names.get(e.name)
            if entity is None:
                raise CheckError(e.name_span, f"module has no '{e.name}'")
            return entity_value(entity)
        raise CheckError(e.name_span, f"a value of type {describe(v)} has no field '{e.name}'")


def entity_value(entity: Entity):
    if entity.kind == "unknown":
        return UNKNOWN
    if entity.kind == "def":
        return FuncV(entity.node, entity.module)
    if entity.kind == "module":
        return ModuleV(entity.module)
    return TypeV(entity)


def _static_index(v: StaticV):
    """An int index or slice bound: an int, a symbolic Dim, or UNKNOWN."""
    return v.python if v.known else UNKNOWN if v.value.is_unknown else v.value


def _full_slice(i) -> bool:
    return isinstance(i, ops.SliceSpec) and i.lo is None and i.hi is None and i.step is None


# ---------------------------------------------------------------- the front end's entry points

def check_program(program: Program) -> Checker:
    """Check every fully annotated function of the main module; raises DslError with all errors."""
    checker = Checker(program)
    for item in program.main.tree.items:
        if isinstance(item, ast.Def) and all(p.type is not None for p in item.params):
            checker.check_generic(item, program.main)
    raise_collected(checker.errors)
    return checker


def check_file(path: str, text: str | None = None) -> Program:
    """Parse, resolve and check a file (docs/language.md §2–§9): the front end of `dslc check`."""
    def run() -> Program:
        program = load_program(path, text)
        check_program(program)
        return program
    return deep(without_gc(run))


def raise_collected(errors: list[DslError]) -> None:
    if not errors:
        return
    unique, seen = [], set()
    for e in errors:
        for d in e.diagnostics:
            key = (d.span.source.path if d.span else "", d.span.start if d.span else -1, d.message)
            if key not in seen:
                seen.add(key)
                unique.append(DslError(d.span, d.message, d.notes))
    raise DslError.collect(unique)


def deep(thunk):
    """Run the front end on a thread with a deep stack: a deeply nested program is then a
    diagnostic, never a crash of the process."""
    result: list = []

    def target():
        saved = sys.getrecursionlimit()
        sys.setrecursionlimit(max(saved, 20000))
        try:
            result.append((True, thunk()))
        except RecursionError:
            result.append((False, CheckError(None, "the program is nested too deeply to check")))
        except BaseException as e:      # re-raised on the calling thread, unchanged
            result.append((False, e))
        finally:
            sys.setrecursionlimit(saved)

    previous = threading.stack_size(512 * 1024 * 1024)
    try:
        worker = threading.Thread(target=target)
        worker.start()
    finally:
        threading.stack_size(previous)
    worker.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value

