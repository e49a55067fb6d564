"""Training a model file: `dslc train FILE` and `dsl.train(FILE)` (docs/language.md §14).

The model file
--------------
`NAME.bend` defines its model as entry points (annotated functions):

    init(key: Key, <static ints>) -> P          the parameters P (a record), from a key
    loss(p: P, <batch>) -> f32                  the objective on one batch
    step(p: P, <batch>, <hyper>) -> (P, f32)    one optimizer step: new parameters and the loss

and may define

    init_opt(p: P) -> S                         an optimizer state (AdamW's moments); step then
                                                takes it second and returns it second:
                                                step(p: P, s: S, …) -> (P, S, f32)
    update(p: P, [s: S,] g: P) -> P | (P, S)    the optimizer step given the gradient g, which
                                                micro-batches and ranks need (docs/distributed.md)
    train_loss(p: P, <batch>) -> (f32, P)       the loss and p with its buffers moved by the
                                                batch (batch norm's running statistics), which
                                                micro-batches and ranks need when P has buffers:
                                                they differentiate it instead of loss, average
                                                its buffers and give them to update
    evaluate(p: P, <batch>) -> f32 | record     held-out metrics (a record of f32 scalars, by
                                                field name, or one scalar), averaged per example
    sample(p: P, key: Key, <static ints>) -> T  generated examples (the loader decodes them)

`step` is required: the optimizer is part of the model, written in the language, and the
trainer never invents one (a derived SGD would hide the learning rate and the update rule from
the model file, the one place a reader looks for them).

The first parameter of every entry but `init` receives the parameters; the second parameter of
`step` the optimizer state (when there is `init_opt`). Every other parameter is passed **by
name**: an array of the batch, a value of the loader's `hyper(t)`, a static value of `DIMS`,
and, for a parameter of type `Key`, a key the trainer derives (below). A parameter that none of
these gives is an error that points at it.

The loader
----------
`NAME.py` beside `NAME.bend` is imported (with its folder on `sys.path`); it may define

    load(split) -> dict[str, ndarray] | None    the examples of split "train" (required), "valid"
                                                or "test" (None: no such split): named arrays
                                                whose leading axes all count the examples
    size(split) -> int | None                   instead of load, examples fetched on demand:
    rows(split, index, rank, ranks) -> dict     how many a split has (None: no such split), and
                                                the arrays of the examples `index` (positions
                                                in the split), asked for by rank `rank` of
                                                `ranks` (0 of 1 on one process)
    DIMS = {"H": 200, …}                        static values for the entries, by parameter name
    SETTINGS = {"steps": 1000, …}               the trainer's defaults (keys below)
    hyper(t) -> dict  or  HYPER = {…}           step's runtime values (a learning rate) at step t
    decode(tokens) -> list[str]                 sample's result as text, one string per example

With `size` and `rows` (both or neither), the trainer never calls `load`: each step, each
rank asks `rows` for the examples of its own micro-batches only, in the batch's order (a
position may come twice), and the evaluations ask for theirs. Code that runs the file as a
script belongs under `if __name__ == "__main__":`. With
`--data DATA.npz` the arrays come from the file instead of the loader's: `train.x`, `valid.x`,
`test.x` for the arrays named `x` of each split (names without a split prefix are "train").

SETTINGS: `steps` (1000), `batch_size` (32; 0 or at least the split's size: the whole split,
in order, every step), `eval_every` (steps // 10), `eval_examples` (4096: the periodic
evaluations and the final train loss use that many examples, a fixed random subset),
`eval_batch_size` (256), `checkpoint_every` (eval_every), `samples` (True).

Randomness and checkpoints
--------------------------
Everything random is a function of the seed and the step number, never of a hidden state:
`init` gets `key(seed)`; step t's batch is drawn (uniformly, with replacement) by a NumPy
PCG64 generator seeded with (seed, t), and its `Key` parameters get
`fold_in(fold_in(key(seed), STEP), t)`; evaluation and sampling use their own tags. So the RNG
state of a run is (seed, step), and a checkpoint resumes bit-identically.

A checkpoint is a .safetensors file. Its tensors: the parameters as `p.<field>` (`p.W1`,
`p.blocks[0].W`, the names `dslc run` reads), the optimizer state named the same way from `opt`
(`opt[0]`, `opt[1].W1`, `opt[2].W1` for optim's adamw, whose state is the tuple (step, m, v)),
`loss` (each step's training loss so far), `valid.step` and `valid.loss` (the periodic
evaluations). Its metadata, text: `step` (steps done) and `seed` in decimal, `model` (the
file's name) and `format` ("dslc-train-2"). Checkpoints go to `DIR/stepNNNNNNN.safetensors`
every `checkpoint_every` steps, at the end, and on Ctrl-C, each written to a temporary file
beside it, synced and renamed, so that none is ever half written. Resuming reads the file
through dsl.safetensors (its header checked before its data), checks the tensors and metadata
above, and every other tensor's name, dtype and shape against what the model's `init` and
`init_opt` make: a damaged checkpoint, or one of another model (or of other sizes), is an
error "cannot resume from PATH: …" that names the first fault. An `.npz` checkpoint of earlier
versions (format "dslc-train-1": the same names, with `step`, `seed`, `model` and `format` as
scalar arrays) is read through dsl.npz and resumes the same way. A run does not mix its checkpoints with
another's: when DIR already holds checkpoints, it starts only with `--resume` (from any
checkpoint) or with `--overwrite`, which deletes them before the first step. `steps` counts from the start
of the run, so a resumed run goes on from the checkpoint's step to `steps`.

Training runs where `device` says: "auto" (the GPU where one is usable, else the CPU backend),
"cpu", "cuda" or "reference" (the interpreter), in `numerics` ("exact", or "fast": the GPU's
products on tensor cores).
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import reprlib
import sys
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from dsl import distributed, npz, safetensors
from dsl.atomic import replacing
from dsl.inputs import array_from_python
from dsl.plot import check_plot_path, plot_losses
from dsl.program import DEVICES, Program, load
from dsl.progress import Progress
from dsl.values import Key, Record, flatten_python, key as seed_key, shortest
from frontend import ast
from frontend.check import check_file
from frontend.diagnostics import Diagnostic, DslError, Note
from ir import philox
from ir.ops.base import dtype_name
from ir.types import FLOAT_DTYPES

FORMAT = "dslc-train-2"
NPZ_FORMAT = "dslc-train-1"          # the .npz checkpoints of earlier versions, still read
SPLITS = ("train", "valid", "test")
STEP, EVAL, SAMPLE = 0x73746570, 0x6576616C, 0x73616D70          # "step", "eval", "samp"
DEFAULTS = {"steps": 1000, "batch_size": 32, "eval_every": None, "eval_examples": 4096,
            "eval_batch_size": 256, "checkpoint_every": None, "samples": True}


def fold_in(k: Key, i: int) -> Key:
    """fold_in(k, i) of the language (docs/random.md §2), computed here."""
    return Key(philox.derive(k.words, i, philox.FOLD_IN))


def step_key(seed: int, t: int) -> Key:
    return fold_in(fold_in(seed_key(seed), STEP), t)


def batch_indices(seed: int, t: int, n: int, batch_size: int) -> np.ndarray:
    """The positions of step t's batch among the split's n examples: batch_size draws with
    replacement, or the whole split."""
    if batch_size <= 0 or batch_size >= n:
        return np.arange(n)
    return np.random.Generator(np.random.PCG64([seed, t])).integers(0, n, size=batch_size)


# ---------------------------------------------------------------- the loader

@dataclass
class Loader:
    """What the model's loader module (or --data) provides."""
    origin: str                                       # where the data comes from, for messages
    load: Callable[[str], Any] | None
    dims: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    hyper: Callable[[int], dict] = lambda t: {}
    decode: Callable[[np.ndarray], list[str]] | None = None
    size: Callable[[str], Any] | None = None          # size and rows: examples on demand
    rows: Callable[[str, np.ndarray, int, int], Any] | None = None


