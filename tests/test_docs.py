"""Every code block of README.md and docs/*.md is checked or run, and every `dslc` command the
docs show is one that dsl/cli.py's parser takes.

A fence's info string is a kind and options (`key=value`, quoted as in a shell):

- ```bend: a program `dslc check`'s front end accepts. ```bend-error: a program whose first
  line is `# error: TEXT` and that is rejected with TEXT among its diagnostics.
  `file=NAME` also writes the block (a bend-error block without its `# error:` line) under NAME
  into the folder where the examples run, for the imports, programs and commands of the others.
- ```python: run in that folder (on the reference interpreter, as the whole suite). With
  `not-run="WHY"` it is only compiled; with `excerpt=PATH` its code, comments aside, is a
  run of lines of PATH.
- ```console: `$ COMMAND` lines, each followed by what it prints (stdout and stderr; a line
  `…` stands for any lines). They run in order in one shell in that folder, `dslc` being this
  checkout's; with `not-run="WHY"` they are not run. Either way each `dslc` command in them is
  parsed by dslc's own parser.
- ```text: anything that is neither a program nor a command; it may hold no `$ ` line.

Any other kind is an error. In the prose, each `dslc SUB …` in backquotes names real
subcommands, flags and choices, and parses whole where it is a concrete command; a lone
`--flag` in backquotes is checked against the last `dslc SUB …` with arguments of its
paragraph, table row or list item. Every exit status the docs state is one that dslc exits with.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsl import cli
from frontend.check import check_file
from frontend.diagnostics import DslError

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.S | re.M)
ERROR_LINE = re.compile(r"#\s*error:\s*(.+)")
KINDS = ("bend", "bend-error", "python", "console", "text")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its kind and options, and its text (dedented)."""
    doc: str
    line: int
    kind: str
    options: tuple[tuple[str, str], ...]
    text: str

    def option(self, name: str) -> str | None:
        return dict(self.options).get(name)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    """Every fenced block of the docs, in order."""
    out = []
    for path in DOCS:
        doc = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(doc):
            kind, *opts = shlex.split(m["info"]) or [""]
            indent = len(m["indent"])
            text = "".join(line[indent:] for line in m["body"].splitlines(keepends=True))
            out.append(Block(path.relative_to(ROOT).as_posix(), doc.count("\n", 0, m.start()) + 1,
                             kind, tuple(tuple(o.split("=", 1)) for o in opts), text))
    return out


BLOCKS = blocks()


def of_kind(*kinds: str, runs: bool = False) -> list:
    """The blocks of these kinds (only those without `not-run` if `runs`), as test parameters."""
    return [pytest.param(b, id=str(b)) for b in BLOCKS
            if b.kind in kinds and not (runs and b.option("not-run") is not None)]


