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
from frontend.limits import (MAX_DIAGNOSTICS, MAX_EXCERPT, MAX_NESTING, MAX_RANK, MAX_SOURCE_BYTES,
                             MAX_UNROLLED)

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
RECURSION = CORPUS / "valid" / "53_generic_static_recursion.bend"
check_file("warm.bend", "def f(x):\n  return x\n")     # the parser is built once, at first use


def checked_within(seconds: float, path: str, text: str | None):
    """check_file(path, text)'s error (None if it checks), which must come within `seconds` of
    CPU time (the process's: the checker runs on a thread of its own; a loaded machine's
    other work is not counted)."""
    start = time.process_time()
    try:
        check_file(path, text)
        error = None
    except DslError as e:
        error = e
    elapsed = time.process_time() - start
    assert elapsed < seconds, f"checking took {elapsed:.1f} s of CPU time"
    return error


# ---------------------------------------------------------------- static recursion

def test_generic_static_recursion_is_checked_once():
    """rep(n - 1, …) under `switch n` and fork(d + 1, …) under `when d < depth`, n and depth
    unknown: typed by the signature, not unrolled until the 256-call limit (or forever)."""
    assert checked_within(1.0, str(RECURSION), RECURSION.read_text()) is None


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_static_recursion_unrolls_for_known_values(device: str):
    prog = dsl.loads(RECURSION.read_text(), name=str(RECURSION), device=device)
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


def test_static_recursion_that_branches_too_much_is_a_diagnostic():
    """A bend whose two forks differ in a static int (2 * c, 2 * c + 1) unrolls 2 ** depth
    distinct steps: past MAX_UNROLLED, a diagnostic at the fork, within a second or two."""
    text = ("def code(depth: int, x: f32[N]) -> f32[N]:\n  bend d = 0, c = 0, y = x:\n"
            "    when d < depth:\n      r = fork(d + 1, 2 * c, y) + fork(d + 1, 2 * c + 1, y)\n"
            "    else:\n      r = y * c\n  return r\n\n"
            "def main(x: f32[N]) -> f32[N]:\n  return code(40, x)\n")
    err = checked_within(3.0, "code.bend", text)
    assert err is not None and f"more than {MAX_UNROLLED:,} calls, forks and fold steps" in err.message, err
    assert err.span.line == 4
    assert checked_within(1.0, "code.bend", text.replace("code(40, x)", "code(8, x)")) is None


def test_folds_over_long_lists_are_a_diagnostic():
    """Folds over static lists are unrolled: 30 ** 3 steps pass MAX_UNROLLED."""
    items = ", ".join(["1.0"] * 30)
    text = (HEAD + f"  l = [{items}]\n  fold a in l with s = x:\n    fold b in l with t = s:\n"
            "      fold c in l with u = t:\n        u = u + c\n      t = u\n    s = t\n  return s\n")
    err = checked_within(3.0, "folds.bend", text)
    assert err is not None and "fold steps unrolled" in err.message, err
    assert len(err.diagnostics) == 1 and (err.span.line, err.span.col) == (5, 17)


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


# ---------------------------------------------------------------- limits

HEAD = "def f(x: f32[N]) -> f32[N]:\n"

NESTED = {                      # n levels of each kind of nesting, in a function of x
    "brackets": lambda n: f"  return {'(' * n}x{')' * n}\n",
    "calls": lambda n: f"  return {'tanh(' * n}x{')' * n}\n",
    "lists": lambda n: f"  y = {'[' * n}1{']' * n}\n  return x\n",
    "lambdas": lambda n: f"  return map({'lambda a: ' * n}a, x)\n",
    "prefix operators": lambda n: f"  return {'-' * n}x\n",
    "powers": lambda n: f"  return x{' ** x' * n}\n",
    "an operator chain": lambda n: f"  return x{' + x' * n}\n",
    "indexing": lambda n: f"  return x{'[:]' * n}\n",
    "blocks": lambda n: "".join(" " * (i + 1) + "if True:\n" for i in range(n)) + " " * (n + 1) + "return x\n",
}


@pytest.mark.parametrize("kind", NESTED)
@pytest.mark.parametrize("n", [1000, 10_000])
def test_deep_nesting_is_a_diagnostic(kind: str, n: int):
    if kind == "blocks" and n > 1000:
        pytest.skip("10,000 blocks are 50 MB of indentation: the size limit's case")
    """10,000 nested lambdas took 12 s and 4 GB; nested brackets and operators exhausted the
    stack: past MAX_NESTING levels, one diagnostic where the limit is passed."""
    err = checked_within(1.0 if n <= 1000 else 3.0, "deep.bend", HEAD + NESTED[kind](n))
    assert err is not None and f"nested more than {MAX_NESTING} deep" in err.message, err
    assert err.span is not None and err.span.line >= 2
    assert len(err.diagnostics) == 1 and len(str(err)) < 1000


