"""The loader of names_mlp.bend (see dsl/train.py for the hooks): the first and last names that
the PyPI package `names` ships, as (three characters -> next character) examples.

The 91,910 distinct names of its three lists (4,275 female and 1,219 male first names, 88,799
last names, lowercased) are shuffled once with a fixed seed and split 80/10/10 into train,
valid and test, so every run and every model of the names (lstm_chars.bend too) sees the same
split. '.' (token 0) pads the context before a
name and marks its end; 'a'..'z' are tokens 1..26.

    dslc train examples/names_mlp.bend            # or: python examples/names_mlp.py
"""
from __future__ import annotations

import functools
import importlib.resources

import numpy as np

from extra import require

ALPHABET = ".abcdefghijklmnopqrstuvwxyz"
FILES = ("dist.female.first", "dist.male.first", "dist.all.last")

TOKENS = np.zeros(256, np.int32)          # a character's code -> its token
TOKENS[[ord(c) for c in ALPHABET]] = np.arange(len(ALPHABET))

DIMS = {"V": 27, "T": 3, "E": 10, "H": 200, "n": 12, "L": 16}   # n, L: sample's count and length
SETTINGS = {"steps": 4000, "batch_size": 64, "eval_every": 500, "eval_examples": 8192}
HYPER = {"lr": 0.005}


def read_names() -> list[str]:
    """Every distinct name of the package's lists, lowercased, in the lists' order."""
    found: dict[str, None] = {}
    package = require("names", "names")
    for name in FILES:
        text = importlib.resources.files(package).joinpath(name).read_text()
        for line in text.splitlines():
            if line.strip():
                found.setdefault(line.split()[0].lower(), None)
    return list(found)


@functools.cache
def splits() -> dict[str, list[str]]:
    words = read_names()
    order = np.random.Generator(np.random.PCG64(2003)).permutation(len(words))
    words = [words[i] for i in order]
    a, b = int(0.8 * len(words)), int(0.9 * len(words))
    return {"train": words[:a], "valid": words[a:b], "test": words[b:]}


def encode(word: str) -> list[int]:
    return [ALPHABET.index(c) for c in word]


def contexts(words: list[str], T: int) -> dict[str, np.ndarray]:
    """x[i]: the T tokens before y[i], for every character of every word and its end."""
    # every word after T ends ('.', token 0), as one array of tokens
    text = "".join("." * T + w + "." for w in words)
    tokens = TOKENS[np.frombuffer(text.encode("ascii"), np.uint8)]
    counts = np.array([len(w) + 1 for w in words], np.int64)        # a word's letters and end
    first = np.cumsum(counts + T) - counts                          # where each word's letters start
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    at = np.repeat(first, counts) + within
    windows = np.lib.stride_tricks.sliding_window_view(tokens, T)
    return {"x": np.ascontiguousarray(windows[at - T]), "y": tokens[at]}


@functools.cache
def examples(split: str, T: int) -> dict[str, np.ndarray]:
    return contexts(splits()[split], T)


def size(split: str) -> int:
    return len(examples(split, DIMS["T"])["y"])


def rows(split: str, index: np.ndarray, rank: int, ranks: int) -> dict[str, np.ndarray]:
    return {k: a[index] for k, a in examples(split, DIMS["T"]).items()}


def decode(tokens: np.ndarray) -> list[str]:
    """Each row up to its first '.'."""
    return ["".join(ALPHABET[t] for t in row).split(".")[0] for row in tokens]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
