"""Static functions of lists, tuples and records, evaluated by the checker: len, zip,
enumerate, leaves, slices (`xs[1:]`) and concatenation (`xs + ys`). Their results are static
lists and tuples of the values they are given, so a fold over them is unrolled."""
from __future__ import annotations

from dataclasses import dataclass

from frontend.diagnostics import CheckError, Span, given
from frontend.values import (UNKNOWN, ListV, RecordV, StaticV, TensorV, TupleV, UnknownV,
                             describe, literal_shape)
from ir.dims import Dim

FUNCTIONS = ("len", "zip", "enumerate", "leaves")


@dataclass(frozen=True)
class PositionsV(ListV):
    """A list made by zip or enumerate: its items are tuples of the values at one position,
    which `map` passes to its function as separate arguments, whole."""

    @staticmethod
    def of(items) -> PositionsV:
        items = tuple(items)
        return PositionsV(items, None, Dim.const(len(items)))


def call(name: str, args: list, spans: list[Span], span: Span):
    """len(xs), zip(xs, ys, …), enumerate(xs) or leaves(s)."""
    if name == "zip":
        if not args:
            raise CheckError(span, "zip takes one list or tuple or more")
        return zipped(args, spans)
    if len(args) != 1:
        raise CheckError(span, f"{name} takes one argument but {given(len(args))}")
    return {"len": length, "enumerate": enumerated, "leaves": leaves_of}[name](args[0], spans[0])


def length(v, span: Span) -> StaticV:
    """The static length of a list or tuple, or of a tensor's leading axis."""
    match v:
        case ListV():
            return StaticV("int", v.length)
        case TupleV():
            return StaticV("int", Dim.const(len(v.items)))
        case TensorV() if v.type.rank > 0:
            return StaticV("int", v.type.shape[0])
        case UnknownV():
            return StaticV("int", Dim.unknown())
    hint = "; len(leaves(r)) counts a record's tensors" if isinstance(v, RecordV) else ""
    raise CheckError(span, f"len needs a list, a tuple or a tensor with an axis, got {describe(v)}{hint}")


def _sequence(v, span: Span, what: str):
    if not isinstance(v, (ListV, TupleV, UnknownV)):
        hint = f"; {what}(leaves(r)) walks a record's tensors" if isinstance(v, RecordV) else ""
        raise CheckError(span, f"{what} needs lists or tuples, got {describe(v)}{hint}")
    return v


def zipped(args: list, spans: list[Span]):
    """The list of tuples of the items at each position; the lists must have one length."""
    seqs = [_sequence(a, s, "zip") for a, s in zip(args, spans)]
    if any(isinstance(s, UnknownV) for s in seqs):
        return UNKNOWN
    if all(s.items is not None for s in seqs):
        n = len(seqs[0].items)
        for s, where in zip(seqs[1:], spans[1:]):
            if len(s.items) != n:
                raise CheckError(where, f"zip needs lists of one length: the first has {n} "
                                        f"items, this one {len(s.items)}")
        return PositionsV.of(TupleV(items) for items in zip(*(s.items for s in seqs)))
    # a List parameter of symbolic length, in a generic check: one abstract item of each
    item = TupleV(tuple(_item(s) for s in seqs))
    n = next(s.length for s in seqs if isinstance(s, ListV) and s.items is None)
    return PositionsV(None, item, n)


def enumerated(v, span: Span):
    """The list of (position, item) pairs, positions static ints from 0."""
    v = _sequence(v, span, "enumerate")
    if isinstance(v, UnknownV):
        return UNKNOWN
    if v.items is None:
        return PositionsV(None, TupleV((StaticV("int", Dim.unknown()), v.elem)), v.length)
    return PositionsV.of(TupleV((StaticV("int", Dim.const(i)), x)) for i, x in enumerate(v.items))


def leaves_of(v, span: Span):
    """The leaves of records, tuples and lists (what `map` applies its function to), in the
    order of their fields and items, as a tuple: they may differ in type."""
    out: list = []

    def walk(x) -> bool:
        match x:
            case RecordV():
                return all(walk(f) for _, f in x.fields)
            case TupleV() | ListV() if x.items is not None:
                return all(walk(i) for i in x.items)
            case ListV() | UnknownV():
                return False                    # a symbolic length: its leaves are not known
        out.append(x)
        return True

    return TupleV(tuple(out)) if walk(v) else UNKNOWN


def sliced(v: ListV | TupleV, lo, hi, step, span: Span):
    """v[lo:hi:step], by Python's rules; the bounds are ints, symbolic Dims or UNKNOWN."""
    if step == 0:
        raise CheckError(span, "a slice step cannot be 0")
    if UNKNOWN in (lo, hi, step):
        return UNKNOWN if isinstance(v, TupleV) else ListV(None, _item(v), Dim.unknown())
    static = all(b is None or isinstance(b, int) for b in (lo, hi, step))
    if v.items is not None and static:
        items = v.items[lo:hi:step]
        return TupleV(items) if isinstance(v, TupleV) else ListV.of(items)
    if isinstance(v, TupleV):                   # its items' types are known one by one
        raise CheckError(span, "a tuple is sliced by static ints only, and a bound of this slice "
                               "is a size: index a tensor, or use a list")
    # a symbolic length or bound: taken to lie inside the list, as for tensors
    n = v.length
    if step not in (None, 1):
        return ListV(None, _item(v), Dim.unknown())
    start = _bound(0 if lo is None else lo, n)
    stop = _bound(n if hi is None else hi, n)
    return ListV(None, _item(v), Dim.of(stop) - start)


def _bound(b, n: Dim) -> Dim:
    return n + b if isinstance(b, int) and b < 0 else Dim.of(b)


def _item(v: ListV):
    """What is known of any one item of v."""
    return v.elem if v.items is None else v.items[0] if v.items else UNKNOWN


def concatenable(a, b) -> bool:
    """Whether `a + b` joins two tuples or two lists (two lists of numbers are tensor
    literals, which `+` adds)."""
    if isinstance(a, TupleV) and isinstance(b, TupleV):
        return True
    return isinstance(a, ListV) and isinstance(b, ListV) and not (
        literal_shape(a) is not None and literal_shape(b) is not None)


def concatenated(a, b):
    """a's items, then b's."""
    if isinstance(a, TupleV):
        return TupleV(a.items + b.items)
    if a.items is not None and b.items is not None:
        return ListV.of(a.items + b.items)
    elem = a.elem if a.items is None else b.elem
    return ListV(None, elem, a.length + b.length)
