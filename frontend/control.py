"""Checking statements: blocks, returns and assignments, and control flow (if, switch, match,
fold, scan and bend), evaluated where static and every branch checked where not."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

from frontend import ast
from frontend.ast import contains_span, names_type_param
from frontend.calls import Frame
from frontend.diagnostics import (LIST_BY_MAP, CheckError, DslError, LimitError, Note, ShapeError,
                                  Span, counted, with_note)
from frontend.limits import MAX_STATIC_RECURSION
from frontend.lower import (LoweringError, close_over, fresh_params, leaf_values, materialize,
                            rebuild)
from frontend.resolve import bound_names
from frontend.unify import Binder, Mismatch
from frontend.values import (UNKNOWN, AdtV, ForkV, FuncV, ListV, RecordV, StaticV, TensorV, TupleV,
                             UnknownV, describe, merge, merge_all, signature, stack, type_of)
from ir.ad import b_scan
from ir.core import Builder
from ir.dims import Dim
from ir.types import ListType, TensorType, types_agree


class Statements:
    """The Checker's statements (frontend/check.py)."""

    def block(self, body: tuple[ast.Stmt, ...], frame: Frame) -> bool:
        """Run statements; True when every path through them has returned."""
        for s in body:
            try:
                if self.stmt(s, frame):
                    return True
            except LimitError:
                raise
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
            if contains_span(e.span, d):
                e = with_note(e, Note(f"in '{d.name}' called from {span}"))
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
                raise CheckError(target.span, f"cannot unpack {counted(len(value.items), 'value')} into {counted(n, 'name')}")
            items = value.items
        else:
            raise CheckError(target.span, f"cannot unpack a value of type {describe(value)}")
        for t, v in zip(target.items, items):
            self.assign(t, v, frame)

    # ------------------------------------------------------------ control flow

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
        with self.undecided_branch():
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

    @contextmanager
    def undecided_branch(self):
        """Inside a branch the checker cannot choose: a recursive call or fork here is not
        unrolled but typed (a generic check of `switch n` with n unknown, calls.assumed)."""
        self.undecided += 1
        try:
            yield
        finally:
            self.undecided -= 1

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
        if isinstance(seq, (ListV, TupleV)) and seq.items is not None:
            emitted = []
            for item in seq.items:
                self.unroll(s.iterable.span)
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
            hint = "; fold over leaves(r) walks a record's tensors" if isinstance(seq, RecordV) else ""
            raise CheckError(s.iterable.span, f"fold walks a tensor's leading axis or a static list; "
                                              f"got {describe(seq)}{hint}")
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
                hint = f"; {LIST_BY_MAP}" if isinstance(before, ListType) or isinstance(new, ListType) else ""
                raise ShapeError(_last_assignment(s.body, st.name) or st.span, f"the fold state '{st.name}' changes type in the body: "
                                          f"{before} before a step, {new} after{hint}")
        return fixed

    def trace_scan(self, s: ast.Fold, frame: Frame, seq: TensorV, state: dict,
                   typed: dict) -> tuple[dict, object]:
        """Lower a fold over a tensor to one scan op: the body traced once into a function of
        (state, element, captured values) -> (new state, emitted values). `typed` holds the
        state's types (a literal initial state made a tensor of the type the body gives it)."""
        outer = self.builder
        names = list(state)
        init = [self.realize(state[n], like=typed[n]) for n in names]
        body = Builder(f"fold_{s.var.name if isinstance(s.var, ast.NameTarget) else 'items'}")
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

    def fold_step(self, s: ast.Fold, frame: Frame, item, state: dict) -> tuple[dict, list]:
        step = frame.child(**state)
        self.assign(s.var, item, step)
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
        memo: dict = {}              # forks with the same state (in one IR function) give one result

        def run(values: list, span: Span, base_only: bool = False):
            """One step of the bend; base_only: its `else` branch alone (a fork not unrolled)."""
            signatures = (id(self.builder), tuple(signature(v) for v in values))
            if (signatures, base_only) in memo:
                return memo[signatures, base_only]
            key = ("bend", id(s), id(frame), signatures[1])
            if key in self.active:
                return UNKNOWN
            if self.depth >= MAX_STATIC_RECURSION:
                raise CheckError(span, f"bend recursion deeper than {MAX_STATIC_RECURSION}: does its 'when' "
                                       "condition become false?")
            self.unroll(span)
            self.active.add(key)
            self.depth += 1
            try:
                entry = self.undecided

                def fork(args: list, fork_span: Span):
                    if self.undecided > entry:
                        # a fork in a branch the checker could not choose (a generic check of
                        # `when d < depth`): typed by the base case for the state it may have
                        return run([merge(a, v) for a, v in zip(args, values)], fork_span, True)
                    return run(args, fork_span)

                step = frame.child(**dict(zip(names, values)), fork=ForkV(fork, len(names)))
                cond = False if base_only else self.static_bool(s.cond, step, "when")
                bodies = [b for b, ok in ((s.when_body, cond is not False), (s.else_body, cond is not True)) if ok]
                outs = []
                with self.undecided_branch() if cond is None else nullcontext():
                    for body in bodies:
                        f = Frame(dict(step.env), step.module, step.name)
                        self.block(body, f)
                        if f.returns:
                            raise CheckError(f.returns[0][1], "'return' inside a bend: assign the "
                                                              f"result to '{result}' instead")
                        outs.append(f.env.get(result, UNKNOWN))
                out = memo[signatures, base_only] = merge_all(outs)
                return out
            finally:
                self.active.discard(key)
                self.depth -= 1

        frame.env[result] = run([self.eval(st.value, frame) for st in s.state], s.span)


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
                    if f.type is not None and not f.recursive and not names_type_param(f.type, v.decl.node)
                    else UNKNOWN) for f in ctor.fields)
    return AdtV(v.type_name, ctor.name, fields, v.decl)


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
