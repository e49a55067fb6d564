"""The loader of resnet_digits.bend (see dsl/train.py for the hooks): cnn_digits's data, the
8 x 8 digits split 70/10/20, and a learning rate that follows half a cosine to 0.

    dslc train examples/resnet_digits.bend         # or: python examples/resnet_digits.py
"""
from __future__ import annotations

import math

from cnn_digits import load

DIMS = {"C": 32}
SETTINGS = {"steps": 1500, "batch_size": 32, "eval_every": 250}
LR = 0.003


def hyper(t: int) -> dict[str, float]:
    return {"lr": LR * 0.5 * (1.0 + math.cos(math.pi * t / SETTINGS["steps"]))}


__all__ = ["DIMS", "SETTINGS", "hyper", "load"]

if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