def file_text(block: Block) -> str:
    """What a block with `file=` writes: a bend-error block loses its `# error:` line."""
    if block.kind == "bend-error":
        return block.text.split("\n", 1)[1]
    return block.text


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder holding the files the docs define (file=…), where their examples run."""
    path = tmp_path_factory.mktemp("doc")
    for b in BLOCKS:
        if b.option("file"):
            (path / b.option("file")).write_text(file_text(b), encoding="utf-8")
    return path


def test_the_docs_have_examples_of_every_kind():
    kinds = [b.kind for b in BLOCKS]
    assert kinds.count("bend") >= 50 and kinds.count("bend-error") >= 10
    assert kinds.count("python") >= 3 and kinds.count("console") >= 3


@pytest.mark.parametrize("block", [pytest.param(b, id=str(b)) for b in BLOCKS])
def test_every_block_has_a_known_kind(block):
    assert block.kind in KINDS, f"{block}: a fence of kind {block.kind!r}; use one of {KINDS}"
    if block.option("not-run") is not None:
        assert block.kind in ("python", "console") and block.option("not-run").strip(), (
            f"{block}: not-run needs a reason, on a python or console block")


def test_file_names_are_unique():
    names = [b.option("file") for b in BLOCKS if b.option("file")]
    assert len(names) == len(set(names)), f"two blocks write one file: {sorted(names)}"


@pytest.mark.parametrize("block", of_kind("bend", "bend-error"))
def test_bend_example(block, folder, monkeypatch):
    monkeypatch.chdir(folder)
    monkeypatch.delenv("DSL_PATH", raising=False)
    name = block.option("file") or "doc.bend"
    if block.kind == "bend":
        try:
            check_file(name, block.text)
        except DslError as e:
            pytest.fail(f"the example at {block} is rejected:\n{e}")
        return
    expected = ERROR_LINE.fullmatch(block.text.lstrip().splitlines()[0].strip())
    assert expected, f"{block}: a bend-error block starts with '# error: …'"
    with pytest.raises(DslError) as info:
        check_file(name, block.text)
    assert expected[1].strip() in str(info.value), (
        f"{block}: expected '{expected[1].strip()}' in:\n{info.value}")


@pytest.mark.parametrize("block", of_kind("python"))
def test_python_example(block, folder, monkeypatch):
    code = compile(block.text, str(block), "exec")
    if block.option("excerpt"):
        source = (ROOT / block.option("excerpt")).read_text(encoding="utf-8")
        lines = [re.sub(r"\s+#.*", "", line) for line in block.text.splitlines()]
        assert "\n".join(lines) + "\n" in source, f"{block} is not a run of lines of {block.option('excerpt')}"
    if block.option("not-run") is None and block.option("excerpt") is None:
        monkeypatch.chdir(folder)
        exec(code, {"__name__": "__doc_example__"})


def test_text_blocks_hold_no_commands():
    for b in BLOCKS:
        if b.kind == "text":
            assert not re.search(r"^\$ ", b.text, re.M), f"{b}: a transcript is a console block"


# ---------------------------------------------------------------- dslc commands

PARSER = cli.parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (`dslc ir`, and deeper ones such as `dslc a b`)."""
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


