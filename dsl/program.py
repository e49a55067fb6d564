"""The Python API (docs/language.md §15): programs loaded from .bend text, called on NumPy arrays.

A call specialises the entry point for its inputs' types (checking and lowering it to IR,
cached per input signature) and runs it. Records come back as `Record`s, keys as `Key`s."""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np

from dsl.compiled import Compiled
from dsl.doc import document
from dsl.fastcall import Signatures
from dsl.generic import NotGeneric, merge, sample_sizes
from dsl.inputs import (COMPILED, MAX_BYTES, Inputs, abstract_inputs, bind_python, check_sizes,
                        dimension_names, from_arrays, from_python, kind, memory_bytes)
from dsl.specialisations import Specialisation, Specialisations, kept_per_entry
from frontend import ast
from frontend.check import Checker, deep, raise_collected
from frontend.collector import without_gc
from frontend.calls import _not_differentiable
from frontend.diagnostics import CheckError, DslError, Note, Source, did_you_mean
from frontend.lower import Layout, LoweringError, flatten, trained_leaves
from frontend.parser import parse
from frontend.resolve import Program as Resolved, load_program
from frontend.values import KeyV, ListV, RecordV, StaticV, TensorV, TupleV
from ir import interp
from ir.ad import grad_function
from ir.core import Builder, Function
from ir.mlir import NotExpressible, to_mlir
from ir.passes import for_backends, optimize, tidy
from ir.types import FLOAT_DTYPES


class NoSuchName(DslError, AttributeError):
    """A name a program does not define: a DslError like every user error, and an
    AttributeError too, so that hasattr(prog, "f") and getattr(prog, "f", None) keep working."""


@dataclass(frozen=True)
class Lowered:
    """An entry point specialised for one input signature."""
    function: Function
    outputs: Layout
    params: list[Layout]              # each parameter's structure
    arg_leaves: list[list[int]]       # for each parameter, the positions of its leaves

    def __str__(self) -> str:
        from ir import printer
        return printer.to_text(self.function)


@dataclass(frozen=True)
class Stored:
    """A program's entry point compiled for one input signature, as the compile cache holds it
    under `key`: its lowering, and on the CPU, once it has run, its plan (runtime/cpu.py), so
    that a warm load neither lowers nor schedules."""
    key: str
    lowered: Lowered
    plan: Any                       # runtime.cpu.Planned, or None


@dataclass(frozen=True)
class Interpreted:
    """device="reference": a function run by the interpreter, as an executable is run."""
    function: Function

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return interp.run(self.function, arrays)


