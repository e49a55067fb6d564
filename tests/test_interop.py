"""Arrays from and to PyTorch and JAX on the CPU: taken by DLPack (or NumPy's array interface)
without a copy, given back as NumPy arrays that torch.from_dlpack and jax.dlpack.from_dlpack
share; and records given as any Mapping, a NamedTuple or a dataclass."""
from __future__ import annotations

import collections
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dsl
from conftest import raises
from ir import interp
from runtime.cpu import Executable

SOURCE = """
object P { W: f32[D, C], b: f32[C] }

def affine(p: P, x: f32[B, D]) -> f32[B, C]:
  return x @ p.W + p.b

def loss(p: P, x: f32[B, D]) -> f32:
  return sum(affine(p, x))

def scale(x: f32[N, M], k: f32) -> f32[N, M]:
  return x * k

def kinds(a: f64[N], b: i64[N], c: u32[N], d: bool[N], e: f16[N], f: i32[N]
          ) -> (f64[N], i64[N], u32[N], bool[N], f16[N], i32[N]):
  return (a + a, b + b, c + c, d & (b > 0), e + e, f + f)
"""

W = np.arange(6, dtype=np.float32).reshape(3, 2)
B = np.array([1.0, -1.0], np.float32)
X = np.arange(12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(scope="module", params=["reference", "cpu"])
def prog(request):
    return dsl.loads(SOURCE, name="interop.bend", device=request.param)


@pytest.fixture(scope="module")
def cpu_prog():
    return dsl.loads(SOURCE, name="interop.bend", device="cpu")


@pytest.fixture
def received(monkeypatch) -> list[list[int]]:
    """The data addresses of the arrays each call hands the runtime (compiled or reference)."""
    seen: list[list[int]] = []
    run_compiled, run_reference = Executable.run, interp.run

    def compiled(self, arrays):
        seen.append([a.ctypes.data for a in arrays])
        return run_compiled(self, arrays)

    def reference(fn, arrays):
        seen.append([a.ctypes.data for a in arrays])
        return run_reference(fn, arrays)

    monkeypatch.setattr(Executable, "run", compiled)
    monkeypatch.setattr(interp, "run", reference)
    return seen


# ---------------------------------------------------------------- round trips

def test_torch_in_and_out_without_a_copy(prog, received):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    k = torch.tensor(3.0)                                       # a 0-d tensor for a scalar
    out = prog.scale(x, k)
    assert received[0] == [x.data_ptr(), k.data_ptr()]          # the caller's memory itself
    back = torch.from_dlpack(out)
    assert back.data_ptr() == out.ctypes.data                   # the result's memory itself
    assert np.asarray(out).ctypes.data == out.ctypes.data
    assert torch.equal(back, x * 3.0)


def test_jax_in_without_a_copy(prog, received):
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    out = prog.scale(x, jnp.float32(0.5))
    assert received[0][0] == x.unsafe_buffer_pointer()
    assert np.array_equal(jax.dlpack.from_dlpack(out), x * 0.5)


def kinds(a, b, c, d, e, f) -> list[np.ndarray]:
    """What the entry `kinds` returns, by NumPy."""
    return [a + a, b + b, c + c, d & (b > 0), e + e, f + f]


KINDS_IN = (np.array([1.5, -2.0, 0.0]), np.array([3, -4, 2 ** 40]),
            np.array([1, 2, 2 ** 31], np.uint32), np.array([True, True, False]),
            np.array([0.5, 1.0, -3.0], np.float16), np.array([7, 0, -7], np.int32))


def test_a_compiled_result_goes_to_jax_without_a_copy(cpu_prog):
    # jax.dlpack.from_dlpack copies an array whose address is not a multiple of 64 bytes
    # (copy=False makes that an error), and without x64 mode one of f64 or i64 (to f32, i32)
    with jax.enable_x64(True):
        for out, want in zip(cpu_prog.kinds(*KINDS_IN), kinds(*KINDS_IN)):
            back = jax.dlpack.from_dlpack(out, copy=False)
            assert back.unsafe_buffer_pointer() == out.ctypes.data
            assert back.dtype == want.dtype and np.array_equal(np.asarray(back), want)


def test_every_dslc_dtype_round_trips_through_torch(prog, received):
    ins = [torch.from_numpy(a.copy()) for a in KINDS_IN]
    outs = prog.kinds(*ins)
    assert received[0] == [t.data_ptr() for t in ins]
    for out, want in zip(outs, kinds(*KINDS_IN)):
        back = torch.from_dlpack(out)
        assert back.data_ptr() == out.ctypes.data
        assert back.dtype == torch.from_numpy(want).dtype and np.array_equal(back.numpy(), want)


def test_strided_and_offset_tensors_are_read_where_they_lie(prog, received):
    base = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    for x in (base.T, base[1:], base[:, 1:3]):
        out = prog.scale(x, 2.0)
        assert received[-1][0] == x.data_ptr()
        assert torch.equal(torch.from_dlpack(out), x * 2.0)


def test_zero_size_tensors(prog):
    out = prog.scale(torch.zeros(0, 3), 2.0)
    assert out.shape == (0, 3) and torch.from_dlpack(out).shape == (0, 3)
    assert prog.scale(jnp.zeros((3, 0)), 2.0).shape == (3, 0)


def test_gradients_of_torch_inputs_are_those_of_numpy_inputs(prog):
    p = {"W": torch.from_numpy(W), "b": torch.from_numpy(B)}
    got = prog.grad("loss", wrt="p")(p, torch.from_numpy(X))
    want = prog.grad("loss", wrt="p")({"W": W, "b": B}, X)
    assert all(np.array_equal(got[k], want[k]) for k in ("W", "b"))


def test_an_object_with_the_array_interface_is_read_in_place(prog, received):
    class Interface:                       # what a library without DLPack exposes
        def __init__(self, a: np.ndarray):
            self.a, self.__array_interface__ = a, a.__array_interface__
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = prog.scale(Interface(x), 2.0)
    assert received[0][0] == x.ctypes.data and np.array_equal(out, x * 2)


# ---------------------------------------------------------------- refused, naming the argument

def test_a_tensor_that_requires_grad_is_refused(prog):
    w = torch.from_numpy(W).requires_grad_()
    raises(lambda: prog.affine({"W": w, "b": B}, X),
           "'p.W' is a tensor that requires grad: pass p.W.detach()")
    assert np.array_equal(prog.affine({"W": w.detach(), "b": B}, X), X @ W + B)


@pytest.mark.parametrize("x, dtype", [
    (torch.zeros(2, 2, dtype=torch.bfloat16), "got bfloat16, which NumPy cannot read"),
    (torch.zeros(2, 2, dtype=torch.complex64), "got complex64"),
    (torch.zeros(2, 2, dtype=torch.int8), "got int8"),
    (torch.zeros(2, 2, dtype=torch.uint8), "got uint8"),
    (torch.zeros(2, 2, dtype=torch.int16), "got int16"),
    (jnp.zeros((2, 2), jnp.int8), "got int8"),
])
def test_a_dtype_dslc_lacks_is_refused(prog, x, dtype):
    raises(lambda: prog.scale(x, 1.0), "'x' must be an array of a dslc dtype", dtype)


def test_a_tensor_of_another_dslc_dtype_is_a_type_error(prog):
    raises(lambda: prog.scale(torch.zeros(2, 2, dtype=torch.float64), 1.0), "'x'", "f64[2, 2]")


def test_a_tensor_in_gpu_memory_is_refused():
    class OnGpu:                            # a DLPack exporter on CUDA device 1 (none is here)
        def __dlpack_device__(self):
            return (2, 1)

        def __dlpack__(self, **kwargs):
            raise AssertionError("a GPU tensor must not be exported to the CPU")
    prog = dsl.loads(SOURCE, name="interop.bend", device="reference")
    raises(lambda: prog.scale(OnGpu(), 1.0), "'x' is in the memory of cuda:1",
           "from the CPU's memory only", "x.cpu()")


# ---------------------------------------------------------------- records

def record_as(kind: str, fields: dict):
    """The fields of a record as a Python value of `kind`."""
    if kind == "mapping":
        return types.MappingProxyType(fields)
    if kind == "namedtuple":
        return collections.namedtuple("P", list(fields))(**fields)
    if kind == "dataclass":
        return dataclasses.make_dataclass("P", list(fields), frozen=True)(**fields)
    return fields


KINDS = ["dict", "mapping", "namedtuple", "dataclass"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_record_is_any_mapping_a_namedtuple_or_a_dataclass(prog, received, kind):
    w, b = torch.from_numpy(W), torch.from_numpy(B)
    out = prog.affine(record_as(kind, {"b": b, "W": w}), X)
    assert received[0][:2] == [w.data_ptr(), b.data_ptr()]      # its fields, not copies
    assert np.array_equal(out, X @ W + B)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fields, message", [
    ({"W": W, "b": B, "bb": B}, "'p' has a field 'bb' that P does not have"),
    ({"W": W, "bx": B}, "did you mean 'b'?"),
    ({"W": W}, "'p' lacks the field 'b' of P"),
])
def test_a_records_fields_must_match_whatever_holds_them(prog, kind, fields, message):
    raises(lambda: prog.affine(record_as(kind, fields), X), message, "the fields of P are W, b")


def test_a_plain_tuple_is_not_a_record(prog):
    raises(lambda: prog.affine((W, B), X), "'p' must be a P record (a dict or other Mapping, "
                                           "a NamedTuple or a dataclass), got tuple")
