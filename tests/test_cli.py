"""`dslc` as a user runs it: exit statuses, the diagnostic format, no tracebacks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

VALID = Path(__file__).parent / "corpus" / "valid" / "01_first_look.bend"


def dslc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsl", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_check_accepts_a_valid_program():
    r = dslc("check", str(VALID))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_check_reports_every_error_of_every_file_and_exits_1(tmp_path: Path):
    a = tmp_path / "a.bend"
    a.write_text("def f(x: f32[N]) -> f32[N]:\n  return x + y\n\ndef g(x: f32[N]) -> f32[N]:\n  return x @ 1\n")
    b = tmp_path / "b.bend"
    b.write_text("def h(x: u24[N]) -> f32[N]:\n  return x\n")
    r = dslc("check", str(a), str(b), str(VALID))
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == f"{a}:2:14: error: undefined name 'y'"
    assert lines[1:3] == ["    2 |   return x + y", "      |              ^"]
    assert f"{b}:1:10: error: 'u24' is not supported; use u32" in lines
    assert "Traceback" not in r.stderr


def test_diagnostic_shows_the_span_and_a_note_on_the_declaration(tmp_path: Path):
    src = tmp_path / "model.bend"
    src.write_text("object P { W1: f32[T * E, H] }\n\n"
                   "def f(p: P, x: f32[B, 64]) -> f32[B, H]:\n"
                   "  h = x @ p.W1\n"
                   "  return h\n")
    r = dslc("check", str(src))
    assert r.returncode == 1
    assert r.stderr.splitlines()[:3] == [
        f"{src}:4:9: error: shape mismatch in '@': f32[B, 64] @ f32[T * E, H]",
        "    4 |   h = x @ p.W1",
        "      |         ^",
    ]
    assert f"note: p.W1 is f32[T * E, H] ({src}:1)" in r.stderr


@pytest.mark.parametrize("args", [[], ["check"], ["frobnicate", "x.bend"], ["check", "--bogus", "x"]])
def test_usage_errors_exit_2(args):
    r = dslc(*args)
    assert r.returncode == 2
    assert "usage:" in r.stderr


def test_missing_file_is_a_user_error(tmp_path: Path):
    r = dslc("check", str(tmp_path / "nope.bend"))
    assert r.returncode == 1
    assert "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_version():
    r = dslc("--version")
    assert r.returncode == 0 and r.stdout.startswith("dslc ")
