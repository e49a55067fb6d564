"""A fold whose body is small runs as one persistent kernel (backend/persistent.py): chosen by
the rule of backend/gpu_plan.py's fold_kernel, accepted by ptxas for sm_80 and sm_90 within
the chips' limits. tests/runtime/test_on_device.py runs it, emulated, against the CPU."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from backend import nvptx, persistent
from backend.gpu_plan import gpu_kernels, gpu_schedule, module_ptx
from backend.schedule import HostStep
from ir.ad import grad_function
from ir.ops.control import Scan
from ir.passes import for_backends, optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend"))
from test_nvptx import within_limits  # noqa: E402

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not on the PATH")

RNN = """
def loss(xs: f32[T, B, I], w: f32[I, H], u: f32[H, H], h0: f32[B, H]) -> f32:
  hs = fold x in xs with h = h0:
    h = tanh(x @ w + h @ u)
    return h
  return sum(hs * hs)
"""


def rnn(t: int, b: int, i: int, h: int) -> list[np.ndarray]:
    return [np.zeros(s, np.float32) for s in ((t, b, i), (i, h), (h, h), (b, h))]


def folds(src: str, args: list[np.ndarray], grad: bool = False) -> list:
    """The GPU kernels of each fold's body, its persistent kernel among them where it has one,
    for the loss of these arguments (or its gradient)."""
    low, _ = dsl.loads(src).lower("loss", tuple(args), {})
    fn = low.function
    if grad:
        fn = optimize(grad_function(fn, [1, 2, 3]))
    out = []
    for i, step in enumerate(gpu_schedule(for_backends(fn), "rnn").steps):
        if isinstance(step, HostStep) and isinstance(step.op.primitive, Scan):
            body = gpu_schedule(for_backends(step.op.body), f"rnn_b{i}")
            out.append(gpu_kernels(body, f"rnn_b{i}", "exact", step.op))
    return out


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_an_rnns_folds_forward_and_backward_assemble_as_persistent_kernels(arch):
    """The forward fold and the gradient's reverse fold of a small RNN: a persistent kernel
    each, through ptxas within the launch, register and shared-memory limits."""
    parts = folds(RNN, rnn(7, 4, 8, 16)) + folds(RNN, rnn(7, 4, 8, 16), grad=True)
    assert len(parts) >= 2 and all(len(p.folds) == 1 for p in parts)
    for p in parts:
        text = module_ptx(p.kernels, p.matmuls, p.gather_kernels, p.mmas, arch, p.folds)
        assert f".entry {p.folds[0].entry}(" in text and "bar.sync" in text
        within_limits(text, nvptx.ptxas(text, arch), [f.launch for f in p.folds])


@pytest.mark.parametrize("sizes, small", [
    ((5, 4, 8, 16), True),
    ((5, 64, 64, 64), False),         # 64·64·128 multiply-adds a step: over WORK
    ((5, 1, 4, 4500), False),         # h twice and the body's values: over ARENA
])
def test_the_rule_takes_small_bodies_only(sizes, small):
    (part,) = folds(RNN, rnn(*sizes))
    assert bool(part.folds) == small
    if small:
        (fold,) = part.folds
        assert fold.arena <= persistent.ARENA and fold.launch.grid == 1 and fold.length == 5


def test_a_body_with_a_gather_is_not_persistent():
    src = """
def loss(xs: i32[T, 3], E: f32[9, 4], h0: f32[3, 4]) -> f32:
  hs = fold i in xs with h = h0:
    h = tanh(E[i] + h)
    return h
  return sum(hs)
"""
    (part,) = folds(src, [np.zeros((4, 3), np.int32), np.ones((9, 4), np.float32), np.zeros((3, 4), np.float32)])
    assert part.folds == ()
