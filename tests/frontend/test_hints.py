"""Diagnostics that name the fix (docs/language.md §13): each mistake a Python or PyTorch user
makes gets one diagnostic, at the mistake, that says what to write instead."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import dsl

from frontend.check import check_file
from frontend.diagnostics import DslError

FOLD_FOR = ("dslc has no 'for' loop: fold walks a tensor's leading axis or a list, "
            "e.g. 'fold t in arange(T) with h = h0:'")
FOLD_WHILE = ("dslc has no 'while' loop: the number of steps is static; fold over arange(n), "
              "e.g. 'fold i in arange(n) with x = x0:', or recurse with bend")
MAP = "to make a list from another, use map, e.g. map(lambda k: init(k, D), split(key, L))"

CASES = {
    "for": ("""
        def f(xs: f32[T, N]) -> f32[N]:
          h = zeros([N])
          for t in range(T):
            h = h + xs[t]
          return h
        """, 4, 3, FOLD_FOR),
    "for over a list": ("""
        def f(ws: List(f32[N, N]), x: f32[N]) -> f32[N]:
          for W in ws: x = x @ W
          return x
        """, 3, 3, FOLD_FOR),
    "while": ("""
        def f(x: f32[N]) -> f32[N]:
          while True:
            x = x * 0.5
          return x
        """, 3, 3, FOLD_WHILE),
    "max of two": ("""
        def f(x: f32[N]) -> f32[N]:
          return max(x, 0.0)
        """, 3, 17, "'max' reduces one tensor, and its second argument is an axis, got float; "
                    "the elementwise maximum of two values is maximum(a, b)"),
    "min of two tensors": ("""
        def f(x: f32[N], y: f32[N]) -> f32[N]:
          return min(x, y)
        """, 3, 17, "'min' reduces one tensor, and its second argument is an axis, got f32[N]; "
                    "the elementwise minimum of two values is minimum(a, b)"),
    "standard library name": ("""
        def f(x: f32[B, V], y: i32[B]) -> f32:
          return cross_entropy(x, y)
        """, 3, 10, "undefined name 'cross_entropy'; the standard library defines it: "
                    "from nn import cross_entropy"),
    "misspelt standard library name": ("""
        def f(p: f32[N], g: f32[N], s: (i32, f32[N], f32[N])):
          return adam(p, g, s)
        """, 3, 10, "undefined name 'adam' (did you mean 'adamw'? from optim import adamw)"),
    "misspelt local": ("""
        def f(hidden: f32[N]) -> f32[N]:
          return tanh(hiden)
        """, 3, 15, "undefined name 'hiden' (did you mean 'hidden'?)"),
    "misspelt primitive": ("""
        def f(x: f32[N]) -> f32[N]:
          return sigmiod(x)
        """, 3, 10, "undefined name 'sigmiod' (did you mean 'sigmoid'?)"),
    "list grown in a fold": ("""
        def f(key: Key, L: int) -> List(f32[4]):
          fold k in split(key, L) with xs = []:
            xs = xs + [normal(k, [4])]
          return xs
        """, 4, 5, "the fold state 'xs' changes type in the body: List(?)[0] before a step, "
                   f"List(f32[4])[1] after; {MAP}"),
    "list changed by a scan": ("""
        def f(k: Key, ts: f32[T]) -> List(Key):
          fold t in ts with ks = split(k, 2):
            ks = [ks[0]]
          return ks
        """, 4, 5, f"the fold state 'ks' changes type in the body: List(Key)[2] before a step, "
                   f"List(Key)[1] after; {MAP}"),
    "records stacked by a fold": ("""
        object Layer { W: f32[D, D] }
        def init(key: Key, D: int) -> List(Layer):
          layers = fold k in split(key, 3):
            return Layer { W: normal(k, [D, D]) }
          return layers
        """, 6, 10, f"expected a List, got Layer (a fold stacks what it emits; {MAP})"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_mistake_gets_one_diagnostic_that_names_the_fix(name):
    source, line, col, message = CASES[name]
    with pytest.raises(DslError) as info:
        check_file("hint.bend", textwrap.dedent(source))
    [d] = info.value.diagnostics
    assert (d.span.line, d.span.col) == (line, col), d.render()
    assert message in d.message, d.render()


ASSERT_IN_A_FOLD = textwrap.dedent("""
    def heads(x: f32[B, T, D], H: int):
      assert D % H == 0, "the number of heads must divide D"
      return x * 2.0 + zeros([B, T, D])

    def forward(x: f32[2, 3, 6]) -> f32[2, 3, 6]:
      fold k in [1, 2, 3] with h = x:
        h = heads(h, 4)
      return h
    """)


@pytest.mark.parametrize("how", ["check", "reference", "cpu"])
def test_a_failed_assert_in_a_helper_folded_over_a_list_is_reported_once(how):
    """The fold's later steps call the helper with the unknown value the failure left: checking,
    the dimension names its annotation would bind are unknown then, not undefined; specialising
    for a call, the helper is not run again."""
    if how == "check":
        run = lambda: check_file("assert.bend", ASSERT_IN_A_FOLD)
    else:
        run = lambda: dsl.loads(ASSERT_IN_A_FOLD, name="assert.bend", device=how).forward(
            np.zeros((2, 3, 6), np.float32))
    with pytest.raises(DslError) as info:
        run()
    [d] = info.value.diagnostics
    assert d.message == "assertion failed: the number of heads must divide D"
    assert (d.span.line, d.span.col) == (3, 10)
