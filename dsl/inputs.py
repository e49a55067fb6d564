"""What a Python caller (or --dims, or `dslc run`'s arrays) passes an entry point, converted
and checked against the entry's annotations and dslc's limits (docs/language.md §13.1)."""
from __future__ import annotations

import contextlib
import difflib
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields as dataclass_fields, is_dataclass
from typing import Any

import numpy as np

from dsl.values import Key, key
from frontend import ast
from frontend.diagnostics import DslError, Note, counted, did_you_mean, given
from frontend.resolve import lookup_type
from frontend.unify import NO_PARAMS, Params, eval_dim, record_params
from frontend.values import KeyV, ListV, RecordV, StaticV, TensorV, TupleV
from ir.core import Builder, Function, tensor_type
from ir.dims import Dim
from ir.ops.base import NUMPY_DTYPES, dtype_name
from ir.types import KeyType, TensorType


@dataclass(frozen=True)
class Spec:
    """A tensor input's type without its array: what --dims makes for `dslc ir`, `grad` and
    `compile`, which must not allocate the arrays whose shapes they print."""
    dtype: str
    shape: tuple[int, ...]


MAX_BYTES = 2 ** 40        # no array may be larger (nor larger than the machine's memory)
COMPILED = "an array of compiled code may take (2**40)"
MAX_DIM = 2 ** 40          # a dimension given by --dims or dims=
MAX_LIST = 2 ** 16         # a list's length given by --dims (lists are unrolled)
MAX_INT = 2 ** 63          # a static int is in (-MAX_INT, MAX_INT)


