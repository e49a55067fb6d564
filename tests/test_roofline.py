"""benchmarks/roofline.py: the products it counts in a plan, and its FMA loop on the team."""
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
from conftest import benchmark

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))     # (its import of train_step)
roofline = benchmark("roofline")

PRODUCTS = """
def f(x: f32[7, 13], w: f32[13, 29], q: f32[3, 5, 4], k: f32[3, 6, 4]) -> f32:
  return sum(exp(x @ w)) + sum(einsum("btd,bsd->bts", q, k))
"""


def test_every_product_of_the_plan_is_counted_at_two_flops_a_multiply_add():
    prog = dsl.loads(PRODUCTS, device="cpu")
    args = [np.ones(s, np.float32) for s in [(7, 13), (13, 29), (3, 5, 4), (3, 6, 4)]]
    assert roofline.product_flops(prog, "f", *args) == (2, 2 * 7 * 29 * 13 + 2 * 3 * 5 * 6 * 4)


def test_the_fma_loop_runs_each_chunk_once_on_one_thread_and_on_the_team():
    for threads in (1, 2, 3):
        rate, ran = roofline.fma_peak(threads, chunks=7, repeat=1)
        assert rate > 0 and len(ran) == threads and sum(ran) == 7     # whoever ran them


def test_a_product_in_a_loop_body_is_refused_not_counted_once():
    prog = dsl.loads("""
def f(xs: f32[5, 3, 4], w: f32[4, 4]) -> f32:
  hs = fold x in xs with h = zeros([3, 4]):
    h = tanh(x @ w + h)
    return h
  return sum(hs)
""", device="cpu")
    with pytest.raises(ValueError, match="loop's body"):
        roofline.product_flops(prog, "f", np.ones((5, 3, 4), np.float32), np.ones((4, 4), np.float32))
