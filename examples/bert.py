"""The loader of bert.bend (see dsl/train.py for the hooks): the corpus and split of gpt.py,
as windows of T characters, and a vocabulary of its characters plus [MASK], the last token.

Every position of the training text starts a window; the validation windows do not overlap.
There are no targets to load: the model corrupts each batch itself and predicts what it hid.

    dslc train examples/bert.bend            # or: python examples/bert.py
"""
from __future__ import annotations

import numpy as np

from gpt import tokens, vocabulary

MASK = len(vocabulary())                                           # [MASK]: the last token
DIMS = {"V": MASK + 1, "D": 128, "L": 4, "H": 4, "G": 4, "T": 64,
        "lr": 2e-3, "warmup": 100, "steps": 1250}                 # the schedule of step
SETTINGS = {"steps": 1250, "batch_size": 32, "eval_every": 250, "eval_examples": 256,
            "eval_batch_size": 32}


def split_windows(split: str) -> np.ndarray | None:
    """Every window of a split (views of its text): one at each position to train, every T-th
    to validate."""
    if split == "test":
        return None
    T = DIMS["T"]
    w = np.lib.stride_tricks.sliding_window_view(tokens(split), T)
    return w if split == "train" else w[::T]


def size(split: str) -> int | None:
    w = split_windows(split)
    return None if w is None else len(w)


def rows(split: str, index: np.ndarray, rank: int, ranks: int) -> dict[str, np.ndarray]:
    """The windows asked for (a rank's micro-batches), copied out of the text."""
    return {"x": split_windows(split)[index]}


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
