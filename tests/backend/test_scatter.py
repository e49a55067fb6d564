"""scatter_add compiled for the host (backend/scatter.py): every destination accumulates its
slices in index order, so the bits are the interpreter's (np.add.at), repeated, negative and
multi-axis indices included; an index out of range is the interpreter's error."""
from __future__ import annotations

import numpy as np
import pytest

import dsl

SOURCE = """
def rows(x: {t}[V, D], i: {i}[N], u: {t}[N, D]) -> {t}[V, D]:
  return scatter_add(x, i, u)

def middle(x: {t}[B, V, D], i: {i}[N, M], u: {t}[B, N, M, D]) -> {t}[B, V, D]:
  return scatter_add(x, i, u, axis=1)

def last(x: {t}[B, V], i: {i}[N], u: {t}[B, N]) -> {t}[B, V]:
  return scatter_add(x, i, u, axis=-1)
"""
rng = np.random.default_rng(3)


def programs(t: str, i: str):
    source = SOURCE.format(t=t, i=i)
    return (dsl.loads(source, name="scatter.bend", device="reference"),
            dsl.loads(source, name="scatter.bend", device="cpu"))


def values(shape, dtype) -> np.ndarray:
    """Normal values with -0.0, inf and NaN among them."""
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::7], flat[3::11], flat[5::13] = -0.0, np.inf, np.nan
    return x


def same_bits(a, b) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("t, i", [("f32", "i32"), ("f32", "i64"), ("f64", "i32")])
def test_compiled_scatter_add_gives_the_interpreters_bits(t, i):
    ref, cpu = programs(t, i)
    dt, it = {"f32": np.float32, "f64": np.float64}[t], {"i32": np.int32, "i64": np.int64}[i]
    cases = [
        ("rows", values((65, 128), dt), rng.integers(-65, 65, 1024).astype(it), values((1024, 128), dt)),
        ("rows", values((5, 3), dt), np.array([4, 4, 4, -1, 0], it), values((5, 3), dt)),
        ("rows", values((5, 3), dt), np.zeros(0, it), values((0, 3), dt)),
        ("middle", values((3, 7, 5), dt), rng.integers(0, 7, (4, 6)).astype(it), values((3, 4, 6, 5), dt)),
        ("last", values((4, 9), dt), rng.integers(-9, 9, 30).astype(it), values((4, 30), dt)),
    ]
    for name, *args in cases:
        same_bits(getattr(cpu, name)(*args), getattr(ref, name)(*args))


def test_an_index_out_of_range_is_the_interpreters_error():
    ref, cpu = programs("f32", "i32")
    x, u = values((5, 3), np.float32), values((4, 3), np.float32)
    for bad in (5, -6):
        i = np.array([0, 1, bad, 7], np.int32)          # the first bad one is reported
        messages = []
        for p in (ref, cpu):
            with pytest.raises(dsl.DslError) as e:
                p.rows(x, i, u)
            messages.append(str(e.value))
        assert messages[0] == messages[1] and f"index {bad} is out of bounds" in messages[0]


def test_what_is_not_compiled_runs_in_the_interpreter():
    ref, cpu = programs("i32", "i32")                  # integer values: not compiled
    x, i, u = np.arange(15, dtype=np.int32).reshape(5, 3), np.array([1, 1, 4], np.int32), \
        np.ones((3, 3), np.int32)
    same_bits(cpu.rows(x, i, u), ref.rows(x, i, u))
