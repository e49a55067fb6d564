"""`dslc train` and dsl.train as a user relies on them: every example trains like its PyTorch
twin, checkpoints resume to the bit, a seed fixes a run, and bad configuration is a
diagnostic (exit status 1, no traceback).

The twins: each example's first 20 steps run beside a PyTorch implementation of the same model
written here, from the same initial weights (dslc's `init`, copied), on the same batches (the
ones dsl.train hands to on_step) with the same optimizer (torch.optim.AdamW or plain SGD). The
losses must agree to rtol 1e-4: the two sides round the same math in a different order (dslc's
canonical fma-ordered contractions and lane-tree sums against torch's kernels), about 1e-7
relative per operation, and 20 optimizer steps carry that into the weights; a wrong gradient or
update rule is off by far more at the first step that uses it.
"""
from __future__ import annotations

import errno
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.numpy import save_file

import dsl
from conftest import quick, slow, warmup_cosine
from dsl.progress import Progress
from dsl.safetensors import read_with_metadata
from dsl.train import Model, State, batch_indices, checksum, load_checkpoint, read_npz_data, save_checkpoint
from frontend.diagnostics import DslError
from runtime import cuda

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
XOR = EXAMPLES / "xor.bend"

pytest.importorskip("names", reason="the names examples need the PyPI package 'names'")
pytest.importorskip("sklearn", reason="the digits example needs scikit-learn")


def dslc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsl", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def trained_steps(name: str, steps: int = 20, **kw):
    """dsl.train for a few steps: the initial weights, the batches and the losses it used, and
    the weights it ended with."""
    path = str(EXAMPLES / f"{name}.bend")
    p0, _ = Model(path, dims=kw.get("dims")).init(kw.get("seed") or 0)
    batches, losses = [], []
    result = dsl.train(path, steps=steps, progress=None, final_eval=False,
                       on_step=lambda t, b, l: (batches.append(b), losses.append(l)), **kw)
    return p0, batches, losses, result.params


def run_steps(name: str, steps: int = 20, **kw):
    """dsl.train for a few steps: the initial weights, the batches and the losses it used."""
    return trained_steps(name, steps, **kw)[:3]


def tensors(p: dict) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in p.items()}


# ---------------------------------------------------------------- the PyTorch twins

