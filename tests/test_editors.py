"""Editor support: the Pygments lexer (found through its entry point) and the TextMate grammar
editors/bend.tmLanguage.json (run by babi's TextMate engine) classify every token of the
project's .bend files as the parser reads it, and alike."""
import json
import plistlib
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from babi.highlight import Compiler, Grammar, Grammars, highlight_line
from lark import Lark
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
from pygments.token import (Comment, Error, Keyword, Name, Number, Operator, Punctuation,
                            String, Token, Whitespace)

from dsl import highlight
from frontend.builtins import BUILTIN_TYPES

ROOT = Path(__file__).resolve().parents[1]
GRAMMAR = ROOT / "frontend" / "grammar.lark"
TEXTMATE = ROOT / "editors" / "bend.tmLanguage.json"
VALID = sorted(path for folder in ("examples", "dsl/lib", "tests/programs", "tests/corpus/valid")
               for path in (ROOT / folder).glob("*.bend"))
# and the invalid corpus, the bad inputs to dslc, the benchmarks' models
EVERY = sorted(path for folder in ("examples", "dsl", "tests", "benchmarks")
               for path in (ROOT / folder).rglob("*.bend"))
_SCOPE_CLASS = {scope: cls for cls, scope in highlight.SCOPES.items()}


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@cache
def _lexer():
    """Found as pygmentize finds it, through the entry point that `pip install -e .` installs."""
    return get_lexer_by_name("bend")


@cache
def _parser_lexer() -> Lark:
    return Lark(GRAMMAR.read_text(), parser="lalr", lexer="basic")


@cache
def _textmate() -> Compiler:
    return Compiler(Grammar.make(json.loads(TEXTMATE.read_text())), Grammars())


def pygments_classes(source: str) -> list:
    """The Pygments class of each character of source."""
    classes = []
    for _, cls, text in _lexer().get_tokens_unprocessed(source):
        classes += [cls] * len(text)
    return classes


def textmate_classes(source: str) -> list:
    """The class of each character of source whose innermost TextMate scope says it; Token
    where the grammar gives none (whitespace only, in a grammar that classifies everything)."""
    classes, state = [], _textmate().root_state
    for number, line in enumerate(re.findall(r"[^\n]*\n|[^\n]+$", source)):
        state, regions = highlight_line(_textmate(), state, line, number == 0)
        for region in regions:
            cls = next((_SCOPE_CLASS[s] for s in reversed(region.scope) if s in _SCOPE_CLASS),
                       Token)
            classes += [cls] * (region.end - region.start)
    return classes


def _where(path: Path, source: str, at: int) -> str:
    line, column = source.count("\n", 0, at) + 1, at - source.rfind("\n", 0, at)
    return f"{_name(path)}:{line}:{column}"


# ---------------------------------------------------------------- found as a user finds it

def test_pygments_finds_the_lexer_by_name_and_by_file_name():
    assert type(get_lexer_by_name("bend")) is highlight.BendLexer
    assert type(get_lexer_for_filename("model.bend")) is highlight.BendLexer


def test_pygmentize_highlights_a_file():
    out = subprocess.run([sys.executable, "-m", "pygments", "-l", "bend", "-f", "raw",
                          str(ROOT / "examples" / "xor.bend")],
                         capture_output=True, text=True, check=True).stdout
    assert "Token.Keyword.Declaration\t'def'" in out.splitlines()
    assert "Token.Error" not in out


def test_the_textmate_grammar_is_the_lexers_rules():
    assert TEXTMATE.read_text() == highlight.textmate_json(), \
        "stale: python -m dsl.highlight > editors/bend.tmLanguage.json"


