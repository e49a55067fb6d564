"""Checking calls: of functions (each specialised per argument signature and remembered),
primitives, `grad` and `checkpoint` (traced into IR functions), `map` and constructors."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from frontend import ast
from frontend.ast import contains_span, names_type_param, source_text
from frontend.diagnostics import (CheckError, DslError, LimitError, Note, ShapeError, Site, Span,
                                  counted, did_you_mean, given, with_note)
from frontend.limits import MAX_RANK, MAX_STATIC_RECURSION, MAX_UNROLLED
from frontend.lower import close_over, emit_primitive, fresh_params, leaf_values, rebuild, trained_leaves
from frontend.resolve import Entity, ModuleInfo, dim_names, lookup_type
from frontend.structure import PositionsV
from frontend.unify import Binder, Mismatch, as_tensor, eval_dim, record_params
from frontend.values import (UNKNOWN, AdtV, CheckpointV, CtorV, DTypeV, ForkV, FuncV, GradV, KeyV,
                             LambdaV, ListV, Origin, PrimV, RecordV, SpecialV, StaticV, TensorV,
                             TupleV, TypeV, UnknownV, abstract, describe, merge_all, param_names,
                             same_structure, signature, static_value, strip_origin, type_of)
from ir import ops
from ir.ad import grad_function, inline
from ir.core import Builder, Op, Value
from ir.dims import Dim
from ir.ops.base import Kind, OpError, Primitive
from ir.ops.control import Checkpoint
from ir.ops.elementwise import Pow
from ir.types import FLOAT_DTYPES, TensorType, UnknownType



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


class Calls:
    """The Checker's calls (frontend/check.py)."""

    def call_value(self, f, args: list, kwargs: dict, spans: Spans):
        """Call any callable value."""
        span = spans.call
        match f:
            case FuncV():
                return self.call_def(f, args, kwargs, spans)
            case LambdaV():
                if kwargs or len(args) != len(f.node.params):
                    raise CheckError(span, f"the lambda takes {counted(len(f.node.params), 'argument')} "
                                           f"but {given(len(args))}")
                self.unroll(span)
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
                    raise CheckError(span, f"fork takes {counted(f.arity, 'argument')} (the bend's state) "
                                           f"but {given(len(args))}")
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
            raise CheckError(spans.arg(len(names)), f"{what} takes {counted(len(names), 'argument')} "
                             f"but {given(len(args))}")
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
        entries = self.entered.setdefault(key[:2], [])
        if key in self.active or entries and self.undecided > entries[-1]:
            # recursion with the same arguments, or from a branch the checker could not
            # choose (`switch n` with n unknown): the call is typed by the signature, as a
            # type checker does, and unrolled only where the branch is decided
            return self.assumed(f, values, spans)
        if self.depth >= MAX_STATIC_RECURSION:
            raise CheckError(span, f"static recursion deeper than {MAX_STATIC_RECURSION} calls of '{d.name}': "
                                   "does its switch or bend reach a base case?")
        self.unroll(span)
        self.active.add(key)
        entries.append(self.undecided)
        self.depth += 1
        called = span != d.name_span                # not the generic check of d itself
        if called:
            self.calls.append((d, span))
        try:
            result = self.run_def(f, values, spans)
        except DslError as e:
            if not called or not contains_span(e.span, d):
                raise
            raise with_note(e, Note(f"in '{d.name}' called from {span}")) from None
        finally:
            self.active.discard(key)
            entries.pop()
            self.depth -= 1
            if called:
                self.calls.pop()
        self.memo[key] = result
        return result

    def site(self, span: Span) -> Site:
        """Where an op emitted now is written, and the calls being checked that led there."""
        return Site(span, tuple((d.name, call) for d, call in reversed(self.calls)))

    def unroll(self, span: Span) -> None:
        """Count one body run at compile time (of a function, lambda, bend step or step of a
        fold over a list); past MAX_UNROLLED, an error at span."""
        self.unrolled += 1
        if self.unrolled > MAX_UNROLLED:
            raise LimitError(span, f"more than {MAX_UNROLLED:,} calls, forks and fold steps unrolled "
                                   "at compile time: a static recursion that branches too much, or "
                                   "a fold over too long a list?")

    def assumed(self, f: FuncV, values: list, spans: Spans):
        """A call not unrolled: its arguments checked against the parameters' annotations and
        its result the declared one (unknown where none is declared)."""
        if f.node.ret is None:
            return UNKNOWN
        binder = Binder()
        self.bind_params(f, values, spans, binder)
        binder.finish()
        result = binder.instantiate(f.node.ret, f.module, f"{f.node.name}()")
        return StaticV("int", Dim.unknown()) if isinstance(result, StaticV) and result.kind == "int" else result

    def bind_params(self, f: FuncV, values: list, spans: Spans, binder: Binder) -> dict:
        """The arguments matched against the parameters' annotations (dimensions bound in binder)."""
        d, mod = f.node, f.module
        names = [p.name for p in d.params]
        env = {}
        order = sorted(range(len(d.params)), key=lambda i: not _is_static_int(d.params[i].type))
        for i in order:
            p, v = d.params[i], values[i]
            if p.type is not None:
                try:
                    v = binder.match(p.type, v, mod, owner=p.name)
                    if _is_static_int(p.type) and isinstance(v, StaticV):
                        binder.bind_static(p.name, v.value)
                except Mismatch as m:
                    blamed = d.params[names.index(m.owner or p.name)]
                    raise ShapeError(spans.param(names, blamed.name), f"argument '{blamed.name}' of '{d.name}': {m}",
                                     [Note(f"'{blamed.name}' is declared here", blamed.span)]) from None
                if isinstance(v, TensorV):
                    v = TensorV(v.type, Origin(p.name, p.type, p.span), v.ir)
            env[p.name] = v
        return env

    def run_def(self, f: FuncV, values: list, spans: Spans):
        d, mod = f.node, f.module
        if self.builder is not None and any(p.type is not None and isinstance(v, UnknownV)
                                            for p, v in zip(d.params, values)):
            return UNKNOWN        # lowering: only an error, already reported, leaves a value unknown
        binder = self.binder()
        env = dict(f.env or {})
        env.update(self.bind_params(f, values, spans, binder))
        binder.finish()
        for name, dim in binder.env.items():
            env.setdefault(name, StaticV("int", dim))
        for p in d.params:          # dimensions an unknown argument (an earlier error) left unbound,
                                    # or (when checking generically) one whose type is undecided
            for name in dim_names(p.type, mod):
                env.setdefault(name, StaticV("int", Dim.unknown()))
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
        pairwise = getattr(prim, "pairwise", None)
        if pairwise and len(args) > 1 and _not_an_axis(args[1]):
            raise CheckError(spans.arg(1), f"'{name}' reduces one tensor, and its second argument is "
                                           f"an axis, got {describe(args[1])}; the elementwise "
                                           f"{pairwise} of two values is {pairwise}(a, b)")
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
            if isinstance(prim, Pow) and isinstance(result, TensorType) and result.is_int \
                    and _negative(values[1]):
                raise CheckError(where_is("b"), "integer power with a negative exponent; cast to a "
                                                "float first")
            if isinstance(result, TensorType) and result.rank > MAX_RANK:
                raise CheckError(span, f"'{name}' would make a tensor of rank {result.rank}: a "
                                       f"tensor has at most {MAX_RANK} dimensions")
            if self.builder is None:
                return abstract(result)
            raw = {p.name: v for p, v in zip(positional, values)}
            if variadic is not None:
                raw[variadic.name] = tuple(rest)
            self.builder.origin = self.site(span)
            out = emit_primitive(self.builder, prim, raw, prepared, result)
            # an effect passes its input on: what uses the value need not wait for the effect
            return values[0] if prim.effect else out
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
                    if len(v.items) > MAX_RANK:
                        raise CheckError(span, f"a shape of {len(v.items)} dimensions: a tensor has "
                                               f"at most {MAX_RANK}")
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
        params = param_names(f)
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
        params = param_names(g.f)
        bound = dict(zip(params, args)) | kwargs
        start = len(self.builder.ops) if self.builder is not None else 0
        out = self.call_value(g.f, args, kwargs, spans)
        if self.builder is not None:
            # this call types f; the gradient traced below runs f again, with f's effects
            self.builder.ops[start:] = [op for op in self.builder.ops[start:] if not op.primitive.effect]
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
            grads.append(strip_origin(v))
        if self.builder is not None:
            if isinstance(value, UnknownV) or isinstance(aux, UnknownV):
                return UNKNOWN                     # an error in f, already reported
            value, aux, grads = self.lowered_grad(g, args, kwargs, spans, value, aux)
        grad = TupleV(tuple(grads)) if g.wrt_tuple else grads[0]
        if g.with_value:
            return TupleV((TupleV((value, aux)) if g.has_aux else value, grad))
        return TupleV((grad, aux)) if g.has_aux else grad

    def map_values(self, f, structs: list, spans: Spans):
        """f applied leaf by leaf over records, tuples and lists of one structure; over a zip
        or an enumerate, to the items at each position."""
        if any(isinstance(s, PositionsV) for s in structs):
            return self.map_positions(f, structs, spans)
        if any(isinstance(s, UnknownV) or isinstance(s, ListV) and s.items is None for s in structs):
            return UNKNOWN
        first = structs[0]
        for i, s in enumerate(structs[1:], start=2):
            if not same_structure(first, s):
                raise CheckError(spans.arg(i), f"map over mismatched structures: {describe(first)} "
                                               f"and {describe(s)}")
        if isinstance(first, RecordV):        # a buffer is not trained: it stays the first record's
            fields = tuple((n, v if n in first.buffers else self.map_values(f, [s.get(n) for s in structs], spans))
                           for n, v in first.fields)
            return RecordV(first.name, fields, first.decl)
        if isinstance(first, (TupleV, ListV)):
            items = tuple(self.map_values(f, list(leaves), spans)
                          for leaves in zip(*(s.items for s in structs)))
            return TupleV(items) if isinstance(first, TupleV) else ListV.of(items)
        return self.call_value(f, list(structs), {}, Spans(spans.call))

    def map_positions(self, f, structs: list, spans: Spans) -> ListV:
        """map(f, zip(xs, ys)) and map(f, enumerate(xs)): f(x, y) and f(i, x) at each position,
        each item whole (a record, a key, a tuple), not walked leaf by leaf."""
        if len(structs) > 1:
            i = next(i for i, s in enumerate(structs) if isinstance(s, PositionsV))
            raise CheckError(spans.arg(i + 1), "map over a zip or an enumerate takes no other "
                                               "structures: zip them all together")
        apply = lambda item: self.call_value(f, list(item.items), {}, Spans(spans.call))   # noqa: E731
        positions = structs[0]
        if positions.items is None:            # a symbolic length: f checked on any one position
            return ListV(None, apply(positions.elem), positions.length)
        return ListV.of(apply(item) for item in positions.items)

    def construct(self, entity: Entity, ctor: ast.Ctor, args: list, kwargs: dict, spans: Spans):
        names = [f.name for f in ctor.fields]
        values = self.bind_args(names, [None] * len(names), args, kwargs, spans, f"'{ctor.name}'")
        binder = self.binder()
        fields = []
        for f, v in zip(ctor.fields, values):
            if f.type is not None and not f.recursive and not names_type_param(f.type, entity.node):
                try:
                    v = binder.match(f.type, v, entity.module, owner=f.name)
                except Mismatch as m:
                    blamed = m.owner or f.name
                    raise CheckError(spans.param(names, blamed), f"field '{blamed}' of {ctor.name}: {m}") from None
            fields.append((f.name, v))
        return AdtV(entity.node.name, ctor.name, tuple(fields), entity)

    def record(self, e: ast.RecordLit, frame: Frame):
        entity = lookup_type(e.type, frame.module)
        given = self.field_values(e.fields, frame)
        if entity is None or entity.kind != "object":
            owner, ctor = _find_ctor(e.type, frame.module)
            values = {n: v for n, (v, _) in given.items()}
            return self.construct(owner, ctor, [], values, Spans(
                e.type_span, (), tuple(ast.Keyword(n, f.value, f.span) for n, (_, f) in given.items())))
        decl = entity.node
        _no_extra_fields(entity, given)
        for df in decl.fields:
            if df.name not in given:
                raise CheckError(e.type_span, f"missing field '{df.name}' in {decl.name} {{ … }}",
                                 [Note(f"{decl.name} is declared here", decl.name_span)])
        return self.matched_record(entity, given)

    def record_update(self, e: ast.RecordUpdate, frame: Frame):
        base = self.eval(e.value, frame)
        given = self.field_values(e.fields, frame)
        if isinstance(base, UnknownV):
            return UNKNOWN
        if not isinstance(base, RecordV):
            raise CheckError(e.value.span, f"'with {{ … }}' updates a record, but this is {describe(base)}")
        _no_extra_fields(base.decl, given)
        kept = {n: (v, None) for n, v in base.fields if n not in given}
        return self.matched_record(base.decl, kept | given)

    def field_values(self, inits: tuple[ast.FieldInit, ...], frame: Frame) -> dict[str, tuple]:
        """The values of `name: value` fields by name, with their FieldInit; each name once."""
        given = {}
        for f in inits:
            if f.name in given:
                raise CheckError(f.span, f"field '{f.name}' is given twice")
            given[f.name] = (self.eval(f.value, frame), f)
        return given

    def matched_record(self, entity: Entity, given: dict[str, tuple]) -> RecordV:
        """The record of every field's (value, FieldInit or None) checked against its declared
        type in the declaration's order, the fields kept (None) first: they fix the dimensions
        that the new values must have."""
        decl = entity.node
        binder, params = self.binder(), record_params(None, decl, entity.module)
        fields = {}
        for df in sorted(decl.fields, key=lambda df: given[df.name][1] is not None):
            name, (v, f) = df.name, given[df.name]
            try:
                fields[name] = strip_origin(binder.match(df.type, v, entity.module, params, name))
            except Mismatch as m:
                blamed = next(df for df in decl.fields if df.name == (m.owner or name))
                at = given[blamed.name][1]             # (a kept field: blame the new value that contradicts it)
                raise ShapeError((at or f).value.span, f"field '{blamed.name}' of {decl.name}: {m}",
                                 [Note(f"'{blamed.name}' is declared {source_text(blamed.type)} here",
                                       blamed.span)]) from None
        binder.finish()
        return RecordV(decl.name, tuple((df.name, fields[df.name]) for df in decl.fields), entity)

    # ------------------------------------------------------------ tracing into IR functions

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
        params = param_names(g.f)
        owners = [(name, t) for name, a in zip(params, args) for t in trained_leaves(a)]
        owners += [(k, t) for k, a in kwargs.items() for t in trained_leaves(a)]
        wrt = [i for i, ((o, trained), p) in enumerate(zip(owners, fn.params))
               if o in g.wrt and trained and p.dtype in FLOAT_DTYPES]
        gfn = grad_function(fn, wrt, with_value=True)
        outs = inline(self.builder, gfn, actual + captured)
        value_out = TensorV(outs[0].type, ir=outs[0])
        aux_out = rebuild(faux, outs[1:1 + len(aux_leaves)])
        grads = list(outs[1 + len(aux_leaves):])
        bound = dict(zip(params, args)) | kwargs
        result = []
        for name in g.wrt:
            leaves = []
            for leaf, trained in zip(leaf_values(bound[name]), trained_leaves(bound[name])):
                leaves.append(grads.pop(0) if trained and leaf.dtype in FLOAT_DTYPES else
                              self.builder.emit("zeros", shape=leaf.shape, dtype=leaf.dtype))
            result.append(rebuild(strip_origin(bound[name]), leaves))
        return value_out, aux_out, result

    def lowered_checkpoint(self, c: CheckpointV, args: list, kwargs: dict, spans: Spans):
        """A checkpointed call: one op whose body the backward pass recomputes."""
        body, out, actual = self.trace(c.f, args, kwargs, spans, "checkpoint_body")
        with self.emitting(body):
            out = self.realize(out)
        fn, captured = close_over(body, leaf_values(out))
        outputs = tuple(Value(v.type) for v in fn.results)
        self.builder.add(Op(Checkpoint(), tuple(actual + captured), (), outputs, fn))
        return rebuild(out, list(outputs))


