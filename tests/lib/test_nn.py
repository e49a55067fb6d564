"""The standard library's `nn` (dsl/lib/nn.bend) against PyTorch.

Each function runs through a small driver program that imports it from `nn` and declares two
entry points for the same call: `out`, its value, and `loss`, the sum of the value times a
random cotangent, whose gradient (prog.grad) is the function's vector-Jacobian product. The
same call in PyTorch (torch.nn.functional, torch.nn) on the same float32 inputs gives the
expected value and, through torch.autograd, the expected gradients.

Tolerances
----------
rtol 1e-5 on every entry, plus an absolute floor of 1e-6 times the largest magnitude of the
compared tensor (tests/test_programs.py uses the same floor, but at least 1e-6; here it scales
with the values, however small). The two sides compute the same math with float32 roundings in
a different order (NumPy's pairwise sums and matmul kernels vs PyTorch's vectorised and
blocked ones, dslc's own exp/tanh vs PyTorch's), so each entry differs by a few ulps
(2**-23 ~ 1.2e-7) of the terms summed into it; an entry that comes out near zero from
cancelling terms of the tensor's typical size can differ by ~1e-7 to 1e-6 of that size, which
a purely relative bound cannot express. Tests that need another bound say why.

The programs run on the reference interpreter (the definition of every primitive), or on the
device that the environment variable DSLC_TEST_DEVICE names (e.g. `cpu`).
"""
from __future__ import annotations

import functools
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dsl
from frontend import ast
from frontend.check import check_file

HERE = Path(__file__).resolve().parent
DEVICE = os.environ.get("DSLC_TEST_DEVICE", "reference")
RTOL, FLOOR = 1e-5, 1e-6


# ---------------------------------------------------------------- drivers

@functools.lru_cache(maxsize=None)
def driver(source: str) -> dsl.Program:
    """A program whose `nn` import resolves to the standard library."""
    return dsl.loads(textwrap.dedent(source), name=str(HERE / "nn_driver.bend"), device=DEVICE)


def annotation(v) -> str:
    if isinstance(v, dsl.Key):
        return "Key"
    a = np.asarray(v)
    dtype = {np.float32: "f32", np.int32: "i32", np.int64: "i64"}[a.dtype.type]
    return f"{dtype}[{', '.join(map(str, a.shape))}]"


def as_tuple(v):
    return v if isinstance(v, tuple) else (v,)


def leaves(v):
    """The arrays of a value made of dicts (records), tuples and arrays, in order."""
    if isinstance(v, dict):
        return [a for k in v for a in leaves(v[k])]
    if isinstance(v, (tuple, list)):
        return [a for x in v for a in leaves(x)]
    return [v]


def to_torch(v, grads: list | None):
    """Torch tensors for the arrays of v; float ones require grad and join `grads`."""
    if isinstance(v, dict):
        return {k: to_torch(x, grads) for k, x in v.items()}
    if isinstance(v, dsl.Key):
        return v
    t = torch.from_numpy(np.array(v))
    if grads is not None and t.dtype == torch.float32:
        grads.append(t.requires_grad_(True))
    return t


def close(actual, expected, what: str, rtol: float = RTOL, floor: float = FLOOR) -> None:
    """|actual - expected| <= rtol |expected| + floor max |expected|, entrywise."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    atol = floor * float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def compare(call: str, args: dict, torch_fn, wrt: tuple[str, ...], types: dict | None = None,
            seed: int = 0, rtol: float = RTOL, floor: float = FLOOR, helpers: str = ""):
    """Checks the value of `call` (source over the names of args, with `nn` imported and the
    definitions `helpers`) against torch_fn(*args as tensors), and the gradients of
    <value, ct> with respect to the parameters `wrt` against torch's, for a random cotangent
    ct. Returns dslc's value."""
    types = {k: (types or {}).get(k) or annotation(v) for k, v in args.items()}
    tensors = {name: to_torch(v, None) for name, v in args.items()}
    torch_leaves = []                                  # in the order of wrt, as dslc's gradients
    for name in wrt:
        tensors[name] = to_torch(args[name], torch_leaves)
    expected = as_tuple(torch_fn(*(tensors[name] for name in args)))
    rng = np.random.default_rng(seed + 100)
    cts = [rng.standard_normal(tuple(e.shape)).astype(np.float32) for e in expected]

    params = ", ".join(f"{k}: {types[k]}" for k in args)
    ct_params = ", ".join(f"ct{i}: {annotation(c)}" for i, c in enumerate(cts))
    outs = " + ".join(f"sum(o[{i}] * ct{i})" if len(cts) > 1 else f"sum(o * ct{i})"
                      for i in range(len(cts)))
    prog = driver(f"""
        import nn
{textwrap.indent(textwrap.dedent(helpers), " " * 8)}
        def out({params}):
          return {call}

        def loss({params}, {ct_params}) -> f32:
          o = {call}
          return {outs}
        """)
    value = as_tuple(prog.out(**args))
    for i, (v, e) in enumerate(zip(value, expected)):
        close(v, e.detach().numpy(), f"{call}: value {i}", rtol, floor)

    loss = sum((e * torch.from_numpy(c)).sum() for e, c in zip(expected, cts))
    want = torch.autograd.grad(loss, torch_leaves, allow_unused=True)
    got = prog.grad("loss", wrt=wrt)(**args, **{f"ct{i}": c for i, c in enumerate(cts)})
    got = leaves(got)                                  # wrt is a tuple: so is the gradient
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = np.zeros_like(g) if w is None else w.numpy()
        close(g, w, f"{call}: gradient {i} of {wrt}", rtol, floor)
    return value if len(value) > 1 else value[0]


def randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def nchw(x):
    """A channels-last image [B, H, W, C] as PyTorch's [B, C, H, W]."""
    return x.permute(0, 3, 1, 2)


def nhwc(x):
    return x.permute(0, 2, 3, 1)


# ---------------------------------------------------------------- the library itself

LIBRARY = Path(dsl.__file__).resolve().parent / "lib"


@pytest.mark.parametrize("module", ["nn", "optim"])
def test_library_checks_and_documents_every_definition(module):
    """`dslc check` accepts the module, and every def and object has a #{ … #} doc comment:
    the library is what users read to learn the language."""
    program = check_file(str(LIBRARY / f"{module}.bend"))
    items = [i for i in program.main.tree.items if isinstance(i, (ast.Def, ast.ObjectDef, ast.TypeDef))]
    assert items
    undocumented = [i.name for i in items if not (i.doc or "").strip()]
    assert not undocumented, f"{module}.bend: no doc comment on {undocumented}"


# ---------------------------------------------------------------- layers and activations

@pytest.mark.parametrize("seed", [0, 1])
def test_linear(seed):
    rng = np.random.default_rng(seed)
    x, W, b = randn(rng, 2, 3, 5), randn(rng, 5, 4), randn(rng, 4)
    compare("nn.linear(x, W, b)", dict(x=x, W=W, b=b), lambda x, W, b: F.linear(x, W.T, b),
            ("x", "W", "b"), seed=seed)
    compare("nn.linear(x, W)", dict(x=x, W=W), lambda x, W: F.linear(x, W.T), ("x", "W"))


@pytest.mark.parametrize("call, reference", [
    ("relu(x)", F.relu),
    ("gelu(x)", F.gelu),
    ('gelu(x, "tanh")', lambda x: F.gelu(x, approximate="tanh")),
    ("silu(x)", F.silu),
    ("softplus(x)", F.softplus),
    ("softplus(x, 2.0, 5.0)", lambda x: F.softplus(x, 2.0, 5.0)),
    ("mish(x)", F.mish),
])
def test_activations(call, reference):
    rng = np.random.default_rng(0)
    x = randn(rng, 4, 3, 7, scale=3.0)
    x[0, 0, :3] = 0.0                          # the kink of relu: relu'(0) must be 0
    x[1, 0, :4] = [30.0, -30.0, 90.0, -120.0]  # softplus beyond its threshold; exp overflows
    compare(f"nn.{call}", dict(x=x), reference, ("x",))


def test_relu_gradient_at_zero_is_zero():
    """PyTorch's convention, which `maximum(x, 0.0)` (half the gradient at a tie) would break."""
    prog = driver("""
        import nn
        def loss(x: f32[3]) -> f32:
          return sum(nn.relu(x))
        """)
    g = prog.grad("loss", wrt="x")(np.array([-1.0, 0.0, 2.0], np.float32))
    np.testing.assert_array_equal(g, [0.0, 0.0, 1.0])


def test_gelu_is_close_to_the_exact_gelu():
    """The tanh approximation stays within 5e-4 of x Phi(x), as its doc comment says."""
    x = np.linspace(-8, 8, 2001, dtype=np.float32)
    got = driver("""
        import nn
        def out(x: f32[2001]) -> f32[2001]:
          return nn.gelu(x, "tanh")
        """).out(x)
    assert np.max(np.abs(got - F.gelu(torch.from_numpy(x)).numpy())) < 5e-4


def test_embedding():
    rng = np.random.default_rng(0)
    E = randn(rng, 7, 4)
    idx = np.array([[1, 3, 1], [6, 0, 1]], np.int32)        # repeated rows accumulate
    compare("nn.embedding(E, idx)", dict(E=E, idx=idx), lambda E, idx: F.embedding(idx, E), ("E",))


# ---------------------------------------------------------------- dropout

DROPOUT = """
    import nn
    def out(k: Key, x: f32[64, 32], p: float, training: bool) -> f32[64, 32]:
      return nn.dropout(k, x, [64, 32], p, training)
    def loss(k: Key, x: f32[64, 32], ct: f32[64, 32], p: float) -> f32:
      return sum(nn.dropout(k, x, [64, 32], p) * ct)
    def uniforms(k: Key) -> f32[64, 32]:
      return uniform(k, [64, 32])
    """


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_matches_torch_given_the_mask(p):
    """The kept elements are x / (1 - p) and the others 0, so the output fixes the mask; PyTorch's
    x * mask / (1 - p) with that mask gives the same value and gradient. PyTorch's own random
    mask comes from another generator, so the masks themselves are compared with statistics."""
    rng = np.random.default_rng(0)
    x = randn(rng, 64, 32) + 5.0                       # no zeros: a zero output means dropped
    ct = randn(rng, 64, 32)
    prog = driver(DROPOUT)
    y = prog.out(dsl.key(3), x, p, True)
    mask = (y != 0).astype(np.float32)
    keep = mask.mean()
    assert abs(keep - (1 - p)) < 4 * np.sqrt(p * (1 - p) / x.size)      # 4 standard deviations
    xt = torch.from_numpy(x).requires_grad_(True)
    ref = xt * torch.from_numpy(mask) / (1 - p)
    close(y, ref.detach().numpy(), "dropout value")
    (want,) = torch.autograd.grad((ref * torch.from_numpy(ct)).sum(), [xt])
    close(prog.grad("loss", wrt="x")(dsl.key(3), x, ct, p), want.numpy(), "dropout gradient")
    # the mask is bernoulli(k, 1 - p): the uniform draws of the same key below 1 - p
    np.testing.assert_array_equal(mask > 0, prog.uniforms(dsl.key(3)) < np.float32(1 - p))


