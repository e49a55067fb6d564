"""The compile cache's codec: what it writes decodes to an equal value (floats bit for bit, the
same sharing), and anything it did not write, or names a class outside dslc's own
dataclasses and enums, is a DecodeError, never code run."""
from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from frontend import ast
from frontend.parser import parse
from frontend.diagnostics import Source
from ir.core import Builder, Value, tensor_type
from ir.ops.base import Kind
from runtime import codec


def roundtrip(value):
    return codec.decode(codec.encode(value))


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2**80, "", "naïve ✓", b"\x00\xffbytes", 1.5, -0.0, 1e-310,
    (), (1, (2, (3,))), [], [1, [2, ()]], {"a": 1, (1, 2): [3]}, {1: "x", "1": "y"},
    frozenset({1, "a", (2, 3)}), {4, 5}, [(), [()], {"k": ()}], ..., (1, ..., slice(None, 3)),
    slice(1, -1, (2,)),
])
def test_plain_values_come_back_equal_and_of_the_same_types(value):
    back = roundtrip(value)
    assert back == value and repr(back) == repr(value)


@pytest.mark.parametrize("x", [math.nan, -math.nan, math.inf, -math.inf, -0.0,
                               struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]])
def test_floats_come_back_bit_for_bit(x):
    assert struct.pack(">d", roundtrip(x)) == struct.pack(">d", x)


@pytest.mark.parametrize("a", [np.arange(12, dtype=np.float32).reshape(3, 4),
                               np.array([np.nan, -0.0, np.inf], np.float64),
                               np.zeros((0, 3), np.int32), np.array(True),
                               np.arange(6, dtype=np.int64)[::2], np.ones((2, 2), np.complex64)])
def test_arrays_come_back_with_their_dtype_shape_and_bytes(a):
    back = roundtrip(a)
    assert (back.dtype, back.shape, back.tobytes()) == (a.dtype, a.shape, np.ascontiguousarray(a).tobytes())
    back[...] = 0                                 # a decoded array is the caller's own, writable


def test_numpy_scalars_and_dtypes_come_back_as_themselves():
    values = [np.float32(1.25), np.int8(-3), np.bool_(True), np.float64(np.nan), np.dtype("f4"),
              np.dtype(np.int64)]
    back = roundtrip(values)
    assert [type(v) for v in back] == [type(v) for v in values]
    assert [np.asarray(v).tobytes() if not isinstance(v, np.dtype) else v for v in back] == \
           [np.asarray(v).tobytes() if not isinstance(v, np.dtype) else v for v in values]


def test_enums_of_dslc_come_back_as_the_same_members():
    assert roundtrip([Kind.TENSOR, (Kind.SHAPE,)]) == [Kind.TENSOR, (Kind.SHAPE,)]
    assert roundtrip(Kind.DIM) is Kind.DIM


def test_shared_objects_stay_shared_and_values_take_fresh_ids():
    b = Builder()
    x = b.param(tensor_type("f32", (4,)))
    y = b.emit("mul", x, x)
    fn = b.finish([b.emit("add", y, x)])
    back = roundtrip([fn, fn.params])
    f, params = back
    assert params is not fn.params and params[0] is f.params[0]
    mul, add = f.ops
    assert mul.inputs[0] is mul.inputs[1] is add.inputs[1] is f.params[0]
    assert add.inputs[0] is mul.outputs[0] and f.results[0] is add.outputs[0]
    assert {v.id for v in (x, y)}.isdisjoint(v.id for op in f.ops for v in op.inputs + op.outputs)


def test_equal_values_are_written_once_and_only_equal_ones():
    from backend.loops import Instr, Load
    from ir.dims import Dim
    loads = [Load(0, (4, 1)), Load(0, (4, 1)), Load(0, (4, 1), 1), Load(True, (4, 1))]
    nans = [struct.unpack(">d", bytes.fromhex(h))[0] for h in ("7ff8000000000000", "7ff8000000000123")]
    consts = [Instr.constant(0.0, "f32"), Instr.constant(-0.0, "f32"), Instr.constant(0.0, "f32"),
              *(Instr.constant(x, "f64") for x in nans)]
    dims = [Dim.var("B").spelled("B"), Dim.var("B").spelled("batch"), Dim.var("B").spelled("B")]
    back = roundtrip((loads, consts, dims))
    assert back[0] == loads and back[2] == dims and [type(x.buffer) for x in back[0]] == [int, int, int, bool]
    (a, b, c, d), (zero, minus_zero, zero_again, nan, other_nan), (spelled, other, same) = back
    assert a is b and c is not a and d is not a                 # True is not 1
    assert zero is zero_again and minus_zero is not zero        # -0.0 is not 0.0
    assert nan is not other_nan and struct.pack(">d", dict(other_nan.attrs)["value"]) == struct.pack(">d", nans[1])
    assert same is spelled and other is not spelled and str(other) == "batch"
    one, hundred = (codec.encode([Load(0, (4, 1)) for _ in range(n)]) for n in (1, 100))
    assert len(hundred) == len(one) + len("!") + 99 * len(',{"r":0}')     # one Load, 99 references


