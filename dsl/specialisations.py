"""The specialisations a program keeps: for each entry point, those of the DSLC_SPECIALISATIONS
(default 8) input signatures it was called with most recently, each with everything built
from it (its gradients, their executables and their arenas). A loop over batch sizes or
sentence lengths thus holds a bounded amount of memory; an evicted signature is built again at
its next call, from the compile cache on disk (runtime/cache.py)."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from dsl.values import builder
from frontend.diagnostics import DslError
from ir.core import Function

if TYPE_CHECKING:
    from dsl.program import Lowered

DEFAULT = 8
VARIABLE = "DSLC_SPECIALISATIONS"


def kept_per_entry() -> int:
    """How many specialisations an entry point keeps: $DSLC_SPECIALISATIONS, else DEFAULT."""
    value = os.environ.get(VARIABLE, "")
    if not value:
        return DEFAULT
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise DslError(None, f"{VARIABLE}: expected a whole number of at least 1, got {value!r}")
    return int(value)


class Specialisation:
    """An entry point specialised for one input signature, and what was built from it:
    functions (the entry itself, under None; its gradients, under the positions of the leaves
    they differentiate) and, once run, each one's executable."""

    def __init__(self, key: tuple, lowered: Lowered, signature: str):
        self.key = key
        self.lowered = lowered
        self.signature = signature                 # as a user reads it: x: f32[3, 4]
        self.results = builder(lowered.outputs)    # the entry's result arrays as its value
        self._functions: dict[tuple[int, ...] | None, Function] = {None: lowered.function}
        self._executables: dict[tuple[int, ...] | None, Any] = {}
        self._parameters: dict[int, Callable[[list], Any]] = {}

    def parameter(self, k: int) -> Callable[[list], Any]:
        """Parameter k's value from its leaves (builder's, made at first use): a gradient with
        respect to it has its structure."""
        made = self._parameters.get(k)
        return made if made is not None else self._parameters.setdefault(k, builder(self.lowered.params[k]))

    def function(self, grad: tuple[int, ...] | None, make: Callable[[], Function]) -> Function:
        """The function under `grad`, made by make() the first time (a concurrent call may make
        it too: one of them is kept)."""
        fn = self._functions.get(grad)
        return fn if fn is not None else self._functions.setdefault(grad, make())

    def executable(self, grad: tuple[int, ...] | None, make: Callable[[Function], Any]) -> Any:
        """The function under `grad` as make() compiles it for the program's device, once."""
        exe = self._executables.get(grad)
        return exe if exe is not None else self._executables.setdefault(grad, make(self._functions[grad]))


class Specialisations:
    """An entry point's specialisations by input signature, the least recently used dropped
    when there are more than `bound`; safe to use from several threads."""

    def __init__(self, bound: int):
        self.bound = bound
        self._by_key: dict[tuple, Specialisation] = {}
        self._recent: OrderedDict[Specialisation, None] = OrderedDict()   # least recent first
        self._lock = threading.Lock()

    def get(self, key: tuple, make: Callable[[], Specialisation]) -> Specialisation:
        """The specialisation under key, now the most recently used; make()'s if there is none
        (made outside the lock: lowering takes long, and other signatures' calls go on)."""
        with self._lock:
            found = self._by_key.get(key)          # one lookup: a deep key's hash is not kept
            if found is not None:
                self._recent.move_to_end(found)    # (keyed by identity: no deep hash)
                return found
        made = make()
        with self._lock:
            kept = self._by_key.setdefault(key, made)
            self._hold(kept)
        return kept

    def use(self, spec: Specialisation) -> None:
        """spec, found by the fast path (dsl/fastcall.py), is now the most recently used; held
        again if it was evicted while a call still had it."""
        with self._lock:
            if spec in self._recent:
                self._recent.move_to_end(spec)
            elif self._by_key.setdefault(spec.key, spec) is spec:
                self._hold(spec)

    def _hold(self, spec: Specialisation) -> None:
        """spec held as the most recently used, the least recently used over the bound
        dropped (under the lock)."""
        self._recent[spec] = None
        self._recent.move_to_end(spec)
        while len(self._recent) > self.bound:
            oldest, _ = self._recent.popitem(last=False)
            del self._by_key[oldest.key]

    def signatures(self) -> list[str]:
        """The input signatures held, least recently used first."""
        with self._lock:
            return [s.signature for s in self._recent]