@dataclass(frozen=True)
class _Default:
    """A primitive's default argument: already in the form its shape rule expects."""
    value: object


def _choose(cands: list[Primitive], args: list) -> Primitive:
    """Among primitives sharing a name (split of a key or of a tensor), the one the first argument fits."""
    if len(cands) > 1 and args:
        for p in cands:
            if p.params and (p.params[0].kind is Kind.KEY) == isinstance(args[0], KeyV):
                return p
    return cands[0]


def _negative(v) -> bool:
    """Whether a static int, or a list of them, is or holds a known negative number."""
    if isinstance(v, StaticV):
        return v.kind == "int" and v.known and v.python < 0
    return isinstance(v, (ListV, TupleV)) and v.items is not None and any(map(_negative, v.items))


def _not_an_axis(v) -> bool:
    """A tensor or a float: what a reduction's axis never is, and `max(x, 0.0)` passes."""
    return isinstance(v, TensorV) or isinstance(v, StaticV) and v.kind == "float"


def _not_differentiable(v) -> str | None:
    match v:
        case TensorV() if not v.type.is_float:
            return f"it is {v.type}: integer and boolean inputs have no gradient"
        case StaticV():
            return f"it is a static {v.kind}: only runtime tensors have gradients"
        case KeyV():
            return "it is a random key"
    return None


