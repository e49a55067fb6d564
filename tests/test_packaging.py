"""What `pip install` brings, as pyproject.toml declares it: the compiler and what it needs,
and the examples' data packages only with the `examples` extra."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

PROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+(\[[a-z,]+\])?", r).group(0).lower() for r in requirements}


def test_the_core_installs_no_example_data():
    core = names(PROJECT["dependencies"])
    assert {"lark", "llvmlite", "ml_dtypes", "numpy", "scipy", "safetensors"} <= core
    assert not core & {"names", "scikit-learn", "torch"}


def test_the_examples_and_test_extras():
    extras = PROJECT["optional-dependencies"]
    assert names(extras["examples"]) == {"names", "scikit-learn"}
    test_extras = {m.group(1) for r in extras["test"] if (m := re.fullmatch(r"dslc\[([a-z,]+)\]", r))}
    assert {"examples", "plot"} <= set(",".join(test_extras).split(","))
