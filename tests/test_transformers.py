"""The transformer examples (examples/gpt.bend, examples/bert.bend) train like PyTorch twins.

As in tests/test_train.py: each model's first 20 steps under dsl.train run beside a PyTorch
implementation written here, from the same initial weights (dslc's `init`), on the same batches
(the ones dsl.train hands to on_step), with torch.optim.AdamW and the same learning-rate
schedule; the losses must agree to rtol 1e-4. The blocks are tests/lib/test_nn.py's TorchBlock,
which is checked there against nn.transformer_block. Sizes are tiny so the reference
interpreter runs them in seconds; DSLC_SLOW=1 adds the full GPT run of examples/gpt.py's
settings on the CPU backend, and the full BERT run.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dsl
from conftest import slow, warmup_cosine
from dsl.train import Model, step_key
from lib.test_nn import TorchBlock
from test_train import EXAMPLES, run_steps

GPT, BERT = EXAMPLES / "gpt.bend", EXAMPLES / "bert.bend"
sys.path.insert(0, str(EXAMPLES))
import gpt as gpt_loader                                            # noqa: E402


def weights(p) -> dict:
    """dslc's parameters as PyTorch leaves that require grad, the list of blocks included."""
    leaf = lambda a: torch.tensor(np.asarray(a), requires_grad=True)          # noqa: E731
    return {k: [{n: leaf(a) for n, a in b.items()} for b in v] if isinstance(v, list) else leaf(v)
            for k, v in p.items()}


def leaves(w: dict) -> list[torch.Tensor]:
    return [t for v in w.values() for t in ([u for b in v for u in b.values()] if isinstance(v, list) else [v])]


def encoder(w, h, causal: bool, rope: bool):
    """The blocks of either model and its final layer norm."""
    block = TorchBlock("layer", "gelu", causal, rope)
    for b in w["blocks"]:
        h = block(b, h)
    return F.layer_norm(h, (h.shape[-1],), w["norm"])


def gpt_loss(w, b, rope: bool):
    x, y = torch.tensor(b["x"]).long(), torch.tensor(b["y"]).long()
    h = w["wte"][x]
    if not rope:
        h = h + w["wpe"][:x.shape[1]]
    z = encoder(w, h, True, rope) @ w["wte"].T
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))


