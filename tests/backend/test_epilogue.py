"""A map kernel that computes on a contraction's result C where it lies (a bias, an activation,
a residual, an attention's scale and mask), or a row kernel over C's rows (a layer norm, a
softmax), is the contraction's epilogue: run on each block of C's rows as soon as they are
final, with the bits of the same operations done one by one, on any number of threads."""
from __future__ import annotations

import numpy as np
import pytest

import dsl
import backend.contract
import runtime.cpu
from backend.schedule import ContractStep, schedule
from backend.step import ProductCall
from ir.passes import for_backends
from runtime.cpu import Executable
from runtime.step import Native
from test_rows import assert_same_bits, reference

rng = np.random.default_rng(11)

SOURCE = """
def gelu(x):
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

def bias(x: f32[M, K], W: f32[K, N], b: f32[N]) -> f32[M, N]:
  return x @ W + b

def mlp(x: f32[M, K], W: f32[K, N], b: f32[N]) -> f32[M, N]:
  return gelu(x @ W + b)

def residual(x: f32[M, K], W: f32[K, N], r: f32[M, N]) -> f32[M, N]:
  return r + x @ W

def tokens(x: f32[B, M, K], W: f32[K, N], b: f32[N]) -> f32[B, M, N]:
  return gelu(x @ W + b)

def attention(q: f32[B, H, M, K], k: f32[B, H, N, K]) -> f32[B, H, M, N]:
  s = einsum("bhtd,bhsd->bhts", q, k) * 0.125
  return where(tril(ones([M, N])) > 0.0, s, -1e9)

def row(v: f32[K], W: f32[K, N], b: f32[N]) -> f32[N]:
  return v @ W + b

def column(W: f32[M, K], v: f32[K], b: f32[M]) -> f32[M]:
  return gelu(W @ v) * b

def normed(x: f32[M, K], W: f32[K, N], r: f32[M, N]) -> f32[M, N]:
  y = r + x @ W
  m = mean(y, axis=-1, keepdims=True)
  v = mean((y - m) * (y - m), axis=-1, keepdims=True)
  return (y - m) * rsqrt(v + 1e-5)

def softmax_rows(q: f32[B, M, K], k: f32[B, K, N]) -> f32[B, M, N]:
  s = q @ k
  e = exp(s - max(s, axis=-1, keepdims=True))
  return e / sum(e, axis=-1, keepdims=True)

def softmax_columns(q: f32[M, K], k: f32[K, N]) -> f32[N, M]:
  s = transpose(q @ k)
  e = exp(s - max(s, axis=-1, keepdims=True))
  return e / sum(e, axis=-1, keepdims=True)

def transposed(x: f32[M, K], W: f32[K, M], y: f32[M, M]) -> f32[M, M]:
  return transpose(x @ W) + y

def reduced(x: f32[M, K], W: f32[K, N], b: f32[N]) -> f32[M]:
  return sum((x @ W + b) * (x @ W + b), axis=-1)
"""
PROGRAM = dsl.loads(SOURCE, device="reference")


