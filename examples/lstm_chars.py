"""The loader of lstm_chars.bend (see dsl/train.py for the hooks): the names of names_mlp.py,
same split, as whole sequences.

A name of k characters becomes x = '.' c1 … ck and y = c1 … ck '.', padded to the longest
name plus one (14) with '.' in x and -100 in y, the target cross_entropy ignores. `rows`
encodes only the names asked for: those of the calling rank's micro-batches.

    dslc train examples/lstm_chars.bend            # or: python examples/lstm_chars.py
"""
from __future__ import annotations

import numpy as np

from names_mlp import decode, encode, splits

LENGTH = 14                                        # the longest name (13) and its end
DIMS = {"V": 27, "H": 32, "n": 12, "N": 16}
SETTINGS = {"steps": 1500, "batch_size": 64, "eval_every": 250, "eval_examples": 2048}
HYPER = {"lr": 0.01}


def sequences(words: list[str]) -> dict[str, np.ndarray]:
    x = np.zeros((len(words), LENGTH), np.int32)
    y = np.full((len(words), LENGTH), -100, np.int32)
    for i, w in enumerate(words):
        toks = encode(w)
        x[i, 1:len(toks) + 1] = toks
        y[i, :len(toks) + 1] = toks + [0]
    return {"x": x, "y": y}


def size(split: str) -> int:
    return len(splits()[split])


def rows(split: str, index: np.ndarray, rank: int, ranks: int) -> dict[str, np.ndarray]:
    words = splits()[split]
    return sequences([words[i] for i in index])


__all__ = ["DIMS", "SETTINGS", "HYPER", "size", "rows", "decode"]

if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
