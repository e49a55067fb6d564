"""Every primitive, registered by importing its family's module; the operator tables the
front end lowers `a + b` and `-x` with; and lookup by surface name."""
from ir.ops import (construct, contract, control, elementwise, index, observe, order, random,
                    reduce, scan, shape)
from ir.ops.base import REGISTRY, SURFACE, Primitive
from ir.ops.shape import SliceSpec

__all__ = ["BINARY_OPERATORS", "UNARY_OPERATORS", "REGISTRY", "SliceSpec", "lookup",
           "construct", "contract", "control", "elementwise", "index", "observe", "order", "random",
           "reduce", "scan", "shape"]

BINARY_OPERATORS = {
    "+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "//": "floordiv", "**": "pow",
    "@": "matmul",
    "==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge",
    "&": "and", "|": "or", "^": "xor", "<<": "shl", ">>": "shr",
}
UNARY_OPERATORS = {"-": "neg"}


def lookup(surface_name: str) -> list[Primitive]:
    """The primitives users call by this name (several for `split`: by tensor, by key)."""
    return list(SURFACE.get(surface_name, ()))