def scheduled_adamw_twin(loss_fn, p, batches, dims: dict):
    """loss_fn(weights, batch, t) minimised from dslc's weights p by PyTorch's AdamW (betas 0.9,
    0.99; weight decay 0.01) on the schedule of the models' step; (the weights, the losses)."""
    w = weights(p)
    opt = torch.optim.AdamW(leaves(w), betas=(0.9, 0.99), weight_decay=0.01)
    losses = []
    for t, b in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine(t, dims["lr"], dims["warmup"], dims["steps"])
        loss = loss_fn(w, b, t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return w, losses


# ---------------------------------------------------------------- GPT

TINY_GPT = {"D": 16, "L": 2, "H": 4, "G": 2, "lr": 1e-2, "warmup": 5, "steps": 20, "N": 8, "n": 2}


@pytest.mark.parametrize("rope, G", [(True, 2), (False, 4)])
def test_gpt_first_20_steps_match_a_pytorch_twin(rope, G):
    dims = {**TINY_GPT, "rope": rope, "G": G}
    p0, batches, losses = run_steps("gpt", dims=dims, batch_size=4)
    assert p0["wpe"].shape == ((0, 16) if rope else (gpt_loader.DIMS["T"], 16))
    _, want = scheduled_adamw_twin(lambda w, b, t: gpt_loss(w, b, rope), p0, batches, dims)
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    assert losses[-1] < losses[0] - 0.5                                 # and it learns


def test_gpt_samples_with_top_k():
    """top_k = 1 is greedy decoding: the argmax of every step's scores, whatever the key, and so
    is top_p = 0; top_k = 3 draws among the three best only, and a key fixes the draw."""
    dims = {**TINY_GPT, "T": 8, "N": 12, "n": 2, "rope": True}
    model = Model(str(GPT), dims=dims)
    p, _ = model.init(0)
    prog = model.prog

    def sample(top_k, seed, temperature=1.0, top_p=1.0):
        return prog.sample(p, dsl.key(seed), n=2, N=12, T=8, temperature=temperature, top_k=top_k,
                           rope=True, top_p=top_p)

    greedy = sample(1, 0)
    np.testing.assert_array_equal(greedy, sample(1, 1))
    np.testing.assert_array_equal(greedy, sample(0, 2, top_p=0.0))
    w = weights(p)
    ctx = torch.zeros(2, 1, dtype=torch.long)
    with torch.no_grad():
        for i in range(12):                               # the window: at most the last 8 tokens
            z = encoder(w, w["wte"][ctx[:, -8:]], True, True) @ w["wte"].T
            ctx = torch.cat([ctx, z[:, -1].argmax(-1, keepdim=True)], 1)
    np.testing.assert_array_equal(greedy, ctx[:, 1:].numpy())
    a = sample(3, 5)
    np.testing.assert_array_equal(a, sample(3, 5))
    assert not np.array_equal(a, sample(3, 6))


# ---------------------------------------------------------------- BERT

TINY_BERT = {"D": 16, "L": 2, "H": 2, "G": 1, "lr": 1e-2, "warmup": 5, "steps": 20}


def bert_scores(w, x):
    h = w["wte"][torch.as_tensor(x).long()] + w["wpe"]
    return encoder(w, h, False, False) @ w["wte"].T + w["bias"]


def test_bert_first_20_steps_match_a_pytorch_twin():
    """The twin corrupts each batch with the masks of dslc's `corrupt` entry under the key
    dsl.train gave that step (step_key(seed, t)), so both sides see the same inputs."""
    p0, batches, losses = run_steps("bert", dims=TINY_BERT, batch_size=4)
    prog = Model(str(BERT), dims=TINY_BERT).prog
    V = p0["wte"].shape[0]

    def loss(w, b, t):
        inputs, targets = prog.corrupt(step_key(0, t), b["x"], V=V)
        z = bert_scores(w, inputs)
        return F.cross_entropy(z.reshape(-1, V), torch.as_tensor(targets).long().reshape(-1))

    _, want = scheduled_adamw_twin(loss, p0, batches, TINY_BERT)
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    assert losses[-1] < losses[0] - 0.5


def test_bert_corruption_is_15_percent_80_10_10():
    """Over 64,000 positions: 15% chosen; of those 80% [MASK], 10% another token (never
    [MASK]), 10% kept; the targets are the originals there and -100 elsewhere."""
    prog = Model(str(BERT), dims=TINY_BERT).prog
    V = 20
    x = np.random.default_rng(0).integers(0, V - 1, (500, 128)).astype(np.int32)
    inputs, targets = prog.corrupt(dsl.key(3), x, V=V)
    chosen = targets != -100
    np.testing.assert_array_equal(targets[chosen], x[chosen])
    np.testing.assert_array_equal(inputs[~chosen], x[~chosen])
    n = chosen.sum()
    masked, kept = (inputs[chosen] == V - 1).sum(), (inputs[chosen] == x[chosen]).sum()
    within = lambda count, total, q: abs(count / total - q) < 4 * np.sqrt(q * (1 - q) / total)  # noqa: E731
    assert within(n, x.size, 0.15) and within(masked, n, 0.8)
    assert within(kept, n, 0.1 + 0.1 / (V - 1))            # a random token is the original 1 in V - 1
    assert inputs.max() == V - 1 and (inputs[~chosen] < V - 1).all()
    again, _ = prog.corrupt(dsl.key(3), x, V=V)
    np.testing.assert_array_equal(inputs, again)


def test_bert_accuracy_is_the_fraction_of_masked_tokens_guessed():
    model = Model(str(BERT), dims=TINY_BERT)
    p, _ = model.init(0)
    x = np.asarray(model.split("valid").all()["x"][:8])
    V = p["wte"].shape[0]
    inputs, targets = model.prog.corrupt(dsl.key(1), x, V=V)
    with torch.no_grad():
        guess = bert_scores(weights(p), inputs).argmax(-1).numpy()
    chosen = targets != -100
    want = (guess == targets)[chosen].mean()
    np.testing.assert_allclose(model.prog.evaluate(p, x, dsl.key(1))["accuracy"], want, rtol=1e-6)


@pytest.mark.slow
@slow
def test_full_gpt_run_matches_its_twin_within_0_02_nats():
    """examples/gpt.py's settings on the CPU backend, and the twin on the same batches."""
    batches = []
    t0 = time.perf_counter()
    result = dsl.train(str(GPT), device="cpu", progress=sys.stderr, checkpoint_dir=None,
                       on_step=lambda t, b, l: batches.append(b))
    dslc_time = time.perf_counter() - t0
    print(f"\n{result}")
    dims = gpt_loader.DIMS
    t0 = time.perf_counter()
    p0, _ = Model(str(GPT)).init(0)
    w, _ = scheduled_adamw_twin(lambda w, b, t: gpt_loss(w, b, dims["rope"]), p0, batches, dims)
    with torch.no_grad():                             # the mean over every held-out window
        valid = gpt_loader.split_windows("valid")
        twin = gpt_loss(w, valid, dims["rope"]).item()
    twin_time = time.perf_counter() - t0
    got = result.metrics["valid"]["loss"]
    print(f"gpt valid loss: dslc {got:.4f} in {dslc_time:.0f} s (wall, all of dsl.train), "
          f"PyTorch twin {twin:.4f} in {twin_time:.0f} s")
    assert abs(got - twin) < 0.02


@pytest.mark.slow
@slow
def test_full_bert_run_guesses_half_the_masked_characters():
    """examples/bert.py's settings on the CPU backend: the masked-token accuracy on the
    held-out tenth, where always guessing the commonest character (' ') gets 25%."""
    t0 = time.perf_counter()
    result = dsl.train(str(BERT), device="cpu", progress=sys.stderr, checkpoint_dir=None)
    print(f"\n{result}\nbert wall time {time.perf_counter() - t0:.0f} s (all of dsl.train)")
    assert result.metrics["valid"]["accuracy"] >= 0.5
