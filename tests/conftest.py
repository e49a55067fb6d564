"""The suite tests the language on the reference interpreter (its definition) unless a test
asks for a device; the backends' own tests compare them with it."""
import os

os.environ.setdefault("DSLC_DEVICE", "reference")

from hypothesis import settings

# Property tests check values, not speed (a slow shared machine must not fail them); tests
# that promise a time, like the front end's fuzz test, set their own deadline.
settings.register_profile("dslc", deadline=None)
settings.load_profile("dslc")


def raises(call, *fragments: str):
    """call() raises a dsl.DslError whose message holds every fragment; returns the error."""
    import dsl
    import pytest
    with pytest.raises(dsl.DslError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return info.value


# ---------------------------------------------------------------- a child process per case
# A compiled kernel that crashes (a signal) or never returns (a hang) must be a test's finding,
# not the end of the run: `isolated` runs each call in a forked child and says how it ended.

import os as _os
import pickle as _pickle
import select as _select
import signal as _signal
import time as _time
import traceback as _traceback
from collections.abc import Callable as _Callable, Iterable as _Iterable, Iterator as _Iterator


def isolated(fn: _Callable, items: _Iterable, timeout: float, jobs: int = 1) -> _Iterator:
    """(item, outcome, value) for each fn(item), each call in its own forked child, `jobs` at
    a time: ("ok", fn's value), ("error", the traceback of its exception), ("crash", the
    signal or exit status that ended it) or ("hang", None) past `timeout` seconds (killed).
    Results come in the order the children finish."""
    pending, running = iter(items), {}
    while True:
        while len(running) < jobs:
            item = next(pending, _DONE)
            if item is _DONE:
                break
            running.update([_fork(fn, item, timeout)])
        if not running:
            return
        now = _time.monotonic()
        ready, _, _ = _select.select(list(running), [], [],
                                     max(0.0, min(r[3] for r in running.values()) - now))
        for fd in ready:
            chunk = _os.read(fd, 1 << 20)
            running[fd][2].append(chunk)
            if not chunk:
                pid, item, chunks, _ = running.pop(fd)
                yield (item, *_ended(pid, fd, b"".join(chunks)))
        now = _time.monotonic()
        for fd in [fd for fd, r in running.items() if r[3] < now]:
            pid, item, _, _ = running.pop(fd)
            _os.kill(pid, _signal.SIGKILL)
            _os.waitpid(pid, 0)
            _os.close(fd)
            yield item, "hang", None


_DONE = object()


def _fork(fn: _Callable, item, timeout: float) -> tuple[int, list]:
    read, write = _os.pipe()
    pid = _os.fork()
    if pid == 0:                                   # the child: report, then leave at once
        _os.close(read)
        try:
            import faulthandler
            faulthandler.disable()                 # (a crash is the parent's to report)
            message = ("ok", fn(item))
        except BaseException:                      # noqa: BLE001 — the edge of the child
            message = ("error", _traceback.format_exc())
        data = _pickle.dumps(message)
        view = memoryview(data)
        while view:
            view = view[_os.write(write, view):]
        _os._exit(0)
    _os.close(write)
    return read, [pid, item, [], _time.monotonic() + timeout]


def _ended(pid: int, fd: int, data: bytes) -> tuple[str, object]:
    _os.close(fd)
    _, status = _os.waitpid(pid, 0)
    if _os.WIFSIGNALED(status):
        return "crash", _signal.Signals(_os.WTERMSIG(status)).name
    if _os.WEXITSTATUS(status) != 0 or not data:
        return "crash", f"exit status {_os.WEXITSTATUS(status)}"
    return _pickle.loads(data)


# ---------------------------------------------------------------- the command line in a child

import subprocess as _subprocess
from pathlib import Path as _Path
import sys as _sys


def dslc(*args: str, cwd=None, env: dict | None = None, timeout: float = 300) -> _subprocess.CompletedProcess:
    """`python -m dsl ARGS` in a child process (this interpreter, the environment plus `env`)."""
    return _subprocess.run([_sys.executable, "-m", "dsl", *args], capture_output=True, text=True,
                           cwd=cwd, env={**_os.environ, **(env or {})}, timeout=timeout)


def user_error(r: _subprocess.CompletedProcess, *fragments: str) -> None:
    """r ended as dslc ends on a user error: status 1, every fragment said, no traceback."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


def quick(tmp: _Path, example: _Path, dims: dict | None = None, **settings) -> _Path:
    """A copy of an example in tmp whose evaluations take 64 examples, that draws no samples,
    and whose other SETTINGS are overridden by `settings`, and DIMS by `dims`."""
    for sibling in (*example.parent.glob("*.py"), *example.parent.glob("*.bend")):
        (tmp / sibling.name).write_text(sibling.read_text())   # (what loaders and models import)
    (tmp / "m.bend").write_text(example.read_text())
    override = {"eval_examples": 64, "samples": False, **settings}
    (tmp / "m.py").write_text(example.with_suffix(".py").read_text() +
                              f"\nSETTINGS = {{**SETTINGS, **{override!r}}}\n" +
                              (f"DIMS = {{**DIMS, **{dims!r}}}\n" if dims else ""))
    return tmp / "m.bend"


# ---------------------------------------------------------------- IREE against the CPU backend

def beyond_iree_bound(got, want, magnitude):
    """Where IREE's result `got` differs from the CPU backend's `want` beyond docs/mlir.md's
    bound, ε·(168·magnitude + 17·max|want|), magnitude a bound on the sum of |terms| behind
    each element (NaN where both are NaN agrees)."""
    import numpy as np
    finite = np.abs(want[np.isfinite(want)])         # (random inputs make NaNs: sqrt(v < 0))
    eps = np.finfo(want.dtype).eps                   # (168 and 17 ε: 2e-5 and 2e-6 in f32)
    bound = eps * (168 * magnitude + 17 * (finite.max() if finite.size else 0))
    return ~(np.abs(got - want) <= bound) & ~(np.isnan(got) & np.isnan(want)) & (got != want)


# ---------------------------------------------------------------- the examples, small

# Small sizes for every example's dimension names (one letter means one thing per example).
EXAMPLE_DIMS = {"B": 4, "N": 2, "T": 8, "L": 2, "V": 11, "D": 16, "H": 2, "G": 1, "E": 4,
                "C": 4, "C1": 4, "C2": 8, "P": 8, "rope": True, "p.blocks": 2}
EXAMPLES = sorted(p.stem for p in (_Path(__file__).parents[1] / "examples").glob("*.bend")
                  if "def init(" in p.read_text() and "def loss(" in p.read_text())


def example_case(name: str, device: str):
    """An example program on `device`, its parameters from its own init, and random inputs
    for loss: (program, loss's arguments, the name of its parameters)."""
    import dsl
    prog = dsl.load(str(_Path(__file__).parents[1] / "examples" / f"{name}.bend"), device=device)
    init = prog._def("init")
    statics = {p.name: EXAMPLE_DIMS[p.name] for p in init.params if p.name != "key"}
    params = prog.init(dsl.key(0), **statics)
    first = prog._def("loss").params[0]     # the parameters, then the data
    return prog, {first.name: params, **_random_inputs(prog, "loss", {first.name})}, first.name


STEP_STATICS = {"lr": 1, "warmup": 1, "steps": 3}     # a step's static hyper-parameters


def example_step_case(name: str, device: str):
    """An example's training step on `device`: (program, step's arguments), the parameters
    from its own init, the optimizer state (if any) from its init_opt, and random data."""
    prog, args, first = example_case(name, device)
    leading = {first: args[first]}
    if "def init_opt(" in (_Path(__file__).parents[1] / "examples" / f"{name}.bend").read_text():
        leading[prog._def("step").params[1].name] = prog.call("init_opt", args[first])
    return prog, {**leading, **_random_inputs(prog, "step", set(leading), STEP_STATICS)}


def _random_inputs(prog, entry: str, given: set[str], statics: dict | None = None) -> dict:
    """Random arguments of an entry (but those given), of EXAMPLE_DIMS's sizes."""
    import dataclasses
    import numpy as np
    from dsl.inputs import example_inputs
    d = prog._def(entry)
    rest = [p for p in d.params if p.name not in given]
    args = example_inputs(dataclasses.replace(d, params=rest), prog._resolved.main,
                          {**EXAMPLE_DIMS, **(statics or {})})
    rng = np.random.default_rng(0)
    for arg, a in args.items():
        if isinstance(a, np.ndarray):       # indices 0 and 1 are in range for every example
            args[arg] = (rng.standard_normal(a.shape).astype(a.dtype) if a.dtype.kind == "f"
                          else rng.integers(0, 2, a.shape).astype(a.dtype))
    return args


# ---------------------------------------------------------------- the examples' PyTorch twins

import math as _math


def warmup_cosine(t: int, lr: float, warmup: int, total: int) -> float:
    """optim.warmup_cosine with min_lr = lr / 10, as the examples' step uses it."""
    if t < warmup:
        return lr * t / warmup
    p = min(max((t - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return lr / 10 + (lr - lr / 10) * 0.5 * (1 + _math.cos(_math.pi * p))


# ---------------------------------------------------------------- the same bits on every thread count

THREADS = (1, 2, 3)


def bits(value) -> dict:
    """Each leaf of a value (arrays, records, tuples, lists) as its dtype, shape and bytes."""
    import numpy as np
    from dsl.values import flatten_python
    return {k: (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())
            for k, a in flatten_python(value, "v").items()}


def full_range(rng, dtype: str, *shape: int):
    """Integers drawn from the whole range of a NumPy integer dtype, so that sums and products
    of them wrap round."""
    import numpy as np
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def contents(arrays: list) -> list:
    """Each NumPy array's bytes (None for anything else), to tell later which a call wrote."""
    import numpy as np
    return [a.tobytes() if isinstance(a, np.ndarray) else None for a in arrays]


def written(arrays: list, before: list) -> list[str]:
    """"argument i written" for each array whose bytes are no longer contents()'s."""
    return [f"argument {i} written" for i, (a, was) in enumerate(zip(arrays, before))
            if was is not None and a.tobytes() != was]


def on_host(value):
    """A value with each array leaf a NumPy array (a GPU runtime's downloaded: its pointers mean
    nothing outside the process that made them)."""
    import numpy as np
    from dsl import Key, Record
    if isinstance(value, Record):
        return Record(value.type_name, {k: on_host(v) for k, v in value.items()})
    if isinstance(value, dict):
        return {k: on_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_host(v) for v in value)
    return value if isinstance(value, Key) else np.asarray(value)


def on_every_thread_count(fn: _Callable[[], object], timeout: float = 300):
    """fn()'s value on the host, computed in a child process on each of THREADS (DSLC_THREADS):
    a crash, a hang or an exception in any fails the test, and so do different bits on
    different counts."""
    def on(threads: int):
        _os.environ["DSLC_THREADS"] = str(threads)
        return on_host(fn())
    results = {}
    for threads, outcome, value in isolated(on, THREADS, timeout):
        assert outcome == "ok", f"DSLC_THREADS={threads}: {outcome}: {value}"
        results[threads] = value
    first = results[THREADS[0]]
    for threads in THREADS[1:]:
        assert bits(results[threads]) == bits(first), f"DSLC_THREADS={threads} differs from {THREADS[0]}"
    return first


import importlib.util as _importlib_util
from types import ModuleType as _ModuleType


def benchmark(name: str) -> _ModuleType:
    """benchmarks/NAME.py imported as a module (the benchmarks are scripts, not a package)."""
    spec = _importlib_util.spec_from_file_location(name, _Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
    module = _importlib_util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Tests that cost tens of seconds each, which CI's 15 minutes cannot hold: run with DSLC_SLOW=1
import pytest as _pytest  # noqa: E402

SLOW = bool(os.environ.get("DSLC_SLOW"))
slow = _pytest.mark.skipif(not SLOW, reason="set DSLC_SLOW=1 for the slow tests")


# Hand-made compile cache entries (runtime/codec.py reads pickles through an allow-list): what
# a damaged or hostile entry could hold, written by Python's own unrestricted pickle.
import pickle as _pickle  # noqa: E402


class _Call:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def pickled_call(fn, *args) -> bytes:
    """A pickle that calls fn(*args) when loaded, fn named by its module and name."""
    return _pickle.dumps(_Call(fn, args), protocol=4)


def pickled_new(module: str, qualname: str) -> bytes:
    """A pickle that makes an object of the class module.qualname, which need not exist."""
    return b"\x80\x04c" + f"{module}\n{qualname}\n".encode() + b")\x81."


def lowerings(prog, monkeypatch) -> list[str]:
    """The entries prog checks and lowers from now on (the full path, not the fast path of
    dsl/fastcall.py), in order."""
    made: list[str] = []
    full = prog._specialisation
    monkeypatch.setattr(prog, "_specialisation", lambda *a: made.append(a[0]) or full(*a))
    return made
