"""The standard library's `optim` (dsl/lib/optim.bend) against torch.optim.

The optimizers run for several steps on a nested parameter record (a record inside a record,
a vector and a scalar: `map` must reach every leaf), with the same random gradients given to
torch.optim at each step; parameters and optimizer state are compared after every step.
Gradient clipping is compared with torch.nn.utils.clip_grad_norm_, the schedule with
torch.optim.lr_scheduler.

Tolerances
----------
rtol 1e-5 plus an absolute floor of 1e-6 times the largest magnitude of the compared tensor,
as in tests/lib/test_nn.py. An update is a few float32 operations per element, computed in
the same order as PyTorch's kernels (the library mirrors torch.optim's formulas on purpose),
so each step differs by an ulp or two at most, and a few steps stay far below the bound.
Tests that need another bound say why.

The programs run on the reference interpreter, or on the device that the environment
variable DSLC_TEST_DEVICE names (e.g. `cpu`).
"""
from __future__ import annotations

import functools
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import dsl

HERE = Path(__file__).resolve().parent
DEVICE = os.environ.get("DSLC_TEST_DEVICE", "reference")
RTOL, FLOOR = 1e-5, 1e-6
STEPS = 5

MODEL = """
    from optim import sgd, sgd_init, adamw, adamw_init, clip_grad_norm, warmup_cosine

    object Dense { W: f32[I, O], b: f32[O] }
    object Model { dense: Dense, gain: f32[O], scale: f32 }
    """


@functools.lru_cache(maxsize=None)
def driver(source: str) -> dsl.Program:
    """MODEL and `source`, with `optim` resolving to the standard library."""
    text = textwrap.dedent(MODEL) + textwrap.dedent(source)
    return dsl.loads(text, name=str(HERE / "optim_driver.bend"), device=DEVICE)


