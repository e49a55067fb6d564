"""Every example trains to the same bits on the CPU backend on every run and whatever the
thread count: each step's losses, and the parameters AdamW makes of its gradients."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dsl
from runtime import cpu

EXAMPLES = Path(__file__).parent.parent / "examples"
SMALL = {                                   # sizes that keep each step well under a second
    "xor": {},
    "names_mlp": {"H": 64},
    "lstm_chars": {},
    "cnn_digits": {},
    "resnet_digits": {"C": 4},
    "gpt": {"D": 32, "L": 2, "H": 4, "G": 2, "lr": 1e-2, "warmup": 2, "steps": 3},
    "bert": {"D": 32, "L": 2, "H": 2, "G": 1, "lr": 1e-2, "warmup": 2, "steps": 3},
}


def bits(tree) -> list[bytes]:
    return [np.asarray(v).tobytes() for v in dsl.values.flatten_python(tree, "p").values()]


@pytest.mark.parametrize("name", SMALL)
def test_training_gives_the_same_bits_on_every_run_and_thread_count(name, monkeypatch):
    monkeypatch.setattr(cpu, "MIN_RUN_WORK", 0)          # every run shared by the threads,
    monkeypatch.setattr(cpu, "MIN_CHUNK_WORK", 1)        # cut as finely as it goes
    runs = []
    for threads in ("1", "2", "2", "1", "3"):
        monkeypatch.setenv("DSLC_THREADS", threads)
        r = dsl.train(str(EXAMPLES / f"{name}.bend"), steps=3, seed=5, dims=SMALL[name],
                      batch_size=8, device="cpu", progress=None, final_eval=False)
        runs.append((bits(r.params), np.asarray(r.losses).tobytes()))
    assert all(run == runs[0] for run in runs[1:])
