"""The primitives' shape rules and reference evaluations, against NumPy's own behaviour."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ir.core import Builder, tensor_type
from ir.dims import Dim
from ir.interp import run
from ir.ops import BINARY_OPERATORS, REGISTRY, UNARY_OPERATORS, lookup
from ir.ops.base import Kind, OpError, type_of
from ir.ops.shape import SliceSpec
from ir.types import KeyType, ListType, TensorType, TupleType, UnknownType, tensor

rng = np.random.default_rng(0)
B, T, E, K, N = (Dim.var(v) for v in "BTEKN")
U = Dim.unknown()


def f32(*shape: int | str | Dim) -> TensorType:
    return tensor("f32", *shape)


def i32(*shape: int | str | Dim) -> TensorType:
    return tensor("i32", *shape)


def weak(dtype: str, *shape: int) -> TensorType:
    return TensorType(dtype, tuple(map(Dim.of, shape)), weak=True)


def normal(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def positive(*shape: int) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape).astype(np.float32)


def ints(*shape: int, lo: int = -9, hi: int = 10) -> np.ndarray:
    return rng.integers(lo, hi, shape).astype(np.int32)


def bools(*shape: int) -> np.ndarray:
    return rng.random(shape) < 0.5


def types_for(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the checker prepares them: types for tensors, Dims for dimensions."""
    kinds = {p.name: p.kind for p in REGISTRY[name].params}
    variadic = {p.name for p in REGISTRY[name].params if p.variadic}
    convert = {
        Kind.TENSOR: type_of,
        Kind.TENSORS: lambda v: tuple(map(type_of, v)),
        Kind.SHAPE: lambda v: tuple(map(Dim.const, v)),
        Kind.DIM: lambda v: None if v is None else Dim.const(v),
    }
    one = lambda k, v: convert.get(kinds[k], lambda v: v)(v)
    return {k: tuple(one(k, x) for x in v) if k in variadic else one(k, v)
            for k, v in args.items()}


def infer(name: str, **args: Any) -> Any:
    return REGISTRY[name].infer(**args)


def check_against_numpy(name: str, args: dict[str, Any], want: Any) -> None:
    """evaluate equals NumPy's answer in value and dtype, and infer gives that shape and dtype."""
    got = REGISTRY[name].evaluate(**args)
    typ = REGISTRY[name].infer(**types_for(name, args))
    if isinstance(want, tuple):
        assert isinstance(typ, TupleType) and len(got) == len(want) == len(typ.items)
        pairs = list(zip(got, want, typ.items))
    else:
        pairs = [(got, want, typ)]
    for g, w, t in pairs:
        w = np.asarray(w)
        assert isinstance(g, np.ndarray)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)
        assert t == type_of(w), (t, type_of(w))


# ---------------------------------------------------------------- registry and operators

def test_every_operator_names_a_primitive() -> None:
    assert set(BINARY_OPERATORS) == set("+ - * / % // ** @ == != < <= > >= & | ^ << >>".split())
    assert all(v in REGISTRY for v in {**BINARY_OPERATORS, **UNARY_OPERATORS}.values())


def test_split_has_a_tensor_and_a_key_form() -> None:
    forms = {p.name: p.params[0].kind for p in lookup("split")}
    assert forms == {"split": Kind.TENSOR, "key_split": Kind.KEY}
    assert lookup("no_such_primitive") == []


def test_every_primitive_has_a_docstring_and_unique_param_names() -> None:
    for prim in REGISTRY.values():
        assert type(prim).__doc__, prim.name
        names = [p.name for p in prim.params]
        assert len(names) == len(set(names)), prim.name


# ---------------------------------------------------------------- elementwise

UNARY_WANT = {
    "neg": lambda x: -x, "exp": np.exp, "log": np.log, "exp2": lambda x: 2 ** x,
    "log2": np.log2, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "sin": np.sin, "cos": np.cos, "abs": abs,
    "sign": np.sign, "floor": np.floor,
}


@pytest.mark.parametrize("name", sorted(UNARY_WANT))
def test_unary_float(name: str) -> None:
    x = positive(3, 4) if name in ("log", "log2", "sqrt", "rsqrt") else normal(3, 4) * 3
    check_against_numpy(name, {"x": x}, UNARY_WANT[name](x))


@pytest.mark.parametrize("name", ["neg", "abs", "sign"])
def test_unary_on_integers(name: str) -> None:
    x = ints(5, 2)
    check_against_numpy(name, {"x": x}, UNARY_WANT[name](x))


BINARY_WANT = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
    "maximum": np.maximum, "minimum": np.minimum,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
}


@pytest.mark.parametrize("name", sorted(BINARY_WANT))
def test_binary_float_broadcasting(name: str) -> None:
    a, b = positive(3, 1, 4), normal(5, 4)
    if name in ("eq", "ne", "le", "ge"):
        b[0, :] = 1.0
        a[0, 0, :] = 1.0
    check_against_numpy(name, {"a": a, "b": b}, BINARY_WANT[name](a, b))