def close(actual, expected, what: str, rtol: float = RTOL, floor: float = FLOOR) -> None:
    """|actual - expected| <= rtol |expected| + floor max |expected|, entrywise."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    atol = floor * float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


# ---------------------------------------------------------------- a record of parameters

PATHS = (("dense", "W"), ("dense", "b"), ("gain",), ("scale",))


def model(rng) -> dict:
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {"dense": {"W": f(3, 4), "b": f(4)}, "gain": f(4), "scale": f()}


def get(record, path):
    for k in path:
        record = record[k]
    return record


def leaves(record) -> list[np.ndarray]:
    return [np.asarray(get(record, p)) for p in PATHS]


def record(arrays) -> dict:
    W, b, gain, scale = (np.asarray(a, dtype=np.float32) for a in arrays)
    return {"dense": {"W": W, "b": b}, "gain": gain, "scale": scale}


def torch_params(p) -> list[torch.Tensor]:
    return [torch.tensor(a).requires_grad_(True) for a in leaves(p)]


def torch_step(opt, params, grads) -> None:
    for t, g in zip(params, leaves(grads)):
        t.grad = torch.from_numpy(g.copy())
    opt.step()


def compare_params(ours, theirs, what: str) -> None:
    for path, a, t in zip(PATHS, leaves(ours), theirs):
        close(a, t.detach().numpy(), f"{what}: {'.'.join(path)}")


# ---------------------------------------------------------------- SGD

SGD = """
    def init(p: Model) -> Model:
      return sgd_init(p)

    def step(p: Model, g: Model, s: Model, lr: float, momentum: float, wd: float, nesterov: bool) -> (Model, Model):
      return sgd(p, g, s, lr, momentum, wd, nesterov)

    def step_runtime_lr(p: Model, g: Model, s: Model, lr: f32) -> (Model, Model):
      return sgd(p, g, s, lr, momentum=0.9, weight_decay=0.01)
    """


@pytest.mark.parametrize("momentum, wd, nesterov", [
    (0.0, 0.0, False), (0.0, 0.1, False), (0.9, 0.0, False), (0.9, 0.05, False), (0.8, 0.05, True),
])
def test_sgd(momentum, wd, nesterov):
    rng = np.random.default_rng(0)
    prog = driver(SGD)
    p = model(rng)
    s = prog.init(p)
    assert all(np.all(a == 0) for a in leaves(s))
    params = torch_params(p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=momentum, weight_decay=wd, nesterov=nesterov)
    for i in range(STEPS):
        g = model(rng)
        p, s = prog.step(p, g, s, 0.1, momentum, wd, nesterov)
        torch_step(opt, params, g)
        compare_params(p, params, f"step {i + 1}")
        if momentum:
            for a, t in zip(leaves(s), params):
                close(a, opt.state[t]["momentum_buffer"].numpy(), f"step {i + 1}: momentum buffer")


def test_sgd_with_a_runtime_learning_rate():
    """lr as an f32 scalar argument: one specialisation serves every value (a schedule)."""
    rng = np.random.default_rng(1)
    prog = driver(SGD)
    p = model(rng)
    s = prog.init(p)
    params = torch_params(p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    for i, lr in enumerate([0.1, 0.05, 0.2, 0.01]):
        g = model(rng)
        p, s = prog.step_runtime_lr(p, g, s, np.float32(lr))
        opt.param_groups[0]["lr"] = float(np.float32(lr))
        torch_step(opt, params, g)
        compare_params(p, params, f"step {i + 1}")


# ---------------------------------------------------------------- AdamW

ADAMW = """
    def init(p: Model) -> (i32, Model, Model):
      return adamw_init(p)

    def step(p: Model, g: Model, s: (i32, Model, Model), lr: float, beta1: float, beta2: float, eps: float, wd: float) -> (Model, (i32, Model, Model)):
      return adamw(p, g, s, lr, beta1, beta2, eps, wd)

    def step_scheduled(p: Model, g: Model, s: (i32, Model, Model)) -> (Model, (i32, Model, Model)):
      lr = warmup_cosine(s[0], 0.01, 2, 6)
      return adamw(p, g, s, lr)
    """


@pytest.mark.parametrize("lr, beta1, beta2, eps, wd", [
    (1e-3, 0.9, 0.999, 1e-8, 1e-2),             # torch.optim.AdamW's defaults
    (0.05, 0.9, 0.999, 1e-8, 0.0),
    (0.01, 0.8, 0.95, 1e-6, 0.1),
])
def test_adamw(lr, beta1, beta2, eps, wd):
    rng = np.random.default_rng(0)
    prog = driver(ADAMW)
    p = model(rng)
    s = prog.init(p)
    assert int(s[0]) == 0 and all(np.all(a == 0) for a in leaves(s[1]) + leaves(s[2]))
    params = torch_params(p)
    opt = torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd,
                            foreach=False)
    for i in range(STEPS):
        g = model(rng)
        p, s = prog.step(p, g, s, lr, beta1, beta2, eps, wd)
        torch_step(opt, params, g)
        compare_params(p, params, f"step {i + 1}")
        step, m, v = s
        assert step.dtype == np.int32 and int(step) == i + 1
        for a, b, t in zip(leaves(m), leaves(v), params):
            state = opt.state[t]
            assert float(state["step"]) == i + 1
            close(a, state["exp_avg"].numpy(), f"step {i + 1}: exp_avg")
            close(b, state["exp_avg_sq"].numpy(), f"step {i + 1}: exp_avg_sq")


def test_adamw_bias_correction_is_computed_in_f64():
    """1 - beta2 cancels: with beta2 = 0.9999 rounded to float32, 1 - beta2 is off by 1.7e-4
    of its value, and the first update, which divides by its square root, by 8e-5 (more than
    rtol 1e-5). From zero parameters the update is all there is to compare."""
    rng = np.random.default_rng(2)
    prog = driver(ADAMW)
    p = record([np.zeros((3, 4)), np.zeros(4), np.zeros(4), np.zeros(())])
    g = model(rng)
    p1, _ = prog.step(p, g, prog.init(p), 1e-3, 0.9, 0.9999, 1e-8, 0.0)
    params = torch_params(p)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.9999), weight_decay=0.0, foreach=False)
    torch_step(opt, params, g)
    compare_params(p1, params, "step 1")


def test_adamw_with_a_schedule():
    """The learning rate computed in the program from the state's step count, against
    torch.optim.lr_scheduler.LambdaLR with the same schedule."""
    rng = np.random.default_rng(3)
    prog = driver(ADAMW)
    p = model(rng)
    s = prog.init(p)
    params = torch_params(p)
    opt = torch.optim.AdamW(params, lr=0.01, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: hf_cosine(t, 2, 6))
    for i in range(8):
        g = model(rng)
        p, s = prog.step_scheduled(p, g, s)
        torch_step(opt, params, g)
        sched.step()
        compare_params(p, params, f"step {i + 1}")


TRAIN = """
    def loss(p: Model, x: f32[B, 3], y: f32[B, 4]) -> f32:
      h = tanh(x @ p.dense.W + p.dense.b) * p.gain * p.scale
      return mean((h - y) * (h - y))

    #{ A whole training loop as one program: the optimizer state is a fold state. #}
    def train(p: Model, xs: f32[S, B, 3], ys: f32[S, B, 4]) -> (Model, f32[S]):
      s = adamw_init(p)
      losses = fold i in arange(S) with q = p, st = s:
        l, g = value_and_grad(loss, wrt=p)(q, xs[i], ys[i])   # wrt: loss's parameter
        g, n = clip_grad_norm(g, 0.5)
        q, st = adamw(q, g, st, 0.01)
        return l
      return q, losses
    """


def test_a_training_loop_in_the_language():
    """value_and_grad, clip_grad_norm and adamw in a fold over steps, against the same loop in
    PyTorch. The gradients come from each side's own backward pass here, so the two runs also
    differ by the rounding of 6 forward and backward passes; on this small model that stays
    within the usual bound (measured: about 1e-7 relative)."""
    rng = np.random.default_rng(4)
    prog = driver(TRAIN)
    p = model(rng)
    xs = rng.standard_normal((6, 5, 3)).astype(np.float32)
    ys = rng.standard_normal((6, 5, 4)).astype(np.float32)
    q, losses = prog.train(p, xs, ys)

    params = torch_params(p)
    W, b, gain, scale = params
    opt = torch.optim.AdamW(params, lr=0.01, foreach=False)
    want = []
    for x, y in zip(torch.from_numpy(xs), torch.from_numpy(ys)):
        opt.zero_grad()
        h = torch.tanh(x @ W + b) * gain * scale
        l = ((h - y) ** 2).mean()
        l.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=False)
        opt.step()
        want.append(l.item())
    close(losses, np.array(want, np.float32), "losses")
    compare_params(q, params, "after 6 steps")


# ---------------------------------------------------------------- gradient clipping

CLIP = """
    def clip(g: Model, max_norm: float) -> (Model, f32):
      return clip_grad_norm(g, max_norm)
    """


@pytest.mark.parametrize("max_norm, scale", [
    (0.5, 1.0), (2.0, 1.0),             # clipped
    (100.0, 1.0),                       # unchanged
    (1e-6, 1e-4),                       # a norm of 3e-4: its eps of 1e-6 shows
])
def test_clip_grad_norm(max_norm, scale):
    rng = np.random.default_rng(5)
    g = record([a * scale for a in leaves(model(rng))])
    clipped, norm = driver(CLIP).clip(g, max_norm)
    grads = [torch.from_numpy(a.copy()) for a in leaves(g)]
    params = [torch.zeros_like(t, requires_grad=True) for t in grads]
    for t, d in zip(params, grads):
        t.grad = d
    want = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
    close(norm, want.numpy(), "norm")
    for path, a, t in zip(PATHS, leaves(clipped), params):
        close(a, t.grad.numpy(), ".".join(path))
    if max_norm == 100.0:
        for a, b in zip(leaves(clipped), leaves(g)):
            np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- learning-rate schedules

def hf_cosine(step, warmup, total, min_ratio=0.0):
    """Hugging Face's get_cosine_schedule_with_warmup factor, with a floor min_ratio."""
    if step < warmup:
        return step / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1.0 + np.cos(np.pi * progress))


