"""ir/printer.py: `to_text` is deterministic and numbers values in order; `to_bend` writes every
printable primitive (and scans, checkpoints, gradients) as .bend source that the checker accepts
and that, run through `dsl.loads`, computes the interpreter's results bit for bit."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from frontend.check import check_file
from ir import interp, ops, printer
from ir.ad import grad_function
from ir.core import Builder, Function, Op, Value, tensor_type
from ir.ops import SliceSpec
from ir.ops.base import NUMPY_DTYPES, Kind, Param, Primitive, Role
from ir.ops.control import Checkpoint, Scan
from ir.types import KeyType, TensorType

try:
    import dsl
    LOADS = getattr(dsl, "loads", None)
except ImportError:                               # the Python API is not there yet
    LOADS = None
needs_loads = pytest.mark.skipif(LOADS is None, reason="dsl.loads (the lowering API) is not "
                                 "available, so printed programs cannot be run")

DTYPE_NAMES = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}
NAN, INF = float("nan"), float("inf")
rng = np.random.default_rng(1234)


class KeyArg:
    """A random key argument: its two 32-bit words."""

    def __init__(self, seed: int):
        self.words = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)


def floats(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def positive(*shape: int) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape).astype(np.float32)


def ints(*shape: int, low: int = -5, high: int = 6, dtype: Any = np.int32) -> np.ndarray:
    return rng.integers(low, high, shape).astype(dtype)


def bools(*shape: int) -> np.ndarray:
    return rng.integers(0, 2, shape).astype(bool)


SPECIAL = np.array([[0.0, -0.0, INF], [-INF, NAN, 1.5]], dtype=np.float32)


# ---------------------------------------------------------------- building programs

def program(build: Callable[..., Any], *args: Any) -> tuple[Function, list]:
    """The function build(b, *params) of parameters shaped like args, and the args."""
    b = Builder("f")
    params = [b.param(KeyType() if isinstance(a, KeyArg) else
                      tensor_type(DTYPE_NAMES[a.dtype], a.shape)) for a in args]
    out = build(b, *params)
    return b.finish(list(out) if isinstance(out, (tuple, list)) else [out]), list(args)


def prim(name: str, *args: Any, **static: Any) -> Callable[[], tuple[Function, list]]:
    """One primitive applied to parameters shaped like args."""
    return lambda: program(lambda b, *ps: b.emit(name, *ps, **static), *args)


def built(build: Callable[..., Any], *args: Any) -> Callable[[], tuple[Function, list]]:
    return lambda: program(build, *args)


def const(value: Any, dtype: str) -> Callable[[], tuple[Function, list]]:
    return built(lambda b: b.constant(value, dtype))


def scan(b: Builder, body: Function, inputs: list[Value], n_state: int, n_xs: int,
         length: int, reverse: bool = False) -> tuple[Value, ...]:
    outputs = tuple(Value(v.type) for v in body.results[:n_state]) + tuple(
        Value(tensor_type(v.dtype, (length, *v.shape))) for v in body.results[n_state:])
    attrs = {"n_state": n_state, "n_xs": n_xs, "length": length, "reverse": reverse}
    b.add(Op(Scan(), tuple(inputs), tuple(sorted(attrs.items())), outputs, body))
    return outputs


def function(name: str, types: list[TensorType], build: Callable[..., Any]) -> Function:
    b = Builder(name)
    params = [b.param(t) for t in types]
    out = build(b, *params)
    return b.finish(list(out) if isinstance(out, (tuple, list)) else [out])


F3 = tensor_type("f32", (3,))
F2_3 = tensor_type("f32", (2, 3))


def rnn(reverse: bool = False):
    """h = tanh(h * w + x), emitting h: one state, one emit, one captured value."""
    body = function("rnn", [F3, F3, F3],
                    lambda b, h, x, w: [b.emit("tanh", b.emit("add", b.emit("mul", h, w), x))] * 2)
    return built(lambda b, h0, xs, w: scan(b, body, [h0, xs, w], 1, 1, 4, reverse),
                 floats(3), floats(4, 3), floats(3))


def two_states_two_emits(reverse: bool = False):
    """(s, c) -> (c, s + c) (the states swap), emitting s * x and the incoming c."""
    body = function("fib", [F3, F3, F3], lambda b, s, c, x: [c, b.emit("add", s, c),
                                                             b.emit("mul", s, x), c])
    return built(lambda b, s, c, xs: scan(b, body, [s, c, xs], 2, 1, 5, reverse),
                 floats(3), floats(3), floats(5, 3))


def two_sequences(reverse: bool = False):
    """Two scanned sequences of different shapes and dtypes and a state."""
    i3 = tensor_type("i32", (3,))
    body = function("mix", [F3, F2_3, i3],
                    lambda b, h, x, k: [b.emit("add", h, b.emit("sum", x, axis=0)),
                                        b.emit("mul", b.emit("cast", k, dtype="f32"), h)])
    return built(lambda b, h0, xs, ks: scan(b, body, [h0, xs, ks], 1, 2, 4, reverse),
                 floats(3), floats(4, 2, 3), ints(4, 3))


def no_sequence(reverse: bool = False):
    """A loop of fixed length over nothing: h = h * 2 six times, emitting h."""
    body = function("double", [F3], lambda b, h: [b.emit("add", h, h), h])
    return built(lambda b, h0: scan(b, body, [h0], 1, 0, 6, reverse), floats(3))


def zero_length(reverse: bool = False):
    body = function("empty", [F3, F3], lambda b, h, x: [b.emit("add", h, x), b.emit("neg", x)])
    return built(lambda b, h0, xs: scan(b, body, [h0, xs], 1, 1, 0, reverse), floats(3), floats(0, 3))


def zero_length_two_sequences(reverse: bool = False):
    body = function("empty", [F3, F3, F2_3], lambda b, h, x, y: [b.emit("add", h, x), y])
    return built(lambda b, h0, xs, ys: scan(b, body, [h0, xs, ys], 1, 2, 0, reverse),
                 floats(3), floats(0, 3), floats(0, 2, 3))


def stateless():
    """n_state = 0: a map over the leading axis."""
    body = function("map", [F3], lambda b, x: [b.emit("exp", x)])
    return built(lambda b, xs: scan(b, body, [xs], 0, 1, 4, True), floats(4, 3))


def nested():
    """A scan whose body scans, capturing the outer step's element."""
    inner = function("inner", [F3, F3, F3],
                     lambda b, h, y, x: [b.emit("add", b.emit("mul", h, x), y)])
    outer = function("outer", [F3, F2_3],
                     lambda b, h, ys: [scan(b, inner, [h, ys, h], 1, 1, 2)[0]] * 2)
    return built(lambda b, h0, yss: scan(b, outer, [h0, yss], 1, 1, 3),
                 floats(3), floats(3, 2, 3))