@pytest.mark.parametrize("name, op", [("mod", lambda p, q: p % q),
                                      ("floordiv", lambda p, q: p // q)])
def test_integer_division_follows_python(name: str, op: Any) -> None:
    a = ints(6, 7)
    b = ints(7)
    b[b == 0] = 3
    want = np.array([[op(int(p), int(q)) for p, q in zip(row, b)] for row in a], np.int32)
    check_against_numpy(name, {"a": a, "b": b}, want)
    fa, fb = normal(7) * 5, positive(7) * np.where(bools(7), -1, 1).astype(np.float32)
    want_f = np.array([op(float(p), float(q)) for p, q in zip(fa, fb)], np.float32)
    check_against_numpy(name, {"a": fa, "b": fb}, want_f)


@pytest.mark.parametrize("name, op", [("and", np.logical_and), ("or", np.logical_or),
                                      ("xor", np.logical_xor)])
def test_logic_on_bools_and_bits_on_ints(name: str, op: Any) -> None:
    a, b = bools(4, 5), bools(5)
    check_against_numpy(name, {"a": a, "b": b}, op(a, b))
    x, y = ints(4, 5, lo=0, hi=255), ints(5, lo=0, hi=255)
    bitwise = {"and": x & y, "or": x | y, "xor": x ^ y}[name]
    check_against_numpy(name, {"a": x, "b": y}, bitwise)


def test_shifts() -> None:
    a, s = ints(4, 3, lo=-100, hi=100), ints(3, lo=0, hi=5)
    check_against_numpy("shl", {"a": a, "b": s}, a << s)
    check_against_numpy("shr", {"a": a, "b": s}, a >> s)


def test_where_and_cast() -> None:
    cond, a = bools(2, 1), normal(3)
    check_against_numpy("where", {"cond": cond, "a": a, "b": 0.0},
                        np.where(cond, a, np.float32(0)))
    x = np.array([-1.5, -0.5, 0.0, 2.7], np.float32)
    check_against_numpy("cast", {"x": x, "dtype": "i32"}, np.array([-1, 0, 0, 2], np.int32))
    check_against_numpy("cast", {"x": x, "dtype": "bool"}, x != 0)
    assert REGISTRY["cast"].reference(3, "f64").dtype == np.float64


def test_literals_take_the_tensors_dtype_in_evaluation() -> None:
    x = normal(3)
    check_against_numpy("mul", {"a": x, "b": 0.1}, x * np.float32(0.1))
    n = ints(3)
    check_against_numpy("add", {"a": n, "b": 2}, n + np.int32(2))
    assert REGISTRY["add"].evaluate(a=2, b=0.5).dtype == np.float32


def test_reference_works_on_python_numbers() -> None:
    assert REGISTRY["sqrt"].reference(4 * 16) == 8.0
    assert REGISTRY["floordiv"].reference(-7, 2) == -4
    assert REGISTRY["mod"].reference(-7, 2) == 1
    assert REGISTRY["pow"].reference(2, 10) == 1024
    assert REGISTRY["sigmoid"].reference(-1000.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4))
def test_broadcasting_matches_numpy(shapes: Any) -> None:
    (sa, sb), want = shapes.input_shapes, shapes.result_shape
    assert infer("add", a=f32(*sa), b=f32(*sb)) == f32(*want)
    # naming every non-1 dimension by its length keeps the rule intact symbolically
    name = {n: Dim.var(f"D{n}") for n in range(2, 5)}
    sym = [[d if d == 1 else name[d] for d in s] for s in (sa, sb, want)]
    assert infer("mul", a=f32(*sym[0]), b=f32(*sym[1])) == f32(*sym[2])


@pytest.mark.parametrize("a, b, want", [
    (f32("B", "T"), f32("T"), f32("B", "T")),
    (f32("B", 1, "E"), f32("T", 1), f32("B", "T", "E")),
    (f32(B * T, E), f32(T * B, 1), f32(B * T, E)),
    (TensorType("f32", (U, Dim.const(4))), f32("B", 4), f32("B", 4)),
    (TensorType("f32", (U,)), f32(1), TensorType("f32", (U,))),
    (f32(), f32("B"), f32("B")),
])
def test_symbolic_broadcasting(a: TensorType, b: TensorType, want: TensorType) -> None:
    assert infer("add", a=a, b=b) == want
    assert infer("lt", a=a, b=b) == want.with_dtype("bool")


@pytest.mark.parametrize("name, a, b, want", [
    ("mul", i32("B"), weak("i32"), i32("B")),
    ("mul", weak("i32"), tensor("f16", "B"), tensor("f16", "B")),
    ("add", f32("B"), weak("f32"), f32("B")),
    ("add", weak("i32"), weak("f32"), weak("f32")),
    ("add", weak("i32"), weak("i32", 2), weak("i32", 2)),
    ("div", weak("i32"), weak("i32"), weak("f32")),
    ("eq", i32("B"), weak("i32"), tensor("bool", "B")),
    ("and", tensor("bool", "B"), weak("bool"), tensor("bool", "B")),
    ("add", weak("bool"), i32("B"), i32("B")),
])
def test_weak_literals(name: str, a: TensorType, b: TensorType, want: TensorType) -> None:
    assert infer(name, a=a, b=b) == want


def test_weak_integer_literal_becomes_float_where_needed() -> None:
    assert infer("sqrt", x=weak("i32")) == weak("f32")
    assert infer("mean", x=weak("i32", 3)) == weak("f32")


def test_where_rules() -> None:
    assert infer("where", cond=tensor("bool", "B", 1), a=f32("T"), b=weak("f32")) == f32("B", "T")
    assert infer("cast", x=weak("f32"), dtype="i32") == i32()


# ---------------------------------------------------------------- reductions

@st.composite
def reductions(draw: Any, one_axis: bool = False) -> tuple[tuple[int, ...], Any, bool]:
    """A shape, an axis argument for it (None, an int or a tuple; some negative), keepdims."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    rank = len(shape)
    axes = draw(st.lists(st.integers(0, rank - 1), unique=True) if rank else st.just([]))
    signed = tuple(a - rank if draw(st.booleans()) else a for a in axes)
    choices = [None, *signed[:1]] + [signed] * (not one_axis)
    return shape, draw(st.sampled_from(choices)), draw(st.booleans())


@settings(max_examples=80, deadline=None)
@given(reductions(), st.sampled_from(["sum", "mean", "max", "min"]))
def test_reductions_match_numpy(case: Any, name: str) -> None:
    """max and min exactly; a float32 sum or mean of n terms, whatever its order, within
    n ulps of the largest partial sum (n * 2**-24 * sum|x|) of the float64 one, which a
    relative tolerance cannot bound where the terms cancel."""
    shape, axis, keepdims = case
    x = normal(*shape)
    if name in ("max", "min"):
        want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
        check_against_numpy(name, {"x": x, "axis": axis, "keepdims": keepdims}, want)
        return
    reduce = getattr(np, name)
    want = reduce(x.astype(np.float64), axis=axis, keepdims=keepdims)
    n = x.size // max(np.size(want), 1)
    bound = n * 2.0 ** -24 * reduce(np.abs(x).astype(np.float64), axis=axis, keepdims=keepdims)
    got = REGISTRY[name].evaluate(x, axis=axis, keepdims=keepdims)
    assert got.dtype == np.float32 and got.shape == np.shape(want)
    assert np.all(np.abs(got - want) <= bound + 1e-30)
    assert REGISTRY[name].infer(**types_for(name, {"x": x, "axis": axis, "keepdims": keepdims})) \
        == type_of(got)


@settings(max_examples=60, deadline=None)
@given(reductions())
def test_prod_matches_numpy(case: Any) -> None:
    """A float32 product of n terms, in any order, within about n ulps of the float64 one."""
    shape, axis, keepdims = case
    x = positive(*shape)
    want = np.prod(x.astype(np.float64), axis=axis, keepdims=keepdims)
    n = x.size // max(np.size(want), 1)
    got = REGISTRY["prod"].evaluate(x, axis=axis, keepdims=keepdims)
    assert got.dtype == np.float32 and got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=(n + 1) * 2.0 ** -24)


@settings(max_examples=60, deadline=None)
@given(reductions(), st.sampled_from(["any", "all"]), st.sampled_from(["f32", "i32", "bool"]))
def test_any_and_all_match_numpy(case: Any, name: str, dtype: str) -> None:
    shape, axis, keepdims = case
    x = {"f32": lambda: np.where(bools(*shape), normal(*shape), 0).astype(np.float32),
         "i32": lambda: ints(*shape, lo=-1, hi=2), "bool": lambda: bools(*shape)}[dtype]()
    want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    check_against_numpy(name, {"x": x, "axis": axis, "keepdims": keepdims}, np.asarray(want))


def test_any_and_all_count_nan_as_true_and_of_nothing_are_false_and_true() -> None:
    x = np.array([[np.nan, 0.0], [0.0, -0.0]], np.float32)
    np.testing.assert_array_equal(REGISTRY["any"].evaluate(x, axis=1), [True, False])
    np.testing.assert_array_equal(REGISTRY["all"].evaluate(x, axis=0), [False, False])
    empty = np.zeros((3, 0), np.float32)
    np.testing.assert_array_equal(REGISTRY["any"].evaluate(empty, axis=1), [False] * 3)
    np.testing.assert_array_equal(REGISTRY["all"].evaluate(empty, axis=1), [True] * 3)
    assert infer("any", x=f32(3, 0), axis=1) == tensor("bool", 3)


def test_integer_prod_wraps_around_as_sum_does() -> None:
    x = np.full((2, 40), 3, np.int32)
    check_against_numpy("prod", {"x": x, "axis": 1}, np.prod(x, axis=1).astype(np.int32))
    assert REGISTRY["prod"].evaluate(np.zeros((0,), np.int32)).item() == 1


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("axis, keepdims, correction", [(None, False, 0), (0, True, 1),
                                                         ((0, 2), False, 1), (-1, False, 0)])
def test_var_and_std_match_numpy(name: str, axis: Any, keepdims: bool, correction: int) -> None:
    """As NumPy's (its ddof is torch's correction), computed by the ops that define them."""
    x = normal(3, 4, 5) * 10 + 3
    b = Builder()
    p = b.param(tensor_type("f32", x.shape))
    fn = b.finish([b.emit(name, p, axis=axis, keepdims=keepdims, correction=correction)])
    (got,) = run(fn, [x])
    want = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims, ddof=correction)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert not {op.primitive.name for op in fn.ops} & {"var", "std"}    # its parts, expanded


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")       # torch's, for var of one term
@pytest.mark.parametrize("n", [0, 1, 7, 31, 97, 100_000])
@pytest.mark.parametrize("keepdims", [False, True])
def test_new_reductions_at_every_length_and_on_nan_and_inf(n: int, keepdims: bool) -> None:
    """prod, var, std, any and all over a long axis and a short one, with NaN and inf in
    some rows, against NumPy (and torch's var and std, NaN where any term is not finite)."""
    torch = pytest.importorskip("torch")
    x = rng.uniform(0.999, 1.001, (4, n)) * rng.choice([-1.0, 1.0], (4, n))
    if n:
        x[1, n // 2], x[2, n - 1] = np.nan, np.inf
    for a in (0, 1):
        t = torch.from_numpy(x)
        args = {"axis": a, "keepdims": keepdims}
        want = {"prod": np.prod(x, axis=a, keepdims=keepdims),
                "var": torch.var(t, a, correction=0, keepdim=keepdims).numpy(),
                "std": torch.std(t, a, correction=1, keepdim=keepdims).numpy(),
                "any": np.any(x, axis=a, keepdims=keepdims),
                "all": np.all(x > 0, axis=a, keepdims=keepdims)}
        b = Builder()
        p = b.param(tensor_type("f64", x.shape))
        fn = b.finish([b.emit("prod", p, **args), b.emit("var", p, **args),
                       b.emit("std", p, correction=1, **args), b.emit("any", p, **args),
                       b.emit("all", b.emit("gt", p, b.constant(0.0, "f64")), **args)])
        for got, (name, w) in zip(run(fn, [x]), want.items()):
            assert got.shape == w.shape and got.dtype == w.dtype, name
            np.testing.assert_allclose(got, w, rtol=1e-9 * max(n, 1), equal_nan=True, err_msg=name)


def test_var_of_too_few_elements_divides_by_zero_and_std_of_equal_ones_is_zero() -> None:
    """As torch's: N - correction <= 0 divides by 0 (inf, or NaN for 0 / 0)."""
    b = Builder()
    p = b.param(tensor_type("f32", (2, 1)))
    q = b.param(tensor_type("f32", (0,)))
    fn = b.finish([b.emit("var", p, axis=1, correction=1), b.emit("std", p, axis=1),
                   b.emit("var", q), b.emit("var", p, correction=2), b.emit("var", p, correction=3)])
    x = np.array([[2.0], [3.0]], np.float32)
    got = run(fn, [x, np.zeros(0, np.float32)])
    assert np.isnan(got[0]).all() and np.isnan(got[2])
    np.testing.assert_array_equal(got[1], [0.0, 0.0])
    assert got[3] == got[4] == np.inf
    x[1] = np.inf
    np.testing.assert_array_equal(run(fn, [x, np.zeros(0, np.float32)])[1], [0.0, np.nan])


@settings(max_examples=40, deadline=None)
@given(reductions(one_axis=True), st.sampled_from(["argmax", "argmin"]))
def test_arg_reductions_match_numpy(case: Any, name: str) -> None:
    shape, axis, keepdims = case
    x = ints(*shape, lo=0, hi=3)                       # many ties: the first index wins
    want = getattr(np, name)(x, axis=axis, keepdims=keepdims).astype(np.int32)
    check_against_numpy(name, {"x": x, "axis": axis, "keepdims": keepdims}, want)


def test_integer_sum_keeps_its_dtype() -> None:
    x = ints(3, 4)
    check_against_numpy("sum", {"x": x, "axis": 0}, x.sum(0).astype(np.int32))
    assert infer("sum", x=i32("B", "T"), axis=-1) == i32("B")


def test_symbolic_reductions() -> None:
    x = f32("B", "T", "E")
    assert infer("mean", x=x, axis=(0, -1), keepdims=True) == f32(1, "T", 1)
    assert infer("max", x=x) == f32()
    assert infer("argmax", x=x, axis=1) == i32("B", "E")
    assert infer("argmin", x=x) == i32()
    assert infer("max", x=tensor("bool", "B"), axis=0) == tensor("bool")


# ---------------------------------------------------------------- shape

def test_shape_primitives_against_numpy() -> None:
    x = normal(2, 3, 4)
    cases: list[tuple[str, dict[str, Any], Any]] = [
        ("reshape", {"x": x, "shape": (6, 4)}, x.reshape(6, 4)),
        ("reshape", {"x": x, "shape": (-1, 2)}, x.reshape(-1, 2)),
        ("reshape", {"x": x[0, 0, :1], "shape": ()}, x[0, 0, 0]),
        ("transpose", {"x": x}, x.T),
        ("transpose", {"x": x, "perm": (1, -1, 0)}, x.transpose(1, 2, 0)),
        ("broadcast_to", {"x": normal(3, 1), "shape": (2, 3, 5)}, None),
        ("expand_dims", {"x": x, "axis": 1}, x[:, None]),
        ("expand_dims", {"x": x, "axis": (0, -1)}, x[None, ..., None]),
        ("squeeze", {"x": normal(1, 3, 1)}, None),
        ("squeeze", {"x": normal(1, 3, 1), "axis": -1}, None),
        ("concat", {"xs": (x, normal(2, 1, 4)), "axis": 1}, None),
        ("concat", {"xs": (normal(2), [1.0, 2.0])}, None),
        ("stack", {"xs": (normal(2, 3), normal(2, 3), normal(2, 3)), "axis": -1}, None),
        ("split", {"x": x, "sections": 2, "axis": 2}, tuple(np.split(x, 2, 2))),
        ("split", {"x": x, "sections": (1, 2), "axis": 1}, (x[:, :1], x[:, 1:])),
        ("slice", {"x": x, "start": 1, "stop": 3, "axis": 1}, x[:, 1:3]),
        ("slice", {"x": x, "start": -1, "axis": -1}, x[..., -1:]),
        ("slice", {"x": x, "start": 3, "stop": 0, "axis": 2, "step": -2}, x[:, :, 3:0:-2]),
        ("pad", {"x": x, "widths": (0, 1, 2, 0, 1, 1), "value": 7.5}, None),
        ("flip", {"x": x, "axis": (0, 2)}, x[::-1, :, ::-1]),
        ("flip", {"x": x}, x[::-1, ::-1, ::-1]),
        ("tril", {"x": x, "k": 1}, np.tril(x, 1)),
        ("triu", {"x": x, "k": -1}, np.triu(x, -1)),
    ]
    for name, args, want in cases:
        if want is None:
            want = {
                "broadcast_to": lambda: np.broadcast_to(args["x"], args["shape"]),
                "squeeze": lambda: np.squeeze(args["x"], args.get("axis")),
                "concat": lambda: np.concatenate(
                    [np.asarray(v, np.float32) for v in args["xs"]], args.get("axis", 0)),
                "stack": lambda: np.stack(args["xs"], args["axis"]),
                "pad": lambda: np.pad(x, [(0, 1), (2, 0), (1, 1)], constant_values=7.5),
            }[name]()
        check_against_numpy(name, args, want)


@pytest.mark.parametrize("items", [
    (1,), (-1, 0), (Ellipsis, -1), (Ellipsis,), (SliceSpec(1, None), Ellipsis, 2),
    (SliceSpec(None, None, 2), SliceSpec(-2, None), SliceSpec(None, None, -1)),
    (SliceSpec(5, 1, -2),), (SliceSpec(-100, 100),), (SliceSpec(3, 1),), (0, 1, 2),
    (0, Ellipsis, SliceSpec(1, 3), 0),
])
def test_index_matches_numpy(items: tuple[Any, ...]) -> None:
    x = normal(6, 5, 4, 3)
    numpy_items = tuple(slice(i.lo, i.hi, i.step) if isinstance(i, SliceSpec) else i
                        for i in items)
    check_against_numpy("index", {"x": x, "items": items}, x[numpy_items])


@pytest.mark.parametrize("items, want", [
    ((0,), f32("T", 8)),
    ((SliceSpec(None, None), -1), f32("B", 8)),
    ((Ellipsis, SliceSpec(2, 6)), f32("B", "T", 4)),
    ((SliceSpec(1, None),), f32(B - 1, "T", 8)),
    ((SliceSpec(None, -1),), f32(B - 1, "T", 8)),
    ((SliceSpec(-3, None),), f32(3, "T", 8)),
    ((SliceSpec(None, T),), f32("T", "T", 8)),
    ((SliceSpec(None, None, -1),), f32("B", "T", 8)),
    ((SliceSpec(None, None, 2), Ellipsis, SliceSpec(None, None, 3)), f32((B + 1) // 2, "T", 3)),
    ((T - 1,), f32("T", 8)),
])
def test_symbolic_index(items: tuple[Any, ...], want: TensorType) -> None:
    assert infer("index", x=f32("B", "T", 8), items=items) == want


def test_index_on_unknown_dims() -> None:
    x = TensorType("f32", (U, Dim.const(8)))
    assert infer("index", x=x, items=(SliceSpec(None, -1),)) == TensorType("f32", (U, Dim.const(8)))
    assert infer("index", x=x, items=(SliceSpec(0, 2),)) == f32(2, 8)
    assert infer("index", x=x, items=(-1, 3)) == f32()


def test_slice_spec_prints_like_python() -> None:
    assert [str(s) for s in (SliceSpec(), SliceSpec(1, T), SliceSpec(None, None, -1))] == \
        [":", "1:T", "::-1"]


@pytest.mark.parametrize("name, args, want", [
    ("reshape", {"x": f32("B", "T", "E"), "shape": (B, T * E)}, f32("B", T * E)),
    ("reshape", {"x": f32("B", "T", "E"), "shape": (Dim.const(-1), E)}, f32(B * T, "E")),
    ("reshape", {"x": f32(B * T, 4), "shape": (B, Dim.const(-1), Dim.const(2))},
     f32("B", 2 * T, 2)),
    ("reshape", {"x": TensorType("f32", (U, E)), "shape": (B, Dim.const(-1))},
     TensorType("f32", (B, U))),
    ("reshape", {"x": TensorType("f32", (U,)), "shape": (B, T)}, f32("B", "T")),
    ("transpose", {"x": f32("B", "T", "E")}, f32("E", "T", "B")),
    ("transpose", {"x": f32("B", "T", "E"), "perm": (0, 2, 1)}, f32("B", "E", "T")),
    ("broadcast_to", {"x": f32(1, "E"), "shape": (B, T, E)}, f32("B", "T", "E")),
    ("broadcast_to", {"x": f32("E"), "shape": (B, U)}, f32("B", "E")),
    ("expand_dims", {"x": f32("B", "T"), "axis": -1}, f32("B", "T", 1)),
    ("squeeze", {"x": f32(1, "B", 1)}, f32("B")),
    ("squeeze", {"x": TensorType("f32", (U, B)), "axis": 0}, f32("B")),
    ("squeeze", {"x": TensorType("f32", (U, B))}, UnknownType()),
    ("concat", {"xs": (f32("B", "T"), f32("B", "E"), f32("B", 1)), "axis": 1},
     f32("B", T + E + 1)),
    ("concat", {"xs": (TensorType("f32", (U, T)), f32("B", "E")), "axis": -1},
     f32("B", T + E)),
    ("stack", {"xs": (f32("B", "T"), f32("B", "T")), "axis": 1}, f32("B", 2, "T")),
    ("split", {"x": f32("B", 3 * E), "sections": 3, "axis": -1},
     TupleType((f32("B", "E"),) * 3)),
    ("split", {"x": f32("B", T + E), "sections": (T, E), "axis": 1},
     TupleType((f32("B", "T"), f32("B", "E")))),
    ("split", {"x": f32("B", "E"), "sections": K, "axis": 1}, UnknownType()),
    ("slice", {"x": f32("B", "T"), "start": Dim.const(0), "stop": T - 1, "axis": 1},
     f32("B", T - 1)),
    ("pad", {"x": f32("B", "T"), "widths": (Dim.const(0), Dim.const(0), K - 1, Dim.const(0))},
     f32("B", T + K - 1)),
    ("pad", {"x": f32("B"), "widths": (Dim.const(1), Dim.const(1))}, f32(B + 2)),
    ("flip", {"x": f32("B", "T"), "axis": -1}, f32("B", "T")),
    ("tril", {"x": tensor("bool", "T", "T")}, tensor("bool", "T", "T")),
])
def test_symbolic_shape_rules(name: str, args: dict[str, Any], want: Any) -> None:
    assert infer(name, **args) == want


# ---------------------------------------------------------------- indexing

def test_take_one_hot_scatter_add_against_numpy() -> None:
    x, idx = normal(5, 4, 3), np.array([[0, 3], [3, 1], [2, 2]], np.int32)
    check_against_numpy("take", {"x": x, "indices": idx, "axis": 1}, x[:, idx])
    check_against_numpy("take", {"x": x, "indices": 4}, x[4])
    check_against_numpy("one_hot", {"indices": idx, "n": 4}, np.eye(4, dtype=np.float32)[idx])
    check_against_numpy("one_hot", {"indices": idx, "n": 4, "dtype": "i32"},
                        np.eye(4, dtype=np.int32)[idx])
    updates = normal(5, 3, 2, 3)
    want = x.copy()
    for i in range(3):
        for j in range(2):
            want[:, idx[i, j]] += updates[:, i, j]
    check_against_numpy("scatter_add",
                        {"x": x, "indices": idx, "updates": updates, "axis": 1}, want)


def test_take_counts_negative_indices_from_the_end_unless_told_not_to() -> None:
    x, idx = normal(5, 3), np.array([0, -1, 4], np.int32)
    check_against_numpy("take", {"x": x, "indices": idx}, x[idx])
    with pytest.raises(IndexError, match="index -1 is out of bounds for axis 1 with size 3"):
        REGISTRY["take"].evaluate(x, idx, axis=-1, from_end=False)
    check_against_numpy("take", {"x": x, "indices": idx % 3, "axis": 1, "from_end": False},
                        x[:, idx % 3])


@pytest.mark.parametrize("prim, dtype", [("argmax", "f32"), ("argmin", "f32"), ("max", "i32"),
                                         ("min", "i32"), ("max", "bool")])
def test_reductions_without_an_identity_reject_an_empty_axis(prim, dtype) -> None:
    """NumPy raises for these; a sum (0) and a float max (-inf) of nothing are defined."""
    with pytest.raises(OpError, match=f"'{prim}' of an empty axis has no value"):
        infer(prim, x=tensor(dtype, 3, 0), axis=1)
    with pytest.raises(OpError, match="has length 0 on axis 0"):
        infer(prim, x=tensor(dtype, 0, 4))
    assert infer(prim, x=tensor(dtype, 3, 0), axis=0).shape == (Dim.const(0),)


def test_reductions_with_an_identity_accept_an_empty_axis() -> None:
    assert infer("sum", x=i32(3, 0), axis=1) == i32(3)
    assert infer("max", x=f32(0, 3), axis=0) == f32(3)
    assert infer("mean", x=f32(0)) == f32()


def test_symbolic_indexing_rules() -> None:
    emb = f32("V", "E")
    assert infer("take", x=emb, indices=i32("B", "T")) == f32("B", "T", "E")
    assert infer("take", x=f32("B", "V"), indices=i32("K"), axis=-1) == f32("B", "K")
    assert infer("take", x=emb, indices=weak("i32")) == f32("E")
    assert infer("one_hot", indices=i32("B"), n=Dim.var("V")) == f32("B", "V")
    assert infer("scatter_add", x=emb, indices=i32("B", "T"), updates=f32("B", "T", "E")) == emb
    assert infer("scatter_add", x=emb, indices=i32("B"),
                 updates=TensorType("f32", (U, E))) == emb


# ---------------------------------------------------------------- contraction

@pytest.mark.parametrize("sa, sb", [
    ((3,), (3,)), ((3,), (3, 5)), ((4, 3), (3,)), ((4, 3), (3, 5)), ((2, 1, 4, 3), (6, 3, 5)),
    ((6, 4, 3), (3,)), ((3,), (2, 3, 5)),
])
def test_matmul_matches_numpy(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = normal(*sa), normal(*sb)
    check_against_numpy("matmul", {"a": a, "b": b}, a @ b)


@pytest.mark.parametrize("a, b, want", [
    (f32("B", "K"), f32("K", "N"), f32("B", "N")),
    (f32("H", 1, "T", "D"), f32("B", "D", "S"), f32("H", "B", "T", "S")),
    (f32("K"), f32("K", "N"), f32("N")),
    (f32("B", "K"), f32("K"), f32("B")),
    (f32("K"), f32("K"), f32()),
    (TensorType("f32", (B, U)), f32(64, "N"), f32("B", "N")),
])
def test_symbolic_matmul(a: TensorType, b: TensorType, want: TensorType) -> None:
    assert infer("matmul", a=a, b=b) == want


@pytest.mark.parametrize("spec, shapes", [
    ("bhtd,bhsd->bhts", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij,jk->", [(3, 4), (4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("Ba,aC", [(2, 3), (3, 4)]),
    ("ba,ab", [(2, 3), (3, 2)]),
    ("i j , j -> i", [(3, 4), (4,)]),
    (",i->i", [(), (3,)]),
])
def test_einsum_matches_numpy(spec: str, shapes: list[tuple[int, ...]]) -> None:
    ops = tuple(normal(*s) for s in shapes)
    check_against_numpy("einsum", {"spec": spec, "operands": ops}, np.einsum(spec, *ops))


def test_symbolic_einsum() -> None:
    q, k = f32("B", "H", "T", "D"), f32("B", "H", "S", "D")
    assert infer("einsum", spec="bhtd,bhsd->bhts", operands=(q, k)) == f32("B", "H", "T", "S")
    assert infer("einsum", spec="ij,jk", operands=(f32(U, "K"), f32(U, "N"))) == \
        TensorType("f32", (U, Dim.var("N")))
    assert infer("einsum", spec="ab,bc->ac", operands=(f32("A", U), f32(4, "C"))) == f32("A", "C")


# ---------------------------------------------------------------- construction, randomness

def test_construction_against_numpy() -> None:
    cases: list[tuple[str, dict[str, Any], Any]] = [
        ("zeros", {"shape": (2, 3)}, np.zeros((2, 3), np.float32)),
        ("ones", {"shape": (4,), "dtype": "i32"}, np.ones(4, np.int32)),
        ("ones", {"shape": (), "dtype": "bool"}, np.ones((), bool)),
        ("full", {"shape": (2, 2), "value": 2.5}, np.full((2, 2), 2.5, np.float32)),
        ("full", {"shape": (3,), "value": -1, "dtype": "i64"}, np.full(3, -1, np.int64)),
        ("arange", {"start": 5}, np.arange(5, dtype=np.int32)),
        ("arange", {"start": 2, "stop": 11, "step": 3}, np.arange(2, 11, 3, dtype=np.int32)),
        ("arange", {"start": 5, "stop": 0, "step": -2, "dtype": "f32"},
         np.arange(5, 0, -2, dtype=np.float32)),
        ("arange", {"start": 5, "stop": 2}, np.arange(5, 2, dtype=np.int32)),
        ("eye", {"n": 3}, np.eye(3, dtype=np.float32)),
        ("eye", {"n": 2, "m": 4, "dtype": "i32"}, np.eye(2, 4, dtype=np.int32)),
    ]
    for name, args, want in cases:
        check_against_numpy(name, args, want)


def test_symbolic_construction() -> None:
    assert infer("zeros", shape=(B, T * E)) == f32("B", T * E)
    assert infer("full", shape=(B,), value=0, dtype="i32") == i32("B")
    assert infer("arange", start=T) == i32("T")
    assert infer("arange", start=Dim.const(0), stop=E, step=2, dtype="f32") == f32((E + 1) // 2)
    assert infer("arange", start=Dim.const(1), stop=T) == i32(T - 1)
    assert infer("eye", n=N) == f32("N", "N")
    assert infer("eye", n=N, m=K, dtype="bool") == tensor("bool", "N", "K")


def test_random_rules() -> None:
    key = KeyType()
    assert infer("key", seed=0) == key
    assert infer("key_split", k=key, n=Dim.const(3)) == ListType(key, Dim.const(3))
    assert infer("key_split", k=key, n=Dim.var("L")) == ListType(key, Dim.var("L"))
    assert infer("fold_in", k=key, i=weak("i32")) == key
    assert infer("fold_in", k=key, i=i32()) == key
    assert infer("uniform", k=key, shape=(B, E), low=-1.0, high=1.0) == f32("B", "E")
    assert infer("normal", k=key, shape=(E,), dtype="f64") == tensor("f64", "E")
    assert infer("bernoulli", k=key, p=weak("f32"), shape=(B, T)) == tensor("bool", "B", "T")
    assert infer("bernoulli", k=key, p=f32(), shape=()) == tensor("bool")
    for name in ("key", "key_split", "fold_in", "uniform", "normal", "bernoulli"):
        assert not REGISTRY[name].differentiable


def test_stop_gradient() -> None:
    x = normal(3)
    check_against_numpy("stop_gradient", {"x": x}, x)
    assert infer("stop_gradient", x=weak("f32", 2)) == weak("f32", 2)


# ---------------------------------------------------------------- errors

ERRORS: list[tuple[str, dict[str, Any], str, str | None]] = [
    # elementwise dtypes
    ("exp", {"x": i32("B")}, "'exp' needs a float tensor, got i32[B]; use cast(x, f32)", "x"),
    ("neg", {"x": tensor("bool", "B")}, "'-' needs a numeric tensor, got bool[B]", "x"),
    ("add", {"a": f32("B"), "b": i32("B")},
     "cannot mix f32[B] and i32[B] in '+'; use cast() to convert one", None),
    ("mul", {"a": i32("B"), "b": weak("f32")},
     "a float literal cannot take the integer dtype i32", "b"),
    ("and", {"a": weak("i32"), "b": tensor("bool", "B")},
     "an integer literal cannot take the boolean dtype bool", "a"),
    ("div", {"a": i32("B"), "b": i32("B")},
     "'/' needs float operands, got i32[B] and i32[B]; use '//' for integer division, "
     "or cast() to a float dtype", None),
    ("div", {"a": i32("B"), "b": weak("i32")}, "'/' needs float operands", None),
    ("add", {"a": tensor("bool", "B"), "b": tensor("bool", "B")},
     "'+' needs numeric operands, got bool[B] and bool[B]; use cast()", None),
    ("or", {"a": f32("B"), "b": f32("B")}, "'|' needs bool or integer operands", None),
    ("shl", {"a": tensor("bool", "B"), "b": tensor("bool", "B")},
     "'<<' needs integer operands", None),
    ("add", {"a": f32("B", 4), "b": f32(3)}, "cannot broadcast f32[B, 4] with f32[3]", None),
    ("add", {"a": f32("B"), "b": f32("T")}, "cannot broadcast f32[B] with f32[T]", None),
    ("where", {"cond": f32("B"), "a": f32("B"), "b": f32("B")},
     "where needs a bool condition, got f32[B]", "cond"),
    ("where", {"cond": tensor("bool", 5), "a": f32(2, 1), "b": f32(3)},
     "cannot broadcast bool[5] with f32[3]", None),
    ("where", {"cond": tensor("bool", "B"), "a": f32("B"), "b": i32("B")},
     "cannot mix f32[B] and i32[B] in 'where'", None),
    # reductions
    ("sum", {"x": f32("B", "T"), "axis": 2}, "axis 2 is out of range for f32[B, T] of rank 2",
     "axis"),
    ("sum", {"x": f32("B", "T"), "axis": -3}, "axis -3 is out of range", "axis"),
    ("sum", {"x": f32(), "axis": 0}, "axis 0 is out of range for f32 of rank 0", "axis"),
    ("max", {"x": f32("B", "T"), "axis": (1, -1)}, "axis -1 is repeated in (1, -1)", "axis"),
    ("mean", {"x": i32("B")}, "'mean' needs a float tensor, got i32[B]; use cast()", "x"),
    ("sum", {"x": tensor("bool", "B")}, "'sum' needs a numeric tensor, got bool[B]", "x"),
    ("prod", {"x": tensor("bool", "B")}, "'prod' needs a numeric tensor, got bool[B]", "x"),
    ("var", {"x": i32("B")}, "'var' needs a float tensor, got i32[B]; use cast()", "x"),
    ("std", {"x": f32("B", "T"), "axis": 2}, "axis 2 is out of range for f32[B, T]", "axis"),
    ("any", {"x": f32("B"), "axis": (0, 0)}, "axis 0 is repeated in (0, 0)", "axis"),
    ("argmax", {"x": f32("B", "T"), "axis": (0, 1)}, "'argmax' takes one axis or None, got (0, 1)",
     "axis"),
    # shape
    ("reshape", {"x": f32("B", "T", "E"), "shape": (B, T)},
     "cannot reshape f32[B, T, E] (B * E * T elements) to [B, T] (B * T elements)", "shape"),
    ("reshape", {"x": f32(6), "shape": (Dim.const(-1), Dim.const(4))},
     "cannot reshape f32[6] (6 elements) to [-1, 4]", "shape"),
    ("reshape", {"x": f32(6), "shape": (Dim.const(-1), Dim.const(-1))},
     "reshape allows one -1 in its shape, got [-1, -1]", "shape"),
    ("reshape", {"x": f32(6), "shape": (Dim.const(-2), Dim.const(-3))},
     "shape [-2, -3] has a negative dimension", "shape"),
    ("transpose", {"x": f32("B", "T", "E"), "perm": (0, 1)},
     "perm (0, 1) must name each of the 3 axes of f32[B, T, E] once", "perm"),
    ("transpose", {"x": f32("B", "T"), "perm": (0, 0)}, "axis 0 is repeated in (0, 0)", "perm"),
    ("broadcast_to", {"x": f32(3), "shape": (B, Dim.const(4))},
     "cannot broadcast f32[3] to [B, 4]", "shape"),
    ("broadcast_to", {"x": f32("B", "T"), "shape": (T,)}, "cannot broadcast f32[B, T] to [T]",
     "shape"),
    ("expand_dims", {"x": f32("B"), "axis": 2},
     "axis 2 is out of range for the result of expand_dims(f32[B]) of rank 2", "axis"),
    ("expand_dims", {"x": f32("B"), "axis": None}, "expand_dims needs an axis", "axis"),
    ("squeeze", {"x": f32("B", 1), "axis": 0},
     "cannot squeeze axis 0 of f32[B, 1]: its length is B, not 1", "axis"),
    ("concat", {"xs": ()}, "concat needs at least one tensor", "xs"),
    ("concat", {"xs": (f32("B", "T"), f32("T"))},
     "concat needs tensors of one rank, got f32[B, T] and f32[T]", "xs"),
    ("concat", {"xs": (f32("B", 4), f32("B", 5))},
     "cannot concat f32[B, 4] and f32[B, 5] along axis 0: axis 1 differs", "xs"),
    ("concat", {"xs": (f32("B"), i32("B"))}, "cannot mix f32[B] and i32[B] in 'concat'", None),
    ("stack", {"xs": (f32("B", 4), f32("B", 5))},
     "stack needs tensors of one shape, got f32[B, 4] and f32[B, 5]", "xs"),
    ("stack", {"xs": (f32("B"),), "axis": 2},
     "axis 2 is out of range for the result of stacking f32[B] of rank 2", "axis"),
    ("split", {"x": f32("B", 10), "sections": 3, "axis": 1},
     "cannot split axis 1 of f32[B, 10] into 3 equal parts", "sections"),
    ("split", {"x": f32("B", 10), "sections": 0, "axis": 1},
     "cannot split axis 1 of f32[B, 10] into 0 equal parts", "sections"),
    ("split", {"x": f32("B", "T"), "sections": (2, T), "axis": 1},
     "split sizes [2, T] add up to T + 2, but axis 1 of f32[B, T] has length T", "sections"),
    ("split", {"x": f32("B", "T"), "sections": (), "axis": 1},
     "split sizes [] add up to 0", "sections"),
    ("slice", {"x": f32("B", "T"), "start": Dim.const(0), "step": 0},
     "a slice step cannot be zero", "step"),
    ("slice", {"x": f32("B"), "start": Dim.const(0), "axis": 1},
     "axis 1 is out of range for f32[B] of rank 1", "axis"),
    ("index", {"x": f32("B", 4), "items": (0, 1, 2)},
     "too many indices for f32[B, 4]: 3 given", "items"),
    ("index", {"x": f32("B", 4), "items": (Ellipsis, 0, Ellipsis)},
     "an index can hold only one '...'", "items"),
    ("index", {"x": f32(4, "B"), "items": (5,)}, "index 5 is out of range for axis 0 of f32[4, B]",
     "items"),
    ("index", {"x": f32(4, "B"), "items": (SliceSpec(None, None, 0),)},
     "a slice step cannot be zero", "items"),
    ("pad", {"x": f32("B", "T"), "widths": (Dim.const(1), Dim.const(1))},
     "pad needs a (before, after) pair of widths for each axis of f32[B, T]: 4 numbers, got 2",
     "widths"),
    ("pad", {"x": f32("B"), "widths": (Dim.const(-1), Dim.const(1))},
     "pad widths cannot be negative: [-1, 1]", "widths"),
    ("pad", {"x": i32("B"), "widths": (Dim.const(1), Dim.const(1)), "value": 0.5},
     "the value 0.5 cannot become i32", "value"),
    ("flip", {"x": f32("B"), "axis": 1}, "axis 1 is out of range for f32[B] of rank 1", "axis"),
    ("tril", {"x": f32("T")}, "tril needs a tensor of rank 2 or more, got f32[T]", "x"),
    # indexing
    ("take", {"x": f32("V", "E"), "indices": f32("B")},
     "take needs integer indices, got f32[B]; use cast(i, i32)", "indices"),
    ("take", {"x": f32("V", "E"), "indices": i32("B"), "axis": 2},
     "axis 2 is out of range for f32[V, E] of rank 2", "axis"),
    ("one_hot", {"indices": tensor("bool", "B"), "n": Dim.const(3)},
     "one_hot needs integer indices, got bool[B]", "indices"),
    ("one_hot", {"indices": i32("B"), "n": Dim.const(-3)},
     "shape [-3] has a negative dimension", "n"),
    ("scatter_add", {"x": f32("V", "E"), "indices": i32("B"), "updates": f32("B", "V")},
     "scatter_add needs updates of shape [B, E] (x.shape[:axis] + indices.shape + "
     "x.shape[axis + 1:]), got f32[B, V]", "updates"),
    ("scatter_add", {"x": f32("V", "E"), "indices": i32("B"), "updates": tensor("f64", "B", "E")},
     "cannot mix f32[V, E] and f64[B, E] in 'scatter_add'", None),
    ("scatter_add", {"x": tensor("bool", "V"), "indices": i32("B"), "updates": tensor("bool", "B")},
     "scatter_add needs numeric tensors, got bool[V]; use cast()", "x"),
    # contraction
    ("matmul", {"a": f32("B", 64), "b": f32(128, "V")},
     "shape mismatch in '@': f32[B, 64] @ f32[128, V]", None),
    ("matmul", {"a": f32(2, "B", "K"), "b": f32(3, "K", "N")},
     "shape mismatch in '@': f32[2, B, K] @ f32[3, K, N]", None),
    ("matmul", {"a": f32(), "b": f32("K")},
     "'@' needs operands of rank 1 or more, got f32 @ f32[K]", None),
    ("matmul", {"a": f32("B", "K"), "b": i32("K", "N")},
     "cannot mix f32[B, K] and i32[K, N] in '@'", None),
    ("matmul", {"a": tensor("bool", "B", "K"), "b": tensor("bool", "K", "N")},
     "'@' needs numeric tensors, got bool; use cast()", None),
    ("einsum", {"spec": "ij,jk->ik", "operands": (f32("B", 64), f32(128, "V"))},
     "einsum letter 'j' is 64 in f32[B, 64] but 128 in f32[128, V]", "operands"),
    ("einsum", {"spec": "ij,jk->ik", "operands": (f32("B", "K"),)},
     "einsum spec 'ij,jk->ik' names 2 operands, but 1 was given", "spec"),
    ("einsum", {"spec": "ijk,jk->ik", "operands": (f32("B", "K"), f32("K", "N"))},
     "einsum term 'ijk' has 3 letters, but operand 0 is f32[B, K] of rank 2", "operands"),
    ("einsum", {"spec": "...i,i->...", "operands": (f32("B", "K"), f32("K"))},
     "einsum spec '...i,i->...' has '.' where a letter belongs", "spec"),
    ("einsum", {"spec": "i1,i->i", "operands": (f32("B", "K"), f32("K"))},
     "has '1' where a letter belongs", "spec"),
    ("einsum", {"spec": "ij->ii", "operands": (f32("B", "K"),)},
     "einsum output 'ii' must name input letters once each, but has 'i'", "spec"),
    ("einsum", {"spec": "ij->z", "operands": (f32("B", "K"),)},
     "einsum output 'z' must name input letters once each, but has 'z'", "spec"),
    ("einsum", {"spec": "i->i->i", "operands": (f32("B"),)},
     "einsum spec 'i->i->i' has more than one '->'", "spec"),
    ("einsum", {"spec": "ii->i", "operands": (f32(3, 4),)},
     "einsum letter 'i' is 3 in f32[3, 4] but 4 in f32[3, 4]", "operands"),
    # construction
    ("zeros", {"shape": (B, Dim.const(-1))}, "shape [B, -1] has a negative dimension", "shape"),
    ("full", {"shape": (B,), "value": 0.5, "dtype": "i32"}, "the value 0.5 cannot become i32",
     "value"),
    ("arange", {"start": T, "step": 0}, "arange's step cannot be zero", "step"),
    ("arange", {"start": T, "dtype": "bool"}, "arange makes numbers, not bool", "dtype"),
    ("eye", {"n": Dim.const(2), "m": Dim.const(-1)}, "shape [-1] has a negative dimension", "m"),
    # randomness
    ("key", {"seed": -1}, "a seed is an integer in [0, 2**64), got -1", "seed"),
    ("key_split", {"k": KeyType(), "n": Dim.const(0)}, "split makes at least 1 key, got n = 0",
     "n"),
    ("fold_in", {"k": KeyType(), "i": f32()}, "fold_in needs an integer scalar, got f32", "i"),
    ("fold_in", {"k": KeyType(), "i": i32("B")}, "fold_in needs an integer scalar, got i32[B]",
     "i"),
    ("uniform", {"k": KeyType(), "shape": (B,), "dtype": "i32"}, "uniform draws floats, not i32",
     "dtype"),
    ("normal", {"k": KeyType(), "shape": (Dim.const(-2),)},
     "shape [-2] has a negative dimension", "shape"),
    ("bernoulli", {"k": KeyType(), "p": f32("B"), "shape": (B,)},
     "bernoulli needs a float scalar probability, got f32[B]", "p"),
    ("bernoulli", {"k": KeyType(), "p": tensor("bool"), "shape": (B,)},
     "bernoulli needs a float scalar probability, got bool[]", "p"),
]


@pytest.mark.parametrize("name, args, message, arg", ERRORS,
                         ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_error_messages(name: str, args: dict[str, Any], message: str, arg: str | None) -> None:
    with pytest.raises(OpError) as info:
        infer(name, **args)
    assert message in info.value.message
    assert info.value.arg == arg
    if arg is not None:
        assert arg in {p.name for p in REGISTRY[name].params}


def test_evaluate_applies_the_rule() -> None:
    with pytest.raises(OpError, match="cannot mix"):
        REGISTRY["add"].evaluate(a=normal(3), b=ints(3))
    with pytest.raises(OpError, match="float literal"):
        REGISTRY["mul"].evaluate(a=ints(3), b=0.5)


def test_pad_of_a_scalar_is_the_scalar() -> None:
    """No axes, no widths: what NumPy's pad refuses (it wants integer pairs) is a copy."""
    check_against_numpy("pad", {"x": np.float32(2.5), "widths": ()}, np.float32(2.5))