def test_dropout_identity_and_keys():
    rng = np.random.default_rng(0)
    x = randn(rng, 64, 32)
    prog = driver(DROPOUT)
    np.testing.assert_array_equal(prog.out(dsl.key(0), x, 0.5, False), x)    # evaluation
    np.testing.assert_array_equal(prog.out(dsl.key(0), x, 0.0, True), x)     # p = 0
    np.testing.assert_array_equal(prog.out(dsl.key(0), x, 1.0, True), 0 * x)
    a, b = prog.out(dsl.key(1), x, 0.5, True), prog.out(dsl.key(1), x, 0.5, True)
    np.testing.assert_array_equal(a, b)                                       # same key, same mask
    assert np.any((a == 0) != (prog.out(dsl.key(2), x, 0.5, True) == 0))


# ---------------------------------------------------------------- softmax and losses

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
    rng = np.random.default_rng(0)
    x = randn(rng, 3, 4, 5, scale=3.0)
    compare(f"nn.softmax(x, {axis})", dict(x=x), lambda x: F.softmax(x, axis), ("x",))
    compare(f"nn.log_softmax(x, axis={axis})", dict(x=x), lambda x: F.log_softmax(x, axis), ("x",))


@pytest.mark.parametrize("axis, keepdims", [(-1, False), (0, True), (1, False)])
def test_logsumexp(axis, keepdims):
    rng = np.random.default_rng(0)
    x = randn(rng, 3, 4, 5, scale=3.0) + 40.0            # exp(x) alone would lose digits
    compare(f"nn.logsumexp(x, {axis}, {keepdims})", dict(x=x),
            lambda x: torch.logsumexp(x, axis, keepdim=keepdims), ("x",))


