"""The checker: an abstract interpreter that types, shapes and statically evaluates a program.

Runtime tensors are known by their types; static values (ints, bools, ADT values, lists) by
their values, which are symbolic or unknown when a generic function is checked and concrete
when an entry point is specialised for given inputs. Static `if`, `switch`, `match`, `fold`
over lists and `bend` are evaluated; where the checker cannot decide, every branch is checked.
Calls are checked per argument signature and remembered, so helpers without annotations are
checked at each distinct use (specialisation), and each only once.
"""
from __future__ import annotations

import gc
import math
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from frontend import ast
from frontend.builtins import SPECIAL_FORMS
from frontend.diagnostics import CheckError, DslError, Note, ShapeError, Span
from frontend.resolve import (Entity, ModuleInfo, Program, bound_names, load_program, lookup_type,
                              qualified)
from frontend.lower import (LoweringError, close_over, emit_primitive, fresh_params,
                            leaf_values, materialize, rebuild)
from frontend.unify import Binder, Mismatch, as_tensor, eval_dim
from frontend.values import (UNKNOWN, AdtV, CheckpointV, CtorV, DTypeV, ForkV, FuncV, GradV, KeyV,
                             LambdaV, ListV, ModuleV, Origin, PrimV, RecordV, SpecialV, StaticV,
                             TensorV, TupleV, TypeV, UnknownV, describe, signature, type_of)
from ir import ops
from ir.ad import b_scan, grad_function, inline
from ir.core import Builder, Op, Value
from ir.dims import Dim
from ir.ops.base import Kind, OpError, Primitive
from ir.types import (DTYPES, FLOAT_DTYPES, KeyType, ListType, TensorType, TupleType, Type, UnknownType,
                      types_agree)

MAX_DEPTH = 256          # static recursion (switch, bend, recursive helpers) deeper than this is an error


@dataclass(frozen=True)
class Spans:
    """Where a call and each of its arguments are written, for diagnostics about one argument."""
    call: Span
    args: tuple[Span, ...] = ()
    kwargs: tuple[ast.Keyword, ...] = ()

    def arg(self, i: int) -> Span:
        return self.args[i] if i < len(self.args) else self.call

    def kw(self, name: str) -> Span:
        """The whole `name=value` of a keyword argument."""
        return next((k.span for k in self.kwargs if k.name == name), self.call)

    def param(self, names: list[str], name: str) -> Span:
        """The value bound to parameter `name`, by position or keyword."""
        value = next((k.value.span for k in self.kwargs if k.name == name), None)
        if value is not None:
            return value
        return self.arg(names.index(name)) if name in names else self.call


@dataclass(eq=False)
class Frame:
    """One activation: a function body, a fold step or a bend step."""
    env: dict
    module: ModuleInfo
    name: str
    returns: list = field(default_factory=list)      # (value, span) of each `return` reached
    declared: ast.TypeExpr | None = None
    binder: Binder | None = None

    def child(self, **env) -> Frame:
        return Frame({**self.env, **env}, self.module, self.name, [], None, None)


