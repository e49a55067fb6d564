"""A program printed generic in its dimensions (`dslc grad` without --dims, docs/language.md §14).

The IR has concrete shapes, so the program is printed once per sample: each assigns the open
dimensions distinct primes (`sample_sizes`), every sample's sizes differing from every
other's. The texts must be the same token for token but for their numbers; then each number is
printed as it is where it is the same in every sample, and otherwise as the one dimension
expression that gives it in every sample (`dimension_expression`). A number that changes with
the sizes in no such way, or in two, is an error. A name therefore stands only for a number
that changed with that dimension through all the samples, never for one that merely equals
its size once.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass
from fractions import Fraction

SAMPLES = 5                 # pairs of terms take three samples to solve; the others check them
MAX_DEGREE = 3              # of a single term (B * T * C); each of a pair of terms has at most 2
PRIMES = [p for p in range(11, 252) if all(p % q for q in range(2, int(p ** 0.5) + 1))]

TOKEN = re.compile(r"""(?P<name>[A-Za-z_]\w*)|(?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
                       |(?P<string>"(?:\\.|[^"\\])*")|(?P<space>\s+)|(?P<other>.)""", re.X)


class NotGeneric(Exception):
    """The samples' texts do not make one generic program; the message says where and why."""


def sample_sizes(names: list[str]) -> list[dict[str, int]]:
    """SAMPLES assignments of primes between 11 and 251 to `names`, no prime used twice, drawn
    the same way each time, so that sizes made from different dimensions rarely coincide
    (which could merge two ops in one sample). Within a sample a name earlier in the list gets
    a larger size: an input's data dimensions tend to come before its kernels', which must not
    exceed them."""
    if SAMPLES * len(names) > len(PRIMES):
        raise NotGeneric(f"{len(names)} dimensions are more than can be sampled")
    drawn = random.Random(0).sample(PRIMES, SAMPLES * len(names))
    return [dict(zip(names, sorted(drawn[k::SAMPLES], reverse=True))) for k in range(SAMPLES)]


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str


def _tokens(text: str) -> list[_Token]:
    return [_Token(m.lastgroup, m.group()) for m in TOKEN.finditer(text)]


def merge(texts: list[str], samples: list[dict[str, int]]) -> str:
    """The one program the texts printed at `samples` are, with each number that differs among
    them as its dimension expression (see the module docstring)."""
    streams = [_tokens(t) for t in texts]
    if len({len(s) for s in streams}) != 1:
        raise NotGeneric(_first_difference(texts))
    out: list[str] = []
    for k, column in enumerate(zip(*streams)):
        first = column[0]
        if all(t == first for t in column):
            out.append(first.text)
            continue
        if any(t.kind != "number" for t in column):
            raise NotGeneric(_first_difference(texts))
        values = [_integer(t.text) for t in column]
        expr = dimension_expression(values, samples) if None not in values else None
        if expr is None:
            raise NotGeneric(f"{', '.join(t.text for t in column)} at the sizes "
                             f"{'; '.join(map(_sizes, samples))} is no single expression of "
                             f"the dimensions (line {''.join(x.text for x in streams[0][:k]).count(chr(10)) + 1}:"
                             f" {_line_at(streams[0], k)})")
        before = next((t.text for t in reversed(streams[0][:k]) if t.kind != "space"), "")
        after = next((t.text for t in streams[0][k + 1:] if t.kind != "space"), "")
        bare = " " not in expr or (before in "[(,:=" and after in ",)]:")
        out.append(expr if bare else f"({expr})")
    return "".join(out)


def _integer(text: str) -> int | None:
    """A number token's value when it is a whole number (5 and 5.0 alike), else None."""
    value = float(text) if any(c in text for c in ".eE") else int(text)
    return int(value) if math.isfinite(value) and value == int(value) else None


def _sizes(sample: dict[str, int]) -> str:
    return ", ".join(f"{n}={v}" for n, v in sample.items())