def xor_twin(p, batches, lr=0.5):
    w = tensors(p)
    opt = torch.optim.SGD(list(w.values()), lr=lr)
    losses = []
    for b in batches:
        x, y = torch.tensor(b["x"]), torch.tensor(b["y"])
        q = torch.sigmoid(torch.tanh(x @ w["W1"] + w["b1"]) @ w["W2"] + w["b2"])[:, 0]
        loss = -(y * torch.log(q + 1e-7) + (1 - y) * torch.log(1 - q + 1e-7)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def mlp_logits(w, x):
    e = w["C"][x]
    return torch.tanh(e.reshape(len(x), -1) @ w["W1"] + w["b1"]) @ w["W2"] + w["b2"]


def mlp_loss(w, b):
    return F.cross_entropy(mlp_logits(w, torch.tensor(b["x"]).long()), torch.tensor(b["y"]).long())


def cnn_loss(w, b):
    x = torch.tensor(b["x"]).permute(0, 3, 1, 2)                   # channels first
    conv = lambda h, K, c: F.conv2d(h, K.permute(3, 2, 0, 1), c, padding=1)   # noqa: E731
    h = F.max_pool2d(F.relu(conv(x, w["K1"], w["c1"])), 2)
    h = F.max_pool2d(F.relu(conv(h, w["K2"], w["c2"])), 2)
    h = h.permute(0, 2, 3, 1).reshape(len(x), -1)                  # flatten channels last
    return F.cross_entropy(h @ w["W"] + w["b"], torch.tensor(b["y"]).long())


def lstm_loss(w, b):
    x, y = torch.tensor(b["x"]).long(), torch.tensor(b["y"]).long()
    H = w["Wh"].shape[0]
    gx = w["Wx"][x.T] + w["b"]                                     # [L, B, 4H]
    h = c = torch.zeros(x.shape[0], H)
    hs = []
    for t in range(x.shape[1]):
        i, f, g, o = (gx[t] + h @ w["Wh"]).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    s = torch.stack(hs) @ w["Wo"] + w["bo"]
    return F.cross_entropy(s.reshape(-1, s.shape[-1]), y.T.reshape(-1), ignore_index=-100)


def adamw_twin(loss_fn, p, batches, lr):
    w = tensors(p)
    opt = torch.optim.AdamW(list(w.values()), lr=lr, weight_decay=0.01)
    losses = []
    for b in batches:
        loss = loss_fn(w, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


TWINS = {
    "xor": lambda p, b: xor_twin(p, b),
    "names_mlp": lambda p, b: adamw_twin(mlp_loss, p, b, lr=0.005),
    "cnn_digits": lambda p, b: adamw_twin(cnn_loss, p, b, lr=0.003),
    "lstm_chars": lambda p, b: adamw_twin(lstm_loss, p, b, lr=0.01),
}


@pytest.mark.parametrize("name", TWINS)
def test_first_20_steps_match_a_pytorch_twin(name):
    p0, batches, losses = run_steps(name)
    want = TWINS[name](p0, batches)
    assert len(batches) == 20
    np.testing.assert_allclose(losses, want, rtol=1e-4)
    assert losses[-1] < losses[0]                                  # and it learns


BLOCKS = ("block1", "block2")
RESNET_BNS = ("bn", *(f"{b}.{n}" for b in BLOCKS for n in ("bn1", "bn2")))


def leaf(p: dict, name: str):
    """p's leaf at a dotted name: leaf(p, "block1.bn1")."""
    for part in name.split("."):
        p = p[part]
    return p


class ResNetTwin:
    """resnet_digits in PyTorch: the same weights with its convolutions functional (channels
    last, as dslc holds them) and its batch norms torch.nn.BatchNorm2d (momentum 0.1, eps 1e-5)."""

    def __init__(self, p: dict):
        self.w = tensors({name: leaf(p, name) for name in ("K", "W", "b", *(f"{b}.{k}" for b in BLOCKS
                                                                             for k in ("K1", "K2")))})
        self.bns = {name: torch.nn.BatchNorm2d(len(leaf(p, name)["weight"]), momentum=0.1, eps=1e-5)
                    for name in RESNET_BNS}
        with torch.no_grad():
            for name, bn in self.bns.items():
                for field, v in leaf(p, name).items():
                    getattr(bn, field).copy_(torch.tensor(np.asarray(v)))

    def conv_bn(self, h, K: str, bn: str):
        return self.bns[bn](F.conv2d(h, self.w[K].permute(3, 2, 0, 1), padding=1))

    def block(self, h, name: str):
        z = F.relu(self.conv_bn(h, f"{name}.K1", f"{name}.bn1"))
        return F.relu(h + self.conv_bn(z, f"{name}.K2", f"{name}.bn2"))

    def logits(self, x: np.ndarray):
        h = F.relu(self.conv_bn(torch.tensor(x).permute(0, 3, 1, 2), "K", "bn"))
        h = self.block(F.max_pool2d(self.block(h, "block1"), 2), "block2")
        return h.mean(dim=(2, 3)) @ self.w["W"] + self.w["b"]

    def loss(self, b: dict):
        return F.cross_entropy(self.logits(b["x"]), torch.tensor(b["y"]).long())

    def train(self, batches: list[dict], lr) -> list[float]:
        """AdamW over the weights and the batch norms' weight and bias, lr(t) at step t."""
        trained = [*self.w.values(), *(q for bn in self.bns.values() for q in bn.parameters())]
        opt = torch.optim.AdamW(trained, weight_decay=0.01)
        losses = []
        for t, b in enumerate(batches):
            opt.param_groups[0]["lr"] = lr(t)
            loss = self.loss(b)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses


def resnet_loader():
    sys.path.insert(0, str(EXAMPLES))
    import resnet_digits
    return resnet_digits


def test_resnet_and_its_batch_norms_match_a_pytorch_twin():
    """The first 20 steps' losses, the running statistics they leave and evaluate's metrics on
    the test split (by those statistics) agree with torch.nn.BatchNorm2d's."""
    p0, batches, losses, p = trained_steps("resnet_digits", device="cpu")
    twin = ResNetTwin(p0)
    dims = resnet_loader().DIMS
    lr = lambda t: warmup_cosine(t, dims["lr"], dims["warmup"], dims["steps"])   # noqa: E731
    np.testing.assert_allclose(losses, twin.train(batches, lr), rtol=1e-4)
    assert losses[-1] < losses[0]
    for name, bn in twin.bns.items():
        for field in ("running_mean", "running_var"):
            np.testing.assert_allclose(leaf(p, name)[field], getattr(bn, field).numpy(), rtol=1e-4,
                                       atol=1e-6, err_msg=f"{name}.{field}")
    loader = resnet_loader()
    test = loader.rows("test", np.arange(loader.size("test")), 0, 1)
    got = dsl.load(str(EXAMPLES / "resnet_digits.bend"), device="cpu").evaluate(p, test["x"], test["y"])
    with torch.no_grad():
        for bn in twin.bns.values():
            bn.eval()
        loss, scores = twin.loss(test).item(), twin.logits(test["x"]).numpy()
    np.testing.assert_allclose(got["loss"], loss, rtol=1e-4)
    assert got["accuracy"] == np.float32(np.mean(scores.argmax(-1) == test["y"]))


def test_resnet_buffers_have_no_gradient_and_adamw_leaves_them():
    """grad gives the running statistics zeros; update (AdamW), given a gradient of ones even
    for them, moves every trained leaf and leaves the buffers' bits as they were."""
    model = Model(str(EXAMPLES / "resnet_digits.bend"), dims={"C": 4}, device="cpu")
    p, s = model.init(0)
    batch = model.split("train").fetch(np.arange(16))
    _, g, _ = model.gradient(p, batch, dsl.key(0))
    ones = lambda t: {k: ones(v) for k, v in t.items()} if isinstance(t, dict) else np.ones_like(t)  # noqa: E731
    after, _ = model.update(p, (np.int32(200), *s[1:]), ones(g), 200)    # past the warm-up
    for name in RESNET_BNS:
        for field in ("running_mean", "running_var"):
            assert not np.any(leaf(g, name)[field]), f"{name}.{field}"
            assert leaf(after, name)[field].tobytes() == leaf(p, name)[field].tobytes()
        assert np.any(leaf(g, name)["weight"]) and np.all(leaf(after, name)["weight"] != leaf(p, name)["weight"])
    assert np.all(after["K"] != p["K"])


def test_resnet_trains_and_its_checkpoint_keeps_the_running_statistics(tmp_path):
    """A few small steps: the running statistics move off batch_norm_init's 0 and 1, evaluate
    reports by them, and the final checkpoint holds them to the bit and resumes with them."""
    path = str(EXAMPLES / "resnet_digits.bend")
    r = dsl.train(path, steps=4, dims={"C": 4}, batch_size=16, device="cpu", progress=None,
                  checkpoint_dir=str(tmp_path))
    assert set(r.metrics["test"]) == {"loss", "accuracy"}
    for name in RESNET_BNS:
        assert np.all(leaf(r.params, name)["running_mean"] != 0) and np.all(leaf(r.params, name)["running_var"] != 1)
    saved = checkpoint_arrays(tmp_path / "step0000004.safetensors")
    assert saved["p.block2.bn2.running_var"].tobytes() == r.params["block2"]["bn2"]["running_var"].tobytes()
    model = Model(path, dims={"C": 4}, device="cpu")
    p, s = model.init(0)
    back = load_checkpoint(str(tmp_path / "step0000004.safetensors"), model, State(p, s, 0, 0))
    assert same_bits(back.p, r.params) and same_bits(back.s, r.opt_state)


# ---------------------------------------------------------------- checkpoints and seeds

def same_bits(a, b) -> bool:
    fa, fb = dsl.values.flatten_python(a, "v"), dsl.values.flatten_python(b, "v")
    return fa.keys() == fb.keys() and all(fa[k].dtype == fb[k].dtype and
                                          np.array_equal(fa[k], fb[k]) for k in fa)


def test_an_interrupted_run_resumes_to_the_same_bits(tmp_path):
    path = str(EXAMPLES / "names_mlp.bend")
    straight = dsl.train(path, steps=6, seed=3, progress=None, final_eval=False)

    def interrupt(t, batch, loss):
        if t == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dsl.train(path, steps=6, seed=3, progress=None, final_eval=False, on_step=interrupt,
                  checkpoint_dir=str(tmp_path))
    ckpt = tmp_path / "step0000003.safetensors"
    tensors, meta = read_with_metadata(ckpt)
    assert meta["step"] == "3" and meta["seed"] == "3" and meta["format"] == "dslc-train-2"
    assert {"p.C", "p.W1", "p.b1", "p.W2", "p.b2", "opt[0]", "opt[1].W1", "opt[2].W1"} <= set(tensors)
    assert tensors["p.W1"].shape == (30, 200) and tensors["loss"].shape == (3,)
    resumed = dsl.train(path, steps=6, resume=str(ckpt), progress=None, final_eval=False)
    assert resumed.start_step == 3 and resumed.steps == 6
    assert same_bits(resumed.params, straight.params)
    assert same_bits(resumed.opt_state, straight.opt_state)
    assert resumed.losses == straight.losses


def test_a_seed_fixes_the_run_to_the_bit():
    path = str(EXAMPLES / "names_mlp.bend")
    a = dsl.train(path, steps=3, seed=11, progress=None, final_eval=False)
    b = dsl.train(path, steps=3, seed=11, progress=None, final_eval=False)
    c = dsl.train(path, steps=3, seed=12, progress=None, final_eval=False)
    assert same_bits(a.params, b.params) and a.losses == b.losses
    assert not np.array_equal(a.params["W1"], c.params["W1"])


def test_the_batches_are_a_function_of_seed_and_step():
    assert np.array_equal(batch_indices(5, 7, 1000, 32), batch_indices(5, 7, 1000, 32))
    assert not np.array_equal(batch_indices(5, 7, 1000, 32), batch_indices(5, 8, 1000, 32))
    assert all(np.array_equal(batch_indices(5, 7, 10, size), np.arange(10)) for size in (0, 10, 11))


def checkpoint_arrays(path: Path) -> dict[str, np.ndarray]:
    return read_with_metadata(path)[0]


def test_cli_seed_and_resume(tmp_path):
    runs = {}
    for name, args in {"a": ["--seed", "7", "--steps", "40"], "b": ["--seed", "7", "--steps", "40"],
                       "c": ["--seed", "8", "--steps", "40"], "half": ["--seed", "7", "--steps", "20"]}.items():
        r = dslc("train", str(XOR), *args, "--checkpoint-dir", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        runs[name] = tmp_path / name / f"step{int(args[3]):07d}.safetensors"
    r = dslc("train", str(XOR), "--resume", str(runs["half"]), "--steps", "40",
             "--checkpoint-dir", str(tmp_path / "resumed"))
    assert r.returncode == 0, r.stderr
    assert "resumed at step 20" in r.stdout and "accuracy" in r.stdout
    a, b, c = (checkpoint_arrays(runs[k]) for k in "abc")
    resumed = checkpoint_arrays(tmp_path / "resumed" / "step0000040.safetensors")
    for k in a:
        if k.startswith("p."):
            assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], resumed[k])
    assert not np.array_equal(a["p.W1"], c["p.W1"])


def test_report_plot_and_data_file(tmp_path):
    data = tmp_path / "xor.npz"
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    np.savez(data, **{"train.x": x, "train.y": np.array([0, 1, 1, 0], np.float32),
                      "valid.x": x, "valid.y": np.array([0, 1, 1, 0], np.float32)})
    plot = tmp_path / "loss.png"
    r = dslc("train", str(XOR), "--data", str(data), "--steps", "30", "--checkpoint-dir", "",
             "--plot", str(plot), "--hyper", "lr=1.0")
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout and "valid" in r.stdout and "accuracy" in r.stdout
    assert f"  plot        {plot}" in r.stdout
    first, last = r.stderr.splitlines()                    # not a terminal: no bar, two lines
    assert first.startswith(f"training {XOR} for 30 steps from step 0")
    assert re.fullmatch(r"step 30/30 loss 0\.[0-9]+ [0-9.]+ steps/s", last)
    image = matplotlib.image.imread(plot)
    assert image.shape == (675, 1200, 4)                   # 8 x 4.5 inches at 150 dpi, RGBA
    colours = {tuple(c) for c in (image[..., :3] * 255).round().astype(int).reshape(-1, 3)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours   # training line, validation markers


# ---------------------------------------------------------------- the plot and the progress

def test_a_plot_without_matplotlib_says_how_to_install_it(tmp_path):
    hide = "import sys; sys.modules['matplotlib'] = None; from dsl.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", hide, "train", str(XOR), "--plot", str(tmp_path / "l.png"),
                        "--checkpoint-dir", str(tmp_path / "ck")], capture_output=True, text=True, timeout=300)
    user_error(r, "a loss plot needs matplotlib, which is not installed: pip install 'dslc[plot]'")
    assert "training" not in r.stderr and not (tmp_path / "ck").exists()