class Checker:
    """Checks a program; with a Builder it also lowers what it checks to IR (frontend/lower.py)."""

    def __init__(self, program: Program, builder: Builder | None = None):
        self.program = program
        self.builder = builder
        self.errors: list[DslError] = []
        self.memo: dict = {}
        self.active: set = set()
        self.depth = 0
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
        self.guard(lambda: self.call_def(FuncV(d, mod), args, {}, Spans(d.name_span)))

    def specialise(self, d: ast.Def, mod: ModuleInfo, args: list):
        """The result of calling d on concrete abstract arguments (tensors of concrete shapes)."""
        return self.guard(lambda: self.call_def(FuncV(d, mod), args, {}, Spans(d.name_span)))

    def guard(self, thunk):
        try:
            return thunk()
        except DslError as e:
            self.errors.append(e)
            return UNKNOWN

    # ------------------------------------------------------------ calls

    def call_value(self, f, args: list, kwargs: dict, spans: Spans):
        """Call any callable value."""
        span = spans.call
        match f:
            case FuncV():
                return self.call_def(f, args, kwargs, spans)
            case LambdaV():
                if kwargs or len(args) != len(f.node.params):
                    raise CheckError(span, f"the lambda takes {len(f.node.params)} arguments but "
                                           f"{len(args)} were given")
                frame = Frame({**f.env, **dict(zip(f.node.params, args))}, f.module, "lambda")
                return self.eval(f.node.body, frame)
            case PrimV():
                return self.call_primitive(f.name, args, kwargs, spans)
            case GradV():
                return self.call_grad(f, args, kwargs, spans)
            case CheckpointV():
                if self.builder is not None:
                    return self.lowered_checkpoint(f, args, kwargs, spans)
                return self.call_value(f.f, args, kwargs, spans)
            case CtorV():
                return self.construct(f.entity, f.ctor, args, kwargs, spans)
            case ForkV():
                if kwargs or len(args) != f.arity:
                    raise CheckError(span, f"fork takes {f.arity} arguments (the bend's state) "
                                           f"but {len(args)} were given")
                return f.run(args, span)
            case UnknownV():
                return UNKNOWN
            case SpecialV():
                raise CheckError(span, f"'{f.name}' must be called directly")
            case TypeV():
                raise CheckError(span, f"'{f.entity.node.name}' is a type: build a record with "
                                       f"{f.entity.node.name} {{ field: value, … }}")
        raise CheckError(span, f"cannot call a value of type {describe(f)}")

    def bind_args(self, names: list[str], defaults: list, args: list, kwargs: dict,
                  spans: Spans, what: str) -> list:
        """Arguments matched to parameter names (defaults filled in by calling their thunks)."""
        if len(args) > len(names):
            raise CheckError(spans.arg(len(names)), f"{what} takes {len(names)} "
                             f"argument{'s' * (len(names) != 1)} but {len(args)} were given")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise CheckError(spans.kw(k), f"{what} has no parameter '{k}'")
            if k in bound:
                raise CheckError(spans.kw(k), f"{what} got two values for '{k}'")
            bound[k] = v
        out = []
        for n, default in zip(names, defaults):
            if n not in bound:
                if default is None:
                    raise CheckError(spans.call, f"{what} is missing the argument '{n}'")
                bound[n] = default()
            out.append(bound[n])
        return out

    def call_def(self, f: FuncV, args: list, kwargs: dict, spans: Spans):
        d, mod, span = f.node, f.module, spans.call
        defaults = [None if p.default is None else
                    (lambda p=p: self.eval(p.default, Frame(dict(f.env or {}), mod, d.name)))
                    for p in d.params]
        values = self.bind_args([p.name for p in d.params], defaults, args, kwargs, spans, f"'{d.name}'")
        key = (id(d), id(f.env), tuple(signature(v) for v in values))
        if key in self.memo:
            return self.memo[key]
        if key in self.active:          # symbolic recursion: the declared result, if any
            return Binder().instantiate(d.ret, mod, "result") if d.ret else UNKNOWN
        if self.depth >= MAX_DEPTH:
            raise CheckError(span, f"static recursion deeper than {MAX_DEPTH} calls of '{d.name}': "
                                   "does its switch or bend reach a base case?")
        self.active.add(key)
        self.depth += 1
        called = span != d.name_span                # not the generic check of d itself
        if called:
            self.calls.append((d, span))
        try:
            result = self.run_def(f, values, spans)
        except DslError as e:
            if not called or not _inside(e.span, d):
                raise
            raise _with_note(e, Note(f"in '{d.name}' called from {span}")) from None
        finally:
            self.active.discard(key)
            self.depth -= 1
            if called:
                self.calls.pop()
        self.memo[key] = result
        return result

    def run_def(self, f: FuncV, values: list, spans: Spans):
        d, mod = f.node, f.module
        names = [p.name for p in d.params]
        binder = self.binder()
        env = dict(f.env or {})
        order = sorted(range(len(d.params)), key=lambda i: not _is_static_int(d.params[i].type))
        for i in order:
            p, v = d.params[i], values[i]
            if p.type is not None:
                try:
                    v = binder.match(p.type, v, mod)
                    if _is_static_int(p.type) and isinstance(v, StaticV):
                        binder.bind_static(p.name, v.value)
                except Mismatch as m:
                    raise ShapeError(spans.param(names, p.name), f"argument '{p.name}' of '{d.name}': {m}",
                                     [Note(f"'{p.name}' is declared here", p.span)]) from None
                if isinstance(v, TensorV):
                    v = TensorV(v.type, Origin(p.name, p.type, p.span), v.ir)
            env[p.name] = v
        binder.finish()
        for name, dim in binder.env.items():
            env.setdefault(name, StaticV("int", dim))
        frame = Frame(env, mod, d.name, [], d.ret, binder)
        self.block(d.body, frame)
        if not frame.returns:
            if d.ret is not None:
                raise CheckError(d.name_span, f"'{d.name}' is declared to return "
                                              f"{binder.show(d.ret)} but has no return")
            return TupleV(())
        return merge_all([v for v, _ in frame.returns])

    def call_primitive(self, name: str, args: list, kwargs: dict, spans: Spans,
                       at_operator: bool = False):
        """A primitive applied to arguments; for an operator every diagnostic points at it."""
        prim = _choose(ops.lookup(name) or [ops.REGISTRY[name]], args)
        span = spans.call
        positional = [p for p in prim.params if not p.variadic]
        names = [p.name for p in positional]
        variadic = next((p for p in prim.params if p.variadic), None)
        if variadic is not None:
            fixed = len([p for p in positional if p.required])
            rest, args = args[fixed:], args[:fixed]
            rest_spans = [spans.arg(i) for i in range(fixed, fixed + len(rest))]
        values = self.bind_args(names, [None if p.required else (lambda p=p: _Default(p.default))
                                        for p in positional], args, kwargs, spans, f"'{name}'")
        where_is = lambda param: span if at_operator else spans.param(names, param)
        prepared: dict = {}
        unknown = False
        for p, v in zip(positional, values):
            where = where_is(p.name)
            param = None if at_operator else p.name
            shown = getattr(prim, "symbol", name) if at_operator else name
            prepared[p.name] = v.value if isinstance(v, _Default) else self.prepare(p.kind, v, where, param, shown)
            unknown |= prepared[p.name] is UNKNOWN
        if variadic is not None:
            prepared[variadic.name] = tuple(self.prepare(variadic.kind, v, s, variadic.name, name)
                                            for v, s in zip(rest, rest_spans))
            unknown |= any(x is UNKNOWN for x in prepared[variadic.name])
        static = self.static_apply(prim, [v for v in values if not isinstance(v, _Default)])
        if static is not None:
            return static
        if unknown:
            return UNKNOWN
        try:
            result = prim.infer(**prepared)
            if self.builder is None:
                return value_of(result)
            raw = {p.name: v for p, v in zip(positional, values)}
            if variadic is not None:
                raw[variadic.name] = tuple(rest)
            return emit_primitive(self.builder, prim, raw, prepared, result)
        except OpError as e:
            where = span if e.arg is None else where_is(e.arg)
            if "shape" in e.message or "broadcast" in e.message:
                notes = [_origin_note(v) for v in args if isinstance(v, TensorV) and v.origin]
                raise ShapeError(where, e.message, notes) from None
            raise CheckError(where, e.message) from None

    def prepare(self, kind: Kind, v, span: Span, param: str, prim: str):
        """An argument in the form a shape rule expects (see ir.ops.base.Kind)."""
        if isinstance(v, UnknownV):
            return UNKNOWN
        bad = lambda: CheckError(span, f"'{param}' of '{prim}' must be {kind.value}, got {describe(v)}"
                                 if param else f"'{prim}' needs tensors or numbers, got {describe(v)}")
        match kind:
            case Kind.TENSOR:
                t = as_tensor(v)
                if t is None:
                    raise bad()
                return t
            case Kind.TENSORS:
                if isinstance(v, ListV) and v.items is None:
                    return UNKNOWN
                if not isinstance(v, (ListV, TupleV)):
                    raise bad()
                items = [as_tensor(i) if not isinstance(i, UnknownV) else UNKNOWN for i in v.items]
                if any(i is None for i in items):
                    raise bad()
                return UNKNOWN if UNKNOWN in items else tuple(items)
            case Kind.KEY:
                if not isinstance(v, KeyV):
                    raise bad()
                return v
            case Kind.DTYPE:
                if not isinstance(v, DTypeV):
                    raise bad()
                return v.name
            case Kind.STR | Kind.BOOL:
                want = "str" if kind is Kind.STR else "bool"
                if not (isinstance(v, StaticV) and v.kind == want):
                    raise bad()
                return v.value if v.known else UNKNOWN
            case Kind.DIM:
                if not (isinstance(v, StaticV) and v.kind == "int"):
                    raise bad()
                return v.value
            case Kind.INT:
                if not (isinstance(v, StaticV) and v.kind == "int"):
                    raise bad()
                return v.python if v.known else UNKNOWN
            case Kind.NUMBER:
                if not (isinstance(v, StaticV) and v.kind in ("int", "float")):
                    raise bad()
                return v.python if v.known else UNKNOWN
            case Kind.STATIC:
                if isinstance(v, StaticV) and v.kind == "int":
                    return v.python if v.known else v.value
                if isinstance(v, (ListV, TupleV)) and v.items is not None and all(
                        isinstance(i, StaticV) and i.kind == "int" for i in v.items):
                    return tuple(i.python if i.known else i.value for i in v.items)
                raise bad()
            case Kind.SHAPE | Kind.INTS | Kind.AXES:
                if kind is Kind.AXES and isinstance(v, StaticV) and v.kind == "int":
                    return v.python if v.known else UNKNOWN
                if kind is Kind.AXES and v is None:
                    return None
                if not isinstance(v, (ListV, TupleV)) or (isinstance(v, ListV) and v.items is None):
                    raise bad()
                if not all(isinstance(i, StaticV) and i.kind == "int" for i in v.items):
                    raise bad()
                if kind is Kind.SHAPE:
                    for i in v.items:
                        if i.known and i.python < -1:
                            raise CheckError(span, f"negative dimension {i.python} in a shape")
                    return tuple(i.value for i in v.items)
                if not all(i.known for i in v.items):
                    return UNKNOWN
                return tuple(i.python for i in v.items)
        return v

    def static_apply(self, prim: Primitive, values: list):
        """An elementwise primitive applied to static numbers is computed now (sqrt(T * E))."""
        reference = getattr(prim, "reference", None)
        if reference is None or not values or not all(
                isinstance(v, StaticV) and v.kind in ("int", "float") for v in values):
            return None
        probe = np.asarray(reference(*[1.0 if v.kind == "float" else 1 for v in values]))
        kind = "bool" if probe.dtype == np.bool_ else "float" if probe.dtype.kind == "f" else "int"
        if not all(v.known for v in values):
            return StaticV(kind, Dim.unknown() if kind == "int" else None)
        with np.errstate(all="ignore"):
            out = np.asarray(reference(*[v.python for v in values])).item()
        return static_value(kind, out)

    # ------------------------------------------------------------ grad, map, constructors

    def make_grad(self, name: str, args: list, kw: dict, call: ast.Call, frame: Frame):
        if len(args) != 1:
            raise CheckError(call.span, f"{name} takes one function (and wrt=, has_aux=)")
        f = args[0]
        params = _param_names(f)
        if params is None:
            raise CheckError(call.args[0].span, f"{name} needs a function, got {describe(f)}")
        for k in call.kwargs:
            if k.name not in ("wrt", "has_aux"):
                raise CheckError(k.span, f"{name} has no parameter '{k.name}'")
        wrt_node = next((k.value for k in call.kwargs if k.name == "wrt"), None)
        if wrt_node is None:
            if not params:
                raise CheckError(call.span, f"{name} needs a function with parameters")
            wrt, as_tuple, wrt_spans = (params[0],), False, (call.args[0].span,)
        else:
            items = wrt_node.items if isinstance(wrt_node, ast.TupleLit) else (wrt_node,)
            if not all(isinstance(i, ast.Name) for i in items):
                raise CheckError(wrt_node.span, "wrt= names a parameter, or a tuple of them")
            for i in items:
                if i.id not in params:
                    raise CheckError(i.span, f"'{i.id}' is not a parameter of the function given to {name}")
            wrt, as_tuple = tuple(i.id for i in items), isinstance(wrt_node, ast.TupleLit)
            wrt_spans = tuple(i.span for i in items)
        has_aux = self.eval(kw["has_aux"], frame) if "has_aux" in kw else StaticV("bool", False)
        if not (isinstance(has_aux, StaticV) and has_aux.kind == "bool" and has_aux.known):
            raise CheckError(kw["has_aux"].span, "has_aux= must be True or False")
        return GradV(f, wrt, wrt_spans, as_tuple, has_aux.value, name == "value_and_grad",
                     call.args[0].span)

    def call_grad(self, g: GradV, args: list, kwargs: dict, spans: Spans):
        params = _param_names(g.f)
        bound = dict(zip(params, args)) | kwargs
        out = self.call_value(g.f, args, kwargs, spans)
        value, aux = out, None
        if g.has_aux and not isinstance(out, UnknownV):
            if not (isinstance(out, TupleV) and len(out.items) == 2):
                raise CheckError(g.f_span, f"with has_aux=True the function must return (loss, aux), "
                                           f"but it returns {describe(out)}")
            value, aux = out.items
        t = type_of(value)
        if not isinstance(t, UnknownType) and not (isinstance(t, TensorType) and t.rank == 0 and t.is_float):
            raise CheckError(g.f_span, f"grad needs a function that returns a scalar float, but this "
                                       f"one returns {t}")
        grads = []
        for name, wrt_span in zip(g.wrt, g.wrt_spans):
            v = bound.get(name, UNKNOWN)
            problem = _not_differentiable(v)
            if problem:
                raise CheckError(wrt_span, f"cannot differentiate with respect to '{name}': {problem}")
            grads.append(_strip_origin(v))
        if self.builder is not None:
            value, aux, grads = self.lowered_grad(g, args, kwargs, spans, value, aux)
        grad = TupleV(tuple(grads)) if g.wrt_tuple else grads[0]
        if g.with_value:
            return TupleV((TupleV((value, aux)) if g.has_aux else value, grad))
        return TupleV((grad, aux)) if g.has_aux else grad

    def map_values(self, f, structs: list, spans: Spans):
        """f applied leaf by leaf over records, tuples and lists of one structure."""
        if any(isinstance(s, UnknownV) or isinstance(s, ListV) and s.items is None for s in structs):
            return UNKNOWN
        first = structs[0]
        for i, s in enumerate(structs[1:], start=2):
            if not _same_structure(first, s):
                raise CheckError(spans.arg(i), f"map over mismatched structures: {describe(first)} "
                                               f"and {describe(s)}")
        if isinstance(first, RecordV):
            fields = tuple((n, self.map_values(f, [s.get(n) for s in structs], spans))
                           for n, _ in first.fields)
            return RecordV(first.name, fields, first.decl)
        if isinstance(first, (TupleV, ListV)):
            items = tuple(self.map_values(f, list(leaves), spans)
                          for leaves in zip(*(s.items for s in structs)))
            return TupleV(items) if isinstance(first, TupleV) else ListV.of(items)
        return self.call_value(f, list(structs), {}, Spans(spans.call))

    def construct(self, entity: Entity, ctor: ast.Ctor, args: list, kwargs: dict, spans: Spans):
        names = [f.name for f in ctor.fields]
        values = self.bind_args(names, [None] * len(names), args, kwargs, spans, f"'{ctor.name}'")
        binder = self.binder()
        fields = []
        for f, v in zip(ctor.fields, values):
            if f.type is not None and not f.recursive and not _names_type_param(f.type, entity.node):
                try:
                    v = binder.match(f.type, v, entity.module)
                except Mismatch as m:
                    raise CheckError(spans.param(names, f.name), f"field '{f.name}' of {ctor.name}: {m}") from None
            fields.append((f.name, v))
        return AdtV(entity.node.name, ctor.name, tuple(fields), entity)

    def record(self, e: ast.RecordLit, frame: Frame):
        entity = lookup_type(e.type, frame.module)
        given = {}
        for f in e.fields:
            if f.name in given:
                raise CheckError(f.span, f"field '{f.name}' is given twice")
            given[f.name] = (self.eval(f.value, frame), f)
        if entity is None or entity.kind != "object":
            owner, ctor = _find_ctor(e.type, frame.module)
            values = {n: v for n, (v, _) in given.items()}
            return self.construct(owner, ctor, [], values, Spans(
                e.type_span, (), tuple(ast.Keyword(n, f.value, f.span) for n, (_, f) in given.items())))
        decl = entity.node
        for name, (_, f) in given.items():
            if all(df.name != name for df in decl.fields):
                raise CheckError(f.span, f"'{decl.name}' has no field '{name}'",
                                 [Note(f"{decl.name} is declared here", decl.name_span)])
        binder = self.binder()
        fields = []
        for df in decl.fields:
            if df.name not in given:
                raise CheckError(e.type_span, f"missing field '{df.name}' in {decl.name} {{ … }}",
                                 [Note(f"{decl.name} is declared here", decl.name_span)])
            v, f = given[df.name]
            try:
                v = binder.match(df.type, v, entity.module)
            except Mismatch as m:
                raise ShapeError(f.value.span, f"field '{df.name}' of {decl.name}: {m}",
                                 [Note(f"'{df.name}' is declared {_text(df.type)} here", df.span)]) from None
            fields.append((df.name, _strip_origin(v)))
        binder.finish()
        return RecordV(decl.name, tuple(fields), entity)

    # ------------------------------------------------------------ statements

    def block(self, body: tuple[ast.Stmt, ...], frame: Frame) -> bool:
        """Run statements; True when every path through them has returned."""
        for s in body:
            try:
                if self.stmt(s, frame):
                    return True
            except DslError as e:
                self.errors.append(self.in_context(e))
                for name in bound_names((s,)):
                    frame.env[name] = UNKNOWN
                if isinstance(s, ast.Assert) or _returns_inside(s):
                    # what follows depended on this statement: stop here rather than report
                    # errors it would have prevented; the function returns something unknown
                    frame.returns.append((UNKNOWN, s.span))
                    return True
        return False

    def in_context(self, e: DslError) -> DslError:
        """An error inside a called function, with notes naming the calls that led to it."""
        for d, span in reversed(self.calls):
            if _inside(e.span, d):
                e = _with_note(e, Note(f"in '{d.name}' called from {span}"))
        return e

    def stmt(self, s: ast.Stmt, frame: Frame) -> bool:
        match s:
            case ast.Assign():
                self.assign(s.target, self.eval(s.value, frame), frame)
            case ast.Use():
                frame.env[s.name] = self.eval(s.value, frame)
            case ast.AugAssign():
                current = self.lookup(s.target.name, s.target.span, frame)
                frame.env[s.target.name] = self.binary(s.op, current, self.eval(s.value, frame),
                                                       s.op_span, s.target.span, s.value.span)
            case ast.ExprStmt():
                self.eval(s.value, frame)
            case ast.Return():
                value = TupleV(()) if s.value is None else self.eval(s.value, frame)
                self.ret(value, s.value.span if s.value is not None else s.span, frame)
                return True
            case ast.Assert():
                cond = self.static_bool(s.cond, frame, "assert")
                if cond is False:
                    message = self.eval(s.message, frame) if s.message is not None else None
                    text = message.value if isinstance(message, StaticV) and message.kind == "str" else None
                    raise CheckError(s.cond.span, "assertion failed" + (f": {text}" if text else ""))
            case ast.If():
                return self.if_(s, frame)
            case ast.Switch():
                return self.switch(s, frame)
            case ast.Match():
                return self.match(s, frame)
            case ast.Fold():
                self.fold(s, frame)
            case ast.AdtFold():
                return self.adt_fold(s, frame)
            case ast.Bend():
                self.bend(s, frame)
            case ast.Def():
                frame.env[s.name] = FuncV(s, frame.module, frame.env)
        return False

    def ret(self, value, span: Span, frame: Frame) -> None:
        if frame.declared is not None:
            try:
                value = frame.binder.match(frame.declared, value, frame.module)
                frame.binder.finish()
            except Mismatch as m:
                raise ShapeError(span, f"'{frame.name}' is declared to return "
                                       f"{frame.binder.show(frame.declared)}: {m}",
                                 [Note("the return type is declared here", frame.declared.span)]) from None
        frame.returns.append((value, span))

    def assign(self, target: ast.Target, value, frame: Frame) -> None:
        if isinstance(target, ast.NameTarget):
            frame.env[target.name] = value
            return
        n = len(target.items)
        if isinstance(value, UnknownV) or isinstance(value, ListV) and value.items is None:
            items = [UNKNOWN if isinstance(value, UnknownV) else value.elem] * n
        elif isinstance(value, (TupleV, ListV)):
            if len(value.items) != n:
                raise CheckError(target.span, f"cannot unpack {len(value.items)} values into {n} names")
            items = value.items
        else:
            raise CheckError(target.span, f"cannot unpack a value of type {describe(value)}")
        for t, v in zip(target.items, items):
            self.assign(t, v, frame)

    def static_bool(self, e: ast.Expr, frame: Frame, what: str) -> bool | None:
        v = self.eval(e, frame)
        if isinstance(v, UnknownV):
            return None
        if not (isinstance(v, StaticV) and v.kind == "bool"):
            hint = "; for tensors use where(c, a, b)" if what == "if" else ""
            raise CheckError(e.span, f"'{what}' needs a static bool, got {describe(v)}{hint}")
        return v.value

    def branches(self, bodies: list, frame: Frame) -> bool:
        """Check several bodies the checker cannot choose between; merge what they assign."""
        ends = []
        for body, extra in bodies:
            f = Frame({**frame.env, **extra}, frame.module, frame.name, frame.returns,
                      frame.declared, frame.binder)
            if not self.block(body, f):
                ends.append(f.env)
        if not ends:
            return True
        merged = {k: merge_all([e.get(k, UNKNOWN) for e in ends]) for k in set().union(*ends)}
        frame.env.clear()
        frame.env.update(merged)
        return False

    def if_(self, s: ast.If, frame: Frame) -> bool:
        candidates = []
        for b in s.branches:
            cond = self.static_bool(b.cond, frame, "if")
            if cond is True and not candidates:
                return self.block(b.body, frame)
            if cond is not False:
                candidates.append((b.body, {}))
                if cond is True:
                    return self.branches(candidates, frame)
        if not candidates:
            return self.block(s.orelse or (), frame)
        return self.branches(candidates + [(s.orelse or (), {})], frame)

    def switch(self, s: ast.Switch, frame: Frame) -> bool:
        numbered = [c for c in s.cases if c.value is not None]
        for i, c in enumerate(numbered):
            if c.value != i:
                raise CheckError(c.span, f"switch cases must count up from 0: expected 'case {i}'")
        if not s.cases or s.cases[-1].value is not None:
            raise CheckError(s.span, "switch needs a 'case _' arm as its last case")
        if any(c.value is None for c in s.cases[:-1]):
            raise CheckError(s.cases[-1].span, "'case _' must be the last case of a switch")
        v = self.eval(s.subject, frame)
        extra = {s.bind: v} if s.bind else {}
        if isinstance(v, UnknownV) or isinstance(v, StaticV) and v.kind == "int" and not v.known:
            return self.branches([(c.body, extra) for c in s.cases], frame)
        if not (isinstance(v, StaticV) and v.kind == "int"):
            raise CheckError(s.subject.span, f"switch needs a static int, got {describe(v)}; "
                                             "for tensors use where(c, a, b)")
        frame.env.update(extra)
        n = v.python
        if n < 0:
            raise CheckError(s.subject.span, f"switch on a negative int ({n})")
        return self.block(s.cases[min(n, len(numbered))].body, frame)

    def adt_subject(self, s, frame: Frame, what: str) -> tuple[AdtV, str | None]:
        v = self.eval(s.subject, frame)
        if isinstance(v, UnknownV):
            return v, s.bind
        if not isinstance(v, AdtV):
            raise CheckError(s.subject.span, f"{what} needs a value of a 'type', got {describe(v)}")
        name = s.bind or (s.subject.id if isinstance(s.subject, ast.Name) else None)
        decl = v.decl.node
        seen = set()
        for c in s.cases:
            if c.ctor is None:
                continue
            if len(c.ctor) > 1 and c.ctor[-2] != decl.name or all(k.name != c.ctor[-1] for k in decl.ctors):
                raise CheckError(c.span, f"'{'/'.join(c.ctor)}' is not a constructor of {decl.name}")
            seen.add(c.ctor[-1])
        missing = [k.name for k in decl.ctors if k.name not in seen]
        if missing and all(c.ctor is not None for c in s.cases):
            raise CheckError(s.span, f"{what} on {decl.name} misses {', '.join(missing)}")
        return v, name

    def match(self, s: ast.Match, frame: Frame) -> bool:
        v, name = self.adt_subject(s, frame, "match")
        if isinstance(v, UnknownV):
            return self.branches([(c.body, {name: UNKNOWN} if name else {}) for c in s.cases], frame)
        if v.ctor is not None:
            case = _case_for(s.cases, v.ctor)
            if name:
                frame.env[name] = v
            return self.block(case.body, frame)
        return self.branches([(c.body, {name: _assume_ctor(v, c)} if name else {}) for c in s.cases], frame)

    def fold(self, s: ast.Fold, frame: Frame) -> None:
        seq = self.eval(s.iterable, frame)
        state = {st.name: self.eval(st.value, frame) for st in s.state}
        if isinstance(seq, ListV) and seq.items is not None:
            emitted = []
            for item in seq.items:
                state, emits = self.fold_step(s, frame, item, state)
                emitted.append(self.one_emit(emits))
            result = self.stack_static(emitted, s) if s.result is not None else None
        elif isinstance(seq, (TensorV, ListV, UnknownV)):
            if isinstance(seq, TensorV) and seq.type.rank == 0:
                raise CheckError(s.iterable.span, f"fold walks a tensor's leading axis, but "
                                                  f"{seq.type} has none")
            if isinstance(seq, TensorV):
                item, n = TensorV(seq.type.with_shape(seq.type.shape[1:])), seq.type.shape[0]
            elif isinstance(seq, ListV):
                item, n = seq.elem, seq.length
            else:
                item, n = UNKNOWN, Dim.unknown()
            with self.emitting(None):
                typed = self.scan_state(s, frame, item, state)
            if self.builder is not None and isinstance(seq, TensorV):
                state, result = self.trace_scan(s, frame, seq, state, typed)
            else:
                state, emits = self.fold_step(s, frame, item, typed)
                emit = self.one_emit(emits)
                result = stack(emit[0], n) if emit is not None else None
        else:
            raise CheckError(s.iterable.span, f"fold walks a tensor's leading axis or a static list; "
                                              f"got {describe(seq)}")
        frame.env.update(state)
        if s.result is not None:
            if result is None:
                raise CheckError(s.span, "this fold emits nothing: add 'return e' to its body")
            self.assign(s.result, result, frame)

    def scan_state(self, s: ast.Fold, frame: Frame, item, state: dict) -> dict:
        """The state of a scan: a weak initial value takes the type the body gives it, and the
        state must then keep its type from step to step."""
        after, _ = self.fold_step(s, frame, item, state)
        fixed = dict(state)
        for name, v in state.items():
            new = after[name]
            if isinstance(v, StaticV) and isinstance(new, TensorV):
                fixed[name] = TensorV(new.type)
            elif isinstance(v, StaticV) and v.kind in ("int", "float") and new != v:
                # a number that changes from step to step is a runtime scalar (a counter)
                fixed[name] = TensorV(TensorType("f32" if v.kind == "float" else "i32", ()))
        after, _ = self.fold_step(s, frame, item, fixed)
        for st in s.state:
            before, new = type_of(fixed[st.name]), type_of(after[st.name])
            if isinstance(fixed[st.name], StaticV) and isinstance(after[st.name], StaticV):
                continue
            if not types_agree(before, new):
                raise ShapeError(_last_assignment(s.body, st.name) or st.span, f"the fold state '{st.name}' changes type in the body: "
                                          f"{before} before a step, {new} after")
        return fixed

    def trace_scan(self, s: ast.Fold, frame: Frame, seq: TensorV, state: dict,
                   typed: dict) -> tuple[dict, object]:
        """Lower a fold over a tensor to one scan op: the body traced once into a function of
        (state, element, captured values) -> (new state, emitted values). `typed` holds the
        state's types (a literal initial state made a tensor of the type the body gives it)."""
        outer = self.builder
        names = list(state)
        init = [self.realize(state[n], like=typed[n]) for n in names]
        body = Builder(f"fold_{s.var}")
        params = [fresh_params(body, v) for v in init]
        x = body.param(seq.ir.type.with_shape(seq.ir.type.shape[1:]))
        with self.emitting(body):
            after, emits = self.fold_step(s, frame, TensorV(x.type, ir=x), dict(zip(names, params)))
            emit = self.one_emit(emits)
            emitted = self.realize(emit[0]) if emit is not None else TupleV(())
            new = [self.realize(after[n], like=v) for n, v in zip(names, init)]
        results = [v for a in new for v in leaf_values(a)] + leaf_values(emitted)
        fn, captured = close_over(body, results)
        inputs = [v for a in init for v in leaf_values(a)]
        outs = b_scan(outer, fn, inputs + [seq.ir] + captured,
                      {"n_state": len(inputs), "n_xs": 1, "length": seq.type.shape[0].value})
        final = [rebuild(v, outs) for v in init]          # consumes the state outputs
        result = rebuild(stack(emitted, seq.type.shape[0]), outs) if emit is not None else None
        return dict(zip(names, final)), result

    def realize(self, v, like=None):
        """v with every static number that stands for a tensor made a constant (lowering);
        `like` gives the tensor type a state must have (a literal 0.0 initial state)."""
        if isinstance(like, TensorV) and not isinstance(v, TensorV):
            c = materialize(self.builder, v, like.type.dtype)
            shape = tuple(d.value for d in like.type.shape)
            if c.shape != shape:
                c = self.builder.emit("broadcast_to", c, shape=shape)
            return TensorV(c.type, ir=c)
        if isinstance(v, TensorV) and v.ir is None:
            raise LoweringError(f"a value of type {v.type} has no IR")
        if isinstance(v, TupleV):
            return TupleV(tuple(self.realize(i) for i in v.items))
        if isinstance(v, StaticV) and v.kind in ("int", "float") and not isinstance(like, StaticV):
            c = materialize(self.builder, v, None)
            return TensorV(c.type, ir=c)
        return v

    def trace(self, f, args: list, kwargs: dict, spans: Spans, name: str):
        """Trace a call of f on fresh parameters of the same structure as the arguments into
        its own function; returns (builder, result, the arguments' IR leaves)."""
        body = Builder(name)
        fresh_args = [fresh_params(body, a) for a in args]
        fresh_kwargs = {k: fresh_params(body, v) for k, v in kwargs.items()}
        with self.emitting(body):
            out = self.call_value(f, fresh_args, fresh_kwargs, spans)
        actual = [v for a in list(args) + list(kwargs.values()) for v in leaf_values(a)]
        return body, out, actual

    def lowered_grad(self, g: GradV, args: list, kwargs: dict, spans: Spans, value, aux):
        """The gradient as IR: f traced to a function, differentiated, inlined here."""
        body, out, actual = self.trace(g.f, args, kwargs, spans, "grad_body")
        if g.has_aux:
            fvalue, faux = out.items
        else:
            fvalue, faux = out, TupleV(())
        with self.emitting(body):
            faux = self.realize(faux)
        aux_leaves = leaf_values(faux)
        fn, captured = close_over(body, [fvalue.ir] + aux_leaves)
        params = _param_names(g.f)
        owners = [name for name, a in zip(params, args) for _ in leaf_values(a)]
        owners += [k for k, a in kwargs.items() for _ in leaf_values(a)]
        wrt = [i for i, (o, p) in enumerate(zip(owners, fn.params)) if o in g.wrt and p.dtype in FLOAT_DTYPES]
        gfn = grad_function(fn, wrt, with_value=True)
        outs = inline(self.builder, gfn, actual + captured)
        value_out = TensorV(outs[0].type, ir=outs[0])
        aux_out = rebuild(faux, outs[1:1 + len(aux_leaves)])
        grads = list(outs[1 + len(aux_leaves):])
        bound = dict(zip(params, args)) | kwargs
        result = []
        for name in g.wrt:
            leaves = []
            for leaf in leaf_values(bound[name]):
                leaves.append(grads.pop(0) if leaf.dtype in FLOAT_DTYPES else
                              self.builder.emit("zeros", shape=leaf.shape, dtype=leaf.dtype))
            result.append(rebuild(_strip_origin(bound[name]), leaves))
        return value_out, aux_out, result

    def lowered_checkpoint(self, c: CheckpointV, args: list, kwargs: dict, spans: Spans):
        """A checkpointed call: one op whose body the backward pass recomputes."""
        body, out, actual = self.trace(c.f, args, kwargs, spans, "checkpoint_body")
        with self.emitting(body):
            out = self.realize(out)
        fn, captured = close_over(body, leaf_values(out))
        outputs = tuple(Value(v.type) for v in fn.results)
        self.builder.add(Op("checkpoint", tuple(actual + captured), (), outputs, fn))
        return rebuild(out, list(outputs))

    def fold_step(self, s: ast.Fold, frame: Frame, item, state: dict) -> tuple[dict, list]:
        step = frame.child(**{s.var: item}, **state)
        self.block(s.body, step)
        return {k: step.env.get(k, UNKNOWN) for k in state}, step.returns

    def one_emit(self, emits: list) -> tuple | None:
        """The value one step emits (and where), all its returns agreeing in type."""
        if not emits:
            return None
        first, _ = emits[0]
        for v, span in emits[1:]:
            if not types_agree(type_of(first), type_of(v)):
                raise ShapeError(span, f"this fold step emits {describe(v)} but another return "
                                       f"emits {describe(first)}")
        return merge_all([v for v, _ in emits]), emits[0][1]

    def stack_static(self, emitted: list, s: ast.Fold):
        if any(e is None for e in emitted):
            raise CheckError(s.span, "every step of this fold must emit a value with 'return'")
        values = [v for v, _ in emitted]
        if values and all(isinstance(v, StaticV) for v in values):
            return ListV.of(values)
        for v, span in emitted[1:]:
            if not types_agree(type_of(v), type_of(values[0])):
                raise ShapeError(span, f"fold steps emit different types: {describe(values[0])} "
                                       f"and then {describe(v)}")
        if not values:
            return UNKNOWN
        if self.builder is None:
            return stack(values[0], Dim.const(len(values)))
        return self.stacked([self.realize(v) for v in values])

    def stacked(self, values: list):
        """Emitted values of an unrolled fold, stacked along a new leading axis (lowering)."""
        first = values[0]
        if isinstance(first, TensorV):
            out = self.builder.emit("stack", *[v.ir for v in values], axis=0)
            return TensorV(out.type, ir=out)
        if isinstance(first, TupleV):
            return TupleV(tuple(self.stacked([v.items[i] for v in values]) for i in range(len(first.items))))
        if isinstance(first, RecordV):
            return RecordV(first.name, tuple((n, self.stacked([v.get(n) for v in values]))
                                             for n, _ in first.fields), first.decl)
        raise LoweringError(f"cannot stack values of type {describe(first)}")

    def adt_fold(self, s: ast.AdtFold, frame: Frame) -> bool:
        v, name = self.adt_subject(s, frame, "fold")
        state = {st.name: self.eval(st.value, frame) for st in s.state}

        def fold_value(value) -> object:
            if not isinstance(value, AdtV) or value.ctor is None:
                outs = [run_case(c, _assume_ctor(value, c) if isinstance(value, AdtV) else UNKNOWN)
                        for c in s.cases]
                return merge_all(outs)
            ctor = next(k for k in value.decl.node.ctors if k.name == value.ctor)
            recursive = {f.name for f in ctor.fields if f.recursive}
            fields = tuple((n, fold_value(fv) if n in recursive else fv) for n, fv in value.fields)
            return run_case(_case_for(s.cases, value.ctor), AdtV(value.type_name, value.ctor, fields, value.decl))

        def run_case(case: ast.MatchCase, value) -> object:
            step = frame.child(**state, **({name: value} if name else {}))
            self.block(case.body, step)
            if not step.returns:
                raise CheckError(case.span, "each case of a fold must return its result")
            return merge_all([r for r, _ in step.returns])

        if isinstance(v, UnknownV):
            return self.branches([(c.body, {name: UNKNOWN} if name else {}) for c in s.cases], frame)
        self.ret(fold_value(v), s.subject.span, frame)
        return True

    def bend(self, s: ast.Bend, frame: Frame) -> None:
        result = _bend_result(s)
        names = [st.name for st in s.state]

        def run(values: list, span: Span):
            key = ("bend", id(s), id(frame), tuple(signature(v) for v in values))
            if key in self.active:
                return UNKNOWN
            if self.depth >= MAX_DEPTH:
                raise CheckError(span, f"bend recursion deeper than {MAX_DEPTH}: does its 'when' "
                                       "condition become false?")
            self.active.add(key)
            self.depth += 1
            try:
                step = frame.child(**dict(zip(names, values)), fork=ForkV(run, len(names)))
                cond = self.static_bool(s.cond, step, "when")
                bodies = [b for b, ok in ((s.when_body, cond is not False), (s.else_body, cond is not True)) if ok]
                outs = []
                for body in bodies:
                    f = Frame(dict(step.env), step.module, step.name)
                    self.block(body, f)
                    if f.returns:
                        raise CheckError(f.returns[0][1], "'return' inside a bend: assign the "
                                                          f"result to '{result}' instead")
                    outs.append(f.env.get(result, UNKNOWN))
                return merge_all(outs)
            finally:
                self.active.discard(key)
                self.depth -= 1

        frame.env[result] = run([self.eval(st.value, frame) for st in s.state], s.span)

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
        if name in SPECIAL_FORMS:
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
        if op not in ops.BINARY_OPERATORS:
            raise CheckError(op_span, f"unknown operator '{op}'")
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
        if name == "checkpoint":
            if len(args) != 1 or _param_names(args[0]) is None:
                raise CheckError(e.span, "checkpoint takes one function")
            return CheckpointV(args[0])
        if len(args) < 2 or _param_names(args[0]) is None:
            raise CheckError(e.span, "map takes a function and one or more records, lists or tuples")
        return self.map_values(args[0], args[1:], Spans(e.span, tuple(a.span for a in e.args)))

    def index(self, e: ast.Index, frame: Frame):
        base = self.eval(e.value, frame)
        if isinstance(base, (ListV, TupleV)):
            if len(e.items) != 1 or isinstance(e.items[0], (ast.Slice, ast.EllipsisIndex)):
                raise CheckError(e.span, "a list or tuple is indexed by one static int")
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
                return value_of(result)
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
                raise CheckError(e.name_span, f"'{v.name}' has no field '{e.name}'",
                                 [Note(f"{v.name} is declared here", v.decl.node.name_span)])
            field_value = v.get(e.name)
            if isinstance(field_value, TensorV):
                decl = next(f for f in v.decl.node.fields if f.name == e.name)
                return TensorV(field_value.type, Origin(_source(e), decl.type, decl.span), field_value.ir)
            return field_value
        if isinstance(v, AdtV):
            if v.ctor is None:
                return UNKNOWN
            if dict(v.fields).get(e.name) is None:
                raise CheckError(e.name_span, f"'{v.type_name}/{v.ctor}' has no field '{e.name}'")
            return dict(v.fields)[e.name]
        if isinstance(v, ModuleV):
            entity = v.module.names.get(e.name)
            if entity is None:
                raise CheckError(e.name_span, f"module has no '{e.name}'")
            return entity_value(entity)
        raise CheckError(e.name_span, f"a value of type {describe(v)} has no field '{e.name}'")


