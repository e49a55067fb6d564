"""Every example of the language reference (docs/language.md) is a tested program.

A ```bend block must pass `dslc check`'s front end; a ```bend-error block starts with a line
`# error: TEXT` and must be rejected with a DslError whose diagnostics contain TEXT. A
block whose info string names a file (```bend file=shapes.bend) is also written under that
name into the folder the examples are checked in, so that the other blocks can import it.
Snippets that are not whole programs are fenced ```text and are not checked.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from frontend.check import check_file
from frontend.diagnostics import DslError

DOC = Path(__file__).resolve().parent.parent / "docs" / "language.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
ERROR_LINE = re.compile(r"#\s*error:\s*(.+)")


def blocks() -> list[tuple[str, dict[str, str], str, int]]:
    """(kind, options, text, line) of each ```bend and ```bend-error block, in order."""
    doc = DOC.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(doc):
        kind, *opts = m[1].split()
        if kind in ("bend", "bend-error"):
            options = dict(o.split("=", 1) for o in opts)
            out.append((kind, options, m[2], doc.count("\n", 0, m.start()) + 1))
    return out


BLOCKS = blocks()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder holding the modules the reference defines (file=…), for its imports."""
    path = tmp_path_factory.mktemp("doc")
    for _, options, text, _ in BLOCKS:
        if "file" in options:
            (path / options["file"]).write_text(text, encoding="utf-8")
    return path


def test_the_reference_has_examples():
    kinds = [kind for kind, _, _, _ in BLOCKS]
    assert kinds.count("bend") >= 50 and kinds.count("bend-error") >= 10


@pytest.mark.parametrize("kind, options, text, line", BLOCKS,
                         ids=[f"line{line}" for _, _, _, line in BLOCKS])
def test_example(kind, options, text, line, folder, monkeypatch):
    monkeypatch.chdir(folder)
    monkeypatch.delenv("DSL_PATH", raising=False)
    name = options.get("file", "doc.bend")
    if kind == "bend":
        try:
            check_file(name, text)
        except DslError as e:
            pytest.fail(f"the example at docs/language.md:{line} is rejected:\n{e}")
        return
    expected = ERROR_LINE.fullmatch(text.lstrip().splitlines()[0].strip())
    assert expected, f"docs/language.md:{line}: a bend-error block starts with '# error: …'"
    with pytest.raises(DslError) as info:
        check_file(name, text)
    assert expected[1].strip() in str(info.value), (
        f"docs/language.md:{line}: expected '{expected[1].strip()}' in:\n{info.value}")


def test_the_architecture_page_names_every_host_primitive():
    """docs/architecture.md's table of host steps: each primitive that always runs on the host
    is named there (in backquotes, by its surface name or its IR name)."""
    from ir.ops import REGISTRY
    from ir.ops.base import Role
    page = (DOC.parent / "architecture.md").read_text(encoding="utf-8")
    table = page.split("### What runs on the host, and why")[1].split("\n## ")[0]
    named = set(re.findall(r"`([a-z_]+)`", table))
    for name, p in REGISTRY.items():
        if p.role is Role.HOST:
            assert name in named or p.surface in named, f"{name} is missing from the host table"