SUBCOMMANDS = subcommands(PARSER)
PLACEHOLDER = re.compile(r"[\[\]…|]|^[A-Z][A-Z0-9_.]*$")


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def flag_problems(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """Flags of `words` that `parser` lacks, and values outside their flag's choices
    (`--level a|b` names several)."""
    options, problems = options_of(parser), []
    for i, word in enumerate(words):
        flag = word.strip("[]").split("=", 1)[0]
        if not flag.startswith("-") or flag in ("-", "--"):
            continue
        if flag not in options:
            problems.append(f"{parser.prog} has no option {flag}")
            continue
        value = words[i + 1].strip("[]") if i + 1 < len(words) else ""
        if options[flag].choices and value and not value.startswith("-") and "…" not in value:
            problems += [f"{parser.prog} {flag} has no choice {v!r}" for v in value.split("|")
                         if v not in options[flag].choices]
    return problems


def parse_problems(args: list[str]) -> list[str]:
    """What dslc's parser says of a whole command line, if it refuses it."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            PARSER.parse_args(args)
    except SystemExit as e:
        if e.code:
            return [f"dslc {' '.join(args)}: {err.getvalue().strip().splitlines()[-1]}"]
    return []


def word_problems(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """What is wrong with `parser`'s words: unknown subcommands (`a|b` names several), at any
    depth, and unknown flags and choices."""
    subs = subcommands(parser)
    if not subs or not words or words[0].startswith("-") or PLACEHOLDER.fullmatch(words[0]):
        return flag_problems(parser, words)
    names = words[0].split("|")
    return [f"{parser.prog} has no command {n!r}" for n in names if n not in subs] + [
        p for n in names if n in subs for p in word_problems(subs[n], words[1:])]


def command_problems(words: list[str], concrete: bool) -> list[str]:
    """What is wrong with `dslc WORDS…`; for a concrete command, whatever the parser refuses."""
    words = [w.replace("\\|", "|") for w in words]
    problems = word_problems(PARSER, words)
    if concrete and not problems:
        problems += parse_problems(words)
    return problems


def innermost(words: list[str]) -> argparse.ArgumentParser | None:
    """The subcommand's parser that `dslc WORDS…` reaches, if it names one."""
    parser = PARSER
    for word in words:
        if word not in subcommands(parser):
            break
        parser = subcommands(parser)[word]
    return None if parser is PARSER else parser


def is_dslc(word: str) -> bool:
    return word == "dslc" or word.endswith("/dslc")


def shell_commands(text: str) -> list[str]:
    """The commands of a console block: each `$ ` line with the lines that continue it (an
    open quote goes on)."""
    commands, current = [], None
    for line in text.splitlines():
        if current is not None:
            current += "\n" + line
        elif line.startswith("$ "):
            current = line[2:]
        else:
            continue
        try:
            shlex.split(current)
        except ValueError:
            continue
        commands.append(current)
        current = None
    return commands


def dslc_invocations(command: str) -> list[list[str]]:
    """The argument lists of each `dslc` in a shell command (`a && dslc … 2> err | b`)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    words, out, current = list(lexer), [], None
    for w, following in zip(words, words[1:] + [""]):
        if (w and set(w) <= set("();<>|&")) or (w.isdigit() and following.startswith(">")):
            out += [current] if current is not None else []
            current = None
        elif current is not None:
            current.append(w)
        elif is_dslc(w):
            current = []
    return out + ([current] if current is not None else [])


@pytest.mark.parametrize("block", of_kind("console"))
def test_console_commands_parse(block):
    problems = [p for c in shell_commands(block.text) for args in dslc_invocations(c)
                for p in command_problems(args, concrete=True)]
    assert not problems, f"{block}:\n" + "\n".join(problems)


def transcript(text: str) -> list[tuple[str, list[str]]]:
    """(command, the lines it prints) for each `$ ` command of a console block."""
    commands, out = shell_commands(text), []
    lines = text.splitlines()
    i = 0
    for command in commands:
        i += command.count("\n") + 1
        printed = []
        while i < len(lines) and not lines[i].startswith("$ "):
            printed.append(lines[i])
            i += 1
        out.append((command, printed))
    return out


def matches(expected: list[str], got: str) -> bool:
    """Whether the printed text is the expected lines, a line `…` standing for any lines."""
    pattern = "".join(r"(?:[^\n]*\n)*?" if line.strip() == "…" else re.escape(line.rstrip()) + r"[ \t]*\n"
                      for line in expected)
    return re.fullmatch(pattern, got.rstrip() + "\n" if got.strip() else "") is not None


@pytest.fixture(scope="module")
def shell_bin(tmp_path_factory) -> Path:
    """A folder of `dslc` and `python` for the transcripts: this checkout's, this interpreter."""
    path = tmp_path_factory.mktemp("bin")
    for name, run in (("dslc", "-m dsl "), ("python", "")):
        (path / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {run}"$@"\n')
        (path / name).chmod(0o755)
    return path


@pytest.mark.parametrize("block", of_kind("console", runs=True))
def test_console_transcript(block, folder, shell_bin):
    steps = transcript(block.text)
    mark = "@@dslc-docs-step@@"
    script = "exec 2>&1\n" + "".join(f"s=$?; printf '\\n{mark}\\n'; (exit $s); {c}\n" for c, _ in steps)
    env = dict(os.environ, PATH=f"{shell_bin}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT))
    r = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True,
                       text=True, timeout=300)
    outputs = r.stdout.split(f"\n{mark}\n")[1:]
    for (command, expected), got in zip(steps, outputs, strict=True):
        assert matches(expected, got), f"{block}: `{command}` printed\n{got}\ninstead of\n" + "\n".join(expected)


def prose_units(text: str) -> list[tuple[int, str]]:
    """(line, text) of each paragraph, table row and list item outside the fences."""
    text = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    units, start, current = [], 0, []
    for n, line in enumerate(text.splitlines(), 1):
        new = not line.strip() or line.lstrip().startswith("|") or re.match(r"\s*(- |\d+\. )", line)
        if new and current:
            units.append((start, " ".join(current)))
            current = []
        if line.strip():
            start = start if current else n
            current.append(line.strip())
    return units + ([(start, " ".join(current))] if current else [])


def prose_problems(doc: Path) -> list[str]:
    """What is wrong with the `dslc` commands and flags in backquotes of one page's prose."""
    problems = []
    for line, unit in prose_units(doc.read_text(encoding="utf-8")):
        context = None
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", unit):
            words = span.replace("\\|", "|").split()
            where = f"{doc.relative_to(ROOT)}:{line}: `{span}`"
            if is_dslc(words[0]):
                args = words[1:]
            elif words[0] in SUBCOMMANDS and len(words) > 1 and words[1].startswith("--"):
                args = words
            elif words[0].startswith("--") and context:
                problems += [f"{where}: {p}" for p in flag_problems(context, words)]
                continue
            else:
                context = None if len(words) > 1 else context
                continue
            context = innermost(args) if len(args) > 1 else context   # not a bare `dslc run`
            concrete = len(args) > 1 and not args[1].startswith("-") and not any(map(PLACEHOLDER.search, args))
            problems += [f"{where}: {p}" for p in command_problems(args, concrete)]
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_commands_in_the_prose_are_dslcs(doc):
    problems = prose_problems(doc)
    assert not problems, "\n".join(problems)


def test_the_paths_the_docs_name_exist():
    """Each path into the repository the docs name (`examples/gpt2.py`, `dsl/lib/`) exists; a
    part in capitals (`examples/NAME.bend`) is a placeholder."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"(?<![\w/.`-])((?:[\w.-]+/)+[\w.-]*)", text):
            path = m[1].rstrip(".,;:")
            if path.split("/")[0] in tops and not re.search(r"\b[A-Z]{2,}\b", path) \
                    and not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {path}")
    assert missing == []


# ---------------------------------------------------------------- exit statuses

STATED_STATUS = re.compile(r"\b(?:exits?|exit status|status)(?: with)?(?: status)?\s+\**(\d+)\b", re.I)
MEANING = re.compile(r"\**(\d+)\**\s+(success|a user error|a usage error|an internal error|when interrupted)")


def exit_status(argv: list[str], monkeypatch) -> int:
    """dslc's exit status for argv, run in this process (os._exit and argparse's exit caught)."""
    def leave(code):
        raise SystemExit(code)
    monkeypatch.setattr(os, "_exit", leave)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return cli.main(argv)
    except SystemExit as e:
        return e.code


def test_the_exit_statuses_the_docs_state_are_dslcs(tmp_path, monkeypatch):
    """language.md's list of exit statuses is what dslc gives for success, a user error, a
    usage error, a bug and Ctrl-C; every status the docs state is one of them."""
    good, bad = tmp_path / "good.bend", tmp_path / "bad.bend"
    good.write_text("def f(x: f32[N]) -> f32[N]:\n  return x\n")
    bad.write_text("def f(x: f32[N]) -> f32[N]:\n  return y\n")

    def failing(error: BaseException):
        def command(args):
            raise error
        return command
    given = {"success": exit_status(["check", str(good)], monkeypatch),
             "a user error": exit_status(["check", str(bad)], monkeypatch),
             "a usage error": exit_status(["check", "--no-such-flag"], monkeypatch)}
    for meaning, error in (("an internal error", RuntimeError("a bug")),
                           ("when interrupted", KeyboardInterrupt())):
        monkeypatch.setattr(cli, "cmd_check", failing(error))
        given[meaning] = exit_status(["check", str(good)], monkeypatch)
    reference = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    listed = reference.split("**Exit statuses**")[1].split("\n\n")[0]
    assert {meaning: int(s) for s, meaning in MEANING.findall(listed)} == given
    stated = {(d.name, int(s)) for d in DOCS for s in STATED_STATUS.findall(d.read_text(encoding="utf-8"))}
    assert stated, "the docs state no exit status"
    assert {(name, s) for name, s in stated if s not in given.values()} == set(), f"dslc gives {given}"


# ---------------------------------------------------------------- one reference

def test_no_tracked_file_points_to_the_design_guide():
    """docs/language.md stands alone: no file names the design guide it was written from."""
    guide = "LANGUAGE" + ".md"                   # spelt in two parts, so that this file passes
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: its tracked files are unknown")
    naming = [f for f in filter(None, files) if (ROOT / f).is_file()
              and guide.encode() in (ROOT / f).read_bytes()]
    assert naming == []


def test_the_architecture_page_names_every_host_primitive():
    """docs/architecture.md's table of host steps: each primitive that always runs on the host
    is named there (in backquotes, by its surface name or its IR name)."""
    from ir.ops import REGISTRY
    from ir.ops.base import Role
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = page.split("### What runs on the host, and why")[1].split("\n## ")[0]
    named = set(re.findall(r"`([a-z_]+)`", table))
    for name, p in REGISTRY.items():
        if p.role is Role.HOST:
            assert name in named or p.surface in named, f"{name} is missing from the host table"