def test_logsumexp_of_minus_infinity():
    """A row that is all -inf gives -inf, not NaN, as PyTorch; -inf entries elsewhere add 0."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]], np.float32)
    got = driver("""
        import nn
        def out(x: f32[2, 3]) -> f32[2]:
          return nn.logsumexp(x)
        """).out(x)
    np.testing.assert_array_equal(got, torch.logsumexp(torch.from_numpy(x), -1).numpy())


def ce_reference(ignore_index=-100, label_smoothing=0.0):
    return lambda logits, y: F.cross_entropy(logits, y.long(), ignore_index=ignore_index,
                                             label_smoothing=label_smoothing)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("options, kwargs", [
    ("", {}),
    (", label_smoothing=0.1", dict(label_smoothing=0.1)),
    (", ignore_index=2", dict(ignore_index=2)),
    (", 2, 0.25", dict(ignore_index=2, label_smoothing=0.25)),
])
def test_cross_entropy(seed, options, kwargs):
    rng = np.random.default_rng(seed)
    logits = randn(rng, 9, 5, scale=2.0)
    y = rng.integers(0, 5, size=9).astype(np.int32)
    y[[1, 4]] = kwargs.get("ignore_index", -100)            # some rows are ignored
    compare(f"nn.cross_entropy(logits, y{options})", dict(logits=logits, y=y),
            ce_reference(**kwargs), ("logits",), seed=seed)


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("target", [3, 7, -1, -3, -101])
def test_cross_entropy_rejects_a_target_out_of_range(target, device):
    """As PyTorch does (it raises), rather than a row that silently adds nothing to the loss;
    only ignore_index may lie outside [0, C)."""
    logits = randn(np.random.default_rng(0), 4, 3)
    y = np.array([0, target, 2, -100], np.int32)
    with pytest.raises(IndexError):
        F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y).long())
    prog = dsl.loads("from nn import cross_entropy\n"
                     "def f(x: f32[B, C], y: i32[B]) -> f32:\n  return cross_entropy(x, y)\n",
                     name=str(HERE / "nn_driver.bend"), device=device)
    with pytest.raises(dsl.DslError, match=f"index {target} is out of bounds for axis 0 with size 3"):
        prog.f(logits, y)


def test_cross_entropy_with_masked_classes():
    """-inf scores of classes that are not the target: their probability is 0 and the loss and
    gradient stay finite (a product with the one-hot target would give -inf * 0 = NaN)."""
    rng = np.random.default_rng(0)
    logits = randn(rng, 4, 6)
    logits[:, 4:] = -np.inf
    y = np.array([0, 3, 1, 2], np.int32)
    compare("nn.cross_entropy(logits, y)", dict(logits=logits, y=y), ce_reference(), ("logits",))


def test_cross_entropy_of_a_sequence_model():
    """[B, T, V] scores, reshaped to [B * T, V] as the doc comment says."""
    rng = np.random.default_rng(0)
    z, t = randn(rng, 2, 3, 7), rng.integers(0, 7, size=(2, 3)).astype(np.int32)
    compare("nn.cross_entropy(reshape(z, [6, 7]), reshape(t, [6]))", dict(z=z, t=t),
            lambda z, t: F.cross_entropy(z.reshape(6, 7), t.reshape(6).long()), ("z",))


# ---------------------------------------------------------------- normalisation

@pytest.mark.parametrize("seed", [0, 1])
def test_layer_norm(seed):
    rng = np.random.default_rng(seed)
    x, w, b = randn(rng, 2, 3, 8, scale=2.0) + 1.0, randn(rng, 8), randn(rng, 8)
    compare("nn.layer_norm(x, w, b)", dict(x=x, w=w, b=b),
            lambda x, w, b: F.layer_norm(x, (8,), w, b), ("x", "w", "b"), seed=seed)
    compare("nn.layer_norm(x, eps=1e-3)", dict(x=x), lambda x: F.layer_norm(x, (8,), eps=1e-3), ("x",))


@pytest.mark.parametrize("seed", [0, 1])
def test_rms_norm(seed):
    rng = np.random.default_rng(seed)
    x, w = randn(rng, 2, 3, 8, scale=2.0), randn(rng, 8)
    compare("nn.rms_norm(x, w)", dict(x=x, w=w), lambda x, w: F.rms_norm(x, (8,), w), ("x", "w"),
            seed=seed)
    compare("nn.rms_norm(x, eps=1e-5)", dict(x=x), lambda x: F.rms_norm(x, (8,), eps=1e-5), ("x",))


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(groups):
    rng = np.random.default_rng(groups)
    x, w, b = randn(rng, 2, 3, 4, 6, scale=2.0) + 0.5, randn(rng, 6), randn(rng, 6)
    compare(f"nn.group_norm(x, {groups}, w, b)", dict(x=x, w=w, b=b),
            lambda x, w, b: nhwc(F.group_norm(nchw(x), groups, w, b)), ("x", "w", "b"))
    compare(f"nn.group_norm(x, {groups})", dict(x=x),
            lambda x: nhwc(F.group_norm(nchw(x), groups)), ("x",))


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(training):
    """The value, the running statistics after the step (PyTorch updates them in place), and
    the gradients with respect to x, weight and bias (none flows into the statistics)."""
    rng = np.random.default_rng(int(training))
    x, w, b = randn(rng, 3, 2, 5, 4, scale=2.0) + 0.5, randn(rng, 4), randn(rng, 4)
    rm, rv = randn(rng, 4), np.abs(randn(rng, 4)) + 0.5

    def torch_batch_norm(x, rm, rv, w, b):
        rm, rv = rm.clone(), rv.clone()
        y = F.batch_norm(nchw(x), rm, rv, w, b, training, 0.1, 1e-5)
        return nhwc(y), rm, rv
    compare(f"stats(nn.batch_norm(x, nn/BatchNorm {{ weight: w, bias: b, running_mean: rm, running_var: rv }}, "
            f"{training}))", dict(x=x, rm=rm, rv=rv, w=w, b=b), torch_batch_norm, ("x", "w", "b"),
            helpers="""
            def stats(out):
              y, bn = out
              return y, bn.running_mean, bn.running_var
            """)


def test_batch_norm_gives_its_buffers_no_gradient():
    """grad with respect to the whole BatchNorm record: weight and bias have gradients, the
    running statistics (buffers) zeros; a map over it, as an optimizer's, leaves them as they are."""
    prog = driver("""
        import nn
        def loss(bn: nn/BatchNorm, x: f32[B, H, W, C]) -> f32:
          y, _ = nn.batch_norm(x, bn)
          return sum(y * y * bn.running_mean)
        def gradient(bn: nn/BatchNorm, x: f32[B, H, W, C]) -> nn/BatchNorm:
          return grad(loss, wrt=bn)(bn, x)
        def sgd(bn: nn/BatchNorm, x: f32[B, H, W, C]) -> nn/BatchNorm:
          g = grad(loss, wrt=bn)(bn, x)
          return map(lambda p, d: p - 0.5 * d - 1.0, bn, g)
        """)
    rng = np.random.default_rng(0)
    bn = dict(weight=randn(rng, 4), bias=randn(rng, 4), running_mean=randn(rng, 4), running_var=np.ones(4, np.float32))
    x = randn(rng, 2, 3, 3, 4)
    g = prog.grad("loss", wrt="bn")(bn, x)
    for name, value in prog.gradient(bn, x).items():               # grad in the language
        np.testing.assert_array_equal(value, g[name])
    assert np.all(g["weight"] != 0) and np.all(g["bias"] != 0)
    np.testing.assert_array_equal(g["running_mean"], np.zeros(4, np.float32))
    np.testing.assert_array_equal(g["running_var"], np.zeros(4, np.float32))
    new = prog.sgd(bn, x)
    np.testing.assert_array_equal(new["weight"], bn["weight"] - 0.5 * g["weight"] - 1.0)
    np.testing.assert_array_equal(new["running_mean"], bn["running_mean"])
    np.testing.assert_array_equal(new["running_var"], bn["running_var"])


def test_batch_norm_of_one_value_a_channel_is_an_error():
    with pytest.raises(dsl.DslError, match="more than one value per channel"):
        driver("import nn\ndef f(x: f32[1, 1, 1, 3]):\n"
               "  return nn.batch_norm(x, nn.batch_norm_init(3))\n").f(np.ones((1, 1, 1, 3), np.float32))


# ---------------------------------------------------------------- convolution and pooling

@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 0), (1, 1), (2, 2), (3, 1)])
def test_conv2d(stride, padding):
    rng = np.random.default_rng(stride * 10 + padding)
    x, w, b = randn(rng, 2, 7, 6, 3), randn(rng, 3, 2, 3, 4), randn(rng, 4)
    compare(f"nn.conv2d(x, w, b, {stride}, {padding})", dict(x=x, w=w, b=b),
            lambda x, w, b: nhwc(F.conv2d(nchw(x), w.permute(3, 2, 0, 1), b, stride, padding)),
            ("x", "w", "b"))


def test_conv2d_without_bias():
    rng = np.random.default_rng(0)
    x, w = randn(rng, 1, 5, 5, 2), randn(rng, 3, 3, 2, 3)
    compare("nn.conv2d(x, w, padding=1)", dict(x=x, w=w),
            lambda x, w: nhwc(F.conv2d(nchw(x), w.permute(3, 2, 0, 1), padding=1)), ("x", "w"))


POOLS = [(2, 0, 0), (2, 1, 0), (3, 2, 1), (3, 1, 1), (2, 3, 1)]      # kernel, stride, padding


