"""Highlighting .bend files: one table of token rules, read by a Pygments lexer and written out
as a TextMate grammar (editors/bend.tmLanguage.json), so that the two classify alike.

Pygments finds BendLexer through the `pygments.lexers` entry point: `pygmentize -l bend FILE`.
`python -m dsl.highlight` prints the TextMate grammar (`--plist`: as Sublime Text reads it)."""
from __future__ import annotations

import argparse
import json
import plistlib
import sys

from pygments.lexer import RegexLexer, bygroups
from pygments.token import (Comment, Error, Keyword, Name, Number, Operator, Punctuation,
                            String, Whitespace, _TokenType)

# the keywords of frontend/grammar.lark (docs/language.md §2.3), by how they are highlighted
DECLARATIONS = ("def", "object", "type")
IMPORTS = ("from", "import", "as")
CONTROL = ("assert", "bend", "case", "elif", "else", "fold", "if", "in", "lambda", "match",
           "return", "switch", "use", "when", "with")
CONSTANTS = ("True", "False")
WORD_OPERATORS = ("and", "not", "or")
RESERVED = ("fork",)                  # not a keyword, but it means "recurse" inside a bend (§8.4)
TYPES = ("int", "float", "bool", "Key", "List", "f32", "f16", "bf16", "f64", "i32", "i64", "u32")

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
MODULE_PATH = rf"{NAME}(?:[./]{NAME})*"
# a number runs to the next character that is neither a letter, a digit, '_' nor '.'
_END = r"(?![\w.])"
_DIGITS = r"[0-9](?:_?[0-9])*"
_EXPONENT = rf"[eE][+-]?{_DIGITS}"
ESCAPE = r"\\[ntr0\\\"']"


def _words(words: tuple[str, ...]) -> str:
    return rf"\b(?:{'|'.join(words)})\b"


# (regex, the class of the whole match or of each group), tried in order by both engines:
# Pygments at the current position, TextMate at the earliest position, ties to the first rule
RULES: tuple[tuple[str, tuple[_TokenType, ...]], ...] = (
    (rf"(?:(?:{_DIGITS}\.(?:{_DIGITS})?|\.{_DIGITS})(?:{_EXPONENT})?|{_DIGITS}{_EXPONENT}){_END}",
     (Number.Float,)),
    (rf"0[xX](?:_?[0-9a-fA-F])+{_END}", (Number.Hex,)),
    (rf"0[bB](?:_?[01])+{_END}", (Number.Bin,)),
    (rf"{_DIGITS}{_END}", (Number.Integer,)),
    (r"(?:[0-9]|\.[0-9])[\w.]*", (Error,)),              # the parser's "invalid number"
    (rf"\b(from)([ \t]+)({MODULE_PATH})([ \t]+)(import)\b",
     (Keyword.Namespace, Whitespace, Name.Namespace, Whitespace, Keyword.Namespace)),
    (rf"\b(import)([ \t]+)({MODULE_PATH})", (Keyword.Namespace, Whitespace, Name.Namespace)),
    (rf"\b(def)([ \t]+)({NAME})", (Keyword.Declaration, Whitespace, Name.Function)),
    (rf"\b(object|type)([ \t]+)({NAME})", (Keyword.Declaration, Whitespace, Name.Class)),
    (_words(DECLARATIONS), (Keyword.Declaration,)),
    (_words(IMPORTS), (Keyword.Namespace,)),
    (_words(CONTROL), (Keyword,)),
    (_words(CONSTANTS), (Keyword.Constant,)),
    (_words(WORD_OPERATORS), (Operator.Word,)),
    (_words(RESERVED), (Keyword.Reserved,)),
    (_words(TYPES), (Keyword.Type,)),
    (NAME, (Name,)),
    (r"\*\*|//|<<|>>|<=|>=|==|!=|->|[-+*/@]=|[-+*/%@<>=|^&~]", (Operator,)),
    (r"\.\.\.|[()\[\]{},:;.]", (Punctuation,)),
)