def _is_static_int(t: ast.TypeExpr | None) -> bool:
    return isinstance(t, ast.NamedType) and t.name == ("int",)


def _no_extra_fields(entity: Entity, given: dict[str, tuple]) -> None:
    decl = entity.node
    names = [df.name for df in decl.fields]
    for name, (_, f) in given.items():
        if name not in names:
            raise CheckError(f.span, f"'{decl.name}' has no field '{name}'"
                                     f"{did_you_mean(name, [n for n in names if n not in given])}",
                             [Note(f"{decl.name} is declared here", decl.name_span)])


def _find_ctor(name: tuple[str, ...], mod: ModuleInfo) -> tuple[Entity, ast.Ctor]:
    if len(name) == 1:
        found = mod.constructor(name[0])
        typedef = found[0]
        return mod.names[typedef.name] if typedef.name in mod.names else Entity("type", typedef, mod), found[1]
    owner = lookup_type(name[:-1], mod)
    return owner, next(c for c in owner.node.ctors if c.name == name[-1])


def _origin_note(v: TensorV) -> Note:
    """`p.W1 is f32[T * E, H] with T * E = 128`: a declared type and what its dims are here."""
    o = v.origin
    note = f"{o.what} is {source_text(o.declared)}"
    if isinstance(o.declared, ast.TensorTypeExpr):
        differing = [f"{source_text(d)} = {actual}" for d, actual in zip(o.declared.dims, v.type.shape)
                     if eval_dim(d) != actual]
        if differing:
            note += " with " + ", ".join(differing)
    return Note(note, o.span)