def checkpointed(n_out: int):
    """checkpoint of (x, w) -> tanh(x @ w) [and its sum], w passed as a captured value."""
    def build(b: Builder, x: Value, w: Value):
        body = function("block", [x.type, w.type], lambda bb, x_, w_: [
            y := bb.emit("tanh", bb.emit("matmul", x_, w_)), bb.emit("sum", y)][:n_out])
        outputs = tuple(Value(v.type) for v in body.results)
        b.add(Op(Checkpoint(), (x, w), (), outputs, body))
        return list(outputs)
    return built(build, floats(2, 3), floats(3, 4))


def randomness(b: Builder, k: Value, step: Value):
    k0 = b.emit("key", seed=2 ** 40 + 7)
    k1, k2, k3 = b.emit("key_split", k, n=3)
    (k4,) = b.emit("key_split", k0, n=1)
    k5 = b.emit("fold_in", k1, step)
    p = b.constant(0.25, "f32")
    return [b.emit("uniform", k2, shape=(2, 3), low=-1.0, high=3.0),
            b.emit("uniform", k3, shape=(4,), dtype="f64"),
            b.emit("normal", k5, shape=(3, 3)),
            b.emit("normal", k4, shape=(5,), dtype="f64"),
            b.emit("bernoulli", k2, p, shape=(2, 2)),
            b.emit("key_split", k4)[1]]


def unindex(shape: tuple[int, ...], items: tuple):
    def build(b: Builder, x: Value):
        return b.emit("unindex", x, items=items, shape=shape)
    selected = np.zeros(shape)[tuple(slice(i.lo, i.hi, i.step) if isinstance(i, SliceSpec) else i
                                     for i in items)]
    return built(build, floats(*selected.shape))


