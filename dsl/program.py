"""The Python API (LANGUAGE.md §12): programs loaded from .bend text, called on NumPy arrays.

A call specialises the entry point for its inputs' types (checking and lowering it to IR,
cached per input signature) and runs it. Records come back as `Record`s, keys as `Key`s."""
from __future__ import annotations

import difflib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from frontend import ast
from frontend.check import Checker, deep, raise_collected
from frontend.calls import _not_differentiable
from frontend.diagnostics import CheckError, DslError, Note, Source
from frontend.lower import Layout, LoweringError, flatten
from frontend.parser import parse
from frontend.unify import eval_dim
from frontend.resolve import Program as Resolved, load_program, lookup_type
from frontend.values import KeyV, ListV, RecordV, StaticV, TensorV, TupleV
from ir import interp
from ir.ad import grad_function
from ir.core import Builder, Function, tensor_type
from ir.dims import Dim
from ir.ops.base import NUMPY_DTYPES
from ir.passes import for_backends, optimize
from ir.types import FLOAT_DTYPES, KeyType


class Record(dict):
    """A record value: a dict of its fields, also readable as attributes (p.W1)."""

    def __init__(self, type_name: str, fields: dict[str, Any]):
        super().__init__(fields)
        self.type_name = type_name

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"{self.type_name}{dict.__repr__(self)}"


@dataclass(frozen=True)
class Key:
    """A random key: two 32-bit words (docs/random.md)."""
    words: np.ndarray

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and np.array_equal(self.words, other.words)

    def __hash__(self) -> int:
        return hash(self.words.tobytes())


