"""The parser: source text to frontend.ast, by lark's LALR(1) parser over grammar.lark."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import threading
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedToken
from lark.indenter import Indenter
from lark.lexer import BasicLexer

from frontend import ast, collector
from frontend.diagnostics import Note, ParseError, Source, Span
from frontend.limits import MAX_NESTING, MAX_RANK, MAX_SOURCE_BYTES

# Binary operators by precedence, loosest (1) to tightest (docs/language.md §9.1); `**` is right-associative.
BINARY = {"or": 1, "and": 2, "|": 4, "^": 5, "&": 6, "==": 7, "!=": 7, "<": 7, "<=": 7, ">": 7,
          ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10, "//": 10, "@": 10,
          "**": 12}
PREFIX = {"not": 3, "-": 11, "+": 11}
COMPARISON = 7

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER_LIKE = re.compile(r"\.?\d[\w.]*")            # \d: any digit, to name a non-ASCII one
CLOSERS = {"(": ")", "[": "]", "{": "}"}
# Python's loops, which a statement may start with and dslc writes with fold (docs/language.md §8)
LOOP = re.compile(r"[ \t]*(for|while)\b")
LOOP_HINTS = {
    "for": "dslc has no 'for' loop: fold walks a tensor's leading axis or a list, "
           "e.g. 'fold t in arange(T) with h = h0:'",
    "while": "dslc has no 'while' loop: the number of steps is static; fold over arange(n), "
             "e.g. 'fold i in arange(n) with x = x0:', or recurse with bend",
}

# How a message names the tokens it expected; the others are named by their quoted text.
TOKEN_WORDS = {"NAME": "a name", "INT": "a number", "FLOAT": "a number",
               "STRING": "a string", "_NL": "the end of the line", "_INDENT": "an indented block",
               "_DEDENT": "the end of the block", "$END": "the end of the file"}
# Tokens that may follow any expression: left out of the list of expected tokens.
CONTINUATIONS = {"(", "[", "{", ".", ";", *BINARY, *PREFIX}
# Keywords that start a statement: met inside brackets, they mean that a bracket was left open.
STATEMENT_KEYWORDS = {"def", "object", "type", "from", "import", "use", "return", "assert", "if",
                      "elif", "else", "switch", "match", "case", "fold", "bend", "when"}


class Lexeme(Token):
    """A lark Token, made without the keyword handling of Token.__new__ (a tenth of the lexing time)."""
    __slots__ = ()

    def __new__(cls, type, value, start_pos=None, line=None, column=None, end_line=None,
                end_column=None, end_pos=None):
        token = str.__new__(cls, value)
        token.type, token.value, token.start_pos, token.end_pos = type, value, start_pos, end_pos
        token.line, token.column, token.end_line, token.end_column = line, column, end_line, end_column
        return token


class Lexer(BasicLexer):
    """lark's basic lexer with a leaner loop: one regex, which also skips blanks; keywords by lookup."""
    __future_interface__ = 2

    def __init__(self, conf):
        super().__init__(conf)
        self.keywords = {t.pattern.value: t.name for t in self.terminals
                         if t.pattern.type == "str" and NAME.fullmatch(t.pattern.value)}
        blanks = [t for t in self.terminals if t.name in self.ignore_types
                  and t.name not in self.user_callbacks and t.name not in self.newline_types]
        tokens = [t for t in self.terminals if t not in blanks and t.name not in self.keywords.values()]
        self.blanks = re.compile("(?:%s)*+" % "|".join(t.pattern.to_regexp() for t in blanks))
        self.regex = re.compile(self.blanks.pattern + "(?:%s)" % "|".join(
            f"(?P<{t.name}>{t.pattern.to_regexp()})" for t in tokens))

    def lex(self, state, parser_state):
        text, pos, line, line_start = state.text.text, 0, 1, 0
        match, keywords, newline_types = self.regex.match, self.keywords, self.newline_types
        ignore, callbacks = self.ignore_types, self.user_callbacks
        while pos < len(text):
            m = match(text, pos)
            if m is None:                               # only blanks left, or no token fits
                pos = self.blanks.match(text, pos).end()
                if pos < len(text):
                    raise UnexpectedCharacters(text, pos, line, pos - line_start + 1)
                return
            kind = m.lastgroup
            pos, end = m.span(kind)
            value = text[pos:end]
            if kind == "NAME":
                kind = keywords.get(value, kind)
            end_line, end_line_start = line, line_start
            if kind in newline_types and "\n" in value:
                end_line += value.count("\n")
                end_line_start = pos + value.rindex("\n") + 1
            token = Lexeme(kind, value, pos, line, pos - line_start + 1, end_line,
                           end - end_line_start + 1, end)
            if kind in callbacks:
                token = callbacks[kind](token)
            if kind not in ignore:
                yield token
            pos, line, line_start = end, end_line, end_line_start


