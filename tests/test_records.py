"""Record updates (`r with { … }`) and buffers (`buffer name: T`) on the reference interpreter
and the CPU backend: values, and gradients against PyTorch's."""
import numpy as np
import pytest
import torch

import dsl

SOURCE = """
object Stats { mean: f32[D], var: f32[D], w: f32[D] }

def loss(s: Stats, xs: f32[T, D]) -> f32:
  s = s with { mean: s.mean * 2.0 }
  s = s with {
    var: s.var + 1.0,
    w: s.w * s.mean,
  }
  fold x in xs with s = s:
    s = s with { mean: s.mean + x }
  return sum(s.mean * s.var * s.w)

def update(s: Stats, m: f32[D]) -> Stats:
  return s with { mean: m }

# a buffer first: its leaves come before the trained ones
object Frozen { buffer emb: f32[V, D], W: f32[D] }

def score(p: Frozen, idx: i32[B]) -> f32:
  return sum(tanh(p.emb[idx] * p.W))

def score_grad(p: Frozen, idx: i32[B]) -> Frozen:
  return grad(score, wrt=p)(p, idx)
"""

DEVICES = ("reference", "cpu")


def torch_loss(s, xs):
    mean = s["mean"] * 2.0
    var, w = s["var"] + 1.0, s["w"] * mean
    mean = mean + xs.sum(0)
    return (mean * var * w).sum()


@pytest.mark.parametrize("device", DEVICES)
def test_update_and_its_gradient_match_torch(device):
    prog = dsl.loads(SOURCE, name="records.bend", device=device)
    rng = np.random.default_rng(0)
    s = {k: rng.standard_normal(4).astype(np.float32) for k in ("mean", "var", "w")}
    xs = rng.standard_normal((3, 4)).astype(np.float32)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in s.items()}
    want = torch_loss(t, torch.tensor(xs))
    want.backward()
    np.testing.assert_allclose(prog.loss(s, xs), want.item(), rtol=1e-5)
    g = prog.grad("loss", wrt="s")(s, xs)
    for k in s:
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_update_keeps_the_other_fields(device):
    prog = dsl.loads(SOURCE, name="records.bend", device=device)
    s = {k: np.full(2, i, np.float32) for i, k in enumerate(("mean", "var", "w"))}
    out = prog.update(s, np.array([7.0, 8.0], np.float32))
    assert list(out) == ["mean", "var", "w"]
    np.testing.assert_array_equal(out["mean"], [7.0, 8.0])
    np.testing.assert_array_equal(out["var"], s["var"])
    np.testing.assert_array_equal(out["w"], s["w"])


@pytest.mark.parametrize("device", DEVICES)
def test_a_buffer_has_a_zero_gradient_and_the_others_theirs(device):
    prog = dsl.loads(SOURCE, name="records.bend", device=device)
    rng = np.random.default_rng(1)
    p = {"emb": rng.standard_normal((5, 3)).astype(np.float32), "W": rng.standard_normal(3).astype(np.float32)}
    idx = np.array([0, 4, 4, 2], np.int32)
    emb, W = torch.tensor(p["emb"], requires_grad=True), torch.tensor(p["W"], requires_grad=True)
    torch.tanh(emb[torch.tensor(idx, dtype=torch.long)] * W).sum().backward()
    for g in (prog.score_grad(p, idx), prog.grad("score", wrt="p")(p, idx)):
        np.testing.assert_array_equal(g["emb"], np.zeros((5, 3), np.float32))
        np.testing.assert_allclose(g["W"], W.grad.numpy(), rtol=1e-5)


def test_dslc_grad_prints_buffers_as_buffers_with_zero_gradients():
    prog = dsl.loads(SOURCE, name="records.bend", device="reference")
    text = prog.source("score", grad="p", dims={"V": 5, "D": 3, "B": 4})
    assert "object Frozen { buffer emb: f32[5, 3], W: f32[3] }" in text
    assert "emb: zeros([5, 3], dtype=f32)" in text
    generic = prog.source("score", grad="p")
    assert "object Frozen { buffer emb: f32[V, D], W: f32[D] }" in generic
    assert "emb: zeros([V, D], dtype=f32)" in generic
