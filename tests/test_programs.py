"""End-to-end checks of whole model programs (tests/programs/*.bend) against PyTorch.

For each program: float32 random inputs of small shapes (seeded NumPy) go through dslc and
through a PyTorch implementation of the same math written here (torch.float32, CPU); the loss
and its gradient with respect to every float parameter must agree. Then the gradients of the
same program run at float64 are checked against float64 central finite differences at a few
entries of each parameter, and the float32 gradients against the float64 ones.

The programs write their models in helpers without annotations, which are specialised per
call site and so run at any float dtype; the float64 runs use a small driver (`F64_*` below)
that imports those helpers and declares f64 entry points.

Tolerances
----------
- dslc f32 vs torch f32: rtol 1e-5 on every entry, plus an absolute floor of 1e-6 times the
  largest magnitude of the compared tensor (at least 1e-6). The two sides round the same math
  in a different order (NumPy's pairwise sums and matmul kernels vs torch's), so each entry
  differs by a few float32 ulps (2**-23 ~ 1.2e-7) *of the terms summed into it*; an entry that
  comes out near zero from cancelling terms of the tensor's typical size can therefore differ
  by ~1e-7 to 1e-6 of that size, which a purely relative bound cannot express.
- dslc f64 vs central differences, step h = 1e-6: the truncation error is O(h² f''') ~ 1e-12
  and the rounding error ~ 1e-16 |f| / h ~ 1e-10 |f| (times a small amplification by the ops);
  rtol 1e-7 with an absolute floor of 1e-8 (1 + |loss|) leaves a wide margin for both, and is
  far below the error of any wrong derivative rule.
- dslc f32 vs dslc f64 gradients: the same bound as against torch (rtol 1e-5, floor 1e-6 of the
  largest magnitude): the f64 result is exact at that scale, so this measures the f32 program's
  own rounding, which is about half of the f32-vs-f32 difference bounded above.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:                      # run from anywhere, installed or not
    sys.path.insert(0, str(ROOT))

import dsl  # noqa: E402

PROGRAMS = ROOT / "tests" / "programs"
SEEDS = (0, 1)


# ---------------------------------------------------------------- helpers

def load(name: str) -> dsl.Program:
    return dsl.load(str(PROGRAMS / f"{name}.bend"))


def driver(source: str) -> dsl.Program:
    """A program whose imports resolve in tests/programs (the f64 entry points)."""
    return dsl.loads(textwrap.dedent(source), name=str(PROGRAMS / "f64_driver.bend"))


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def is_float(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def leaves(v, path=()):
    """(path, array) for every array of a value made of dicts (records) and arrays, with dict
    entries in the order of their keys in v."""
    if isinstance(v, dict):
        for k in v:
            yield from leaves(v[k], path + (k,))
    else:
        yield path, v


def get(v, path):
    for k in path:
        v = v[k]
    return v


def to_f64(v):
    if isinstance(v, dict):
        return {k: to_f64(x) for k, x in v.items()}
    return v.astype(np.float64) if is_float(v) else v


def to_torch(v, leaf_list: list | None = None):
    """Tensors for the arrays of v; float ones require grad and are appended to leaf_list."""
    if isinstance(v, dict):
        return {k: to_torch(x, leaf_list) for k, x in v.items()}
    t = torch.from_numpy(np.array(v))
    if is_float(v) and leaf_list is not None:
        assert t.dtype == torch.float32
        leaf_list.append(t.requires_grad_(True))
    return t


def close(actual, expected, rtol: float, floor: float, what: str) -> None:
    """|actual - expected| <= rtol |expected| + floor * max(1, max |expected|), entrywise."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    atol = floor * max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def dslc_grads(prog, entry: str, args: dict, wrt: tuple[str, ...]):
    """(loss, {(param, *field path): gradient}) from dslc's value_and_grad."""
    value, grads = prog.value_and_grad(entry, wrt=wrt)(**args)
    out = {}
    for name, g in zip(wrt, grads):
        for path, _ in leaves(args[name]):
            out[(name, *path)] = np.asarray(get(g, path))
    return np.asarray(value), out


