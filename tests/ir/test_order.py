"""ir/ops/order.py: sort, argsort, topk and take_along_axis against NumPy and PyTorch, bit for
bit, at empty, single, prime and tied sizes with NaN, ±inf and ±0, along every axis; their
shape rules and errors, in the IR and as diagnostics; the CPU runtime against the interpreter;
and a .bend program through the API. Their VJPs are cases of tests/ir/test_vjp.py, beside
every other primitive's."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import dsl
from ir import interp
from ir.ad import grad_function
from ir.core import Builder, Function, tensor_type
from ir.dims import Dim
from ir.ops import REGISTRY
from ir.ops.base import OpError, type_of
from ir.types import TupleType, tensor
from runtime.cpu import Executable

rng = np.random.default_rng(20250101)

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint32, np.bool_]
# every axis length is one of 0, 1, 2 and primes
SHAPES = [(0,), (1,), (2,), (7,), (3, 0), (5, 13), (2, 7, 3), (1, 1, 31), (0, 4, 1)]


def tied(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Values from a few, so that most have ties; floats hold NaN (both signs), ±inf and ±0."""
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.floating):
        pool = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5]
    else:
        pool = [np.iinfo(dtype).min, np.iinfo(dtype).max, 0, 1, 2]
    return rng.choice(np.array(pool, dtype), shape)


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal dtype, shape and bytes: -0.0 is not 0.0, and NaNs keep their sign and payload."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
    assert got.tobytes() == want.tobytes(), (got, want)


def as_torch(x: np.ndarray) -> torch.Tensor:
    """x for torch in the same order: u32 as i64, bool as u8 (torch.topk has neither)."""
    return torch.from_numpy(x.astype(np.int64) if x.dtype == np.uint32 else
                            x.astype(np.uint8) if x.dtype == np.bool_ else x.copy())


def back(t: torch.Tensor, dtype: Any) -> np.ndarray:
    return t.numpy().astype(dtype)


def evaluate(name: str, *args: Any, **static: Any) -> Any:
    return REGISTRY[name].evaluate(*args, **static)


def axes(shape: tuple[int, ...]) -> range:
    return range(-len(shape), len(shape))


