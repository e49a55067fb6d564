"""The types of dslc values: tensors with symbolic shapes, statics, keys, and structures."""
from __future__ import annotations

from dataclasses import dataclass

from ir.dims import Dim

FLOAT_DTYPES = ("f32", "f16", "bf16", "f64")
INT_DTYPES = ("i32", "i64", "u32")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
BEND_ONLY_DTYPES = {"u24": "u32", "i24": "i32", "f24": "f32"}


@dataclass(frozen=True)
class TensorType:
    """A runtime tensor. `weak` marks a literal's type: it takes the dtype of the tensor it meets."""
    dtype: str
    shape: tuple[Dim, ...]
    weak: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @property
    def is_int(self) -> bool:
        return self.dtype in INT_DTYPES

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(self.dtype, tuple(shape), self.weak)

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(dtype, self.shape, False)

    def __str__(self) -> str:
        dims = ", ".join(map(str, self.shape))
        if not self.shape and self.dtype != "bool" and not self.weak:
            return self.dtype
        return f"{'literal ' if self.weak else ''}{self.dtype}[{dims}]"


def tensor(dtype: str, *shape: int | str | Dim) -> TensorType:
    """Shorthand: tensor('f32', 'B', 4) is f32[B, 4]."""
    return TensorType(dtype, tuple(Dim.of(d) for d in shape))


@dataclass(frozen=True)
class StaticType:
    """A compile-time value: 'int', 'float', 'bool' or 'str'."""
    kind: str

    def __str__(self) -> str:
        return self.kind


@dataclass(frozen=True)
class KeyType:
    def __str__(self) -> str:
        return "Key"


@dataclass(frozen=True)
class DTypeType:
    """The type of a dtype name used as a value, as in cast(x, f32)."""
    def __str__(self) -> str:
        return "dtype"


@dataclass(frozen=True)
class TupleType:
    items: tuple[Type, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.items)) + ("," if len(self.items) == 1 else "") + ")"


@dataclass(frozen=True)
class ListType:
    """A static-length list; its elements share one type."""
    elem: Type
    length: Dim

    def __str__(self) -> str:
        return f"List({self.elem})[{self.length}]"


@dataclass(frozen=True)
class RecordType:
    """An instance of an `object` declaration: its fields with dimensions substituted."""
    name: str
    fields: tuple[tuple[str, Type], ...]

    def field(self, name: str) -> Type | None:
        return dict(self.fields).get(name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class AdtType:
    """A value of a `type` declaration; always static."""
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FunctionType:
    """A function value (a def, a lambda, a primitive, a transform of one)."""
    name: str

    def __str__(self) -> str:
        return f"function {self.name}"


@dataclass(frozen=True)
class UnknownType:
    """What the checker cannot know before specialisation; agrees with everything."""
    def __str__(self) -> str:
        return "?"


Type = (TensorType | StaticType | KeyType | DTypeType | TupleType | ListType | RecordType
        | AdtType | FunctionType | UnknownType)


def types_agree(a: Type, b: Type) -> bool:
    """Structural equality where unknown dimensions and types agree with anything."""
    if isinstance(a, UnknownType) or isinstance(b, UnknownType):
        return True
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        return (a.dtype == b.dtype and a.rank == b.rank
                and all(x.agrees(y) for x, y in zip(a.shape, b.shape)))
    if isinstance(a, TupleType) and isinstance(b, TupleType):
        return len(a.items) == len(b.items) and all(map(types_agree, a.items, b.items))
    if isinstance(a, ListType) and isinstance(b, ListType):
        return a.length.agrees(b.length) and types_agree(a.elem, b.elem)
    if isinstance(a, RecordType) and isinstance(b, RecordType):
        return (a.name == b.name
                and all(types_agree(x, y) for (_, x), (_, y) in zip(a.fields, b.fields)))
    return a == b