class LayoutError(LarkError):
    """An indentation error found by the postlexer, at source offsets [start, end)."""

    def __init__(self, start: int, end: int, message: str):
        super().__init__(message)
        self.start, self.end, self.message = start, end, message


class Layout(Indenter):
    """lark's Indenter, taking a line's indentation from its first token; reports tabs and bad dedents."""
    NL_type = "_NL"
    OPEN_PAREN_types = ("LPAR", "LSQB", "LBRACE", "WITH_LBRACE")
    CLOSE_PAREN_types = ("RPAR", "RSQB", "RBRACE")
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8

    def process(self, stream):
        self.open_brackets: list[Token] = []
        return super().process(stream)

    def _process(self, stream):
        line_break, at_line_start = None, True
        for token in stream:
            if token.type == self.NL_type:
                if not self.open_brackets:
                    line_break, at_line_start = token, True
                continue
            if at_line_start:
                yield from self.line_start(line_break, token)
                at_line_start = False
            yield token
            if token.type in self.OPEN_PAREN_types:
                self.open_brackets.append(token)
                if len(self.open_brackets) > MAX_NESTING:
                    raise LayoutError(token.start_pos, token.end_pos,
                                      f"brackets nested more than {MAX_NESTING} deep")
            elif token.type in self.CLOSE_PAREN_types and self.open_brackets:
                self.open_brackets.pop()
        if at_line_start:
            yield from self.line_start(line_break, None)

    def line_start(self, line_break: Token | None, token: Token | None):
        """Yield the line break, then _INDENT or _DEDENTs to the column of `token` (0 at the end)."""
        if line_break is not None:
            yield line_break
            indentation = line_break.value[line_break.value.rfind("\n") + 1:]
            if "\t" in indentation and token is not None and token.line == line_break.end_line:
                tab = line_break.end_pos - len(indentation) + indentation.index("\t")
                raise LayoutError(tab, tab + 1, "tab in indentation; indent with spaces")
        column = token.column - 1 if token is not None else 0
        here = token if token is not None else line_break
        if column > self.indent_level[-1]:
            self.indent_level.append(column)
            if len(self.indent_level) > MAX_NESTING:
                raise LayoutError(here.start_pos, here.end_pos,
                                  f"blocks nested more than {MAX_NESTING} deep")
            yield Token.new_borrow_pos(self.INDENT_type, "", here)
            return
        while column < self.indent_level[-1]:
            self.indent_level.pop()
            yield Token.new_borrow_pos(self.DEDENT_type, "", here)
        if column != self.indent_level[-1]:
            raise LayoutError(token.start_pos, token.end_pos,
                              "unindent does not match any outer indentation level")