SCHEDULE = """
    def lr(t: i32, peak: float, warmup: int, total: int, floor: float) -> f32:
      return warmup_cosine(t, peak, warmup, total, floor)
    """


@pytest.mark.parametrize("warmup, total, min_lr", [(10, 100, 0.0), (0, 50, 1e-4), (5, 5, 0.0)])
def test_warmup_cosine(warmup, total, min_lr):
    """Against LambdaLR with Hugging Face's formula over every step, past the end too. The
    dslc side computes in float32 (the torch side in float64): near the end the rate is a
    small difference 1 + cos(pi p) of rounded terms, so the bound has an absolute floor of
    1e-6 of the peak rate (a few float32 ulps of it)."""
    prog = driver(SCHEDULE)
    peak = 3e-3
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: hf_cosine(t, warmup, total, min_lr / peak))
    for t in range(total + 10):
        got = prog.lr(np.int32(t), peak, warmup, total, min_lr)
        want = opt.param_groups[0]["lr"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * peak, err_msg=f"step {t}")
        opt.step()
        sched.step()


def test_cosine_part_is_cosine_annealing():
    """After the warmup the schedule is torch's CosineAnnealingLR, shifted by the warmup."""
    prog = driver(SCHEDULE)
    peak, warmup, total, floor = 0.1, 4, 24, 0.01
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=floor)
    for t in range(warmup, total + 1):
        got = prog.lr(np.int32(t), peak, warmup, total, floor)
        np.testing.assert_allclose(got, opt.param_groups[0]["lr"], rtol=1e-5, atol=1e-6 * peak)
        opt.step()
        sched.step()


