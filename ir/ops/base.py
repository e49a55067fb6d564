"""What a primitive is: its call signature, its shape rule, its reference evaluation, its VJP,
its role in a kernel and its scalar body, all in its class; and the registry the front end looks
names up in. The pipeline after the front end dispatches on these objects, never on names."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, ClassVar

import numpy as np

from ir.dims import Dim
from ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, Type


class Kind(Enum):
    """How the checker prepares one argument before calling a shape rule."""
    TENSOR = "a tensor"                  # TensorType; numbers and static number lists arrive weak
    TENSORS = "a list of tensors"        # tuple[TensorType, ...]
    KEY = "a random key"                 # KeyType
    DIM = "a static int"                 # Dim (possibly symbolic)
    SHAPE = "a static list of ints"      # tuple[Dim, ...]
    INT = "a known static int"           # int
    INTS = "a static list of known ints" # tuple[int, ...]
    AXES = "an axis or a tuple of axes"  # None | int | tuple[int, ...]
    BOOL = "a static bool"               # bool
    NUMBER = "a static number"           # int | float
    DTYPE = "a dtype"                    # str, one of ir.types.DTYPES
    STR = "a string"                     # str
    STATIC = "a static value"            # passed as it is: int | Dim | float | bool | str | None
                                         #   | Ellipsis | SliceSpec | a tuple of these


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind
    default: Any = ...                   # ... means required
    variadic: bool = False               # collects the remaining positional arguments

    @property
    def required(self) -> bool:
        return self.default is ... and not self.variadic


class OpError(Exception):
    """A shape or dtype rule failed; `arg` names the offending parameter (None: the whole call).

    The checker turns it into a diagnostic at that argument's span."""

    def __init__(self, message: str, arg: str | None = None):
        super().__init__(message)
        self.message, self.arg = message, arg


class EvalError(Exception):
    """An op that cannot be evaluated on these values (an index out of range, a dtype the
    reference does not have, a failed run-time check); the API reports it as a diagnostic at
    `origin`, the op's (see ir.core.Op), when it has one."""

    def __init__(self, message: str, origin: Any = None):
        super().__init__(message)
        self.origin = origin

    def at(self, op: Any) -> EvalError:
        """This error, at op's origin unless it has one (from an op inside op's body)."""
        if self.origin is None:
            self.origin = op.origin
        return self


class Role(Enum):
    """What a primitive is to the scheduler and the code generators (backend/schedule.py)."""
    ELEMENTWISE = "elementwise"   # one value per point from its operands' there: its scalar body
    REDUCTION = "reduction"       # `combine` along axes: a reduction kernel, or a row kernel's stage
    VIEW = "view"                 # its input's elements read in place (backend/views.py)
    WINDOW = "window"             # a view that is 0 outside a window: read in place by map kernels
    CONTRACTION = "contraction"   # a matrix product: the blocked contraction kernel
    CONSTANT = "constant"         # a literal: written into the kernels that read it
    STRUCTURED = "structured"     # holds a body function (scan, checkpoint) the runtimes run
    SCAN = "scan"                 # `step` along one axis in order: a scan kernel
    COMPOSITE = "composite"       # emitted as the ops of its `expand` (ir/core.py): never in the IR
    HOST = "host"                 # evaluated by the reference interpreter, for `host`'s reason