@v_args(inline=True)
class Builder(Transformer):
    """Builds the AST while the parser reduces: one method per grammar rule (or rule alias)."""

    def _begin(self, source: Source) -> None:
        """Start the parse of a source."""
        self.source = source
        self.docs: dict[int, str] = {}       # the line below a `#{ … #}` comment -> its text

    def _span(self, first, last=None) -> Span:
        """The span from the start of `first` to the end of `last` (tokens or nodes)."""
        last = first if last is None else last
        start = first.start_pos if isinstance(first, Token) else first.span.start
        end = last.end_pos if isinstance(last, Token) else last.span.end
        return Span(self.source, start, end)

    def _doc_comment(self, token: Token) -> Token:
        """Keep a block comment's text: it documents an item that starts on the next line.
        Its lines keep their indentation relative to one another (as a docstring's do)."""
        self.docs[token.end_line + 1] = inspect.cleandoc(token[2:-2]).strip()
        return token

    def _target(self, expr) -> ast.Target:
        """The assignment target written as the expression `expr`."""
        if isinstance(expr, ast.Name):
            return ast.NameTarget(expr.id, expr.span)
        if isinstance(expr, ast.TupleLit):
            return ast.TupleTarget(tuple(map(self._target, expr.items)), expr.span)
        what = {ast.Index: "an element: tensors are immutable",
                ast.Attr: "a field: records are immutable"}.get(type(expr), "this expression")
        raise ParseError(expr.span, f"cannot assign to {what}")

    def _group(self, items, i: int, min_level: int, depth: int = 0):
        """Group items[i:] by precedence, down to `min_level`; returns (expression, next i).
        `depth` counts the prefix and right-associative operators it is nested in."""
        first = items[i]
        if depth > MAX_NESTING:
            raise ParseError(self._span(items[i - 1]), f"operators nested more than {MAX_NESTING} deep")
        if isinstance(first, Token):                                  # a prefix operator
            level = PREFIX[first]
            if first == "not" and min_level > level:
                raise ParseError(self._span(first), "put 'not …' in parentheses here")
            operand, i = self._group(items, i + 1, level + 1, depth + 1)
            span = self._span(first, operand)
            left = (dataclasses.replace(operand, span=span) if first == "+"
                    else ast.UnaryOp(str(first), operand, span))
        else:
            left, i = first, i + 1
        compared = False
        while i < len(items) and BINARY[items[i]] >= min_level:
            op, level = items[i], BINARY[items[i]]
            if level == COMPARISON and compared:
                raise ParseError(self._span(op), "comparisons cannot be chained; use 'and'")
            compared = level == COMPARISON
            right, i = self._group(items, i + 1, level if op == "**" else level + 1,
                                   depth + (op == "**"))
            left = ast.BinOp(str(op), left, right, self._span(op), self._span(left, right))
        return left, i

    # ---------------------------------------------------------------- items

    def start(self, *items):
        return ast.Module(items, Span(self.source, 0, len(self.source.text)))

    def comma_list(self, *items):
        return items

    def def_(self, kw, name, params, ret, body):
        return ast.Def(str(name), params or (), ret, body, self.docs.get(kw.line),
                       self._span(name), self._span(kw, body[-1]))

    def param(self, name, type_, default):
        return ast.Param(str(name), type_, default, self._span(name, default or type_ or name))

    def object_def(self, kw, name, params, dims, fields, rbrace):
        return ast.ObjectDef(str(name), fields or (), self.docs.get(kw.line), self._span(name),
                             self._span(kw, rbrace), tuple(map(str, dims or ())),
                             tuple(map(str, params or ())))

    def field(self, modifier, name, type_):
        if modifier is not None and modifier != "buffer":
            raise ParseError(self._span(modifier), f"'{modifier}' cannot mark a field: write "
                                                   f"'buffer {name}: …' for state that is not trained")
        return ast.Field(str(name), type_, modifier is not None, self._span(modifier or name, type_))

    def type_def(self, kw, name, params, *ctors):
        return ast.TypeDef(str(name), tuple(map(str, params or ())), ctors,
                           self.docs.get(kw.line), self._span(name), self._span(kw, ctors[-1]))

    def ctor(self, name, fields, rbrace):
        return ast.Ctor(str(name), fields or (), self._span(name, rbrace or name))

    def ctor_field(self, tilde, name, type_):
        return ast.CtorField(str(name), type_, tilde is not None,
                             self._span(tilde or name, type_ or name))

    def from_import(self, kw, module, *names):
        parts, module_span = module
        return ast.FromImport(parts, names, module_span, self._span(kw, names[-1]))

    def import_name(self, name, alias):
        return ast.ImportName(str(name), alias and str(alias), self._span(name, alias or name))

    def import_(self, kw, module, alias):
        parts, module_span = module
        end = alias.end_pos if alias else module_span.end
        return ast.Import(parts, alias and str(alias), module_span,
                          Span(self.source, kw.start_pos, end))

    def module_path(self, *names):
        return tuple(p for name in names for p in name.split("/")), self._span(names[0], names[-1])

    # ---------------------------------------------------------------- types

    def tensor_type(self, name, dims, rsqb):
        (parts, span), dims = name, dims or ()
        if len(parts) > 1 or parts[0][:1].isupper():      # a record at given dimensions
            return ast.NamedType(parts, (), span.to(self._span(rsqb)), dims)
        if len(dims) > MAX_RANK:
            raise ParseError(self._span(dims[MAX_RANK]), f"a tensor type of {len(dims)} dimensions: "
                                                         f"a tensor has at most {MAX_RANK}")
        return ast.TensorTypeExpr(parts[0], dims, span.to(self._span(rsqb)))

    def qual_name(self, *names):
        return tuple(str(n) for n in names), self._span(names[0], names[-1])

    def generic_type(self, name, args, dims, rsqb):
        (parts, span) = name
        return ast.NamedType(parts, args, span.to(self._span(rsqb)), dims or ())

    def named_type(self, name, args, rpar):
        parts, span = name
        return ast.NamedType(parts, args or (), span.to(self._span(rpar)) if rpar else span)

    def tuple_type(self, lpar, *rest):
        return ast.TupleTypeExpr(rest[:-1], self._span(lpar, rest[-1]))

    # ---------------------------------------------------------------- statements

    def body(self, *stmts):
        return stmts

    def assign(self, target, value):
        return ast.Assign(self._target(target), value, self._span(target, value))

    def aug_assign(self, target, op, value):
        if not isinstance(target, ast.Name):
            raise ParseError(target.span, f"'{op}' needs a single name on its left")
        return ast.AugAssign(ast.NameTarget(target.id, target.span), op[:-1], value,
                             self._span(op), self._span(target, value))

    def expr_stmt(self, value):
        return ast.ExprStmt(value, value.span)

    def use(self, kw, name, value):
        return ast.Use(str(name), value, self._span(kw, value))

    def return_(self, kw, value):
        return ast.Return(value, self._span(kw, value or kw))

    def assert_(self, kw, cond, message):
        return ast.Assert(cond, message, self._span(kw, message or cond))

    def if_(self, *parts):
        *branches, orelse = parts
        return ast.If(tuple(branches), orelse,
                      self._span(branches[0], (orelse or branches[-1].body)[-1]))

    def if_branch(self, kw, cond, body):
        return ast.IfBranch(cond, body, self._span(kw, body[-1]))

    def switch(self, kw, bind, subject, *cases):
        return ast.Switch(bind and str(bind), subject, cases, self._span(kw, cases[-1]))

    def switch_case(self, kw, value, body):
        if isinstance(value, Token) and value != "_":
            raise ParseError(self._span(value), "a switch case is an integer or '_'")
        number = value.value if isinstance(value, ast.Int) else None
        return ast.SwitchCase(number, body, self._span(kw, body[-1]))

    def match(self, kw, bind, subject, *cases):
        return ast.Match(bind and str(bind), subject, cases, self._span(kw, cases[-1]))

    def match_case(self, kw, ctor, body):
        parts = None if ctor[0] == ("_",) else ctor[0]
        return ast.MatchCase(parts, body, self._span(kw, body[-1]))

    def fold(self, target, kw, var, iterable, state, body):
        result = None if target is None else self._target(target)
        return ast.Fold(result, var, iterable, state or (), body, self._span(target or kw, body[-1]))

    def fold_vars(self, *parts):
        if len(parts) == 1:
            return ast.NameTarget(str(parts[0]), self._span(parts[0]))
        first = ast.NameTarget(str(parts[0]), self._span(parts[0]))
        return ast.TupleTarget((first, *parts[1:]), self._span(first, parts[-1]))

    def fold_var(self, *parts):
        if len(parts) == 1:
            return ast.NameTarget(str(parts[0]), self._span(parts[0]))
        items = tuple(p for p in parts if not isinstance(p, Token))
        return ast.TupleTarget(items, self._span(parts[0], parts[-1]))

    def adt_fold(self, kw, bind, subject, state, *cases):
        return ast.AdtFold(bind and str(bind), subject, state or (), cases,
                           self._span(kw, cases[-1]))

    def bend(self, kw, state, cond, when_body, else_body):
        return ast.Bend(state, cond, when_body, else_body, self._span(kw, else_body[-1]))

    def state_inits(self, *inits):
        return inits

    def state_init(self, name, value):
        return ast.StateInit(str(name), value, self._span(name, value))

    # ---------------------------------------------------------------- expressions

    def tuple_(self, *items):
        return ast.TupleLit(items, self._span(items[0], items[-1]))

    def lambda_(self, kw, *rest):
        *names, body = rest
        params = tuple(str(name) for name in names if name is not None)
        return ast.Lambda(params, body, self._span(kw, body))

    def expr(self, *items):
        return self._group(items, 0, 0)[0]

    def call(self, func, arguments, rpar):
        arguments = arguments or ()
        args = tuple(a for a in arguments if not isinstance(a, ast.Keyword))
        kwargs = arguments[len(args):]
        for late in kwargs:
            if not isinstance(late, ast.Keyword):
                raise ParseError(late.span, "positional argument after a keyword argument")
        return ast.Call(func, args, kwargs, self._span(func, rpar))

    def keyword(self, name, value):
        return ast.Keyword(str(name), value, self._span(name, value))

    def index(self, value, items, rsqb):
        return ast.Index(value, items, self._span(value, rsqb))

    def slice(self, lo, colon, hi, colon2, step):
        return ast.Slice(lo, hi, step, self._span(lo or colon, step or colon2 or hi or colon))

    def ellipsis(self, token):
        return ast.EllipsisIndex(self._span(token))

    def attr(self, value, name):
        return ast.Attr(value, str(name), self._span(name), self._span(value, name))

    def name(self, token):
        return ast.Name(str(token), self._span(token))

    def record(self, type_, fields, rbrace):
        return ast.RecordLit(tuple(type_.split("/")), fields or (), self._span(type_),
                             self._span(type_, rbrace))

    def record_update(self, value, with_lbrace, fields, rbrace):
        return ast.RecordUpdate(value, fields or (), self._span(value, rbrace))

    def field_init(self, name, value):
        return ast.FieldInit(str(name), value, self._span(name, value))

    def paren(self, lpar, inner, rpar):
        if inner is None:
            return ast.TupleLit((), self._span(lpar, rpar))
        return dataclasses.replace(inner, span=self._span(lpar, rpar))

    def list_(self, lsqb, items, rsqb):
        return ast.ListLit(items or (), self._span(lsqb, rsqb))

    def INT(self, token):
        digits = token.replace("_", "")
        try:
            value = int(digits, 0) if digits[:2].lower() in ("0x", "0b") else int(digits)
        except ValueError:                                # over Python's 4300-digit limit
            raise ParseError(self._span(token), "integer literal too long") from None
        return ast.Int(value, self._span(token))

    def FLOAT(self, token):
        return ast.Float(float(token.replace("_", "")), self._span(token))

    def STRING(self, token):
        value = re.sub(r"\\(.)", lambda m: ESCAPES.get(m[1], m[0]), token[1:-1])
        return ast.Str(value, self._span(token))

    def TRUE(self, token):
        return ast.Bool(True, self._span(token))

    def FALSE(self, token):
        return ast.Bool(False, self._span(token))


