"""Reverse-mode automatic differentiation, source to source: IR in, IR out.

`vjp_function(f)` builds the function that, given f's arguments and a cotangent for each of
f's results, returns a cotangent for each of f's arguments. It replays f's ops, then walks
them backwards, asking each primitive for its VJP rule (the `vjp` method of its class in
ir/ops/), which emits ordinary ops. A `scan` differentiates as a reverse scan over the states
its forward pass saves; a `checkpoint` recomputes its body in the backward pass. `grad` is
the special case of a scalar result whose cotangent is 1, and since the result is an ordinary
function, it can be differentiated again.
"""
from __future__ import annotations

from dataclasses import replace

from ir.core import Builder, Function, Op, Value
from ir.dims import Dim
from ir.ops.control import Checkpoint, Scan
from ir.types import FLOAT_DTYPES, TensorType


def differentiable(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.dtype in FLOAT_DTYPES


def zeros_like(b: Builder, v: Value) -> Value:
    return b.emit("zeros", shape=v.shape, dtype=v.dtype)


def accumulate(b: Builder, cts: dict[Value, Value], v: Value, ct: Value | None) -> None:
    """Add a cotangent contribution for v (a value used several times gets their sum)."""
    if ct is None or not differentiable(v):
        return
    if ct.shape != v.shape or ct.dtype != v.dtype:
        raise AssertionError(f"VJP rule gave a {ct.dtype}{list(ct.shape)} cotangent for a "
                             f"{v.dtype}{list(v.shape)} value")
    cts[v] = b.emit("add", cts[v], ct) if v in cts else ct


def active_values(f: Function, wrt: set[Value]) -> set[Value]:
    """Values that depend differentiably on wrt: only these need cotangents."""
    active = set(wrt)
    for op in f.ops:
        if any(v in active for v in op.inputs) and (op.body is not None or op.primitive.differentiable):
            active.update(v for v in op.outputs if differentiable(v))
    return active


def backward(b: Builder, f: Function, cts: dict[Value, Value], wrt: set[Value]) -> None:
    """Emit into b (which already computes f's values) the cotangents of f's ops, in reverse."""
    active = active_values(f, wrt)
    for op in reversed(f.ops):
        out_cts = tuple(cts.get(v) for v in op.outputs)
        if all(c is None for c in out_cts) or not any(v in active for v in op.inputs):
            continue
        if isinstance(op.primitive, Scan):
            in_cts = vjp_scan(b, op, out_cts)
        elif isinstance(op.primitive, Checkpoint):
            in_cts = vjp_checkpoint(b, op, out_cts)
        elif not op.primitive.differentiable:
            continue
        else:
            in_cts = op.primitive.vjp(b, op, out_cts)
        for v, c in zip(op.inputs, in_cts):
            if v in active:
                accumulate(b, cts, v, c)


def vjp_function(f: Function, name: str | None = None) -> Function:
    """(args…, cotangents of f's results…) -> cotangents of f's args (zeros where none)."""
    b = Builder(name or f"{f.name}_vjp")
    args = inline_params(b, f)
    result_cts = [b.param(v.type) for v in f.results]
    outs = inline(b, f, args)
    cts: dict[Value, Value] = {}
    for v, c in zip(outs, result_cts):
        accumulate(b, cts, v, c)
    fresh = Function(f.name, tuple(args), tuple(b.ops), tuple(outs))
    backward(b, fresh, cts, set(args))
    return b.finish([cts[a] if a in cts else zeros_like(b, a) if differentiable(a) else a
                     for a in args])


def grad_function(f: Function, wrt: list[int], name: str | None = None,
                  with_value: bool = False) -> Function:
    """The gradient of f's first result (a float scalar) with respect to the parameters at
    positions wrt; with_value puts f's results first."""
    b = Builder(name or f"{f.name}_grad")
    args = inline_params(b, f)
    outs = inline(b, f, args)
    seed = b.emit("ones", shape=outs[0].shape, dtype=outs[0].dtype)
    cts = {outs[0]: seed}
    fresh = Function(f.name, tuple(args), tuple(b.ops), tuple(outs))
    backward(b, fresh, cts, {args[i] for i in wrt})
    grads = [cts[args[i]] if args[i] in cts else zeros_like(b, args[i]) for i in wrt]
    return b.finish((list(outs) if with_value else []) + grads)


def inline_params(b: Builder, f: Function) -> list[Value]:
    return [b.param(p.type) for p in f.params]


def inline(b: Builder, f: Function, args: list[Value]) -> list[Value]:
    """Emit a copy of f's ops applied to args into b; returns the copies of f's results."""
    env: dict[Value, Value] = dict(zip(f.params, args))
    for op in f.ops:
        outputs = tuple(Value(v.type) for v in op.outputs)
        b.add(replace(op, inputs=tuple(env[v] for v in op.inputs), outputs=outputs))
        env.update(zip(op.outputs, outputs))
    return [env[v] for v in f.results]


def vjp_checkpoint(b: Builder, op: Op, out_cts: tuple[Value | None, ...]) -> list[Value | None]:
    """Recompute the body from its inputs, then differentiate it: memory traded for time."""
    cts = [c if c is not None else zeros_like(b, v) for c, v in zip(out_cts, op.outputs)]
    return inline(b, vjp_function(op.body), list(op.inputs) + cts)


def vjp_scan(b: Builder, op: Op, out_cts: tuple[Value | None, ...]) -> list[Value | None]:
    """A scan's VJP. One step of the body is differentiated: forward ops F, then backward ops
    B. The forward scan (already in b) is replaced by one whose body also emits, stacked, the
    values of each step that B reads (its residuals); then a reverse scan runs B over them,
    carrying the states' cotangents and summing the constants'. Nothing is recomputed."""
    a = op.attrs
    n_state, n_xs, length = a["n_state"], a["n_xs"], a["length"]
    step = Builder(f"{op.body.name}_bwd")
    args = inline_params(step, op.body)
    outs = inline(step, op.body, args)
    fwd_ops = list(step.ops)
    carry = [step.param(v.type) for v in args[:n_state]]      # cotangent of the next state
    emit_cts = [step.param(v.type) for v in outs[n_state:]]
    acc = [step.param(v.type) for v in args[n_state + n_xs:]]   # constants' cotangents so far
    cts: dict[Value, Value] = {}
    for v, c in zip(outs, carry + emit_cts):
        accumulate(step, cts, v, c)
    backward(step, Function(op.body.name, tuple(args), tuple(fwd_ops), tuple(outs)), cts, set(args))
    arg_cts = [cts[v] if v in cts else zeros_like(step, v) for v in args]
    acc_out = [step.emit("add", s_, c) for s_, c in zip(acc, arg_cts[n_state + n_xs:])]
    bwd_ops = step.ops[len(fwd_ops):]

    produced = {v for o in fwd_ops for v in o.outputs} | set(args[:n_state + n_xs])
    residuals = list(dict.fromkeys(v for v in [v for o in bwd_ops for v in o.inputs] + arg_cts
                                   if v in produced))
    stacked = [Value(TensorType(v.dtype, (Dim.const(length), *v.type.shape))) for v in residuals]
    forward = Function(op.body.name, tuple(args), tuple(fwd_ops), tuple(outs) + tuple(residuals))
    b.ops[b.ops.index(op)] = replace(op, outputs=op.outputs + tuple(stacked), body=forward)

    consts = args[n_state + n_xs:]
    bwd = Function(step.name, tuple(carry + acc + residuals + emit_cts + consts), tuple(bwd_ops),
                   tuple(arg_cts[:n_state] + acc_out + arg_cts[n_state:n_state + n_xs]))
    cts_in = [c if c is not None else zeros_like(b, v) for c, v in zip(out_cts, op.outputs)]
    const_inputs = list(op.inputs[n_state + n_xs:])
    outs_b = b_scan(b, bwd, cts_in[:n_state] + [zeros_like(b, c) for c in const_inputs] + stacked
                    + cts_in[n_state:] + const_inputs,
                    {"n_state": n_state + len(consts), "n_xs": len(residuals) + len(emit_cts),
                     "length": length, "reverse": not a.get("reverse", False)})
    state_cts, const_cts = outs_b[:n_state], outs_b[n_state:n_state + len(consts)]
    return state_cts + outs_b[n_state + len(consts):] + const_cts


def b_scan(b: Builder, body: Function, inputs: list[Value], attrs: dict) -> list[Value]:
    """Emit a scan op of body over inputs (states + sequences + constants)."""
    n_state, length = attrs["n_state"], attrs["length"]
    outputs = [Value(v.type) for v in body.results[:n_state]]
    outputs += [Value(TensorType(v.dtype, (Dim.const(length), *v.type.shape))) for v in body.results[n_state:]]
    b.add(Op(Scan(), tuple(inputs), tuple(sorted(attrs.items())), tuple(outputs), body))
    return outputs