class Program:
    """A loaded .bend program; its functions are attributes: prog.loss(p, x, y)."""

    def __init__(self, resolved: Resolved, device: str = "auto", numerics: str = "exact"):
        if device not in DEVICES:
            raise DslError(None, f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        self._resolved = resolved
        self.device = pick_device(device)
        self.numerics = checked_numerics(numerics)
        self._bound = kept_per_entry()
        self._kept: dict[str, Specialisations] = {}       # per entry point
        self._last: dict[str, tuple[Lowered, Inputs]] = {}
        self._entries: dict[str, Compiled] = {}
        self._devices: dict[tuple[str, str], Program] = {}   # on the other devices and numerics
        # the fast paths (dsl/fastcall.py) of each entry's calls and of its gradients
        self._signatures: dict[Hashable, Signatures] = {}
        self._stored: weakref.WeakKeyDictionary[Function, Stored] = weakref.WeakKeyDictionary()

    def __getattr__(self, name: str) -> Compiled:
        if name.startswith("_"):
            raise AttributeError(name)
        # kept as an attribute, so that the next `prog.name` is found without this call
        compiled = self.__dict__[name] = self._entry(name)
        return compiled

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.functions()))

    def compile(self, name: str, device: str | None = None, numerics: str | None = None) -> Compiled:
        """Entry `name` as a callable on `device` in `numerics` (default: the program's), with
        its .bend signature and doc comment; its calls are cached per input signature."""
        self._def(name)
        return self._on(device, numerics)._entry(name)

    def _on(self, device: str | None, numerics: str | None) -> Program:
        """This program on another device or in other numerics: the same source, its own
        caches (so that no kernel of one mode serves the other)."""
        other = Program(self._resolved, self.device if device is None else device,
                        self.numerics if numerics is None else numerics)
        key = (other.device, other.numerics)
        if key == (self.device, self.numerics):
            return self
        return self._devices.setdefault(key, other)

    def _entry(self, name: str) -> Compiled:
        d = self._def(name)
        if name not in self._entries:
            self._entries[name] = Compiled(self, d)
        return self._entries[name]

    def doc(self) -> str:
        """Every definition of the program's file, its signature and doc comment, in source
        order (what `dslc doc` prints)."""
        return document(self._resolved.main.tree)

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
        spec, _, arrays, _ = self._fast(name, name, args, kwargs)
        return spec.results(self._run(name, spec, None, arrays))

    def _fast(self, path: Hashable, name: str, args: tuple, kwargs: dict,
              derive: Callable[[Specialisation, Inputs], Any] = lambda spec, inputs: None
              ) -> tuple[Specialisation, Inputs, list[np.ndarray], Any]:
        """Entry `name` specialised for these arguments, its inputs, the call's arrays and
        what derive() makes of the first two: by the fast path of `path` (dsl/fastcall.py: a
        call or a gradient) for a signature met before, else checked and lowered."""
        signatures = self._signatures.get(path) or self._signatures.setdefault(path, Signatures())
        fast = signatures.get(args, kwargs)
        # the fast path holds a specialisation weakly: one evicted, and gone, takes the full path
        spec = fast[0][0]() if fast is not None else None
        if spec is None:
            spec, inputs = self._specialisation(name, args, kwargs)
            derived = derive(spec, inputs)
            signatures.remember(args, kwargs, (weakref.ref(spec), replace(inputs, arrays=[], numbers={}),
                                               derived), inputs.arrays, inputs.numbers)
            return spec, inputs, inputs.arrays, derived
        (_, inputs, derived), arrays = fast
        self._kept[name].use(spec)
        self._last[name] = (spec.lowered, inputs)
        return spec, inputs, arrays, derived

    def specialisations(self, name: str) -> list[str]:
        """The input signatures entry `name` is held specialised for (with its executables),
        least recently used first."""
        self._def(name)
        kept = self._kept.get(name)
        return kept.signatures() if kept else []

    def _run(self, name: str, spec: Specialisation, grad: tuple[int, ...] | None,
             arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run spec's function under `grad` (None: the entry itself) on the program's device."""
        def compiled(fn: Function):
            check_sizes(self._def(name).name_span, name, fn, memory_bytes(), "an array may take "
                        "here (the smaller of 2**40 and this machine's memory)")
            # (the backend, like the front end, makes many objects and few cycles worth
            # collecting before it is done: collections would cost a sixth of its Python time)
            return without_gc(lambda: self.executable(fn))()
        try:
            return spec.executable(grad, compiled).run(arrays)
        except interp.EvalError as e:
            message = f"while running '{name}': {e}"
            raise (e.origin.error(message) if e.origin else DslError(self._def(name).name_span,
                                                                       message)) from None
        except NotExpressible as e:                 # device="iree": an op MLIR cannot say yet
            raise (e.origin.error(str(e)) if e.origin else DslError(self._def(name).name_span,
                                                                     str(e))) from None
        except MemoryError:
            raise DslError(self._def(name).name_span, f"while running '{name}': out of memory "
                           "(its arrays do not fit in this machine's memory together)") from None

    def executable(self, fn: Function):
        """fn made runnable on this program's device (a new one each time: a call's live in
        its specialisation)."""
        if self.device == "reference":
            return Interpreted(fn)
        options = {}
        if self.device == "cuda":
            from runtime.cuda import Executable
            options = {"numerics": self.numerics}      # (fast numerics is exact off the GPU)
        elif self.device in ("iree", "iree-cuda"):
            from runtime.iree import HOST, Executable, gpu_target
            options = {"target": gpu_target() if self.device == "iree-cuda" else HOST}
        else:
            from runtime.cpu import Executable
            options = {"planned": self._plan(fn)}
        return Executable(fn, fn.name, **options)

    def grad(self, name: str, wrt: str | tuple[str, ...], has_aux: bool = False):
        """grad(f, wrt=…) from Python: the gradient function of entry `name`."""
        return self._gradient(name, wrt, has_aux, with_value=False)

    def value_and_grad(self, name: str, wrt: str | tuple[str, ...], has_aux: bool = False):
        return self._gradient(name, wrt, has_aux, with_value=True)

    def _gradient(self, name: str, wrt: str | tuple[str, ...], has_aux: bool, with_value: bool):
        """The function of `name`'s arguments that _grad computes, its options checked now."""
        wanted, one = _grad_options(self._def(name), wrt, has_aux), isinstance(wrt, str)
        return lambda *args, **kwargs: self._grad(name, wanted, one, has_aux, with_value, args, kwargs)

    def _grad(self, name: str, wanted: tuple[str, ...], one: bool, has_aux: bool, with_value: bool,
              args: tuple, kwargs: dict) -> Any:
        """The gradient of entry `name` with respect to `wanted` (`one`: given as a name, not
        a tuple), with its value where `with_value`, at these arguments."""
        d = self._def(name)

        def positions(spec: Specialisation, inputs: Inputs) -> tuple[int, ...]:
            _differentiable(d, inputs, wanted)
            return tuple(_float_leaves(d, spec.lowered, inputs, wanted))
        spec, _, arrays, at = self._fast((name, wanted), name, args, kwargs, positions)
        low = spec.lowered
        fn = low.function
        spec.function(at, lambda: optimize(grad_function(fn, list(at), with_value=True)))
        outs = self._run(name, spec, at, arrays)
        grads = dict(zip(at, outs[len(fn.results):]))
        names = [p.name for p in d.params]
        results = []
        for w in wanted:
            k = names.index(w)
            leaves = [grads[i] if i in grads else np.zeros_like(arrays[i]) for i in low.arg_leaves[k]]
            results.append(spec.parameter(k)(leaves))
        g = results[0] if one else tuple(results)
        value = spec.results(outs[:len(fn.results)])
        if has_aux:
            if not (isinstance(value, tuple) and len(value) == 2):
                raise DslError(d.name_span, "with has_aux=True the function must return (loss, aux)")
            return (value, g) if with_value else (g, value[1])
        return (value, g) if with_value else g

    def buffers(self, name: str, param: str, value: Any) -> list[str]:
        """The leaves of `value`, passed as parameter `param` of entry `name`, that are buffers
        (held by a record field declared `buffer`), named as `dslc run` names arrays: p.bn.mean."""
        d = self._def(name)
        p = next((q for q in d.params if q.name == param), None)
        if p is None or p.type is None:
            raise DslError(d.name_span, f"'{name}' has no annotated parameter {param!r}")
        v = from_python(Builder(name), value, p.type, self._resolved.main, param, [], self.device)
        return [path for path, trained in zip(_leaf_paths(flatten(v)[1], param), trained_leaves(v))
                if not trained]

    def source(self, name: str, grad: str | tuple[str, ...] | None = None,
               dims: dict[str, int] | None = None) -> str:
        """An entry point (or its gradient with respect to `grad`) as .bend source, specialised
        for the sizes `dims` gives and generic in the entry's dimensions it leaves out (all of
        them without dims: dsl/generic.py)."""
        d = self._def(name)
        given = {} if dims is None else dims        # (abstract_inputs checks what dims is)
        open_dims = [n for n in dimension_names(d, self._resolved.main)
                     if isinstance(given, dict) and n not in given]
        what = f"# {name}" + (f", differentiated with respect to {grad}," if grad else "")
        if not open_dims:
            low, inputs = self._specialised(d, given)
            header = f"{what} specialised for {_describe_inputs(d, inputs)}"
            return "\n\n".join([header, self._printed(d, low, inputs, grad, optimize)]) + "\n"
        samples = sample_sizes(open_dims)
        if grad is not None:
            self._differentiable_in_every_size(d, grad, given, samples)
        texts = [self._printed(d, *self._sample(d, {**given, **s}), grad, tidy, open_dims)
                 for s in samples]
        try:
            body = merge(texts, samples)
        except NotGeneric as e:
            raise DslError(d.name_span, f"cannot print '{name}' generic in {', '.join(open_dims)}: "
                                        f"{e}", [_PIN_NOTE]) from None
        pinned = ", ".join(f"{k}={v}" for k, v in given.items())
        header = f"{what} generic in {', '.join(open_dims)}" + \
            (f"; specialised for {pinned}" if pinned else "")
        return "\n\n".join([header, body]) + "\n"

    def _differentiable_in_every_size(self, d: ast.Def, grad: str | tuple[str, ...],
                                      given: dict[str, int], samples: list[dict[str, int]]) -> None:
        """_differentiable for a program printed generic: its error names the sizes
        (`it is i32[B]`), as the program would."""
        wanted, messages = _wrt_names(d, grad), []
        for s in samples:
            try:
                _differentiable(d, self._sample_inputs(Builder(d.name), d, {**given, **s}), wanted)
                return
            except DslError as e:
                messages.append(e.message)
        raise DslError(d.name_span, merge(messages, samples))

    def _sample_inputs(self, b: Builder, d: ast.Def, dims: dict[str, int]) -> Inputs:
        return self._inputs(b, d, bind_python(d, (), abstract_inputs(d, self._resolved.main, dims)))

    def _sample(self, d: ast.Def, dims: dict[str, int]) -> tuple[Lowered, Inputs]:
        """d lowered for these sizes with its constants unfolded (tidy), as a sample of the
        program printed generic in its dimensions."""
        b = Builder(d.name)
        inputs = self._sample_inputs(b, d, dims)
        sizes = ", ".join(f"{k}={v}" for k, v in dims.items())
        try:
            low = deep(lambda: self._traced(d, b, inputs))
        except DslError as e:
            first = e.diagnostics[0]
            raise DslError(first.span, first.message, [*first.notes, Note(
                f"while printing '{d.name}' generic in its dimensions, at the sample sizes "
                f"{sizes}"), _PIN_NOTE]) from None
        return replace(low, function=tidy(low.function)), inputs

    def _printed(self, d: ast.Def, low: Lowered, inputs: Inputs,
                 grad: str | tuple[str, ...] | None, passes: Callable[[Function], Function],
                 reserved: list[str] = ()) -> str:
        """The record declarations and the def of an entry (or its gradient, `passes` applied
        to it) specialised as low is."""
        from ir import printer
        fn = low.function
        names = [p.name for p in d.params]
        runtime = [(p.name, a) for p, a in zip(d.params, inputs.abstract) if not isinstance(a, StaticV)]
        bindings = _input_names(d, low)
        records = _Records([a for _, a in runtime])
        signature = ", ".join(f"{n}: {_annotation(a, records.name)}" for n, a in runtime)
        decls = records.declarations
        if grad is None:
            text = printer.to_bend(fn, d.name, signature=signature, bindings=bindings,
                                   returns=None, reserved=reserved)
            return "\n\n".join([*decls, text])
        wanted = _wrt_names(d, grad)
        _differentiable(d, inputs, wanted)
        positions = _float_leaves(d, low, inputs, wanted)
        gfn = passes(grad_function(fn, positions))
        slots = iter(range(len(positions)))
        parts = [_result_expr(inputs.abstract[names.index(w)], slots, records.name) for w in wanted]
        result = parts[0] if isinstance(grad, str) else "(" + ", ".join(parts) + ")"
        returns = _annotation(inputs.abstract[names.index(grad)], records.name) if isinstance(grad, str) else \
            "(" + ", ".join(_annotation(inputs.abstract[names.index(w)], records.name) for w in wanted) + ")"
        text = printer.to_bend(gfn, f"{d.name}_grad", signature=signature, bindings=bindings,
                               result=result, returns=returns, reserved=reserved)
        return "\n\n".join([*decls, text])

    def compile_to(self, name: str, target: str, out: str, dims: dict[str, int] | None = None,
                   grad: str | tuple[str, ...] | None = None, arch: str | None = None,
                   numerics: str | None = None) -> dict:
        """Write an entry point's kernels into the folder `out` (object code for 'cpu', PTX for
        'ptx', for the GPU architecture `arch`, default sm_90, in `numerics`, default the
        program's) with manifest.json: parameters, results, kernels with their buffers and
        launch shapes, and the steps that run them. Returns the manifest."""
        import json
        from backend import cpu, nvptx, schedule, tensorcore
        from ir.ops.control import Scan
        from ir.ops.shape import Rearrange
        from backend.gpu_plan import GpuKernels, gpu_kernels, gpu_schedule
        if target not in TARGETS:
            raise DslError(None, f"target= is one of {', '.join(TARGETS)}, got {target!r}")
        arch = gpu_arch(arch, target == "ptx", "target='ptx'")
        numerics = self.numerics if numerics is None else checked_numerics(numerics)
        d = self._def(name)
        low, inputs = self._specialised(d, dims)
        fn = low.function
        params = _input_names(d, low)
        results = _leaf_paths(low.outputs, "out")
        if grad is not None:
            _differentiable(d, inputs, _wrt_names(d, grad))
            positions = _float_leaves(d, low, inputs, _wrt_names(d, grad))
            fn = optimize(grad_function(fn, positions, with_value=True))
            results += [f"grad({params[i]})" for i in positions]
        check_sizes(d.name_span, name, fn, MAX_BYTES, COMPILED)
        fn = for_backends(fn)
        plan_of = lambda f, n: gpu_schedule(f, n, numerics) if target == "ptx" else schedule.schedule(f, n)
        plan = plan_of(fn, name)
        try:
            folder = Path(out)
            folder.mkdir(parents=True, exist_ok=True)
        except (OSError, TypeError, ValueError) as e:       # ValueError: a NUL in the path
            raise DslError(None, f"cannot write into {out!r}: {e}") from None
        ids = {v: i for i, v in enumerate(fn.params)}
        parts = []                  # (plan, its GPU kernels) of the entry and of each fold's body

        def described(plan: schedule.Plan, name: str, fold=None) -> list[dict]:
            """The steps of a plan, its kernels added to parts (a fold's body's in its step,
            with the fold's persistent kernel where the body is small)."""
            gpu = gpu_kernels(plan, name, numerics, fold) if target == "ptx" else None
            parts.append((plan, gpu))
            for step in plan.steps:
                for v in schedule.writes(step):
                    ids.setdefault(v, len(ids))
            return [step_entry(s, gpu, f"{name}_b{i}") for i, s in enumerate(plan.steps)]

        def step_entry(s, gpu, body_name: str) -> dict:
            if isinstance(s, schedule.KernelStep):
                return {"kernel": s.kernel.name, "args": [ids[v] for v in s.args]}
            inputs, outputs = [ids[v] for v in s.op.inputs], [ids[v] for v in s.op.outputs]
            if gpu and id(s.op) in gpu.copies:
                return {"kernel": gpu.copies[id(s.op)].name, "args": inputs + outputs}
            if gpu and id(s.op) in gpu.gathers:            # a gather kernel, indices from the host
                prim, dtype = gpu.gathers[id(s.op)]
                return {"gather": prim.name, "entry": nvptx.gather_entry(prim, dtype),
                        "axis": s.op.attrs.get("axis", 0), "inputs": inputs, "outputs": outputs}
            if isinstance(s, schedule.ContractStep):      # dslc's contraction kernel
                entry = {"matmul": s.op.outputs[0].dtype, "inputs": inputs, "outputs": outputs}
                if gpu:                                     # exact tiles, or tensor cores
                    launch = gpu.product_launch(s.op)
                    entry["entry"] = launch.entry if launch else None
                if s.epilogue:                              # a kernel run after the product
                    entry["epilogue"] = step_entry(s.epilogue, gpu, body_name)
                return entry
            if isinstance(s.op.primitive, Scan):          # its body's steps, run at each step
                body = for_backends(s.op.body)
                for v in body.params:
                    ids.setdefault(v, len(ids))
                a = s.op.attrs
                at = len(parts)
                steps = described(plan_of(body, body_name), body_name, s.op)
                folds = parts[at][1].folds if target == "ptx" else ()
                return {"fold": a["length"], "reverse": bool(a.get("reverse")), "state": a["n_state"],
                        "scanned": a["n_xs"], "inputs": inputs, "outputs": outputs,
                        "persistent": folds[0].entry if folds else None,
                        "body": {"params": [ids[v] for v in body.params],
                                 "results": [ids[v] for v in body.results], "steps": steps}}
            if schedule.made_once(s.op):                  # made when loaded, for every call
                return {"once": s.op.primitive.name, "outputs": outputs}
            if isinstance(s, schedule.ViewStep) if gpu is None else isinstance(s.op.primitive, Rearrange):
                return {"view": s.op.primitive.name, "inputs": inputs, "outputs": outputs}   # in place
            return {"host": s.op.primitive.name, "inputs": inputs, "outputs": outputs}

        steps = described(plan, name)
        gpu = GpuKernels.joined([g for _, g in parts]) if target == "ptx" else None
        kernels = []
        for k in (gpu.kernels if gpu else [k for p, _ in parts for k in p.kernels]):
            kind = ("rows" if k.is_rows else "reduction" if k.is_reduction else
                    "scan" if k.is_scan else "map")
            entry = {"name": k.name, "buffers": [[dt, list(shape)] for dt, shape in k.buffers],
                     "kind": kind, "extent": k.extent, "n": k.n}
            if gpu:
                shape = gpu.launches[k.name]
                entry["launch"] = {"entry": shape.entry, "extent": shape.extent,
                                   "block": shape.block, "grid": shape.grid}
            kernels.append(entry)
        if gpu:
            (folder / "kernels.ptx").write_text(gpu.ptx(arch))
        else:
            mod = llvm_module(cpu.module_ir([k for p, _ in parts for k in p.kernels]))
            (folder / "kernels.o").write_bytes(cpu.target_machine().emit_object(mod))

        manifest = {
            "entry": name, "target": target, "numerics": numerics, "gradient_of": grad,
            "params": [{"name": n, "id": ids[v], "dtype": v.dtype, "shape": list(v.shape)}
                       for n, v in zip(params, fn.params, strict=True)],
            "results": [{"name": n, "id": ids[v], "dtype": v.dtype, "shape": list(v.shape)}
                        for n, v in zip(results, fn.results, strict=True)],
            "kernels": kernels,
            "steps": steps,
        }
        if gpu:
            manifest["arch"] = arch
            manifest["matmul_entries"] = [e for e in gpu.entries if e.startswith("dslc_matmul_")]
            manifest["mma_entries"] = [tensorcore.entry(d) for d in gpu.mmas]
            manifest["gather_entries"] = [nvptx.gather_entry(*g) for g in gpu.gather_kernels]
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest

    def inputs_from_arrays(self, name: str, arrays: dict[str, np.ndarray],
                           statics: dict[str, int]) -> dict[str, Any]:
        """An entry's arguments from named arrays (`p.W1`, `xs[0]`, as `dslc run` reads them)
        and static values (dsl/inputs.py checks them)."""
        return from_arrays(name, self._def(name), self._resolved.main, arrays, statics)

    def ir(self, name: str, dims: dict[str, int] | None = None, level: str = "tensor",
           arch: str | None = None, numerics: str | None = None) -> str:
        """An entry point at a stage of compilation, as text: 'tensor' (the IR), 'loops' (the
        CPU kernels' loop IR and host steps), 'llvm' (their LLVM IR), 'ptx' (the GPU kernels
        for the architecture `arch`, default sm_90, in `numerics`, default the program's) or
        'mlir' (the tensor IR in MLIR's upstream dialects)."""
        from ir import printer
        if level not in LEVELS:
            raise DslError(None, f"level= is one of {', '.join(LEVELS)}, got {level!r}")
        arch = gpu_arch(arch, level == "ptx", "level='ptx'")
        numerics = self.numerics if numerics is None else checked_numerics(numerics)
        low, _ = self._specialised(self._def(name), dims)
        if level == "tensor":
            return printer.to_text(low.function)
        if level == "mlir":
            try:
                return to_mlir(low.function, name, _input_names(self._def(name), low))
            except NotExpressible as e:
                span = self._def(name).name_span       # an op a pass made has no origin
                raise (e.origin.error(str(e)) if e.origin else DslError(span, str(e))) from None
        from backend import cpu, loops, schedule
        check_sizes(self._def(name).name_span, name, low.function, MAX_BYTES, COMPILED)
        if level == "ptx":
            from backend.gpu_plan import gpu_kernels, gpu_schedule
            return gpu_kernels(gpu_schedule(for_backends(low.function), name, numerics), name,
                               numerics).ptx(arch)
        plan = schedule.schedule(for_backends(low.function), name)
        if level == "llvm":
            return str(cpu.module_ir(plan.kernels))
        def text(s) -> str:
            if isinstance(s, schedule.KernelStep):
                return loops.to_text(s.kernel)
            if isinstance(s, schedule.ContractStep) and s.epilogue:
                epilogue = loops.to_text(s.epilogue.kernel).replace("\n", "\n  ")
                return f"host {s.op.primitive.name}, on each block of rows it finishes:\n  {epilogue}"
            return f"host {s.op.primitive.name}"
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
        spec, inputs = self._specialisation(name, args, kwargs)
        return spec.lowered, inputs

    def _specialisation(self, name: str, args: tuple, kwargs: dict) -> tuple[Specialisation, Inputs]:
        """Entry `name` specialised for these inputs: one of those kept (dsl/specialisations.py),
        else checked and lowered now."""
        d = self._def(name)
        for p in d.params:
            if p.type is None:
                raise DslError(p.span, f"entry point '{name}' must annotate its parameter '{p.name}'")
        b = Builder(d.name)
        inputs = self._inputs(b, d, bind_python(d, args, kwargs))
        key = inputs.key
        kept = self._kept.get(name) or self._kept.setdefault(name, Specialisations(self._bound))
        spec = kept.get(key, lambda: Specialisation(key, self._lowered(d, b, inputs),
                                                    _describe_inputs(d, inputs)))
        self._last[name] = (spec.lowered, inputs)
        return spec, inputs

    def _inputs(self, b: Builder, d: ast.Def, bound: dict[str, Any]) -> Inputs:
        abstract, arrays, arg_leaves, numbers = [], [], [], {}
        for p in d.params:
            start = len(arrays)
            abstract.append(from_python(b, bound[p.name], p.type, self._resolved.main, p.name, arrays,
                                        self.device, numbers=numbers))
            arg_leaves.append(list(range(start, len(arrays))))
        return Inputs(abstract, arrays, arg_leaves, numbers)

    def _lowered(self, d: ast.Def, b: Builder, inputs: Inputs) -> Lowered:
        """d lowered for these inputs: from the program's entry in the on-disk cache
        (runtime/cache.py) when these sources were compiled for this input signature before,
        with the plan its first call then made on the CPU."""
        from runtime import cache
        if self.device == "cpu":
            # the entry holds a runtime.cpu.Planned, and decode finds only imported classes
            import runtime.cpu  # noqa: F401
        k = self._entry_key(d, inputs)
        found = cache.load_value(k, Stored)
        if found is not None and isinstance(found.lowered, Lowered):
            self._stored[found.lowered.function] = found
            return found.lowered
        low = deep(without_gc(lambda: self._lower(d, b, inputs)))
        entry = self._stored[low.function] = Stored(k, low, None)
        if self.device != "cpu":            # on the CPU, stored with its plan at the first call
            cache.store_value(k, entry)
        return low

    def _entry_key(self, d: ast.Def, inputs: Inputs) -> str:
        """The cache key of entry d for these inputs: everything its lowering and its plan
        depend on (the program's sources, the imported and the standard library's included;
        the input signature; the device and numerics; the code of dslc that makes them; this
        CPU), besides the versions every key covers."""
        from runtime import cache
        sources = sorted((m.path, m.source.text) for m in self._resolved.modules.values())
        return cache.key("program", cache.code_digest("frontend", "ir", "dsl", "backend", "runtime"),
                         repr(sources), d.name, repr(inputs.key), self.device, self.numerics,
                         cache.host())

    def _plan(self, fn: Function) -> Any:
        """The host plan of an entry point's own function (None for another function: a
        gradient's, whose plan runtime/cpu.py caches by its IR), made at its first call and
        stored with its lowering as the program's cache entry."""
        from runtime import cache
        from runtime.cpu import plan
        entry = self._stored.get(fn)
        if entry is None:
            return None
        if entry.plan is None:
            entry = self._stored[fn] = replace(entry, plan=plan(fn, fn.name))
            cache.store_value(entry.key, entry)
        return entry.plan

    def _lower(self, d: ast.Def, b: Builder, inputs: Inputs) -> Lowered:
        low = self._traced(d, b, inputs)
        if self.device == "cpu":    # as soon as the products are known: beside the optimisation
            from runtime.cpu import compile_products_beside
            compile_products_beside(low.function)
        return replace(low, function=optimize(low.function))

    def _traced(self, d: ast.Def, b: Builder, inputs: Inputs) -> Lowered:
        """d checked and lowered for these inputs, not yet optimised."""
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
        fn = b.finish([leaf.ir for leaf in leaves])
        return Lowered(fn, layout, [flatten(a)[1] for a in inputs.abstract], inputs.arg_leaves)