@pytest.mark.parametrize("where, fault", [
    ("missing/loss.png", "the folder {tmp}/missing does not exist"),
    ("", "it is a directory"),
    ("loss.XYZ", "matplotlib writes .*\\.png, .*, not \\.XYZ"),
    ("loss", "matplotlib writes .*\\.pdf, .*\\.png, .*\\.svg, .*, not a file without an extension"),
    ("/sys/loss.png", "Permission denied"),                # not writable, even by root
])
def test_a_bad_plot_path_is_refused_before_training(tmp_path, where, fault):
    plot = str(tmp_path / where)
    with pytest.raises(DslError, match=re.escape(f"cannot write the plot {plot}: ") + fault.format(tmp=tmp_path)):
        dsl.train(str(XOR), steps=2, plot=plot, checkpoint_dir=str(tmp_path / "ck"), progress=None)
    assert not (tmp_path / "ck").exists()


def test_another_runs_checkpoints_are_kept_unless_resumed_or_overwritten(tmp_path):
    ck = tmp_path / "ck"
    assert dslc("train", str(XOR), "--steps", "2", "--checkpoint-dir", str(ck)).returncode == 0
    user_error(dslc("train", str(XOR), "--steps", "3", "--checkpoint-dir", str(ck)),
               f"error: {ck} already holds another run's checkpoints (the last is step0000002.safetensors): "
               f"give --resume {ck / 'step0000002.safetensors'} to go on from it, or --overwrite to delete them")
    assert sorted(p.name for p in ck.iterdir()) == ["step0000002.safetensors"]
    dsl.train(str(XOR), steps=4, resume=str(ck / "step0000002.safetensors"), checkpoint_dir=str(ck), progress=None)
    assert sorted(p.name for p in ck.iterdir()) == ["step0000002.safetensors", "step0000004.safetensors"]
    assert dslc("train", str(XOR), "--steps", "3", "--checkpoint-dir", str(ck), "--overwrite").returncode == 0
    assert sorted(p.name for p in ck.iterdir()) == ["step0000003.safetensors"]