# ---------------------------------------------------------------- helpers

@dataclass(frozen=True)
class _Default:
    """A primitive's default argument: already in the form its shape rule expects."""
    value: object


def entity_value(entity: Entity):
    if entity.kind == "unknown":
        return UNKNOWN
    if entity.kind == "def":
        return FuncV(entity.node, entity.module)
    if entity.kind == "module":
        return ModuleV(entity.module)
    return TypeV(entity)


def value_of(t: Type):
    """The abstract value a shape rule's result type describes."""
    match t:
        case TensorType():
            return TensorV(t)
        case KeyType():
            return KeyV()
        case TupleType():
            return TupleV(tuple(value_of(i) for i in t.items))
        case ListType():
            n = t.length.value
            elem = value_of(t.elem)
            return ListV.of([elem] * n) if n is not None else ListV(None, elem, t.length)
    return UNKNOWN


def static_value(kind: str, x) -> StaticV:
    if kind == "int":
        return StaticV("int", Dim.const(int(x)))
    if kind == "float":
        return StaticV("float", float(x))
    return StaticV("bool", bool(x))


def static_binary(op: str, a: StaticV, b: StaticV, span: Span) -> StaticV:
    """Arithmetic on static values, as Python does it; ints may be symbolic dimensions."""
    if a.kind == "str" or b.kind == "str":
        if op == "+" and a.kind == b.kind == "str":
            return StaticV("str", a.value + b.value)
        if op in ("==", "!=") and a.kind == b.kind:
            return StaticV("bool", (a.value == b.value) == (op == "=="))
        raise CheckError(span, f"'{op}' does not apply to {a.kind} and {b.kind}")
    if a.kind == b.kind == "int" and op in ("+", "-", "*", "//") and not (a.known and b.known):
        if op == "//" and b.known and b.python == 0:
            raise CheckError(span, "division by zero in a static expression")
        return StaticV("int", {"+": a.value.__add__, "-": a.value.__sub__, "*": a.value.__mul__,
                               "//": a.value.__floordiv__}[op](b.value))
    if op in ("==", "!=") and a.kind == b.kind == "int" and a.value == b.value and not a.value.is_unknown:
        return StaticV("bool", op == "==")
    kind = _result_kind(op, a.kind, b.kind, span)
    if not (a.known and b.known):
        return StaticV(kind, Dim.unknown() if kind == "int" else None)
    x, y = a.python, b.python
    if op == "**" and kind == "int" and y < 0:
        kind = "float"                          # 2 ** -1 is 0.5, as in Python
    try:
        out = _PY_OPS[op](x, y)
    except ZeroDivisionError:
        raise CheckError(span, "division by zero in a static expression") from None
    except (OverflowError, ValueError) as err:
        raise CheckError(span, f"static arithmetic failed: {err}") from None
    if isinstance(out, complex) or isinstance(out, float) and not math.isfinite(out) and kind == "int":
        raise CheckError(span, "static arithmetic has no real result")
    if kind == "int" and isinstance(out, int) and abs(out) > 2 ** 62:
        raise CheckError(span, "static int overflows")
    return static_value(kind, out)