@pytest.mark.parametrize("kernel, stride, padding", POOLS)
def test_max_pool2d(kernel, stride, padding):
    rng = np.random.default_rng(kernel + stride)
    x = randn(rng, 2, 7, 6, 3)
    torch_stride = stride or kernel
    compare(f"nn.max_pool2d(x, {kernel}, {stride}, {padding})", dict(x=x),
            lambda x: nhwc(F.max_pool2d(nchw(x), kernel, torch_stride, padding)), ("x",))


@pytest.mark.parametrize("kernel, stride, padding", POOLS)
def test_max_pool2d_sends_the_gradient_to_the_first_maximum(kernel, stride, padding):
    """Small integers tie often; PyTorch gives each window's gradient to its first maximum
    (in row-major order), where the `max` reduction would share it among the ties. Negative
    values check that padding is -inf, not 0."""
    rng = np.random.default_rng(kernel * stride + 7)
    x = rng.integers(-3, 1, size=(2, 7, 6, 3)).astype(np.float32)
    torch_stride = stride or kernel
    compare(f"nn.max_pool2d(x, {kernel}, {stride}, {padding})", dict(x=x),
            lambda x: nhwc(F.max_pool2d(nchw(x), kernel, torch_stride, padding)), ("x",))


@pytest.mark.parametrize("kernel, stride, padding", POOLS)
def test_avg_pool2d(kernel, stride, padding):
    rng = np.random.default_rng(kernel + 2 * stride)
    x = randn(rng, 2, 7, 6, 3)
    torch_stride = stride or kernel
    compare(f"nn.avg_pool2d(x, {kernel}, {stride}, {padding})", dict(x=x),
            lambda x: nhwc(F.avg_pool2d(nchw(x), kernel, torch_stride, padding)), ("x",))


# ---------------------------------------------------------------- recurrent cells

def cell_params(rng, I, H, gates):
    s = 1 / np.sqrt(H)
    return dict(Wx=randn(rng, I, gates * H, scale=s), Wh=randn(rng, H, gates * H, scale=s),
                bx=randn(rng, gates * H, scale=s), bh=randn(rng, gates * H, scale=s))


def torch_cell(module, p):
    """PyTorch's cell with our record's weights (transposed), differentiable in them."""
    weights = dict(weight_ih=p["Wx"].T, weight_hh=p["Wh"].T, bias_ih=p["bx"], bias_hh=p["bh"])
    return lambda *args: torch.func.functional_call(module, weights, args)


@pytest.mark.parametrize("seed", [0, 1])
def test_lstm_cell(seed):
    rng = np.random.default_rng(seed)
    p, x, h, c = cell_params(rng, 3, 4, 4), randn(rng, 2, 3), randn(rng, 2, 4), randn(rng, 2, 4)
    compare("nn.lstm_cell(p, x, (h, c))", dict(p=p, x=x, h=h, c=c),
            lambda p, x, h, c: torch_cell(torch.nn.LSTMCell(3, 4), p)(x, (h, c)),
            ("p", "x", "h", "c"), types=dict(p="nn/LstmCell"), seed=seed)


@pytest.mark.parametrize("seed", [0, 1])
def test_gru_cell(seed):
    rng = np.random.default_rng(seed)
    p, x, h = cell_params(rng, 3, 4, 3), randn(rng, 2, 3), randn(rng, 2, 4)
    compare("nn.gru_cell(p, x, h)", dict(p=p, x=x, h=h),
            lambda p, x, h: torch_cell(torch.nn.GRUCell(3, 4), p)(x, h),
            ("p", "x", "h"), types=dict(p="nn/GruCell"), seed=seed)


def test_lstm_over_a_sequence():
    """The fold of lstm_cell's doc comment against torch.nn.LSTM over the same sequence: the
    gradient is a reverse scan through the cell."""
    rng = np.random.default_rng(0)
    p, xs = cell_params(rng, 3, 4, 4), randn(rng, 5, 2, 3)
    h0, c0 = randn(rng, 2, 4), randn(rng, 2, 4)

    def reference(p, xs, h0, c0):
        weights = dict(weight_ih_l0=p["Wx"].T, weight_hh_l0=p["Wh"].T, bias_ih_l0=p["bx"],
                       bias_hh_l0=p["bh"])
        hs, _ = torch.func.functional_call(torch.nn.LSTM(3, 4), weights, (xs, (h0[None], c0[None])))
        return hs

    compare("run(p, xs, h0, c0)", dict(p=p, xs=xs, h0=h0, c0=c0), reference,
            ("p", "xs", "h0", "c0"), types=dict(p="nn/LstmCell"), helpers="""
                def run(p, xs, h0, c0):
                  hs = fold x in xs with s = (h0, c0):
                    s = nn.lstm_cell(p, x, s)
                    return s[0]
                  return hs
                """)


# ---------------------------------------------------------------- attention

def rope_reference(x, base=10000.0):
    """Hugging Face Llama's rotary embedding (rotate_half), positions 0 … T - 1."""
    D, T = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope(base):
    rng = np.random.default_rng(0)
    x = randn(rng, 2, 3, 6, 8)
    compare(f"nn.rope(x, {base})", dict(x=x), lambda x: rope_reference(x, base), ("x",))


def test_rope_rotates_pairs():
    """A rotation keeps each pair's length: the norm of every (x_j, x_{j + D/2}) pair is kept."""
    rng = np.random.default_rng(1)
    x = randn(rng, 1, 1, 5, 4)
    y = driver("""
        import nn
        def out(x: f32[1, 1, 5, 4]) -> f32[1, 1, 5, 4]:
          return nn.rope(x)
        """).out(x)
    pairs = lambda a: a[..., :2] ** 2 + a[..., 2:] ** 2
    close(pairs(y), pairs(x), "pair norms")
    np.testing.assert_array_equal(y[..., 0, :], x[..., 0, :])       # position 0: angle 0


