"""Control of differentiation: `stop_gradient`."""
from __future__ import annotations

from typing import Any

import numpy as np

from ir.ops.base import Kind, Param, Primitive, primitive
from ir.types import TensorType


@primitive
class StopGradient(Primitive):
    """x unchanged; reverse mode treats it as a constant."""
    name = surface = "stop_gradient"
    params = (Param("x", Kind.TENSOR),)
    differentiable = False

    def infer(self, x: TensorType) -> TensorType:
        return x

    def evaluate(self, x: np.ndarray) -> np.ndarray:
        return x

    def vjp(self, b: Any, op: Any, cts: tuple) -> tuple:
        return (None,)