def check_against_torch(prog, args: dict, wrt: tuple[str, ...], torch_loss, entry="loss"):
    """dslc's f32 loss and gradients vs torch_loss(**tensors) in float32."""
    value, grads = dslc_grads(prog, entry, args, wrt)
    assert value.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    tensors, torch_leaves, keys = {}, [], []
    for name, v in args.items():
        tensors[name] = to_torch(v, torch_leaves if name in wrt else None)
        if name in wrt:
            keys += [(name, *path) for path, a in leaves(v) if is_float(a)]
    expected = torch_loss(**tensors)
    assert expected.dtype == torch.float32
    expected_grads = torch.autograd.grad(expected, torch_leaves)
    close(value, expected.detach().numpy(), 1e-5, 1e-6, "loss")
    assert set(keys) == set(grads), "dslc returned gradients for other leaves"
    for k, g in zip(keys, expected_grads):
        close(grads[k], g.numpy(), 1e-5, 1e-6, f"d loss / d {'.'.join(k)}")
    return grads


def check_finite_differences(prog64, args64: dict, wrt: tuple[str, ...], grads32: dict,
                             rng: np.random.Generator, entry="loss", n=4, h=1e-6):
    """dslc's f64 gradients vs central differences at n random entries of each parameter,
    then the f32 gradients vs the f64 ones."""
    fn = getattr(prog64, entry)
    value, grads = dslc_grads(prog64, entry, args64, wrt)
    assert value.dtype == np.float64
    base = float(value)
    for key, g in grads.items():
        assert g.dtype == np.float64
        for flat in rng.choice(g.size, size=min(n, g.size), replace=False):
            idx = np.unravel_index(flat, g.shape)
            values = []
            for sign in (1.0, -1.0):
                bumped = {k: to_f64(v) for k, v in args64.items()}   # fresh copies
                leaf = get(bumped[key[0]], key[1:])
                leaf[idx] += sign * h
                values.append(float(fn(**bumped)))
            fd = (values[0] - values[1]) / (2 * h)
            assert abs(g[idx] - fd) <= 1e-7 * abs(fd) + 1e-8 * (1 + abs(base)), \
                f"d loss / d {'.'.join(key)}{list(idx)}: dslc {g[idx]!r}, central difference {fd!r}"
        close(grads32[key], g, 1e-5, 1e-6, f"f32 vs f64 d loss / d {'.'.join(key)}")


def check_hvp_against_torch(hv, p: dict, v: dict, torch_loss_of_p) -> None:
    """dslc's H v (a Params record) vs torch's double backward of torch_loss_of_p(p)."""
    assert isinstance(hv, dsl.Record)
    names = list(p)
    tp = {k: torch.from_numpy(a).requires_grad_(True) for k, a in p.items()}
    loss = torch_loss_of_p(tp)
    g = torch.autograd.grad(loss, [tp[k] for k in names], create_graph=True)
    dot = sum((gi * torch.from_numpy(v[k])).sum() for gi, k in zip(g, names))
    expected = torch.autograd.grad(dot, [tp[k] for k in names])
    for k, e in zip(names, expected):
        assert hv[k].dtype == np.float32
        # Second-order terms mix products of first-order ones of both signs (the softmax
        # Jacobian, tanh''), so entries land near zero by cancellation: the same floor as the
        # first-order checks, relative to the largest entry, covers them.
        close(hv[k], e.numpy(), 1e-5, 1e-6, f"hvp.{k}")


# ---------------------------------------------------------------- the MLP

B, D, H, C = 8, 5, 7, 4