def memory_bytes() -> int:
    """The array size a run may not exceed: MAX_BYTES, or the machine's memory if smaller."""
    try:
        return min(MAX_BYTES, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return MAX_BYTES


def check_sizes(span, name: str, fn: Function, limit: int, bound: str) -> None:
    """Refuse to run or compile fn when one of its arrays would be larger than `limit` bytes
    (`bound` says why), before anything is allocated (NumPy would otherwise try, or the system
    kill the process) or compiled (an index past 2**63 would wrap)."""
    def walk(f: Function):
        yield from (("an input", v) for v in f.params)
        for op in f.ops:
            yield from ((f"made by {op.primitive.name}", v) for v in op.outputs)
            if op.body is not None:
                yield from walk(op.body)
    for what, v in walk(fn):
        if v.is_key:
            continue
        size = math.prod(v.shape) * np.dtype(NUMPY_DTYPES[v.dtype]).itemsize
        if size > limit:
            raise DslError(span, f"'{name}' would need an array of {size} bytes, {v.type} ({what}), "
                                 f"more than the {limit} bytes {bound}")


@dataclass(frozen=True)
class Inputs:
    """A call's arguments: their abstract values (the specialisation key) and their arrays,
    with the Python number each array made from one was made from, by its position."""
    abstract: list
    arrays: list[np.ndarray]
    arg_leaves: list[list[int]]
    numbers: dict[int, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return tuple(signature_of(a) for a in self.abstract)


def signature_of(v) -> Any:
    """What a specialisation depends on: types and static values, not the arrays' contents."""
    match v:
        case TensorV():
            return v.type
        case KeyV():
            return "key"
        case TupleV() | ListV():
            return (type(v).__name__, tuple(signature_of(i) for i in v.items))
        case RecordV():
            return (v.name, tuple((n, signature_of(f)) for n, f in v.fields))
    return v


def bind_python(d: ast.Def, args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by parameter name, with the defaults of those not given."""
    names = [p.name for p in d.params]
    if len(args) > len(names):
        raise DslError(d.name_span, f"'{d.name}' takes {counted(len(names), 'argument')} but {given(len(args))}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise DslError(d.name_span, f"'{d.name}' has no parameter {k!r}{did_you_mean(k, names)}"
                           if k not in names else f"'{d.name}' got two values for '{k}'")
        bound[k] = v
    for p in d.params:
        if p.name not in bound and p.default is not None:
            bound[p.name] = literal_default(p)
    missing = [n for n in names if n not in bound]
    if missing:
        raise DslError(d.name_span, f"'{d.name}' is missing the argument '{missing[0]}'")
    return bound


def literal_default(p: ast.Param) -> Any:
    """An entry parameter's default, which must be a literal (a number, bool or string)."""
    e, sign = p.default, 1
    if isinstance(e, ast.UnaryOp) and e.op == "-":
        e, sign = e.operand, -1
    if isinstance(e, (ast.Int, ast.Float)):
        return sign * e.value
    if isinstance(e, (ast.Bool, ast.Str)) and sign == 1:
        return e.value
    raise DslError(p.default.span, f"an entry point's default for '{p.name}' must be a literal")


def from_python(b: Builder, value: Any, t: ast.TypeExpr, mod, where: str, arrays: list,
                device: str = "cpu", params: Params = NO_PARAMS, numbers: dict | None = None):
    """The abstract value of a Python input for a parameter annotated t (a field of a record
    whose use gives `params`), for a program on `device`; arrays become parameters of b and are
    appended to `arrays` in the same order, and where one is made from a Python number, that
    number is `numbers[its position]`."""
    if (arg := type_argument(t, params, where)) is not None:
        return from_python(b, value, arg[0], arg[1], where, arrays, device, arg[2], numbers)
    name = "/".join(t.name) if isinstance(t, ast.NamedType) else None
    if isinstance(t, ast.TensorTypeExpr) or name in NUMPY_DTYPES and name != "bool":
        dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else name
        arr = _plain(value, t, where) if isinstance(value, np.ndarray) else \
            value if isinstance(value, Spec) or _on_device(value) else \
            _borrowed(value, t, where) if device == "cuda" and _in_gpu_memory(value) else \
            _foreign_array(value, t, where) if _is_foreign_array(value) else \
            array_from_python(value, dtype, t, where)
        dt = arr.dtype if isinstance(arr, Spec) else dtype_name(arr.dtype)
        if dt is None:
            raise DslError(t.span, f"'{where}' must be an array of a dslc dtype "
                                   f"({', '.join(NUMPY_DTYPES)}), got {arr.dtype}")
        if numbers is not None and isinstance(value, (bool, int, float, np.generic)):
            numbers[len(arrays)] = value
        arrays.append(arr)
        param = b.param(tensor_type(dt, arr.shape))
        return TensorV(param.type, ir=param)
    if name in ("int", "float", "bool"):
        kinds = {"int": (int, np.integer), "float": (int, float, np.integer, np.floating), "bool": (bool, np.bool_)}
        if not isinstance(value, kinds[name]) or name != "bool" and isinstance(value, (bool, np.bool_)):
            raise DslError(t.span, f"'{where}' is a static {name}, got {kind(value)}")
        if name == "int" and not -MAX_INT < int(value) < MAX_INT:
            raise DslError(t.span, f"'{where}' is a static int, which must lie strictly between "
                                   f"-2**63 and 2**63, got {int(value)}")
        if name == "float" and isinstance(value, (int, np.integer)) and not abs(int(value)) < 2 ** 1024:
            raise DslError(t.span, f"'{where}' is a static float, got an int too large for one")
        return StaticV(name, _static(name, value))
    if name == "Key":
        if not (isinstance(value, Key) and isinstance(value.words, np.ndarray)
                and value.words.dtype == np.uint32 and value.words.shape == (2,)):
            raise DslError(t.span, f"'{where}' must be a key (dsl.key(seed)), got {kind(value)}")
        arrays.append(value.words)
        return KeyV(ir=b.param(KeyType()))
    if isinstance(t, ast.TupleTypeExpr) or name == "List":
        items = t.items if isinstance(t, ast.TupleTypeExpr) else None
        if not isinstance(value, (list, tuple)):
            raise DslError(t.span, f"'{where}' must be a {'tuple' if items else 'list'}, got {kind(value)}")
        if items is not None and len(items) != len(value):
            raise DslError(t.span, f"'{where}' must be a tuple of {len(items)} items, got {len(value)}")
        parts = [from_python(b, v, items[i] if items else t.args[0], mod, f"{where}[{i}]", arrays, device,
                             params, numbers) for i, v in enumerate(value)]
        return TupleV(tuple(parts)) if items is not None else ListV.of(parts)
    entity = lookup_type(t.name, mod)
    if entity is not None and entity.kind == "object":
        record = entity.node.name
        given = _fields_of(value)
        if given is None:
            raise DslError(t.span, f"'{where}' must be a {record} record (a dict or other Mapping, "
                                   f"a NamedTuple or a dataclass), got {kind(value)}")
        names = [f.name for f in entity.node.fields]
        extra = [k for k in given if k not in names]
        if extra:
            raise DslError(t.span, f"'{where}' has a field {extra[0]!r} that {record} does not have"
                                   f"{did_you_mean(extra[0], [n for n in names if n not in given])}",
                           [Note(f"the fields of {record} are {', '.join(names)}", entity.node.span)])
        fields, inner = [], record_params(t, entity.node, mod, params)
        for f in entity.node.fields:
            if f.name not in given:
                raise DslError(t.span, f"'{where}' lacks the field '{f.name}' of {record}",
                               [Note(f"the fields of {record} are {', '.join(names)}", entity.node.span)])
            fields.append((f.name, from_python(b, given[f.name], f.type, entity.module,
                                               f"{where}.{f.name}", arrays, device, inner, numbers)))
        return RecordV(record, tuple(fields), entity)
    raise DslError(t.span, f"a value of type '{name}' cannot be passed from Python")


def type_argument(t: ast.TypeExpr, params: Params, where: str) -> tuple | None:
    """What a record's use gives the type parameter t names (None when t names none); an
    entry's input must have every type parameter given."""
    is_param, arg = params.type_argument(t)
    if is_param and arg is None:
        raise DslError(t.span, f"'{where}' has the type parameter {t.name[0]}, which an entry's "
                               f"input must give: name the record with its types, as AdamW(Params)")
    return arg


def _fields_of(value: Any) -> Mapping | None:
    """A record's fields as given from Python: a Mapping as it is, a NamedTuple's or a
    dataclass instance's fields by name (read, not copied); None for anything else."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return dict(zip(type(value)._fields, value))
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclass_fields(value)}
    return None


def _static(kind: str, value: Any):
    return Dim.const(int(value)) if kind == "int" else float(value) if kind == "float" else bool(value)


def kind(value: Any) -> str:
    """What a Python value is, for a diagnostic: its type, and for arrays their dtype."""
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}"
    return "None" if value is None else type(value).__name__


def array_from_python(value: Any, dtype: str, t: ast.TypeExpr, where: str) -> np.ndarray:
    """A Python number or nested list of numbers as an array of `dtype`; anything else, or
    a number an integer dtype cannot hold exactly (1.5 or 2**40 for i32) or one beyond a float
    dtype's range (1e300 for f32), is an error (floats round to the nearest, as NumPy's do)."""
    want = f"'{where}' must be {t.span.source.text[t.span.start:t.span.end]}"
    hint = "a NumPy array, a number or a nested list of numbers"
    if not isinstance(value, (bool, int, float, list, tuple, np.generic)):
        raise DslError(t.span, f"{want} ({hint}), got {kind(value)}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise DslError(t.span, f"{want} ({hint}), got a ragged list (its rows differ in length)") from None
    if arr.dtype.kind not in "biuf":
        what = "a number too large for any dtype" if arr.dtype.kind == "O" and _all_ints(value) else \
            f"a {type(value).__name__} holding {'non-numbers' if arr.dtype.kind != 'c' else 'complex numbers'}"
        raise DslError(t.span, f"{want} ({hint}), got {what}")
    target = NUMPY_DTYPES.get(dtype)
    if target is None:
        raise DslError(t.span, f"{want}: pass a NumPy array, since NumPy has no {dtype}")
    target = np.dtype(target)
    if target.kind == "b":
        if arr.dtype.kind != "b":
            raise DslError(t.span, f"{want}: bools, got {'floats' if arr.dtype.kind == 'f' else 'ints'}")
        return arr.astype(target)
    if target.kind in "iu":
        if arr.dtype.kind == "f" and arr.size and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
            raise DslError(t.span, f"{want}: integers, got a float that is not one")
        info = np.iinfo(target)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise DslError(t.span, f"{want}: integers in [{info.min}, {info.max}], "
                                   f"got {arr.min() if arr.min() < info.min else arr.max()}")
        return arr.astype(target)
    with np.errstate(over="ignore"):
        out = arr.astype(target)
    if not np.array_equal(np.isfinite(out), np.isfinite(arr)):
        raise DslError(t.span, f"{want}: a number too large for {dtype}")
    return out


def _all_ints(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_all_ints(v) for v in value)
    return isinstance(value, int)


# DLPack's device types (dlpack.h) whose memory the CPU reads; others are named in diagnostics
_HOST_MEMORY = {1, 3, 11, 13}           # CPU, CUDA pinned host, ROCm pinned host, CUDA managed
_DEVICE_NAMES = {2: "cuda", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi", 10: "rocm",
                 12: "ext_dev", 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}


def _plain(value: np.ndarray, t: ast.TypeExpr, where: str) -> np.ndarray:
    """A NumPy array as the plain array it holds: a subclass's (np.matrix, whose reductions
    keep two axes, np.memmap) as a view, no copy; a masked array is an error, its mask being
    what it means."""
    if type(value) is not np.ndarray and isinstance(value, np.ma.MaskedArray):
        raise DslError(t.span, f"'{where}' is a masked array, and dslc has no masks: pass "
                               f"{where}.filled(value) or {where}.data")
    return np.asarray(value)


def _is_foreign_array(value: Any) -> bool:
    """Another framework's array: a DLPack exporter (PyTorch, JAX, CuPy) or an object with
    NumPy's array interface. NumPy scalars have one too, but are numbers here (converted to
    the declared dtype when it holds them exactly)."""
    return not isinstance(value, np.generic) and (hasattr(value, "__dlpack__")
                                                  or hasattr(value, "__array_interface__"))


def _refuse_grad(value: Any, t: ast.TypeExpr, where: str) -> None:
    if getattr(value, "requires_grad", False) is True:        # PyTorch refuses to export it
        raise DslError(t.span, f"'{where}' is a tensor that requires grad: pass {where}.detach() "
                               "(dslc reads its values, not its autograd graph)")


def _in_gpu_memory(value: Any) -> bool:
    """A CUDA tensor of another framework: its DLPack device is CUDA, or it has the CUDA array
    interface (CuPy, Numba, PyTorch)."""
    if hasattr(value, "__dlpack_device__") and hasattr(value, "__dlpack__"):
        return int(value.__dlpack_device__()[0]) == 2                # kDLCUDA
    return hasattr(value, "__cuda_array_interface__")


def _borrowed(value: Any, t: ast.TypeExpr, where: str):
    """A CUDA tensor of another framework as a device array of the same memory (no copy), or
    a DslError naming `where` when it cannot be one (runtime/cuda.py says why)."""
    from runtime import cuda
    _refuse_grad(value, t, where)
    try:
        return cuda.borrow(value)
    except cuda.NotShareable as e:
        raise DslError(t.span, f"'{where}' {e}") from None


def _foreign_array(value: Any, t: ast.TypeExpr, where: str) -> np.ndarray:
    """Another framework's array as a NumPy array of the same memory (no copy), or a DslError
    naming `where` when it cannot be one: it requires grad, lies in a GPU's memory, or has a
    dtype NumPy cannot hold (bfloat16)."""
    _refuse_grad(value, t, where)
    exported = hasattr(value, "__dlpack__")       # else NumPy's array interface
    device_type, index = value.__dlpack_device__() if exported else (1, 0)
    if device_type not in _HOST_MEMORY:
        device = f"{_DEVICE_NAMES.get(int(device_type), f'device type {int(device_type)}')}:{index}"
        raise DslError(t.span, f"'{where}' is in the memory of {device}, and dslc reads other "
                               "frameworks' arrays from the CPU's memory only: copy it there first "
                               f"({where}.cpu() in PyTorch)")
    try:
        return np.from_dlpack(value) if exported else np.asarray(value)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:   # a dtype NumPy lacks (bfloat16)
        dtype = str(getattr(value, "dtype", "unknown")).removeprefix("torch.")
        if dtype == "bfloat16" and hasattr(value, "__array__"):     # JAX's: ml_dtypes' underneath
            with contextlib.suppress(TypeError, ValueError, RuntimeError):
                arr = np.asarray(value)
                if dtype_name(arr.dtype) == "bf16":
                    return arr
        hint = "; pass bf16 as a NumPy array of ml_dtypes.bfloat16" if dtype == "bfloat16" else ""
        raise DslError(t.span, f"'{where}' must be an array of a dslc dtype ({', '.join(NUMPY_DTYPES)}), "
                               f"got {dtype}, which NumPy cannot read ({e}){hint}") from None


def _on_device(value: Any) -> bool:
    """A GPU runtime's array (runtime/cuda.py), passed on as it is, without a copy."""
    cuda = sys.modules.get("runtime.cuda")          # not loaded: no such array exists
    return cuda is not None and isinstance(value, cuda.DeviceArray)


