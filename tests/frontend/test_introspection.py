"""x.shape, x.ndim, x.dtype and finfo/iinfo (docs/language.md §4.11): helpers that read their
arguments' sizes, dtypes and dtype limits compute the same on the reference interpreter and the
CPU, and are checked symbolically by `dslc check`."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import dsl
from frontend.check import check_file
from conftest import raises

DEVICES = ["reference", "cpu"]

HELPERS = """
from nn import dropout

def heads(x, H):
  B, T, D = x.shape
  assert D % H == 0, "the number of heads must divide D"
  return transpose(reshape(x, [B, T, H, D // H]), [0, 2, 1, 3])

def split_heads(x: f32[B, T, 12]) -> f32[B, 3, T, 4]:
  return heads(x, 3)

def like(x: f16[N, M]) -> (f16[N, M], f16[M], f16[N, M]):
  assert x.ndim == 2
  return zeros(x.shape, x.dtype) + 1.0, x[0] / cast(x.shape[-1], x.dtype), cast(x, x.dtype)

def dropped(k: Key, x: f64[A, B, C]) -> f64[A, B, C]:
  return dropout(k, x, 0.5)
"""


@pytest.mark.parametrize("device", DEVICES)
def test_a_helper_reads_its_arguments_shape(device):
    prog = dsl.loads(HELPERS, device=device)
    x = np.arange(2 * 5 * 12, dtype=np.float32).reshape(2, 5, 12)
    np.testing.assert_array_equal(prog.split_heads(x), x.reshape(2, 5, 3, 4).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_shape_ndim_and_dtype_make_tensors_like_their_argument(device):
    x = np.arange(12, dtype=np.float16).reshape(3, 4)
    ones, scaled, same = dsl.loads(HELPERS, device=device).like(x)
    assert ones.dtype == np.float16 and ones.shape == (3, 4) and (ones == 1).all()
    np.testing.assert_array_equal(scaled, x[0] / np.float16(4))
    np.testing.assert_array_equal(same, x)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_needs_no_shape_at_any_rank_and_dtype(device):
    x = np.arange(1, 1 + 4 * 5 * 6, dtype=np.float64).reshape(4, 5, 6)
    out = dsl.loads(HELPERS, device=device).dropped(dsl.key(3), x)
    kept = out != 0
    assert out.dtype == np.float64 and 0 < kept.sum() < x.size
    np.testing.assert_array_equal(out[kept], 2 * x[kept])


def test_sizes_read_off_a_shape_are_checked_symbolically():
    check_file("ok.bend", HELPERS)
    bad = HELPERS + """
def wrong(x: f32[B, T, 12]) -> f32[B, T, 3, 4]:
  return heads(x, 3)
"""
    raises(lambda: check_file("bad.bend", bad),
           "'wrong' is declared to return f32[B, T, 3, 4]: expected f32[B, T, 3, 4], got f32[B, 3, T, 4]")


LIMITS = [(q, d, f) for q, ds, fs in (("finfo", ("f16", "bf16", "f32", "f64"), ("min", "max", "eps", "tiny")),
                                      ("iinfo", ("i32", "i64", "u32"), ("min", "max")))
          for d in ds for f in fs]
NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64, "i32": np.int32,
         "i64": np.int64, "u32": np.uint32}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("query, dtype, field", LIMITS)
def test_dtype_limits_are_numpys(device, query, dtype, field):
    prog = dsl.loads(f"""
def limit(x: {dtype}[2]) -> {dtype}[2]:
  return x * 0 + {query}(x.dtype).{field}
""", device=device)
    want = getattr({"finfo": ml_dtypes.finfo, "iinfo": np.iinfo}[query](NUMPY[dtype]), field)
    got = prog.limit(np.zeros(2, NUMPY[dtype]))
    assert got.dtype == NUMPY[dtype]
    np.testing.assert_array_equal(got, np.full(2, want, NUMPY[dtype]))


def test_bf16_limits_are_ml_dtypes():
    """NumPy has no bfloat16; its limits are ml_dtypes', checked statically here against their
    values written out."""
    check_file("bf16.bend", """
def limits(x: f32[N]) -> f32[N]:
  f = finfo(bf16)
  assert f.max == 3.3895313892515355e38 and f.min == -f.max and f.bits == 16
  assert f.eps == 0.0078125 and f.tiny == 1.1754943508222875e-38
  return x
""")


@pytest.mark.parametrize("expr, message", [
    ("x.shap[0]", "a value of type f32[N] has no field 'shap' (did you mean 'shape'?)"),
    ("finfo(f32).mx", "finfo(f32) has no field 'mx' (did you mean 'max'?); it has min, max, eps, tiny, bits"),
    ("finfo(i32).max", "finfo takes a float dtype (f32, f16, bf16, f64), got i32; for i32 use iinfo(i32)"),
    ("iinfo(x).max", "iinfo takes an integer dtype (i32, i64, u32), got f32[N]"),
    ("finfo(f32, f64).max", "finfo takes a float dtype (f32, f16, bf16, f64), got 2 arguments"),
    ("zeros(x.shape, x.ndim)", "'dtype' of 'zeros' must be a dtype, got int"),
])
def test_misused_attributes_and_limits_are_diagnostics(expr, message):
    raises(lambda: check_file("f.bend", f"def f(x: f32[N]) -> f32[N]:\n  return x + {expr}\n"), message)