@dataclass(frozen=True)
class Split:
    """A split's examples by position: `size` of them, and `fetch(index)`, the named arrays of
    the examples at the positions `index`, in its order."""
    size: int
    fetch: Callable[[np.ndarray], dict[str, np.ndarray]]

    def all(self) -> dict[str, np.ndarray]:
        return self.fetch(np.arange(self.size))


def _user_error(file: str, what: str, e: BaseException) -> DslError:
    """An exception raised by the loader's code (in `file`) as a diagnostic that names the
    loader's line that raised it, or called what raised it."""
    tb, line = e.__traceback__, None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == Path(file).resolve():
            line = tb.tb_lineno
        tb = tb.tb_next
    at = f" at line {line}" if line else ""
    return DslError(None, f"{what} failed{at}: {type(e).__name__}: {e}")


def import_loader(model: Path) -> Loader:
    """NAME.py beside NAME.bend, or an empty loader when there is none."""
    path = model.with_suffix(".py")
    if not path.exists():
        return Loader(origin=str(path), load=None)
    spec = importlib.util.spec_from_file_location(f"dslc_loader_{model.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as e:                            # the user's code: report, never trace
        raise _user_error(str(path), f"{path} (the loader of {model.name})", e) from None
    finally:
        sys.path.remove(str(path.parent))

    def value(name: str, kind: type, default: Any) -> Any:
        v = getattr(module, name, default)
        if not isinstance(v, kind):
            raise DslError(None, f"{path}: {name} must be a {kind.__name__}, got {type(v).__name__}")
        return v

    size, rows = getattr(module, "size", None), getattr(module, "rows", None)
    if (size is None) != (rows is None):
        raise DslError(None, f"{path} defines {'rows' if size is None else 'size'} but not "
                             f"{'size' if size is None else 'rows'}: examples on demand need "
                             "size(split), how many, and rows(split, index, rank, ranks), which")
    hyper = getattr(module, "hyper", None)
    if hyper is None:
        constant = value("HYPER", dict, {})
        hyper = lambda t: constant                     # noqa: E731
    return Loader(origin=str(path), load=getattr(module, "load", None),
                  dims=dict(value("DIMS", dict, {})), settings=dict(value("SETTINGS", dict, {})),
                  hyper=hyper, decode=getattr(module, "decode", None), size=size, rows=rows)


def read_npz_data(path: str) -> Callable[[str], dict | None]:
    """--data DATA.npz: arrays `split.name` (a name without a split prefix is in "train")."""
    try:
        arrays = npz.read(path)
    except npz.NpzError as e:
        raise DslError(None, f"cannot read the data {path}: {e.problem}") from None
    splits: dict[str, dict] = {}
    for name, a in arrays.items():
        split, dot, rest = name.partition(".")
        if not dot:
            split, rest = "train", name
        if split not in SPLITS:
            raise DslError(None, f"{path}: the array '{name}' is in no split: name arrays "
                                 f"train.NAME, valid.NAME or test.NAME")
        splits.setdefault(split, {})[rest] = a
    return splits.get


# ---------------------------------------------------------------- the model

def _typename(a: np.ndarray) -> str:
    """An array's type as dslc writes it: f32[4, 3]."""
    return f"{dtype_name(a.dtype) or a.dtype}{list(a.shape)}"


def _describe(arrays: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k}: {_typename(a)}" for k, a in arrays.items())


class Model:
    """A model file and its loader: the hooks checked, each entry's arguments bound by name."""

    REQUIRED = ("init", "loss", "step")

    def __init__(self, path: str, data: str | None = None, dims: dict | None = None,
                 hyper: dict | None = None, device: str = "auto", numerics: str = "exact"):
        self.path = Path(path)
        if self.path.suffix != ".bend":
            raise DslError(None, f"{path}: a model file ends in .bend")
        check_file(str(self.path))                    # every diagnostic of the file at once
        self.prog: Program = load(str(self.path), device=device, numerics=numerics)
        self.loader = import_loader(self.path)
        if data is not None:
            self.loader = replace(self.loader, origin=data, load=read_npz_data(data), size=None, rows=None)
        self.dims = {**self.loader.dims, **(dims or {})}
        self._hyper_override = dict(hyper or {})
        self.has = {n: self._defines(n) for n in ("init", "loss", "step", "init_opt", "update",
                                                  "train_loss", "evaluate", "sample")}
        missing = [n for n in self.REQUIRED if not self.has[n]]
        if missing:
            raise DslError(None, f"{self.path} defines no {' and no '.join(repr(m) for m in missing)}: "
                                 "dslc train needs init (the parameters), loss (the objective) "
                                 "and step (the optimizer step); see dsl/train.py")
        if self.loader.load is None and self.loader.rows is None:
            raise DslError(None, f"{self.path} has no data: write a loader {self.loader.origin} "
                                 "with load(split) -> dict of arrays, or give --data DATA.npz")
        self._splits: dict[str, Split | None] = {}

    def _defines(self, name: str) -> bool:
        entity = self.prog._resolved.main.names.get(name)
        return entity is not None and entity.kind == "def"

    def _def(self, name: str) -> ast.Def:
        return self.prog._def(name)

    # ---- data

    def split(self, name: str, team: distributed.Team = distributed.Solo()) -> Split | None:
        """A split (cached): from `load`, or fetched on demand for `team`'s rank from `rows`."""
        if name not in self._splits:
            self._splits[name] = (self._loaded if self.loader.rows is None else self._on_demand)(name, team)
        if name == "train" and self._splits[name] is None:
            hook = "load('train')" if self.loader.rows is None else "size('train')"
            raise DslError(None, f"{self.loader.origin}: {hook} gave no data")
        return self._splits[name]

    def _user(self, hook: Callable, call: str, *args: Any) -> Any:
        try:
            return hook(*args)
        except Exception as e:                        # the user's code
            raise _user_error(self.loader.origin, f"{self.loader.origin} {call}", e) from None

    def _loaded(self, name: str, team: distributed.Team) -> Split | None:
        raw = self._user(self.loader.load, f"load({name!r})", name)
        if raw is None:
            return None
        arrays = self._check_split(f"load({name!r})", raw)
        return Split(len(next(iter(arrays.values()))), lambda index: {k: a[index] for k, a in arrays.items()})

    def _on_demand(self, name: str, team: distributed.Team) -> Split | None:
        n = self._user(self.loader.size, f"size({name!r})", name)
        if n is None:
            return None
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise DslError(None, f"{self.loader.origin}: size({name!r}) must be a number of "
                                 f"examples (at least 1) or None, got {reprlib.repr(n)}")

        def fetch(index: np.ndarray) -> dict[str, np.ndarray]:
            call = f"rows({name!r}, …, {team.rank}, {team.size})"
            arrays = self._check_split(call, self._user(self.loader.rows, call, name, index, team.rank, team.size))
            got = len(next(iter(arrays.values())))
            if got != len(index):
                raise DslError(None, f"{self.loader.origin}: {call} gave {got} examples for "
                                     f"{len(index)} positions: {_describe(arrays)}")
            return arrays
        return Split(int(n), fetch)

    def _check_split(self, call: str, raw: Any) -> dict[str, np.ndarray]:
        where = f"{self.loader.origin}: {call}"
        if not isinstance(raw, dict) or not raw:
            raise DslError(None, f"{where} must return a dict of named arrays (or None), "
                                 f"got {type(raw).__name__}")
        arrays = {}
        for k, v in raw.items():
            a = np.asarray(v)
            if not isinstance(k, str) or a.dtype.kind not in "biuf" or a.ndim == 0:
                raise DslError(None, f"{where}: '{k}' must be an array of numbers with a leading "
                                     f"axis of examples, got {a.dtype}{list(a.shape)}")
            arrays[k] = a
        sizes = {k: len(a) for k, a in arrays.items()}
        if len(set(sizes.values())) != 1 or 0 in sizes.values():
            raise DslError(None, f"{where}: the arrays must count the same number (> 0) of examples "
                                 f"along their first axis, got {_describe(arrays)}")
        return arrays

    def hyper(self, t: int) -> dict[str, Any]:
        try:
            h = self.loader.hyper(t)
        except Exception as e:                        # the user's code
            raise _user_error(self.loader.origin, f"{self.loader.origin} hyper({t})", e) from None
        if not isinstance(h, dict):
            raise DslError(None, f"{self.loader.origin}: hyper({t}) must return a dict, got {type(h).__name__}")
        return {**h, **self._hyper_override}

    # ---- calls

    def bind(self, entry: str, leading: tuple, batch: dict | None = None, hyper: dict | None = None,
             key: Key | None = None) -> dict[str, Any]:
        """The keyword arguments of an entry: `leading` for its first parameters, then by name."""
        d = self._def(entry)
        if len(d.params) < len(leading):
            raise DslError(d.name_span, f"'{entry}' must take {self._leading_doc(entry)}")
        args = dict(zip((p.name for p in d.params), leading))
        pools = (("the batch", batch or {}), ("the hyper-parameters", hyper or {}), ("DIMS", self.dims))
        for p in d.params[len(leading):]:
            if isinstance(p.type, ast.NamedType) and p.type.name == ("Key",) and key is not None:
                args[p.name] = key
                continue
            found = next((pool[p.name] for _, pool in pools if p.name in pool), None)
            if found is None and p.default is not None:
                continue                              # the entry's own default
            if found is None:
                offered = "; ".join(f"{what}: {', '.join(pool) or 'none'}" for what, pool in pools)
                raise DslError(p.span, f"no value for '{p.name}' of '{entry}': dslc train passes "
                                       "parameters by name from the batch, the loader's hyper() "
                                       "and DIMS (or --dims)", [Note(f"available: {offered}")])
            args[p.name] = _runtime_number(p, found)
        return args

    def _leading_doc(self, entry: str) -> str:
        return ("the parameters and the optimizer state first" if entry == "step" and self.has["init_opt"]
                else "the parameters first")

    def call(self, entry: str, args: dict, batch: dict | None = None, grad: str | None = None,
             has_aux: bool = False) -> Any:
        """Run an entry (its value and gradient with respect to `grad`, if given); a diagnostic
        about its inputs says where the batch came from."""
        try:
            if grad is not None:
                return self.prog.value_and_grad(entry, grad, has_aux)(**args)
            return self.prog.call(entry, **args)
        except DslError as e:
            if batch:
                last = e.diagnostics[-1]
                note = Note(f"the batch from {self.loader.origin} is {_describe(batch)}")
                e.diagnostics = e.diagnostics[:-1] + (Diagnostic(last.span, last.message, last.notes + (note,)),)
            raise

    def init(self, seed: int) -> tuple[Record, Any]:
        p = self.call("init", self.bind("init", (seed_key(seed),)))
        if not isinstance(p, dict):
            raise DslError(self._def("init").name_span, "init must return a record of parameters")
        s = self.call("init_opt", self.bind("init_opt", (p,))) if self.has["init_opt"] else None
        return p, s

    def step(self, p: Record, s: Any, batch: dict, t: int, seed: int) -> tuple[Record, Any, float]:
        stateful = self.has["init_opt"]
        leading = (p, s) if stateful else (p,)
        out = self.call("step", self.bind("step", leading, batch, self.hyper(t), step_key(seed, t)), batch)
        n = 3 if stateful else 2
        if not isinstance(out, tuple) or len(out) != n or np.ndim(out[-1]) != 0:
            raise DslError(self._def("step").name_span,
                           "step must return (parameters, optimizer state, loss)" if stateful else
                           "step must return (parameters, loss)" + " (with init_opt, step takes and "
                           "returns the optimizer state second)")
        return out[0], (out[1] if stateful else None), float(out[-1])

    def buffers(self, p: Record) -> list[str]:
        """The names of p's leaves that are buffers, as flatten_python(p, "p") names them."""
        return ["p" + name[len(self._wrt()):] for name in self.prog.buffers("loss", self._wrt(), p)]

    def _wrt(self) -> str:
        return self._def("loss").params[0].name

    def gradient(self, p: Record, batch: dict, key: Key) -> tuple[np.ndarray, Record, Record]:
        """The loss on one batch, its gradient with respect to the parameters, and the
        parameters with their buffers moved by the batch: train_loss's, else p as it was."""
        if not self.has["train_loss"]:
            loss, g = self.call("loss", self.bind("loss", (p,), batch, key=key), batch, grad=self._wrt())
            return loss, g, p
        wrt = self._def("train_loss").params[0].name
        args = self.bind("train_loss", (p,), batch, key=key)
        (loss, moved), g = self.call("train_loss", args, batch, grad=wrt, has_aux=True)
        return loss, g, moved

    def update(self, p: Record, s: Any, g: Record, t: int) -> tuple[Record, Any]:
        """`update`, the optimizer step given the gradient, at step t: the new (p, s)."""
        stateful = self.has["init_opt"]
        out = self.call("update", self.bind("update", (p, s, g) if stateful else (p, g), hyper=self.hyper(t)))
        if not (isinstance(out, tuple) and len(out) == 2 if stateful else isinstance(out, dict)):
            raise DslError(self._def("update").name_span, "update must return (parameters, optimizer "
                           "state)" if stateful else "update must return the parameters")
        return (out[0], out[1]) if stateful else (out, None)

    def evaluate(self, p: Record, data: dict, seed: int, batch_size: int) -> dict[str, float]:
        """Mean loss (and evaluate's metrics) over the examples of data, per example."""
        n = len(next(iter(data.values())))
        totals: dict[str, float] = {}
        k = fold_in(seed_key(seed), EVAL)
        for start in range(0, n, max(1, batch_size)):
            chunk = {name: a[start:start + batch_size] for name, a in data.items()}
            m = len(next(iter(chunk.values())))
            values = {"loss": self.call("loss", self.bind("loss", (p,), chunk, key=k), chunk)}
            if self.has["evaluate"]:
                values.update(self._metrics(self.call("evaluate", self.bind("evaluate", (p,), chunk, key=k), chunk)))
            for name, v in values.items():
                totals[name] = totals.get(name, 0.0) + float(v) * m
        return {name: v / n for name, v in totals.items()}

    def _metrics(self, value: Any) -> dict[str, Any]:
        if isinstance(value, dict) and all(np.ndim(v) == 0 for v in value.values()):
            return dict(value)
        if not isinstance(value, dict) and np.ndim(value) == 0:
            return {"evaluate": value}
        raise DslError(self._def("evaluate").name_span,
                       "evaluate must return an f32 scalar or a record of f32 scalars")

    def sample(self, p: Record, seed: int) -> list[str]:
        tokens = self.call("sample", self.bind("sample", (p,), key=fold_in(seed_key(seed), SAMPLE)))
        if self.loader.decode is None:
            return [shortest(tokens)]
        try:
            return [str(s) for s in self.loader.decode(np.asarray(tokens))]
        except Exception as e:                        # the user's code
            raise _user_error(self.loader.origin, f"{self.loader.origin} decode()", e) from None


# ---------------------------------------------------------------- checkpoints

@dataclass
class State:
    """Everything a run needs to go on: its checkpoint."""
    p: Record
    s: Any
    step: int
    seed: int
    losses: list[float] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)