_PIN_NOTE = Note("give in --dims (dims=) the sizes it needs; the dimensions --dims leaves out stay "
                 "names")

LEVELS = ("tensor", "loops", "llvm", "ptx", "mlir")     # what Program.ir shows
TARGETS = ("cpu", "ptx")                         # what Program.compile_to writes
NUMERICS = ("exact", "fast")                    # fast: products on tensor cores (GPU only)
DEVICES = ("auto", "cpu", "cuda", "reference", "iree", "iree-cuda")   # auto: $DSLC_DEVICE, else the GPU if usable, else the CPU


def gpu_arch(arch: str | None, ptx: bool, needs: str) -> str | None:
    """The GPU architecture PTX is built for (sm_90 unless `arch` names another of
    nvptx.ARCHES); an arch given where no PTX is built is an error saying what it `needs`."""
    from backend.nvptx import ARCHES
    if arch is None:
        return "sm_90" if ptx else None
    if not ptx:
        raise DslError(None, f"arch= is for PTX: it needs {needs}")
    if arch not in ARCHES:
        raise DslError(None, f"arch= is one of {', '.join(ARCHES)}, got {arch!r}")
    return arch


def checked_numerics(numerics: Any) -> str:
    if not isinstance(numerics, str) or numerics not in NUMERICS:
        raise DslError(None, f"numerics= is one of {', '.join(NUMERICS)}, got {numerics!r}")
    return numerics


