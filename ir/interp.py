"""The reference interpreter: runs IR functions on NumPy arrays, op by op.

It is the definition of what a program means; the compiled backends are tested against it."""
from __future__ import annotations

import numpy as np

from ir.core import Function, Op, Value, bind_inputs
from ir.ops.base import EvalError, Role


def run(fn: Function, args: list[np.ndarray]) -> list[np.ndarray]:
    """fn applied to arrays (one per parameter, in order); its results as arrays."""
    if len(args) != len(fn.params):
        raise ValueError(f"{fn.name} takes {len(fn.params)} arrays, got {len(args)}")
    env: dict[Value, np.ndarray] = dict(zip(fn.params, args))
    for op in fn.ops:
        env.update(zip(op.outputs, evaluate(op, [env[v] for v in op.inputs])))
    return [env[v] for v in fn.results]


def evaluate(op: Op, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """One op's outputs."""
    prim = op.primitive
    if prim.role is Role.STRUCTURED:
        return prim.run(op, inputs, lambda arrays: run(op.body, arrays))
    args = bind_inputs(prim, tuple(inputs), op.attrs)
    if prim.effect:                              # what it prints or reports names the source
        args["origin"] = op.origin
    try:
        with np.errstate(all="ignore"):          # inf and NaN are values, as in IEEE arithmetic
            out = prim.evaluate(**args)
    except (IndexError, ArithmeticError, NotImplementedError) as e:
        raise EvalError(f"'{prim.name}' failed at run time: {e}", op.origin) from None
    return list(out) if isinstance(out, (list, tuple)) else [out]
