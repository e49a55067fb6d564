"""Train examples/xor.bend to 100% accuracy on XOR and print the loss curve and predictions."""
from pathlib import Path

import numpy as np

import dsl

prog = dsl.load(str(Path(__file__).with_name("xor.bend")))
x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
y = np.array([0, 1, 1, 0], np.float32)
p = prog.init(dsl.key(0), H=8)
for i in range(500):
    p, loss = prog.step(p, x, y, np.float32(0.5))
    if i % 100 == 0 or i == 499:
        print(f"step {i:4d}  loss {float(loss):.4f}")
q = prog.predict(p, x)
print("predictions", np.round(q, 3), "accuracy", float(np.mean((q > 0.5) == (y > 0.5))))