_BUILDER = Builder()
_LAYOUT = Layout()
_LOCK = threading.Lock()          # the builder and the layout hold the state of one parse


@functools.cache
def _lark() -> Lark:
    """The LALR(1) parser, built on first use."""
    return Lark(Path(__file__).with_name("grammar.lark").read_text(encoding="utf-8"), parser="lalr",
                lexer=Lexer, postlex=_LAYOUT, transformer=_BUILDER, maybe_placeholders=True,
                lexer_callbacks={"BLOCK_COMMENT": _BUILDER._doc_comment})


def parse(source: Source) -> ast.Module:
    """Parse a module; malformed input raises a ParseError that points at the problem."""
    size = len(source.text)
    if size * 4 > MAX_SOURCE_BYTES and (size := len(source.text.encode("utf-8", "replace"))) > MAX_SOURCE_BYTES:
        raise too_large(source.path, source.text[:MAX_EXCERPT_READ], size)
    text = source.text if source.text.endswith("\n") else source.text + "\n"
    parser = _lark()
    with _LOCK, collector.paused():     # (a parse allocates much and frees little)
        _BUILDER._begin(source)
        try:
            tree = parser.parse(text)
        except UnexpectedCharacters as e:
            raise _bad_character(source, e.pos_in_stream) from None
        except UnexpectedToken as e:
            raise _unexpected(source, e.token, e.expected) from None
        except LayoutError as e:
            raise ParseError(Span(source, e.start, e.end), e.message) from None
        except RecursionError:
            raise ParseError(Span(source, 0, 0), "expression nested too deeply") from None
    deep = ast.too_deep(tree, MAX_NESTING)
    if deep is not None:
        raise ParseError(getattr(deep, "op_span", deep.span), f"expressions and blocks nested more "
                                                              f"than {MAX_NESTING} deep")
    return tree