S = SliceSpec
CASES = {
    # elementwise: every unary primitive, on inputs where it is defined
    **{f"unary_{p}": prim(p, floats(2, 3)) for p in ("exp", "exp2", "tanh", "sigmoid", "sin",
                                                     "cos", "floor", "abs", "sign", "neg")},
    **{f"unary_{p}": prim(p, positive(2, 3)) for p in ("log", "log2", "sqrt", "rsqrt")},
    **{f"unary_{p}": prim(p, floats(2, 3)) for p in ("tan", "atan", "sinh", "cosh", "expm1", "erf",
                                                     "erfc", "ceil", "trunc", "round", "isnan",
                                                     "isinf", "isfinite")},
    **{f"unary_{p}": prim(p, positive(2, 3) / 2.5) for p in ("asin", "acos", "log1p")},
    "binary_atan2": prim("atan2", floats(2, 3), floats(3)),
    "clip": prim("clip", floats(2, 3), floats(3) - 1, floats(2, 1) + 1),
    "unary_int_abs": prim("abs", ints(4)),
    "tanh_grad": prim("tanh_grad", np.tanh(floats(2, 3)), floats(2, 3)),
    "sigmoid_grad": prim("sigmoid_grad", positive(2, 3) / 2.5, floats(2, 3)),
    "unary_int_neg": prim("neg", ints(4)),
    "unary_int_sign": prim("sign", ints(4)),
    "unary_special_values": prim("exp", SPECIAL),
    # every binary operator and binary function, broadcasting
    **{f"binary_{p}": prim(p, floats(2, 3), floats(3)) for p in (
        "add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge")},
    "binary_pow": prim("pow", positive(2, 3), floats(3)),
    "binary_mod": prim("mod", floats(2, 3), positive(3)),
    "binary_special": prim("maximum", SPECIAL, SPECIAL[::-1].copy()),
    **{f"binary_int_{p}": prim(p, ints(2, 3), ints(3, low=1)) for p in (
        "add", "sub", "mul", "mod", "floordiv", "pow", "eq", "lt")},
    "binary_f64_floordiv": prim("floordiv", floats(4, dtype=np.float64), positive(4).astype(np.float64)),
    **{f"binary_bool_{p}": prim(p, bools(2, 3), bools(2, 3)) for p in ("and", "or", "xor", "eq")},
    **{f"binary_int_{p}": prim(p, ints(2, 3), ints(2, 3)) for p in ("and", "or", "xor")},
    **{f"binary_int_{p}": prim(p, ints(2, 3), ints(2, 3, low=0, high=4)) for p in ("shl", "shr")},
    "where": prim("where", bools(2, 3), floats(2, 3), floats(3)),
    "cast_f64": prim("cast", floats(2, 3), dtype="f64"),
    "cast_i32": prim("cast", floats(2, 3) * 4, dtype="i32"),
    "cast_bool": prim("cast", ints(5), dtype="bool"),
    "cast_f16": prim("cast", floats(5, dtype=np.float64), dtype="f16"),
    # reductions
    "sum_all": prim("sum", floats(2, 3, 4)),
    "sum_axes_keepdims": prim("sum", floats(2, 3, 4), axis=(0, 2), keepdims=True),
    "sum_int": prim("sum", ints(2, 3), axis=-1),
    "mean": prim("mean", floats(2, 3), axis=1),
    "max": prim("max", floats(2, 3), axis=0, keepdims=True),
    "min": prim("min", floats(2, 3)),
    "argmax": prim("argmax", floats(2, 3), axis=1),
    "argmax_flat": prim("argmax", floats(2, 3)),
    "argmin": prim("argmin", floats(2, 3), axis=0, keepdims=True),
    "prod": prim("prod", floats(2, 3), axis=-1),
    "prod_int": prim("prod", ints(2, 3), axis=(0, 1), keepdims=True),
    "any": prim("any", floats(2, 3), axis=0),
    "all": prim("all", ints(2, 3)),
    "var_std": built(lambda b, x: [b.emit("var", x, axis=1, correction=1), b.emit("std", x)],
                     floats(2, 3)),
    # scans
    "cumsum": prim("cumsum", floats(2, 3), axis=1),
    "cumsum_int": prim("cumsum", ints(4), axis=0),
    "cumprod": prim("cumprod", floats(2, 3), axis=-2),
    "logcumsumexp": prim("logcumsumexp", floats(3, 2), axis=0),
    # shapes
    "reshape": prim("reshape", floats(2, 3), shape=(3, 2)),
    "transpose_default": prim("transpose", floats(2, 3, 4)),
    "transpose_perm": prim("transpose", floats(2, 3, 4), perm=(1, 2, 0)),
    "broadcast_to": prim("broadcast_to", floats(3, 1), shape=(2, 3, 4)),
    "expand_dims": prim("expand_dims", floats(2, 3), axis=1),
    "expand_dims_tuple": prim("expand_dims", floats(2, 3), axis=(0, 3)),
    "squeeze_all": prim("squeeze", floats(1, 3, 1)),
    "squeeze_axis": prim("squeeze", floats(1, 3, 1), axis=(2,)),
    "concat": prim("concat", floats(2, 3), floats(2, 1), axis=1),
    "stack": prim("stack", floats(2, 3), floats(2, 3), floats(2, 3), axis=-1),
    "split_even": prim("split", floats(4, 3), sections=2),
    "split_sizes": prim("split", floats(2, 6), sections=(1, 2, 3), axis=1),
    "split_one": prim("split", floats(2, 3), sections=1, axis=1),
    "slice": prim("slice", floats(5, 4), start=1),
    "slice_all_params": prim("slice", floats(5, 6), start=5, stop=0, axis=1, step=-2),
    "pad": prim("pad", floats(2, 3), widths=(1, 0, 0, 2)),
    "pad_value": prim("pad", floats(2, 3), widths=(0, 1, 2, 0), value=-0.0),
    "pad_int": prim("pad", ints(3), widths=(2, 1), value=7),
    "flip_all": prim("flip", floats(2, 3)),
    "flip_axis": prim("flip", floats(2, 3), axis=1),
    "tril": prim("tril", floats(3, 4)),
    "triu_k": prim("triu", floats(2, 3, 4), k=-1),
    # indexing
    "index_ints": prim("index", floats(3, 4), items=(1, -1)),
    "index_slices": prim("index", floats(5, 6), items=(S(1, 4), S(None, None, 2))),
    "index_negative_step": prim("index", floats(5, 6), items=(S(None, None, -1), S(-2, 0, -1))),
    "index_ellipsis": prim("index", floats(2, 3, 4), items=(Ellipsis, 2)),
    "index_mixed": prim("index", floats(2, 3, 4, 5), items=(1, Ellipsis, S(0, 4, 3))),
    "index_nothing": prim("index", floats(2, 3), items=()),
    "index_empty_slice": prim("index", floats(2, 3), items=(S(2, 1),)),
    "take": prim("take", floats(5, 3), ints(2, 4, low=0, high=5)),
    "take_axis": prim("take", floats(2, 5), ints(3, low=-5, high=5), axis=1),
    "take_scalar_index": built(lambda b, x: b.emit("take", x, b.constant(2, "i32")), floats(4, 3)),
    "one_hot": prim("one_hot", ints(2, 3, low=0, high=4), n=4),
    "one_hot_dtype": prim("one_hot", ints(3, low=0, high=4), n=5, dtype="i64"),
    "scatter_add": prim("scatter_add", floats(4, 3), ints(5, low=0, high=4), floats(5, 3)),
    "scatter_add_axis": prim("scatter_add", floats(2, 4), ints(3, low=0, high=4), floats(2, 3), axis=1),
    # ordering and selection
    "sort": prim("sort", SPECIAL),
    "sort_descending": prim("sort", ints(3, 4), axis=0, descending=True),
    "argsort": prim("argsort", SPECIAL, descending=True),
    "topk": prim("topk", floats(2, 5), k=3),
    "topk_smallest": prim("topk", SPECIAL, k=2, axis=0, largest=False),
    "take_along_axis": prim("take_along_axis", floats(2, 5), ints(1, 3, low=-5, high=5), axis=1),
    "unindex_ints": unindex((3, 4), (1, -1)),
    "unindex_slices": unindex((5, 6), (S(1, 4), S(None, None, 2))),
    "unindex_negative_step": unindex((5, 6), (S(None, None, -1), S(-2, 0, -2))),
    "unindex_ellipsis": unindex((2, 3, 4), (Ellipsis, 2)),
    "unindex_mixed": unindex((2, 3, 4, 5), (1, Ellipsis, S(0, 4, 3))),
    "unindex_whole": unindex((2, 3), ()),
    "unindex_empty": unindex((2, 3), (S(2, 1),)),
    # contractions
    "matmul": prim("matmul", floats(2, 3), floats(3, 4)),
    "matmul_batched": prim("matmul", floats(2, 1, 2, 3), floats(5, 3, 4)),
    "matmul_vector": prim("matmul", floats(3), floats(2, 3, 4)),
    "matmul_int": prim("matmul", ints(2, 3), ints(3)),
    "einsum": prim("einsum", floats(2, 3), floats(3, 4), floats(4), spec="ij,jk,k->ik"),
    "einsum_implicit": prim("einsum", floats(3, 3), spec="ii"),
    # construction
    "zeros": prim("zeros", shape=(2, 3)),
    "zeros_i64": prim("zeros", shape=(4,), dtype="i64"),
    "ones_bool": prim("ones", shape=(2,), dtype="bool"),
    "full": prim("full", shape=(2, 2), value=-0.0, dtype="f64"),
    "full_int": prim("full", shape=(3,), value=-7, dtype="i32"),
    "full_inf": prim("full", shape=(), value=-INF),
    "arange": prim("arange", start=5),
    "arange_all": prim("arange", start=2, stop=-7, step=-3, dtype="f32"),
    "eye": prim("eye", n=3),
    "eye_rect": prim("eye", n=2, m=4, dtype="i32"),
    # constants of every dtype, scalars and arrays, with the floats' special values
    **{f"constant_{d}": const(((1.5, -2.0, 0.1), (1e-8, 3.0, 65504.0)), d) for d in ("f32", "f64", "f16")},
    **{f"constant_special_{d}": const((0.0, -0.0, INF, -INF, NAN, -NAN), d) for d in ("f32", "f64", "f16")},
    **{f"constant_scalar_{d}": const(v, d) for d, v in (("f32", 0.1), ("f64", 0.1), ("f16", 0.1),
                                                        ("i32", -3), ("i64", -2 ** 40), ("u32", 2 ** 32 - 1),
                                                        ("bool", True))},
    **{f"constant_scalar_{n}": const(v, "f32") for n, v in (("nan", NAN), ("minus_nan", -NAN),
                                                            ("inf", INF), ("minus_zero", -0.0))},
    "constant_int_in_float": const((1, 2, 16777217), "f32"),
    "constant_i32": const(((1, -2), (3, 2 ** 31 - 1)), "i32"),
    "constant_i64": const((2 ** 62, -1, 0), "i64"),
    "constant_u32": const((4000000000, 0, 1), "u32"),
    "constant_bool": const(((True, False), (False, False)), "bool"),
    "constant_uniform": const(((2.5, 2.5), (2.5, 2.5)), "f64"),
    "constant_empty": const(((), ()), "f32"),
    # randomness, keys in and out
    "random": built(randomness, KeyArg(3), np.array(11, dtype=np.int32)),
    "stop_gradient": prim("stop_gradient", floats(2, 3)),
    "debug": prim("debug", floats(2, 3), label="x"),
    "assert_finite": prim("assert_finite", floats(2, 3), label="x"),
    # scans and checkpoints
    "scan_rnn": rnn(),
    "scan_rnn_reverse": rnn(reverse=True),
    "scan_two_states_two_emits": two_states_two_emits(),
    "scan_two_states_two_emits_reverse": two_states_two_emits(reverse=True),
    "scan_two_sequences": two_sequences(),
    "scan_two_sequences_reverse": two_sequences(reverse=True),
    "scan_no_sequence": no_sequence(),
    "scan_no_sequence_reverse": no_sequence(reverse=True),
    "scan_zero_length": zero_length(),
    "scan_zero_length_reverse": zero_length(reverse=True),
    "scan_zero_length_two_sequences": zero_length_two_sequences(),
    "scan_zero_length_two_sequences_reverse": zero_length_two_sequences(reverse=True),
    "scan_stateless_reverse": stateless(),
    "scan_nested": nested(),
    "checkpoint_one_result": checkpointed(1),
    "checkpoint_two_results": checkpointed(2),
}


