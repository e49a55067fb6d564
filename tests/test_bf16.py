"""Programs that compute in bf16 run on every device: the reference interpreter's arithmetic
(ml_dtypes' bfloat16, each operation rounded once), the CPU backend (which evaluates bf16 ops
on the host) and the GPU runtime give the same bits, forward and backward."""
from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dsl
from conftest import dslc

sys.path.insert(0, str(Path(__file__).parent / "runtime"))
from test_cuda import FakeDriver, install  # noqa: E402

BF16 = ml_dtypes.bfloat16
SOURCE = """
def layer(W: bf16[I, O], x: f32[B, I]) -> bf16[B, O]:
  h = cast(x, bf16) @ W
  return tanh(h) * 0.5 + sum(h * h, axis=1, keepdims=True) / 3.0

def loss(W: bf16[I, O], x: f32[B, I]) -> bf16:
  return mean(layer(W, x))
"""
rng = np.random.default_rng(16)
W = rng.standard_normal((5, 3)).astype(BF16)
X = rng.standard_normal((4, 5)).astype(np.float32)


def reference_layer() -> np.ndarray:
    """layer written out in ml_dtypes' bf16: the contraction as its fma chain in k order, the
    sum of 3 in the canonical order (lanes 0, 1, 2, then the tree: (x0 + x2) + x1)."""
    x = X.astype(BF16)
    h = np.zeros((4, 3), BF16) * BF16(-1)
    for k in range(5):
        exact = x[:, k:k + 1].astype(np.float64) * W[k].astype(np.float64) + h.astype(np.float64)
        h = exact.astype(BF16)               # 8 + 8 bits and a bf16: one rounding in f64 is exact here
    s = h * h
    return np.tanh(h) * BF16(0.5) + ((s[:, 0:1] + s[:, 2:3]) + s[:, 1:2]) / BF16(3.0)


@pytest.mark.parametrize("device", ["reference", "cpu", "cuda"])
def test_a_bf16_program_gives_the_same_bits_on_every_device(device, monkeypatch):
    if device == "cuda":
        install(monkeypatch, FakeDriver())
    prog = dsl.loads(SOURCE, device=device)
    got = np.asarray(prog.layer(W, X))
    assert got.dtype == BF16 and got.shape == (4, 3)
    want = dsl.loads(SOURCE, device="reference").layer(W, X)
    assert got.tobytes() == want.tobytes()
    assert got.tobytes() == reference_layer().tobytes()
    grad = np.asarray(prog.grad("loss", wrt="W")(W, X))
    assert grad.dtype == BF16 and grad.shape == (5, 3)
    assert grad.tobytes() == dsl.loads(SOURCE, device="reference").grad("loss", wrt="W")(W, X).tobytes()


def test_dslc_run_writes_bf16_results_widened_to_f32(tmp_path):
    """.npy has no bf16: `dslc run -o` writes a bf16 result as float32, exactly."""
    (tmp_path / "m.bend").write_text(SOURCE + """
def from_f32(W: f32[I, O], x: f32[B, I]) -> bf16[B, O]:
  return layer(cast(W, bf16), x)
""")
    np.savez(tmp_path / "in.npz", W=W.astype(np.float32), x=X)
    r = dslc("run", str(tmp_path / "m.bend"), "--entry", "from_f32", "--inputs", str(tmp_path / "in.npz"),
             "-o", str(tmp_path / "out.npz"), "--device", "cpu")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "out.npz") as out:
        assert out["out"].dtype == np.float32
        assert out["out"].astype(BF16).tobytes() == reference_layer().tobytes()