def abstract_inputs(d: ast.Def, mod, dims: dict[str, int]) -> dict[str, Any]:
    """Inputs of an entry made concrete by --dims: Specs of the annotated shapes (their types
    without arrays), static values (and list lengths, as `name=3`) from dims, key(0) for keys.
    Every name in dims must be one of the entry's (a dimension, a static or a list)."""
    given = _Given(dims, d)
    out = _given_inputs(d, mod, given)
    given.check_all_used()
    return out


def example_inputs(d: ast.Def, mod, dims: dict[str, int]) -> dict[str, Any]:
    """abstract_inputs with zero arrays for the Specs, for tests and benchmarks; names in dims
    that the entry does not have are ignored (one dict can then serve several entries)."""
    def real(v: Any) -> Any:
        match v:
            case Spec():
                return np.zeros(v.shape, NUMPY_DTYPES[v.dtype])
            case dict():
                return {k: real(i) for k, i in v.items()}
            case list() | tuple():
                return type(v)(real(i) for i in v)
        return v
    return real(_given_inputs(d, mod, _Given(dims, d)))


def _given_inputs(d: ast.Def, mod, given: _Given) -> dict[str, Any]:

    def make(t: ast.TypeExpr, where: str, module, params: Params = NO_PARAMS) -> Any:
        if (arg := type_argument(t, params, where)) is not None:
            return make(arg[0], where, arg[1], arg[2])
        name = "/".join(t.name) if isinstance(t, ast.NamedType) else None
        if isinstance(t, ast.TensorTypeExpr) or name in NUMPY_DTYPES and name != "bool":
            dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else name
            dims_ = t.dims if isinstance(t, ast.TensorTypeExpr) else ()
            return Spec(dtype, tuple(given.size(e, where, params.dims) for e in dims_))
        if name in ("int", "float", "bool"):
            return given.static(t, name, where)
        if name == "Key":
            return key(0)
        if isinstance(t, ast.TupleTypeExpr):
            return tuple(make(i, f"{where}[{k}]", module, params) for k, i in enumerate(t.items))
        if name == "List":
            return [make(t.args[0], where, module, params) for _ in range(given.length(t, where))]
        entity = lookup_type(t.name, module)
        if entity is None or entity.kind != "object":
            raise DslError(t.span, f"a value of type '{name}' cannot be an entry point's input")
        inner = record_params(t, entity.node, module, params)
        return {f.name: make(f.type, f"{where}.{f.name}", entity.module, inner) for f in entity.node.fields}

    for p in d.params:
        if p.type is None:
            raise DslError(p.span, f"entry point '{d.name}' must annotate its parameter '{p.name}'")
    return {p.name: make(p.type, p.name, mod) for p in d.params}