# ---------------------------------------------------------------- running printed programs

def interp_args(args: list) -> list[np.ndarray]:
    return [a.words if isinstance(a, KeyArg) else a for a in args]


def run_printed(text: str, name: str, args: list) -> list:
    """The printed program's entry called through the Python API, its results as a list."""
    prog = LOADS(text, name="printed.bend")
    out = getattr(prog, name)(*[dsl.Key(a.words) if isinstance(a, KeyArg) else a for a in args])
    return list(out) if isinstance(out, tuple) else [out]


def assert_same_bits(got: list, want: list) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        g = g.words if isinstance(g, dsl.Key) else np.asarray(g)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"result {i}"
        assert g.tobytes() == w.tobytes(), f"result {i}: {g} != {w}"


def primitives_in(fn: Function) -> set[str]:
    return {p for op in fn.ops for p in {op.primitive.name} | (primitives_in(op.body) if op.body else set())}


# ---------------------------------------------------------------- to_bend: checks and runs

@pytest.mark.parametrize("case", list(CASES))
def test_printed_program_checks(case):
    fn, _ = CASES[case]()
    check_file("printed.bend", printer.to_bend(fn, "f"))


@needs_loads
@pytest.mark.parametrize("case", list(CASES))
def test_printed_program_computes_the_same_bits(case):
    fn, args = CASES[case]()
    text = printer.to_bend(fn, "f")
    assert_same_bits(run_printed(text, "f", args), interp.run(fn, interp_args(args)))


