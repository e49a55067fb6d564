"""The bad-input corpus (tests/inputs/cases.toml): what each input that once crashed, hung,
showed a traceback or gave a silently wrong answer gets now, from the command line and from the
Python API. Each command runs in a child process, so a crash is a failure of its case alone."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import dsl

INPUTS = Path(__file__).parent / "inputs"
FILES = INPUTS / "files"
CASES = tomllib.loads((INPUTS / "cases.toml").read_text())
# the record the [[api]] cases pass where the model wants its parameters
P = {"W": np.zeros((4, 3), np.float32), "bias": np.zeros(3, np.float32)}


def label(case: dict) -> str:
    return " ".join(case.get("args") or [case["code"]])[:60]


@pytest.mark.parametrize("case", CASES["cli"], ids=label)
def test_the_command_line_answers_a_bad_input_with_a_diagnostic(case, tmp_path):
    args = [a.replace("{out}", str(tmp_path / "out")) for a in case["args"]]
    done = subprocess.run([sys.executable, "-m", "dsl", *args], cwd=FILES, capture_output=True,
                          text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == case["status"], output
    assert "Traceback" not in output and "internal error" not in output, output
    for text in case["says"]:
        assert text in output


@pytest.mark.parametrize("case", CASES["api"], ids=label)
def test_the_api_answers_a_bad_input_with_a_dsl_error(case):
    prog = dsl.load(str(FILES / case["file"]))
    with pytest.raises(dsl.DslError) as info:
        eval(case["code"], {"prog": prog, "np": np, "P": P})
    for text in case["says"]:
        assert text in str(info.value)