_PY_OPS = {
    "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
    "/": lambda x, y: x / y, "//": lambda x, y: x // y, "%": lambda x, y: x % y,
    "**": lambda x, y: _power(x, y), "==": lambda x, y: x == y, "!=": lambda x, y: x != y,
    "<": lambda x, y: x < y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y,
    ">=": lambda x, y: x >= y, "&": lambda x, y: x & y, "|": lambda x, y: x | y,
    "^": lambda x, y: x ^ y, "<<": lambda x, y: x << y, ">>": lambda x, y: x >> y,
}


def _power(x, y):
    if isinstance(x, int) and isinstance(y, int) and abs(y) > 4096:
        raise OverflowError("exponent too large")
    return x ** y


def _result_kind(op: str, ka: str, kb: str, span: Span) -> str:
    if op in ("==", "!=", "<", "<=", ">", ">="):
        if (ka == "bool") != (kb == "bool") and op not in ("==", "!="):
            raise CheckError(span, f"cannot compare {ka} with {kb}")
        return "bool"
    if op in ("&", "|", "^"):
        if ka == kb and ka in ("bool", "int"):
            return ka
        raise CheckError(span, f"'{op}' needs two bools or two ints, got {ka} and {kb}")
    if "bool" in (ka, kb):
        raise CheckError(span, f"'{op}' does not apply to a bool")
    if op in ("<<", ">>"):
        if ka == kb == "int":
            return "int"
        raise CheckError(span, f"'{op}' needs ints")
    if op == "@":
        raise CheckError(span, "'@' needs tensors, got static numbers")
    if op == "/":
        return "float"
    return "int" if ka == kb == "int" else "float"


