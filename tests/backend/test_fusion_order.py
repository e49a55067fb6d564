"""The scheduler fuses neighbours, so it takes the ops in fusion_order: an elementwise op is
followed by the later ones of its shape that join it and could run now, where all their
results are the program's or used among them alone (an optimizer's updates, written map after
map over the parameters), and nothing that feeds later work moves."""
from __future__ import annotations

import numpy as np

import dsl
from backend.schedule import KernelStep, fusion_order
from ir.passes import for_backends
from runtime.cpu import Executable
from test_rows import assert_same_bits, reference

rng = np.random.default_rng(3)

SOURCE = """
from optim import adamw

object Model { W: f32[3, 4], b: f32[4], V: f32[4, 7], c: f32[7], scale: f32 }

def step(p: Model, g: Model, s: (i32, Model, Model)) -> (Model, (i32, Model, Model)):
  return adamw(p, g, s, lr=0.01)

def feeds_later(x: f32[N], y: f32[N]) -> (f32[N], f32[N]):
  a = x * 2.0
  t = sum(x * y)
  e = exp(x)                    # could run beside a, but its product waits for the sum:
  return a, e * t               # moved, e would be stored instead of fused into e * t
"""
PROGRAM = dsl.loads(SOURCE, device="reference")
SHAPES = {"W": (3, 4), "b": (4,), "V": (4, 7), "c": (7,), "scale": ()}


def model() -> dict:
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def lowered(entry: str, args: tuple):
    low, inputs = PROGRAM.lower(entry, args, {})
    return for_backends(low.function), inputs.arrays


def adamw_step():
    state = (np.int32(3), model(), {k: np.abs(a) for k, a in model().items()})
    return lowered("step", (model(), model(), state))


def test_each_parameter_is_updated_by_one_kernel_with_the_interpreters_bits():
    fn, arrays = adamw_step()
    exe = Executable(fn)
    kernels = [s.kernel for s in exe.plan.steps if isinstance(s, KernelStep)]
    by_shape = {}
    for k in kernels:
        by_shape.setdefault(k.shape, []).append(k)
    for name, shape in SHAPES.items():        # p, m and v of each: one kernel, three stores
        if shape:
            (k,) = by_shape[shape]
            assert len(k.stores) == 3, name
    assert_same_bits(exe.run(arrays), reference(fn, arrays))


def test_the_order_is_the_ops_own_keeping_their_data_flow():
    for fn, _ in (adamw_step(), lowered("feeds_later", (np.ones(5, np.float32),) * 2)):
        order = fusion_order(fn.ops)
        assert sorted(map(id, order)) == sorted(map(id, fn.ops))
        made = set(fn.params)
        for op in order:
            assert all(v in made for v in op.inputs), op
            made.update(op.outputs)


def test_an_op_that_feeds_later_work_does_not_move():
    fn, _ = lowered("feeds_later", (np.ones(5, np.float32), np.ones(5, np.float32)))
    assert [op.primitive.name for op in fusion_order(fn.ops)] == [op.primitive.name for op in fn.ops]