class Primitive:
    """Base of every primitive. Subclasses set `name`, `params`, and define `infer`.

    Instances are stateless: two of one class are equal, and each prints as its name."""
    name: ClassVar[str]                  # the IR op name, unique
    surface: ClassVar[str | None] = None # the name users call it by, if any (several may share one)
    params: ClassVar[tuple[Param, ...]] = ()
    differentiable: ClassVar[bool] = True
    # tensor parameters whose literal arguments take the dtype of the others (x * 2)
    shares_dtype: ClassVar[tuple[str, ...]] = ()
    role: ClassVar[Role] = Role.HOST
    # why the backends run it (or, for an elementwise primitive, its dtypes without a scalar
    # body) on the host; None: they must compile it, and a plan that cannot is an error
    host: ClassVar[str | None] = None
    # many instructions a value: a row kernel stores it once; a scan gathers lines into lanes
    costly: ClassVar[bool] = False
    random: ClassVar[bool] = False       # each op is its own draw: never merged, never folded
    # it acts when the program runs (prints, or checks and raises): kept though its result
    # is unused, never merged nor folded, run in program order
    effect: ClassVar[bool] = False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return self.name

    def infer(self, **args: Any) -> Type:
        """The result type for bound, prepared arguments; raises OpError."""
        raise NotImplementedError

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        """Cotangents of op's inputs (None: zero) given those of its outputs (None: zero),
        emitted as ops into the ir.core.Builder b (see ir/ad.py)."""
        raise NotImplementedError(f"no VJP rule for '{self.name}'")

    def expand(self, b: Any, **args: Any) -> Any:
        """A composite primitive's result, emitted as the ops that define it into the
        ir.core.Builder b (args: its inputs as Values and its static parameters)."""
        raise NotImplementedError(f"'{self.name}' is not a composition")

    def compiles(self, dtypes: list[str], dtype: str) -> bool:
        """Whether `scalar` has a body for operands of these dtypes and a result of dtype."""
        return False

    def mlir(self, w: Any, op: Any) -> list[str] | None:
        """op written in MLIR by the ir.mlir.Writer w: the SSA names of its results (None: a
        scalar literal, which w writes where it is used)."""
        from ir.mlir import NotExpressible
        raise NotExpressible(f"'{self.name}'")

    def scalar(self, e: Any, args: list, dtypes: list[str], dtype: str, attrs: dict) -> Any:
        """The result at one point (or one vector of lanes) from the operands' values there,
        built with a target's scalar emitter e (backend/llvm.py's Emitter: LLVM operations and
        the exact-mode math library); the body every target fuses into its kernels."""
        raise NotImplementedError(f"'{self.name}' has no scalar body")


REGISTRY: dict[str, Primitive] = {}
SURFACE: dict[str, list[Primitive]] = {}


def primitive(cls: type[Primitive]) -> type[Primitive]:
    """Class decorator: register one instance under its IR name and its surface name."""
    if cls.name in REGISTRY:
        raise ValueError(f"primitive {cls.name!r} registered twice")
    inst = cls()
    REGISTRY[cls.name] = inst
    if cls.surface:
        SURFACE.setdefault(cls.surface, []).append(inst)
    return cls


# ---------------------------------------------------------------- helpers shared by the families

NUMERIC = FLOAT_DTYPES + INT_DTYPES


def _bfloat16() -> type:
    import ml_dtypes
    return ml_dtypes.bfloat16


class _NumpyDtypes(Mapping):
    """dslc's dtypes by name, as NumPy's: ml_dtypes' bfloat16 (which NumPy lacks) looked up at
    its first use. Loading ml_dtypes 0.7 takes a process 0.7 s, and the compile workers and
    the contraction kernel's process never meet bf16."""

    def __init__(self, dtypes: dict[str, type | None], loaders: dict[str, Callable[[], type]]):
        self._dtypes, self._loaders = dtypes, loaders      # None: not looked up yet

    def __getitem__(self, name: str) -> type:
        found = self._dtypes[name]
        if found is None:       # (two threads may both look it up: they find the same type)
            found = self._dtypes[name] = self._loaders[name]()
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._dtypes             # (Mapping's would look the dtype up)

    def __iter__(self) -> Iterator[str]:
        return iter(self._dtypes)

    def __len__(self) -> int:
        return len(self._dtypes)

    def native(self) -> dict[str, type]:
        """The dtypes NumPy has itself (all but bf16), by name."""
        return {name: t for name, t in self._dtypes.items() if name not in self._loaders}


