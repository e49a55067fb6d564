"""The front end never fails in any way but a diagnostic: mutated valid programs either check
or raise DslError, each within a second (hypothesis' deadline)."""
from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontend.check import check_file
from frontend.diagnostics import DslError

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "valid"
PROGRAMS = {p: p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("[0-9][0-9]_*.bend"))}
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


@settings(max_examples=EXAMPLES, deadline=timedelta(seconds=1),
          derandomize=os.environ.get("DSLC_FUZZ_RANDOM") is None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated())
def test_mutated_programs_check_or_diagnose(case):
    path, text = case
    try:
        check_file(str(path), text)
    except DslError as e:
        assert e.diagnostics and str(e)


@settings(max_examples=200, deadline=timedelta(seconds=1), derandomize=True)
@given(st.text(max_size=200))
def test_arbitrary_text_checks_or_diagnoses(text):
    try:
        check_file("random.bend", text)
    except DslError as e:
        assert str(e)