def pick_device(device: str) -> str:
    """The device a program runs on; 'cuda' only where a GPU is usable (else a DslError)."""
    if device == "auto":
        device = os.environ.get("DSLC_DEVICE", "")
        if not device:
            from runtime import cuda
            return "cuda" if cuda.usable() else "cpu"
        if device not in DEVICES or device == "auto":
            raise DslError(None, f"DSLC_DEVICE must be one of cpu, cuda, reference, iree, iree-cuda, "
                                 f"got {device!r}")
    if device == "cuda":
        from runtime import cuda
        cuda.driver()                     # raises DslError saying why no GPU is usable
    if device in ("iree", "iree-cuda"):
        from runtime import iree
        iree.version()                    # raises DslError saying how to install IREE
    if device == "iree-cuda":
        iree.gpu_target()                 # raises DslError where IREE finds no GPU
    return device


def load(path: str, device: str = "auto", numerics: str = "exact") -> Program:
    """dsl.load("model.bend"): its functions run on `device` ('auto': $DSLC_DEVICE, else the
    GPU where one is usable, else the CPU backend; 'reference': the NumPy interpreter, the
    definition), in `numerics` ('fast': the GPU's products on tensor cores)."""
    path = _path(path, "dsl.load's path")
    return Program(deep(lambda: load_program(path, parse=_parse)), device, numerics)


