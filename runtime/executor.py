"""The one walk of a compiled plan (backend/schedule.py) on any device: the CPU runtime
(runtime/cpu.py) and the CUDA runtime (runtime/cuda.py) each implement Device, and what
differs between them (memory, how a kernel, a run of kernels, a product or a view is
launched, how a host step reaches its inputs, waiting for the device) is behind it. A device
may also run several steps as one call, a segment (the CPU's native step: runtime/step.py):
the walk is then over steps and segments in order."""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from backend.schedule import HostStep, Plan, Step
from ir.core import Op, Value

Env = dict[Value, Any]          # each live value's buffer: a NumPy array, a DeviceArray


class Device(Protocol):
    """What the walk asks of a runtime, for one call of a plan."""

    def arguments(self, arrays: Sequence[Any]) -> Env:
        """The call's arguments as the device's buffers, with whatever the device keeps
        between calls (values made once, the arena's views)."""

    def launch(self, i: int, step: Step, env: Env) -> None:
        """Step i, a kernel, product or view step, started on the device; its outputs in env."""

    def host(self, op: Op, env: Env) -> None:
        """A host step's op evaluated (the interpreter, or a fold's or checkpoint's body);
        its outputs in env."""

    def segment(self, segment: Any, env: Env) -> None:
        """The steps of a segment that the device made, run as one call; their outputs that
        the walk reads in env. (Only a device that makes segments is given any.)"""

    def synchronise(self) -> None:
        """Return once the device has finished every step launched in this call."""

    def results(self, env: Env) -> list[Any]:
        """The plan's results, as the call returns them."""


def execute(plan: Plan, dead: Sequence[Sequence[Value]] | None, device: Device,
            arrays: Sequence[Any], order: Sequence[int | Any] | None = None) -> list[Any]:
    """The plan's results for these arguments: each step run in order on `device` (`order`,
    where given: step numbers and the device's segments, in the plan's order), and each value
    dropped after its last use (`dead`, one list per step; None where the device holds every
    value to the end, as a segment's frame does), so its memory goes back."""
    env = device.arguments(arrays)
    for item in range(len(plan.steps)) if order is None else order:
        if not isinstance(item, int):
            device.segment(item, env)
            continue
        step(item, plan.steps[item], device, env)
        for v in dead[item] if dead is not None else ():
            del env[v]
    device.synchronise()
    return device.results(env)


def step(i: int, s: Step, device: Device, env: Env) -> None:
    """Step i of a plan on `device`, its inputs and outputs in env."""
    if isinstance(s, HostStep):
        device.host(s.op, env)
    else:
        device.launch(i, s, env)