def test_training_goes_on_after_an_evaluation(tmp_path):
    """The evaluations in the loop once took the name of the micro-batch count, so the step
    after the first one crashed (the README's first command)."""
    result = dsl.train(str(quick(tmp_path, EXAMPLES / "names_mlp.bend", eval_every=1)), steps=3,
                       device="cpu", checkpoint_dir=None, progress=None, final_eval=False)
    assert [s for s, _ in result.evals] == [1, 2] and len(result.losses) == 3


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_the_loss_and_the_rate():
    term = Terminal()
    dsl.train(str(XOR), steps=30, progress=term, final_eval=False)
    assert f"training {XOR} for 30 steps from step 0" in term.getvalue()
    last = term.getvalue().split("\r")[-1]
    assert re.fullmatch(r"100%\|[#█]+\| 30/30 \[[0-9:]+<00:00, [0-9.]+ steps/s, loss 0\.[0-9]+\]\n", last), last


def test_a_log_gets_a_line_every_interval_and_at_each_evaluation():
    log, now, evaluating = io.StringIO(), [0.0], 0.0
    bar = Progress(log, 0, 1000, clock=lambda: now[0], interval=30.0)
    for done in range(1, 1001):
        now[0] += 0.125                                    # 8 steps/s
        if done == 500:
            now[0] += 2.5                                  # an evaluation, left out of the rate
            evaluating = 2.5
        bar.update(done, 2.0, "valid loss 1.5" if done == 500 else None, evaluating)
    assert log.getvalue().splitlines() == [
        "step 240/1000 loss 2.0 8.0 steps/s",
        "step 480/1000 loss 2.0 8.0 steps/s",
        "step 500/1000 loss 2.0 valid loss 1.5 8.0 steps/s",
        "step 740/1000 loss 2.0 8.0 steps/s",
        "step 980/1000 loss 2.0 8.0 steps/s",
        "step 1000/1000 loss 2.0 8.0 steps/s"]


# ---------------------------------------------------------------- diagnostics

def user_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


def model_copy(tmp_path: Path, bend: str, loader: str | None) -> Path:
    path = tmp_path / "m.bend"
    path.write_text(bend)
    if loader is not None:
        (tmp_path / "m.py").write_text(loader)
    return path


XOR_LOADER = (EXAMPLES / "xor.py").read_text()
XOR_X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
XOR_Y = np.array([0, 1, 1, 0], np.float32)


def test_missing_hooks(tmp_path):
    src = XOR.read_text().split("def step(")[0]
    user_error(dslc("train", str(model_copy(tmp_path, src, XOR_LOADER))), "defines no 'step'",
               "init (the parameters), loss (the objective) and step")


def test_missing_data(tmp_path):
    user_error(dslc("train", str(model_copy(tmp_path, XOR.read_text(), None))),
               "has no data", "load(split)")


def test_wrong_shape_from_the_loader(tmp_path):
    loader = XOR_LOADER.replace("X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)",
                                "X = np.zeros((4, 3), np.float32)")
    user_error(dslc("train", str(model_copy(tmp_path, XOR.read_text(), loader))),
               "m.bend", "the batch from", "x: f32[4, 3]")


def test_loader_arrays_of_different_lengths(tmp_path):
    loader = XOR_LOADER.replace('return {"x": X, "y": Y}', 'return {"x": X, "y": Y[:3]}')
    user_error(dslc("train", str(model_copy(tmp_path, XOR.read_text(), loader))),
               "the same number (> 0) of examples", "x: f32[4, 2], y: f32[3]")