def loads(text: str, name: str = "<string>", device: str = "auto", numerics: str = "exact") -> Program:
    """dsl.loads(source_text, name="model.bend"): imports resolve from the current folder."""
    name = _path(name, "dsl.loads's name")
    if not isinstance(text, str):
        raise DslError(None, f"dsl.loads takes the source as a str, got {kind(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DslError(None, f"the source text is not valid Unicode: a lone surrogate "
                             f"{text[e.start]!r} at offset {e.start}") from None
    return Program(deep(lambda: load_program(name, text, parse=_parse)), device, numerics)


def _path(value: Any, what: str) -> str:
    """A path from Python (a str, bytes or path object) as a str the file system can take."""
    try:
        path = os.fsdecode(value)
        os.fsencode(path)
    except (TypeError, UnicodeError):
        raise DslError(None, f"{what} must be a path the file system can name, got "
                             f"{repr(value) if isinstance(value, str) else kind(value)}") from None
    if "\0" in path:
        raise DslError(None, f"{what} cannot hold a NUL character, got {path!r}")
    return path


def _parse(source: Source) -> ast.Module:
    """A module's syntax tree, from the on-disk cache when this parser read the same text under
    the same path before (parsing the standard library is most of a warm load's wait)."""
    from runtime import cache
    k = cache.key("ast", cache.code_digest("frontend"), ascii(source.path), source.text)
    return cache.memo(k, lambda: parse(source), ast.Module)


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