def test_bf16_constants_print_and_check():
    fn, _ = program(lambda b: [b.constant((1.5, 0.1), "bf16"), b.constant(-INF, "bf16")])
    text = printer.to_bend(fn, "f")
    assert "ones([2], dtype=bf16) * [1.5, 0.1]" in text
    check_file("printed.bend", text)


def test_every_printable_primitive_is_exercised():
    used = set().union(*(primitives_in(make()[0]) for make in CASES.values()))
    # (a composite is never in the IR: its parts are)
    missing = {name for name, p in ops.REGISTRY.items()
               if printer.printable(name) and p.role is not Role.COMPOSITE} - used
    assert not missing, f"add cases to tests/ir/test_printer.py for {sorted(missing)}"


def test_every_primitive_is_printable_or_listed_as_unprintable():
    for name in ops.REGISTRY:
        assert printer.printable(name) != (name in printer.UNPRINTABLE), (
            f"'{name}' needs a spelling in ir/printer.py, or an entry in printer.UNPRINTABLE "
            "saying why it has none")


class Mystery(Primitive):
    """An IR-only primitive with no spelling."""
    name = "mystery"
    params = (Param("x", Kind.TENSOR),)

    def infer(self, x: TensorType) -> TensorType:
        return x


def test_a_primitive_without_spelling_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(ops.REGISTRY, "mystery", Mystery())
    fn, _ = prim("mystery", floats(2))()
    assert not printer.printable("mystery")
    with pytest.raises(ValueError, match="'mystery' has no .bend spelling"):
        printer.to_bend(fn, "f")
    assert "mystery(%0)" in printer.to_text(fn)


