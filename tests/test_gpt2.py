"""GPT-2 inference (examples/gpt2.bend, examples/gpt2.py) against a PyTorch GPT-2 written
here in Hugging Face's layout, on random weights saved by the `safetensors` package; and the
safetensors reader (dsl/safetensors.py) against that package."""
from __future__ import annotations

import importlib.util
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl import cli
from dsl.safetensors import SafetensorsError, read

torch = pytest.importorskip("torch")
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
spec = importlib.util.spec_from_file_location("gpt2_example", EXAMPLES / "gpt2.py")
gpt2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpt2)

CONFIG = {"n_layer": 2, "n_head": 4, "d": 64, "vocab": 100, "n_ctx": 64}
PROMPT = [3, 14, 15, 92, 65]
STEPS = 32


# ---------------------------------------------------------------- GPT-2 in PyTorch

class Conv1D(torch.nn.Module):
    """Hugging Face's linear layer: y = x @ weight + bias, weight [in, out]."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(torch.nn.Module):
    def __init__(self, d: int, n_head: int, n_ctx: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn, self.c_proj = Conv1D(d, 3 * d), Conv1D(d, d)
        # the causal mask Hugging Face keeps as a buffer, which the loader must skip
        self.register_buffer("bias", torch.tril(torch.ones(n_ctx, n_ctx)).view(1, 1, n_ctx, n_ctx))

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(D, dim=2))
        s = (q @ k.transpose(-1, -2)) / (D // self.n_head) ** 0.5
        s = s.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))


class Mlp(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(d, 4 * d), Conv1D(4 * d, d)

    def forward(self, x):
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self, d: int, n_head: int, n_ctx: int):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d, eps=1e-5), torch.nn.LayerNorm(d, eps=1e-5)
        self.attn, self.mlp = Attention(d, n_head, n_ctx), Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(torch.nn.Module):
    """GPT2Model's parameters, named as Hugging Face names them, with the tied output layer."""

    def __init__(self, n_layer: int, n_head: int, d: int, vocab: int, n_ctx: int):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(n_ctx, d)
        self.h = torch.nn.ModuleList(Block(d, n_head, n_ctx) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.T


def random_gpt2(seed: int = 0) -> GPT2:
    """Random weights large enough that every layer matters (norm scales around 1)."""
    torch.manual_seed(seed)
    model = GPT2(**CONFIG)
    with torch.no_grad():
        for name, w in model.named_parameters():
            w.copy_(torch.randn(w.shape) * (0.3 if "ln" not in name else 0.1)
                    + (1.0 if "ln" in name and name.endswith("weight") else 0.0))
    return model.eval()


@pytest.fixture(scope="module")
def model() -> GPT2:
    return random_gpt2()


@pytest.fixture(scope="module")
def weights(model, tmp_path_factory) -> Path:
    """The model saved as a Hugging Face GPT2LMHeadModel file: names under `transformer.`,
    the mask buffers included."""
    path = tmp_path_factory.mktemp("gpt2") / "model.safetensors"
    save_torch({f"transformer.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def torch_run(model):
    """Greedy generation by recomputing the whole sequence each step: ids and logits."""
    seq, ids, logits = list(PROMPT), [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # a tiny model: a second thread only waits for a busy core
    try:
        with torch.no_grad():
            for _ in range(STEPS):
                z = model(torch.tensor([seq]))[0, -1].numpy()
                ids.append(int(np.argmax(z)))
                logits.append(z)
                seq.append(ids[-1])
    finally:
        torch.set_num_threads(threads)
    return ids, np.array(logits)


def cached_run(prog, p) -> tuple[list[int], np.ndarray]:
    steps = list(gpt2.generate(prog, p, PROMPT, STEPS, CONFIG["n_head"]))
    return [t for t, _ in steps], np.array([z for _, z in steps])


def assert_logits_match(got, want):
    # atol covers logits near 0, where relative error means little
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# ---------------------------------------------------------------- the model against PyTorch

def test_loader_maps_hugging_face_names(weights, model):
    p = gpt2.load(str(weights))
    assert len(p["h"]) == CONFIG["n_layer"]
    sd = model.state_dict()
    np.testing.assert_array_equal(p["h"][1]["attn"]["c_attn"]["weight"], sd["h.1.attn.c_attn.weight"].numpy())
    np.testing.assert_array_equal(p["h"][0]["mlp"]["c_proj"]["bias"], sd["h.0.mlp.c_proj.bias"].numpy())
    np.testing.assert_array_equal(p["ln_f"]["weight"], sd["ln_f.weight"].numpy())


def test_cached_and_full_generation_match_torch(weights, torch_run):
    """32 greedy tokens three ways: dslc's decode with the cache, dslc's full forward over
    the growing sequence, and PyTorch's: the same ids, the same logits at every step."""
    prog = dsl.load(str(EXAMPLES / "gpt2.bend"), device="reference")
    p = gpt2.load(str(weights))
    want_ids, want = torch_run
    ids, logits = cached_run(prog, p)
    seq, full_ids, full = list(PROMPT), [], []
    for _ in range(STEPS):
        z = prog.forward(p, np.array([seq], np.int32), CONFIG["n_head"])[0, -1]
        full_ids.append(int(np.argmax(z)))
        full.append(z)
        seq.append(full_ids[-1])
    assert len(set(want_ids)) > 3, "the test needs a continuation that does not repeat one token"
    assert ids == want_ids and full_ids == want_ids
    assert_logits_match(logits, want)
    assert_logits_match(np.array(full), want)


def test_compiled_cpu_generation_matches_torch(weights, torch_run):
    """The same on the CPU backend; its full forward runs once, over the final sequence, whose
    causal logits at each position are those of the growing one's steps."""
    prog = dsl.load(str(EXAMPLES / "gpt2.bend"), device="cpu")
    p = gpt2.load(str(weights))
    want_ids, want = torch_run
    ids, logits = cached_run(prog, p)
    assert ids == want_ids
    assert_logits_match(logits, want)
    seq = np.array([PROMPT + ids[:-1]], np.int32)
    full = prog.forward(p, seq, CONFIG["n_head"])[0, len(PROMPT) - 1:]
    assert_logits_match(full, want)


def test_decode_is_one_specialisation_for_every_position(weights):
    """A new token never compiles anything: decode's position is a run-time value."""
    prog = dsl.load(str(EXAMPLES / "gpt2.bend"), device="reference")
    p = gpt2.load(str(weights))
    _, cache = prog.prefill(p, np.array([PROMPT], np.int32), CONFIG["n_head"], 40)
    token = np.array([7], np.int32)
    lowered = {id(prog.lower("decode", (p, token, np.int32(pos), cache), {})[0]) for pos in (5, 21, 39)}
    assert len(lowered) == 1


def test_generate_entry_runs_under_dslc_run(weights, torch_run, tmp_path, capsys):
    """examples/gpt2.py --npz writes the inputs of `dslc run --entry generate`, whose greedy
    fold over decode steps gives PyTorch's ids."""
    inputs, out = tmp_path / "in.npz", tmp_path / "out.npz"
    assert gpt2.main([str(weights), "--prompt", ",".join(map(str, PROMPT)), "--tokens", "8",
                      "--n-head", "4", "--npz", str(inputs)]) == 0
    assert "--dims n_head=4,n_new=8" in capsys.readouterr().out
    assert cli.main(["run", str(EXAMPLES / "gpt2.bend"), "--entry", "generate", "--inputs", str(inputs),
                     "--dims", "n_head=4,n_new=8", "--device", "reference", "-o", str(out)]) == 0
    with np.load(out) as got:
        assert got["out"].tolist() == [torch_run[0][:8]]


def test_script_prints_the_greedy_ids(weights, torch_run, capsys):
    (weights.parent / "config.json").write_text(json.dumps({"n_head": CONFIG["n_head"]}))
    code = gpt2.main([str(weights), "--prompt", ",".join(map(str, PROMPT)), "--tokens", "6",
                      "--device", "reference"])
    assert code == 0
    assert capsys.readouterr().out.strip() == ",".join(map(str, torch_run[0][:6]))


def test_sampling_keeps_to_the_top_k():
    z = np.array([0.0, 5.0, 4.0, -1.0, 4.5])
    rng = np.random.default_rng(0)
    draws = {gpt2.pick(z, 1.0, 3, rng) for _ in range(200)}
    assert draws == {1, 2, 4}
    assert gpt2.pick(z, 0.0, 0, rng) == 1
    assert {gpt2.pick(z, 0.7, 1, rng) for _ in range(20)} == {1}


def test_weights_that_are_not_gpt2_are_refused(model, tmp_path):
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    missing = tmp_path / "missing.safetensors"
    save_torch({k: v for k, v in sd.items() if k != "h.1.ln_2.bias"}, str(missing))
    with pytest.raises(SafetensorsError, match=r"missing.safetensors: has no tensor 'h.1.ln_2.bias'"):
        gpt2.load(str(missing))
    extra = tmp_path / "extra.safetensors"
    save_torch({**sd, "h.0.attn.q_norm.weight": torch.ones(4)}, str(extra))
    with pytest.raises(SafetensorsError, match=r"'h.0.attn.q_norm.weight' is not a GPT-2 parameter"):
        gpt2.load(str(extra))


# ---------------------------------------------------------------- the safetensors reader

def test_every_dtype_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {"f32": rng.standard_normal((3, 4)).astype(np.float32),
              "f16": rng.standard_normal((2, 5)).astype(np.float16),
              "f64": rng.standard_normal(7),
              "i32": rng.integers(-2 ** 31, 2 ** 31, (4, 1, 2), dtype=np.int32),
              "i64": rng.integers(-2 ** 63, 2 ** 63, 6, dtype=np.int64),
              "u32": rng.integers(0, 2 ** 32, (2, 2), dtype=np.uint32), "bool": rng.random(5) < 0.5,
              "scalar": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.float32)}
    path = tmp_path / "all.safetensors"
    save_numpy(arrays, str(path), metadata={"format": "np"})
    got = read(path)
    assert set(got) == set(arrays)
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        np.testing.assert_array_equal(got[name], a)
    bf16 = torch.randn(5, 3).to(torch.bfloat16)
    save_torch({"w": bf16}, str(tmp_path / "bf16.safetensors"))
    w = read(tmp_path / "bf16.safetensors")["w"]
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, bf16.float().numpy())      # bf16 widens exactly


def tensor_file(path: Path, header: dict | bytes, data: bytes, length: int | None = None) -> Path:
    """A file laid out by hand: the header length (its true one unless given), header, data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}}


def test_a_hand_written_file_reads(tmp_path):
    data = np.array([1.5, -2.0], "<f4").tobytes() + np.array([7], "<i8").tobytes()
    got = read(tensor_file(tmp_path / "ok.safetensors", GOOD, data))
    assert got["a"].tolist() == [1.5, -2.0] and got["b"].tolist() == [7]


@pytest.mark.parametrize("header, data, length, fault", [
    (GOOD, bytes(12), None, r"tensor 'b' ends at byte 16 of the data, which has only 12 bytes"),
    (GOOD, bytes(16), 10 ** 6, r"the header is said to be 1000000 bytes long, but only \d+ bytes follow"),
    (b'{"a": {"dtype": "F32",', bytes(16), None, r"the header is not valid JSON"),
    (b"[1, 2]", b"", None, r"the header is a JSON list, not an object of tensors"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4), None,
     r"tensor 'a' ends at byte 8 of the data, which has only 4 bytes"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), None,
     r"tensor 'a' is F32\[3\] \(12 bytes\) but its data_offsets \[0, 8\] hold 8 bytes"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8), None,
     r"data_offsets \[8, 0\]: expected \[begin, end\] with 0 <= begin <= end"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), None,
     r"tensors 'a' and 'b' overlap"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), None,
     r"bytes 0 to 4 of the data belong to no tensor"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8), None,
     r"the data has 8 bytes but its tensors cover 4 \(trailing bytes\)"),
    ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), None,
     r"tensor 'a' has dtype 'U8': a dtype this reader does not support"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), None,
     r"shape \[-1\]: expected a list of non-negative integers"),
    (b'{"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "a": {}}', bytes(4), None,
     r"the header names 'a' twice"),
])
def test_malformed_files_are_clear_errors(tmp_path, header, data, length, fault):
    path = tensor_file(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(SafetensorsError) as e:
        read(path)
    assert str(e.value).startswith(f"error: {path}: ")
    assert re.search(fault, str(e.value)), str(e.value)


def test_short_and_missing_files(tmp_path):
    (tmp_path / "short.safetensors").write_bytes(b"\x05\x00\x00")
    with pytest.raises(SafetensorsError, match=r"short.safetensors: too short for a safetensors file \(3 bytes"):
        read(tmp_path / "short.safetensors")
    with pytest.raises(SafetensorsError, match=r"nothing.safetensors: cannot read the file: No such file"):
        read(tmp_path / "nothing.safetensors")


def test_the_script_reports_a_bad_file_without_a_traceback(weights, tmp_path, capsys):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(weights.read_bytes()[:-100])
    assert gpt2.main([str(cut), "--prompt", "1,2", "--n-head", "4"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cut}: ") and "truncated" in err and "Traceback" not in err
