"""The front end never fails in any way but a diagnostic: mutated valid programs either check
or raise DslError, each within a second of CPU time.

The second is the process's CPU time (the checker's thread included), kept by a watchdog,
not hypothesis' deadline: that one is wall-clock time, which a loaded machine stretches, and
it judges an example only after it returns, which one that hangs never does. Past the second
the check is stopped (an exception raised in its thread) and the example fails. The seed
programs are tests/corpus/valid, among them the static recursion that once hung the checker
(53_generic_static_recursion.bend)."""
from __future__ import annotations

import ctypes
import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontend.check import check_file
from frontend.diagnostics import DslError

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "valid"
PROGRAMS = {p: p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("[0-9][0-9]_*.bend"))}
SECONDS = 1.0                    # of CPU time, for one input
TOKEN = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d[\d_.eExXbB]*|\*\*|//|[-+*/@=<>!]=|.", re.S)
SPARE = ["def", "fold", "in", "with", "bend", "when", "else", "case", "_", "switch", "match",
         "return", "lambda", "#{", "#}", "#", ":", ",", "(", ")", "[", "]", "{", "}", "\n", "\t",
         "  ", "@", "**", "->", "/", ".", "...", "~", "0", "-1", "1e999", "0x", "u24", "f32[",
         "x", "Key", "List(", "type", "object", "grad", "map", "fork", "assert", "\"", "'", "\x00"]
EXAMPLES = int(os.environ.get("DSLC_FUZZ_EXAMPLES", "2000"))


@st.composite
def mutated(draw) -> tuple[Path, str]:
    path = draw(st.sampled_from(sorted(PROGRAMS)))
    tokens = TOKEN.findall(PROGRAMS[path])
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(tokens) - 1))
        action = draw(st.sampled_from(["delete", "insert", "swap", "duplicate", "byte", "truncate",
                                       "rename", "rename", "renumber"]))
        if action == "rename":         # keeps the program parseable: exercises the checker
            names = [t for t in tokens if t[:1].isalpha() or t[:1] == "_"]
            if names:
                j = draw(st.integers(0, len(tokens) - 1))
                tokens[j] = draw(st.sampled_from(names)) if tokens[j] in names else tokens[j]
        elif action == "renumber":
            numbers = [k for k, t in enumerate(tokens) if t[:1].isdigit()]
            if numbers:
                tokens[draw(st.sampled_from(numbers))] = str(draw(st.integers(-3, 70)))
        elif action == "delete":
            del tokens[i]
        elif action == "insert":
            tokens.insert(i, draw(st.sampled_from(SPARE + tokens)))
        elif action == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif action == "duplicate":
            tokens[i:i] = tokens[i:i + draw(st.integers(1, 12))]
        elif action == "byte":
            tokens.insert(i, draw(st.characters(max_codepoint=0x2FF)))
        else:
            tokens = tokens[:i]
        if not tokens:
            tokens = [" "]
    return path, "".join(tokens)


class TookTooLong(BaseException):
    """An input took more than SECONDS of CPU time to check (a BaseException, which no
    `except Exception` of the front end swallows)."""


@contextmanager
def cpu_deadline(seconds: float):
    """Stop the threads the block starts (check_file's worker) with TookTooLong once the
    process has spent `seconds` of CPU time in it; a watchdog thread keeps the time."""
    before = set(threading.enumerate())
    start = time.process_time()
    done = threading.Event()

    def watch():
        while not done.wait(0.02):
            if time.process_time() - start > seconds:
                for t in set(threading.enumerate()) - before - {watchdog}:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident),
                                                               ctypes.py_object(TookTooLong))
                return

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


def check_or_diagnose(path: str, text: str) -> None:
    """check_file(path, text) checks or raises DslError, within the deadline."""
    with cpu_deadline(SECONDS):
        try:
            check_file(path, text)
        except DslError as e:
            assert e.diagnostics and str(e)


check_file("warm.bend", "def f(x):\n  return x\n")     # the parser is built once, at first use


@settings(max_examples=EXAMPLES, deadline=None,
          derandomize=os.environ.get("DSLC_FUZZ_RANDOM") is None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated())
def test_mutated_programs_check_or_diagnose(case):
    path, text = case
    check_or_diagnose(str(path), text)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=200))
def test_arbitrary_text_checks_or_diagnoses(text):
    check_or_diagnose("random.bend", text)


def test_the_deadline_stops_a_check_that_hangs(monkeypatch):
    """The timer fails an input that never finishes, and stops its thread."""
    import frontend.check
    def forever(path, text):
        while True:
            pass
    monkeypatch.setattr(frontend.check, "load_program", forever)
    before = threading.active_count()                   # (other tests' threads live on)
    with pytest.raises(TookTooLong):
        check_or_diagnose("hang.bend", "")
    assert threading.active_count() == before