def test_a_nan_with_a_payload_is_refused():
    payload = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)[0]
    fn, _ = const((float(payload), 1.0), "f32")()
    with pytest.raises(ValueError, match="NaN with payload"):
        printer.to_bend(fn, "f")


# ---------------------------------------------------------------- to_bend: spellings

def bend_of(make: Callable[[], tuple[Function, list]]) -> str:
    return printer.to_bend(make()[0], "f")


@pytest.mark.parametrize("case, line", [
    ("binary_add", "add_2 = a0 + a1"),
    ("binary_int_floordiv", "floordiv_2 = a0 // a1"),
    ("binary_bool_xor", "xor_2 = a0 ^ a1"),
    ("binary_int_shl", "shl_2 = a0 << a1"),
    ("unary_neg", "neg_1 = -a0"),
    ("matmul", "matmul_2 = a0 @ a1"),
    ("sum_axes_keepdims", "sum_1 = sum(a0, axis=(0, 2), keepdims=True)"),
    ("squeeze_axis", "squeeze_1 = squeeze(a0, axis=(2,))"),
    ("cast_f64", "cast_1 = cast(a0, f64)"),
    ("split_one", "split_1, = split(a0, 1, axis=1)"),
    ("split_sizes", "split_1, split_2, split_3 = split(a0, [1, 2, 3], axis=1)"),
    ("slice_all_params", "slice_1 = slice(a0, 5, stop=0, axis=1, step=-2)"),
    ("pad_value", "pad_1 = pad(a0, [0, 1, 2, 0], value=-0.0)"),
    ("topk_smallest", "topk_1, topk_2 = topk(a0, 2, axis=0, largest=False)"),
    ("concat", "concat_2 = concat([a0, a1], axis=1)"),
    ("einsum", 'einsum_3 = einsum("ij,jk,k->ik", a0, a1, a2)'),
    ("index_mixed", "index_1 = a0[1, ..., 0:4:3]"),
    ("index_negative_step", "index_1 = a0[::-1, -2:0:-1]"),
    ("index_nothing", "index_1 = a0[...]"),
    ("arange_all", "arange_0 = arange(2, stop=-7, step=-3, dtype=f32)"),
    ("constant_scalar_f64", "constant_0 = full([], 0.1, dtype=f64)"),
    ("constant_scalar_bool", "constant_0 = full([], 1, dtype=bool)"),
    ("constant_scalar_nan", "constant_0 = full([], abs(1e999 - 1e999), dtype=f32)"),
    ("constant_scalar_minus_nan", "constant_0 = full([], -abs(1e999 - 1e999), dtype=f32)"),
    ("constant_scalar_minus_zero", "constant_0 = full([], -0.0, dtype=f32)"),
    ("constant_special_f64", "constant_0 = ones([6], dtype=f64) * [0.0, -0.0, 1e999, -1e999, "
                             "abs(1e999 - 1e999), -abs(1e999 - 1e999)]"),
    ("constant_bool", "constant_0 = cast([[1, 0], [0, 0]], bool)"),
    ("constant_uniform", "constant_0 = full([2, 2], 2.5, dtype=f64)"),
    ("constant_empty", "constant_0 = zeros([2, 0], dtype=f32)"),
    ("random", "key_split_3, key_split_4, key_split_5 = split(a0, n=3)"),
    ("random", "key_2 = key(1099511627783)"),
    ("random", "fold_in_7 = fold_in(key_split_3, a1)"),
    ("random", "uniform_9 = uniform(key_split_4, [2, 3], low=-1.0, high=3.0)"),
    ("random", "bernoulli_13 = bernoulli(key_split_4, constant_8, [2, 2])"),
])
def test_spelling(case, line):
    assert line in [text.strip() for text in bend_of(CASES[case]).splitlines()]


