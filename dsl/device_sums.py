"""The gradient tree's arithmetic on the GPU (docs/distributed.md): the sum of two DeviceArrays
and the division by the micro-batch count, each one IEEE operation per element as NumPy's on
the host, so that partial sums stay on the device and keep the host's bits."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from ir.ops.base import dtype_name

if TYPE_CHECKING:
    from runtime.cuda import DeviceArray

@functools.cache
def _program(dtype: np.dtype, size: int):
    import dsl                                          # (dsl imports this module's users)
    t = f"{dtype_name(dtype)}[{size}]"
    return dsl.loads(f"def add(a: {t}, b: {t}) -> {t}:\n  return a + b\n\n"
                     f"def div(a: {t}, d: {dtype_name(dtype)}) -> {t}:\n  return a / d\n",
                     name="device_sums.bend", device="cuda")


def _flat(x: DeviceArray) -> DeviceArray:
    return x.view((x.size,))


def add(a: DeviceArray, b: DeviceArray) -> DeviceArray:
    """a + b, elementwise, on the device."""
    return _program(a.dtype, a.size).add(_flat(a), _flat(b)).view(a.shape)


def divide(a: DeviceArray, d: int) -> DeviceArray:
    """a / d, elementwise, on the device (d converted to a's dtype first)."""
    return _program(a.dtype, a.size).div(_flat(a), np.asarray(d, a.dtype)).view(a.shape)