class _Given:
    """The values --dims (or dims=) gives an entry, checked as the entry's inputs use them:
    dimensions in [0, MAX_DIM], list lengths in [0, MAX_LIST], static ints below 2**63 in size,
    bools 0 or 1; and at the end, that each name was one of the entry's."""

    def __init__(self, values: Any, d: ast.Def):
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values) or \
                not all(isinstance(v, (int, np.integer, np.bool_)) for v in values.values()):
            raise DslError(d.name_span, f"dims= maps names to integers (as --dims B=4,D=8), got {values!r}")
        self.values, self.d, self.names = values, d, set()

    def _get(self, span, name: str, what: str, lo: int, hi: int) -> int:
        self.names.add(name)
        if name not in self.values:
            close = difflib.get_close_matches(name, [k for k in self.values if k != name], n=1)
            raise DslError(span, f"--dims must give {what} '{name}' ({name}=…)" +
                           (f"; it gives {close[0]!r}: did you mean {name!r}?" if close else ""))
        v = int(self.values[name])
        if not lo <= v <= hi:
            raise DslError(span, f"--dims gives {what} '{name}' the value {v}, outside [{lo}, {hi}]")
        return v

    def size(self, e: ast.Expr, where: str, params: Mapping[str, Dim]) -> int:
        dim = eval_dim(e, params)
        env = {v: Dim.const(self._get(e.span, v, "the dimension", 0, MAX_DIM))
               for v in sorted(dim.free_vars())}
        n = dim.subst(env).value
        if n is None or n < 0:
            raise DslError(e.span, f"a dimension of '{where}' would be {n if n is not None else 'unknown'} "
                                   f"with the sizes --dims gives")
        return n

    def length(self, t: ast.TypeExpr, where: str) -> int:
        return self._get(t.span, where, "the length of the list", 0, MAX_LIST)

    def static(self, t: ast.TypeExpr, kind: str, where: str) -> Any:
        if kind == "bool":
            return bool(self._get(t.span, where, "the static bool", 0, 1))
        v = self._get(t.span, where, f"the static {kind}", -MAX_INT + 1, MAX_INT - 1)
        return float(v) if kind == "float" else v

    def check_all_used(self) -> None:
        unknown = [k for k in self.values if k not in self.names]
        if unknown:
            names = sorted(self.names)
            raise DslError(self.d.name_span, f"--dims names {unknown[0]!r}, which '{self.d.name}' does not have"
                                             f"{did_you_mean(unknown[0], names)}",
                           [Note(f"'{self.d.name}' takes {', '.join(names)}" if names else
                                 f"'{self.d.name}' takes no dimensions or static values")])


