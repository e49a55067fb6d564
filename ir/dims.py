"""Symbolic dimensions: integer polynomials over dimension variables.

`T * E` and `E * T` are the same dimension; `2 * C + C` is `3 * C`. Floor division that is
not exact becomes an opaque atom (`(T + 1) // 2`). `Dim.unknown()` stands for a dimension the
checker cannot know before specialisation; it agrees with every dimension.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import reduce

Monomial = tuple[str, ...]          # sorted atom names, with repetition: ('E', 'T') is E*T


@dataclass(frozen=True)
class Dim:
    terms: tuple[tuple[Monomial, int], ...]     # sorted, no zero coefficients
    unknown_: bool = False
    spelling: str | None = field(default=None, compare=False)   # as the user wrote it

    def spelled(self, text: str) -> Dim:
        """The same dimension, shown in messages as the user wrote it (`T * E`, not `E * T`)."""
        return replace(self, spelling=text)

    @staticmethod
    def const(n: int) -> Dim:
        known = _CONSTANTS.get(n) if type(n) is int else None
        if known is None:
            known = Dim((((), n),) if n else ())
            if type(n) is int and -_KEPT <= n <= _KEPT:
                _CONSTANTS[n] = known
        return known

    @staticmethod
    def var(name: str) -> Dim:
        return Dim((((name,), 1),))

    @staticmethod
    def unknown() -> Dim:
        return Dim((), True)

    @staticmethod
    def of(x: int | str | Dim) -> Dim:
        return x if isinstance(x, Dim) else Dim.var(x) if isinstance(x, str) else Dim.const(x)

    @property
    def is_unknown(self) -> bool:
        return self.unknown_

    @property
    def value(self) -> int | None:
        """The integer this dimension is, when it is a constant."""
        terms = self.terms                  # (the hottest property of the compiler: no list made)
        if self.unknown_ or len(terms) > 1:
            return None
        if not terms:
            return 0
        mono, c = terms[0]
        return c if mono == () else None

    def free_vars(self) -> frozenset[str]:
        """The variables this dimension depends on, those of its floor divisions included."""
        return frozenset().union(*(_atom_vars(a) for mono, _ in self.terms for a in mono))

    def __add__(self, other: Dim | int) -> Dim:
        numbers = _numbers(self, other)
        return Dim.const(numbers[0] + numbers[1]) if numbers else _combine(self, Dim.of(other), 1)

    def __sub__(self, other: Dim | int) -> Dim:
        numbers = _numbers(self, other)
        return Dim.const(numbers[0] - numbers[1]) if numbers else _combine(self, Dim.of(other), -1)

    def __neg__(self) -> Dim:
        return Dim(tuple((m, -c) for m, c in self.terms), self.unknown_)

    def __mul__(self, other: Dim | int) -> Dim:
        numbers = _numbers(self, other)
        if numbers:
            return Dim.const(numbers[0] * numbers[1])
        other = Dim.of(other)
        if self.unknown_ or other.unknown_:
            return Dim.unknown()
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2))
                acc[m] = acc.get(m, 0) + c1 * c2
        return _normal(acc)

    __radd__ = __add__
    __rmul__ = __mul__

    def __rsub__(self, other: Dim | int) -> Dim:
        return Dim.of(other) - self

    def __floordiv__(self, other: Dim | int) -> Dim:
        other = Dim.of(other)
        if self.unknown_ or other.unknown_:
            return Dim.unknown()
        exact = self.divide_exactly(other)
        if exact is not None:
            return exact
        a, b = self.value, other.value
        if a is not None and b is not None and b != 0:
            return Dim.const(a // b)
        name = f"{OPAQUE}{_paren(self)} // {_paren(other)}"
        _DIVISIONS.setdefault(name, (self, other))
        return Dim.var(name)

    def divide_exactly(self, other: Dim) -> Dim | None:
        """self / other when other is a monomial that divides every term exactly, else None."""
        if self.unknown_ or other.unknown_ or len(other.terms) != 1:
            return None
        (dm, dc), = other.terms
        acc: dict[Monomial, int] = {}
        for m, c in self.terms:
            rest = list(m)
            for atom in dm:
                if atom not in rest:
                    return None
                rest.remove(atom)
            if dc == 0 or c % dc:
                return None
            acc[tuple(rest)] = c // dc
        return _normal(acc)

    def subst(self, env: dict[str, Dim]) -> Dim:
        """Replace variables bound in env."""
        if self.unknown_ or self.value is not None or env.keys().isdisjoint(self.free_vars()):
            return self
        total = Dim.const(0)
        for mono, c in self.terms:
            total = total + reduce(lambda acc, a: acc * _subst_atom(a, env), mono, Dim.const(c))
        return total

    def agrees(self, other: Dim) -> bool:
        """Equal, or possibly equal: one side unknown, or they differ only by floor divisions
        the checker cannot decide (`H * (D // H)` is D exactly when H divides D)."""
        if self.unknown_ or other.unknown_ or self == other:
            return True
        return any(a.startswith(OPAQUE) for mono, _ in (self - other).terms for a in mono)

    def __str__(self) -> str:
        if self.spelling is not None:
            return self.spelling
        if self.unknown_:
            return "?"
        if not self.terms:
            return "0"
        out = ""
        for i, (mono, c) in enumerate(sorted(self.terms, key=lambda t: (-len(t[0]), t[0]))):
            factors = ([str(abs(c))] if abs(c) != 1 or not mono else []) + [_atom(a) for a in mono]
            text = " * ".join(factors)
            out += (("- " if c < 0 else "+ ") if i else ("-" if c < 0 else "")) + text + " "
        return out.strip()


def _numbers(a: Dim, b: Dim | int) -> tuple[int, int] | None:
    """a and b as the numbers they are, when both are (while tracing, every size is one: the
    arithmetic is then the numbers', not the polynomials')."""
    x, y = a.value, b if type(b) is int else Dim.of(b).value
    return None if x is None or y is None else (x, y)


_KEPT = 1 << 12          # constants up to this size are made once (tracing makes thousands)
_CONSTANTS: dict[int, Dim] = {}

OPAQUE = "//"     # the prefix of an atom that stands for a floor division the checker cannot do
# each such atom's operands, so that it is computed once they are known (`E // H` with E = 3, H = 2
# is 1: as a bare name it agreed with any size)
_DIVISIONS: dict[str, tuple[Dim, Dim]] = {}


def _atom_vars(a: str) -> frozenset[str]:
    if not a.startswith(OPAQUE):
        return frozenset((a,))
    operands = _DIVISIONS.get(a, ())
    return frozenset().union(*(d.free_vars() for d in operands))


def _subst_atom(a: str, env: dict[str, Dim]) -> Dim:
    if a in env:
        return env[a]
    if a in _DIVISIONS:
        num, den = _DIVISIONS[a]
        return num.subst(env) // den.subst(env)
    return Dim.var(a)


def _atom(a: str) -> str:
    """An atom as shown: a name, or an undecidable floor division in parentheses."""
    return f"({a[len(OPAQUE):]})" if a.startswith(OPAQUE) else a


def _paren(d: Dim) -> str:
    """A dimension as an operand of //: parenthesised unless it is one name or number."""
    s = str(d)
    return s if " " not in s else f"({s})"