def key(seed: int) -> Key:
    """dsl.key(seed): the key a program's key(seed) makes."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, (bool, np.bool_)) or \
            not 0 <= seed < 2 ** 64:
        raise DslError(None, f"a seed is an integer in [0, 2**64), got {seed!r}")
    seed = int(seed)
    return Key(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32))


class NoSuchName(DslError, AttributeError):
    """A name a program does not define: a DslError like every user error, and an
    AttributeError too, so that hasattr(prog, "f") and getattr(prog, "f", None) keep working."""


def did_you_mean(name: Any, candidates) -> str:
    """' (did you mean 'loss'?)' when a candidate is close to `name`, else ''."""
    close = difflib.get_close_matches(name, list(candidates), n=1) if isinstance(name, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class Spec:
    """A tensor input's type without its array: what --dims makes for `dslc ir`, `grad` and
    `compile`, which must not allocate the arrays whose shapes they print."""
    dtype: str
    shape: tuple[int, ...]


MAX_BYTES = 2 ** 40        # no array may be larger (nor larger than the machine's memory)
COMPILED = "an array of compiled code may take (2**40)"
MAX_DIM = 2 ** 40          # a dimension given by --dims or dims=
MAX_LIST = 2 ** 16         # a list's length given by --dims (lists are unrolled)
MAX_INT = 2 ** 63          # a static int is in (-MAX_INT, MAX_INT)


def memory_bytes() -> int:
    """The array size a run may not exceed: MAX_BYTES, or the machine's memory if smaller."""
    try:
        return min(MAX_BYTES, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return MAX_BYTES


@dataclass(frozen=True)
class Lowered:
    """An entry point specialised for one input signature."""
    function: Function
    outputs: Layout
    params: list[Layout]              # each parameter's structure
    arg_leaves: list[list[int]]       # for each parameter, the positions of its leaves


@dataclass(frozen=True)
class Inputs:
    """A call's arguments: their abstract values (the specialisation key) and their arrays."""
    abstract: list
    arrays: list[np.ndarray]
    arg_leaves: list[list[int]]

    @property
    def key(self) -> tuple:
        return tuple(signature_of(a) for a in self.abstract)


class Program:
    """A loaded .bend program; its functions are attributes: prog.loss(p, x, y)."""

    def __init__(self, resolved: Resolved, device: str = "auto"):
        if device not in DEVICES:
            raise DslError(None, f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        self._resolved = resolved
        self.device = pick_device(device)
        self._cache: dict[Any, Lowered] = {}
        self._last: dict[str, tuple[Lowered, Inputs]] = {}
        self._grads: dict[Any, Function] = {}
        self._executables: dict[int, Any] = {}
        self._sized: dict[int, Function] = {}      # the functions whose arrays fit in memory

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        self._def(name)
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def _def(self, name: str) -> ast.Def:
        if not isinstance(name, str):
            raise DslError(None, f"a function is named by a string, got {type(name).__name__}")
        entity = self._resolved.main.names.get(name)
        if entity is None or entity.kind != "def":
            names = self.functions()
            raise NoSuchName(None, f"{self._resolved.main.path} defines no function {name!r}"
                                   f"{did_you_mean(name, names)}",
                             [Note(f"its entry points are {', '.join(names)}" if names else
                                   "it has no entry points (functions that annotate their parameters)")])
        return entity.node

    def functions(self) -> list[str]:
        """The names of the entry points the program's file defines (the functions that
        annotate all their parameters)."""
        main = self._resolved.main
        return sorted(n for n, e in main.names.items() if e.kind == "def" and e.module is main
                      and all(p.type is not None for p in e.node.params))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        low, inputs = self.lower(name, args, kwargs)
        return unflatten(low.outputs, self._run(name, low.function, inputs.arrays))

    def _run(self, name: str, fn: Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
        span = self._def(name).name_span
        if id(fn) not in self._sized:                # (fn is kept, so its id stays its own)
            _check_sizes(span, name, fn, memory_bytes(), "an array may take here (the smaller "
                         "of 2**40 and this machine's memory)")
            self._sized[id(fn)] = fn
        try:
            if self.device == "reference":
                return interp.run(fn, arrays)
            return self.executable(fn).run(arrays)
        except interp.EvalError as e:
            raise DslError(span, f"while running '{name}': {e}") from None
        except MemoryError:
            raise DslError(span, f"while running '{name}': out of memory (its arrays do not fit "
                                 "in this machine's memory together)") from None

    def executable(self, fn: Function):
        """fn compiled for this program's device (once per function)."""
        if id(fn) not in self._executables:
            if self.device == "cuda":
                from runtime.cuda import Executable
            else:
                from runtime.cpu import Executable
            self._executables[id(fn)] = (fn, Executable(fn, fn.name))
        return self._executables[id(fn)][1]

    def grad(self, name: str, wrt: str | tuple[str, ...], has_aux: bool = False):
        """grad(f, wrt=…) from Python: the gradient function of entry `name`."""
        _grad_options(self._def(name), wrt, has_aux)
        return lambda *args, **kwargs: self._grad(name, wrt, has_aux, False, args, kwargs)

    def value_and_grad(self, name: str, wrt: str | tuple[str, ...], has_aux: bool = False):
        _grad_options(self._def(name), wrt, has_aux)
        return lambda *args, **kwargs: self._grad(name, wrt, has_aux, True, args, kwargs)

    def _grad(self, name, wrt, has_aux, with_value, args, kwargs):
        d = self._def(name)
        names = [p.name for p in d.params]
        wanted = _wrt_names(d, wrt)
        low, inputs = self.lower(name, args, kwargs)
        fn = low.function
        _differentiable(d, inputs, wanted)
        positions = _float_leaves(d, low, wanted)
        key = (id(fn), tuple(positions))
        if key not in self._grads:
            self._grads[key] = optimize(grad_function(fn, positions, with_value=True))
        outs = self._run(name, self._grads[key], inputs.arrays)
        grads = dict(zip(positions, outs[len(fn.results):]))
        results = []
        for w in wanted:
            k = names.index(w)
            leaves = [grads[i] if i in grads else np.zeros_like(inputs.arrays[i]) for i in low.arg_leaves[k]]
            results.append(unflatten(low.params[k], leaves))
        g = results[0] if isinstance(wrt, str) else tuple(results)
        value = unflatten(low.outputs, outs[:len(fn.results)])
        if has_aux:
            if not (isinstance(value, tuple) and len(value) == 2):
                raise DslError(d.name_span, "with has_aux=True the function must return (loss, aux)")
            return (value, g) if with_value else (g, value[1])
        return (value, g) if with_value else g

    def source(self, name: str, grad: str | tuple[str, ...] | None = None,
               dims: dict[str, int] | None = None) -> str:
        """An entry point (or its gradient with respect to `grad`) as .bend source, specialised
        for `dims`, or else for the inputs it was last called with."""
        from ir import printer
        d = self._def(name)
        low, inputs = self._specialised(d, dims)
        fn = low.function
        names = [p.name for p in d.params]
        header = f"# {name}" + (f", differentiated with respect to {grad}," if grad else "") + \
                 f" specialised for {_describe_inputs(d, inputs)}"
        runtime = [(p.name, a) for p, a in zip(d.params, inputs.abstract) if not isinstance(a, StaticV)]
        bindings = [expr for _, a in runtime for expr in _leaf_exprs(a, _)]
        signature = ", ".join(f"{n}: {_annotation(a)}" for n, a in runtime)
        decls = _declarations([a for _, a in runtime])
        if grad is None:
            text = printer.to_bend(fn, name, signature=signature, bindings=bindings,
                                   returns=None)
            return "\n\n".join([header, *decls, text]) + "\n"
        wanted = _wrt_names(d, grad)
        _differentiable(d, inputs, wanted)
        positions = _float_leaves(d, low, wanted)
        gfn = optimize(grad_function(fn, positions))
        slots = iter(range(len(positions)))
        parts = [_result_expr(inputs.abstract[names.index(w)], slots) for w in wanted]
        result = parts[0] if isinstance(grad, str) else "(" + ", ".join(parts) + ")"
        returns = _annotation(inputs.abstract[names.index(grad)]) if isinstance(grad, str) else \
            "(" + ", ".join(_annotation(inputs.abstract[names.index(w)]) for w in wanted) + ")"
        text = printer.to_bend(gfn, f"{name}_grad", signature=signature, bindings=bindings,
                               result=result, returns=returns)
        return "\n\n".join([header, *decls, text]) + "\n"

    def compile_to(self, name: str, target: str, out: str, dims: dict[str, int] | None = None,
                   grad: str | tuple[str, ...] | None = None) -> dict:
        """Write an entry point's kernels into the folder `out` (object code for 'cpu', PTX for
        'ptx') with manifest.json: parameters, results, kernels with their buffers and launch
        shapes, and the steps that run them. Returns the manifest."""
        import json
        from backend import cpu, nvptx, schedule
        from runtime.cuda import gpu_kernels
        if target not in TARGETS:
            raise DslError(None, f"target= is one of {', '.join(TARGETS)}, got {target!r}")
        d = self._def(name)
        low, inputs = self._specialised(d, dims)
        fn = low.function
        if grad is not None:
            _differentiable(d, inputs, _wrt_names(d, grad))
            positions = _float_leaves(d, low, _wrt_names(d, grad))
            fn = optimize(grad_function(fn, positions, with_value=True))
        _check_sizes(d.name_span, name, fn, MAX_BYTES, COMPILED)
        fn = for_backends(fn)
        plan = schedule.schedule(fn, name)
        try:
            folder = Path(out)
            folder.mkdir(parents=True, exist_ok=True)
        except (OSError, TypeError, ValueError) as e:       # ValueError: a NUL in the path
            raise DslError(None, f"cannot write into {out!r}: {e}") from None
        ids = {v: i for i, v in enumerate(fn.params)}
        for step in plan.steps:
            for v in schedule.writes(step):
                ids.setdefault(v, len(ids))
        gpu = gpu_kernels(plan, name) if target == "ptx" else None
        kernels = []
        for k in (gpu.kernels if gpu else plan.kernels):
            kind = "rows" if k.is_rows else "reduction" if k.is_reduction else "map"
            entry = {"name": k.name, "buffers": [[dt, list(shape)] for dt, shape in k.buffers],
                     "kind": kind, "extent": k.extent}
            if gpu:
                shape = gpu.launches[k.name]
                entry["launch"] = {"entry": shape.entry, "extent": shape.extent,
                                   "block": shape.block, "grid": shape.grid}
            kernels.append(entry)
        if gpu:
            (folder / "kernels.ptx").write_text(nvptx.ptx(gpu.kernels, matmuls=gpu.matmuls,
                                                          gathers=gpu.gather_kernels))
        else:
            mod = llvm_module(cpu.module_ir(plan.kernels))
            (folder / "kernels.o").write_bytes(cpu.target_machine().emit_object(mod))

        def step_entry(s) -> dict:
            if isinstance(s, schedule.KernelStep):
                return {"kernel": s.kernel.name, "args": [ids[v] for v in s.args]}
            inputs, outputs = [ids[v] for v in s.op.inputs], [ids[v] for v in s.op.outputs]
            if gpu and id(s.op) in gpu.copies:
                return {"kernel": gpu.copies[id(s.op)].name, "args": inputs + outputs}
            if gpu and id(s.op) in gpu.gathers:            # a gather kernel, indices from the host
                prim, dtype = gpu.gathers[id(s.op)]
                return {"gather": prim, "entry": nvptx.gather_entry(prim, dtype),
                        "axis": s.op.attrs.get("axis", 0), "inputs": inputs, "outputs": outputs}
            if isinstance(s, schedule.ContractStep):      # dslc's contraction kernel
                entry = {"matmul": s.op.outputs[0].dtype, "inputs": inputs, "outputs": outputs}
                if s.epilogue:                              # a kernel run after the product
                    entry["epilogue"] = step_entry(s.epilogue)
                return entry
            return {"host": s.op.prim, "inputs": inputs, "outputs": outputs}

        manifest = {
            "entry": name, "target": target, "gradient_of": grad,
            "params": [{"id": ids[v], "dtype": v.dtype, "shape": list(v.shape)} for v in fn.params],
            "results": [{"id": ids[v], "dtype": v.dtype, "shape": list(v.shape)} for v in fn.results],
            "kernels": kernels,
            "steps": [step_entry(s) for s in plan.steps],
        }
        if gpu:
            manifest["matmul_entries"] = [e for e in gpu.entries if e.startswith("dslc_matmul_")]
            manifest["gather_entries"] = [nvptx.gather_entry(*g) for g in gpu.gather_kernels]
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest

    def inputs_from_arrays(self, name: str, arrays: dict[str, np.ndarray],
                           statics: dict[str, int]) -> dict[str, Any]:
        """An entry's arguments from named arrays (`p.W1`, `xs[0]`, as `dslc run` reads them);
        static parameters from `statics`. Every array must be named exactly after one input,
        with its dtype and rank; every static value must name a static parameter."""
        d = self._def(name)
        used: set[str] = set()
        given = _Given(statics, d)

        def make(t: ast.TypeExpr, path: str, module) -> Any:
            tname = "/".join(t.name) if isinstance(t, ast.NamedType) else None
            if tname in ("int", "float", "bool"):
                return given.static(t, tname, path)
            if isinstance(t, ast.TupleTypeExpr):
                return tuple(make(i, f"{path}[{k}]", module) for k, i in enumerate(t.items))
            if tname == "List":
                n = 0
                while any(k == f"{path}[{n}]" or k.startswith((f"{path}[{n}].", f"{path}[{n}]["))
                          for k in arrays):
                    n += 1
                return [make(t.args[0], f"{path}[{i}]", module) for i in range(n)]
            entity = lookup_type(t.name, module) if isinstance(t, ast.NamedType) else None
            if entity is not None and entity.kind == "object":
                return {f.name: make(f.type, f"{path}.{f.name}", entity.module) for f in entity.node.fields}
            if path not in arrays:
                unused = [k for k in arrays if k not in used]
                raise DslError(t.span, f"the inputs have no array '{path}' for '{name}'"
                                       f"{did_you_mean(path, unused)}")
            used.add(path)
            return _array_input(arrays[path], t, tname, path)

        for p in d.params:
            if p.type is None:
                raise DslError(p.span, f"entry point '{name}' must annotate its parameter '{p.name}'")
        out = {p.name: make(p.type, p.name, self._resolved.main) for p in d.params}
        extra = sorted(set(arrays) - used)
        if extra:
            raise DslError(d.name_span, f"'{name}' has no input for the array {extra[0]!r}: each array "
                                        f"is named after a parameter, a record's field (p.W) or a "
                                        f"list's or tuple's item (xs[0]){did_you_mean(extra[0], used)}")
        given.check_all_used()
        return out

    def ir(self, name: str, dims: dict[str, int] | None = None, level: str = "tensor") -> str:
        """An entry point at a stage of compilation, as text: 'tensor' (the IR), 'loops' (the
        CPU kernels' loop IR and host steps) or 'llvm' (their LLVM IR)."""
        from ir import printer
        if level not in LEVELS:
            raise DslError(None, f"level= is one of {', '.join(LEVELS)}, got {level!r}")
        low, _ = self._specialised(self._def(name), dims)
        if level == "tensor":
            return printer.to_text(low.function)
        from backend import cpu, loops, schedule
        _check_sizes(self._def(name).name_span, name, low.function, MAX_BYTES, COMPILED)
        plan = schedule.schedule(for_backends(low.function), name)
        if level == "llvm":
            return str(cpu.module_ir(plan.kernels))
        if level == "ptx":
            from backend import nvptx
            from runtime.cuda import gpu_kernels
            gpu = gpu_kernels(plan, name)
            return nvptx.ptx(gpu.kernels, matmuls=gpu.matmuls, gathers=gpu.gather_kernels)
        def text(s) -> str:
            if isinstance(s, schedule.KernelStep):
                return loops.to_text(s.kernel)
            if isinstance(s, schedule.ContractStep) and s.epilogue:
                epilogue = loops.to_text(s.epilogue.kernel).replace("\n", "\n  ")
                return f"host {s.op.prim}, on each block of rows it finishes:\n  {epilogue}"
            return f"host {s.op.prim}"
        return "\n".join(text(s) for s in plan.steps) + "\n"

    def _specialised(self, d: ast.Def, dims: dict[str, int] | None) -> tuple[Lowered, Inputs]:
        if dims is not None:
            return self.lower(d.name, (), abstract_inputs(d, self._resolved.main, dims))
        if d.name not in self._last:
            raise DslError(d.name_span, f"give dims= (or call '{d.name}' once) so that its "
                                        "shapes are known")
        return self._last[d.name]

    def lower(self, name: str, args: tuple, kwargs: dict) -> tuple[Lowered, Inputs]:
        """Check and lower entry `name` for these inputs (cached per input signature)."""
        d = self._def(name)
        for p in d.params:
            if p.type is None:
                raise DslError(p.span, f"entry point '{name}' must annotate its parameter '{p.name}'")
        b = Builder(d.name)
        inputs = self._inputs(b, d, _bind_python(d, args, kwargs))
        key = (name, inputs.key)
        low = self._cache.get(key)              # one lookup: a deep key's hash is not kept
        if low is None:
            low = self._cache[key] = self._lowered(d, b, inputs)
        self._last[name] = (low, inputs)
        return low, inputs

    def _inputs(self, b: Builder, d: ast.Def, bound: dict[str, Any]) -> Inputs:
        abstract, arrays, arg_leaves = [], [], []
        for p in d.params:
            start = len(arrays)
            abstract.append(from_python(b, bound[p.name], p.type, self._resolved.main, p.name, arrays))
            arg_leaves.append(list(range(start, len(arrays))))
        return Inputs(abstract, arrays, arg_leaves)

    def _lowered(self, d: ast.Def, b: Builder, inputs: Inputs) -> Lowered:
        """d lowered for these inputs, from the on-disk cache (runtime/cache.py) when the same
        sources were lowered for the same input signature before."""
        from runtime import cache
        sources = sorted((m.path, m.source.text) for m in self._resolved.modules.values())
        k = cache.key("lowered", cache.code_digest("frontend", "ir", "dsl"), repr(sources),
                      d.name, repr(inputs.key))
        return cache.memo(k, lambda: deep(lambda: self._lower(d, b, inputs)))

    def _lower(self, d: ast.Def, b: Builder, inputs: Inputs) -> Lowered:
        checker = Checker(self._resolved, builder=b)
        try:
            result = checker.specialise(d, self._resolved.main, inputs.abstract)
        except LoweringError as e:          # a user error met while tracing: report that first
            raise_collected(checker.errors)
            raise CheckError(d.name_span, str(e)) from None
        raise_collected(checker.errors)
        try:
            result = checker.realize(result)
            leaves, layout = flatten(result)
        except LoweringError as e:
            raise CheckError(d.name_span, str(e)) from None
        fn = optimize(b.finish([leaf.ir for leaf in leaves]))
        return Lowered(fn, layout, [flatten(a)[1] for a in inputs.abstract], inputs.arg_leaves)


LEVELS = ("tensor", "loops", "llvm", "ptx")     # what Program.ir shows
TARGETS = ("cpu", "ptx")                         # what Program.compile_to writes
DEVICES = ("auto", "cpu", "cuda", "reference")   # auto: $DSLC_DEVICE, else the GPU if usable, else the CPU


def pick_device(device: str) -> str:
    """The device a program runs on; 'cuda' only where a GPU is usable (else a DslError)."""
    if device == "auto":
        device = os.environ.get("DSLC_DEVICE", "")
        if not device:
            from runtime import cuda
            return "cuda" if cuda.usable() else "cpu"
        if device not in DEVICES or device == "auto":
            raise DslError(None, f"DSLC_DEVICE must be one of cpu, cuda, reference, got {device!r}")
    if device == "cuda":
        from runtime import cuda
        cuda.driver()                     # raises DslError saying why no GPU is usable
    return device


def load(path: str, device: str = "auto") -> Program:
    """dsl.load("model.bend"): its functions run on `device` ('auto': $DSLC_DEVICE, else the
    GPU where one is usable, else the CPU backend; 'reference': the NumPy interpreter, the
    definition)."""
    path = _path(path, "dsl.load's path")
    return Program(deep(lambda: load_program(path, parse=_parse)), device)


def loads(text: str, name: str = "<string>", device: str = "auto") -> Program:
    """dsl.loads(source_text, name="model.bend"): imports resolve from the current folder."""
    name = _path(name, "dsl.loads's name")
    if not isinstance(text, str):
        raise DslError(None, f"dsl.loads takes the source as a str, got {_kind(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DslError(None, f"the source text is not valid Unicode: a lone surrogate "
                             f"{text[e.start]!r} at offset {e.start}") from None
    return Program(deep(lambda: load_program(name, text, parse=_parse)), device)


def _path(value: Any, what: str) -> str:
    """A path from Python (a str, bytes or path object) as a str the file system can take."""
    try:
        path = os.fsdecode(value)
        os.fsencode(path)
    except (TypeError, UnicodeError):
        raise DslError(None, f"{what} must be a path the file system can name, got "
                             f"{repr(value) if isinstance(value, str) else _kind(value)}") from None
    if "\0" in path:
        raise DslError(None, f"{what} cannot hold a NUL character, got {path!r}")
    return path


def _parse(source: Source) -> ast.Module:
    """A module's syntax tree, from the on-disk cache when this parser read the same text under
    the same path before (parsing the standard library is most of a warm load's wait)."""
    from runtime import cache
    k = cache.key("ast", cache.code_digest("frontend"), ascii(source.path), source.text)
    return cache.memo(k, lambda: parse(source))


# ---------------------------------------------------------------- Python values in and out

def _bind_python(d: ast.Def, args: tuple, kwargs: dict) -> dict[str, Any]:
    names = [p.name for p in d.params]
    if len(args) > len(names):
        raise DslError(d.name_span, f"'{d.name}' takes {len(names)} arguments but {len(args)} were given")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise DslError(d.name_span, f"'{d.name}' has no parameter {k!r}{did_you_mean(k, names)}"
                           if k not in names else f"'{d.name}' got two values for '{k}'")
        bound[k] = v
    for p in d.params:
        if p.name not in bound and p.default is not None:
            bound[p.name] = _literal_default(p)
    missing = [n for n in names if n not in bound]
    if missing:
        raise DslError(d.name_span, f"'{d.name}' is missing the argument '{missing[0]}'")
    return bound


def _literal_default(p: ast.Param) -> Any:
    """An entry parameter's default, which must be a literal (a number, bool or string)."""
    e, sign = p.default, 1
    if isinstance(e, ast.UnaryOp) and e.op == "-":
        e, sign = e.operand, -1
    if isinstance(e, (ast.Int, ast.Float)):
        return sign * e.value
    if isinstance(e, (ast.Bool, ast.Str)) and sign == 1:
        return e.value
    raise DslError(p.default.span, f"an entry point's default for '{p.name}' must be a literal")


DTYPE_NAMES = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}     # (one name each)


def from_python(b: Builder, value: Any, t: ast.TypeExpr, mod, where: str, arrays: list):
    """The abstract value of a Python input for a parameter annotated t; arrays become
    parameters of b and are appended to `arrays` in the same order."""
    name = "/".join(t.name) if isinstance(t, ast.NamedType) else None
    if isinstance(t, ast.TensorTypeExpr) or name in NUMPY_DTYPES and name != "bool":
        dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else name
        arr = value if isinstance(value, (np.ndarray, Spec)) or _on_device(value) else \
            _array_from_python(value, dtype, t, where)
        dt = arr.dtype if isinstance(arr, Spec) else DTYPE_NAMES.get(arr.dtype)
        if dt is None:
            raise DslError(t.span, f"'{where}' must be an array of a dslc dtype "
                                   f"({', '.join(NUMPY_DTYPES)}), got {arr.dtype}")
        arrays.append(arr)
        param = b.param(tensor_type(dt, arr.shape))
        return TensorV(param.type, ir=param)
    if name in ("int", "float", "bool"):
        kinds = {"int": (int, np.integer), "float": (int, float, np.integer, np.floating), "bool": (bool, np.bool_)}
        if not isinstance(value, kinds[name]) or name != "bool" and isinstance(value, (bool, np.bool_)):
            raise DslError(t.span, f"'{where}' is a static {name}, got {_kind(value)}")
        if name == "int" and not -MAX_INT < int(value) < MAX_INT:
            raise DslError(t.span, f"'{where}' is a static int, which must lie strictly between "
                                   f"-2**63 and 2**63, got {int(value)}")
        if name == "float" and isinstance(value, (int, np.integer)) and not abs(int(value)) < 2 ** 1024:
            raise DslError(t.span, f"'{where}' is a static float, got an int too large for one")
        return StaticV(name, _static(name, value))
    if name == "Key":
        if not (isinstance(value, Key) and isinstance(value.words, np.ndarray)
                and value.words.dtype == np.uint32 and value.words.shape == (2,)):
            raise DslError(t.span, f"'{where}' must be a key (dsl.key(seed)), got {_kind(value)}")
        arrays.append(value.words)
        return KeyV(ir=b.param(KeyType()))
    if isinstance(t, ast.TupleTypeExpr) or name == "List":
        items = t.items if isinstance(t, ast.TupleTypeExpr) else None
        if not isinstance(value, (list, tuple)):
            raise DslError(t.span, f"'{where}' must be a {'tuple' if items else 'list'}, got {_kind(value)}")
        if items is not None and len(items) != len(value):
            raise DslError(t.span, f"'{where}' must be a tuple of {len(items)} items, got {len(value)}")
        parts = [from_python(b, v, items[i] if items else t.args[0], mod, f"{where}[{i}]", arrays)
                 for i, v in enumerate(value)]
        return TupleV(tuple(parts)) if items is not None else ListV.of(parts)
    entity = lookup_type(t.name, mod)
    if entity is not None and entity.kind == "object":
        record = entity.node.name
        if not isinstance(value, dict):
            raise DslError(t.span, f"'{where}' must be a {record} record (a dict), got {_kind(value)}")
        names = [f.name for f in entity.node.fields]
        extra = [k for k in value if k not in names]
        if extra:
            raise DslError(t.span, f"'{where}' has a field {extra[0]!r} that {record} does not have"
                                   f"{did_you_mean(extra[0], [n for n in names if n not in value])}",
                           [Note(f"the fields of {record} are {', '.join(names)}", entity.node.span)])
        fields = []
        for f in entity.node.fields:
            if f.name not in value:
                raise DslError(t.span, f"'{where}' lacks the field '{f.name}' of {record}",
                               [Note(f"the fields of {record} are {', '.join(names)}", entity.node.span)])
            fields.append((f.name, from_python(b, value[f.name], f.type, entity.module,
                                               f"{where}.{f.name}", arrays)))
        return RecordV(record, tuple(fields), entity)
    raise DslError(t.span, f"a value of type '{name}' cannot be passed from Python")


def _kind(value: Any) -> str:
    """What a Python value is, for a diagnostic: its type, and for arrays their dtype."""
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}"
    return "None" if value is None else type(value).__name__


def _array_from_python(value: Any, dtype: str, t: ast.TypeExpr, where: str) -> np.ndarray:
    """A Python number or nested list of numbers as an array of `dtype`; anything else, or
    a number the dtype cannot hold exactly (1.5 or 2**40 for i32, 1e300 for f32), is an error."""
    want = f"'{where}' must be {t.span.source.text[t.span.start:t.span.end]}"
    hint = "a NumPy array, a number or a nested list of numbers"
    if not isinstance(value, (bool, int, float, list, tuple, np.generic)):
        raise DslError(t.span, f"{want} ({hint}), got {_kind(value)}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise DslError(t.span, f"{want} ({hint}), got a ragged list (its rows differ in length)") from None
    if arr.dtype.kind not in "biuf":
        what = "a number too large for any dtype" if arr.dtype.kind == "O" and _all_ints(value) else \
            f"a {type(value).__name__} holding {'non-numbers' if arr.dtype.kind != 'c' else 'complex numbers'}"
        raise DslError(t.span, f"{want} ({hint}), got {what}")
    target = NUMPY_DTYPES.get(dtype)
    if target is None:
        raise DslError(t.span, f"{want}: pass a NumPy array, since NumPy has no {dtype}")
    target = np.dtype(target)
    if target.kind == "b":
        if arr.dtype.kind != "b":
            raise DslError(t.span, f"{want}: bools, got {'floats' if arr.dtype.kind == 'f' else 'ints'}")
        return arr.astype(target)
    if target.kind in "iu":
        if arr.dtype.kind == "f" and arr.size and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
            raise DslError(t.span, f"{want}: integers, got a float that is not one")
        info = np.iinfo(target)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise DslError(t.span, f"{want}: integers in [{info.min}, {info.max}], "
                                   f"got {arr.min() if arr.min() < info.min else arr.max()}")
        return arr.astype(target)
    with np.errstate(over="ignore"):
        out = arr.astype(target)
    if not np.array_equal(np.isfinite(out), np.isfinite(arr)):
        raise DslError(t.span, f"{want}: a number too large for {dtype}")
    return out


def _all_ints(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_all_ints(v) for v in value)
    return isinstance(value, int)


def _on_device(value: Any) -> bool:
    """A GPU runtime's array (runtime/cuda.py), passed on as it is, without a copy."""
    cuda = sys.modules.get("runtime.cuda")          # not loaded: no such array exists
    return cuda is not None and isinstance(value, cuda.DeviceArray)


def abstract_inputs(d: ast.Def, mod, dims: dict[str, int]) -> dict[str, Any]:
    """Inputs of an entry made concrete by --dims: Specs of the annotated shapes (their types
    without arrays), static values (and list lengths, as `name=3`) from dims, key(0) for keys.
    Every name in dims must be one of the entry's (a dimension, a static or a list)."""
    given = _Given(dims, d)
    out = _given_inputs(d, mod, given)
    given.check_all_used()
    return out


def example_inputs(d: ast.Def, mod, dims: dict[str, int]) -> dict[str, Any]:
    """abstract_inputs with zero arrays for the Specs, for tests and benchmarks; names in dims
    that the entry does not have are ignored (one dict can then serve several entries)."""
    def real(v: Any) -> Any:
        match v:
            case Spec():
                return np.zeros(v.shape, NUMPY_DTYPES.get(v.dtype, np.float32))
            case dict():
                return {k: real(i) for k, i in v.items()}
            case list() | tuple():
                return type(v)(real(i) for i in v)
        return v
    return real(_given_inputs(d, mod, _Given(dims, d)))


def _given_inputs(d: ast.Def, mod, given: _Given) -> dict[str, Any]:

    def make(t: ast.TypeExpr, where: str, module) -> Any:
        name = "/".join(t.name) if isinstance(t, ast.NamedType) else None
        if isinstance(t, ast.TensorTypeExpr) or name in NUMPY_DTYPES and name != "bool":
            dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else name
            dims_ = t.dims if isinstance(t, ast.TensorTypeExpr) else ()
            return Spec(dtype, tuple(given.size(e, where) for e in dims_))
        if name in ("int", "float", "bool"):
            return given.static(t, name, where)
        if name == "Key":
            return key(0)
        if isinstance(t, ast.TupleTypeExpr):
            return tuple(make(i, f"{where}[{k}]", module) for k, i in enumerate(t.items))
        if name == "List":
            return [make(t.args[0], where, module) for _ in range(given.length(t, where))]
        entity = lookup_type(t.name, module)
        if entity is None or entity.kind != "object":
            raise DslError(t.span, f"a value of type '{name}' cannot be an entry point's input")
        return {f.name: make(f.type, f"{where}.{f.name}", entity.module) for f in entity.node.fields}

    for p in d.params:
        if p.type is None:
            raise DslError(p.span, f"entry point '{d.name}' must annotate its parameter '{p.name}'")
    return {p.name: make(p.type, p.name, mod) for p in d.params}


class _Given:
    """The values --dims (or dims=) gives an entry, checked as the entry's inputs use them:
    dimensions in [0, MAX_DIM], list lengths in [0, MAX_LIST], static ints below 2**63 in size,
    bools 0 or 1; and at the end, that each name was one of the entry's."""

    def __init__(self, values: Any, d: ast.Def):
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values) or \
                not all(isinstance(v, (int, np.integer, np.bool_)) for v in values.values()):
            raise DslError(d.name_span, f"dims= maps names to integers (as --dims B=4,D=8), got {values!r}")
        self.values, self.d, self.names = values, d, set()

    def _get(self, span, name: str, what: str, lo: int, hi: int) -> int:
        self.names.add(name)
        if name not in self.values:
            close = difflib.get_close_matches(name, [k for k in self.values if k != name], n=1)
            raise DslError(span, f"--dims must give {what} '{name}' ({name}=…)" +
                           (f"; it gives {close[0]!r}: did you mean {name!r}?" if close else ""))
        v = int(self.values[name])
        if not lo <= v <= hi:
            raise DslError(span, f"--dims gives {what} '{name}' the value {v}, outside [{lo}, {hi}]")
        return v

    def size(self, e: ast.Expr, where: str) -> int:
        dim = eval_dim(e)
        env = {v: Dim.const(self._get(e.span, v, "the dimension", 0, MAX_DIM))
               for v in sorted(dim.free_vars())}
        n = dim.subst(env).value
        if n is None or n < 0:
            raise DslError(e.span, f"a dimension of '{where}' would be {n if n is not None else 'unknown'} "
                                   f"with the sizes --dims gives")
        return n

    def length(self, t: ast.TypeExpr, where: str) -> int:
        return self._get(t.span, where, "the length of the list", 0, MAX_LIST)

    def static(self, t: ast.TypeExpr, kind: str, where: str) -> Any:
        if kind == "bool":
            return bool(self._get(t.span, where, "the static bool", 0, 1))
        v = self._get(t.span, where, f"the static {kind}", -MAX_INT + 1, MAX_INT - 1)
        return float(v) if kind == "float" else v

    def check_all_used(self) -> None:
        unknown = [k for k in self.values if k not in self.names]
        if unknown:
            names = sorted(self.names)
            raise DslError(self.d.name_span, f"--dims names {unknown[0]!r}, which '{self.d.name}' does not have"
                                             f"{did_you_mean(unknown[0], names)}",
                           [Note(f"'{self.d.name}' takes {', '.join(names)}" if names else
                                 f"'{self.d.name}' takes no dimensions or static values")])


def _array_input(arr: np.ndarray, t: ast.TypeExpr, tname: str | None, path: str) -> Any:
    """An array read for the input `path` (annotated t), checked against its annotation: a key's
    two 32-bit words, a tensor's dtype and rank (its sizes are the checker's)."""
    if tname == "Key":
        if not (arr.shape == (2,) and arr.dtype.kind in "iu" and np.all((arr >= 0) & (arr < 2 ** 32))):
            raise DslError(t.span, f"the input array {path!r} is a key: two integers in [0, 2**32), "
                                   f"got {DTYPE_NAMES.get(arr.dtype, arr.dtype)}{list(arr.shape)}")
        return Key(arr.astype(np.uint32))
    dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else tname
    dims = t.dims if isinstance(t, ast.TensorTypeExpr) else ()
    want = t.span.source.text[t.span.start:t.span.end]
    got = f"{DTYPE_NAMES.get(arr.dtype, arr.dtype)}{list(arr.shape)}"
    sizes = [eval_dim(e).value for e in dims]
    if DTYPE_NAMES.get(arr.dtype) != dtype or arr.ndim != len(dims) or \
            any(n is not None and n != m for n, m in zip(sizes, arr.shape)):
        raise DslError(t.span, f"the input array {path!r} is {got}, but '{path}' is {want}")
    return arr


def _check_sizes(span, name: str, fn: Function, limit: int, bound: str) -> None:
    """Refuse to run or compile fn when one of its arrays would be larger than `limit` bytes
    (`bound` says why), before anything is allocated (NumPy would otherwise try, or the system
    kill the process) or compiled (an index past 2**63 would wrap)."""
    def walk(f: Function):
        yield from (("an input", v) for v in f.params)
        for op in f.ops:
            yield from ((f"made by {op.prim}", v) for v in op.outputs)
            if op.body is not None:
                yield from walk(op.body)
    for what, v in walk(fn):
        if v.is_key:
            continue
        size = math.prod(v.shape) * (2 if v.dtype == "bf16" else np.dtype(NUMPY_DTYPES[v.dtype]).itemsize)
        if size > limit:
            raise DslError(span, f"'{name}' would need an array of {size} bytes, {v.type} ({what}), "
                                 f"more than the {limit} bytes {bound}")


def _static(kind: str, value: Any):
    return Dim.const(int(value)) if kind == "int" else float(value) if kind == "float" else bool(value)


def _wrt_names(d: ast.Def, wrt: str | tuple[str, ...]) -> tuple[str, ...]:
    """The parameters a gradient is taken with respect to (one name or several), checked."""
    wanted = (wrt,) if isinstance(wrt, str) else tuple(wrt) if isinstance(wrt, (tuple, list)) else ()
    if not wanted or not all(isinstance(w, str) for w in wanted):
        raise DslError(d.name_span, f"wrt= names a parameter of '{d.name}', or a tuple of them, "
                                    f"got {wrt!r}")
    names = [p.name for p in d.params]
    for w in wanted:
        if w not in names:
            raise DslError(d.name_span, f"{w!r} is not a parameter of '{d.name}'{did_you_mean(w, names)}",
                           [Note(f"its parameters are {', '.join(names)}" if names else
                                 f"'{d.name}' has no parameters")])
    return wanted


def _grad_options(d: ast.Def, wrt: Any, has_aux: Any) -> None:
    _wrt_names(d, wrt)
    if not isinstance(has_aux, bool):
        raise DslError(d.name_span, f"has_aux= is True or False, got {has_aux!r}")


def _differentiable(d: ast.Def, inputs: Inputs, wanted: tuple[str, ...]) -> None:
    """As grad(f, wrt=y) in the language: y must have a gradient (not an integer, a bool, a
    static value or a key)."""
    names = [p.name for p in d.params]
    for w in wanted:
        problem = _not_differentiable(inputs.abstract[names.index(w)])
        if problem:
            raise DslError(d.name_span, f"cannot differentiate '{d.name}' with respect to {w!r}: {problem}")


def _float_leaves(d: ast.Def, low: Lowered, wanted: tuple[str, ...]) -> list[int]:
    """The positions of the float leaves of those parameters among the function's params."""
    names = [p.name for p in d.params]
    return [i for w in wanted for i in low.arg_leaves[names.index(w)]
            if low.function.params[i].dtype in FLOAT_DTYPES]


def _describe_inputs(d: ast.Def, inputs: Inputs) -> str:
    parts = []
    for p, a in zip(d.params, inputs.abstract):
        parts.append(f"{p.name}={a.python}" if isinstance(a, StaticV) else f"{p.name}: {_annotation(a, concrete=True)}")
    return "; ".join(parts)


def _annotation(v, concrete: bool = False) -> str:
    """A type annotation for an abstract input: records by name, tensors with their shapes."""
    match v:
        case TensorV():
            return str(v.type)
        case KeyV():
            return "Key"
        case TupleV():
            return "(" + ", ".join(_annotation(i, concrete) for i in v.items) + ")"
        case ListV():
            return f"List({_annotation(v.items[0], concrete) if v.items else 'f32'})"
        case RecordV():
            return v.name if not concrete else v.name + " {" + ", ".join(
                f"{n}: {_annotation(f, True)}" for n, f in v.fields) + "}"
    return "?"


def _leaf_exprs(v, path: str) -> list[str]:
    """An expression for each runtime leaf of an input, in parameter order (p.W1, xs[0])."""
    match v:
        case TensorV() | KeyV():
            return [path]
        case TupleV() | ListV():
            return [e for k, i in enumerate(v.items) for e in _leaf_exprs(i, f"{path}[{k}]")]
        case RecordV():
            return [e for n, f in v.fields for e in _leaf_exprs(f, f"{path}.{n}")]
    return []


def _result_expr(v, slots) -> str:
    """The gradient of an input as an expression over the printed results ({0}, {1}, …):
    float leaves take the next result, others are zeros of their type."""
    match v:
        case TensorV() if v.type.dtype in FLOAT_DTYPES:
            return "{" + str(next(slots)) + "}"
        case TensorV():
            shape = ", ".join(str(d) for d in v.type.shape)
            return f"zeros([{shape}], dtype={v.type.dtype})"
        case TupleV():
            return "(" + ", ".join(_result_expr(i, slots) for i in v.items) + ",)"
        case ListV():
            return "[" + ", ".join(_result_expr(i, slots) for i in v.items) + "]"
        case RecordV():
            return v.name + " {{ " + ", ".join(f"{n}: {_result_expr(f, slots)}" for n, f in v.fields) + " }}"
    raise DslError(None, f"cannot differentiate with respect to a value of type {_annotation(v)}")


def _declarations(values: list) -> list[str]:
    """Declarations of the records the inputs hold, with this specialisation's sizes (the
    printed program has concrete shapes throughout)."""
    found: dict[str, str] = {}

    def walk(v) -> None:
        if isinstance(v, RecordV) and v.name not in found:
            found[v.name] = ""
            for _, f in v.fields:
                walk(f)
            fields = ", ".join(f"{n}: {_annotation(f)}" for n, f in v.fields)
            found[v.name] = f"object {v.name} {{ {fields} }}"
        elif isinstance(v, (TupleV, ListV)):
            for i in v.items:
                walk(i)

    for v in values:
        walk(v)
    return list(found.values())


def flatten_python(value: Any, path: str) -> dict[str, np.ndarray]:
    """A result as named arrays (`out`, `out[0]`, `out.W1`), as `dslc run` writes them."""
    if isinstance(value, dict):
        return {k: a for f, v in value.items() for k, a in flatten_python(v, f"{path}.{f}").items()}
    if isinstance(value, (list, tuple)):
        return {k: a for i, v in enumerate(value) for k, a in flatten_python(v, f"{path}[{i}]").items()}
    if isinstance(value, Key):
        return {path: value.words}
    return {path: np.asarray(value)}


def llvm_module(module) -> Any:
    import llvmlite.binding as llvm
    from backend.cpu import optimise
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    optimise(mod)
    return mod


def signature_of(v) -> Any:
    """What a specialisation depends on: types and static values, not the arrays' contents."""
    match v:
        case TensorV():
            return v.type
        case KeyV():
            return "key"
        case TupleV() | ListV():
            return (type(v).__name__, tuple(signature_of(i) for i in v.items))
        case RecordV():
            return (v.name, tuple((n, signature_of(f)) for n, f in v.fields))
    return v


def unflatten(layout: Layout, arrays: list[np.ndarray]) -> Any:
    return layout.unflatten(list(arrays), Record, Key)

