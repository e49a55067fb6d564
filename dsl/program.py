"""The Python API (LANGUAGE.md §12): programs loaded from .bend text, called on NumPy arrays.

A call specialises the entry point for its inputs' types (checking and lowering it to IR,
cached per input signature) and runs it. Records come back as `Record`s, keys as `Key`s."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from frontend import ast
from frontend.check import Checker, deep, raise_collected
from frontend.diagnostics import CheckError, DslError, Source
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
    if not 0 <= seed < 2 ** 64:
        raise ValueError("a seed is an integer in [0, 2**64)")
    return Key(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32))


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
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        self._resolved = resolved
        self.device = pick_device(device)
        self._cache: dict[Any, Lowered] = {}
        self._last: dict[str, tuple[Lowered, Inputs]] = {}
        self._grads: dict[Any, Function] = {}
        self._executables: dict[int, Any] = {}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        self._def(name)
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def _def(self, name: str) -> ast.Def:
        entity = self._resolved.main.names.get(name)
        if entity is None or entity.kind != "def":
            raise AttributeError(f"{self._resolved.main.path} defines no function '{name}'")
        return entity.node

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        low, inputs = self.lower(name, args, kwargs)
        return unflatten(low.outputs, self._run(name, low.function, inputs.arrays))

    def _run(self, name: str, fn: Function, arrays: list[np.ndarray]) -> list[np.ndarray]:
        try:
            if self.device == "reference":
                return interp.run(fn, arrays)
            return self.executable(fn).run(arrays)
        except interp.EvalError as e:
            raise DslError(self._def(name).name_span, f"while running '{name}': {e}") from None

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
        return lambda *args, **kwargs: self._grad(name, wrt, has_aux, False, args, kwargs)

    def value_and_grad(self, name: str, wrt: str | tuple[str, ...], has_aux: bool = False):
        return lambda *args, **kwargs: self._grad(name, wrt, has_aux, True, args, kwargs)

    def _grad(self, name, wrt, has_aux, with_value, args, kwargs):
        d = self._def(name)
        names = [p.name for p in d.params]
        wanted = _wrt_names(d, wrt)
        low, inputs = self.lower(name, args, kwargs)
        fn = low.function
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
        d = self._def(name)
        low, inputs = self._specialised(d, dims)
        fn = low.function
        if grad is not None:
            positions = _float_leaves(d, low, _wrt_names(d, grad))
            fn = optimize(grad_function(fn, positions, with_value=True))
        fn = for_backends(fn)
        plan = schedule.schedule(fn, name)
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
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
        static parameters from `statics`."""
        d = self._def(name)
        used: set[str] = set()

        def make(t: ast.TypeExpr, path: str, module) -> Any:
            tname = "/".join(t.name) if isinstance(t, ast.NamedType) else None
            if tname in ("int", "float", "bool"):
                if path not in statics:
                    raise DslError(t.span, f"give the static {tname} '{path}' with --dims {path}=…")
                return {"int": int, "float": float, "bool": bool}[tname](statics[path])
            if isinstance(t, ast.TupleTypeExpr):
                return tuple(make(i, f"{path}[{k}]", module) for k, i in enumerate(t.items))
            if tname == "List":
                n = 0
                while any(k == f"{path}[{n}]" or k.startswith(f"{path}[{n}].") for k in arrays):
                    n += 1
                return [make(t.args[0], f"{path}[{i}]", module) for i in range(n)]
            entity = lookup_type(t.name, module) if isinstance(t, ast.NamedType) else None
            if entity is not None and entity.kind == "object":
                return {f.name: make(f.type, f"{path}.{f.name}", entity.module) for f in entity.node.fields}
            if path not in arrays:
                raise DslError(t.span, f"the inputs have no array '{path}' for '{name}'")
            used.add(path)
            return Key(arrays[path].astype(np.uint32)) if tname == "Key" else arrays[path]

        for p in d.params:
            if p.type is None:
                raise DslError(p.span, f"entry point '{name}' must annotate its parameter '{p.name}'")
        out = {p.name: make(p.type, p.name, self._resolved.main) for p in d.params}
        extra = sorted(set(arrays) - used)
        if extra:
            raise DslError(d.name_span, f"'{name}' has no parameter for the input array '{extra[0]}'")
        return out

    def ir(self, name: str, dims: dict[str, int] | None = None, level: str = "tensor") -> str:
        """An entry point at a stage of compilation, as text: 'tensor' (the IR), 'loops' (the
        CPU kernels' loop IR and host steps) or 'llvm' (their LLVM IR)."""
        from ir import printer
        low, _ = self._specialised(self._def(name), dims)
        if level == "tensor":
            return printer.to_text(low.function)
        from backend import cpu, loops, schedule
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
            return self.lower(d.name, (), example_inputs(d, self._resolved.main, dims))
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
        return cache.pickled(k, lambda: deep(lambda: self._lower(d, b, inputs)))

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