def merge(a, b):
    """What is known of a value that is either a or b."""
    if a == b:
        return a
    match a, b:
        case TensorV(), TensorV() if types_agree(a.type, b.type):
            return TensorV(a.type)
        case StaticV(), StaticV() if a.kind == b.kind:
            return StaticV(a.kind, Dim.unknown() if a.kind == "int" else None)
        case TupleV(), TupleV() if len(a.items) == len(b.items):
            return TupleV(tuple(map(merge, a.items, b.items)))
        case RecordV(), RecordV() if a.name == b.name:
            return RecordV(a.name, tuple((n, merge(x, y)) for (n, x), (_, y) in zip(a.fields, b.fields)), a.decl)
        case AdtV(), AdtV() if a.type_name == b.type_name:
            return AdtV(a.type_name, None, (), a.decl)
    return UNKNOWN


def merge_all(values: list):
    out = values[0] if values else UNKNOWN
    for v in values[1:]:
        out = merge(out, v)
    return out


def stack(v, n: Dim):
    """The type of n emitted values stacked along a new leading axis."""
    match v:
        case TensorV():
            return TensorV(v.type.with_shape((n, *v.type.shape)))
        case StaticV() if v.kind in ("int", "float"):
            return TensorV(TensorType("f32" if v.kind == "float" else "i32", (n,)))
        case TupleV():
            return TupleV(tuple(stack(i, n) for i in v.items))
        case RecordV():
            return RecordV(v.name, tuple((k, stack(f, n)) for k, f in v.fields), v.decl)
    return UNKNOWN