def dimension_names(d: ast.Def, mod) -> list[str]:
    """The dimension variables of an entry's annotations and of its records' fields (B and D
    of x: f32[B, D]), in order of first appearance; lists are read at length 1."""
    names = _DimensionNames(d)
    _given_inputs(d, mod, names)
    return list(names.dims)


class _DimensionNames(_Given):
    """Collects the dimension variables an entry's inputs name, giving every size as 0."""

    def __init__(self, d: ast.Def):
        super().__init__({}, d)
        self.dims: dict[str, None] = {}           # (ordered, without repeats)

    def size(self, e: ast.Expr, where: str, params: Mapping[str, Dim]) -> int:
        self.dims.update(dict.fromkeys(sorted(eval_dim(e, params).free_vars())))
        return 0

    def length(self, t: ast.TypeExpr, where: str) -> int:
        return 1

    def static(self, t: ast.TypeExpr, kind: str, where: str) -> Any:
        return 0


def from_arrays(name: str, d: ast.Def, mod, arrays: dict[str, np.ndarray],
                statics: dict[str, int]) -> dict[str, Any]:
    """The arguments of entry d (called `name`) from named arrays (`p.W1`, `xs[0]`, as `dslc run`
    reads them); static parameters from `statics`. Every array must be named exactly after one
    input, with its dtype and rank; every static value must name a static parameter."""
    used: set[str] = set()
    given = _Given(statics, d)

    def make(t: ast.TypeExpr, path: str, module, params: Params = NO_PARAMS) -> Any:
        if (arg := type_argument(t, params, path)) is not None:
            return make(arg[0], path, arg[1], arg[2])
        tname = "/".join(t.name) if isinstance(t, ast.NamedType) else None
        if tname in ("int", "float", "bool"):
            return given.static(t, tname, path)
        if isinstance(t, ast.TupleTypeExpr):
            return tuple(make(i, f"{path}[{k}]", module, params) for k, i in enumerate(t.items))
        if tname == "List":
            n = 0
            while any(k == f"{path}[{n}]" or k.startswith((f"{path}[{n}].", f"{path}[{n}]["))
                      for k in arrays):
                n += 1
            return [make(t.args[0], f"{path}[{i}]", module, params) for i in range(n)]
        entity = lookup_type(t.name, module) if isinstance(t, ast.NamedType) else None
        if entity is not None and entity.kind == "object":
            inner = record_params(t, entity.node, module, params)
            return {f.name: make(f.type, f"{path}.{f.name}", entity.module, inner) for f in entity.node.fields}
        if path not in arrays:
            unused = [k for k in arrays if k not in used]
            raise DslError(t.span, f"the inputs have no array '{path}' for '{name}'"
                                   f"{did_you_mean(path, unused)}")
        used.add(path)
        return _array_input(arrays[path], t, tname, path, params)

    for p in d.params:
        if p.type is None:
            raise DslError(p.span, f"entry point '{name}' must annotate its parameter '{p.name}'")
    out = {p.name: make(p.type, p.name, mod) for p in d.params}
    extra = sorted(set(arrays) - used)
    if extra:
        raise DslError(d.name_span, f"'{name}' has no input for the array {extra[0]!r}: each array "
                                    f"is named after a parameter, a record's field (p.W) or a "
                                    f"list's or tuple's item (xs[0]){did_you_mean(extra[0], used)}")
    given.check_all_used()
    return out