# a checkpoint's tensors besides the parameters and the optimizer state: their dtype kinds, rank
TENSORS = {"loss": ("f", 1), "valid.step": ("iu", 1), "valid.loss": ("f", 1)}
METADATA = ("format", "model", "step", "seed", "crc32")  # text; step and seed in decimal
KIND_NAMES = {"iu": "integers", "f": "floats", "U": "text"}


def checkpoint_name(step: int) -> str:
    return f"step{step:07d}.safetensors"


CHECKPOINT_NAME = re.compile(r"step\d{7,}\.(safetensors|npz)")     # (.npz: earlier versions')


def checkpoints_in(folder: Path) -> list[Path]:
    """The checkpoints in a folder, by step; none when it does not exist."""
    try:
        return sorted(p for p in folder.iterdir() if CHECKPOINT_NAME.fullmatch(p.name))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise DslError(None, f"cannot read the checkpoint directory {folder}: {e.strerror or e}") from None


def remove_checkpoints(paths: list[Path]) -> None:
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise DslError(None, f"cannot remove the old checkpoint {p}: {e.strerror or e}") from None


def save_checkpoint(path: Path, state: State, model: Model) -> None:
    """The state as a .safetensors file (see the module's documentation), written whole or not
    at all."""
    tensors = {**flatten_python(state.p, "p"),
               **(flatten_python(state.s, "opt") if state.s is not None else {}),
               "loss": np.asarray(state.losses[:state.step], np.float32),
               "valid.step": np.asarray([e[0] for e in state.evals], np.int64),
               "valid.loss": np.asarray([e[1] for e in state.evals], np.float64)}
    metadata = {"format": FORMAT, "model": model.path.name, "step": str(state.step),
                "seed": str(state.seed)}
    metadata["crc32"] = checksum(tensors, metadata)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(path, tensors, metadata)
    except OSError as e:
        raise DslError(None, f"cannot write a checkpoint in {path.parent}: {e.strerror or e}") from None
    except SafetensorError as e:          # the package's own write failed (a full disk)
        raise DslError(None, f"cannot write a checkpoint in {path.parent}: {e}") from None