def _choose(cands: list[Primitive], args: list) -> Primitive:
    """Among primitives sharing a name (split of a key or of a tensor), the one the first argument fits."""
    if len(cands) > 1 and args:
        for p in cands:
            if p.params and (p.params[0].kind is Kind.KEY) == isinstance(args[0], KeyV):
                return p
    return cands[0]


def _param_names(f) -> list[str] | None:
    match f:
        case FuncV():
            return [p.name for p in f.node.params]
        case LambdaV():
            return list(f.node.params)
        case CheckpointV():
            return _param_names(f.f)
        case GradV():
            return _param_names(f.f)
        case PrimV() | CtorV():
            return []
    return None


def _not_differentiable(v) -> str | None:
    match v:
        case TensorV() if not v.type.is_float:
            return f"it is {v.type}: integer and boolean inputs have no gradient"
        case StaticV():
            return f"it is a static {v.kind}: only runtime tensors have gradients"
        case KeyV():
            return "it is a random key"
    return None


def _strip_origin(v):
    return TensorV(v.type, None, v.ir) if isinstance(v, TensorV) else v


def _is_static_int(t: ast.TypeExpr | None) -> bool:
    return isinstance(t, ast.NamedType) and t.name == ("int",)


def _names_type_param(t: ast.TypeExpr, decl: ast.TypeDef) -> bool:
    return isinstance(t, ast.NamedType) and len(t.name) == 1 and (t.name[0] in decl.params or t.name[0] == decl.name)


