"""Records with dimension and type parameters at zero and one and prime sizes, on the reference
and the CPU on 1, 2 and 3 threads (each in a child process), with their gradients; and every
wrong input, from Python and from named arrays, as a located diagnostic."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dsl
from conftest import bits, dslc, on_every_thread_count, raises, user_error

CORPUS = Path(__file__).parent / "corpus" / "valid"
DIMENSIONS = (CORPUS / "59_record_dimension_parameters.bend").read_text()
SOURCE = """
object Conv1D[I, O] { weight: f32[I, O], bias: f32[O] }
object Mlp { up: Conv1D[D, 3 * D], down: Conv1D[3 * D, D] }
object Heads[E, H] { w: f32[E, H, E // H] }

def conv1d(c: Conv1D, x: f32[B, I]) -> f32[B, O]:
  return x @ c.weight + c.bias

def loss(p: Mlp, x: f32[B, D]) -> f32:
  y = conv1d(p.down, maximum(conv1d(p.up, x), 0.0))        # (no math library: the same bits)
  return sum(y * y)

def heads(h: Heads, x: f32[B, E]) -> f32[B, H, E // H]:
  return einsum("be,ehk->bhk", x, h.w)
"""
rng = np.random.default_rng(59)


def array(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def mlp(d: int) -> dict:
    return {"up": {"weight": array(d, 3 * d), "bias": array(3 * d)},
            "down": {"weight": array(3 * d, d), "bias": array(d)}}


@pytest.mark.parametrize("d, b", [(0, 2), (1, 0), (1, 1), (7, 3), (13, 5)])
def test_gradients_at_zero_one_and_prime_sizes_are_the_references_on_every_thread_count(d, b):
    p, x = mlp(d), array(b, d)
    run = lambda prog: (prog.loss(p, x), prog.grad("loss", wrt="p")(p, x))     # noqa: E731
    want = run(dsl.loads(SOURCE))
    got = on_every_thread_count(lambda: run(dsl.loads(SOURCE, device="cpu")))
    assert bits(got) == bits(want)
    assert {k: {f: a.shape for f, a in c.items()} for k, c in want[1].items()} == \
           {k: {f: a.shape for f, a in c.items()} for k, c in p.items()}
    if d == 0 or b == 0:                                   # nothing flows: zeros, and a sum of none
        assert all(not a.any() for c in want[1].values() for a in c.values())


@pytest.mark.parametrize("e, h", [(3, 2), (7, 3), (0, 1), (1, 1)])
def test_a_floor_division_of_parameters_is_computed_and_checked(e, h):
    """`Heads[E, H]`'s `E // H` is the quotient once E and H are known: a field of another size
    is refused (it was accepted, and the result broke its declared shape)."""
    prog = dsl.loads(SOURCE, name="heads.bend")
    x, w = array(2, e), array(e, h, e // h)
    assert prog.heads({"w": w}, x).shape == (2, h, e // h)
    wrong = array(e, h, e // h + 1)
    raises(lambda: prog.heads({"w": wrong}, x),
           f"field 'w' of Heads: expected f32[{e}, {h}, {e // h}], got f32[{e}, {h}, {e // h + 1}]")


def test_named_arrays_of_a_wrong_floor_division_are_a_diagnostic(tmp_path):
    (tmp_path / "m.bend").write_text(DIMENSIONS)
    np.savez(tmp_path / "in.npz", **{"p.a.weight": array(2, 3), "p.a.bias": array(3),
                                     "p.b.w": array(3, 2, 2), "x": array(4, 2)})
    user_error(dslc("run", str(tmp_path / "m.bend"), "--entry", "pair", "--inputs", str(tmp_path / "in.npz")),
               "field 'w' of Heads: expected f32[3, 2, 1], got f32[3, 2, 2]")


WRONG = {
    "a missing field": ({"weight": array(2, 6)}, "'p.up' lacks the field 'bias' of Conv1D"),
    "an extra field": ({"bias": array(6), "weight": array(2, 6), "scale": array(6)},
                       "'p.up' has a field 'scale' that Conv1D does not have"),
    "a wrong dtype": ({"weight": array(2, 6).astype(np.float64), "bias": array(6)},
                      "field 'up' of Mlp: field 'weight' of Conv1D: expected f32[D, 3 * D], got f64[2, 6]"),
    "a wrong rank": ({"weight": array(2, 6, 1), "bias": array(6)},
                     "field 'weight' of Conv1D: expected f32[D, 3 * D], got f32[2, 6, 1]"),
    "not a record": (None, "'p.up' must be a Conv1D record"),
}


@pytest.mark.parametrize("case", WRONG)
def test_a_wrong_record_from_python_is_a_located_diagnostic(case):
    up, fragment = WRONG[case]
    p = {**mlp(2), "up": up}
    for device in ("reference", "cpu"):
        error = raises(lambda: dsl.loads(SOURCE, device=device).loss(p, array(1, 2)), fragment)
        assert error.diagnostics[0].span is not None
