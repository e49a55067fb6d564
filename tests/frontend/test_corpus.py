"""The front end's corpus: every program under tests/corpus/valid checks cleanly, and every
program under tests/corpus/invalid fails with exactly the diagnostics its header declares.

An invalid program starts with a block of comment lines such as

    # error: 12:9: shape mismatch in '@'
    # note: p.W1 is f32[T * E, V]
    # error: cycle_b.bend:3:6: import cycle

one `# error:` line per expected diagnostic, in source order: the 1-based line and column of
the caret (optionally in another file, named relative to the program's folder) and a part of
the message. `# note:` lines belong to the error above them: each names a part of one of its
notes. Only files named NN_*.bend are programs; the others are modules they import.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                      # run from anywhere, installed or not
    sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "tests" / "corpus"
PROGRAM = re.compile(r"\d{2,}_")              # NN_name.bend, numbered from 00
VALID = sorted(p for p in (CORPUS / "valid").glob("*.bend") if PROGRAM.match(p.name))
INVALID = sorted(p for p in (CORPUS / "invalid").glob("*.bend") if PROGRAM.match(p.name))

ERROR = re.compile(r"#\s*error:\s*(?:(?P<file>[^:\s]+\.bend):)?(?P<line>\d+):(?P<col>\d+):\s*(?P<text>.+?)\s*$")
NOTE = re.compile(r"#\s*note:\s*(?P<text>.+?)\s*$")


@dataclass
class Expected:
    path: Path
    line: int
    col: int
    text: str
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        notes = "".join(f"\n    note: {n}" for n in self.notes)
        return f"{self.path.name}:{self.line}:{self.col}: {self.text}{notes}"


def expectations(path: Path) -> list[Expected]:
    """The `# error:` / `# note:` header of a program (its leading comment lines)."""
    out: list[Expected] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line.startswith("#"):
            break
        if m := ERROR.match(line):
            where = path.parent / m["file"] if m["file"] else path
            out.append(Expected(where, int(m["line"]), int(m["col"]), m["text"]))
        elif m := NOTE.match(line):
            assert out, f"{path.name}: a '# note:' line must follow an '# error:' line"
            out[-1].notes.append(m["text"])
    return out


def same_file(a: str | Path, b: str | Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def checker():
    """frontend.check, or a skip while it is not written; a checker that fails to import fails."""
    if importlib.util.find_spec("frontend.check") is None:
        pytest.skip("the checker (frontend/check.py) is not written yet")
    return importlib.import_module("frontend.check")


def describe(diagnostics) -> str:
    return "\n".join(d.render() for d in diagnostics)


def test_corpus_is_large_enough():
    assert len(VALID) >= 40, f"only {len(VALID)} valid programs"
    assert len(INVALID) >= 60, f"only {len(INVALID)} invalid programs"


def test_every_invalid_program_declares_its_errors():
    for path in INVALID:
        assert expectations(path), f"{path.name} has no '# error: LINE:COL: MESSAGE' header"


def test_helper_modules_are_not_programs():
    """Modules that programs import must not look like programs (NN_name.bend)."""
    for folder in ("valid", "invalid"):
        for path in (CORPUS / folder).glob("*.bend"):
            if not PROGRAM.match(path.name):
                assert not path.name[0].isdigit(), path.name


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_program_checks(path: Path):
    check = checker()
    from frontend.diagnostics import DslError
    try:
        check.check_file(str(path))
    except DslError as err:
        pytest.fail(f"{path.name} should check cleanly, but:\n{err}")


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_program_reports_its_errors(path: Path):
    check = checker()
    from frontend.diagnostics import DslError
    expected = expectations(path)
    with pytest.raises(DslError) as info:
        check.check_file(str(path))
    err = info.value
    got = err.diagnostics
    listing = (f"expected:\n  " + "\n  ".join(map(str, expected)) +
               f"\ngot:\n{describe(got)}")
    assert len(got) == len(expected), f"{path.name}: wrong number of diagnostics\n{listing}"
    for want, d in zip(expected, got):
        assert d.span is not None, f"{path.name}: a diagnostic without a position\n{listing}"
        assert same_file(d.span.source.path, want.path), f"{path.name}: wrong file\n{listing}"
        assert (d.span.line, d.span.col) == (want.line, want.col), \
            f"{path.name}: wrong position\n{listing}"
        assert want.text in d.message, f"{path.name}: wrong message\n{listing}"
        notes = [n.message for n in d.notes]
        for text in want.notes:
            assert any(text in n for n in notes), f"{path.name}: missing note {text!r}\n{listing}"
    first = expected[0]
    head = str(err).split("\n", 1)[0]
    tail = f":{first.line}:{first.col}: error:"
    if first.path == path:
        assert head.startswith(f"{path}{tail}"), \
            f"{path.name}: the rendering should begin with '{path}{tail}', got {head!r}"
    else:      # reported in an imported module: compare the file itself, not its spelling
        shown = head.partition(tail)[0]
        assert tail in head and same_file(shown, first.path), \
            f"{path.name}: the rendering should begin with '{first.path}{tail}', got {head!r}"