def _last_assignment(body: tuple[ast.Stmt, ...], name: str) -> Span | None:
    """The last statement of a block that assigns `name` directly."""
    spans = [s.span for s in body if isinstance(s, (ast.Assign, ast.AugAssign, ast.Use))
             and name in bound_names((s,))]
    return spans[-1] if spans else None


def _returns_inside(s: ast.Stmt) -> bool:
    """Whether a statement may return from the function (a return in it, not in a local def)."""
    match s:
        case ast.Return() | ast.AdtFold():
            return True
        case ast.If():
            bodies = [b.body for b in s.branches] + [s.orelse or ()]
        case ast.Switch() | ast.Match():
            bodies = [c.body for c in s.cases]
        case _:
            return False
    return any(_returns_inside(x) for body in bodies for x in body)


def _same_structure(a, b) -> bool:
    if isinstance(a, RecordV):
        return isinstance(b, RecordV) and a.name == b.name
    if isinstance(a, (TupleV, ListV)):
        return type(b) is type(a) and b.items is not None and len(a.items) == len(b.items)
    return not isinstance(b, (RecordV, TupleV, ListV))


def _static_index(v: StaticV):
    """An int index or slice bound: an int, a symbolic Dim, or UNKNOWN."""
    return v.python if v.known else UNKNOWN if v.value.is_unknown else v.value


