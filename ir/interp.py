"""The reference interpreter: runs IR functions on NumPy arrays, op by op.

It is the definition of what a program means; the compiled backends are tested against it."""
from __future__ import annotations

import numpy as np

from ir.core import Function, Op, Value, bind_inputs
from ir.ops.base import np_dtype


def run(fn: Function, args: list[np.ndarray]) -> list[np.ndarray]:
    """fn applied to arrays (one per parameter, in order); its results as arrays."""
    if len(args) != len(fn.params):
        raise ValueError(f"{fn.name} takes {len(fn.params)} arrays, got {len(args)}")
    env: dict[Value, np.ndarray] = dict(zip(fn.params, args))
    for op in fn.ops:
        env.update(zip(op.outputs, evaluate(op, [env[v] for v in op.inputs])))
    return [env[v] for v in fn.results]


class EvalError(Exception):
    """An op that cannot be evaluated on these values (an index out of range, a dtype the
    reference does not have); the API reports it as a diagnostic."""


def evaluate(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """One op's outputs."""
    if op.prim == "scan":
        return scan(op, inputs)
    if op.prim == "checkpoint":
        return run(op.body, inputs)
    try:
        with np.errstate(all="ignore"):          # inf and NaN are values, as in IEEE arithmetic
            out = op.primitive.evaluate(**bind_inputs(op.primitive, tuple(inputs), op.attrs))
    except (IndexError, ArithmeticError, NotImplementedError) as e:
        raise EvalError(f"'{op.prim}' failed at run time: {e}") from None
    return list(out) if isinstance(out, (list, tuple)) else [out]


def scan(op: Op, inputs: list[np.ndarray], run_body=None) -> list[np.ndarray]:
    """The body applied along the leading axis of the scanned inputs, threading the state.

    inputs = states + scanned sequences + constants; outputs = final states + stacked emits.
    run_body(arrays) runs one step (by default, this interpreter on op.body)."""
    run_body = run_body or (lambda arrays: run(op.body, arrays))
    a = op.attrs
    n_state, n_xs, length = a["n_state"], a["n_xs"], a["length"]
    state = inputs[:n_state]
    xs, consts = inputs[n_state:n_state + n_xs], inputs[n_state + n_xs:]
    steps = range(length - 1, -1, -1) if a.get("reverse") else range(length)
    emitted: dict[int, list[np.ndarray]] = {}
    for t in steps:
        outs = run_body(state + [x[t] for x in xs] + consts)
        state, emitted[t] = outs[:n_state], outs[n_state:]
    emits = []
    for k, v in enumerate(op.body.results[n_state:]):
        if length:
            emits.append(np.stack([emitted[t][k] for t in range(length)]))
        else:
            emits.append(np.zeros((0, *v.shape), dtype=np_dtype(v.dtype)))
    return state + emits