def _grad_options(d: ast.Def, wrt: Any, has_aux: Any) -> tuple[str, ...]:
    """The parameters of a gradient from Python, its options checked."""
    if not isinstance(has_aux, bool):
        raise DslError(d.name_span, f"has_aux= is True or False, got {has_aux!r}")
    return _wrt_names(d, wrt)


def _differentiable(d: ast.Def, inputs: Inputs, wanted: tuple[str, ...]) -> None:
    """As grad(f, wrt=y) in the language: y must have a gradient (not an integer, a bool, a
    static value or a key)."""
    names = [p.name for p in d.params]
    for w in wanted:
        problem = _not_differentiable(inputs.abstract[names.index(w)])
        if problem:
            raise DslError(d.name_span, f"cannot differentiate '{d.name}' with respect to {w!r}: {problem}")


def _float_leaves(d: ast.Def, low: Lowered, inputs: Inputs, wanted: tuple[str, ...]) -> list[int]:
    """The positions of the trained float leaves of those parameters (not buffers) among the
    function's params."""
    names = [p.name for p in d.params]
    return [i for w in wanted
            for i, trained in zip(low.arg_leaves[names.index(w)], trained_leaves(inputs.abstract[names.index(w)]))
            if trained and low.function.params[i].dtype in FLOAT_DTYPES]