def test_loader_that_raises(tmp_path):
    loader = XOR_LOADER.replace("def load(split: str) -> dict[str, np.ndarray] | None:\n",
                                "def load(split: str) -> dict[str, np.ndarray] | None:\n"
                                "    raise FileNotFoundError('digits.csv')\n")
    user_error(dslc("train", str(model_copy(tmp_path, XOR.read_text(), loader))),
               "load('train') failed at line", "FileNotFoundError: digits.csv")


# where the loader itself fails, the message gives the line; resnet_digits's load is cnn_digits's
@pytest.mark.parametrize("example, package, failed", [
    ("names_mlp", "names", "failed at line "), ("lstm_chars", "names", "failed at line "),
    ("cnn_digits", "scikit-learn", "failed at line "), ("resnet_digits", "scikit-learn", "failed: ")])
def test_an_example_without_its_extra_says_how_to_install_it(tmp_path, example, package, failed):
    for module in ("names", "sklearn"):           # found before the installed ones, and unimportable
        (tmp_path / f"{module}.py").write_text("raise ImportError('hidden by the test')\n")
    r = subprocess.run([sys.executable, "-m", "dsl", "train", str(EXAMPLES / f"{example}.bend"), "--steps", "1",
                        "--checkpoint-dir", ""], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    user_error(r, f"examples/{example}.py size('train') {failed}",
               f": ImportError: this example needs the PyPI package '{package}': pip install 'dslc[examples]' "
               f"(or pip install {package})")


def test_a_parameter_nobody_gives(tmp_path):
    loader = XOR_LOADER.replace('HYPER = {"lr": 0.5}', "HYPER = {}")
    user_error(dslc("train", str(model_copy(tmp_path, XOR.read_text(), loader))),
               "no value for 'lr' of 'step'", "m.bend:", "available: the batch: x, y")


def test_checkpoint_of_another_model(tmp_path):
    r = dslc("train", str(XOR), "--steps", "2", "--checkpoint-dir", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    ckpt = tmp_path / "a" / "step0000002.safetensors"
    user_error(dslc("train", str(XOR), "--dims", "H=4", "--resume", str(ckpt)),
               "is not of this model", "its 'p.W1' is f32[2, 8], xor.bend (init, init_opt) makes f32[2, 4]")
    names = EXAMPLES / "names_mlp.bend"
    user_error(dslc("train", str(names), "--resume", str(ckpt), "--steps", "1"),
               "is not of this model", "it has no 'p.C'")
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    user_error(dslc("train", str(XOR), "--resume", str(other)), "not a dslc train checkpoint")
    user_error(dslc("train", str(XOR), "--resume", str(tmp_path / "nope.safetensors")), "cannot resume from",
               "No such file")


def test_resume_with_another_seed_is_refused(tmp_path):
    r = dslc("train", str(XOR), "--steps", "2", "--seed", "1", "--checkpoint-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    user_error(dslc("train", str(XOR), "--resume", str(tmp_path / "step0000002.safetensors"), "--seed", "2"),
               "was trained with seed 1, not 2")


@pytest.mark.skipif(cuda.usable(), reason="this machine has a GPU")
def test_training_on_a_missing_gpu_says_why():
    r = dslc("train", str(XOR), "--device", "cuda", "--checkpoint-dir", "")
    assert r.returncode == 1 and "error: device 'cuda' is not usable: " in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--steps", "-3"], "expected a count"),
    (["--hyper", "lr"], "expected NAME=NUMBER"),
])
def test_usage_errors_exit_2(args, message):
    r = dslc("train", str(XOR), *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_a_learning_rate_schedule_keeps_the_steps_signature_and_its_bits(tmp_path):
    """A hyper(t) whose learning rate changes each step: the step's calls keep one signature
    (the fast path of dsl/fastcall.py), with the bits of calls given the rate as a number."""
    loader = XOR_LOADER.replace('HYPER = {"lr": 0.5}', "def hyper(t):\n    return {'lr': 0.5 / (1 + t)}")
    model = Model(str(model_copy(tmp_path, XOR.read_text(), loader)), device="cpu")
    p, _ = model.init(0)
    q = p
    for t in range(4):
        p, _, loss = model.step(p, None, {"x": XOR_X, "y": XOR_Y}, t, 0)
        q, want = model.prog.step(dict(q), XOR_X, XOR_Y, 0.5 / (1 + t))
        assert same_bits(p, q) and loss == float(want)
    # the model's signature, and the numbers' (each a float, held by its type)
    assert [len(known) for known in model.prog._signatures["step"]._known.values()] == [1, 1]


def test_checkpoint_loader_checks_dtype_and_shape(tmp_path):
    model = Model(str(XOR))
    p, s = model.init(0)
    save_checkpoint(tmp_path / "c.safetensors", State(p, s, 0, 0), model)
    back = load_checkpoint(str(tmp_path / "c.safetensors"), model, State(p, s, 0, 0))
    assert same_bits(back.p, p)


LEAVES = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "f64": np.array([np.pi, -0.0, np.inf]),
          "f16": np.array([1.5, -2.0], np.float16), "i32": np.array([-2 ** 31, 0, 2 ** 31 - 1], np.int32),
          "i64": np.array([-2 ** 63, 2 ** 63 - 1]), "bool": np.array([True, False, True]),
          "scalar": np.float32(2.5), "int_scalar": np.int32(-7), "empty": np.zeros((0, 4), np.float32),
          "strided": np.arange(12, dtype=np.float32).reshape(3, 4).T}