F64_MLP = """
    from mlp import mlp_loss, grad_dot

    object Params64 { W1: f64[D, H], b1: f64[H], W2: f64[H, C], b2: f64[C] }

    def loss(p: Params64, x: f64[B, D], y: i32[B]) -> f64:
      return mlp_loss(p, x, y, B, C)

    def hvp(p: Params64, x: f64[B, D], y: i32[B], v: Params64) -> Params64:
      return grad(grad_dot, wrt=p)(p, x, y, v, B, C)
"""


@pytest.fixture(scope="module")
def mlp():
    return load("mlp")


@pytest.fixture(scope="module")
def mlp64():
    return driver(F64_MLP)


def mlp_params(rng):
    return {"W1": randn(rng, D, H, scale=0.5), "b1": randn(rng, H, scale=0.1),
            "W2": randn(rng, H, C, scale=0.5), "b2": randn(rng, C, scale=0.1)}


def mlp_inputs(seed):
    rng = np.random.default_rng(seed)
    return {"p": mlp_params(rng), "x": randn(rng, B, D),
            "y": rng.integers(0, C, size=B).astype(np.int32)}


def torch_mlp(p, x, y):
    h = torch.tanh(x @ p["W1"] + p["b1"])
    s = h @ p["W2"] + p["b2"]
    return torch.nn.functional.cross_entropy(s, y.long())


@pytest.mark.parametrize("seed", SEEDS)
def test_mlp_matches_torch(mlp, seed):
    args = mlp_inputs(seed)
    check_against_torch(mlp, args, ("p", "x"), torch_mlp)


@pytest.mark.parametrize("seed", SEEDS)
def test_mlp_one_hot_pick_matches_torch(mlp, seed):
    args = mlp_inputs(seed)
    check_against_torch(mlp, args, ("p", "x"), torch_mlp, entry="loss_one_hot")


@pytest.mark.parametrize("seed", SEEDS)
def test_mlp_finite_differences(mlp, mlp64, seed):
    args = mlp_inputs(seed)
    _, grads32 = dslc_grads(mlp, "loss", args, ("p", "x"))
    check_finite_differences(mlp64, to_f64(args), ("p", "x"), grads32, np.random.default_rng(seed))


@pytest.mark.parametrize("seed", SEEDS)
def test_mlp_hvp_matches_torch_double_backward(mlp, seed):
    args = mlp_inputs(seed)
    v = mlp_params(np.random.default_rng(100 + seed))
    hv = mlp.hvp(args["p"], args["x"], args["y"], v)
    assert hv.type_name == "Params"
    x, y = torch.from_numpy(args["x"]), torch.from_numpy(args["y"])
    check_hvp_against_torch(hv, args["p"], v, lambda p: torch_mlp(p, x, y))


def test_mlp_sgd_step_matches_torch(mlp):
    """step: value_and_grad and map inside the language."""
    args = mlp_inputs(3)
    lr = np.float32(0.1)
    new_p, value = mlp.step(args["p"], args["x"], args["y"], lr)
    assert isinstance(new_p, dsl.Record) and new_p.type_name == "Params"
    p = {k: torch.from_numpy(a).requires_grad_(True) for k, a in args["p"].items()}
    loss = torch_mlp(p, torch.from_numpy(args["x"]), torch.from_numpy(args["y"]))
    grads = torch.autograd.grad(loss, list(p.values()))
    close(value, loss.detach().numpy(), 1e-5, 1e-6, "step loss")
    for (k, w), g in zip(p.items(), grads):
        close(new_p[k], (w - lr * g).detach().numpy(), 1e-5, 1e-6, f"step {k}")


