"""The loader of gpt.bend (see dsl/train.py for the hooks): the text of Python's own
documentation, as windows of characters.

The corpus is `pydoc_data.topics.topics`, the help topics that ship with Python (`help("if")`
shows one): a dict of 79 texts, joined in the sorted order of their keys, about 465,000
characters. The first nine tenths train and the last tenth is held out for validation. The
vocabulary is the characters present, sorted (103; '\\n' is token 0, where samples start).

A training example is the window x = text[i : i + T] and its targets y = text[i + 1 : i + T + 1];
every position i starts one, so a batch draws windows at random positions, as nanoGPT's
get_batch: `rows` cuts only the windows asked for, those of the calling rank's micro-batches.
The validation windows do not overlap, so each held-out character is scored once.

    dslc train examples/gpt.bend            # or: python examples/gpt.py
"""
from __future__ import annotations

import functools

import numpy as np
from pydoc_data.topics import topics


@functools.cache
def text() -> str:
    return "".join(topics[k] for k in sorted(topics))


@functools.cache
def vocabulary() -> str:
    return "".join(sorted(set(text())))


DIMS = {"V": len(vocabulary()), "D": 128, "L": 4, "H": 4, "G": 2, "T": 64, "rope": True,
        "lr": 2e-3, "warmup": 100, "steps": 1500,                 # the schedule of step
        "n": 3, "N": 320, "temperature": 0.8, "top_k": 8}        # sample's
SETTINGS = {"steps": 1500, "batch_size": 32, "eval_every": 250, "eval_examples": 256,
            "eval_batch_size": 32}


def encode(s: str) -> np.ndarray:
    index = {c: i for i, c in enumerate(vocabulary())}
    return np.array([index[c] for c in s], np.int32)


@functools.cache
def tokens(split: str) -> np.ndarray:
    t = encode(text())
    cut = len(t) - len(t) // 10                                    # the last tenth is held out
    return t[:cut] if split == "train" else t[cut:]


def windows(t: np.ndarray, T: int, stride: int) -> dict[str, np.ndarray]:
    """x: windows of T tokens every `stride` positions, and y: each shifted by one (views of
    t, not copies)."""
    w = np.lib.stride_tricks.sliding_window_view(t, T + 1)[::stride]
    return {"x": w[:, :-1], "y": w[:, 1:]}


def split_windows(split: str) -> dict[str, np.ndarray] | None:
    """Every window of a split: one at each position to train, every T-th to validate."""
    if split == "test":
        return None
    T = DIMS["T"]
    return windows(tokens(split), T, 1 if split == "train" else T)


def size(split: str) -> int | None:
    w = split_windows(split)
    return None if w is None else len(w["x"])


def rows(split: str, index: np.ndarray, rank: int, ranks: int) -> dict[str, np.ndarray]:
    return {k: a[index] for k, a in split_windows(split).items()}


def decode(tokens: np.ndarray) -> list[str]:
    v = vocabulary()
    return ["".join(v[t] for t in row) for row in tokens]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