def _array_input(arr: np.ndarray, t: ast.TypeExpr, tname: str | None, path: str, params: Params) -> Any:
    """An array read for the input `path` (annotated t), checked against its annotation: a key's
    two 32-bit words, a tensor's dtype and rank (its sizes are the checker's)."""
    if tname == "Key":
        if not (arr.shape == (2,) and arr.dtype.kind in "iu" and np.all((arr >= 0) & (arr < 2 ** 32))):
            raise DslError(t.span, f"the input array {path!r} is a key: two integers in [0, 2**32), "
                                   f"got {dtype_name(arr.dtype) or arr.dtype}{list(arr.shape)}")
        return Key(arr.astype(np.uint32))
    dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else tname
    dims = t.dims if isinstance(t, ast.TensorTypeExpr) else ()
    declared = [eval_dim(e, params.dims) for e in dims]
    want = str(TensorType(dtype, tuple(declared))) if params.dims else t.span.source.text[t.span.start:t.span.end]
    got = f"{dtype_name(arr.dtype) or arr.dtype}{list(arr.shape)}"
    sizes = [d.value for d in declared]
    if dtype_name(arr.dtype) != dtype or arr.ndim != len(dims) or \
            any(n is not None and n != m for n, m in zip(sizes, arr.shape)):
        raise DslError(t.span, f"the input array {path!r} is {got}, but '{path}' is {want}")
    return arr
