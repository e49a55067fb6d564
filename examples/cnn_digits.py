"""The loader of cnn_digits.bend (see dsl/train.py for the hooks): scikit-learn's bundled 8 x 8
digits (1,797 images, no download), scaled to [0, 1], channels last, shuffled once with a fixed
seed and split 70/10/20 into train (1,257), valid (180) and test (360).

    dslc train examples/cnn_digits.bend            # or: python examples/cnn_digits.py
"""
from __future__ import annotations

import functools

import numpy as np

from extra import require

DIMS = {"C1": 16, "C2": 32}
SETTINGS = {"steps": 1000, "batch_size": 32, "eval_every": 200}
HYPER = {"lr": 0.003}


@functools.cache
def splits() -> dict[str, dict[str, np.ndarray]]:
    digits = require("sklearn.datasets", "scikit-learn").load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]      # [N, 8, 8, 1]
    y = digits.target.astype(np.int32)
    order = np.random.Generator(np.random.PCG64(1998)).permutation(len(y))
    x, y = x[order], y[order]
    a, b = int(0.7 * len(y)), int(0.8 * len(y))
    return {"train": {"x": x[:a], "y": y[:a]}, "valid": {"x": x[a:b], "y": y[a:b]},
            "test": {"x": x[b:], "y": y[b:]}}


def size(split: str) -> int:
    return len(splits()[split]["y"])


def rows(split: str, index: np.ndarray, rank: int, ranks: int) -> dict[str, np.ndarray]:
    return {k: a[index] for k, a in splits()[split].items()}


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