# each class's TextMate scope; whitespace has none
SCOPES: dict[_TokenType, str] = {
    Comment.Single: "comment.line.number-sign.bend",
    Comment.Multiline: "comment.block.bend",
    String.Doc: "comment.block.documentation.bend",
    String.Double: "string.quoted.double.bend",
    String.Single: "string.quoted.single.bend",
    String.Escape: "constant.character.escape.bend",
    Number.Float: "constant.numeric.float.bend",
    Number.Hex: "constant.numeric.integer.hexadecimal.bend",
    Number.Bin: "constant.numeric.integer.binary.bend",
    Number.Integer: "constant.numeric.integer.decimal.bend",
    Keyword.Declaration: "storage.type.bend",
    Keyword.Namespace: "keyword.control.import.bend",
    Keyword: "keyword.control.bend",
    Keyword.Constant: "constant.language.bend",
    Keyword.Reserved: "keyword.other.reserved.bend",
    Keyword.Type: "support.type.bend",
    Operator.Word: "keyword.operator.logical.bend",
    Operator: "keyword.operator.bend",
    Name.Function: "entity.name.function.bend",
    Name.Class: "entity.name.type.bend",
    Name.Namespace: "entity.name.namespace.bend",
    Name: "variable.other.bend",
    Punctuation: "punctuation.bend",
    Error: "invalid.illegal.bend",
}

# `#{ … #}` does not nest: its body holds no `#}`; one left open runs to the end of the file
_BLOCK_COMMENT = r"#\{(?:[^#]|#(?!\}))*(?:#\}|\Z)"
# the parser keeps a block comment as documentation when an item starts on the next line; a
# TextMate grammar sees one line at a time and cannot tell, so there it is a block comment
_DOCUMENTS_ITEM = rf"(?=[^\n]*\n[ \t]*{_words(DECLARATIONS)})"
# a string closes on its line; a quote that does not is an error
_STRING_START = {'"': r'"(?=(?:[^"\\\n]|\\.)*")', "'": r"'(?=(?:[^'\\\n]|\\.)*')"}
_STRING = {'"': String.Double, "'": String.Single}


def _string(quote: str) -> list:
    """Pygments' rules inside a string: its escapes, and any other `\\` kept as written."""
    return [(quote, _STRING[quote], "#pop"), (ESCAPE, String.Escape),
            (rf"[^{quote}\\\n]+|\\.", _STRING[quote])]


class BendLexer(RegexLexer):
    """dslc's Bend-like tensor language (docs/language.md §2)."""
    name = "Bend (dslc)"
    aliases = ["bend", "dslc"]
    filenames = ["*.bend"]
    mimetypes = ["text/x-bend"]

    tokens = {
        "root": [
            (r"\s+", Whitespace),
            (_BLOCK_COMMENT + _DOCUMENTS_ITEM, String.Doc),
            (_BLOCK_COMMENT, Comment.Multiline),
            (r"#[^\n]*", Comment.Single),
            (_STRING_START['"'], String.Double, "double"),
            (_STRING_START["'"], String.Single, "single"),
            *[(regex, bygroups(*classes) if len(classes) > 1 else classes[0])
              for regex, classes in RULES],
        ],
        "double": _string('"'),
        "single": _string("'"),
    }


def _textmate_rule(regex: str, classes: tuple[_TokenType, ...]) -> dict:
    if len(classes) == 1:
        return {"name": SCOPES[classes[0]], "match": regex}
    return {"match": regex, "captures": {str(group): {"name": SCOPES[cls]}
                                         for group, cls in enumerate(classes, 1) if cls in SCOPES}}


def textmate_grammar() -> dict:
    """The TextMate grammar of .bend files, as editors/bend.tmLanguage.json holds it."""
    strings = [{"name": SCOPES[_STRING[quote]], "begin": _STRING_START[quote], "end": quote,
                "patterns": [{"name": SCOPES[String.Escape], "match": ESCAPE}, {"match": r"\\."}]}
               for quote in _STRING]
    return {
        "name": BendLexer.name,
        "scopeName": "source.bend",
        "fileTypes": ["bend"],
        "patterns": [
            {"name": SCOPES[Comment.Multiline], "begin": r"#\{", "end": r"#\}"},
            {"name": SCOPES[Comment.Single], "match": r"#.*"},
            *strings,
            *[_textmate_rule(regex, classes) for regex, classes in RULES],
            {"name": SCOPES[Error], "match": r"\S"},
        ],
    }


def textmate_json() -> str:
    """The grammar as the file holds it."""
    return json.dumps(textmate_grammar(), indent=2) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m dsl.highlight",
                                     description="Print the TextMate grammar of .bend files.")
    parser.add_argument("--plist", action="store_true", help="as a property list, for Sublime Text")
    if parser.parse_args().plist:
        sys.stdout.buffer.write(plistlib.dumps(textmate_grammar()))
    else:
        sys.stdout.write(textmate_json())
