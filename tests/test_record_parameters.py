"""Records with parameters. Dimension parameters (`object Conv1D[I, O]` used as
`Conv1D[D, 4 * D]`): one record type at two shapes in one parameter computes and differentiates
as PyTorch does, and passes through every way inputs arrive (Python, named arrays, --dims) and
through `dslc grad`. Type parameters (`object Moments(P)` used as `Moments(Params)`): an
optimizer's state as a record of any parameter record."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dsl
from conftest import dslc, raises, user_error

sys.path.insert(0, str(Path(__file__).parent))
from test_grad_programs import assert_same_gradient  # noqa: E402

SOURCE = """
object Conv1D[I, O] { weight: f32[I, O], bias: f32[O] }
object Mlp { up: Conv1D[D, 4 * D], down: Conv1D[4 * D, D] }

def conv1d(c: Conv1D, x: f32[B, I]) -> f32[B, O]:
  return x @ c.weight + c.bias

def forward(p: Mlp, x: f32[B, D]) -> f32[B, D]:
  return conv1d(p.down, tanh(conv1d(p.up, x)))

def loss(p: Mlp, x: f32[B, D]) -> f32:
  return sum(forward(p, x) ** 2.0)

def init(k: Key, D: int) -> Mlp:
  up = Conv1D { weight: normal(k, [D, 4 * D]), bias: zeros([4 * D]) }
  return Mlp { up: up, down: Conv1D { weight: normal(fold_in(k, 1), [4 * D, D]), bias: ones([D]) } }
"""

D, B = 3, 2


def params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return {"up": {"weight": f(D, 4 * D), "bias": f(4 * D)}, "down": {"weight": f(4 * D, D), "bias": f(D)}}


def x_input() -> np.ndarray:
    return np.random.default_rng(9).standard_normal((B, D)).astype(np.float32)


@pytest.mark.parametrize("device", ("reference", "cpu"))
def test_one_record_at_two_shapes_matches_torch(device):
    prog = dsl.loads(SOURCE, name="dims.bend", device=device)
    p, x = params(), x_input()
    t = {k: {f: torch.tensor(a, requires_grad=True) for f, a in c.items()} for k, c in p.items()}
    h = torch.tanh(torch.tensor(x) @ t["up"]["weight"] + t["up"]["bias"])
    y = h @ t["down"]["weight"] + t["down"]["bias"]
    (y ** 2).sum().backward()
    np.testing.assert_allclose(prog.forward(p, x), y.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = prog.grad("loss", wrt="p")(p, x)
    for k in p:
        for f in p[k]:
            np.testing.assert_allclose(g[k][f], t[k][f].grad.numpy(), rtol=1e-5, atol=1e-5)


def test_init_builds_each_use_at_its_shape():
    p = dsl.loads(SOURCE, name="dims.bend").init(dsl.key(0), D=5)
    assert {k: {f: a.shape for f, a in c.items()} for k, c in p.items()} == {
        "up": {"weight": (5, 20), "bias": (20,)}, "down": {"weight": (20, 5), "bias": (5,)}}


def test_python_input_at_the_wrong_shape_names_the_field_and_the_substituted_type():
    prog = dsl.loads(SOURCE, name="dims.bend")
    p = params()
    p["down"] = p["up"]                                   # [D, 4 D] where [4 D, D] is declared
    raises(lambda: prog.forward(p, x_input()),
           "argument 'p' of 'forward': field 'down' of Mlp: field 'weight' of Conv1D: "
           "expected f32[12, 3], got f32[3, 12]")


def test_dims_give_the_shapes_of_each_use():
    prog = dsl.loads(SOURCE, name="dims.bend")
    text = prog.source("forward", dims={"B": B, "D": D})
    assert "def forward(p: Mlp, x: f32[2, 3]) -> f32[2, 3]:" in text
    assert "object Conv1D { weight: f32[3, 12], bias: f32[12] }" in text
    assert "object Conv1D_2 { weight: f32[12, 3], bias: f32[3] }" in text
    raises(lambda: prog.source("forward", dims={"B": B, "D": D, "I": 4}), "--dims names 'I'")


def test_printed_gradient_declares_each_shape_and_computes_the_same_bits(tmp_path):
    prog = dsl.loads(SOURCE, name="dims.bend")
    p, x = params(), x_input()
    text = prog.source("loss", grad="p")                  # generic in D and B
    assert "object Mlp { up: Conv1D, down: Conv1D_2 }" in text
    assert "object Conv1D { weight: f32[D, 4 * D], bias: f32[4 * D] }" in text
    assert "object Conv1D_2 { weight: f32[4 * D, D], bias: f32[D] }" in text
    assert_same_gradient(text, tmp_path, prog.grad("loss", wrt="p")(p, x), {"p": p, "x": x})


def test_named_arrays_load_by_field_path(tmp_path):
    src = tmp_path / "dims.bend"
    src.write_text(SOURCE)
    p, x = params(), x_input()
    arrays = {f"p.{k}.{f}": a for k, c in p.items() for f, a in c.items()} | {"x": x}
    np.savez(tmp_path / "in.npz", **arrays)
    r = dslc("run", str(src), "--entry", "forward", "--inputs", str(tmp_path / "in.npz"),
             "-o", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    want = dsl.loads(SOURCE, name="dims.bend").forward(p, x)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["out"], want)
    arrays["p.down.weight"] = arrays["p.up.weight"]
    np.savez(tmp_path / "bad.npz", **arrays)
    user_error(dslc("run", str(src), "--entry", "forward", "--inputs", str(tmp_path / "bad.npz")),
               "field 'down' of Mlp: field 'weight' of Conv1D: expected f32[12, 3], got f32[3, 12]")


def test_fixed_sizes_given_by_a_use_are_checked_when_arrays_are_read(tmp_path):
    src = tmp_path / "fixed.bend"
    src.write_text("object Conv1D[I, O] { weight: f32[I, O], bias: f32[O] }\n\n"
                   "def main(c: Conv1D[4, 8], x: f32[B, 4]) -> f32[B, 8]:\n"
                   "  return x @ c.weight + c.bias\n")
    np.savez(tmp_path / "in.npz", **{"c.weight": np.ones((4, 7), np.float32),
                                      "c.bias": np.ones(8, np.float32), "x": np.ones((2, 4), np.float32)})
    user_error(dslc("run", str(src), "--entry", "main", "--inputs", str(tmp_path / "in.npz")),
               "the input array 'c.weight' is f32[4, 7], but 'c.weight' is f32[4, 8]")


OPTIMIZER = """
object Params { W: f32[D, D], b: f32[D] }
object Moments(P) { step: i32, m: P, v: P }