def _describe_inputs(d: ast.Def, inputs: Inputs) -> str:
    parts = []
    for p, a in zip(d.params, inputs.abstract):
        parts.append(f"{p.name}={a.python}" if isinstance(a, StaticV) else f"{p.name}: {_annotation(a, concrete=True)}")
    return "; ".join(parts)


def _annotation(v, name: Callable[[RecordV], str] = lambda r: r.name, concrete: bool = False) -> str:
    """A type annotation for an abstract input: records by `name`, tensors with their shapes;
    concrete, records with their fields' types."""
    match v:
        case TensorV():
            return str(v.type)
        case KeyV():
            return "Key"
        case TupleV():
            return "(" + ", ".join(_annotation(i, name, concrete) for i in v.items) + ")"
        case ListV():
            return f"List({_annotation(v.items[0], name, concrete) if v.items else 'f32'})"
        case RecordV():
            return name(v) if not concrete else v.name + " {" + ", ".join(
                f"{n}: {_annotation(f, name, True)}" for n, f in v.fields) + "}"
    return "?"


def _input_names(d: ast.Def, low: Lowered) -> list[str]:
    """The name of each of the function's params: the runtime leaves of d's inputs (p.W1, x)."""
    return [e for p, layout in zip(d.params, low.params) for e in _leaf_paths(layout, p.name)]