def test_every_leaf_round_trips_to_the_bit(tmp_path):
    """A checkpoint of every kind of leaf a model's state has: each dtype, a key (u32 words),
    scalars, an empty array, a transposed view; read back with its dtype, shape and bits."""
    model = Model(str(XOR), device="reference")
    p = dsl.Record("Leaves", dict(LEAVES))
    s = (np.int32(4), {"k": dsl.key(2 ** 64 - 1), "m": [np.float32(0.5), np.zeros(2, np.float64)]})
    save_checkpoint(tmp_path / "c.safetensors", State(p, s, 2, 2 ** 64 - 1, [0.25, 0.125], [(1, 0.5)]), model)
    back = load_checkpoint(str(tmp_path / "c.safetensors"), model, State(p, s, 0, 0))
    assert same_bits(back.p, p) and same_bits(back.s, s)
    assert isinstance(back.p, dsl.Record) and isinstance(back.s[1]["k"], dsl.Key)
    assert back.s[1]["k"].words.dtype == np.uint32 and back.s[1]["k"] == dsl.key(2 ** 64 - 1)
    assert (back.step, back.seed, back.losses, back.evals) == (2, 2 ** 64 - 1, [0.25, 0.125], [(1, 0.5)])


# ---------------------------------------------------------------- damaged checkpoints, failed writes

@pytest.fixture(scope="module")
def xor_checkpoint(tmp_path_factory):
    """XOR's model, a checkpoint of it after 3 steps, and that checkpoint's tensors and metadata."""
    model = Model(str(XOR), device="reference")
    p, s = model.init(0)
    path = tmp_path_factory.mktemp("ckpt") / "good.safetensors"
    save_checkpoint(path, State(p, s, 3, 5, [0.7, 0.6, 0.5], [(2, 0.65)]), model)
    return model, path, *read_with_metadata(path)


def resume_error(model: Model, path: Path, fault: str) -> None:
    p, s = model.init(0)
    with pytest.raises(DslError, match=f"^error: cannot resume from {re.escape(str(path))}: {fault}"):
        load_checkpoint(str(path), model, State(p, s, 0, 0))


def rewrite(path: Path, tensors: dict, meta: dict) -> Path:
    """A checkpoint as another writer might make it: any tensors and metadata, its crc32 theirs."""
    save_file(tensors, str(path), metadata={**meta, "crc32": checksum(tensors, meta)})
    return path


def legacy_npz(path: Path, tensors: dict, meta: dict) -> Path:
    """The .npz checkpoint that earlier versions wrote (format dslc-train-1) of the same state."""
    np.savez(path, **tensors, step=np.int64(meta["step"]), seed=np.uint64(meta["seed"]),
             model=np.str_(meta["model"]), format=np.str_("dslc-train-1"))
    return path


OTHER = r"it is not of this model \(it was saved by xor.bend\): "


def without(arrays: dict, name: str) -> dict:
    return {k: a for k, a in arrays.items() if k != name}


@pytest.mark.parametrize("change, fault", [
    (lambda t, m: (t, without(m, "step")), "it has no 'step'"),
    (lambda t, m: (t, without(m, "seed")), "it has no 'seed'"),
    (lambda t, m: (t, without(m, "model")), "it has no 'model'"),
    (lambda t, m: (without(t, "loss"), m), "it has no 'loss'"),
    (lambda t, m: (without(t, "valid.loss"), m), "it has no 'valid.loss'"),
    (lambda t, m: (t, without(m, "format")), "it is not a dslc train checkpoint"),
    (lambda t, m: (t, {**m, "format": "dslc-train-1"}), r"it is not a dslc train checkpoint \(it has no format 'dslc-train-2'\)"),
    (lambda t, m: ({"x": np.zeros(3)}, {}), "it is not a dslc train checkpoint"),
    (lambda t, m: (without(t, "p.W1"), m), OTHER + "it has no 'p.W1'"),
    (lambda t, m: ({**t, "p.W1": t["p.W1"].astype(np.float64)}, m), OTHER + r"its 'p.W1' is f64\[2, 8\], xor.bend .* makes f32\[2, 8\]"),
    (lambda t, m: ({**t, "p.b1": t["p.b1"][:3]}, m), OTHER + r"its 'p.b1' is f32\[3\], xor.bend .* makes f32\[8\]"),
    (lambda t, m: ({**t, "junk": np.zeros(2)}, m), r"it has 'junk', which no checkpoint has"),
    (lambda t, m: ({**t, "p.W3": np.zeros(2)}, m), OTHER + r"it has 'p.W3', which xor.bend \(init, init_opt\) does not have"),
    (lambda t, m: (t, {**m, "step": "3.0"}), r"its 'step' is '3.0', not a whole number"),
    (lambda t, m: (t, {**m, "step": "-1"}), r"its 'step' is '-1', not a whole number"),
    (lambda t, m: (t, {**m, "step": ""}), r"its 'step' is '', not a whole number"),
    (lambda t, m: (t, {**m, "step": "٣"}), r"its 'step' is '٣', not a whole number"),
    (lambda t, m: (t, {**m, "step": "9" * 5000}), r"its 'step' is '9{10,}\.\.\.9+', not a whole number"),
    (lambda t, m: (t, {**m, "step": str(2 ** 62)}), r"its 'step' is 4611686018427387904 but it has 3 steps' losses"),
    (lambda t, m: (t, {**m, "step": "1"}), r"its 'step' is 1 but it has 3 steps' losses"),
    (lambda t, m: (t, {**m, "seed": "0x5"}), r"its 'seed' is '0x5', not a whole number"),
    (lambda t, m: (t, {**m, "seed": str(2 ** 64)}), r"its 'seed' is 18446744073709551616, not in \[0, 2\*\*64\)"),
    (lambda t, m: ({**t, "loss": t["loss"].reshape(1, 3)}, m), r"its 'loss' is f32\[1, 3\], not a vector of floats"),
    (lambda t, m: ({**t, "valid.step": np.float32([2])}, m), r"its 'valid.step' is f32\[1\], not a vector of integers"),
    (lambda t, m: ({**t, "valid.step": np.int64([1, 2])}, m), r"it has 2 'valid.step' but 1 'valid.loss'"),
])
def test_a_checkpoint_with_wrong_contents_cannot_be_resumed(xor_checkpoint, tmp_path, change, fault):
    model, _, tensors, meta = xor_checkpoint
    resume_error(model, rewrite(tmp_path / "bad.safetensors", *change(dict(tensors), without(meta, "crc32"))), fault)