@pytest.mark.parametrize("Hq, Hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention(Hq, Hkv, causal):
    rng = np.random.default_rng(Hq + Hkv)
    q, k, v = randn(rng, 2, Hq, 5, 8), randn(rng, 2, Hkv, 5, 8), randn(rng, 2, Hkv, 5, 8)
    compare(f"nn.attention(q, k, v, {causal})", dict(q=q, k=k, v=v),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           enable_gqa=True),
            ("q", "k", "v"))


@pytest.mark.parametrize("T, S", [(3, 5), (5, 3)])
def test_attention_cross_and_causal_alignment(T, S):
    """T queries and S keys; the causal mask is aligned at the top left, as PyTorch's."""
    rng = np.random.default_rng(T)
    q, k, v = randn(rng, 1, 2, T, 4), randn(rng, 1, 1, S, 4), randn(rng, 1, 1, S, 4)
    for causal in (False, True):
        compare(f"nn.attention(q, k, v, causal={causal})", dict(q=q, k=k, v=v),
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                               enable_gqa=True),
                ("q", "k", "v"))


def test_attention_with_a_mask():
    """An additive mask of shape [B, 1, T, S] (padding, with -inf) and one of [Hq, T, S]
    (a learned bias); with causal=True both combine with the causal mask."""
    rng = np.random.default_rng(0)
    q, k, v = randn(rng, 2, 4, 5, 8), randn(rng, 2, 2, 5, 8), randn(rng, 2, 2, 5, 8)
    pad = np.zeros((2, 1, 5, 5), np.float32)
    pad[1, :, :, 3:] = -np.inf                  # the second sequence has 3 keys
    bias = randn(rng, 4, 5, 5)
    sdpa = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    compare("nn.attention(q, k, v, mask=m)", dict(q=q, k=k, v=v, m=pad), sdpa, ("q", "k", "v"))
    compare("nn.attention(q, k, v, mask=m)", dict(q=q, k=k, v=v, m=bias), sdpa, ("q", "k", "v", "m"))
    causal = torch.full((5, 5), -torch.inf).triu(1)
    compare("nn.attention(q, k, v, True, m)", dict(q=q, k=k, v=v, m=bias),
            lambda q, k, v, m: sdpa(q, k, v, m + causal), ("q", "k", "v", "m"))


def repeat_kv(x, groups):
    """Key/value heads repeated for the query heads that read them, as enable_gqa does."""
    return x.repeat_interleave(groups, dim=1)


