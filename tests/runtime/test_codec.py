"""The compile cache's codec: what it writes decodes to an equal value (floats bit for bit, the
same sharing), and anything it did not write, or names a class outside dslc's own
dataclasses and enums or a function outside its makers, is a DecodeError, never code run."""
from __future__ import annotations

import math
import pickle
import struct

import numpy as np
import pytest

import dsl.program
from conftest import pickled_call, pickled_new
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


def test_a_shared_list_stays_one_list():
    inner = [1, 2]
    back = roundtrip({"a": inner, "b": (inner,)})
    assert back["a"] is back["b"][0] and back["a"] == [1, 2]


def test_a_syntax_tree_comes_back_equal_with_its_positions():
    tree = parse(Source("m.bend", "def f(x: f32[N]) -> f32:\n  return sum(x * x)\n"))
    back = roundtrip(tree)
    assert back == tree and isinstance(back, ast.Module)
    assert back.items[0].name_span.source is back.span.source       # one Source, as before


def test_a_cycle_comes_back_as_the_same_cycle():
    loop = []
    loop.append(loop)
    through_a_tuple = []
    through_a_tuple.append((through_a_tuple,))
    a, b = roundtrip([loop, through_a_tuple])
    assert a[0] is a and b[0][0] is b


@pytest.mark.parametrize("value", [object(), print, type, np.array([object()]), 1 + 2j,
                                   bytearray(b"x"), Value.__init__])
def test_a_type_outside_the_list_is_not_encoded(value):
    with pytest.raises(codec.EncodeError):
        codec.encode(value)


class Local:                              # a class outside dslc
    pass


def without_fields() -> bytes:
    """A syntax tree's node that lacks one of its fields, as encode writes it."""
    node = object.__new__(ast.Int)
    object.__setattr__(node, "value", 1)
    return codec.encode(node)


@pytest.mark.parametrize("data", [
    b"", b"\x00" * 8, b"\xff" * 40, b"\x80\x04.", codec.encode((1, [2.5]))[:-1],
    pickle.dumps(print), pickle.dumps(Local()), pickled_call(eval, "1"),
    pickled_new("builtins", "object"),
    pickled_call(codec._Unpickler, None),                  # dslc's, but not a maker
    pickled_call(dsl.program.loads, "def f() -> i32:\n  return 1\n"),      # dslc's, a function
    pickled_new("runtime.cache", "Path"),                  # imported there, not defined there
    pickled_new("dsl.program", "Program"),                 # dslc's, not a dataclass or enum
    pickled_new("ir.ops.elementwise", "Add"),              # a primitive's class, not by name
    pickled_new("frontend.ast", "Int"),                    # made empty, its fields never set
    without_fields(), pickled_call(Kind, "a tensor"),      # a class called
    codec.encode(Kind.TENSOR).replace(b"TENSOR", b"NOSUCH"), pickled_call(codec._object, 3, {}),
    pickled_new("ir.core", "Value.__init__"),
    pickled_call(codec._primitive, "no such primitive"), pickled_call(codec._primitive, 3),
    pickled_call(codec._array, "|O", (3,), b"\0" * 24),  # an array of Python objects
    pickled_call(codec._array, "<f4", (4,), b"\0" * 12), # fewer bytes than its shape
    pickled_call(codec._dtype, [("a", "<f4")]), pickled_call(codec._scalar, "V8", b"\0" * 8),
    b"\x80\x04\x82\x01.",                                 # an extension code
    b"P0\n.",                                             # a persistent id
])
def test_anything_encode_did_not_write_is_a_decode_error(data):
    with pytest.raises(codec.DecodeError):
        codec.decode(data)


def test_an_entry_that_would_run_a_command_runs_nothing(tmp_path):
    import os
    marker = tmp_path / "ran"
    for data in (pickled_call(os.system, f"touch {marker}"),
                 f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()):     # as protocol 0 spells it
        with pytest.raises(codec.DecodeError):
            codec.decode(data)
    assert not marker.exists()


def test_a_class_whose_module_is_not_imported_is_a_decode_error_not_an_import(monkeypatch):
    import sys
    monkeypatch.delitem(sys.modules, "frontend.ast")
    with pytest.raises(codec.DecodeError):
        codec.decode(pickled_new("frontend.ast", "Int"))
    assert "frontend.ast" not in sys.modules


def test_a_class_of_dslc_defined_in_a_function_is_not_encoded():
    import dataclasses
    import ir.core

    @dataclasses.dataclass
    class Local:
        x: int
    Local.__module__ = ir.core.__name__           # as if defined in a function of ir.core
    with pytest.raises(codec.EncodeError):
        codec.encode(Local(1))