@pytest.mark.parametrize("seed", SEEDS)
def test_mlp_hvp_finite_differences(mlp64, seed):
    """H v at f64 against central differences of the f64 gradient along v."""
    args = to_f64(mlp_inputs(seed))
    v = to_f64(mlp_params(np.random.default_rng(100 + seed)))
    hv = mlp64.hvp(args["p"], args["x"], args["y"], v)
    h = 1e-6
    grad = mlp64.grad("loss", wrt="p")
    plus = grad({k: a + h * v[k] for k, a in args["p"].items()}, args["x"], args["y"])
    minus = grad({k: a - h * v[k] for k, a in args["p"].items()}, args["x"], args["y"])
    for k in args["p"]:
        fd = (plus[k] - minus[k]) / (2 * h)
        # the same error analysis as for the first-order differences, one derivative up
        close(hv[k], fd, 1e-7, 1e-8, f"hvp.{k} vs central differences")


# ---------------------------------------------------------------- layer norm

LN_B, LN_D, LN_O = 6, 8, 3

F64_LAYER_NORM = """
    from layer_norm import ln_loss

    object Params64 { gain: f64[D], bias: f64[D], W: f64[D, O], b: f64[O] }

    def loss(p: Params64, x: f64[B, D]) -> f64:
      return ln_loss(p, x)
"""


def layer_norm_inputs(seed):
    rng = np.random.default_rng(seed)
    p = {"gain": 1.0 + randn(rng, LN_D, scale=0.2), "bias": randn(rng, LN_D, scale=0.2),
         "W": randn(rng, LN_D, LN_O, scale=0.5), "b": randn(rng, LN_O, scale=0.1)}
    x = randn(rng, LN_B, LN_D, scale=2.0) + randn(rng, LN_B, 1)     # rows off-centre
    return {"p": p, "x": x}


def torch_layer_norm(p, x):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), p["gain"], p["bias"], eps=1e-5)
    out = y @ p["W"] + p["b"]
    return (out * out).sum()


@pytest.mark.parametrize("seed", SEEDS)
def test_layer_norm_matches_torch(seed):
    check_against_torch(load("layer_norm"), layer_norm_inputs(seed), ("p", "x"), torch_layer_norm)


@pytest.mark.parametrize("seed", SEEDS)
def test_layer_norm_finite_differences(seed):
    prog, args = load("layer_norm"), layer_norm_inputs(seed)
    _, grads32 = dslc_grads(prog, "loss", args, ("p", "x"))
    check_finite_differences(driver(F64_LAYER_NORM), to_f64(args), ("p", "x"), grads32,
                             np.random.default_rng(seed))


# ---------------------------------------------------------------- attention

AT_B, AT_HQ, AT_HKV, AT_T, AT_D = 2, 4, 2, 6, 4

F64_ATTENTION = """
    from attention import causal_attention

    def loss(q: f64[B, Hq, T, D], k: f64[B, Hkv, T, D], v: f64[B, Hkv, T, D], w: f64[B, Hq, T, D]) -> f64:
      return sum(causal_attention(q, k, v, B, Hq, Hkv, T, D) * w)
"""
ATTENTION_WRT = ("q", "k", "v", "w")


def attention_inputs(seed):
    rng = np.random.default_rng(seed)
    return {"q": randn(rng, AT_B, AT_HQ, AT_T, AT_D), "k": randn(rng, AT_B, AT_HKV, AT_T, AT_D),
            "v": randn(rng, AT_B, AT_HKV, AT_T, AT_D), "w": randn(rng, AT_B, AT_HQ, AT_T, AT_D)}


def torch_attention_output(q, k, v):
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)                  # query head h reads kv head h // g
    v = v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    t = q.shape[2]
    allowed = torch.tril(torch.ones(t, t, dtype=torch.bool))
    return torch.softmax(s.masked_fill(~allowed, -1e9), dim=-1) @ v


def torch_attention(q, k, v, w):
    return (torch_attention_output(q, k, v) * w).sum()


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_matches_torch(seed):
    grads = check_against_torch(load("attention"), attention_inputs(seed), ATTENTION_WRT,
                                torch_attention)
    assert all(np.all(np.isfinite(g)) for g in grads.values())


