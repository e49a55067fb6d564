"""Generate token ids with GPT-2 (examples/gpt2.bend) from Hugging Face weights in a
safetensors file:

    python examples/gpt2.py model.safetensors --prompt 464,3290,318 --tokens 32
        [--temperature 0.8 --top-k 40 --seed 0] [--n-head 12] [--device cpu|reference]

prints the generated token ids, comma-separated (there is no tokenizer here: ids in, ids
out). Decoding is greedy unless --temperature is given. The prompt is run once by `prefill`,
which fills the key/value cache; then each new token is one call of `decode`. The number of
heads is not in the weights: it is --n-head, or else `n_head` from a config.json beside them.

`dslc run` can drive the same model through the entry `generate` (greedy, the decode steps
in a fold): --npz writes the weights and the prompt as the arrays it reads, and then

    dslc run examples/gpt2.bend --entry generate --inputs in.npz --dims n_head=12,n_new=32

prints the prompt's continuation.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import dsl
from dsl.values import flatten_python
from dsl.safetensors import SafetensorsError, read

MODEL = Path(__file__).with_suffix(".bend")
BUFFERS = (".attn.bias", ".attn.masked_bias")    # Hugging Face's causal-mask buffers, not weights


def gpt2_params(tensors: dict[str, np.ndarray], path: str) -> dict:
    """The GPT2 record of gpt2.bend from tensors with Hugging Face's GPT-2 names (optionally
    prefixed `transformer.`), as float32."""
    named = {k.removeprefix("transformer."): a for k, a in tensors.items() if not k.endswith(BUFFERS)}

    def take(name: str) -> np.ndarray:
        if name not in named:
            raise SafetensorsError(path, f"has no tensor '{name}', which GPT-2 needs")
        a = named.pop(name)
        if a.dtype.kind != "f":
            raise SafetensorsError(path, f"tensor '{name}' is {a.dtype}, not a float")
        return a.astype(np.float32)

    def affine(prefix: str) -> dict:
        return {"weight": take(f"{prefix}.weight"), "bias": take(f"{prefix}.bias")}

    n_layer = len({m.group(1) for k in named if (m := re.match(r"h\.(\d+)\.", k))})
    p = {"wte": take("wte.weight"), "wpe": take("wpe.weight"),
         "h": [{"ln_1": affine(f"h.{i}.ln_1"),
                "attn": {"c_attn": affine(f"h.{i}.attn.c_attn"), "c_proj": affine(f"h.{i}.attn.c_proj")},
                "ln_2": affine(f"h.{i}.ln_2"),
                "mlp": {"c_fc": affine(f"h.{i}.mlp.c_fc"), "c_proj": affine(f"h.{i}.mlp.c_proj")}}
               for i in range(n_layer)],
         "ln_f": affine("ln_f")}
    lm_head = named.pop("lm_head.weight", None)           # present in some files: the tied wte
    if lm_head is not None and not np.array_equal(lm_head.astype(np.float32), p["wte"]):
        raise SafetensorsError(path, "lm_head.weight differs from wte.weight: GPT-2 ties them")
    if named:
        raise SafetensorsError(path, f"tensor '{min(named)}' is not a GPT-2 parameter")
    return p


def load(path: str) -> dict:
    """The GPT2 record of a safetensors file of Hugging Face GPT-2 weights."""
    return gpt2_params(read(path), path)


def pick(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator) -> int:
    """The next token: the most likely (temperature 0), or a sample from the softmax of
    logits / temperature restricted to the top_k most likely (0: all)."""
    if temperature == 0.0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < len(z):
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    w = np.exp(z - z.max())
    return int(rng.choice(len(z), p=w / w.sum()))


def generate(prog, p: dict, prompt: list[int], n_tokens: int, n_head: int, temperature: float = 0.0,
             top_k: int = 0, seed: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """Each new token with the logits it was picked from: one `prefill` of the prompt, then
    one `decode` per token, on a cache just long enough for all of them."""
    rng = np.random.default_rng(seed)
    size = len(prompt) + n_tokens - 1
    z, cache = prog.prefill(p, np.array([prompt], np.int32), n_head, size)
    logits = z[0, -1]
    for i in range(n_tokens):
        token = pick(logits, temperature, top_k, rng)
        yield token, logits
        if i + 1 < n_tokens:
            # (the position as a 0-d array, not a NumPy scalar: each new number would be a new
            # signature, every call checked and lowered in full: 1.4 ms a token against 0.7)
            z, cache = prog.decode(p, np.array([token], np.int32), np.array(len(prompt) + i, np.int32), cache)
            logits = z[0]


def heads(path: str, given: int | None) -> int:
    """--n-head, or n_head from the config.json beside the weights."""
    if given is not None:
        return given
    config = Path(path).with_name("config.json")
    try:
        return int(json.loads(config.read_text())["n_head"])
    except (OSError, ValueError, KeyError, TypeError):
        raise SystemExit(f"gpt2.py: give --n-head (no usable n_head in {config})") from None


def token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got '{text}'") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected one or more token ids >= 0, got '{text}'")
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", metavar="WEIGHTS.safetensors")
    ap.add_argument("--prompt", type=token_ids, required=True, help="token ids, e.g. 464,3290,318")
    ap.add_argument("--tokens", type=int, default=32, help="how many tokens to generate")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy")
    ap.add_argument("--top-k", type=int, default=0, help="sample among the k most likely (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-head", type=int, help="attention heads (default: config.json's n_head)")
    ap.add_argument("--device", choices=["auto", "cpu", "reference"], default="auto")
    ap.add_argument("--npz", metavar="IN.npz", help="write the inputs of `dslc run --entry generate` instead")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.temperature < 0 or args.top_k < 0:
        ap.error("--tokens must be at least 1, --temperature and --top-k at least 0")
    try:
        p = load(args.weights)
        V, N = p["wte"].shape[0], p["wpe"].shape[0]
        if max(args.prompt) >= V:
            ap.error(f"token {max(args.prompt)} is outside the vocabulary of {V}")
        if len(args.prompt) + args.tokens > N:
            ap.error(f"the prompt and the tokens ({len(args.prompt) + args.tokens}) exceed the context of {N}")
        if args.npz:
            arrays = {**flatten_python(p, "p"), "prompt": np.array([args.prompt], np.int32)}
            np.savez(args.npz, **arrays)
            print(f"{args.npz}: {len(arrays)} arrays; dslc run {MODEL} --entry generate "
                  f"--inputs {args.npz} --dims n_head={heads(args.weights, args.n_head)},n_new={args.tokens}")
            return 0
        prog = dsl.load(str(MODEL), device=args.device)
        n_head = heads(args.weights, args.n_head)
        out = [t for t, _ in generate(prog, p, args.prompt, args.tokens, n_head,
                                      args.temperature, args.top_k, args.seed)]
    except dsl.DslError as e:
        print(e, file=sys.stderr)
        return 1
    print(",".join(map(str, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