def test_sublime_text_gets_the_same_grammar_as_a_property_list():
    out = subprocess.run([sys.executable, "-m", "dsl.highlight", "--plist"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    assert plistlib.loads(out) == json.loads(TEXTMATE.read_text())


def test_the_vs_code_extension_in_editors_uses_the_grammar_and_the_comment_tokens():
    extension = json.loads((ROOT / "editors" / "package.json").read_text())["contributes"]
    [language], [grammar] = extension["languages"], extension["grammars"]
    assert language["extensions"] == [".bend"] and grammar["language"] == language["id"]
    assert grammar["scopeName"] == json.loads(TEXTMATE.read_text())["scopeName"] == "source.bend"
    assert (ROOT / "editors" / grammar["path"]).resolve() == TEXTMATE
    configuration = json.loads((ROOT / "editors" / language["configuration"]).read_text())
    assert configuration["comments"] == {"lineComment": "#", "blockComment": ["#{", "#}"]}


# ---------------------------------------------------------------- the grammar's words

def _grammar_words() -> set[str]:
    return set(re.findall(r'"([A-Za-z_]\w*)"', GRAMMAR.read_text()))


def test_every_keyword_of_the_grammar_and_every_built_in_type_has_its_class():
    highlighted = (highlight.DECLARATIONS + highlight.IMPORTS + highlight.CONTROL
                   + highlight.CONSTANTS + highlight.WORD_OPERATORS)
    assert sorted(highlighted) == sorted(_grammar_words())
    assert sorted(highlight.TYPES) == sorted(set(BUILTIN_TYPES))
    for word in sorted(_grammar_words() | set(BUILTIN_TYPES)):
        assert set(pygments_classes(word)) == set(textmate_classes(word)) != {Name}, word


# ---------------------------------------------------------------- every file of the project

# the Pygments classes each of the parser's tokens may have
_NAME_CLASSES = {Name, Name.Function, Name.Class, Name.Namespace, Keyword.Type, Keyword.Reserved}
_KEYWORD_CLASSES = {Keyword, Keyword.Declaration, Keyword.Namespace, Keyword.Constant, Operator.Word}
_TERMINAL_CLASSES = {
    "NAME": _NAME_CLASSES,
    "INT": {Number.Integer, Number.Hex, Number.Bin},
    "FLOAT": {Number.Float},
    "STRING": {String.Double, String.Single, String.Escape},
    "LINE_COMMENT": {Comment.Single},
    "BLOCK_COMMENT": {Comment.Multiline, String.Doc},
    "WITH_LBRACE": {Keyword, Whitespace, Punctuation},      # a record update's `with {`
}
_SYMBOL_CLASSES = {Operator, Punctuation, Name.Namespace}      # `nn/lib`: a module path


def _allowed(token) -> set:
    if token.type in _TERMINAL_CLASSES:
        return _TERMINAL_CLASSES[token.type]
    return _KEYWORD_CLASSES if token.value.isidentifier() else _SYMBOL_CLASSES


@pytest.mark.parametrize("path", VALID, ids=_name)
def test_pygments_classifies_each_token_as_the_parser_reads_it(path):
    source = path.read_text()
    classes, wrong = pygments_classes(source), []
    for token in _parser_lexer().lex(source, dont_ignore=True):
        got = set(classes[token.start_pos:token.end_pos])
        if token.value.strip() and not got <= _allowed(token):
            wrong.append(f"{_where(path, source, token.start_pos)}: {token.value!r} ({token.type}) "
                         f"is {', '.join(sorted(map(str, got)))}")
    assert not wrong, "\n".join(wrong[:10])


@pytest.mark.parametrize("path", EVERY, ids=_name)
def test_textmate_classifies_each_character_as_pygments_does(path):
    """Except documentation, which a TextMate grammar cannot tell from a block comment."""
    source = path.read_text()
    want = [Comment.Multiline if c is String.Doc else Token if c is Whitespace else c
            for c in pygments_classes(source)]
    got = textmate_classes(source)
    assert len(got) == len(source)
    wrong = next((at for at, (w, g) in enumerate(zip(want, got)) if w is not g), None)
    assert wrong is None, (f"{_where(path, source, wrong)}: {source[wrong:wrong + 20]!r} is "
                           f"{want[wrong]} to Pygments, {got[wrong]} to TextMate")


# ---------------------------------------------------------------- what each class is

# (source, a piece of it, its class to Pygments, its TextMate scope)
CASES = [
    ("def g(x: f32[N]) -> i32[N]:", "def", Keyword.Declaration, "storage.type.bend"),
    ("def g(x: f32[N]) -> i32[N]:", "g", Name.Function, "entity.name.function.bend"),
    ("def g(x: f32[N]) -> i32[N]:", "x", Name, "variable.other.bend"),
    ("def g(x: f32[N]) -> i32[N]:", "f32", Keyword.Type, "support.type.bend"),
    ("def g(x: f32[N]) -> i32[N]:", "i32", Keyword.Type, "support.type.bend"),
    ("def g(x: f32[N]) -> i32[N]:", "->", Operator, "keyword.operator.bend"),
    ("def g(x: f32[N]) -> i32[N]:", "[", Punctuation, "punctuation.bend"),
    ("def g(n: int, on: bool[], k: Key) -> f32:", "bool", Keyword.Type, "support.type.bend"),
    ("def g(n: int, on: bool[], k: Key) -> f32:", "Key", Keyword.Type, "support.type.bend"),
    ("object Affine { W: bf16[I, O] }", "Affine", Name.Class, "entity.name.type.bend"),
    ("object Affine { W: bf16[I, O] }", "bf16", Keyword.Type, "support.type.bend"),
    ("type Act:", "Act", Name.Class, "entity.name.type.bend"),
    ("from nn import cross_entropy as ce", "nn", Name.Namespace, "entity.name.namespace.bend"),
    ("from nn import cross_entropy as ce", "import", Keyword.Namespace, "keyword.control.import.bend"),
    ("from nn import cross_entropy as ce", "cross_entropy", Name, "variable.other.bend"),
    ("from nn import cross_entropy as ce", "as", Keyword.Namespace, "keyword.control.import.bend"),
    ("import lib/shapes as s", "lib/shapes", Name.Namespace, "entity.name.namespace.bend"),
    ("a = 0x1F + 0X_ff", "0x1F", Number.Hex, "constant.numeric.integer.hexadecimal.bend"),
    ("a = 0x1F + 0X_ff", "0X_ff", Number.Hex, "constant.numeric.integer.hexadecimal.bend"),
    ("a = 0b101 - 1_000", "0b101", Number.Bin, "constant.numeric.integer.binary.bend"),
    ("a = 0b101 - 1_000", "1_000", Number.Integer, "constant.numeric.integer.decimal.bend"),
    ("b = .5 * 1e-5 + 2.5E3", ".5", Number.Float, "constant.numeric.float.bend"),
    ("b = .5 * 1e-5 + 2.5E3", "1e-5", Number.Float, "constant.numeric.float.bend"),
    ("b = .5 * 1e-5 + 2.5E3", "2.5E3", Number.Float, "constant.numeric.float.bend"),
    ("b = 1. + 1_000.5", "1.", Number.Float, "constant.numeric.float.bend"),
    ("b = 1. + 1_000.5", "1_000.5", Number.Float, "constant.numeric.float.bend"),
    ("x[0:N-1]*2.0-m", "2.0", Number.Float, "constant.numeric.float.bend"),
    ("x[0:N-1]*2.0-m", "1", Number.Integer, "constant.numeric.integer.decimal.bend"),
    ("c = 0xZZ", "0xZZ", Error, "invalid.illegal.bend"),
    ("c = 1__0", "1__0", Error, "invalid.illegal.bend"),
    ("c = 1.2.3", "1.2.3", Error, "invalid.illegal.bend"),
    ("c = $", "$", Error, "invalid.illegal.bend"),
    ('c = "open', '"', Error, "invalid.illegal.bend"),
    ("y = x  # a comment", "# a comment", Comment.Single, "comment.line.number-sign.bend"),
    ("#{ a block #} y = x", "#{ a block #}", Comment.Multiline, "comment.block.bend"),
    ("#{ a block #} y = x", "y", Name, "variable.other.bend"),
    ("#{ a #}\ny = x\n#{ b #}\ndef f():", "#{ a #}", Comment.Multiline, "comment.block.bend"),
    ("#{ a #}\ny = x\n#{ b #}\ndef f():", "#{ b #}", String.Doc, "comment.block.bend"),
    ("#{ Docs.\n  More. #}\n  object P { a: f32 }", "  More. #}", String.Doc, "comment.block.bend"),
    ('einsum("bh,hd->bd", a, b)', '"bh,hd->bd"', String.Double, "string.quoted.double.bend"),
    ("assert n > 0, 'text'", "'text'", String.Single, "string.quoted.single.bend"),
    (r'assert n > 0, "a\nb\qc"', r"\n", String.Escape, "constant.character.escape.bend"),
    (r'assert n > 0, "a\nb\qc"', r"\q", String.Double, "string.quoted.double.bend"),
    (r"assert n > 0, 'it\'s'", r"\'", String.Escape, "constant.character.escape.bend"),
    ("h = fold x in xs with s = 0:", "fold", Keyword, "keyword.control.bend"),
    ("h = fold x in xs with s = 0:", "in", Keyword, "keyword.control.bend"),
    ("h = fold x in xs with s = 0:", "with", Keyword, "keyword.control.bend"),
    ("k = fold_in(key, 3)", "fold_in", Name, "variable.other.bend"),
    ("  when n > 1: return fork(n // 2)", "when", Keyword, "keyword.control.bend"),
    ("  when n > 1: return fork(n // 2)", "fork", Keyword.Reserved, "keyword.other.reserved.bend"),
    ("  when n > 1: return fork(n // 2)", "//", Operator, "keyword.operator.bend"),
    ("if not a and b or True: use y = x", "not", Operator.Word, "keyword.operator.logical.bend"),
    ("if not a and b or True: use y = x", "True", Keyword.Constant, "constant.language.bend"),
    ("if not a and b or True: use y = x", "use", Keyword, "keyword.control.bend"),
    ("y @= W ** 2", "@=", Operator, "keyword.operator.bend"),
    ("y @= W ** 2", "**", Operator, "keyword.operator.bend"),
    ("x[..., 0]", "...", Punctuation, "punctuation.bend"),
]


@pytest.mark.parametrize("source, piece, cls, scope", CASES,
                         ids=lambda v: v if isinstance(v, str) else "")
def test_each_engine_gives_a_piece_its_class(source, piece, cls, scope):
    at = source.index(piece)
    end = at + len(piece)
    assert set(pygments_classes(source)[at:end]) == {cls}
    assert set(textmate_classes(source)[at:end]) == {_SCOPE_CLASS[scope]}
