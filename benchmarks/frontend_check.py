"""Parse and check a generated 5,000-line program; prints the time (target: under 1 s)."""
from __future__ import annotations

import argparse
import time

from frontend.check import check_file

BLOCK = '''
#{{ Block {i}: a residual MLP layer. #}}
object Layer{i} {{ W: f32[D, D], b: f32[D], g: f32[D] }}

def norm{i}(x, g):
  m = mean(x, axis=-1, keepdims=True)
  v = mean((x - m) * (x - m), axis=-1, keepdims=True)
  return (x - m) * rsqrt(v + 1e-5) * g

def layer{i}(p: Layer{i}, x: f32[B, D]) -> f32[B, D]:
  h = norm{i}(x, p.g)
  h = tanh(h @ p.W + p.b)
  if D > 4:
    h = h * 0.5
  else:
    h = h * 2.0
  return x + h

def score{i}(p: Layer{i}, x: f32[B, D], y: i32[B]) -> f32:
  z = layer{i}(p, x)
  m = max(z, axis=-1, keepdims=True)
  lse = log(sum(exp(z - m), axis=-1))
  picked = sum(z * one_hot(y, D), axis=-1)
  return mean(lse + m[:, 0] - picked)

def train{i}(p: Layer{i}, x: f32[B, D], y: i32[B], lr: f32) -> (Layer{i}, f32):
  l, g = value_and_grad(score{i}, wrt=p)(p, x, y)
  return map(lambda w, d: w - lr * d, p, g), l
'''


def program(lines: int) -> str:
    out, i = [], 0
    while sum(s.count("\n") for s in out) < lines:
        out.append(BLOCK.format(i=i))
        i += 1
    return "".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    text = program(args.lines)
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        check_file("generated.bend", text)
        best = min(best, time.perf_counter() - start)
    print(f"parse + check of {text.count(chr(10))} lines: {best:.3f} s (best of {args.repeat}; target < 1 s)")


if __name__ == "__main__":
    main()
