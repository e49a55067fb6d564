"""Diagnostics that the attacks on bf16 and records found wrong: the argument blamed for a
contradiction, negative sizes, counts in the singular, bf16 arrays from files and from JAX, and
NumPy's warnings on values the language defines."""
from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import dsl
from conftest import dslc, raises, user_error

BF16 = ml_dtypes.bfloat16
H4 = """
def h4(y: f32[E + H], x: f32[E, H]) -> f32:
  return sum(y) + sum(x)
"""


def test_a_contradiction_is_blamed_on_the_argument_whose_sizes_it_contradicts():
    """y's E + H waits for x to bind E and H: a wrong y is y's error, shown with y's types
    (it was 'argument 'x' of 'h4': expected f32[5], got f32[4]')."""
    prog = dsl.loads(H4, name="h4.bend")
    e = raises(lambda: prog.h4(np.zeros(4, np.float32), np.zeros((2, 3), np.float32)),
               "h4.bend:2:5: error: argument 'y' of 'h4': expected f32[5], got f32[4]",
               "note: 'y' is declared here")
    assert "'x'" not in str(e)
    assert prog.h4(np.ones(5, np.float32), np.ones((2, 3), np.float32)) == 11


@pytest.mark.parametrize("source, where", [
    ("object C[I, O] { w: f32[I, O] }\ndef f(c: C[-1, 3]) -> f32:\n  return sum(c.w)\n", "2:12"),
    ("def f(w: f32[-1]) -> f32:\n  return sum(w)\n", "1:14"),
    ("def f(w: f32[2, 1 - 3]) -> f32:\n  return sum(w)\n", "1:17"),
])
def test_a_negative_size_in_an_annotation_is_refused_by_the_check(tmp_path, source, where):
    (tmp_path / "n.bend").write_text(source)
    user_error(dslc("check", str(tmp_path / "n.bend")), f"n.bend:{where}: error: the size '",
               "' is -", "a dimension cannot be negative")


def test_a_size_that_static_arguments_make_negative_is_refused_before_the_call():
    prog = dsl.loads("def f(w: f32[K - 1], K: int) -> f32:\n  return sum(w)\n", name="k.bend")
    raises(lambda: prog.f(np.zeros(0, np.float32), 0),
           "k.bend:1:5: error: argument 'w' of 'f': f32[-1] has the size K - 1 = -1: "
           "a dimension cannot be negative")
    assert prog.f(np.ones(2, np.float32), 3) == 2


def test_counts_of_one_are_singular():
    prog = dsl.loads("def s(x: f32) -> f32:\n  return x\n"
                     "def e(x: f32[N]) -> f32:\n  return einsum('i->', x, x)\n", name="s.bend")
    raises(lambda: prog.s(1.0, 2.0), "'s' takes 1 argument but 2 were given")
    raises(lambda: prog.e(np.zeros(2, np.float32)), "einsum spec 'i->' names 1 operand, but 2 were given")


def test_a_bf16_member_of_an_npz_is_named_with_its_remedy(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones(3, BF16))          # NumPy writes it as |V2
    (tmp_path / "b.bend").write_text("def b(x: bf16[N]) -> f32:\n  return sum(cast(x, f32))\n")
    user_error(dslc("run", str(tmp_path / "b.bend"), "--entry", "b", "--inputs", str(tmp_path / "in.npz")),
               "member 'x.npy' has dtype |V2", "what NumPy writes for a bf16 array",
               "save it as float32 (exactly: a.astype(np.float32))")


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_a_jax_bf16_array_is_read_as_the_ml_dtypes_array_it_is(device):
    jnp = pytest.importorskip("jax.numpy")
    x = np.array([1.5, -2.0, 3.25, 2 ** -10], np.float32).astype(BF16)
    prog = dsl.loads("def b(x: bf16[N]) -> bf16[N]:\n  return x * x\n", device=device)
    got = prog.b(jnp.asarray(x))
    assert got.dtype == BF16 and got.tobytes() == (x * x).tobytes()


def test_values_the_language_defines_raise_no_numpy_warning():
    """A literal beyond f32 is inf, and NaN and inf cast to i32 are INT_MIN (docs/numerics.md):
    NumPy's 'overflow' and 'invalid value encountered in cast' are not the user's to see."""
    prog = dsl.loads("def k() -> i32:\n  return cast(1e300, i32)\n"
                     "def c(x: f32[N]) -> i32[N]:\n  return cast(x, i32)\n", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prog.k() == np.iinfo(np.int32).min
        got = prog.c(np.array([np.nan, np.inf, -1.5], np.float32))
    assert got.tolist() == [np.iinfo(np.int32).min, np.iinfo(np.int32).min, -1]


def test_an_error_in_a_function_reached_only_through_its_gradient_is_a_diagnostic():
    """Lowering went on with the unknown value the error left (an AttributeError)."""
    source = ("def loss(w: f32[5, 3], s: int) -> f32:\n"
              "  return mean(tanh(w) * bernoulli(key(s), 0.8, [5, 3]))\n\n"
              "def g(w: f32[5, 3], s: int) -> (f32, f32[5, 3]):\n"
              "  return value_and_grad(loss, wrt=w)(w, s)\n")
    raises(lambda: dsl.loads(source, name="m.bend").g(np.ones((5, 3), np.float32), 3),
           "m.bend:2:23: error: cannot mix f32[5, 3] and bool[5, 3] in '*'", "note: in 'loss' called from m.bend:5:10")