def zeros_like(x):
  return x * 0.0

def init(p: Params) -> Moments(Params):
  z = map(zeros_like, p)
  return Moments { step: zeros([], dtype=i32), m: z, v: z }

def update(p: Params, s: Moments(Params), g: Params) -> (Params, Moments(Params)):
  m = map(lambda a, d: 0.9 * a + 0.1 * d, s.m, g)
  v = map(lambda a, d: 0.99 * a + 0.01 * d * d, s.v, g)
  p = map(lambda w, a, b: w - 0.5 * a / (sqrt(b) + 1e-8), p, m, v)
  return p, s with { step: s.step + 1, m: m, v: v }

def steps(s: Moments) -> i32:
  return s.step
"""


@pytest.mark.parametrize("device", ("reference", "cpu"))
def test_a_state_generic_in_its_parameters_type_updates_as_written(device):
    prog = dsl.loads(OPTIMIZER, name="moments.bend", device=device)
    rng = np.random.default_rng(3)
    p = {"W": rng.standard_normal((2, 2)).astype(np.float32), "b": rng.standard_normal(2).astype(np.float32)}
    g = {k: rng.standard_normal(a.shape).astype(np.float32) for k, a in p.items()}
    s = prog.init(p)
    assert int(s["step"]) == 0 and list(s["m"]) == ["W", "b"]
    p2, s2 = prog.update(p, s, g)
    assert int(s2["step"]) == 1
    for k in p:
        m, v = np.float32(0.1) * g[k], np.float32(0.01) * g[k] * g[k]
        np.testing.assert_allclose(s2["m"][k], m, rtol=1e-6)
        np.testing.assert_allclose(s2["v"][k], v, rtol=1e-6)
        np.testing.assert_allclose(p2[k], p[k] - 0.5 * m / (np.sqrt(v) + 1e-8), rtol=1e-5)


def test_a_given_type_is_checked_and_an_entry_must_give_it():
    prog = dsl.loads(OPTIMIZER, name="moments.bend")
    p = {"W": np.ones((2, 2), np.float32), "b": np.ones(2, np.float32)}
    s = prog.init(p)
    wrong = {"step": s["step"], "m": s["m"], "v": {"W": np.ones((3, 3), np.float32), "b": p["b"]}}
    raises(lambda: prog.update(p, wrong, p),
           "argument 's' of 'update': field 'v' of Moments: field 'W' of Params: expected f32[2, 2], got f32[3, 3]")
    raises(lambda: prog.steps(s), "'s.m' has the type parameter P, which an entry's input must give")