@pytest.mark.parametrize("Hq, Hkv, causal", [(4, 2, True), (2, 2, False)])
def test_attention_dropout_matches_torch_given_the_mask(Hq, Hkv, causal):
    """Dropout on the attention weights: the kept weights scaled by 1 / (1 - p), the mask being
    bernoulli(rng, 1 - p) over [B, Hq, T, S]. PyTorch's sdpa draws its own mask, so the
    reference is its math written out with dslc's mask."""
    rng = np.random.default_rng(Hq)
    q, k, v = randn(rng, 2, Hq, 5, 8), randn(rng, 2, Hkv, 5, 8), randn(rng, 2, Hkv, 5, 8)
    p, r = 0.3, dsl.key(5)
    keep = driver("""
        def keep(r: Key) -> bool[2, 4, 5, 5]:
          return bernoulli(r, 1.0 - 0.3, [2, 4, 5, 5])
        """.replace("4", str(Hq))).keep(r)
    assert 0.5 < keep.mean() < 0.9

    def reference(q, k, v, r, keep):
        s = q @ repeat_kv(k, Hq // Hkv).transpose(-1, -2) / np.sqrt(8)
        if causal:
            s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -torch.inf)
        a = torch.softmax(s, -1) * keep / (1 - p)
        return a @ repeat_kv(v, Hq // Hkv)

    compare(f"nn.attention(q, k, v, {causal}, dropout_p={p}, rng=r)",
            dict(q=q, k=k, v=v, r=r, keep=keep), reference, ("q", "k", "v"),
            types=dict(keep=f"bool[2, {Hq}, 5, 5]"))
    sdpa = lambda q, k, v, r: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    compare(f"nn.attention(q, k, v, {causal}, dropout_p={p}, rng=r, training=False)",
            dict(q=q, k=k, v=v, r=r), sdpa, ("q", "k", "v"))


# ---------------------------------------------------------------- transformer blocks

class TorchBlock(torch.nn.Module):
    """A pre-norm transformer block in PyTorch, with the weights of nn's Block or SwiGluBlock
    (the per-head projections reshaped to PyTorch's [D, H K] matrices)."""

    def __init__(self, norm: str, mlp: str, causal: bool, rotary: bool):
        super().__init__()
        self.norm, self.mlp, self.causal, self.rotary = norm, mlp, causal, rotary

    def normalize(self, x, w):
        D = x.shape[-1]
        return F.layer_norm(x, (D,), w) if self.norm == "layer" else F.rms_norm(x, (D,), w)

    def forward(self, p, x):
        B, T, D = x.shape
        H, K = p["Wq"].shape[1:]
        heads = lambda h, W: (h @ W.reshape(D, -1)).view(B, T, -1, K).transpose(1, 2)   # noqa: E731
        h = self.normalize(x, p["norm1"])
        q, k, v = heads(h, p["Wq"]), heads(h, p["Wk"]), heads(h, p["Wv"])
        if self.rotary:
            q, k = rope_reference(q), rope_reference(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=True)
        x = x + y.transpose(1, 2).reshape(B, T, H * K) @ p["Wo"].reshape(H * K, D)
        h = self.normalize(x, p["norm2"])
        if self.mlp == "swiglu":
            m = (F.silu(h @ p["W1"]) * (h @ p["W3"])) @ p["W2"]
        else:
            m = F.gelu(h @ p["W1"]) @ p["W2"]
        return x + m


def block_params(rng, D, H, G, K, F_, swiglu):
    """Random weights of a Block (or SwiGluBlock), in the record's field order."""
    p = dict(norm1=1.0 + randn(rng, D, scale=0.1), Wq=randn(rng, D, H, K, scale=D ** -0.5),
             Wk=randn(rng, D, G, K, scale=D ** -0.5), Wv=randn(rng, D, G, K, scale=D ** -0.5),
             Wo=randn(rng, H, K, D, scale=(H * K) ** -0.5), norm2=1.0 + randn(rng, D, scale=0.1),
             W1=randn(rng, D, F_, scale=D ** -0.5), W2=randn(rng, F_, D, scale=F_ ** -0.5))
    if swiglu:
        p["W3"] = randn(rng, D, F_, scale=D ** -0.5)
        p["W2"] = p.pop("W2")                      # SwiGluBlock's order: W1, W3, W2
    return p


@pytest.mark.parametrize("norm, mlp, H, G, causal, rotary", [
    ("layer", "gelu", 4, 4, True, False),           # GPT-2's block, without biases
    ("rms", "swiglu", 4, 2, True, True),            # Llama's
    ("layer", "swiglu", 6, 1, False, True),         # multi-query, bidirectional
    ("rms", "gelu", 2, 2, False, False),
])
def test_transformer_block(norm, mlp, H, G, causal, rotary):
    rng = np.random.default_rng(H * 10 + G)
    p, x = block_params(rng, 12, H, G, 4, 20, mlp == "swiglu"), randn(rng, 2, 5, 12)
    record = "nn/SwiGluBlock" if mlp == "swiglu" else "nn/Block"
    module = TorchBlock(norm, mlp, causal, rotary)
    compare(f'nn.transformer_block(p, x, "{norm}", "{mlp}", {causal}, {rotary})', dict(p=p, x=x),
            module, ("p", "x"), types=dict(p=record))


def test_transformer_block_dropout():
    """training=False (or p = 0) is the block without dropout; in training the same key drops
    the same elements, another key others."""
    rng = np.random.default_rng(0)
    p, x = block_params(rng, 8, 2, 1, 4, 16, False), randn(rng, 2, 6, 8)
    prog = driver("""
        import nn
        def out(p: nn/Block, x: f32[2, 6, 8], r: Key, training: bool) -> f32[2, 6, 8]:
          return nn.transformer_block(p, x, dropout_p=0.2, rng=r, training=training)
        def plain(p: nn/Block, x: f32[2, 6, 8]) -> f32[2, 6, 8]:
          return nn.transformer_block(p, x)
        """)
    plain = prog.plain(p, x)
    close(plain, TorchBlock("layer", "gelu", True, False)(to_torch(p, None), torch.from_numpy(x)).numpy(),
          "block")
    np.testing.assert_array_equal(prog.out(p, x, dsl.key(1), False), plain)
    a, b = prog.out(p, x, dsl.key(1), True), prog.out(p, x, dsl.key(1), True)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, plain) and not np.allclose(a, prog.out(p, x, dsl.key(2), True))


BERT_LAYER = """
    def heads(x: f32[B, T, D], H: int, K: int) -> f32[B, H, T, K]:
      return transpose(reshape(x, [B, T, H, K]), [0, 2, 1, 3])

    def bert_layer(x: f32[B, T, D], mask: f32[B, 1, 1, T], Wq: f32[D, D], bq: f32[D], Wk: f32[D, D], bk: f32[D], Wv: f32[D, D], bv: f32[D], Wo: f32[D, D], bo: f32[D], g1: f32[D], b1: f32[D], W1: f32[D, F], c1: f32[F], W2: f32[F, D], c2: f32[D], g2: f32[D], b2: f32[D], H: int, K: int) -> f32[B, T, D]:
      a = nn.attention(heads(x @ Wq + bq, H, K), heads(x @ Wk + bk, H, K), heads(x @ Wv + bv, H, K), mask=mask)
      h = nn.layer_norm(x + reshape(transpose(a, [0, 2, 1, 3]), [B, T, D]) @ Wo + bo, g1, b1)
      return nn.layer_norm(h + nn.gelu(h @ W1 + c1) @ W2 + c2, g2, b2)
    """