DEVICES = ("auto", "cpu", "cuda", "reference")   # auto: $DSLC_DEVICE, else the GPU if usable, else the CPU


def pick_device(device: str) -> str:
    """The device a program runs on; 'cuda' only where a GPU is usable (else a DslError)."""
    if device == "auto":
        device = os.environ.get("DSLC_DEVICE", "")
        if not device:
            from runtime import cuda
            return "cuda" if cuda.usable() else "cpu"
        if device not in DEVICES or device == "auto":
            raise ValueError(f"DSLC_DEVICE must be one of cpu, cuda, reference, got {device!r}")
    if device == "cuda":
        from runtime import cuda
        cuda.driver()                     # raises DslError saying why no GPU is usable
    return device


def load(path: str, device: str = "auto") -> Program:
    """dsl.load("model.bend"): its functions run on `device` ('auto': $DSLC_DEVICE, else the
    GPU where one is usable, else the CPU backend; 'reference': the NumPy interpreter, the
    definition)."""
    return Program(deep(lambda: load_program(path, parse=_parse)), device)


def loads(text: str, name: str = "<string>", device: str = "auto") -> Program:
    """dsl.loads(source_text, name="model.bend"): imports resolve from the current folder."""
    return Program(deep(lambda: load_program(name, text, parse=_parse)), device)


def _parse(source: Source) -> ast.Module:
    """A module's syntax tree, from the on-disk cache when this parser read the same text under
    the same path before (parsing the standard library is most of a warm load's wait)."""
    from runtime import cache
    k = cache.key("ast", cache.code_digest("frontend"), source.path, source.text)
    return cache.pickled(k, lambda: parse(source))


# ---------------------------------------------------------------- Python values in and out

def _bind_python(d: ast.Def, args: tuple, kwargs: dict) -> dict[str, Any]:
    names = [p.name for p in d.params]
    if len(args) > len(names):
        raise DslError(d.name_span, f"'{d.name}' takes {len(names)} arguments but {len(args)} were given")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise DslError(d.name_span, f"'{d.name}' has no parameter '{k}'" if k not in names
                           else f"'{d.name}' got two values for '{k}'")
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
        arr = value
        if not isinstance(value, np.ndarray) and not _on_device(value):
            arr = np.asarray(value)
            arr = arr.astype(NUMPY_DTYPES.get(dtype, arr.dtype))
        dt = DTYPE_NAMES.get(arr.dtype)
        if dt is None:
            raise DslError(t.span, f"'{where}' must be an array of a dslc dtype, got {arr.dtype}")
        arrays.append(arr)
        param = b.param(tensor_type(dt, arr.shape))
        return TensorV(param.type, ir=param)
    if name in ("int", "float", "bool"):
        kinds = {"int": (int, np.integer), "float": (int, float, np.integer, np.floating), "bool": (bool, np.bool_)}
        if not isinstance(value, kinds[name]) or name != "bool" and isinstance(value, bool):
            raise DslError(t.span, f"'{where}' is a static {name}, got {type(value).__name__}")
        return StaticV(name, _static(name, value))
    if name == "Key":
        if not isinstance(value, Key):
            raise DslError(t.span, f"'{where}' must be a key (dsl.key(seed)), got {type(value).__name__}")
        arrays.append(value.words)
        return KeyV(ir=b.param(KeyType()))
    if isinstance(t, ast.TupleTypeExpr) or name == "List":
        items = t.items if isinstance(t, ast.TupleTypeExpr) else None
        if not isinstance(value, (list, tuple)) or items is not None and len(items) != len(value):
            raise DslError(t.span, f"'{where}' must be a {'tuple' if items else 'list'}")
        parts = [from_python(b, v, items[i] if items else t.args[0], mod, f"{where}[{i}]", arrays)
                 for i, v in enumerate(value)]
        return TupleV(tuple(parts)) if items is not None else ListV.of(parts)
    entity = lookup_type(t.name, mod)
    if entity is not None and entity.kind == "object":
        if not isinstance(value, dict):
            raise DslError(t.span, f"'{where}' must be a {entity.node.name} record (a dict), "
                                   f"got {type(value).__name__}")
        fields = []
        for f in entity.node.fields:
            if f.name not in value:
                raise DslError(t.span, f"'{where}' has no field '{f.name}' of {entity.node.name}")
            fields.append((f.name, from_python(b, value[f.name], f.type, entity.module,
                                               f"{where}.{f.name}", arrays)))
        return RecordV(entity.node.name, tuple(fields), entity)
    raise DslError(t.span, f"a value of type '{name}' cannot be passed from Python")