def _leaf_paths(layout: Layout, path: str) -> list[str]:
    """An expression for each runtime leaf of a value, in order (p.W1, xs[0]): the names of
    `dslc run`'s arrays."""
    match layout.kind:
        case "tensor" | "key":
            return [path]
        case "tuple" | "list":
            return [e for k, i in enumerate(layout.items) for e in _leaf_paths(i, f"{path}[{k}]")]
        case "record":
            return [e for n, f in zip(layout.fields, layout.items) for e in _leaf_paths(f, f"{path}.{n}")]
    return []


def _result_expr(v, slots, name: Callable[[RecordV], str], trained: bool = True) -> str:
    """The gradient of an input as an expression over the printed results ({0}, {1}, …):
    trained float leaves take the next result, others (buffers too) are zeros of their type."""
    match v:
        case TensorV() if trained and v.type.dtype in FLOAT_DTYPES:
            return "{" + str(next(slots)) + "}"
        case TensorV():
            shape = ", ".join(str(d) for d in v.type.shape)
            return f"zeros([{shape}], dtype={v.type.dtype})"
        case TupleV():
            return "(" + ", ".join(_result_expr(i, slots, name, trained) for i in v.items) + ",)"
        case ListV():
            return "[" + ", ".join(_result_expr(i, slots, name, trained) for i in v.items) + "]"
        case RecordV():
            return name(v) + " {{ " + ", ".join(f"{n}: {_result_expr(f, slots, name, trained and n not in v.buffers)}"
                                                for n, f in v.fields) + " }}"
    raise DslError(None, f"cannot differentiate with respect to a value of type {_annotation(v)}")


class _Records:
    """Declarations of the records the inputs hold, with this specialisation's sizes (which a
    program printed generic names: dsl/generic.py). A record type held at several sizes
    (`Conv1D[D, 3 * D]` and `Conv1D[D, D]`) is declared once per size: Conv1D, Conv1D_2, …"""

    def __init__(self, values: list):
        self.names: dict[str, str] = {}           # a record's concrete annotation -> its name
        found: dict[str, str] = {}
        sizes: dict[str, int] = {}                # a record type -> how many sizes of it so far

        def walk(v) -> None:
            key = _annotation(v, concrete=True)
            if isinstance(v, RecordV) and key not in self.names:
                sizes[v.name] = sizes.get(v.name, 0) + 1
                self.names[key] = v.name if sizes[v.name] == 1 else f"{v.name}_{sizes[v.name]}"
                found[key] = ""
                for _, f in v.fields:
                    walk(f)
                fields = ", ".join(f"{'buffer ' * (n in v.buffers)}{n}: {_annotation(f, self.name)}"
                                   for n, f in v.fields)
                found[key] = f"object {self.names[key]} {{ {fields} }}"
            elif isinstance(v, (TupleV, ListV)):
                for i in v.items:
                    walk(i)

        for v in values:
            walk(v)
        self.declarations = list(found.values())

    def name(self, v: RecordV) -> str:
        return self.names[_annotation(v, concrete=True)]


def llvm_module(module) -> Any:
    import llvmlite.binding as llvm
    from backend.cpu import optimise
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    optimise(mod)
    return mod