def test_scan_is_a_fold():
    assert bend_of(rnn()) == (
        "def f(a0: f32[3], a1: f32[4, 3], a2: f32[3]) -> (f32[3], f32[4, 3]):\n"
        "  ys_4 = fold x_6 in a1 with carry_3 = a0:\n"
        "    mul_8 = carry_3 * a2\n"
        "    add_9 = mul_8 + x_6\n"
        "    tanh_10 = tanh(add_9)\n"
        "    carry_3 = tanh_10\n"
        "    return tanh_10\n"
        "  return (carry_3, ys_4)\n")


def test_reversed_scan_folds_over_flipped_sequences_and_flips_the_emits_back():
    text = bend_of(rnn(reverse=True))
    assert "  reversed_4 = fold x_6 in flip(a1, axis=0) with carry_3 = a0:\n" in text
    assert "  ys_4 = flip(reversed_4, axis=0)\n" in text


def test_scan_over_two_sequences_folds_over_the_step_index():
    text = bend_of(two_sequences(reverse=True))
    assert "fold step_3 in arange(3, -1, step=-1) with carry_3 = a0:" in text
    assert "x_6 = a1[step_3]" in text and "x_7 = a2[step_3]" in text


def test_an_emitted_incoming_state_is_copied_before_the_state_changes():
    text = bend_of(two_states_two_emits())
    assert ("    incoming_carry_4 = carry_4\n"
            "    carry_3, carry_4 = carry_4, add_10\n"
            "    return (mul_11, incoming_carry_4)\n") in text


def test_checkpoint_is_a_local_def():
    text = bend_of(checkpointed(2))
    assert "  def checkpointed_2(arg_4, arg_5):\n" in text
    assert "  checkpoint_2, checkpoint_3 = checkpoint(checkpointed_2)(a0, a1)\n" in text


# ---------------------------------------------------------------- to_bend: names, signature

def test_generated_names_avoid_the_names_of_the_signature():
    fn, args = prim("add", floats(2), floats(2))()
    text = printer.to_bend(fn, "f", signature="add_2: f32[2], ys: (f32[2],)",
                           bindings=["add_2", "ys[0]"])
    assert text == ("def f(add_2: f32[2], ys: (f32[2],)) -> f32[2]:\n"
                    "  ys_0 = ys[0]\n"
                    "  add_2_ = add_2 + ys_0\n"
                    "  return add_2_\n")
    check_file("printed.bend", text)


def test_reserved_names_hold_keywords_primitives_and_builtins():
    assert {"fold", "with", "split", "sum", "grad", "checkpoint", "f32", "Key"} <= printer.reserved_names()


def test_signature_bindings_result_and_returns():
    fn, args = prim("sub", floats(2, 3), floats(3))()
    text = printer.to_bend(fn, "g", signature="p: P, x: f32[3]", bindings=["p.W", "x"],
                           result="P {{ W: {0} }}", returns="P")
    assert text == ("def g(p: P, x: f32[3]) -> P:\n"
                    "  p_W = p.W\n"
                    "  sub_2 = p_W - x\n"
                    "  return P { W: sub_2 }\n")
    check_file("printed.bend", "object P { W: f32[2, 3] }\n\n" + text)


def test_bad_arguments_are_refused():
    fn, _ = prim("exp", floats(2))()
    for kwargs in ({"name": "fold"}, {"name": "f", "signature": "x: f32[2]"},
                   {"name": "f", "signature": "x: f32[2]", "bindings": ["x", "y"]}):
        with pytest.raises(ValueError):
            printer.to_bend(fn, **kwargs)


def test_no_results():
    fn, _ = program(lambda b, x: [], floats(2))
    text = printer.to_bend(fn, "f")
    assert text == "def f(a0: f32[2]) -> ():\n  return ()\n"
    check_file("printed.bend", text)


# ---------------------------------------------------------------- gradients

OBJECT = "object Params { W1: f32[3, 4], b1: f32[4], W2: f32[4, 2] }\n\n"


def mlp() -> Function:
    """loss(W1, b1, W2, x, y) = mean((tanh(x @ W1 + b1) @ W2)[:, 0] - y) ** 2)."""
    def build(b: Builder, w1, b1, w2, x, y):
        h = b.emit("tanh", b.emit("add", b.emit("matmul", x, w1), b1))
        out = b.emit("index", b.emit("matmul", h, w2), items=(S(), 0))
        d = b.emit("sub", out, y)
        return b.emit("mean", b.emit("mul", d, d))
    return program(build, floats(3, 4), floats(4), floats(4, 2), floats(5, 3), floats(5))[0]


def mlp_args() -> list[np.ndarray]:
    r = np.random.default_rng(5)
    return [r.standard_normal(s).astype(np.float32) for s in ((3, 4), (4,), (4, 2), (5, 3), (5,))]