@pytest.mark.parametrize("seed", SEEDS)
def test_grouped_attention_matches_torch(seed):
    """The einsum formulation over grouped query heads, against the same torch reference."""
    check_against_torch(load("attention"), attention_inputs(seed), ATTENTION_WRT,
                        torch_attention, entry="loss_grouped")


def test_attention_heads_must_divide():
    rng = np.random.default_rng(0)
    q, kv = randn(rng, 1, 3, 4, 2), randn(rng, 1, 2, 4, 2)
    with pytest.raises(dsl.DslError, match="must divide"):
        load("attention").attention(q, kv, kv)


def test_attention_output_matches_torch_sdpa():
    """The attention itself against torch's fused causal grouped-query attention."""
    args = attention_inputs(2)
    out = load("attention").attention(args["q"], args["k"], args["v"])
    t = {k: torch.from_numpy(a) for k, a in args.items()}
    expected = torch.nn.functional.scaled_dot_product_attention(
        t["q"], t["k"], t["v"], is_causal=True, enable_gqa=True)
    close(out, expected.numpy(), 1e-5, 1e-6, "attention output")


def test_attention_is_causal():
    """Changing the last position's keys and values changes only the last query's output."""
    args = attention_inputs(3)
    prog = load("attention")
    before = prog.attention(args["q"], args["k"], args["v"])
    k, v = args["k"].copy(), args["v"].copy()
    k[:, :, -1] += 1.0
    v[:, :, -1] -= 1.0
    after = prog.attention(args["q"], k, v)
    np.testing.assert_array_equal(after[:, :, :-1], before[:, :, :-1])
    assert np.all(after[:, :, -1] != before[:, :, -1])


@pytest.mark.parametrize("seed", SEEDS)
def test_attention_finite_differences(seed):
    prog, args = load("attention"), attention_inputs(seed)
    _, grads32 = dslc_grads(prog, "loss", args, ATTENTION_WRT)
    check_finite_differences(driver(F64_ATTENTION), to_f64(args), ATTENTION_WRT, grads32,
                             np.random.default_rng(seed))


# ---------------------------------------------------------------- LSTM

LS_T, LS_B, LS_D, LS_H = 16, 3, 4, 5

F64_LSTM = """
    from lstm import lstm_loss

    object Lstm64 { Wx: f64[D, 4 * H], Wh: f64[H, 4 * H], b: f64[4 * H] }

    def loss(p: Lstm64, xs: f64[T, B, D], h0: f64[B, H], c0: f64[B, H]) -> f64:
      return lstm_loss(p, xs, h0, c0)
"""
LSTM_WRT = ("p", "xs", "h0", "c0")


def lstm_inputs(seed):
    rng = np.random.default_rng(seed)
    p = {"Wx": randn(rng, LS_D, 4 * LS_H, scale=0.5), "Wh": randn(rng, LS_H, 4 * LS_H, scale=0.5),
         "b": randn(rng, 4 * LS_H, scale=0.1)}
    return {"p": p, "xs": randn(rng, LS_T, LS_B, LS_D), "h0": randn(rng, LS_B, LS_H, scale=0.5),
            "c0": randn(rng, LS_B, LS_H, scale=0.5)}


def torch_lstm_states(p, xs, h0, c0):
    """torch.nn.LSTM with the program's weights: weight_ih = Wxᵀ, weight_hh = Whᵀ (the same
    i, f, g, o gate order), bias_ih = b, bias_hh = 0."""
    lstm = torch.nn.LSTM(LS_D, LS_H)
    weights = {"weight_ih_l0": p["Wx"].T, "weight_hh_l0": p["Wh"].T, "bias_ih_l0": p["b"],
               "bias_hh_l0": torch.zeros(4 * LS_H)}
    hs, _ = torch.func.functional_call(lstm, weights, (xs, (h0[None], c0[None])))
    return hs


def torch_lstm(p, xs, h0, c0):
    hs = torch_lstm_states(p, xs, h0, c0)
    return (hs * hs).mean()


