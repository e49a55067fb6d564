"""What the front end does with input that once hung it, exhausted it or crashed it (the
limits of docs/language.md, "Limits and bad input"): a located diagnostic, quickly, or the
right result."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import dsl
from frontend.check import check_file
from frontend.diagnostics import DslError

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
RECURSION = CORPUS / "valid" / "53_generic_static_recursion.bend"


def checked_within(seconds: float, path: str, text: str):
    """check_file(path, text), which must finish (either way) within `seconds`."""
    start = time.perf_counter()
    try:
        check_file(path, text)
        error = None
    except DslError as e:
        error = e
    elapsed = time.perf_counter() - start
    assert elapsed < seconds, f"checking took {elapsed:.1f} s"
    return error


# ---------------------------------------------------------------- static recursion

def test_generic_static_recursion_is_checked_once():
    """rep(n - 1, …) under `switch n` and fork(d + 1, …) under `when d < depth`, n and depth
    unknown: typed by the signature, not unrolled until the 256-call limit (or forever)."""
    assert checked_within(1.0, str(RECURSION), RECURSION.read_text()) is None


def test_static_recursion_unrolls_for_known_values():
    prog = dsl.loads(RECURSION.read_text(), name=str(RECURSION), device="reference")
    x = np.array([1.5, 0.5, -2.0, 1.0], np.float32)
    np.testing.assert_array_equal(prog.rep(3, x), x ** 8)

    def tree(d, y):
        return y if d == 0 else tree(d - 1, y * np.float32(2)) + tree(d - 1, y + np.float32(1))
    np.testing.assert_array_equal(prog.tree(3, x), tree(3, x))
    np.testing.assert_allclose(prog.deepen(3, x), np.tanh(np.tanh(np.tanh(x))), rtol=1e-6)


def test_a_wrong_recursive_call_is_still_reported():
    """The call not unrolled is typed by the signature: here f32[N - 1], not the f32[N] declared."""
    text = ("def rep(n: int, x: f32[N]) -> f32[N]:\n  switch n:\n    case 0:\n      return x\n"
            "    case _:\n      return rep(n - 1, x[1:])\n")
    err = checked_within(1.0, "rep.bend", text)
    assert err is not None and "expected f32[N], got f32[N - 1]" in err.message
    assert (err.span.line, err.span.col) == (6, 14)


# ---------------------------------------------------------------- lexical

@pytest.mark.parametrize("number, col", [("٣", 14), ("３", 14), ("1３", 14), ("2.５", 14),
                                         ("1e٣", 14), ("0x1F٣", 14), ("7 + ３", 18)])
def test_non_ascii_digits_are_not_numbers(number: str, col: int):
    err = checked_within(1.0, "digits.bend", f"def f(x: f32[N]) -> f32[N]:\n  return x * {number}\n")
    assert err is not None and "is not an ASCII digit" in err.message, err
    assert (err.span.line, err.span.col) == (2, col)


def test_non_ascii_digits_in_a_dimension():
    err = checked_within(1.0, "dims.bend", "def f(x: f32[３]) -> f32[3]:\n  return x\n")
    assert err is not None and (err.span.line, err.span.col) == (1, 14), err