def test_a_bert_layer_matches_torchs_transformer_encoder_layer():
    """A post-norm BERT encoder layer written with the library (nn.attention with an additive
    padding mask, nn.layer_norm, nn.gelu exact, by erf) against torch.nn.TransformerEncoderLayer
    with the same weights (activation="gelu": F.gelu, exact) and the same padding, in value and
    in the gradients of every weight."""
    rng = np.random.default_rng(7)
    B, T, D, H, F_ = 2, 6, 8, 2, 16
    w = {"Wq": randn(rng, D, D), "bq": randn(rng, D), "Wk": randn(rng, D, D), "bk": randn(rng, D),
         "Wv": randn(rng, D, D), "bv": randn(rng, D), "Wo": randn(rng, D, D), "bo": randn(rng, D),
         "g1": randn(rng, D) + 1, "b1": randn(rng, D), "W1": randn(rng, D, F_), "c1": randn(rng, F_),
         "W2": randn(rng, F_, D), "c2": randn(rng, D), "g2": randn(rng, D) + 1, "b2": randn(rng, D)}
    x = randn(rng, B, T, D)
    padded = np.zeros((B, T), bool)
    padded[1, 4:] = True                        # the second sequence has 4 tokens
    mask = np.where(padded, -np.inf, 0.0).astype(np.float32).reshape(B, 1, 1, T)

    def torch_layer(x, mask, Wq, bq, Wk, bk, Wv, bv, Wo, bo, g1, b1, W1, c1, W2, c2, g2, b2):
        layer = torch.nn.TransformerEncoderLayer(D, H, F_, dropout=0.0, activation="gelu",
                                                 batch_first=True)
        params = {"self_attn.in_proj_weight": torch.cat([Wq.T, Wk.T, Wv.T]),
                  "self_attn.in_proj_bias": torch.cat([bq, bk, bv]),
                  "self_attn.out_proj.weight": Wo.T, "self_attn.out_proj.bias": bo,
                  "linear1.weight": W1.T, "linear1.bias": c1, "linear2.weight": W2.T,
                  "linear2.bias": c2, "norm1.weight": g1, "norm1.bias": b1, "norm2.weight": g2,
                  "norm2.bias": b2}
        out = torch.func.functional_call(layer, params, (x,), {"src_key_padding_mask": torch.from_numpy(padded)})
        return torch.where(torch.from_numpy(padded)[..., None], 0.0, out)     # (pads: any value)

    compare(f"where(reshape(mask, [{B}, {T}, 1]) < 0.0, 0.0, bert_layer(x, mask, {', '.join(w)}, {H}, {D // H}))",
            dict(x=x, mask=mask, **w), torch_layer, ("x", *(n for n in w if n != "bk")),
            helpers=BERT_LAYER)           # (bk adds q . bk to a whole row of scores: its gradient is 0)


def test_transformer_block_rejects_an_unknown_kind():
    rng = np.random.default_rng(0)
    p, x = block_params(rng, 8, 2, 2, 4, 16, False), randn(rng, 1, 3, 8)
    prog = driver("""
        import nn
        def out(p: nn/Block, x: f32[1, 3, 8]) -> f32[1, 3, 8]:
          return nn.transformer_block(p, x, "batch")
        """)
    with pytest.raises(dsl.DslError, match='the norm is "layer" or "rms"'):
        prog.out(p, x)


# ---------------------------------------------------------------- sampling

SAMPLE = """
    import nn
    def draws(z: f32[B, V], k: Key, temperature: float, top_k: int, top_p: float) -> i32[B]:
      return nn.sample(z, k, temperature, top_k, top_p)
    def uniforms(k: Key, B: int, V: int) -> f32[B, V]:
      return uniform(k, [B, V])
    """


def hf_filter(z, top_k: int, top_p: float):
    """Hugging Face's top_k_top_p_filtering (transformers 4.x), filtering to -inf."""
    z = z.clone()
    if top_k > 0:
        z[z < torch.topk(z, min(top_k, z.size(-1)))[0][..., -1, None]] = -float("inf")
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(z, descending=True)
        remove = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > top_p
        remove[..., 1:] = remove[..., :-1].clone()        # keep the first token above top_p too
        remove[..., 0] = False
        z[remove.scatter(1, sorted_indices, remove)] = -float("inf")
    return z


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9), (1.3, 20, 0.5), (1.0, 0, 0.0), (1.0, 1, 1.0),
    (1.0, 64, 0.3), (0.5, 3, 0.8)])
def test_sample_is_hugging_faces_filter_and_the_gumbel_max_draw(temperature, top_k, top_p):
    """With the uniforms of the same key, the tokens are those of HF's filter followed by the
    Gumbel-max draw, row by row (distinct scores: no order of ties to agree on)."""
    rng = np.random.default_rng(top_k)
    z = randn(rng, 256, 64, scale=2.0)
    prog = driver(SAMPLE)
    u = torch.from_numpy(prog.uniforms(dsl.key(4), 256, 64))
    kept = hf_filter(torch.from_numpy(z) / temperature, top_k, top_p)
    want = (kept - torch.log(-torch.log(u))).argmax(-1).numpy()
    np.testing.assert_array_equal(prog.draws(z, dsl.key(4), temperature, top_k, top_p), want)


@pytest.mark.parametrize("row, top_k, top_p, drawn", [
    ([1.0, 3.0, 3.0, 2.0, -np.inf], 1, 1.0, {1, 2}),    # ties with the k-th best stay in
    ([1.0, 3.0, 3.0, 2.0, -np.inf], 3, 1.0, {1, 2, 3}),
    ([2.0, 2.0, 2.0, 2.0, 2.0], 4, 1.0, {0, 1, 2, 3, 4}),
    ([0.0, 0.0, 0.0, 0.0], 0, 0.5, {0, 1, 2}),          # 0, 1/4, 1/2 before: at most top_p
    ([0.0, 0.0, 0.0, 0.0], 0, 0.49, {0, 1}),            # equal scores: the lower token first
    ([0.0, 0.0, 0.0, 0.0], 0, 0.0, {0}),
])
def test_sample_keeps_ties_and_orders_them_by_token(row, top_k, top_p, drawn):
    z = np.tile(np.array(row, np.float32), (400, 1))   # 400 draws from one row of scores
    got = driver(SAMPLE).draws(z, dsl.key(0), 1.0, top_k, top_p)
    assert set(got.tolist()) == drawn


@pytest.mark.parametrize("temperature, top_p, message", [
    (0.0, 1.0, "temperature must be positive"), (1.0, 1.5, "top_p is a probability")])
def test_sample_rejects_a_bad_temperature_or_top_p(temperature, top_p, message):
    with pytest.raises(dsl.DslError, match=message):
        driver(SAMPLE).draws(np.zeros((2, 3), np.float32), dsl.key(0), temperature, 0, top_p)
