"""Source positions and user-facing errors, rendered as `file:line:col: error: ...` (docs/language.md §13)."""
from __future__ import annotations

import bisect
import difflib
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from frontend.limits import MAX_DIAGNOSTICS, MAX_EXCERPT


@dataclass(frozen=True, eq=False)
class Source:
    """A source text and the path it is reported under."""
    path: str
    text: str

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    @cached_property
    def line_starts(self) -> list[int]:
        return [0] + [i + 1 for i, ch in enumerate(self.text) if ch == "\n"]

    def position(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of a character offset."""
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return line + 1, offset - self.line_starts[line] + 1

    def line_text(self, line: int) -> str:
        start = self.line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]


@dataclass(frozen=True)
class Span:
    """The characters [start, end) of a source."""
    source: Source = field(compare=False, repr=False)
    start: int
    end: int

    @property
    def line(self) -> int:
        return self.source.position(self.start)[0]

    @property
    def col(self) -> int:
        return self.source.position(self.start)[1]

    def to(self, other: Span) -> Span:
        """The span from the start of this one to the end of another."""
        return Span(self.source, self.start, max(self.end, other.end))

    def where(self) -> str:
        return f"{self.source.path}:{self.line}"

    def __str__(self) -> str:
        return f"{self.source.path}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Site:
    """Where an IR op was written, and the calls that led there (innermost first): what a
    run-time error of the op reports, and where `debug` says it printed from."""
    span: Span
    calls: tuple[tuple[str, Span], ...] = ()

    def error(self, message: str) -> DslError:
        notes = [Note(f"in '{name}' called from {span}") for name, span in self.calls[:3]]
        return DslError(self.span, message, notes)

    @property
    def identity(self) -> str:
        """The site as text that differs for any other source text or position."""
        spans = [self.span, *(s for _, s in self.calls)]
        return ";".join(f"{s.source.digest}:{s.start}:{s.end}" for s in spans)

    def __str__(self) -> str:
        return str(self.span)


@dataclass(frozen=True)
class Note:
    """A secondary message, optionally pointing at the place it speaks of."""
    message: str
    span: Span | None = None

    def render(self) -> str:
        return f"note: {self.message}" + (f" ({self.span.where()})" if self.span else "")


@dataclass(frozen=True)
class Diagnostic:
    span: Span | None
    message: str
    notes: tuple[Note, ...] = ()

    def render(self) -> str:
        if self.span is None:
            head = [f"error: {self.message}"]
        else:
            head = [f"{self.span}: error: {self.message}", *excerpt(self.span)]
        return "\n".join(head + [n.render() for n in self.notes])


def excerpt(span: Span) -> list[str]:
    """The source line of a span and a caret line under it (`^` then `~` to the span's end);
    of a line longer than MAX_EXCERPT, the part around the caret, cut ends marked `…`."""
    line, col = span.line, span.col
    text = span.source.line_text(line).replace("\t", " ")
    width = max(1, min(span.end - span.start, len(text) - col + 1))
    if len(text) > MAX_EXCERPT:
        first = max(0, min(col - 1 - MAX_EXCERPT // 4, len(text) - MAX_EXCERPT))
        shown = ("…" if first else "") + text[first:first + MAX_EXCERPT]
        text = shown + ("…" if first + MAX_EXCERPT < len(text) else "")
        col = col - first + (1 if first else 0)
        width = max(1, min(width, len(shown) - col + 1))
    gutter = f"{line:>5}"
    return [f"{gutter} | {text}", f"{' ' * len(gutter)} | {' ' * (col - 1)}^{'~' * (width - 1)}"]


class DslError(Exception):
    """A user error: one or more diagnostics; `str()` is their rendering."""

    def __init__(self, span: Span | None, message: str, notes: list[Note] | tuple[Note, ...] = ()):
        self.diagnostics: tuple[Diagnostic, ...] = (Diagnostic(span, message, tuple(notes)),)
        super().__init__(message)

    @classmethod
    def collect(cls, errors: list[DslError]) -> DslError:
        """One error carrying the diagnostics of several, in source order; past MAX_DIAGNOSTICS,
        a note on the last one counts the others."""
        err = cls.__new__(cls)
        diags = [d for e in errors for d in e.diagnostics]
        diags.sort(key=lambda d: (d.span.source.path, d.span.start) if d.span else ("", 0))
        if len(diags) > MAX_DIAGNOSTICS:
            last = diags[MAX_DIAGNOSTICS - 1]
            more = Note(f"{len(diags) - MAX_DIAGNOSTICS:,} more errors are not shown")
            diags = diags[:MAX_DIAGNOSTICS - 1] + [Diagnostic(last.span, last.message, last.notes + (more,))]
        err.diagnostics = tuple(diags)
        Exception.__init__(err, diags[0].message)
        return err

    @property
    def span(self) -> Span | None:
        return self.diagnostics[0].span

    @property
    def message(self) -> str:
        return self.diagnostics[0].message

    def __str__(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)


class ParseError(DslError):
    """Text that is not a program of the grammar (lexical structure included)."""


class ResolveError(DslError):
    """An unknown name, a bad import, an import cycle."""


class CheckError(DslError):
    """A type, shape or static-evaluation error."""


class ShapeError(CheckError):
    """Shapes that do not agree."""


class LimitError(CheckError):
    """Work past a limit of frontend/limits.py: the check stops at the first one."""


def with_note(e: DslError, note: Note) -> DslError:
    """e with note added to its first diagnostic, unless that has three 'in …' notes already."""
    first, *rest = e.diagnostics
    if sum(1 for n in first.notes if n.message.startswith("in '")) < 3:
        first = type(first)(first.span, first.message, first.notes + (note,))
    e.diagnostics = (first, *rest)
    return e


# A list is not grown step by step, nor made by a fold (which stacks): the hint for those who try.
LIST_BY_MAP = "to make a list from another, use map, e.g. map(lambda k: init(k, D), split(key, L))"


def counted(n: int, noun: str) -> str:
    """'1 argument', '2 arguments': a count in a message, in the right number."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def given(n: int) -> str:
    """'1 was given', '2 were given'."""
    return f"{n} {'was' if n == 1 else 'were'} given"


def did_you_mean(name: Any, candidates) -> str:
    """' (did you mean 'loss'?)' when a candidate is close to `name`, else ''."""
    close = difflib.get_close_matches(name, list(candidates), n=1) if isinstance(name, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""