def test_gradient_prints_checks_and_computes_the_same_bits():
    g = grad_function(mlp(), [0, 1, 2])
    text = OBJECT + printer.to_bend(
        g, "loss_grad", signature="p: Params, x: f32[5, 3], y: f32[5]",
        bindings=["p.W1", "p.b1", "p.W2", "x", "y"],
        result="Params {{ W1: {0}, b1: {1}, W2: {2} }}", returns="Params")
    check_file("printed.bend", text)
    if LOADS is None:
        pytest.skip("dsl.loads is not available")
    args = mlp_args()
    got = LOADS(text, name="printed.bend").loss_grad(
        {"W1": args[0], "b1": args[1], "W2": args[2]}, args[3], args[4])
    assert_same_bits([got["W1"], got["b1"], got["W2"]], interp.run(g, args))


def scan_and_checkpoint_model() -> tuple[Function, list]:
    """sum of an RNN's emits, reversed and not, through a checkpointed read-out."""
    def build(b: Builder, h0, xs, w):
        total = []
        for reverse in (False, True):
            body = function("rnn", [F3, F3, F3], lambda bb, h, x, w_: [
                bb.emit("tanh", bb.emit("add", bb.emit("mul", h, w_), x))] * 2)
            h, hs = scan(b, body, [h0, xs, w], 1, 1, 4, reverse)
            readout = function("readout", [hs.type], lambda bb, v: [bb.emit("sum", bb.emit("sin", v))])
            (r,) = outputs = (Value(readout.results[0].type),)
            b.add(Op(Checkpoint(), (hs,), (), outputs, readout))
            total.append(b.emit("add", r, b.emit("sum", h)))
        return b.emit("add", *total)
    return program(build, floats(3), floats(4, 3), floats(3))


@pytest.mark.parametrize("with_value", [False, True])
def test_gradient_through_scans_and_checkpoints(with_value):
    fn, args = scan_and_checkpoint_model()
    g = grad_function(fn, [0, 1, 2], with_value=with_value)
    assert {"scan", "checkpoint"} <= primitives_in(g)
    text = printer.to_bend(g, "f")
    check_file("printed.bend", text)
    if LOADS is None:
        pytest.skip("dsl.loads is not available")
    assert_same_bits(run_printed(text, "f", args), interp.run(g, args))


# ---------------------------------------------------------------- to_text

def test_to_text_is_deterministic_and_numbers_values_in_order():
    first, second = rnn()()[0], rnn()()[0]
    assert printer.to_text(first) == printer.to_text(second) == printer.to_text(first)
    assert printer.to_text(first) == (
        "def f(%0: f32[3], %1: f32[4, 3], %2: f32[3]) -> (%3, %4):\n"
        "  %3: f32[3], %4: f32[4, 3] = scan(%0, %1, %2; length=4, n_state=1, n_xs=1, reverse=False)\n"
        "    def rnn(%5: f32[3], %6: f32[3], %7: f32[3]) -> (%10, %10):\n"
        "      %8: f32[3] = mul(%5, %7)\n"
        "      %9: f32[3] = add(%8, %6)\n"
        "      %10: f32[3] = tanh(%9)\n")


def test_to_text_shows_params_items_constants_and_several_results():
    def build(b: Builder, x, k):
        a, c = b.emit("split", x, sections=2)
        return [b.emit("sum", a, axis=(1,), keepdims=False),
                b.emit("index", c, items=(0, S(1, None, 2), Ellipsis)),
                b.constant(((1.0, -INF),), "f64"), b.emit("cast", c, dtype="i32"),
                b.emit("einsum", a, spec="ij->j"), b.emit("key_split", k, n=2)[0]]
    fn, _ = program(build, floats(4, 3), KeyArg(0))
    assert printer.to_text(fn) == (
        "def f(%0: f32[4, 3], %1: Key) -> (%4, %5, %6, %7, %8, %9):\n"
        "  %2: f32[2, 3], %3: f32[2, 3] = split(%0; sections=2)\n"
        "  %4: f32[2] = sum(%2; axis=(1,), keepdims=False)\n"
        "  %5: f32[1] = index(%3; items=(0, 1::2, ...))\n"
        "  %6: f64[1, 2] = constant(dtype=f64, value=((1.0, -inf),))\n"
        "  %7: i32[2, 3] = cast(%3; dtype=i32)\n"
        "  %8: f32[3] = einsum(%2; spec='ij->j')\n"
        "  %9: Key, %10: Key = key_split(%1; n=2)\n")


def window_steps(n: int) -> int:
    return len(printer.unindex_steps((SliceSpec(1, n - 1, 2),), (n,), "f32"))


def test_a_long_window_prints_in_linear_time():
    """unindex over 10^5 positions: finding each position in a list took 10^10 steps."""
    from conftest import isolated
    [(_, outcome, value)] = isolated(window_steps, [100_000], timeout=60)
    assert (outcome, value) == ("ok", 2)