# ---------------------------------------------------------------- the documented pattern

def test_the_state_pattern_of_the_doc_comment_runs():
    """The entry points that optim.bend's header shows, taken from the file, for a model of
    ours: the state goes out to Python and comes back in as it came out."""
    text = (Path(dsl.__file__).resolve().parent / "lib" / "optim.bend").read_text()
    start = text.index("        from optim import adamw, adamw_init")
    end = text.index("return p, s, l", start) + len("return p, s, l")
    example = textwrap.dedent(text[start:end])
    prog = dsl.loads(textwrap.dedent("""
        object Params { W: f32[D, C], b: f32[C] }

        def loss(p: Params, x: f32[B, D], y: i32[B]) -> f32:
          z = x @ p.W + p.b
          return mean(log(sum(exp(z), axis=-1)) - sum(z * one_hot(y, C), axis=-1))
        """) + example, name=str(HERE / "optim_doc.bend"), device=DEVICE)
    rng = np.random.default_rng(6)
    p = {"W": rng.standard_normal((3, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
    x = rng.standard_normal((5, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=5).astype(np.int32)
    params = [torch.tensor(p["W"]).requires_grad_(True), torch.tensor(p["b"]).requires_grad_(True)]
    opt = torch.optim.AdamW(params, lr=3e-4, foreach=False)
    s = prog.init_state(p)
    for i in range(3):
        p, s, l = prog.step(p, s, x, y)
        opt.zero_grad()
        want = torch.nn.functional.cross_entropy(torch.from_numpy(x) @ params[0] + params[1],
                                                 torch.from_numpy(y).long())
        want.backward()
        opt.step()
        close(l, want.detach().numpy(), f"loss at step {i + 1}")
        close(p["W"], params[0].detach().numpy(), f"W after step {i + 1}")
        close(p["b"], params[1].detach().numpy(), f"b after step {i + 1}")
