"""The loader of resnet_digits.bend (see dsl/train.py for the hooks): cnn_digits's data, the
8 x 8 digits split 70/10/20.

    dslc train examples/resnet_digits.bend         # or: python examples/resnet_digits.py
"""
from __future__ import annotations

from cnn_digits import rows, size

DIMS = {"C": 32, "lr": 0.003, "warmup": 100, "steps": 1500}        # lr, warmup, steps: update's schedule
SETTINGS = {"steps": 1500, "batch_size": 32, "eval_every": 250}

__all__ = ["DIMS", "SETTINGS", "rows", "size"]

if __name__ == "__main__":
    import sys
    from pathlib import Path

    from dsl.cli import main
    sys.exit(main(["train", str(Path(__file__).with_suffix(".bend")), *sys.argv[1:]]))