def _write_whole(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    with replacing(path) as tmp:
        # the package writes each array's memory as it lies: a strided view must be copied
        save_file({k: np.asarray(a, order="C") for k, a in tensors.items()}, tmp, metadata=metadata)


def load_checkpoint(path: str, model: Model, fresh: State) -> State:
    """A checkpoint's state, checked against a fresh state of the model (names, dtypes, shapes);
    anything unreadable, damaged or of another model is "cannot resume from PATH: …"."""
    def fail(problem: str):
        raise DslError(None, f"cannot resume from {path}: {problem}")

    tensors, meta = _read_checkpoint(fail, path)
    step, seed = _check_meta(fail, tensors, meta)
    want = {**flatten_python(fresh.p, "p"), **(flatten_python(fresh.s, "opt") if fresh.s is not None else {})}
    have = {k: a for k, a in tensors.items() if k not in TENSORS}
    stray = [k for k in have if not k.startswith(("p.", "p[", "opt.", "opt["))]
    if stray:
        fail(f"it has '{stray[0]}', which no checkpoint has (only p.…, opt.… and {', '.join(TENSORS)})")
    other = f"it is not of this model (it was saved by {meta['model']})"
    ours = f"{model.path.name} (init, init_opt)"
    for name, a in want.items():
        if name not in have:
            fail(f"{other}: it has no '{name}', which {ours} has")
        b = have[name]
        if b.dtype != a.dtype or b.shape != a.shape:
            fail(f"{other}: its '{name}' is {_typename(b)}, {ours} makes {_typename(a)}")
    extra = sorted(set(have) - set(want))
    if extra:
        fail(f"{other}: it has '{extra[0]}', which {ours} does not have")
    losses = tensors["loss"].astype(np.float64).tolist() + [math.nan] * (step - len(tensors["loss"]))
    evals = list(zip(tensors["valid.step"].tolist(), tensors["valid.loss"].tolist()))
    return State(_rebuild(fresh.p, "p", have), _rebuild(fresh.s, "opt", have) if fresh.s is not None else None,
                 step, seed, losses, evals)


def checksum(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    """The CRC-32 of a checkpoint's metadata (but its crc32) and its tensors' names, dtypes, shapes
    and bytes, in hex: safetensors has no checksum, and a flipped bit in a weight reads as one."""
    crc = zlib.crc32(json.dumps(sorted((k, v) for k, v in metadata.items() if k != "crc32")).encode())
    for name in sorted(tensors):
        a = np.asarray(tensors[name], order="C")
        crc = zlib.crc32(a.reshape(-1).view(np.uint8), zlib.crc32(f"{name} {a.dtype.str} {a.shape}".encode(), crc))
    return f"{crc:08x}"


def _read_checkpoint(fail, path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A checkpoint's tensors and metadata; an .npz one's as if it were a .safetensors one."""
    try:
        if not path.endswith(".npz"):
            return safetensors.read_exact(path)
        return _from_npz(fail, npz.read(path))
    except (safetensors.SafetensorsError, npz.NpzError) as e:
        fail(e.problem)


def _from_npz(fail, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """An .npz checkpoint (format dslc-train-1) as tensors and metadata: its scalar members,
    checked for their kind, become the metadata."""
    fmt = arrays.pop("format", None)
    if fmt is None or fmt.shape != () or fmt.dtype.kind != "U" or str(fmt) != NPZ_FORMAT:
        fail(f"it is not a dslc train checkpoint (it has no format '{NPZ_FORMAT}')")
    meta = {"format": FORMAT}
    for name, kinds in (("model", "U"), ("step", "iu"), ("seed", "iu")):
        if name in arrays:
            a = arrays.pop(name)
            if a.dtype.kind not in kinds or a.ndim != 0:
                fail(f"its '{name}' is {_typename(a)}, not a scalar of {KIND_NAMES[kinds]}")
            meta[name] = str(a)
    meta["crc32"] = checksum(arrays, meta)            # the zip's own CRCs have checked its bytes
    return arrays, meta


def _check_meta(fail, tensors: dict[str, np.ndarray], meta: dict[str, str]) -> tuple[int, int]:
    """The checkpoint's own tensors and metadata: present, of their kind and rank, and
    consistent; its step and seed."""
    if meta.get("format") != FORMAT:
        fail(f"it is not a dslc train checkpoint (it has no format '{FORMAT}')")
    for name in METADATA:
        if name not in meta:
            fail(f"it has no '{name}'")
    if checksum(tensors, meta) != meta["crc32"]:
        fail("its contents do not match its crc32 (a damaged file?)")
    step, seed = (_whole_number(fail, name, meta[name]) for name in ("step", "seed"))
    for name, (kinds, rank) in TENSORS.items():
        if name not in tensors:
            fail(f"it has no '{name}'")
        a = tensors[name]
        if a.dtype.kind not in kinds or a.ndim != rank:
            fail(f"its '{name}' is {_typename(a)}, not a vector of {KIND_NAMES[kinds]}")
    if seed >= 2 ** 64:
        fail(f"its 'seed' is {seed}, not in [0, 2**64)")
    # one loss per step done, but Ctrl-C may fall between counting a step and storing its loss
    losses = len(tensors["loss"])
    if not losses <= step <= losses + 1:
        fail(f"its 'step' is {step} but it has {losses} steps' losses")
    if len(tensors["valid.step"]) != len(tensors["valid.loss"]):
        fail(f"it has {len(tensors['valid.step'])} 'valid.step' but {len(tensors['valid.loss'])} 'valid.loss'")
    return step, seed


def _whole_number(fail, name: str, text: str) -> int:
    """A metadata value that must be a whole number in decimal (of at most 20 digits, as 2**64)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 20):
        fail(f"its '{name}' is {reprlib.repr(text)}, not a whole number")
    return int(text)


def _rebuild(like: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """A value shaped like `like`, its leaves taken from arrays named as flatten_python names them."""
    if isinstance(like, Record):
        return Record(like.type_name, {k: _rebuild(v, f"{path}.{k}", arrays) for k, v in like.items()})
    if isinstance(like, dict):
        return {k: _rebuild(v, f"{path}.{k}", arrays) for k, v in like.items()}
    if isinstance(like, (list, tuple)):
        return type(like)(_rebuild(v, f"{path}[{i}]", arrays) for i, v in enumerate(like))
    if isinstance(like, Key):
        return Key(arrays[path].astype(np.uint32))
    return arrays[path]


# ---------------------------------------------------------------- the report

F32 = np.float32    # loss and evaluate's metrics are f32 scalars: printed as f32s, averaged or not


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s" if s >= 3600 else \
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s"


@dataclass
class Result:
    """What dsl.train returns; str() is the final report."""
    model: str
    params: Record
    opt_state: Any
    start_step: int
    steps: int
    seed: int
    train_seconds: float
    eval_seconds: float
    metrics: dict[str, dict[str, float]]          # split -> {"loss": …, evaluate's fields…}
    losses: list[float]
    evals: list[tuple[int, float]]
    samples: list[str] = field(default_factory=list)
    checkpoint: str | None = None
    plot: str | None = None

    def __str__(self) -> str:
        done = self.steps - self.start_step
        rate = f" ({done / self.train_seconds:.1f} steps/s)" if self.train_seconds > 0 and done else ""
        resumed = f", resumed at step {self.start_step}" if self.start_step else ""
        lines = [f"trained {self.model}: {self.steps} steps{resumed}, seed {self.seed}",
                 f"  time        {duration(self.train_seconds)} training{rate}, "
                 f"{duration(self.eval_seconds)} evaluating"]
        names = [n for n in ("loss", *sorted({k for m in self.metrics.values() for k in m} - {"loss"}))]
        for name in names:
            parts = [f"{split} {shortest(m[name], F32)}" for split, m in self.metrics.items() if name in m]
            lines.append(f"  {name:<11} " + "   ".join(parts))
        if self.losses:
            tail = self.losses[-100:]
            lines.append(f"  step loss   {shortest(np.mean(tail), F32)} (the mean of the last {len(tail)} "
                         "steps' batches)")
        if self.samples:
            lines.append("  samples     " + ", ".join(self.samples))
        if self.checkpoint:
            lines.append(f"  checkpoint  {self.checkpoint}")
        if self.plot:
            lines.append(f"  plot        {self.plot}")
        return "\n".join(lines)


# ---------------------------------------------------------------- the loop

def train(path: str, *, steps: int | None = None, seed: int | None = None, data: str | None = None,
          resume: str | None = None, checkpoint_dir: str | None = None, overwrite: bool = False,
          plot: str | None = None,
          dims: dict | None = None, hyper: dict | None = None, batch_size: int | None = None,
          device: str = "auto", numerics: str = "exact", progress: TextIO | None = sys.stderr,
          on_step: Callable[[int, dict, float], None] | None = None, final_eval: bool = True,
          micro_batches: int | None = None, rank_timeout: float = 600.0) -> Result:
    """Train the model file `path` (see the module's documentation); returns the report.

    on_step(t, batch, loss) is called after each step. A checkpoint_dir that holds checkpoints
    already is refused unless the run resumes (from any checkpoint) or overwrite=True, which
    deletes them before the first step. Ctrl-C (KeyboardInterrupt) saves a
    checkpoint of the last finished step, when there is a checkpoint_dir, and re-raises.
    final_eval=False leaves out the final evaluation and samples (the report then has the
    training losses only). micro_batches and rank_timeout: see docs/distributed.md; under an
    mpiexec of several ranks, only rank 0 evaluates, reports progress and writes files."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if plot:
        check_plot_path(plot)
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else None
    earlier = [] if ckpt_dir is None or resume is not None else checkpoints_in(ckpt_dir)
    if earlier and not overwrite:
        raise DslError(None, f"{ckpt_dir} already holds another run's checkpoints (the last is "
                             f"{earlier[-1].name}): give --resume {earlier[-1]} to go on from it, "
                             "or --overwrite to delete them and start afresh")
    model = Model(path, data=data, dims=dims, hyper=hyper, device=device, numerics=numerics)
    cfg = {**DEFAULTS, **model.loader.settings}
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise DslError(None, f"{model.loader.origin}: unknown SETTINGS '{unknown[0]}' "
                             f"(known: {', '.join(DEFAULTS)})")
    total = int(steps if steps is not None else cfg["steps"])
    bs = int(batch_size if batch_size is not None else cfg["batch_size"])
    eval_every = int(cfg["eval_every"] or max(1, total // 10))
    ckpt_every = int(cfg["checkpoint_every"] or eval_every)
    eval_n, eval_bs = int(cfg["eval_examples"]), int(cfg["eval_batch_size"])

    team = distributed.on_device(distributed.world(rank_timeout), model.prog.device)
    train_split = model.split("train", team)
    n_train = train_split.size
    m = micro_batches if micro_batches is not None or team.size == 1 else team.size
    if m is not None:
        distributed.check(m, team, bs if 0 < bs < n_train else n_train)
        require_update(model)
    if team.rank:                                     # rank 0 alone reports and writes
        progress = checkpoint_dir = plot = None
        final_eval = False
    valid = model.split("valid", team) if not team.rank else None
    valid_subset = valid.fetch(subset(valid.size, eval_n)) if valid is not None else None

    fresh_seed = 0 if seed is None else seed
    p, s = model.init(fresh_seed)
    state = State(p, s, 0, fresh_seed)
    if resume is not None:
        state = load_checkpoint(resume, model, state)
        if seed is not None and seed != state.seed:
            raise DslError(None, f"{resume} was trained with seed {state.seed}, not {seed}: "
                                 "leave out --seed to resume it")
    start = state.step
    buffers = require_train_loss(model, state.p) if m is not None else []
    last_ckpt: str | None = None
    remove_checkpoints(earlier)                   # overwrite: no step of the old run survives

    def checkpoint() -> None:
        nonlocal last_ckpt
        if ckpt_dir is not None:
            target = ckpt_dir / checkpoint_name(state.step)
            save_checkpoint(target, state, model)
            last_ckpt = str(target)

    bar = Progress(progress, start, max(total, start))
    if progress is not None and start < total:
        bar.log(f"training {model.path} for {total - start} steps from step {start} "
                f"(batch {bs if 0 < bs < n_train else n_train} of {n_train} examples, seed {state.seed}"
                f"{sharing(m, team)})")
    train_time = eval_time = 0.0
    t0 = time.perf_counter()
    try:
        for t in range(start, total):
            # (not np.arange(n_train)[…]: an index of every example, 0.2 ms a step of the names MLP)
            order = batch_indices(state.seed, t, n_train, bs)
            if m is None:
                batch = train_split.fetch(order)
                p, s, loss = model.step(state.p, state.s, batch, t, state.seed)
            else:
                batch = train_split.fetch(share(order, team))      # this rank's examples only
                p, s, loss = micro_step(model, state, batch, t, m, team, buffers)
            if not math.isfinite(loss):
                raise DslError(None, f"the loss is {loss} at step {t}: the training diverged "
                                     "(a smaller learning rate may help)")
            state = replace(state, p=p, s=s, step=t + 1)    # one assignment: Ctrl-C safe
            state.losses.append(loss)
            if on_step is not None:
                on_step(t, batch, loss)
            evaluation = None
            if state.step % eval_every == 0 and state.step < total and valid_subset is not None:
                e0 = time.perf_counter()
                scores = model.evaluate(state.p, valid_subset, state.seed, eval_bs)
                eval_time += time.perf_counter() - e0
                state.evals.append((state.step, scores["loss"]))
                evaluation = " ".join(f"valid {k} {shortest(v, F32)}" for k, v in scores.items())
            bar.update(state.step, loss, evaluation, eval_time)
            if state.step % ckpt_every == 0 and state.step < total:
                checkpoint()
    except KeyboardInterrupt:
        bar.close()
        checkpoint()
        bar.log(f"interrupted after step {state.step}" +
                (f": resume with --resume {last_ckpt}" if last_ckpt else " (no checkpoint directory)"))
        raise
    finally:
        bar.close()                               # a diagnostic starts on a line of its own
    train_time = time.perf_counter() - t0 - eval_time

    # the final report: every split, samples, checkpoint, plot
    e0 = time.perf_counter()
    metrics: dict[str, dict[str, float]] = {}
    samples: list[str] = []
    if final_eval:
        metrics["train"] = model.evaluate(state.p, train_split.fetch(subset(n_train, eval_n)),
                                          state.seed, eval_bs)
        for name in ("valid", "test"):
            d = model.split(name, team)
            if d is not None:
                metrics[name] = model.evaluate(state.p, d.all(), state.seed, eval_bs)
        if "valid" in metrics and (not state.evals or state.evals[-1][0] != state.step):
            state.evals.append((state.step, metrics["valid"]["loss"]))
        if model.has["sample"] and cfg["samples"]:
            samples = model.sample(state.p, state.seed)
    eval_time += time.perf_counter() - e0
    if total > start or resume is None:
        checkpoint()
    if plot:
        plot_losses(plot, state.losses, state.evals, title=model.path.name)
    return Result(str(model.path), state.p, state.s, start, state.step, state.seed, train_time,
                  eval_time, metrics, state.losses, state.evals, samples, last_ckpt, plot)


# ---------------------------------------------------------------- micro-batches and ranks

def require_update(model: Model) -> None:
    if not model.has["update"]:
        raise DslError(None, f"{model.path} defines no 'update': training on micro-batches or "
                             "several ranks needs update(p, g, …) -> P (with init_opt, "
                             "update(p, s, g, …) -> (P, S)), the optimizer step given the "
                             "gradient, which step may call; see docs/distributed.md")


def require_train_loss(model: Model, p: Record) -> list[str]:
    """The names of p's buffers, which micro-batches and ranks move only through train_loss."""
    buffers = model.buffers(p)
    if buffers and not model.has["train_loss"]:
        raise DslError(None, f"{model.path} has buffers ({buffers[0]}, …) that training on "
                             "micro-batches or several ranks would never move: define "
                             "train_loss(p, <batch>) -> (f32, P), the loss and p with its "
                             "buffers moved by the batch, which step may call; see "
                             "docs/distributed.md")
    leaves = flatten_python(p, "p")
    counts = [b for b in buffers if leaves[b].dtype.kind != "f"]
    if counts:
        raise DslError(None, f"{model.path}: the buffer {counts[0]} is {_typename(leaves[counts[0]])}: "
                             "training on micro-batches or several ranks averages buffers, "
                             "which must be floats")
    return buffers


def micro_step(model: Model, state: State, mine: dict[str, np.ndarray], t: int, m: int,
               team: distributed.Team, buffers: list[str]) -> tuple[Record, Any, float]:
    """Step t as m micro-batches, of which `mine` holds this rank's examples: their losses,
    gradients and moved `buffers`, the mean of all m along distributed's tree, then `update`
    of the parameters with the mean buffers, on every rank alike."""
    first = team.rank * (m // team.size)              # this rank's first micro-batch
    size, k = len(next(iter(mine.values()))) * team.size // m, step_key(state.seed, t)

    def leaf(i: int) -> distributed.Partial:
        rows = {name: a[(i - first) * size:(i - first + 1) * size] for name, a in mine.items()}
        loss, g, moved = model.gradient(state.p, rows, fold_in(k, i))
        moved = flatten_python(moved, "p", team.keep)
        if not set(buffers) <= moved.keys():
            raise DslError(model._def("train_loss").name_span, "train_loss must return (loss, "
                           "parameters): the parameters it was given, with their buffers moved")
        return [team.keep(loss), *flatten_python(g, "g", team.keep).values(), *(moved[b] for b in buffers)]

    loss, *leaves = distributed.reduce(leaf, m, team, t)
    g = _rebuild(state.p, "g", dict(zip(flatten_python(state.p, "g"), leaves)))
    kept = flatten_python(state.p, "p", lambda a: a)
    p = _rebuild(state.p, "p", {**kept, **dict(zip(buffers, leaves[len(kept):]))})
    p, s = model.update(p, state.s, g, t)
    return p, s, float(loss)


def share(order: np.ndarray, team: distributed.Team) -> np.ndarray:
    """The examples of this rank's micro-batches."""
    part = len(order) // team.size
    return order[team.rank * part:(team.rank + 1) * part]


def _runtime_number(p: ast.Param, value: Any) -> Any:
    """A Python number for a float scalar parameter (a learning rate) as the 0-d array a call
    makes of it, made here: a value that changes by step (a schedule) then keeps the call's
    signature (dsl/fastcall.py), which holds a float by its type but an int by its value."""
    if type(value) in (int, float) and isinstance(p.type, ast.NamedType) \
            and len(p.type.name) == 1 and p.type.name[0] in FLOAT_DTYPES:
        return array_from_python(value, p.type.name[0], p.type, p.name)
    return value


def sharing(m: int | None, team: distributed.Team) -> str:
    if m is None:
        return ""
    return f", {m} micro-batches" + (f" on {team.size} ranks" if team.size > 1 else "")


def subset(size: int, n: int) -> np.ndarray:
    """The positions of at most n examples of a split of `size`: a fixed random choice, in the
    split's order."""
    if n <= 0 or size <= n:
        return np.arange(size)
    return np.sort(np.random.Generator(np.random.PCG64(0)).choice(size, n, replace=False))