def _full_slice(i) -> bool:
    return isinstance(i, ops.SliceSpec) and i.lo is None and i.hi is None and i.step is None


def _case_for(cases, ctor: str) -> ast.MatchCase:
    return next(c for c in cases if c.ctor is None or c.ctor[-1] == ctor)


def _assume_ctor(v: AdtV, case: ast.MatchCase):
    """Inside `case Ctor:` of an unknown value: a value of that constructor with unknown fields."""
    if case.ctor is None:
        return v
    ctor = next((k for k in v.decl.node.ctors if k.name == case.ctor[-1]), None)
    if ctor is None:
        return UNKNOWN
    binder = Binder()
    fields = tuple((f.name, binder.instantiate(f.type, v.decl.module, f.name)
                    if f.type is not None and not f.recursive and not _names_type_param(f.type, v.decl.node)
                    else UNKNOWN) for f in ctor.fields)
    return AdtV(v.type_name, ctor.name, fields, v.decl)


def _find_ctor(name: tuple[str, ...], mod: ModuleInfo) -> tuple[Entity, ast.Ctor]:
    if len(name) == 1:
        found = mod.constructor(name[0])
        typedef = found[0]
        return mod.names[typedef.name] if typedef.name in mod.names else Entity("type", typedef, mod), found[1]
    owner = lookup_type(name[:-1], mod)
    return owner, next(c for c in owner.node.ctors if c.name == name[-1])


def _bend_result(s: ast.Bend) -> str:
    """The variable both branches of a bend assign last: the bend's result."""
    def last(body) -> str | None:
        if body and isinstance(body[-1], (ast.Assign, ast.Use)):
            t = body[-1]
            return t.target.name if isinstance(t, ast.Assign) and isinstance(t.target, ast.NameTarget) else getattr(t, "name", None)
        return None
    a, b = last(s.when_body), last(s.else_body)
    if a is None or a != b:
        raise CheckError(s.span, "both branches of a bend must end by assigning the same variable "
                                 "(its result)")
    return a


def _inside(span: Span | None, node) -> bool:
    return span is not None and span.source is node.span.source and node.span.start <= span.start < node.span.end


def _source(e) -> str:
    return e.span.source.text[e.span.start:e.span.end]


def _text(t: ast.TypeExpr) -> str:
    return t.span.source.text[t.span.start:t.span.end]


def _origin_note(v: TensorV) -> Note:
    """`p.W1 is f32[T * E, H] with T * E = 128`: a declared type and what its dims are here."""
    o = v.origin
    note = f"{o.what} is {_text(o.declared)}"
    if isinstance(o.declared, ast.TensorTypeExpr):
        differing = [f"{_source(d)} = {actual}" for d, actual in zip(o.declared.dims, v.type.shape)
                     if eval_dim(d) != actual]
        if differing:
            note += " with " + ", ".join(differing)
    return Note(note, o.span)


def _with_note(e: DslError, note: Note) -> DslError:
    first, *rest = e.diagnostics
    if sum(1 for n in first.notes if n.message.startswith("in '")) < 3:
        first = type(first)(first.span, first.message, first.notes + (note,))
    e.diagnostics = (first, *rest)
    return e


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
    """Parse, resolve and check a file (LANGUAGE.md §2–§5): the front end of `dslc check`."""
    def run() -> Program:
        program = load_program(path, text)
        check_program(program)
        return program
    return deep(without_gc(run))


def without_gc(thunk):
    """thunk run with Python's cycle collector paused: the front end makes many small objects
    and no cycles worth collecting, and collections in the middle cost a third of its time."""
    def run():
        was = gc.isenabled()
        gc.disable()
        try:
            return thunk()
        finally:
            if was:
                gc.enable()
    return run


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