def _on_device(value: Any) -> bool:
    """A GPU runtime's array (runtime/cuda.py), passed on as it is, without a copy."""
    cuda = sys.modules.get("runtime.cuda")          # not loaded: no such array exists
    return cuda is not None and isinstance(value, cuda.DeviceArray)


def example_inputs(d: ast.Def, mod, dims: dict[str, int]) -> dict[str, Any]:
    """Inputs of an entry made concrete by --dims: zero arrays of the annotated shapes, static
    ints (and list lengths, as `name=3`) from dims, key(0) for keys."""
    env = {k: Dim.const(v) for k, v in dims.items()}

    def make(t: ast.TypeExpr, where: str, module) -> Any:
        name = "/".join(t.name) if isinstance(t, ast.NamedType) else None
        if isinstance(t, ast.TensorTypeExpr) or name in NUMPY_DTYPES and name != "bool":
            dtype = t.dtype if isinstance(t, ast.TensorTypeExpr) else name
            dims_ = t.dims if isinstance(t, ast.TensorTypeExpr) else ()
            shape = []
            for e in dims_:
                n = eval_dim(e).subst(env).value
                if n is None or n < 0:
                    missing = sorted(eval_dim(e).free_vars() - env.keys())
                    raise DslError(e.span, f"--dims must give {', '.join(missing) or 'a size'} "
                                           f"(for '{where}')")
                shape.append(n)
            return np.zeros(shape, NUMPY_DTYPES.get(dtype, np.float32))
        if name in ("int", "float", "bool"):
            if where not in dims:
                raise DslError(t.span, f"--dims must give the static {name} '{where}'")
            return {"int": int, "float": float, "bool": bool}[name](dims[where])
        if name == "Key":
            return key(0)
        if isinstance(t, ast.TupleTypeExpr):
            return tuple(make(i, f"{where}[{k}]", module) for k, i in enumerate(t.items))
        if name == "List":
            if where not in dims:
                raise DslError(t.span, f"--dims must give the length of the list '{where}' ({where}=N)")
            return [make(t.args[0], where, module) for _ in range(dims[where])]
        entity = lookup_type(t.name, module)
        if entity is None or entity.kind != "object":
            raise DslError(t.span, f"a value of type '{name}' cannot be an entry point's input")
        return {f.name: make(f.type, f"{where}.{f.name}", entity.module) for f in entity.node.fields}

    for p in d.params:
        if p.type is None:
            raise DslError(p.span, f"entry point '{d.name}' must annotate its parameter '{p.name}'")
    return {p.name: make(p.type, p.name, mod) for p in d.params}


def _static(kind: str, value: Any):
    return Dim.const(int(value)) if kind == "int" else float(value) if kind == "float" else bool(value)


def _wrt_names(d: ast.Def, wrt: str | tuple[str, ...]) -> tuple[str, ...]:
    """The parameters a gradient is taken with respect to (one name or several), checked."""
    wanted = (wrt,) if isinstance(wrt, str) else tuple(wrt)
    for w in wanted:
        if all(p.name != w for p in d.params):
            raise DslError(d.name_span, f"'{w}' is not a parameter of '{d.name}'")
    return wanted


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