def _normal(acc: dict[Monomial, int]) -> Dim:
    return Dim(tuple(sorted((m, c) for m, c in acc.items() if c)))


def _combine(a: Dim, b: Dim, sign: int) -> Dim:
    if a.unknown_ or b.unknown_:
        return Dim.unknown()
    acc = dict(a.terms)
    for m, c in b.terms:
        acc[m] = acc.get(m, 0) + sign * c
    return _normal(acc)


def solve(declared: Dim, actual: Dim, env: dict[str, Dim]) -> dict[str, Dim] | None:
    """Bindings for the one unbound variable of `declared` (linear in it) that make it `actual`.

    Returns {} when declared has no unbound variable, None when it cannot be solved (yet)."""
    d = declared.subst(env)
    unbound = sorted(declared.free_vars() - env.keys())
    if not unbound:
        return {}
    if len(unbound) != 1 or actual.is_unknown:
        return None
    u = unbound[0]
    coeff, rest = Dim.const(0), Dim.const(0)
    for mono, c in d.terms:
        n = mono.count(u)
        if n > 1:
            return None
        term = Dim(((mono, c),))
        if n:
            coeff = coeff + Dim(((tuple(a for a in mono if a != u), c),))
        else:
            rest = rest + term
    value = (actual - rest).divide_exactly(coeff)
    if value is None:
        a, b = (actual - rest).value, coeff.value
        if a is None or not b or a % b:
            return None
        value = Dim.const(a // b)
    return {u: value}
