"""Control: `stop_gradient`, and the structured primitives `scan` (a fold over a tensor) and
`checkpoint` (a call recomputed in the backward pass), which hold a body function."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ir.ops.base import Kind, Param, Primitive, Role, np_dtype, primitive
from ir.mlir import type_of
from ir.types import TensorType

Run = Callable[[list[np.ndarray]], list[np.ndarray]]


@primitive
class StopGradient(Primitive):
    """x unchanged; reverse mode treats it as a constant."""
    name = surface = "stop_gradient"
    params = (Param("x", Kind.TENSOR),)
    differentiable = False
    role = Role.ELEMENTWISE

    def infer(self, x: TensorType) -> TensorType:
        return x

    def evaluate(self, x: np.ndarray) -> np.ndarray:
        return x

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (None,)

    def compiles(self, dtypes: list[str], dtype: str) -> bool:
        return dtype != "bf16"

    def mlir(self, w: Any, op: Any) -> list[str]:
        return [w[op.inputs[0]]]

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        return args[0]


class Structured(Primitive):
    """A primitive whose op holds a body Function; `run` is its meaning, given a way to run
    the body (the interpreter's, or a runtime's compiled one). ir/ad.py differentiates it."""
    role = Role.STRUCTURED

    def run(self, op: Any, inputs: list[np.ndarray], run_body: Run) -> list[np.ndarray]:
        raise NotImplementedError


@primitive
class Scan(Structured):
    """The body applied along the leading axis of the scanned inputs, threading the state:
    inputs = states + scanned sequences + constants; outputs = final states + stacked emits."""
    name = "scan"

    def run(self, op: Any, inputs: list[np.ndarray], run_body: Run) -> list[np.ndarray]:
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

    def mlir(self, w: Any, op: Any) -> list[str]:
        """An scf.for over the steps: the states and the stacked emits are its loop-carried
        tensors; step t reads slice t of each sequence and writes slice t of each emit."""
        a, body = op.attrs, op.body
        n_state, n_xs, length = a["n_state"], a["n_xs"], a["length"]
        states, xs, consts = (op.inputs[:n_state], op.inputs[n_state:n_state + n_xs],
                              op.inputs[n_state + n_xs:])
        emits = op.outputs[n_state:]
        carried = [(w[v], type_of(v)) for v in states] + \
                  [(w.empty(v.shape, v.dtype), type_of(v)) for v in emits]

        def step(t: str, iters: list[str]) -> list[str]:
            if a.get("reverse"):
                t_rev = w.fresh("t_rev")
                w.line(f"{t_rev} = arith.subi {w.index(length - 1)}, {t} : index")
                t = t_rev
            for v, s in zip(body.params[:n_state], iters):
                w.bind(v, s)
            for v, x in zip(body.params[n_state:n_state + n_xs], xs):
                w.bind(v, w.slice_at(w[x], x.shape, x.dtype, t, "x"))
            for v, c in zip(body.params[n_state + n_xs:], consts):
                w.bind(v, w[c])
            w.ops(body)
            return [w[v] for v in body.results[:n_state]] + \
                   [w.insert_at(w[v], ys, e.shape, e.dtype, t)
                    for v, ys, e in zip(body.results[n_state:], iters[n_state:], emits)]
        return w.loop(length, carried, step, "scan")


@primitive
class Checkpoint(Structured):
    """The body called on the inputs; reverse mode recomputes it instead of keeping its values."""
    name = "checkpoint"

    def run(self, op: Any, inputs: list[np.ndarray], run_body: Run) -> list[np.ndarray]:
        return run_body(inputs)

    def mlir(self, w: Any, op: Any) -> list[str]:
        """The body inline: recomputing it is reverse mode's business, not the module's."""
        for v, x in zip(op.body.params, op.inputs):
            w.bind(v, w[x])
        w.ops(op.body)
        return [w[v] for v in op.body.results]
