"""The names every program starts with: primitives, function transforms, dtypes, built-in types."""
from __future__ import annotations

from frontend import structure
from ir import ops
from ir.types import BEND_ONLY_DTYPES, DTYPES

# Function transforms and structure helpers the checker implements itself (they take functions,
# or lists, tuples and records).
SPECIAL_FORMS = ("grad", "value_and_grad", "map", "checkpoint") + structure.FUNCTIONS
# A dtype's limits, static values the checker computes (frontend/introspection.py).
DTYPE_QUERIES = ("finfo", "iinfo")

STATIC_TYPES = ("int", "float", "bool")
BUILTIN_TYPES = STATIC_TYPES + ("Key", "List") + DTYPES


def is_builtin_value(name: str) -> bool:
    """A name usable as a value without a definition: a primitive, a transform, a dtype."""
    return name in SPECIAL_FORMS or name in DTYPE_QUERIES or name in DTYPES or bool(ops.lookup(name))


def builtin_value_names() -> set[str]:
    """Every name is_builtin_value accepts, for "did you mean" hints."""
    return set(SPECIAL_FORMS) | set(DTYPE_QUERIES) | set(DTYPES) | set(ops.SURFACE)


def unsupported_dtype(name: str) -> str | None:
    """The message for Bend's 24-bit numbers, which dslc does not have."""
    if name in BEND_ONLY_DTYPES:
        return f"'{name}' is not supported; use {BEND_ONLY_DTYPES[name]}"
    return None