def test_a_shared_list_stays_one_list():
    inner = [1, 2]
    back = roundtrip({"a": inner, "b": (inner,)})
    assert back["a"] is back["b"][0] and back["a"] == [1, 2]


def test_a_syntax_tree_comes_back_equal_with_its_positions():
    tree = parse(Source("m.bend", "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"))
    back = roundtrip(tree)
    assert back == tree and isinstance(back, ast.Module)
    assert back.items[0].name_span.source is back.span.source       # one Source, as before


def test_a_cycle_is_not_encoded():
    loop = []
    loop.append(loop)
    with pytest.raises(codec.EncodeError):
        codec.encode(loop)


@pytest.mark.parametrize("value", [object(), print, type, np.array([object()]), 1 + 2j,
                                   bytearray(b"x"), Value.__init__])
def test_a_type_outside_the_list_is_not_encoded(value):
    with pytest.raises(codec.EncodeError):
        codec.encode(value)


def entry(table, doc) -> bytes:
    t, d = json.dumps(table).encode(), json.dumps(doc).encode()
    return struct.pack("<QQ", len(t), len(d)) + t + d


@pytest.mark.parametrize("data", [
    b"", b"\x00" * 8, b"\xff" * 40,
    entry([["os:system", []]], {"0": []}),                    # not dslc's
    entry([["builtins:object", []]], {"0": []}),
    entry([["dsl.program:loads", []]], {"0": []}),             # dslc's, but a function
    entry([["runtime.cache:Path", []]], {"0": []}),            # imported there, not defined there
    entry([["dsl.program:Program", []]], {"0": []}),           # dslc's, not a dataclass
    entry([["ir.core:Value", ["type"]]], {"0": [None]}),       # a field missing
    entry([["ir.core:Value", ["type", "id", "__class__"]]], {"0": [1, 2, 3]}),
    entry([["ir.core:Value", ["type", "id"]]], {"0": [1]}),    # fewer values than fields
    entry([["ir.ops.base:Kind", None]], {"0": "NO_SUCH_MEMBER"}),
    entry([], {"r": 0}), entry([], {"r": -1}), entry([], {"q": 1}), entry([], {"l": 1, "d": 2}),
    entry([], {"a": ["|O", [1], 0, 8]}), entry([], {"a": ["<f4", [4], 0, 16]}),
    entry([], {"d": [1]}), entry([], {"f": "zz"}),
    entry([], [1]).replace(b"[1]", b"[NaN]"),
    entry([], [1])[:-1], entry([], [1])[:12],
])
def test_anything_encode_did_not_write_is_a_decode_error(data):
    with pytest.raises(codec.DecodeError):
        codec.decode(data)


def test_a_class_whose_module_is_not_imported_is_a_decode_error_not_an_import(monkeypatch):
    import sys
    monkeypatch.delitem(sys.modules, "frontend.ast")
    with pytest.raises(codec.DecodeError):
        codec.decode(entry([["frontend.ast:Int", ["value", "span"]]], {"0": [1, None]}))
    assert "frontend.ast" not in sys.modules


def test_a_cycle_through_a_tuple_is_not_encoded():
    loop = []
    loop.append((loop,))
    with pytest.raises(codec.EncodeError):
        codec.encode(loop)


def test_a_class_of_dslc_defined_in_a_function_is_not_encoded():
    import dataclasses
    import ir.core

    @dataclasses.dataclass
    class Local:
        x: int
    Local.__module__ = ir.core.__name__           # as if defined in a function of ir.core
    with pytest.raises(codec.EncodeError):
        codec.encode(Local(1))