@pytest.mark.parametrize("change", [
    lambda t, m: ({**t, "p.W1": t["p.W1"] * 2}, m),
    lambda t, m: ({**t, "p.W1": t["p.W1"].T.copy()}, m),
    lambda t, m: (t, {**m, "seed": "6"}),
    lambda t, m: (t, without(m, "crc32")),
])
def test_contents_that_do_not_match_their_crc32_are_refused(xor_checkpoint, tmp_path, change):
    model, _, tensors, meta = xor_checkpoint
    tensors, changed = change(dict(tensors), dict(meta))
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=changed)
    fault = "its contents do not match its crc32" if "crc32" in changed else "it has no 'crc32'"
    resume_error(model, tmp_path / "bad.safetensors", fault)


def test_an_npz_checkpoint_of_earlier_versions_resumes(xor_checkpoint, tmp_path):
    model, _, tensors, meta = xor_checkpoint
    p, s = model.init(0)
    state = load_checkpoint(str(legacy_npz(tmp_path / "old.npz", tensors, meta)), model, State(p, s, 0, 0))
    assert (state.step, state.seed, state.losses, state.evals) == (3, 5, tensors["loss"].tolist(), [(2, 0.65)])
    assert same_bits(state.p, checkpoint_params(tensors))


@pytest.mark.parametrize("change, fault", [
    (lambda a: without(a, "format"), r"it is not a dslc train checkpoint \(it has no format 'dslc-train-1'\)"),
    (lambda a: {**a, "format": np.int64(1)}, "it is not a dslc train checkpoint"),
    (lambda a: {**a, "format": np.array(["dslc-train-1"] * 2)}, "it is not a dslc train checkpoint"),
    (lambda a: without(a, "model"), "it has no 'model'"),
    (lambda a: {**a, "step": np.float64(3.0)}, r"its 'step' is f64\[\], not a scalar of integers"),
    (lambda a: {**a, "step": np.str_("3")}, r"its 'step' is <U1\[\], not a scalar of integers"),
    (lambda a: {**a, "step": np.int64([3, 3])}, r"its 'step' is i64\[2\], not a scalar"),
    (lambda a: {**a, "step": np.int64(-1)}, r"its 'step' is '-1', not a whole number"),
    (lambda a: {**a, "seed": np.int64(-5)}, r"its 'seed' is '-5', not a whole number"),
    (lambda a: {**a, "model": np.float32(1)}, r"its 'model' is f32\[\], not a scalar of text"),
    (lambda a: {**a, "p.b1": a["p.b1"][:3]}, OTHER + r"its 'p.b1' is f32\[3\], xor.bend .* makes f32\[8\]"),
])
def test_an_npz_checkpoint_with_wrong_members_cannot_be_resumed(xor_checkpoint, tmp_path, change, fault):
    model, _, tensors, meta = xor_checkpoint
    arrays = dict(np.load(legacy_npz(tmp_path / "old.npz", tensors, meta)))
    np.savez(tmp_path / "bad.npz", **change(arrays))
    resume_error(model, tmp_path / "bad.npz", fault)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_a_damaged_checkpoint_cannot_be_resumed(xor_checkpoint, tmp_path, suffix):
    """Cut at many points, bits flipped: refused with a diagnostic, or (where the flip is in a
    byte the reader ignores) read to exactly the saved state."""
    model, good, tensors, meta = xor_checkpoint
    if suffix == ".npz":
        good = legacy_npz(tmp_path / "good.npz", tensors, meta)
    p, s = model.init(0)
    raw = good.read_bytes()
    rng = np.random.default_rng(1)
    damaged = [raw[:n] for n in (0, 1, 7, 8, 9, 21, 22, 100, len(raw) // 3, len(raw) // 2, len(raw) - 23, len(raw) - 1)]
    for _ in range(150):
        b = bytearray(raw)
        b[rng.integers(len(b))] ^= 1 << rng.integers(8)
        damaged.append(bytes(b))
    bad = tmp_path / f"damaged{suffix}"
    for b in damaged:
        bad.write_bytes(b)
        try:
            state = load_checkpoint(str(bad), model, State(p, s, 0, 0))
        except DslError as e:
            assert str(e).startswith(f"error: cannot resume from {bad}: "), str(e)
        else:
            assert state.step == 3 and state.seed == 5 and state.losses == tensors["loss"].tolist()
            assert same_bits(state.p, checkpoint_params(tensors))


def checkpoint_params(arrays: dict) -> dict:
    return {k[2:]: a for k, a in arrays.items() if k.startswith("p.")}


@pytest.mark.parametrize("name, make, fault", [
    ("c.safetensors", lambda p: p.write_bytes(b""), r"too short for a safetensors file \(0 bytes"),
    ("c.safetensors", lambda p: p.mkdir(), r"cannot read the file: Is a directory"),
    ("c.safetensors", lambda p: os.mkfifo(p), r"cannot read the file: not a regular file"),
    ("c.safetensors", lambda p: p.write_text("step = 3\n"), r"the header is said to be \d+ bytes long"),
    ("c.npz", lambda p: p.write_bytes(b""), r"not an .npz archive"),
    ("c.npz", lambda p: p.write_text("step = 3\n"), r"not an .npz archive"),
    ("c.npz", lambda p: zipfile.ZipFile(p, "w").writestr("notes.txt", "hello"), r"member 'notes.txt' is not an .npy array"),
])
def test_what_is_no_checkpoint_cannot_be_resumed(xor_checkpoint, tmp_path, name, make, fault):
    make(tmp_path / name)
    resume_error(xor_checkpoint[0], tmp_path / name, fault)


def test_the_cli_refuses_a_truncated_checkpoint(xor_checkpoint, tmp_path):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(xor_checkpoint[1].read_bytes()[:-40])
    user_error(dslc("train", str(XOR), "--resume", str(cut), "--checkpoint-dir", ""),
               f"cannot resume from {cut}: tensor 'p.W2' ends at byte 124 of the data, which has only 120 bytes "
               "(a truncated file?)")


def test_a_checkpoint_directory_that_is_a_file(xor_checkpoint, tmp_path):
    model = xor_checkpoint[0]
    p, s = model.init(0)
    (tmp_path / "file").write_text("")
    for where in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(DslError, match=f"cannot write a checkpoint in {re.escape(str(where))}: "):
            save_checkpoint(where / "step0000001.safetensors", State(p, s, 1, 0, [0.5]), model)


def test_a_failed_write_leaves_no_temporary(xor_checkpoint, tmp_path, monkeypatch):
    model = xor_checkpoint[0]
    p, s = model.init(0)
    state = State(p, s, 1, 0, [0.5])

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DslError, match=f"cannot write a checkpoint in {re.escape(str(tmp_path))}: No space left"):
        save_checkpoint(tmp_path / "step0000001.safetensors", state, model)
    assert os.listdir(tmp_path) == []

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "step0000001.safetensors", state, model)
    assert os.listdir(tmp_path) == []

    def broken(tensors, filename, metadata):         # the package's own write fails part way
        Path(filename).write_bytes(b"\x00" * 5)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(sys.modules["dsl.train"], "save_file", broken)       # (dsl.train is the function)
    with pytest.raises(DslError, match=f"cannot write a checkpoint in {re.escape(str(tmp_path))}: Error while "
                                       "serializing: I/O error: No space left"):
        save_checkpoint(tmp_path / "step0000001.safetensors", state, model)
    assert os.listdir(tmp_path) == []