# ---------------------------------------------------------------- forward, bit for bit

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sort_and_argsort_match_numpy_ascending(shape, dtype):
    x = tied(shape, dtype)
    for axis in axes(shape):
        same(evaluate("sort", x, axis=axis), np.sort(x, axis, kind="stable"))
        same(evaluate("argsort", x, axis=axis),
             np.argsort(x, axis, kind="stable").astype(np.int32))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sort_and_argsort_match_torchs_stable_sort(shape, dtype, descending):
    """Descending too: NaN first, then +inf, and equal elements in input order."""
    x = tied(shape, dtype)
    for axis in axes(shape):
        want = torch.sort(as_torch(x), dim=axis, descending=descending, stable=True)
        same(evaluate("sort", x, axis=axis, descending=descending), back(want.values, dtype))
        same(evaluate("argsort", x, axis=axis, descending=descending),
             back(want.indices, np.int32))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_topk_values_are_torchs_and_ties_go_to_the_lower_index(shape, dtype, largest):
    """torch.topk's values; its indices among ties follow no documented order (on the CPU they
    change with k and n), so the indices, and the values bit for bit (-0.0 and 0.0 tie, as do
    NaNs of either sign), are the stable sort's first k."""
    x = tied(shape, dtype)
    for axis in axes(shape):
        n = shape[axis]
        for k in sorted({0, min(1, n), n // 2, n}):
            values, indices = evaluate("topk", x, k, axis=axis, largest=largest)
            want = torch.topk(as_torch(x), k, dim=axis, largest=largest)
            np.testing.assert_array_equal(values, back(want.values, dtype))
            stable = torch.sort(as_torch(x), dim=axis, descending=largest, stable=True)
            same(indices, back(stable.indices.narrow(axis, 0, k), np.int32))
            same(values, back(stable.values.narrow(axis, 0, k), dtype))


@pytest.mark.parametrize("shape", [(11,), (4, 7), (3, 5, 2)], ids=str)
def test_topk_indices_are_torchs_without_ties(shape):
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32)
    for axis in axes(shape):
        for largest in (True, False):
            _, indices = evaluate("topk", x, 3 if shape[axis] >= 3 else 1, axis=axis,
                                  largest=largest)
            want = torch.topk(torch.from_numpy(x), indices.shape[axis], dim=axis, largest=largest)
            same(indices, back(want.indices, np.int32))


@pytest.mark.parametrize("xshape, ishape, axis", [
    ((5, 7), (5, 3), 1), ((5, 7), (2, 7), 0), ((1, 7), (4, 2), 1), ((5, 7), (1, 4), -1),
    ((3, 1, 2), (3, 4, 1), 1), ((2, 3, 5), (2, 3, 0), 2), ((7,), (11,), 0), ((4, 1), (4, 5), 1)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_take_along_axis_matches_numpy_and_torch(xshape, ishape, axis, dtype):
    """Broadcast axes and negative indices (not for u32) included."""
    x = tied(xshape, np.float32)
    n = xshape[axis]
    low = 0 if dtype is np.uint32 else -n
    idx = rng.integers(low, n, ishape).astype(dtype)
    got = evaluate("take_along_axis", x, idx, axis=axis)
    same(got, np.take_along_axis(x, idx, axis))
    want = torch.take_along_dim(torch.from_numpy(x), torch.from_numpy(idx.astype(np.int64) % n),
                                axis)
    same(got, want.numpy())


def test_take_along_axis_out_of_range_is_numpys_index_error():
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 1 with size 5"):
        evaluate("take_along_axis", np.zeros((2, 5)), np.array([[0], [5]]), axis=1)
    with pytest.raises(IndexError, match="index -6 is out of bounds for axis 0 with size 5"):
        evaluate("take_along_axis", np.zeros(5), np.array([-6]), axis=0)


# ---------------------------------------------------------------- shape rules and errors

B, N, K = Dim.var("B"), Dim.var("N"), Dim.var("K")


def infer(name: str, *args: Any, **static: Any) -> Any:
    return REGISTRY[name].infer(*args, **static)


def test_symbolic_shape_rules():
    x = tensor("f32", B, N)
    assert infer("sort", x, axis=0, descending=True) == x
    assert infer("argsort", x) == tensor("i32", B, N)
    assert infer("argsort", tensor("bool", 3)) == tensor("i32", 3)
    assert infer("topk", x, K, axis=0) == TupleType((tensor("f32", K, N), tensor("i32", K, N)))
    assert infer("topk", x, Dim.const(3)) == TupleType((tensor("f32", B, 3), tensor("i32", B, 3)))
    assert infer("take_along_axis", x, tensor("i32", B, K), 1) == tensor("f32", B, K)
    assert infer("take_along_axis", tensor("f32", 1, N), tensor("i64", B, K), 1) \
        == tensor("f32", B, K)
    assert infer("take_along_axis", x, tensor("u32", 1, 2), -1) == tensor("f32", B, 2)
    assert infer("sort", type_of([3.0, 1.0])).weak                  # a literal stays weak


@pytest.mark.parametrize("name, args, static, message, arg", [
    ("sort", (tensor("f32", 3, 4),), {"axis": 2}, "axis 2 is out of range for f32[3, 4] of rank 2",
     "axis"),
    ("argsort", (tensor("f32"),), {}, "axis -1 is out of range for f32 of rank 0", "axis"),
    ("topk", (tensor("f32", 3), Dim.const(4)), {},
     "topk needs 0 <= k <= 3, the length of axis 0 of f32[3]; got k = 4", "k"),
    ("topk", (tensor("f32", N), Dim.const(-1)), {},
     "topk needs 0 <= k <= N, the length of axis 0 of f32[N]; got k = -1", "k"),
    ("topk", (tensor("f32", 2, 3), Dim.const(1)), {"axis": -3},
     "axis -3 is out of range for f32[2, 3] of rank 2", "axis"),
    ("take_along_axis", (tensor("f32", 3, 4), tensor("f32", 3, 2), 1), {},
     "take_along_axis needs integer indices, got f32[3, 2]; use cast(i, i32)", "indices"),
    ("take_along_axis", (tensor("f32", 3, 4), tensor("bool", 3, 2), 1), {},
     "take_along_axis needs integer indices, got bool[3, 2]; use cast(i, i32)", "indices"),
    ("take_along_axis", (tensor("f32", 3, 4), tensor("i32", 2), 0), {},
     "take_along_axis needs indices of the rank of f32[3, 4], got i32[2]", "indices"),
    ("take_along_axis", (tensor("f32", 3, 4), tensor("i32", 2, 2), 1), {},
     "take_along_axis cannot broadcast i32[2, 2] with f32[3, 4] on axis 0", "indices"),
    ("take_along_axis", (tensor("f32", 3, 4), tensor("i32", 3, 2), 2), {},
     "axis 2 is out of range for f32[3, 4] of rank 2", "axis"),
])
def test_rules_reject_with_a_message(name, args, static, message, arg):
    with pytest.raises(OpError) as info:
        infer(name, *args, **static)
    assert (info.value.message, info.value.arg) == (message, arg)


@pytest.mark.parametrize("body, message", [
    ("topk(x, 5)[0]", "topk needs 0 <= k <= 4, the length of axis 1 of f32[3, 4]; got k = 5"),
    ("sort(x, axis=2)", "axis 2 is out of range for f32[3, 4] of rank 2"),
    ("take_along_axis(x, cast(i, f32), 1)", "take_along_axis needs integer indices"),
    ("take_along_axis(x, i[0], 1)", "take_along_axis needs indices of the rank of f32[3, 4]"),
    ("argsort(x, descending=1)", "'descending' of 'argsort' must be a static bool"),
])
def test_errors_are_diagnostics(body, message):
    prog = dsl.loads(f"def f(x: f32[3, 4], i: i32[3, 2]):\n  return {body}\n", device="reference")
    with pytest.raises(dsl.DslError, match=message.replace("[", r"\[")):
        prog.f(np.zeros((3, 4), np.float32), np.zeros((3, 2), np.int32))


def test_k_beyond_a_symbolic_length_is_an_error_when_specialised():
    prog = dsl.loads("def f(x: f32[N]) -> f32[3]:\n  return topk(x, 3)[0]\n", device="reference")
    np.testing.assert_array_equal(prog.f(np.arange(4, dtype=np.float32)), [3, 2, 1])
    with pytest.raises(dsl.DslError, match="topk needs 0 <= k <= 2"):
        prog.f(np.arange(2, dtype=np.float32))


def test_an_index_out_of_range_is_a_diagnostic_at_run_time():
    prog = dsl.loads("def f(x: f32[2, 5], i: i32[2, 1]) -> f32[2, 1]:\n"
                     "  return take_along_axis(x, i, 1)\n", device="reference")
    with pytest.raises(dsl.DslError, match="'take_along_axis' failed at run time: index 5 is "
                                           "out of bounds for axis 1 with size 5"):
        prog.f(np.zeros((2, 5), np.float32), np.array([[0], [5]], np.int32))


# ---------------------------------------------------------------- the CPU runtime

def ordering_program() -> Function:
    """Every primitive of the module on one f32[6, 13] input, and the gradient of a loss through
    sort, topk and take_along_axis (arange, take_along_axis and scatter_add in the VJP)."""
    b = Builder("order")
    x = b.param(tensor_type("f32", (6, 13)))
    w = b.param(tensor_type("f32", (6, 4)))
    values, indices = b.emit("topk", x, k=4, largest=False)
    down = b.emit("sort", x, axis=0, descending=True)
    picked = b.emit("take_along_axis", x, b.emit("argsort", x, axis=1), axis=1)
    loss = b.emit("add", b.emit("sum", b.emit("mul", values, w)),
                  b.emit("sum", b.emit("mul", down, picked)))
    f = b.finish([loss, values, indices, down, picked])
    return grad_function(f, wrt=[0], with_value=True)


def test_the_cpu_runtime_computes_the_interpreters_bits():
    g = ordering_program()
    x = tied((6, 13), np.float32)
    x[np.isnan(x)] = 3.0                     # a NaN in the loss would hide the gradient's bits
    w = rng.standard_normal((6, 4)).astype(np.float32)
    want = interp.run(g, [x, w])
    got = Executable(g).run([x, w])
    assert len(got) == len(want) == 6
    for a, e in zip(got, want):
        same(np.asarray(a), e)


# ---------------------------------------------------------------- a .bend program

PROGRAM = """
def order(x: f32[B, N], i: i32[B, M]) -> (f32[B, N], i32[N, B], f32[B, 3], i32[B, 3], f32[B, M]):
  v, j = topk(x, 3, largest=False)
  return sort(x, descending=True), transpose(argsort(x, axis=0)), v, j, take_along_axis(x, i, 1)

def loss(x: f32[B, N], w: f32[B, 3]) -> f32:
  s = sort(x, axis=0)
  return sum(topk(x, 3)[0] * w) + sum(s * s * s)
"""


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_a_program_sorts_selects_and_differentiates_as_torch(device):
    prog = dsl.loads(PROGRAM, device=device)
    x = rng.permutation(4 * 9).reshape(4, 9).astype(np.float32) - 17.0      # no ties
    i = rng.integers(-9, 9, (4, 5)).astype(np.int32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    t = torch.from_numpy(x).requires_grad_(True)
    small = torch.topk(t, 3, largest=False)
    want = (torch.sort(t, descending=True).values, torch.argsort(t, dim=0).T, small.values,
            small.indices, torch.take_along_dim(t, torch.from_numpy(i % 9).long(), 1))
    for got, e in zip(prog.order(x, i), want):
        np.testing.assert_array_equal(got, e.detach().numpy())
    loss = ((torch.topk(t, 3).values * torch.from_numpy(w)).sum()
            + (torch.sort(t, 0).values ** 3).sum())
    (grad,) = torch.autograd.grad(loss, [t])
    np.testing.assert_allclose(prog.grad("loss", wrt="x")(x, w), grad.numpy(), rtol=1e-6)