def arrays(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


# (entry, its arguments' shapes): N ≤ nc (the kernel calls the epilogue per job) and N > nc
# (the runtime runs it after the product), rows in one batch entry and over several, and
# products of at most mr rows (a decoder's token: one job a thread, B streamed in place)
CASES = [
    ("bias", [(1, 40), (40, 600), (600,)]),
    ("mlp", [(5, 24), (24, 700), (700,)]),
    ("mlp", [(1, 24), (24, 100), (100,)]),
    ("bias", [(300, 40), (40, 72), (72,)]),
    ("bias", [(7, 3), (3, 5), (5,)]),
    ("mlp", [(7, 0), (0, 5), (5,)]),
    ("bias", [(64, 32), (32, 600), (600,)]),
    ("mlp", [(300, 40), (40, 130), (130,)]),
    ("mlp", [(200, 16), (16, 700), (700,)]),
    ("residual", [(300, 40), (40, 72), (300, 72)]),
    ("tokens", [(4, 50, 40), (40, 72), (72,)]),
    ("attention", [(2, 3, 40, 16), (2, 3, 40, 16)]),
    ("row", [(40,), (40, 72), (72,)]),
    ("column", [(130, 40), (40,), (130,)]),
    ("normed", [(300, 40), (40, 72), (300, 72)]),
    ("normed", [(64, 32), (32, 600), (64, 600)]),
    ("softmax_rows", [(3, 100, 16), (3, 16, 100)]),
    ("softmax_columns", [(50, 16), (16, 70)]),
    ("softmax_columns", [(120, 16), (16, 120)]),
    ("transposed", [(100, 40), (40, 100), (100, 100)]),
    ("reduced", [(100, 40), (40, 72), (72,)]),
]
FUSED = {"bias", "mlp", "residual", "tokens", "attention", "row", "column", "normed", "softmax_rows"}


def lowered(name: str, shapes: list[tuple[int, ...]]):
    low, inputs = PROGRAM.lower(name, tuple(arrays(*shapes)), {})
    return low.function, inputs.arrays


@pytest.mark.parametrize("name, shapes", CASES, ids=[f"{n}-{s[0]}-{s[1]}" for n, s in CASES])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_epilogues_give_the_bits_of_the_operations_done_one_by_one(name, shapes, threads, monkeypatch):
    monkeypatch.setenv("DSLC_THREADS", str(threads))
    for least in ("MIN_MULTIPLY_ADDS_PER_THREAD", "IN_STEP_MULTIPLY_ADDS_PER_THREAD"):
        monkeypatch.setattr(backend.contract, least, 1)                       # jobs on every thread
    monkeypatch.setattr(runtime.cpu, "MIN_RUN_WORK", 1)
    fn, inputs = lowered(name, shapes)
    exe = Executable(fn)
    epilogues = [s.epilogue for s in exe.plan.steps if isinstance(s, ContractStep) and s.epilogue]
    assert bool(epilogues) == (name in FUSED)
    assert_same_bits(exe.run(inputs), reference(fn, inputs))


def test_the_contraction_runs_the_epilogue_on_its_rows_where_its_jobs_cover_them(monkeypatch):
    """N ≤ nc: no pass over C after the product; N > nc: one (in the walk and the native step)."""
    after = []
    run = runtime.cpu._RunLaunch.run
    monkeypatch.setattr(runtime.cpu._RunLaunch, "run", lambda self, *a: (after.append(self), run(self, *a)))
    for shapes, passes in (([(300, 40), (40, 72), (72,)], 0), ([(64, 32), (32, 600), (600,)], 1)):
        fn, inputs = lowered("mlp", shapes)
        exe, want = Executable(fn), reference(fn, inputs)
        after.clear()
        assert_same_bits(exe.walk(inputs), want)
        assert len(after) == passes
        assert_same_bits(exe.run(inputs), want)
        (product,) = [c for x in exe.native.items if isinstance(x, Native) for c in x.calls
                      if isinstance(c, ProductCall)]
        assert product.fused == (passes == 0)


def test_the_epilogue_is_built_over_the_rows_of_c():
    fn, _ = lowered("tokens", [(4, 50, 40), (40, 72), (72,)])
    (step,) = [s for s in schedule(for_backends(fn)).steps if isinstance(s, ContractStep)]
    assert step.epilogue.kernel.shape == (200, 72)
    assert "on each block of rows" in PROGRAM.ir("tokens", dims={"B": 4, "M": 50, "K": 40, "N": 72},
                                                 level="loops")


def test_the_gpt_training_step_has_epilogues():
    """The forward pass's: the attention's scale and mask and the MLP's bias and GELU (maps),
    the residual adds with their layer norms and the loss's log-softmax (row kernels)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import train_step
    p, idx, tgt = train_step.gpt_inputs(layers=1, B=2, T=8, D=16, V=11)
    prog = dsl.loads(train_step.GPT_STEP, name=str(train_step.MODELS / "gpt_step.bend"), device="reference")
    low, _ = prog.lower("step", (p, train_step.state_like(p), idx, tgt, 2), {})
    plan = schedule(for_backends(low.function))
    epilogues = [s.epilogue.kernel for s in plan.steps if isinstance(s, ContractStep) and s.epilogue]
    assert sum(not k.is_rows for k in epilogues) == 2 and sum(k.is_rows for k in epilogues) == 3


@pytest.mark.parametrize("target", ["cpu", "ptx"])
def test_compiled_manifests_run_the_epilogue_with_its_contraction(target, tmp_path):
    manifest = PROGRAM.compile_to("mlp", target, str(tmp_path), dims={"M": 30, "K": 8, "N": 20})
    (step,) = [s for s in manifest["steps"] if "matmul" in s]
    names = [k["name"] for k in manifest["kernels"]]
    assert step["epilogue"]["kernel"] in names
    assert step["outputs"][0] in step["epilogue"]["args"]
    if target == "ptx":
        assert f"{step['epilogue']['kernel']}_gpu" in (tmp_path / "kernels.ptx").read_text()