MAX_EXCERPT_READ = 4096       # what is read of a source too large to parse, for its diagnostic


def too_large(path: str, head: str, size: int) -> ParseError:
    """The error for a source over MAX_SOURCE_BYTES, shown at its start (head: its first characters)."""
    return ParseError(Span(Source(path, head), 0, 0), f"the source is {size:,} bytes: a source file "
                                                      f"may have at most {MAX_SOURCE_BYTES:,}")


def _bad_character(source: Source, pos: int) -> ParseError:
    """The error for text that no token matches."""
    text, end = source.text, pos + 1
    if text[pos] in "\"'":
        message = "unterminated string"
    elif text.startswith("#{", pos):
        message = "unclosed '#{' comment"
    elif number := NUMBER_LIKE.match(text, pos):
        message, end = f"invalid number '{number[0]}'", number.end()
        if not number[0].isascii():
            digit = next(c for c in number[0] if not c.isascii())
            message += f": {digit!r} is not an ASCII digit; write numbers with 0-9"
    else:
        message = f"unexpected character {text[pos]!r}"
    return ParseError(Span(source, pos, end), message)


def _unexpected(source: Source, token: Token, expected: set[str]) -> ParseError:
    """The error for a token that the grammar does not allow where it stands."""
    text = source.text
    start = len(text.rstrip()) if token.type == "$END" else min(token.start_pos, len(text))
    layout = token.type in ("_NL", "_DEDENT", "$END")
    span = Span(source, start, start if layout else min(token.end_pos, len(text)))
    at_end = layout and not text[start:].strip()
    what = "end of file" if at_end else _describe(token)
    if _LAYOUT.open_brackets and (at_end or token in STATEMENT_KEYWORDS):
        opener = _LAYOUT.open_brackets[-1]
        return ParseError(Span(source, opener.start_pos, opener.end_pos), f"unclosed '{opener}'",
                          [Note(f"expected '{CLOSERS[opener[-1]]}' before {what}", span)])
    if token.type == "_INDENT":
        tab = text.find("\t", text.rfind("\n", 0, start) + 1, start)
        if tab >= 0:
            return ParseError(Span(source, tab, tab + 1), "tab in indentation; indent with spaces")
        return ParseError(span, "unexpected indent")
    if "_INDENT" in expected:
        return ParseError(span, "expected an indented block")
    line_start = text.rfind("\n", 0, start) + 1
    loop = LOOP.match(text, line_start)
    if loop and loop.end() <= start:
        return ParseError(Span(source, loop.start(1), loop.end(1)), LOOP_HINTS[loop[1]])
    if token.type == "_NL" and "COLON" in expected:           # a line that opens a block
        return ParseError(span, "expected ':'")
    wanted = _describe_expected(expected)
    return ParseError(span, f"unexpected {what}" + (f"; expected {wanted}" if wanted else ""))


def _describe(token: Token) -> str:
    """A token as a message names it."""
    if token.type == "NAME":
        return f"name '{token}'"
    if token.type in ("INT", "FLOAT"):
        return f"number {token}"
    return {"STRING": "string", "_NL": "end of line", "_DEDENT": "end of block",
            "$END": "end of file"}.get(token.type, f"'{token}'")


def _describe_expected(expected: set[str]) -> str | None:
    """The tokens that could have come instead, if they are few enough to list."""
    if {"NAME", "INT"} <= expected:
        return "an expression"
    if "IMPORT" in expected:                                   # at the top level
        return "a def, type, object or import"
    words = set()
    for name in expected:
        pattern = None if name in TOKEN_WORDS else _lark().get_terminal(name).pattern
        if pattern is None:
            words.add(TOKEN_WORDS[name])
        elif pattern.type == "str" and pattern.value not in CONTINUATIONS:
            words.add(f"'{pattern.value}'")
    if not words or len(words) > 3:
        return None
    *others, last = sorted(words)
    return f"{', '.join(others)} or {last}" if others else last