def test_lstm_hvp_matches_torch_double_backward():
    """Second order through a fold: the gradient of a reverse scan."""
    args = lstm_inputs(2)
    rng = np.random.default_rng(102)
    v = {k: randn(rng, *a.shape) for k, a in args["p"].items()}
    hv = load("lstm").hvp(args["p"], args["xs"], args["h0"], args["c0"], v)
    assert hv.type_name == "Lstm"
    rest = to_torch({k: args[k] for k in ("xs", "h0", "c0")})
    check_hvp_against_torch(hv, args["p"], v, lambda p: torch_lstm(p, **rest))


def test_lstm_states_match_torch():
    args = lstm_inputs(2)
    hs = load("lstm").lstm(**args)
    t = to_torch(args)
    close(hs, torch_lstm_states(**t).detach().numpy(), 1e-5, 1e-6, "hs")


@pytest.mark.parametrize("seed", SEEDS)
def test_lstm_matches_torch(seed):
    check_against_torch(load("lstm"), lstm_inputs(seed), LSTM_WRT, torch_lstm)


@pytest.mark.parametrize("seed", SEEDS)
def test_lstm_finite_differences(seed):
    prog, args = load("lstm"), lstm_inputs(seed)
    _, grads32 = dslc_grads(prog, "loss", args, LSTM_WRT)
    check_finite_differences(driver(F64_LSTM), to_f64(args), LSTM_WRT, grads32,
                             np.random.default_rng(seed))


# ---------------------------------------------------------------- conv2d

CV_B, CV_H, CV_W, CV_C, CV_KH, CV_KW, CV_O = 2, 7, 6, 3, 3, 2, 4

F64_CONV2D = """
    from conv2d import conv_loss

    def loss(x: f64[B, H, W, C], w: f64[KH, KW, C, O], b: f64[O]) -> f64:
      return conv_loss(x, w, b, H, W, KH, KW)
"""
CONV_WRT = ("x", "w", "b")


def conv_inputs(seed):
    rng = np.random.default_rng(seed)
    return {"x": randn(rng, CV_B, CV_H, CV_W, CV_C), "w": randn(rng, CV_KH, CV_KW, CV_C, CV_O, scale=0.5),
            "b": randn(rng, CV_O, scale=0.5)}


def torch_conv(x, w):
    """Channels last through torch's NCHW conv2d: w [KH, KW, C, O] -> [O, C, KH, KW]."""
    y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1))
    return y.permute(0, 2, 3, 1)


def torch_conv_loss(x, w, b):
    return torch.relu(torch_conv(x, w) + b).sum()


def test_conv2d_output_matches_torch():
    args = conv_inputs(2)
    out = load("conv2d").conv(args["x"], args["w"])
    assert out.shape == (CV_B, CV_H - CV_KH + 1, CV_W - CV_KW + 1, CV_O)
    t = to_torch(args)
    close(out, torch_conv(t["x"], t["w"]).detach().numpy(), 1e-5, 1e-6, "conv output")


@pytest.mark.parametrize("seed", SEEDS)
def test_conv2d_matches_torch(seed):
    args = conv_inputs(seed)
    # relu' at a pre-activation that rounds to exactly 0 would make the comparison depend on
    # rounding; random inputs make that (probability ~2**-23 per entry) not happen
    t = to_torch(args)
    pre = (torch_conv(t["x"], t["w"]) + t["b"]).detach().numpy()
    assert np.min(np.abs(pre)) > 1e-4
    check_against_torch(load("conv2d"), args, CONV_WRT, torch_conv_loss)


@pytest.mark.parametrize("seed", SEEDS)
def test_conv2d_finite_differences(seed):
    prog, args = load("conv2d"), conv_inputs(seed)
    _, grads32 = dslc_grads(prog, "loss", args, CONV_WRT)
    check_finite_differences(driver(F64_CONV2D), to_f64(args), CONV_WRT, grads32,
                             np.random.default_rng(seed))