def _line_at(tokens: list[_Token], k: int) -> str:
    text = "".join(t.text for t in tokens)
    at = sum(len(t.text) for t in tokens[:k])
    start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
    return text[start:end if end >= 0 else len(text)].strip()


def _first_difference(texts: list[str]) -> str:
    """Where the first two texts that differ in more than their numbers first do so."""
    lines = [t.splitlines() for t in texts]
    for row in itertools.zip_longest(*lines, fillvalue=""):
        shapes = {re.sub(r"\d+(\.\d*)?", "0", line) for line in row}
        if len(shapes) > 1:
            return "its text changes with the sizes in more than its numbers: " + \
                " / ".join(dict.fromkeys(_shortened(line.strip()) for line in row))
    return "its text changes with the sizes in more than its numbers"


def _shortened(line: str, limit: int = 100) -> str:
    return line if len(line) <= limit else line[:limit - 1] + "…"


# ---------------------------------------------------------------- dimension expressions

Monomial = tuple[str, ...]      # sorted names, with repetition: ('B', 'T') is B * T


def dimension_expression(values: list[int], samples: list[dict[str, int]]) -> str | None:
    """The one expression c * m + k, else c * m + c' * m' + k (m, m' products of names, c, c'
    and k integers), that gives values[i] at samples[i] for every i; None when there is none,
    or more than one of the fewest terms."""
    names = sorted(samples[0])
    singles = [m for d in range(1, MAX_DEGREE + 1)
               for m in itertools.combinations_with_replacement(names, d)]
    for terms in ([(m,) for m in singles],
                  list(itertools.combinations([m for m in singles if len(m) <= 2], 2))):
        found = {fit for ms in terms if (fit := _fit(ms, values, samples)) is not None}
        if found:
            return _text(found.pop()) if len(found) == 1 else None
    return None


def _fit(monomials: tuple[Monomial, ...], values: list[int],
         samples: list[dict[str, int]]) -> tuple[tuple[tuple[Monomial, int], ...], int] | None:
    """Integer coefficients (one per monomial, none zero) and a constant that give the values
    at every sample, solved exactly from the first len(monomials) + 1 samples."""
    n = len(monomials) + 1
    rows = [[Fraction(_eval(m, s)) for m in monomials] + [Fraction(1)] for s in samples[:n]]
    solution = _solve(rows, [Fraction(v) for v in values[:n]])
    if solution is None or any(x.denominator != 1 for x in solution):
        return None
    *coefficients, constant = (int(x) for x in solution)
    if 0 in coefficients:
        return None
    if any(sum(c * _eval(m, s) for c, m in zip(coefficients, monomials)) + constant != v
           for s, v in zip(samples, values)):
        return None
    return tuple(sorted(zip(monomials, coefficients))), constant


def _eval(m: Monomial, sample: dict[str, int]) -> int:
    out = 1
    for name in m:
        out *= sample[name]
    return out


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction] | None:
    """The solution of a square linear system by Gaussian elimination; None when singular."""
    a = [row + [b] for row, b in zip(rows, rhs)]
    n = len(a)
    for col in range(n):
        pivot = next((r for r in range(col, n) if a[r][col] != 0), None)
        if pivot is None:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col and a[r][col] != 0:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def _text(fit: tuple[tuple[tuple[Monomial, int], ...], int]) -> str:
    """c * m + … + k as .bend text, positive terms first, names in alphabetical order:
    `B * C`, `W - KW + 1`, `2 * D`."""
    terms, constant = fit
    parts = [(c, " * ".join(([str(abs(c))] if abs(c) != 1 else []) + list(m)))
             for m, c in sorted(terms, key=lambda t: (t[1] < 0, -len(t[0]), t[0]))]
    if constant:
        parts.append((constant, str(abs(constant))))
    text = ("-" if parts[0][0] < 0 else "") + parts[0][1]
    for c, part in parts[1:]:
        text += (" - " if c < 0 else " + ") + part
    return text