NUMPY_DTYPES = _NumpyDtypes({"f32": np.float32, "f16": np.float16, "bf16": None,
                             "f64": np.float64, "i32": np.int32, "i64": np.int64, "u32": np.uint32,
                             "bool": np.bool_}, {"bf16": _bfloat16})
_LITERAL_DTYPES = {"b": "bool", "i": "i32", "u": "i32", "f": "f32"}
_KIND_WORDS = ("boolean", "integer", "float")


_NATIVE_NAMES = {np.dtype(t): name for name, t in NUMPY_DTYPES.native().items()}


def dtype_name(dtype: np.dtype) -> str | None:
    """The dslc dtype of a NumPy dtype (None where dslc has none); ml_dtypes is loaded only for
    a dtype of kind 'V', which bf16 is."""
    if dtype.kind == "V":
        return "bf16" if dtype == NUMPY_DTYPES["bf16"] else None
    return _NATIVE_NAMES.get(dtype)


def np_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a dslc dtype (bf16 is ml_dtypes', which NumPy lacks)."""
    if dtype not in NUMPY_DTYPES:
        raise NotImplementedError(f"the NumPy reference evaluation has no {dtype}")
    return np.dtype(NUMPY_DTYPES[dtype])


def literal_array(value: Any, dtype: str) -> np.ndarray:
    """A literal's value in a dtype: one beyond its range is ±inf, as IEEE rounding makes it
    (not a NumPy warning)."""
    with np.errstate(over="ignore"):
        return np.asarray(value, dtype=np_dtype(dtype))


def is_float(dtype: np.dtype) -> bool:
    """Whether a NumPy dtype is a float: kind 'f', or bf16, which ml_dtypes gives kind 'V'."""
    return dtype.kind == "f" or dtype_name(dtype) == "bf16"


def type_of(value: Any) -> TensorType:
    """The type of a reference value: arrays are strong; Python numbers and lists are weak
    literals (f32, i32 or bool), as the checker types them."""
    arr = np.asarray(value)
    shape = tuple(Dim.const(n) for n in arr.shape)
    if isinstance(value, (np.ndarray, np.generic)):
        return TensorType(dtype_name(arr.dtype), shape)
    return TensorType(_LITERAL_DTYPES[arr.dtype.kind], shape, weak=True)


def _kind(dtype: str) -> int:
    return 2 if dtype in FLOAT_DTYPES else 1 if dtype in INT_DTYPES else 0


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def common_dtype(op: str, operands: list[tuple[str, TensorType]]) -> tuple[str, bool]:
    """The dtype that operands (parameter name, type) share, and whether it is weak.

    Strong operands must agree; a weak literal takes their dtype unless that would lose its
    kind (a float literal cannot become i32). Weak operands alone give the widest kind."""
    strong = [t for _, t in operands if not t.weak]
    if not strong:
        return max((t.dtype for _, t in operands), key=_kind), True
    first = strong[0]
    for t in strong[1:]:
        if t.dtype != first.dtype:
            raise OpError(f"cannot mix {first} and {t} in '{op}'; use cast() to convert one")
    for name, t in operands:
        if t.weak and _kind(t.dtype) > _kind(first.dtype):
            raise OpError(f"{_a(_KIND_WORDS[_kind(t.dtype)])} literal cannot take the "
                          f"{_KIND_WORDS[_kind(first.dtype)]} dtype {first.dtype}", name)
    return first.dtype, False


def need(t: TensorType, dtypes: tuple[str, ...], message: str | Callable[[], str],
         arg: str | None) -> TensorType:
    """t when its dtype is one of dtypes; a weak integer literal becomes a weak f32 where a
    float is needed (sqrt(T * E)); otherwise OpError(message) — a message may be given as a
    function, so that the checker's hot path does not format it."""
    if t.dtype in dtypes:
        return t
    if t.weak and t.is_int and "f32" in dtypes:
        return TensorType("f32", t.shape, True)
    raise OpError(message() if callable(message) else message, arg)


def check_fill(value: int | float, dtype: str, arg: str) -> None:
    """A static fill value must fit the tensor's kind: no float into an integer tensor."""
    if isinstance(value, float) and dtype not in FLOAT_DTYPES:
        raise OpError(f"the value {value} cannot become {dtype}", arg)


def merge_dims(a: Dim, b: Dim) -> Dim:
    """Of two agreeing dimensions, the one that is known."""
    return b if a.is_unknown else a


def broadcast_shapes(*types: TensorType) -> tuple[Dim, ...]:
    """NumPy broadcasting over symbolic shapes; an unknown dimension agrees with any."""
    out: list[Dim] = []
    for i in range(max(t.rank for t in types), 0, -1):
        dim, source = Dim.const(1), None
        for t in types:
            d = t.shape[-i] if t.rank >= i else Dim.const(1)
            if d.value == 1:
                continue
            if source is not None and not dim.agrees(d):
                raise OpError(f"cannot broadcast {source} with {t}")
            if source is None or dim.is_unknown:
                dim, source = d, t
        out.append(dim)
    return tuple(out)


def normalize_axes(axes: None | int | tuple[int, ...], rank: int, what: object,
                   arg: str = "axis") -> tuple[int, ...]:
    """Axes counted from 0, in the order given; None means all of them."""
    if axes is None:
        return tuple(range(rank))
    given = (axes,) if isinstance(axes, int) else tuple(axes)
    out: list[int] = []
    for a in given:
        if not -rank <= a < rank:
            raise OpError(f"axis {a} is out of range for {what} of rank {rank}", arg)
        if a % rank in out:
            raise OpError(f"axis {a} is repeated in {axes}", arg)
        out.append(a % rank)
    return tuple(out)


def format_shape(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def check_shape(shape: tuple[Dim, ...], arg: str) -> None:
    """A shape given as an argument has no negative dimensions."""
    if any(d.value is not None and d.value < 0 for d in shape):
        raise OpError(f"shape {format_shape(shape)} has a negative dimension", arg)


def range_length(lo: Dim, hi: Dim, step: int) -> Dim:
    """len(range(lo, hi, step)) for symbolic bounds (step nonzero)."""
    span = hi - lo if step > 0 else lo - hi
    n = (span + (abs(step) - 1)) // abs(step)
    return Dim.const(max(n.value, 0)) if n.value is not None else n


# ---------------------------------------------------------------- helpers shared by VJP rules
# `b` is an ir.core.Builder, `op` an ir.core.Op; cotangents are ir.core.Values.

def statics(op: Any) -> dict[str, Any]:
    """op's static parameters, with the defaults of those it leaves out."""
    given = op.attrs
    return {p.name: given.get(p.name, p.default) for p in op.primitive.params
            if p.kind not in (Kind.TENSOR, Kind.TENSORS, Kind.KEY) and not p.variadic}


def unbroadcast(b: Any, ct: Any, shape: tuple[int, ...]) -> Any:
    """ct summed over the axes that broadcasting to ct's shape added to `shape` or stretched
    in it: the cotangent of a value of `shape` that was broadcast."""
    shape = tuple(shape)
    if ct.shape == shape:
        return ct
    lead = len(ct.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and ct.shape[lead + i] != 1)
    if axes and tuple(n for i, n in enumerate(ct.shape) if i not in axes) == shape:
        return b.emit("sum", ct, axis=axes, keepdims=False)      # one op, no reshape
    if axes:
        ct = b.emit("sum", ct, axis=axes, keepdims=True)
    return ct if ct.shape == shape else b.emit("reshape", ct, shape=shape)


def zero_where_ct_is_zero(b: Any, ct: Any, value: Any) -> Any:
    """value, but 0 wherever ct is 0: a zero cotangent gives a zero input cotangent even where
    the local derivative is inf or NaN (`where(x > 0, sqrt(x), 0)` at x = 0)."""
    zero = b.constant(0.0, ct.dtype)
    return b.emit("where", b.emit("eq", ct, zero), zero, value)