@pytest.mark.parametrize("kind", NESTED)
def test_nesting_within_the_limit_checks(kind: str):
    n = MAX_NESTING - 10
    err = checked_within(2.0, "deep.bend", HEAD + NESTED[kind](n))
    assert err is None or "nested" not in err.message, err


def test_a_source_over_the_size_limit_is_refused_unread(tmp_path):
    """A 50 MB source took over 5 minutes to reach a diagnostic."""
    body = HEAD + "  return x\n"
    padding = "# " + "x" * 78 + "\n"
    text = body + padding * (MAX_SOURCE_BYTES // len(padding) + 1)
    err = checked_within(1.0, "big.bend", text)
    assert err is not None and "may have at most" in err.message
    assert (err.span.line, err.span.col) == (1, 1)
    path = tmp_path / "big.bend"
    path.write_text(text * 20)
    err = checked_within(1.0, str(path), None)
    assert err is not None and f"{len(text) * 20:,} bytes" in err.message
    (tmp_path / "main.bend").write_text("from big import f\n\ndef g(x: f32[N]) -> f32[N]:\n  return f(x)\n")
    err = checked_within(1.0, str(tmp_path / "main.bend"), None)
    assert err is not None and err.span.source.path == str(path) and "may have at most" in err.message


@pytest.mark.parametrize("source, where", [
    (HEAD + "  y = zeros([" + "1, " * 10_000 + "1])\n  return x\n", (2, 13)),
    (HEAD + "  y = reshape(x, [" + "1, " * (MAX_RANK) + "N])\n  return x\n", (2, 18)),
    ("def f(x: f32[" + "1, " * MAX_RANK + "N]) -> f32[N]:\n  return x\n", (1, 14 + 3 * MAX_RANK)),
])
def test_a_rank_over_the_limit_is_a_diagnostic(source: str, where):
    """A 100,000-dimension zeros([1, 1, …]) took 50 s (now 3 s, all of it parsing 300 KB)."""
    err = checked_within(1.0, "rank.bend", source)
    assert err is not None and f"at most {MAX_RANK}" in err.message, err
    assert (err.span.line, err.span.col) == where


def test_a_rank_at_the_limit_checks():
    assert checked_within(1.0, "rank.bend", HEAD + "  y = zeros([" + "1, " * (MAX_RANK - 1)
                          + "1])\n  return x\n") is None


def test_many_errors_are_reported_up_to_the_limit():
    text = HEAD + "".join(f"  y{i} = undefined{i}\n" for i in range(3 * MAX_DIAGNOSTICS)) + "  return x\n"
    err = checked_within(2.0, "many.bend", text)
    assert len(err.diagnostics) == MAX_DIAGNOSTICS
    assert f"{2 * MAX_DIAGNOSTICS:,} more errors" in err.diagnostics[-1].notes[-1].message


def test_a_long_line_is_shown_around_the_error():
    err = checked_within(2.0, "long.bend", HEAD + "  return x" + " + x" * 50 + " + y" + " + x" * 100 + "\n")
    source_line, caret = str(err).split("\n")[1:3]
    assert len(source_line) < MAX_EXCERPT + 20 and source_line.endswith("…")
    assert source_line[caret.index("^")] == "y"


# ---------------------------------------------------------------- programs that crashed

TRIVIAL = CORPUS / "valid" / "54_fold_state_is_an_existing_value.bend"


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_a_fold_whose_state_is_an_existing_value_runs(device: str):
    """`s = x` left the scan's body without ops; the IR passes then dropped it (exit 3)."""
    prog = dsl.loads(TRIVIAL.read_text(), name=str(TRIVIAL), device=device)
    xs = np.arange(6, dtype=np.float32).reshape(3, 2)
    a, b = np.float32([1, 2]), np.float32([3, 4])
    np.testing.assert_array_equal(prog.last(xs), xs[-1])
    np.testing.assert_array_equal(prog.last(xs[:0]), np.zeros(2, np.float32))
    np.testing.assert_array_equal(prog.scaled(xs), xs[-1])
    p, q = prog.swap(xs, a, b)                     # three swaps
    np.testing.assert_array_equal(p, b)
    np.testing.assert_array_equal(q, a)
    ys, s = prog.emits(xs)
    np.testing.assert_array_equal(ys, xs)
    np.testing.assert_array_equal(s, xs[-1])
    np.testing.assert_array_equal(prog.dloss(xs), np.float32([[0, 0], [0, 0], [8, 10]]))
    np.testing.assert_array_equal(prog.same(a), a)
