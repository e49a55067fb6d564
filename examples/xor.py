"""XOR: the loader of examples/xor.bend for `dslc train` (see dsl/train.py for the hooks), and,
run as a script, the same training written out with the Python API: 500 steps of full-batch
gradient descent to 100% accuracy, printing the loss curve and the predictions.

    dslc train examples/xor.bend
    python examples/xor.py
"""
from pathlib import Path

import numpy as np

X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
Y = np.array([0, 1, 1, 0], np.float32)

DIMS = {"H": 8}
SETTINGS = {"steps": 500, "batch_size": 0, "eval_every": 100, "samples": False}
HYPER = {"lr": 0.5}


def load(split: str) -> dict[str, np.ndarray] | None:
    return {"x": X, "y": Y} if split == "train" else None


if __name__ == "__main__":
    import dsl

    prog = dsl.load(str(Path(__file__).with_name("xor.bend")))
    p = prog.init(dsl.key(0), H=DIMS["H"])
    for i in range(SETTINGS["steps"]):
        p, loss = prog.step(p, X, Y, np.float32(HYPER["lr"]))
        if i % 100 == 0 or i == SETTINGS["steps"] - 1:
            print(f"step {i:4d}  loss {float(loss):.4f}")
    q = prog.predict(p, X)
    print("predictions", np.round(q, 3), "accuracy", float(np.mean((q > 0.5) == (Y > 0.5))))