def test_the_cli_names_a_checkpoint_directory_it_cannot_write(tmp_path):
    (tmp_path / "file").write_text("")
    user_error(dslc("train", str(XOR), "--steps", "2", "--checkpoint-dir", str(tmp_path / "file")),
               f"cannot write a checkpoint in {tmp_path / 'file'}: ")


@pytest.mark.parametrize("write, fault", [
    (lambda p: np.savez(p, **{"train.x": np.array([object()], object)}, allow_pickle=True),
     r"member 'train.x.npy' has dtype object"),
    (lambda p: zipfile.ZipFile(p, "w").writestr("train.x.csv", "0,1\n1,0\n"),
     r"member 'train.x.csv' is not an .npy array"),
])
def test_a_bad_data_file_is_a_diagnostic(tmp_path, write, fault):
    write(tmp_path / "d.npz")
    with pytest.raises(DslError, match=f"cannot read the data {re.escape(str(tmp_path / 'd.npz'))}: {fault}"):
        read_npz_data(str(tmp_path / "d.npz"))


def test_xor_trains_to_100_percent():
    result = dsl.train(str(XOR), progress=None)
    assert result.steps == 500 and result.metrics["train"]["accuracy"] == 1.0


# ---------------------------------------------------------------- full runs (minutes each)
# DSLC_SLOW=1 pytest -s -m slow tests/test_train.py prints each run's report (wall times).



def full_run(name: str, **kw):
    batches = []
    result = dsl.train(str(EXAMPLES / f"{name}.bend"), progress=sys.stderr,
                       on_step=lambda t, b, l: batches.append(b), **kw)
    print(f"\n{result}")
    return result, batches


@pytest.fixture(scope="module")
def mlp_run():
    return full_run("names_mlp")


@pytest.mark.slow
@slow
def test_full_names_mlp_matches_its_twin_within_0_02_nats(mlp_run):
    result, batches = mlp_run
    w = tensors(Model(str(EXAMPLES / "names_mlp.bend")).init(0)[0])
    opt = torch.optim.AdamW(list(w.values()), lr=0.005, weight_decay=0.01)
    for b in batches:
        loss = mlp_loss(w, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sys.path.insert(0, str(EXAMPLES))
    import names_mlp
    with torch.no_grad():
        twin = mlp_loss(w, names_mlp.examples("valid", names_mlp.DIMS["T"])).item()
    print(f"names_mlp valid loss: dslc {result.metrics['valid']['loss']:.4f}, PyTorch twin {twin:.4f}")
    assert abs(result.metrics["valid"]["loss"] - twin) < 0.02


@pytest.mark.slow
@slow
def test_full_lstm_beats_the_mlp(mlp_run):
    result, _ = full_run("lstm_chars")
    assert result.metrics["valid"]["loss"] < mlp_run[0].metrics["valid"]["loss"]


@pytest.mark.slow
@slow
def test_full_cnn_reaches_97_percent():
    result, _ = full_run("cnn_digits")
    assert result.metrics["test"]["accuracy"] >= 0.97


@pytest.mark.slow
@slow
def test_full_resnet_reaches_98_5_percent():
    result, _ = full_run("resnet_digits", device="cpu")          # the interpreter takes far longer
    assert result.metrics["test"]["accuracy"] >= 0.985
