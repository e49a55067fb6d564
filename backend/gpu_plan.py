"""Lowering a plan for the GPU: which PTX kernels run its steps (loop kernels, the strided-copy
kernels of its data movement, the contraction and tensor-core kernels of its products, the
gather kernels of its takes, scatters, concatenations, draws and arg-reductions), their
launch shapes and integer arguments, and the PTX module that holds them. No GPU is needed
here: runtime/cuda.py loads the module and launches the kernels."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from backend import draws, nvptx, persistent, scatter, tensorcore, views
from backend.llvm import FLOATS, SCALAR
from backend.loops import Instr, Load, LoopKernel
from backend.persistent import Call, Copy, FoldKernel, Place
from backend.schedule import PRODUCTS, ContractStep, HostStep, KernelStep, Plan, made_once, schedule
from frontend.diagnostics import DslError
from ir.core import Function, Op, Value
from ir.interp import EvalError
from ir.ops.base import Primitive, Role, np_dtype
from ir.ops.index import ScatterAdd, Take
from ir.ops.reduce import ArgReduction
from ir.ops.shape import Concat, Rearrange, Split
from runtime import cache


def compile_ptx(kernels: list, matmuls: tuple[str, ...], gathers: tuple[tuple[str, str], ...],
                target: str, mmas: tuple[str, ...] = (), folds: tuple[FoldKernel, ...] = ()) -> str:
    """The PTX of these kernels, from the on-disk cache where it holds exactly them."""
    k = cache.key("ptx", repr(kernels), repr(matmuls), repr(gathers), target, repr(mmas), repr(folds),
                  cache.code_digest("backend", "ir"))        # (the scalar bodies are in ir/ops)
    cached = cache.load(k)
    if cached is not None:
        return cached.decode()
    text = module_ptx(kernels, matmuls, gathers, mmas, target, folds)
    cache.store(k, text.encode())
    return text


def module_ptx(kernels: list, matmuls: tuple[str, ...], gathers: tuple[tuple[str, str], ...],
               mmas: tuple[str, ...], target: str, folds: tuple[FoldKernel, ...] = ()) -> str:
    """One PTX module: the loop, contraction and gather kernels (backend/nvptx.py), the
    tensor-core kernels for the dtypes in `mmas` (backend/tensorcore.py) and the persistent
    kernels of `folds` (backend/persistent.py)."""
    module = nvptx.module_ir(kernels, matmuls, gathers=gathers)
    module = persistent.module_ir(folds, module=tensorcore.module_ir(mmas, module=module))
    return nvptx.assemble(str(module), target)


def gpu_schedule(fn: Function, name: str, numerics: str = "exact") -> Plan:
    """fn's plan on the GPU: in fast numerics the bf16 and f16 products too are contraction
    steps, which the tensor cores compute; the kernels reduce floats only (a warp's shuffles
    move floats)."""
    fast = tuple(dict.fromkeys(PRODUCTS + tensorcore.DTYPES))
    return schedule(fn, name, fast if numerics == "fast" else PRODUCTS, FLOATS)


@dataclass(frozen=True)
class GpuKernels:
    """What a plan runs on the GPU: its loop kernels and the copy kernels of its data movement
    (by the id of the op they replace), their launch shapes, the dtypes of its products (on
    the exact contraction kernel, or on tensor cores: mmas), and the gather kernel,
    (primitive, dtype), of each take and scatter_add that runs on the GPU."""
    kernels: list[LoopKernel]
    copies: dict[int, LoopKernel]
    launches: dict[str, nvptx.Launch]
    matmuls: tuple[str, ...]
    gathers: dict[int, tuple[Primitive, str]]
    mmas: tuple[str, ...] = ()
    folds: tuple[FoldKernel, ...] = ()      # a fold body's persistent kernel, where it has one

    @staticmethod
    def joined(parts: list[GpuKernels]) -> GpuKernels:
        """The kernels of several plans (an entry's and its folds' bodies') in one module."""
        return GpuKernels([k for p in parts for k in p.kernels], {i: k for p in parts for i, k in p.copies.items()},
                          {n: s for p in parts for n, s in p.launches.items()},
                          tuple(sorted({d for p in parts for d in p.matmuls})),
                          {i: g for p in parts for i, g in p.gathers.items()},
                          tuple(sorted({d for p in parts for d in p.mmas})),
                          tuple(f for p in parts for f in p.folds))

    @property
    def gather_kernels(self) -> tuple[tuple[Primitive, str], ...]:
        """The gather kernels the module holds: one per (primitive, dtype) the plan uses."""
        return tuple(sorted(set(self.gathers.values()), key=lambda g: (g[0].name, g[1])))

    @property
    def entries(self) -> list[str]:
        """The PTX entry points, the contraction kernel's in each tile size included."""
        return [s.entry for s in self.launches.values()] + \
            [nvptx.matmul_entry(d, t) for d in self.matmuls for t in nvptx.TILES] + \
            [tensorcore.entry(d) for d in self.mmas] + \
            [nvptx.gather_entry(*g) for g in self.gather_kernels] + [f.entry for f in self.folds]

    def ptx(self, arch: str) -> str:
        return module_ptx(self.kernels, self.matmuls, self.gather_kernels, self.mmas, arch, self.folds)

    def product_launch(self, op: Op) -> nvptx.MatmulLaunch | None:
        """The kernel and launch shape of a contraction step's product (None: it is empty)."""
        return Product.of(op, op.outputs[0].dtype in self.mmas).launch


def gpu_kernels(plan: Plan, name: str, numerics: str = "exact", fold: Op | None = None) -> GpuKernels:
    """The GPU kernels of a plan (no GPU needed: `dslc compile --target ptx` writes them); in
    fast numerics, the products of tensorcore.DTYPES run on tensor cores. The plan of a fold's
    body (`fold`, the Scan op) has the fold's persistent kernel too where the body is small."""
    products = {s.op.outputs[0].dtype for s in plan.steps if isinstance(s, ContractStep)}
    mmas = tuple(sorted(products & set(tensorcore.DTYPES))) if numerics == "fast" else ()
    matmuls = tuple(sorted(products - set(mmas)))
    copies = {id(s.op): k for i, s in enumerate(plan.steps)
              if not isinstance(s, (KernelStep, ContractStep))
              and (k := copy_kernel(f"{name}_copy{i}", s.op)) is not None}
    kernels = plan.kernels + list(copies.values())
    try:
        launches = {k.name: nvptx.launch(k) for k in kernels}
    except ValueError as e:                   # a kernel beyond what the GPU kernels cover
        raise DslError(None, f"'{name}' cannot run on the GPU: {e}") from None
    gathers = {id(s.op): g for s in plan.steps if isinstance(s, HostStep) and (g := gather_kernel(s.op))}
    persistent_fold = fold_kernel(fold, plan, copies, name) if fold is not None and not mmas else None
    return GpuKernels(kernels, copies, launches, matmuls, gathers, mmas,
                      (persistent_fold,) if persistent_fold else ())


@dataclass(frozen=True)
class Product:
    """What a call of the contraction kernel (or, with mma, the tensor-core kernel, which
    takes the same arguments) for `a @ b` needs besides the pointers (NumPy's rules for 1-D
    operands and batch axes): an operand broadcast along some batch axes only is expanded on
    the host first."""
    shapes: tuple[tuple[int, ...], tuple[int, ...]]      # the operands as matrices
    batch_shape: tuple[int, ...]
    expand: tuple[bool, bool]
    integers: tuple[int, ...]                            # m, n, k, the strides, m·n, batch
    launch: nvptx.MatmulLaunch | None                    # None: C is empty
    purpose: str                                         # of C's allocation

    @staticmethod
    def of(op: Op, mma: bool = False) -> Product:
        (a, b), (out,) = (v.shape for v in op.inputs), op.outputs
        a2 = a if len(a) > 1 else (1,) + a
        b2 = b if len(b) > 1 else b + (1,)
        batch_shape = np.broadcast_shapes(a2[:-2], b2[:-2])
        batch, (m, k), n = math.prod(batch_shape), a2[-2:], b2[-1]
        alone = [math.prod(x[:-2]) == 1 for x in (a2, b2)]
        expand = tuple(not one and x[:-2] != batch_shape for one, x in zip(alone, (a2, b2)))
        strides = [0 if one else math.prod(x[-2:]) for one, x in zip(alone, (a2, b2))]
        launching = tensorcore.launch if mma else nvptx.matmul_launch
        launch = launching(out.dtype, batch, m, n) if batch * m * n else None
        return Product((a2, b2), batch_shape, expand, (m, n, k, *strides, m * n, batch), launch,
                        f"the result of {launch.entry if launch else 'a product'}")


def gather_kernel(op: Op) -> tuple[Primitive, str] | None:
    """The gather kernel, (primitive, dtype), that runs a take, a concat or a split (of any
    dtype: a copy), a scatter_add (of the values backend/scatter.py compiles for the CPU), a
    draw or a key that backend/draws.py computes (of draws.dtype_of), or an argmax or argmin
    (of any dtype), else None."""
    dtype = op.outputs[0].dtype if op.outputs else None
    if isinstance(op.primitive, Take) and dtype in SCALAR:
        return op.primitive, dtype
    if isinstance(op.primitive, Concat) and dtype in SCALAR and all(v.dtype == dtype for v in op.inputs):
        return op.primitive, dtype
    if isinstance(op.primitive, Split) and dtype in SCALAR:
        return op.primitive, dtype
    if op.primitive.random and (random := draws.dtype_of(op)):
        return op.primitive, random
    if isinstance(op.primitive, ArgReduction) and op.inputs[0].dtype in SCALAR:
        return op.primitive, op.inputs[0].dtype                  # (its kernel reads x)
    if isinstance(op.primitive, ScatterAdd) and dtype in scatter.FLOATS and \
            op.inputs[0].dtype == op.inputs[2].dtype == dtype:
        return op.primitive, dtype
    return None


def gather_rows(prim: Primitive, indices: np.ndarray, axis: int, size: int,
                from_end: bool = True) -> np.ndarray:
    """The indices as int64 rows in [0, size), flattened, negative ones counted from the end
    (or out of range, without from_end); one out of range is the interpreter's EvalError, in
    its words (NumPy's)."""
    flat = indices.reshape(-1).astype(np.int64)
    if isinstance(prim, Take) and size == 0 and flat.size:
        raise EvalError(f"'{prim.name}' failed at run time: cannot do a non-empty take from an empty axes.")
    rows = np.where(flat < 0, flat + size, flat) if from_end else flat
    bad = np.flatnonzero((rows < 0) | (rows >= size))
    if bad.size:
        raise scatter.out_of_range(prim.name, flat[bad[0]], axis, size)
    return rows


def segments(rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """scatter_add's order and bounds: the positions of the slices sorted by their row, stably
    (so in index order within a row), and where each row's run starts (bounds[size] = n)."""
    order = np.argsort(rows, kind="stable").astype(np.int64)
    bounds = np.zeros(size + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=size), out=bounds[1:])
    return order, bounds


def copy_kernel(name: str, op: Op) -> LoopKernel | None:
    """A transpose, broadcast, index or slice as a map kernel that reads its input through
    the op's view (backend/views.py: out[i] = x[offset + Σ i[d] · strides[d]]), so that it
    runs on the GPU; None for other ops."""
    copied = op.primitive.role is Role.VIEW and not isinstance(op.primitive, Rearrange)
    if not copied or op.inputs[0].dtype not in SCALAR:
        return None
    (x,), (out,) = op.inputs, op.outputs
    view = views.view_of(op, views.identity(x))
    if view is None:
        return None
    return LoopKernel(name, out.shape, ((x.dtype, x.shape), (out.dtype, out.shape)),
                      (Instr.read(Load(0, view.strides, view.offset), x.dtype),), ((1, 0),))


# ---------------------------------------------------------------- a fold's persistent kernel

def _nbytes(v: Value) -> int:
    return math.prod(v.shape) * np_dtype(v.dtype).itemsize


def _aligned(n: int) -> int:
    return -(-n // persistent.ALIGN) * persistent.ALIGN


def fold_kernel(op: Op, body: Plan, copies: dict[int, LoopKernel], name: str) -> FoldKernel | None:
    """The persistent kernel (backend/persistent.py) of a fold (a Scan op) whose body's GPU
    plan is `body` (its copy kernels by op id, as GpuKernels has them), if the body is small
    (persistent.py's rule), else None."""
    a = op.attrs
    n_state, n_xs, length = a["n_state"], a["n_xs"], a["length"]
    fn = body.function
    inputs = len(op.inputs)
    places: dict[Value, Place] = {}
    constants = made_once_ops(body)             # made once, passed after the fold's outputs
    places.update((v, Place(inputs + len(op.outputs) + i)) for i, v in enumerate(v for c in constants for v in c.outputs))
    state_offsets, offset = [], 0
    for v in fn.params[:n_state]:
        state_offsets.append(offset)
        offset += _aligned(_nbytes(v))
    state_bytes = offset
    places.update((v, Place(-1, o, parity=0)) for v, o in zip(fn.params[:n_state], state_offsets))
    places.update((v, Place(n_state + q, per_step=_nbytes(v))) for q, v in enumerate(fn.params[n_state:n_state + n_xs]))
    places.update((v, Place(i)) for i, v in enumerate(fn.params[n_state + n_xs:], n_state + n_xs))
    offset = 2 * state_bytes
    work = 0

    def made(values) -> None:
        nonlocal offset
        for v in values:
            places[v] = Place(-1, offset)
            offset += _aligned(_nbytes(v))

    def call(k: LoopKernel, args) -> Call | None:
        nonlocal work
        if nvptx.launch(k).shared:
            return None
        work += nvptx.extent(k) * max(k.n, 1)
        return Call(k, tuple(places[v] for v in args))

    steps: list[Call | persistent.Product] = []
    for step in body.steps:
        if isinstance(step, KernelStep):
            made(step.writes)
            steps.append(call(step.kernel, step.args))
        elif isinstance(step, ContractStep):
            product = _product_in_fold(step.op, places, made)
            if product is None:
                return None
            work += product.m * product.n * max(product.k, 1) * product.batch
            steps.append(product)
            if step.epilogue:
                made(step.epilogue.writes)
                steps.append(call(step.epilogue.kernel, step.epilogue.args))
        elif isinstance(step.op.primitive, Rearrange):            # the same bytes
            places[step.op.outputs[0]] = places[step.op.inputs[0]]
        elif any(step.op is c for c in constants):            # an argument (above)
            pass
        elif id(step.op) in copies:
            made(step.op.outputs)
            steps.append(call(copies[id(step.op)], step.op.inputs + step.op.outputs))
        else:
            return None
        if steps and steps[-1] is None:
            return None
    if offset > persistent.ARENA or work > persistent.WORK:
        return None
    count = lambda v: math.prod(v.shape)
    state = lambda j, parity: Place(-1, state_offsets[j], parity=parity)
    results = tuple(Copy(places[v], state(j, 1) if j < n_state else
                         Place(inputs + j, per_step=_nbytes(v)), v.dtype, count(v))
                    for j, v in enumerate(fn.results))
    start = tuple(Copy(Place(j), state(j, 0), v.dtype, count(v)) for j, v in enumerate(fn.params[:n_state]))
    end = tuple(Copy(state(j, 0), Place(inputs + j), v.dtype, count(v)) for j, v in enumerate(fn.params[:n_state]))
    return FoldKernel(f"{name}_fold", length, bool(a.get("reverse")),
                      inputs + len(op.outputs) + sum(len(c.outputs) for c in constants),
                      state_bytes, max(offset, persistent.ALIGN), start, tuple(steps), results, end)


def _product_in_fold(op: Op, places: dict[Value, Place], made) -> persistent.Product | None:
    """A product the block computes, its result placed by `made`; None for one it does not
    (another dtype, or an operand broadcast along some batch axes)."""
    dtype = op.outputs[0].dtype
    if dtype not in ("f32", "f64"):
        return None
    shapes = Product.of(op)
    if any(shapes.expand):
        return None
    m, n, k, sa, sb, _, batch = shapes.integers
    made(op.outputs)
    a, b = (places[v] for v in op.inputs)
    return persistent.Product(dtype, m, n, k, sa, sb, batch, (a, b, places[op.outputs[0]]))


def made_once_ops(plan: Plan) -> list[Op]:
    """The ops of a plan that a runtime makes once (constants): a persistent kernel takes
    their values as arguments, after the fold's."""
    return [s.op for s in plan.steps if isinstance(s, HostStep) and made_once(s.op)]
