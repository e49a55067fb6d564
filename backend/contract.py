"""Batched matrix multiplication C[b] = A[b] @ B[b] as llvmlite IR, blocked for the caches
and registers as BLIS does it, whose every output element is still

    acc = -0.0;  for k = 0, 1, …, K-1:  acc = fma(A[i, k], B[k, j], acc)

so its bits are those of ir.numerics.contract (docs/numerics.md) at any tile size and any
thread count. The generated function, in C:

    void NAME(const T *A, const T *B, T *C,             /* [M,K], [K,N], row-major [M,N] */
              int64_t batch, int64_t M, int64_t N, int64_t K,
              int64_t a_stride, int64_t b_stride, int64_t c_stride,
              int64_t a_row, int64_t a_col, int64_t b_row, int64_t b_col,
              T *scratch, int64_t *next_job,
              void (*epilogue)(void **table, int64_t lo, int64_t hi, int64_t n),
              void **epilogue_table,
              int64_t thread_index, int64_t thread_count);

T is float (f32) or double (f64); the strides are the elements between batch entries (0
broadcasts an operand), and A[i, k] is A[i·a_row + k·a_col] (B likewise), so a transposed
or sliced operand is read in place: B is packed from rows of vectors where b_col is 1, from
blocks transposed in registers where b_row is 1. C need not be initialised and must not
overlap A, B or scratch. K = 0 gives -0.0 everywhere (the empty sum); M, N or batch ≤ 0 does
nothing.

Tiles: the register tile is mr rows × 1 to nv vectors; each tile of C runs the narrowest tile
function that covers its columns, and a tile at an edge of C reads and writes it through masks
(rows past M, lanes past N), so an edge of C costs neither a copy nor a whole tile's work (a
whole tile stores plainly: a masked store is microcoded on AMD's Zen). A job of at most mr rows
(a matrix-vector product: a decoder's token) packs nothing: where B's rows are contiguous, one
row streams STREAM_ROWS of them at a time across all its columns and more read B in place with
the tiles below; tiles of mr rows read a transposed B (x @ W.T: a tied embedding's logits) in
blocks of width × width that they transpose in registers (so does a product of one column,
computed as its transpose, one row). A job whose B rows lie close (Tiles.in_place_row_bytes)
and whose K block of B (rows contiguous) fits in half of L1 (Tiles.in_place_bytes: a 64³, an
attention head's products), or that has few rows besides (on a host without AVX-512,
Tiles.in_place_rows: an RNN cell's products), packs nothing either: tiles of mr rows read A and
B in place, B's rows as vectors, only a tile's last vector through a mask.

Threads: C is cut into jobs (one batch entry × a block of rows × a block of columns, each
running the whole K loop of its elements; about JOBS_PER_THREAD per thread where the shape
allows). The runtime calls the function once for every thread_index in [0, thread_count),
concurrently or one after another, all with the same arguments except thread_index, and
waits for all of them. *next_job is zero before the first call starts: each call takes the
next job from it with an atomic add until none is left, so a thread the OS holds up leaves its
share to the others, and every element is written by exactly one call. NAME.task is the same
function as a task of the host's thread team (backend/team.py), its arguments in an array.
The job grid depends on thread_count; the bits depend on neither the grid nor which thread
ran a job.

Epilogue: where epilogue is not null and a job's column block is all of N (N ≤ nc), the job
calls epilogue(epilogue_table, lo, hi, 0) on each block of at most mc rows once its elements
are final (after their last K block), lo and hi counting C's rows over batch × M (row i of
batch entry b is b·M + i): a kernel of backend/llvm.py over C's rows (never a reduction,
whose n the 0 would be) then runs on them while they are in cache. Where N > nc it is not called.

Scratch: thread t packs its panels into scratch[t·S, (t+1)·S), S = Tiles.scratch_elements;
any alignment works, 64 bytes is faster.

Why the order of each element's K fmas survives the blocking is said where each choice is
made, in comments marked ORDER. On a GPU the same design maps a job to a thread block, the
packed panels to shared memory and the register tile to one thread's (or warp's) registers.
"""
from __future__ import annotations

import ctypes
import functools
import math
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

from backend import cpu
from backend.cpu import address
from backend.llvm import masked_load, overload_suffix
from backend.team import Task, team
from runtime import cache

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
SCALAR = {"f32": ir.FloatType(), "f64": ir.DoubleType()}
NUMPY = {"f32": np.float32, "f64": np.float64}
SIZE = {"f32": 4, "f64": 8}
UNROLL = 4      # k steps per trip of the register tile's main loop
JOBS_PER_THREAD = 4   # so that a thread the OS holds up leaves a share to the others
MIN_TAKE_FMAS = 1 << 15     # the work a thread takes at once, where jobs are smaller (build_matmul)
MIN_JOB_ROWS = 96     # each job packs its B panel: fewer rows would not pay for it
MIN_JOB_COLUMNS = 64  # and its A block: fewer columns would not pay for that
PACK_ROWS = 16  # rows of a B of general strides packed per pass (a cache line of f32)
STREAM_ROWS = 8     # rows of B a matrix-vector product streams at once (8 fmas a load of C:
                    # 10-15% faster than 4 at 1×768×2304 on a Zen 3)
COLUMN_VECTORS = 1  # the transposed-B tile's vectors: its width × width transpose fills the registers
LAYOUTS = 256       # operand layouts a Matmul remembers (then it forgets them all)
ANY_ROWS = 1 << 62  # Tiles.in_place_rows where the rows of a job do not matter
ARGUMENTS = 18      # NAME.task's array: A … b_col, scratch, next_job, epilogue, epilogue_table
# a product's threads get at least this many fmas each (NAME.direct has it compiled in): at
# 2^20, on a Zen 4, 64³ took 5.8 µs on one thread (NumPy 5.6), now 5.0 on two; 64×64×256
# 21.7 µs, now 12.5; 16×512×128, an LSTM's step, 21.2, now 14.9 (its gradient 1.93 -> 1.51 ms)
MIN_MULTIPLY_ADDS_PER_THREAD = 1 << 17
# a product in a native step's segment hands its jobs to the team in native code, where a
# direct call from Python goes back to Python to run them (a second call, the team's lock):
# it is worth a second thread from half the work (the names MLP step's products, 32×30×200,
# 32×200×27 and their gradients', 1.7 to 1.9·10^5 fmas: the step 64.4-65.1 µs -> 58.7-59.4;
# a direct 32×64×64 on two threads took 3.9-5.4 µs, on one 3.7-3.8)
IN_STEP_MULTIPLY_ADDS_PER_THREAD = MIN_MULTIPLY_ADDS_PER_THREAD // 2
# a product of one row tile's fmas cost about this many of a blocked product's, divided by
# its rows (each of B's loads from memory feeds one fma a row)
MATRIX_VECTOR_COST = 2

# LLVM's levels for the kernel. Its code generator's at O1: the tiles are vector code already,
# and O1 runs them as fast as O3 (on a Zen 3, A/B over 64³, 1024×512×128, 256³, 1×768×2304,
# 7×13×29 and 64 batched 64×32×64: within 3%, noise) in half the compile time (1.2 s against
# 2.4). Its passes none (level 0): the IR is written as the code should be, and the code
# generator's own passes (strength reduction, LICM, CSE) do the rest; on a Zen 4, in one
# process against O1's passes, 51 shapes (11 named, 40 random up to 512×1000×1024, either
# operand transposed) ran in 0.999 of the time (geometric mean; 0.93-1.07 each, same bits),
# and the kernel compiled in 1.4-2.0 CPU s against 2.0-3.0.
PASSES_LEVEL, CODE_LEVEL = 0, 1
# The kernel's object code is made in PARTS, each compiled on its own (a cold program starts
# a process for each: runtime/cpu.py) and linked in one engine: the in-place tiles (part 0,
# nearly half of its instructions), and the rest, which calls them. On two cores the first
# call of a GPT step waited 1.2 s for the kernel after its own pieces were compiled.
PARTS = 2


@dataclass(frozen=True)
class Tiles:
    """A register tile of mr rows × nv vectors of `width` lanes (A elements broadcast, packed B
    rows loaded as vectors), a packed A block of at most mc × kc (kept in L2) and a packed B
    panel of at most kc × nc; mc is a multiple of mr and nc of nr. A job whose B rows are at
    most in_place_row_bytes apart reads B in place instead of packing it where its K block of B
    (rows contiguous) takes at most in_place_bytes, or where the job has at most
    in_place_rows rows. A job of at most in_place_a_columns columns reads A (rows
    contiguous) in place, as one of a single column tile reads any A."""
    mr: int
    nv: int
    width: int
    kc: int
    mc: int
    nc: int
    in_place_bytes: int = 1 << 15
    in_place_rows: int = 48
    in_place_row_bytes: int = 2048
    in_place_a_columns: int = 256

    def __post_init__(self):
        if self.mc % self.mr or self.nc % self.nr:
            raise ValueError(f"mc must be a multiple of mr and nc of nr: {self}")

    @property
    def nr(self) -> int:
        return self.nv * self.width

    @property
    def scratch_elements(self) -> int:
        """Elements of scratch one thread packs into."""
        return self.mc * self.kc + self.kc * self.nc

    def scratch_size(self, threads: int) -> int:
        """Elements of a scratch buffer for `threads` threads: 64 spare, room to start it on a
        cache line (`aligned`)."""
        return threads * self.scratch_elements + 64


def host_tiles(dtype: str) -> Tiles:
    """Tiles for this machine, measured on a Zen 4 (AVX-512, 32 KiB L1d, 1 MiB L2): a 6 × 4-vector
    tile (24 accumulators, 4 B vectors and a broadcast in 32 registers; B rows of 4 lines), a
    K block of 512 (C is reloaded once per 512 fmas) and a B panel of about 1 MiB; a K block of
    B of up to 32 KiB read in place (64³: 10% faster than packing it; at 64 KiB, 1024×128×128,
    and 256 KiB, 1024×512×128, packing it is 15% faster on a Zen 3); so is B for any job whose
    B rows are at most 12 KiB apart, each tile streaming them from L2 (a copy of B cost more
    than it saved: the GPT step's weights' gradients, 128×1024×N, took 0.86-0.92 of the time,
    its forward products 0.95-0.98, random shapes up to 1024³ 0.97-0.99, geometric means; rows
    16 KiB apart and more were up to 7% slower). Without AVX-512 (16 registers) the 6 × 2-vector
    Haswell tile, and B read in place for a job of at most 48 rows whose B rows are at most
    2 KiB apart (on a Zen 3: 8×512×384 92 → 56 µs, 16×64×512 21.7 → 18.3, 32×512×512 270 →
    255; rows 4 KiB apart and more conflict in its caches, and were up to 30% slower)."""
    features = llvm.get_host_cpu_features()
    vector_bytes = 64 if features.get("avx512f") else 32 if features.get("avx") else 16
    width = vector_bytes // SIZE[dtype]
    if vector_bytes == 64:
        return Tiles(mr=6, nv=4, width=width, kc=512, mc=96, nc=2048 // SIZE[dtype],
                     in_place_rows=ANY_ROWS, in_place_row_bytes=12 << 10)
    return Tiles(mr=6, nv=2, width=width, kc=512, mc=96, nc=2048 // SIZE[dtype])


# ---------------------------------------------------------------------------------------------
# The IR


def _i64(v: int | ir.Value) -> ir.Value:
    return ir.Constant(I64, v) if isinstance(v, int) else v


@functools.cache
def _zeros(t: ir.Type) -> ir.Constant:
    """t's zero, one object for every use: llvmlite writes a constant's text once, and a
    vector's, made and written element by element at each splat and mask, took a fifth of
    the time Python took to write the kernel's IR."""
    return ir.Constant(t, None)


class _Emitter:
    """An IRBuilder plus the integer and loop idioms the kernel is written in."""

    def __init__(self, fn: ir.Function, dtype: str, tiles: Tiles):
        self.fn, self.module, self.tiles = fn, fn.module, tiles
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.scalar = SCALAR[dtype]
        self.vec = ir.VectorType(self.scalar, tiles.width)
        self.align = SIZE[dtype]
        self.packed: tuple[ir.Value, ir.Value] = ()     # the matmul's slots for its packed B

    def min(self, x, y):
        x, y = _i64(x), _i64(y)
        return self.b.select(self.b.icmp_signed("<", x, y), x, y)

    def max(self, x, y):
        x, y = _i64(x), _i64(y)
        return self.b.select(self.b.icmp_signed("<", x, y), y, x)

    def ceil_div(self, x, d):
        return self.b.sdiv(self.b.add(x, self.b.sub(_i64(d), _i64(1))), _i64(d))

    def at(self, ptr, *offsets):
        """ptr + Σ offsets, in elements."""
        for off in offsets:
            ptr = self.b.gep(ptr, [_i64(off)], inbounds=True)
        return ptr

    def load_vec(self, ptr):
        return self.b.load(self.b.bitcast(ptr, self.vec.as_pointer()), align=self.align)

    def store_vec(self, value, ptr) -> None:
        self.b.store(value, self.b.bitcast(ptr, self.vec.as_pointer()), align=self.align)

    def splat(self, scalar, vec=None):
        vec = vec or self.vec
        one = self.b.insert_element(_zeros(vec), scalar, ir.Constant(I32, 0))
        return self.b.shuffle_vector(one, _zeros(vec), _zeros(ir.VectorType(I32, vec.count)))

    def lanes_below(self, n, v: int):
        """The mask of the lanes of vector v (of a row of vectors) whose column is < n."""
        w = self.tiles.width
        lanes = ir.Constant(ir.VectorType(I64, w), list(range(v * w, (v + 1) * w)))
        return self.b.icmp_signed("<", lanes, self.splat(_i64(n), ir.VectorType(I64, w)))

    def merge(self, *branches: tuple[list, ir.Block]) -> list:
        """Vectors that are, element by element, those of the branch (values, its last block)
        control came from: one phi each."""
        merged = [self.b.phi(self.vec) for _ in branches[0][0]]
        for values, block in branches:
            for phi, value in zip(merged, values, strict=True):
                phi.add_incoming(value, block)
        return merged

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        if name in self.module.globals:
            return self.module.globals[name]
        return ir.Function(self.module, ir.FunctionType(ret, args), name)

    def masked_load(self, ptr, mask):
        """A vector from ptr where mask is set, +0.0 elsewhere (those lanes are not read)."""
        return masked_load(self.b, self.b.bitcast(ptr, self.vec.as_pointer()), mask, self.align)

    def masked_store(self, value, ptr, mask) -> None:
        vec = self.vec
        f = self.intrinsic(f"llvm.masked.store.{overload_suffix(vec)}.p0", ir.VoidType(),
                           [vec, vec.as_pointer(), I32, mask.type])
        self.b.call(f, [value, self.b.bitcast(ptr, vec.as_pointer()),
                        ir.Constant(I32, self.align), mask])

    @contextmanager
    def loop(self, start, stop, step=1, name="i") -> Iterator[ir.Value]:
        """for (i = start; i < stop; i += step), the body being the `with` block."""
        b = self.b
        before = b.block
        head, body, done = (self.fn.append_basic_block(f"{name}.{s}")
                            for s in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name)
        i.add_incoming(_i64(start), before)
        b.cbranch(b.icmp_signed("<", i, _i64(stop)), body, done)
        b.position_at_end(body)
        yield i
        i.add_incoming(b.add(i, _i64(step)), b.block)
        b.branch(head)
        b.position_at_end(done)


def _build_tile(module: ir.Module, name: str, dtype: str, t: Tiles, nv: int,
                b_form: str = "packed", mr: int | None = None, declared: bool = False
                ) -> ir.Function:
    """void tile(const T *a, i64 a_row, i64 a_k, const T *b, i64 b_k, i64 kc, T *c, i64 ldc,
    i1 first, i64 m, i64 n): the m × n corner (m ≤ mr, n ≤ nv·width) of the mr × nv-vector
    block of C at c (row stride ldc) gains kc steps from A (A[r, k] at a[r·a_row + k·a_k]: a
    packed panel or A itself) and B; with `first` it starts from -0.0 instead of c's
    contents. mr is the tiles' unless given. B (b_form) is the packed panel ("packed": B[k, j]
    at b[k·nr + j]), or B itself read in place ("rows": B[k, j] at b[k·b_k + j], the last
    vector through the column mask, as lanes past n are past B's rows), or from a transposed B
    ("columns": B[k, j] at b[j·b_k + k], width k of width columns loaded along k and
    transposed in registers). Only declared where `declared` (another part defines it)."""
    p = SCALAR[dtype].as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [p, I64, I64, p, I64, I64, p, I64,
                                                             I1, I64, I64]), name)
    if declared:
        return fn
    fn.linkage = "internal"
    fn.attributes.add("noinline")      # (its registers its own: see the forms of A below)
    a_pack, a_row, a_k, b_pack, b_k, kc, c, ldc, first, m, n = fn.args
    mr = t.mr if mr is None else mr
    for arg in (a_pack, b_pack, c):
        arg.add_attribute("noalias")
    e = _Emitter(fn, dtype, t)
    b = e.b
    fma = e.intrinsic(f"llvm.fma.{overload_suffix(e.vec)}", e.vec, [e.vec] * 3)
    # C is read and written through masks: rows past m and columns past n are not touched
    # (their lanes compute on padding, or on row m - 1 again), so an edge tile needs no copy
    # of C. A masked-off row's addresses in A and C are row m - 1's, addresses inside them.
    rows = [b.icmp_signed("<", _i64(r), m) for r in range(mr)]
    row_at = [e.min(r, b.sub(m, _i64(1))) for r in range(mr)]
    a_at = [e.at(a_pack, b.mul(r, a_row)) for r in row_at]
    c_at = [[e.at(c, b.mul(r, ldc), v * t.width) for v in range(nv)] for r in row_at]
    tile_c = [ptr for ptr_row in c_at for ptr in ptr_row]
    none = _zeros(ir.VectorType(I1, t.width))

    def masks() -> list:
        """Each of tile_c's vectors' mask, made in the branches that read C through masks."""
        columns = [e.lanes_below(n, v) for v in range(nv)]
        return [b.select(rows[r], columns[v], none) for r in range(mr) for v in range(nv)]

    # ORDER: the accumulators are C itself. The first K block starts from -0.0, as the
    # definition does; a later one reloads exactly the value the previous block stored.
    with b.if_else(first) as (from_zero, from_c):
        with from_zero:
            zero_block = b.block
        with from_c:
            loaded = [e.masked_load(ptr, mask) for ptr, mask in zip(tile_c, masks())]
            load_block = b.block
    acc = e.merge(([ir.Constant(e.vec, [-0.0] * t.width)] * len(loaded), zero_block),
                  (loaded, load_block))

    def a_element(a: tuple, r: int, k):
        """A[r, k] in every lane, a being A's rows' addresses and its k stride."""
        rows_at, k_stride = a
        return e.splat(b.load(e.at(rows_at[r], b.mul(k, k_stride)), align=e.align))

    def step(acc: list, k, bs: list, a: tuple) -> list:
        # ORDER: one k for every element of the tile: lane (r, j) gains A[r, k]·B[k, j].
        # The vectors run across j (distinct elements), never across k.
        out = []
        for r in range(mr):
            out += [b.call(fma, [a_element(a, r, k), bs[v], acc[r * nv + v]]) for v in range(nv)]
        return out

    def b_row(k, edge: bool) -> list:
        """B[k, :nv·width] from a packed panel or B's own row (at a column edge, its last
        vector through the mask)."""
        if b_form == "packed":
            row = e.at(b_pack, b.mul(k, _i64(t.nr)))
            return [e.load_vec(e.at(row, v * t.width)) for v in range(nv)]
        row = e.at(b_pack, b.mul(k, b_k))
        # (the narrowest tile that covers n is called: only its last vector can reach past n)
        return [e.masked_load(e.at(row, v * t.width), e.lanes_below(n, v)) if edge and v == nv - 1 else
                e.load_vec(e.at(row, v * t.width)) for v in range(nv)]

    def by_rows(acc: list, k, count: int, a: tuple, edge: bool = False) -> list:
        for u in range(count):
            acc = step(acc, b.add(k, _i64(u)), b_row(b.add(k, _i64(u)), edge), a)
        return acc

    def by_columns(acc: list, k, count: int, a: tuple, rest=None) -> list:
        """`count` (= width) k from k on, only those below `rest` where it is given: for each
        vector of columns, width loads along k transposed into that many rows of B."""
        along = e.lanes_below(rest, 0) if rest is not None else None
        acc = list(acc)
        for v in range(nv):
            loads = []
            for col in range(count):
                # a column past n reads column n - 1 again (its lanes are never stored)
                j = e.min(_i64(v * t.width + col), b.sub(n, _i64(1)))
                at = e.at(b_pack, b.mul(j, b_k), k)
                loads.append(e.load_vec(at) if along is None else e.masked_load(at, along))
            for u, row in enumerate(_transpose(e, loads)):
                inside = b.icmp_signed("<", _i64(u), rest) if rest is not None else None
                # (a k past the end reads A at k instead: an address inside A)
                ku = b.add(k, _i64(u)) if inside is None else b.select(inside, b.add(k, _i64(u)), k)
                for r in range(mr):
                    added = b.call(fma, [a_element(a, r, ku), row, acc[r * nv + v]])
                    if inside is not None:   # ORDER: a k past the end adds nothing, not even 0
                        added = b.select(inside, added, acc[r * nv + v])
                    acc[r * nv + v] = added
        return acc

    def k_loop(acc: list, start, stop, stride: int, name: str, trip) -> tuple[list, ir.Value]:
        """k = start, start + stride, … while k + stride ≤ stop; trip(acc, k, stride) takes
        `stride` steps, in increasing k. Returns the accumulators and k after the loop."""
        before = b.block
        head, body, done = (fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64, "k")
        k.add_incoming(start, before)
        phis = [b.phi(e.vec) for _ in acc]
        for phi, value in zip(phis, acc):
            phi.add_incoming(value, before)
        b.cbranch(b.icmp_signed("<=", b.add(k, _i64(stride)), stop), body, done)
        b.position_at_end(body)
        out = trip(list(phis), k, stride)
        k.add_incoming(b.add(k, _i64(stride)), b.block)
        for phi, value in zip(phis, out):
            phi.add_incoming(value, b.block)
        b.branch(head)
        b.position_at_end(done)
        return phis, k

    def k_loops(acc: list, a: tuple) -> list:
        """The tile's kc steps, reading A at a."""
        if b_form == "columns":
            trip = functools.partial(by_columns, a=a)
            acc, k = k_loop(acc, _i64(0), kc, t.width, "main", trip)
            rest = b.sub(kc, k)                      # ORDER: the tail comes after, in k order
            without = b.block
            with b.if_then(b.icmp_signed(">", rest, _i64(0))):
                tail = trip(acc, k, t.width, rest=rest)
                with_tail = b.block
            return e.merge((acc, without), (tail, with_tail))

        def main_and_rest(acc: list, edge: bool) -> list:
            trip = functools.partial(by_rows, a=a, edge=edge)
            acc, k = k_loop(acc, _i64(0), kc, UNROLL, "main", trip)
            return k_loop(acc, k, kc, 1, "rest", trip)[0]    # ORDER: the tail after, in k order
        if b_form == "packed":
            return main_and_rest(acc, False)
        # B read in place: only a tile at a column edge loads its last vector through the
        # mask (a masked load each k costs a whole tile a tenth of its time on Zen 3)
        with b.if_else(b.icmp_signed("<", n, _i64(nv * t.width))) as (at_edge, inside):
            with at_edge:
                masked = main_and_rest(acc, True), b.block
            with inside:
                plain = main_and_rest(acc, False), b.block
        return e.merge(masked, plain)

    def k_loops_for(acc: list, forms: list) -> list:
        """k_loops for the first of forms (condition, A's rows and k stride) whose condition
        holds, the last one's being None (any A)."""
        (holds, a), *others = forms
        if not others:
            return k_loops(acc, a)
        with b.if_else(holds) as (this, other):
            with this:
                chosen = k_loops(acc, a), b.block
            with other:
                rest = k_loops_for(acc, others), b.block
        return e.merge(chosen, rest)

    # A's addresses with strides the code knows, where they are (a packed A; A's rows
    # contiguous): a register a row and displacements, where a runtime stride made an address
    # for each row and step of the unrolled loop, most of them spilled to the stack. With the
    # tile a function of its own (inlined, its set-up was spilled the more) and C's masks made
    # only where read, on a Zen 3 (the kernel called from C, one thread): 64×32×64 3.51 ->
    # 3.08 µs, 64 of them 204 -> 189, 64 of 32×64×64 230 -> 205, 1024×128×384 1102 -> 1071,
    # a transposed A's 512×1024×128 1646 -> 1617 (the set-up was a fifth of a 64×32×64)
    general = (a_at, a_k)
    unit_k = (b.icmp_signed("==", a_k, _i64(1)), (a_at, _i64(1)))
    packed = (b.and_(b.icmp_signed("==", a_row, _i64(1)), b.icmp_signed("==", a_k, _i64(mr))),
              ([e.at(a_pack, r) for r in row_at], _i64(mr)))
    forms = {"packed": [packed, unit_k], "rows": [unit_k], "columns": []}[b_form]
    acc = k_loops_for(acc, forms + [(None, general)])
    # A whole tile stores plainly, and so does each row of a tile at the row edge, a row past
    # m not at all: a masked store is microcoded on AMD's Zen (about 10 cycles each on Zen 3,
    # where 12 of them cost a 64-deep tile as much as a third of its fmas); only a tile at a
    # column edge goes through masks
    full_width = b.icmp_signed("==", n, _i64(nv * t.width))
    with b.if_else(b.and_(full_width, b.icmp_signed("==", m, _i64(mr)))) as (plain, edge):
        with plain:
            for value, ptr in zip(acc, tile_c):
                e.store_vec(value, ptr)
        with edge:
            tile_masks = masks()
            for r in range(mr):
                row = slice(r * nv, (r + 1) * nv)
                with b.if_then(rows[r]), b.if_else(full_width) as (whole_row, column_edge):
                    with whole_row:
                        for value, ptr in zip(acc[row], tile_c[row]):
                            e.store_vec(value, ptr)
                    with column_edge:
                        for value, ptr, mask in zip(acc[row], tile_c[row], tile_masks[row]):
                            e.masked_store(value, ptr, mask)
    b.ret_void()
    return fn


def build_matmul(module: ir.Module, name: str, dtype: str, tiles: Tiles | None = None,
                 part: int | None = None) -> None:
    """Add NAME (the C signature is in this module's docstring), NAME.task, NAME.direct and
    the tile functions (one per tile width in vectors and form of B) to module; only those of
    one of the PARTS where `part` is given."""
    t = tiles or host_tiles(dtype)
    # part 0: the tiles that read B in place; part 1: the rest, which calls them
    in_place_by_width = [_build_tile(module, f"{name}.in_place{nv}", dtype, t, nv, "rows",
                                     declared=part == 1) for nv in range(1, t.nv + 1)]
    if part == 0:
        for fn in in_place_by_width:          # (part 1 calls them)
            fn.linkage = "external"
        return
    tiles_by_width = [_build_tile(module, f"{name}.tile{nv}", dtype, t, nv)
                      for nv in range(1, t.nv + 1)]
    # (and for one row, whose tiles of mr rows spent five sixths of their fmas and loads of A
    # on rows past it: 1×768×2304 with B transposed, a tied embedding's logits, took 150 µs)
    columns_by_width = [[_build_tile(module, f"{name}.{label}{nv}", dtype, t, nv, "columns", mr)
                         for nv in range(1, COLUMN_VECTORS + 1)]
                        for label, mr in (("row_columns", 1), ("columns", t.mr))]
    p = SCALAR[dtype].as_pointer()
    table = ir.IntType(8).as_pointer().as_pointer()
    epilogue_type = ir.FunctionType(ir.VoidType(), [table, I64, I64, I64]).as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [p, p, p] + [I64] * 11 +
                                             [p, I64.as_pointer(), epilogue_type, table, I64, I64]),
                     name)
    (A, B, C, batch, M, N, K, sa, sb, sc, a_row, a_col, b_row, b_col,
     scratch, next_job, epilogue, epilogue_table, tid, nthreads) = fn.args
    for arg, label in zip(fn.args, "A B C batch M N K a_stride b_stride c_stride a_row a_col "
                                   "b_row b_col scratch next_job epilogue epilogue_table "
                                   "thread_index thread_count".split()):
        arg.name = label
    e = _Emitter(fn, dtype, t)
    b = e.b
    a_pack = e.at(scratch, b.mul(tid, _i64(t.scratch_elements)))
    b_pack = e.at(a_pack, t.mc * t.kc)
    # what b_pack holds: its K block's address, and its rows and columns (kc << 32 | nj)
    e.packed = (b.alloca(I64, name="packed"), b.alloca(I64, name="packed_shape"))
    for slot in e.packed:
        b.store(_i64(0), slot)

    empty = b.or_(b.or_(b.icmp_signed("<=", batch, _i64(0)), b.icmp_signed("<=", M, _i64(0))),
                  b.icmp_signed("<=", N, _i64(0)))
    with b.if_then(empty, likely=False):
        b.ret_void()

    # A product of one column (a matrix times a vector) is computed as its transpose, one row
    # (Bᵀ @ Aᵀ, whose row of C lies where C's column does): with one column each tile's
    # vectors held one useful lane (128×1000×1 took 38 µs, now 23; NumPy's 6, whose sums
    # are not in k order). Each element's fmas are the same, a·b being b·a; not where an
    # epilogue needs C's rows.
    has_epilogue = b.icmp_unsigned("!=", epilogue, ir.Constant(epilogue_type, None))
    column = b.and_(b.and_(b.icmp_signed("==", N, _i64(1)), b.icmp_signed(">", M, _i64(1))),
                    b.not_(has_epilogue))
    swap = lambda x, y: (b.select(column, y, x), b.select(column, x, y))
    A, B = swap(A, B)
    sa, sb = swap(sa, sb)
    M, N = swap(M, N)
    (a_row, b_col), (a_col, b_row) = swap(a_row, b_col), swap(a_col, b_row)

    # The job grid: column blocks of at most nc (each packs its B panel once per K block),
    # cut into row blocks (of at least MIN_JOB_ROWS rows) until there are about
    # JOBS_PER_THREAD jobs per thread.
    # ORDER: a job owns its elements for the whole K loop; which thread runs it changes where
    # an element is computed, not the order of its fmas.
    row_panels, col_panels = e.ceil_div(M, t.mr), e.ceil_div(N, t.nr)
    wanted = b.select(b.icmp_signed(">", nthreads, _i64(1)),
                      b.mul(nthreads, _i64(JOBS_PER_THREAD)), _i64(1))
    # A product of one row tile (a matrix-vector product, whose fmas each wait on a load of
    # B) is cut into narrower column blocks, enough for every thread, unless an epilogue
    # needs its jobs to cover whole rows (N <= nc: Matmul.fuses). Where it reads B in place
    # (_job: B's rows or columns contiguous) it takes one block a thread, however wide: each
    # row of B then streams the farthest (1×768×2304 on one thread took 0.150 ms in blocks of
    # nc columns, 0.114 ms in one; on two, 0.095 ms in eight blocks, 0.075 ms in two).
    fusing = b.and_(has_epilogue, b.icmp_signed("<=", N, _i64(t.nc)))
    few = b.and_(b.icmp_signed("<=", M, _i64(t.mr)), b.not_(fusing))
    streams = b.and_(few, b.or_(b.icmp_signed("==", b_row, _i64(1)),
                                b.icmp_signed("==", b_col, _i64(1))))
    n_cols = e.ceil_div(N, t.nc)
    spread = e.min(e.ceil_div(b.select(streams, nthreads, wanted), batch), col_panels)
    spreads = b.or_(streams, b.and_(few, b.icmp_signed(">", spread, n_cols)))
    n_cols = b.select(spreads, spread, n_cols)
    jobs = b.mul(batch, n_cols)
    n_rows = e.min(e.ceil_div(wanted, jobs), e.ceil_div(M, MIN_JOB_ROWS))
    # A product of fewer row blocks than threads (under MIN_JOB_ROWS rows: a 96×96×256 ran
    # as one job, the second thread idle) is cut into column blocks too, of at least
    # MIN_JOB_COLUMNS: each job packs its own columns of B, and all of its rows of A, which
    # are few. Not where an epilogue needs whole rows.
    idle = b.icmp_signed("<", b.mul(jobs, n_rows), nthreads)
    narrower = e.min(e.ceil_div(wanted, b.mul(batch, n_rows)),
                     e.ceil_div(N, MIN_JOB_COLUMNS))
    n_cols = b.select(b.and_(b.and_(idle, b.not_(b.or_(fusing, spreads))),
                             b.icmp_signed(">", narrower, n_cols)), narrower, n_cols)
    jobs = b.mul(batch, n_cols)
    # And so few jobs that the threads cannot share them evenly (256³ in three, 200×512×64 in
    # three: one thread taking two) are cut into a multiple of the threads, however few rows
    # each then takes (a thread's jobs of one column block pack B once: _packed_blocks).
    uneven = b.and_(b.icmp_signed("<", b.mul(jobs, n_rows), wanted),
                    b.icmp_signed("!=", b.srem(b.mul(jobs, n_rows), nthreads), _i64(0)))
    even = e.min(b.mul(e.ceil_div(n_rows, nthreads), nthreads), row_panels)
    n_rows = b.select(uneven, even, n_rows)
    # (those narrower blocks are cut in vectors, not panels: equal shares of the columns)
    unit = b.select(spreads, _i64(t.width), _i64(t.nr))
    cols = b.mul(e.ceil_div(e.ceil_div(N, unit), n_cols), unit)
    jobs = b.mul(jobs, n_rows)
    # a job of whole rows hands them to the epilogue (one predictable branch per job)
    whole_rows = fusing

    # Small jobs are taken `grain` at a time, so that a take is worth MIN_TAKE_FMAS: each
    # take is an atomic add on a line the threads share, which moves between their cores
    # (300 products of 8×16×8, a job each, took 27-33 µs on two threads, 18-19 taken so).
    # A take is at most jobs / wanted, JOBS_PER_THREAD takes a thread, lest the last leave a
    # thread idle (attention's 64 heads of 64×64×32 taken 8 at a time were 2-5% slower).
    job_fmas = b.add(b.mul(b.mul(e.ceil_div(M, n_rows), e.min(cols, N)), K), _i64(1))  # (K ≥ 0)
    grain = e.max(e.min(e.ceil_div(jobs, wanted), b.sdiv(_i64(MIN_TAKE_FMAS), job_fmas)), 1)
    head, body, done = (fn.append_basic_block(f"job.{s}") for s in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    taken = b.atomic_rmw("add", next_job, grain, "monotonic", name="taken")
    b.cbranch(b.icmp_signed("<", taken, jobs), body, done)
    b.position_at_end(body)
    with e.loop(taken, e.min(b.add(taken, grain), jobs), name="job") as job:
        jn = b.srem(job, n_cols)
        jm = b.srem(b.sdiv(job, n_cols), n_rows)
        bi = b.sdiv(job, b.mul(n_cols, n_rows))
        # the row blocks' panels shared out evenly (no two blocks differ by more than one panel):
        # cut into blocks of the most panels a block takes, a 1024-row product's eight jobs left
        # the last one 17 panels against 22, and its thread idle for the difference
        first_panel = lambda j: b.sdiv(b.mul(j, row_panels), n_rows)
        i0, j0 = b.mul(first_panel(jm), _i64(t.mr)), b.mul(jn, cols)
        i1 = e.min(b.mul(first_panel(b.add(jm, _i64(1))), _i64(t.mr)), M)
        mj, nj = b.sub(i1, i0), e.min(cols, b.sub(N, j0))
        a_base = e.at(A, b.mul(bi, sa), b.mul(i0, a_row))
        b_base = e.at(B, b.mul(bi, sb), b.mul(j0, b_col))
        c_base = e.at(C, b.mul(bi, sc), b.mul(i0, N), j0)
        live = b.and_(b.icmp_signed(">", mj, _i64(0)), b.icmp_signed(">", nj, _i64(0)))
        with b.if_then(live):
            first_row = b.add(b.mul(bi, M), i0)

            def finished(i, m) -> None:
                """Rows [i, i + m) of the job are final: the epilogue's, where it has them."""
                with b.if_then(whole_rows, likely=False):
                    lo = b.add(first_row, i)
                    b.call(epilogue, [epilogue_table, lo, b.add(lo, m), _i64(0)])   # (no reduction)

            _job(e, (tiles_by_width, columns_by_width, in_place_by_width),
                 (a_base, a_row, a_col),
                 (b_base, b_row, b_col), c_base, mj, nj, K, N, a_pack, b_pack, finished)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    task = _build_task(module, f"{name}.task", fn)
    _build_direct(module, f"{name}.direct", dtype, t, task)


def _build_task(module: ir.Module, name: str, kernel: ir.Function) -> ir.Function:
    """void task(int64_t *arguments, int64_t thread_index, int64_t thread_count): the kernel
    with its first ARGUMENTS arguments read from an array, as the thread team calls tasks."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I64, I64]),
                     name)
    words, tid, count = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    words = b.bitcast(words, I64.as_pointer())
    args = [b.load(b.gep(words, [_i64(i)])) for i in range(ARGUMENTS)]
    args = [b.inttoptr(v, a.type) if isinstance(a.type, ir.PointerType) else v
            for v, a in zip(args, kernel.args)]
    b.call(kernel, args + [tid, count])
    b.ret_void()
    return fn


# NumPy's array object (PyArrayObject_fields in numpy/ndarraytypes.h) on a 64-bit CPython:
# the byte offsets of the fields NAME.direct reads, checked once at import (numpy_layout_holds)
OB_TYPE, DATA, NDIM, DIMENSIONS, STRIDES, DESCR, FLAGS = 8, 16, 24, 32, 40, 56, 64
C_CONTIGUOUS, ALIGNED, WRITEABLE = 0x1, 0x100, 0x400      # NPY_ARRAY_… flags
# NAME.direct's context: the words it compares objects with, the block of a product it runs
# alone, the block it takes for its caller to run on the team, and that block's taken word
CONTEXT_TYPE, CONTEXT_DESCR, CONTEXT_ALONE, CONTEXT_BLOCK, CONTEXT_TAKEN = range(5)
TAKEN = 2           # NAME.direct's answer where another call holds its context's block


def _build_direct(module: ir.Module, name: str, dtype: str, t: Tiles, task: ir.Function
                  ) -> None:
    """i64 direct(PyObject *a, PyObject *b, PyObject *c, i64 *context, i64 threads): the
    whole call of c = a @ b from Python for NumPy arrays of rank 2 and the kernel's dtype
    (c C-contiguous and writable), read from the array objects themselves. Returns 0 (nothing
    done) for any other operands; 1 where the product is worth one thread (Matmul.worth, under
    2·MIN_MULTIPLY_ADDS_PER_THREAD fmas): it is done, in the context's block for one thread;
    else -n where it takes the context's other block (its taken word from 0 to 1): its
    arguments are there, for the caller to run NAME.task on n threads (the threads it is
    worth, at most `threads`) and free the block; or TAKEN (nothing done) where another call
    holds that block."""
    i8p = ir.IntType(8).as_pointer()
    fn = ir.Function(module, ir.FunctionType(I64, [i8p, i8p, i8p, I64.as_pointer(), I64]), name)
    a, b_, c, context, threads = fn.args
    e = _Emitter(fn, dtype, t)
    b = e.b

    def field(obj, offset: int, ty: ir.Type = I64) -> ir.Value:
        return b.load(b.bitcast(b.gep(obj, [_i64(offset)]), ty.as_pointer()))

    def unless(ok: ir.Value) -> None:
        with b.if_then(b.not_(ok), likely=False):
            b.ret(_i64(0))

    def all_of(*conditions: ir.Value) -> ir.Value:
        return functools.reduce(b.and_, conditions)

    word = lambda i: b.load(e.at(context, i))
    arrays = (a, b_, c)
    # each field is read only once the ones before it say it is there: an object that is not
    # an array has no NDIM, an array of rank 0 no DIMENSIONS
    unless(all_of(*(b.icmp_signed("==", field(x, OB_TYPE), word(CONTEXT_TYPE)) for x in arrays)))
    flags = [field(x, FLAGS, I32) for x in arrays]
    wanted = [ALIGNED, ALIGNED, ALIGNED | C_CONTIGUOUS | WRITEABLE]
    unless(all_of(*(b.icmp_signed("==", field(x, NDIM, I32), ir.Constant(I32, 2)) for x in arrays),
                  *(b.icmp_signed("==", field(x, DESCR), word(CONTEXT_DESCR)) for x in arrays),
                  *(b.icmp_signed("==", b.and_(f, ir.Constant(I32, w)), ir.Constant(I32, w))
                    for f, w in zip(flags, wanted))))
    dims = [[b.load(e.at(b.inttoptr(field(x, DIMENSIONS), I64.as_pointer()), i)) for i in (0, 1)]
            for x in arrays]
    strides = [[b.load(e.at(b.inttoptr(field(x, STRIDES), I64.as_pointer()), i)) for i in (0, 1)]
               for x in arrays[:2]]
    (m, k), (k_b, n), (m_c, n_c) = dims
    size = SIZE[dtype]
    unless(all_of(b.icmp_signed("==", k, k_b), b.icmp_signed("==", m, m_c),
                  b.icmp_signed("==", n, n_c),
                  *(b.icmp_signed("==", b.and_(s, _i64(size - 1)), _i64(0))
                    for pair in strides for s in pair)))
    # the threads it is worth (Matmul.worth for other operands)
    work = b.mul(b.mul(m, n), k)
    work = b.select(b.icmp_signed("<=", m, _i64(t.mr)),
                    b.sdiv(b.mul(work, _i64(MATRIX_VECTOR_COST)),
                           b.select(b.icmp_signed(">", m, _i64(1)), m, _i64(1))), work)
    worth = b.sdiv(work, _i64(MIN_MULTIPLY_ADDS_PER_THREAD))
    parts = e.max(e.min(threads, worth), 1)
    data = [field(x, DATA) for x in arrays]
    (a_row, a_col), (b_row, b_col) = ([b.sdiv(s, _i64(size)) for s in pair] for pair in strides)

    def fill(at: int) -> ir.Value:
        """The arguments written to the context's block at word `at`: that block."""
        block = b.inttoptr(word(at), I64.as_pointer())
        for i, value in enumerate(data + [_i64(1), m, n, k, _i64(0), _i64(0), b.mul(m, n),
                                          a_row, a_col, b_row, b_col]):
            b.store(value, e.at(block, i))
        for i in (ARGUMENTS - 2, ARGUMENTS - 1, ARGUMENTS):    # no epilogue; next_job from 0
            b.store(_i64(0), e.at(block, i))
        return block

    with b.if_then(b.icmp_signed("<=", worth, _i64(1))):
        b.call(task, [b.bitcast(fill(CONTEXT_ALONE), i8p), _i64(0), _i64(1)])
        b.ret(_i64(1))
    taken = b.inttoptr(word(CONTEXT_TAKEN), I64.as_pointer())
    took = b.extract_value(b.cmpxchg(taken, _i64(0), _i64(1), "acquire", "monotonic"), 1)
    with b.if_then(b.not_(took), likely=False):
        b.ret(_i64(TAKEN))
    fill(CONTEXT_BLOCK)
    b.ret(b.neg(parts))


def _job(e: _Emitter, tiles, a, b_, c_base, mj, nj, K, N, a_pack, b_pack, finished) -> None:
    """C[:mj, :nj] (row stride N) = A[:mj, :K] @ B[:K, :nj], a and b_ being each operand's
    (base, row stride, column stride), with tiles (packed, rows, columns) by width;
    finished(i, m) emits what follows once rows [i, i + m) are final (after the last K block
    of each block of mc rows, which is in L2)."""
    b, t = e.b, e.tiles
    packed_tiles, column_tiles, in_place_tiles = tiles
    with b.if_then(b.icmp_signed("==", K, _i64(0)), likely=False):
        minus_zero = ir.Constant(e.scalar, -0.0)
        with e.loop(0, mj, 1, "zr") as i, e.loop(0, nj, 1, "zc") as j:
            b.store(minus_zero, e.at(c_base, b.mul(i, N), j), align=e.align)
        finished(_i64(0), mj)

    # ORDER: K is cut into blocks of kc taken in increasing order; between blocks each partial
    # sum waits in C (an exact store and load). K is never padded: a padding 0·x would turn an
    # accumulated -0.0 into +0.0, and 0·inf into NaN.
    # B is packed for reuse across row tiles. A job of at most one row tile (a matrix-vector
    # product, a decoder's token, a small batch) reads B in place instead (packing would cost
    # more than the fmas): one row streaming B's rows where they are contiguous, more by the
    # in-place tiles, whose every load of B feeds all their rows (streamed, 6×512×96 took
    # 15.9 µs on a Zen 4, 6×768×2304 274; by tiles 6.8 and 98; NumPy 7.0 and 360); B's
    # columns with the transposing tiles where those are contiguous (x @ W.T, q @ K.T). So
    # does a job whose K block of B is in cache (rows contiguous): its reads of B cost less
    # than a copy of them.
    few = b.icmp_signed("<=", mj, _i64(t.mr))
    by_rows = b.and_(b.icmp_signed("==", mj, _i64(1)), b.icmp_signed("==", b_[2], _i64(1)))
    by_columns = b.and_(few, b.icmp_signed("==", b_[1], _i64(1)))
    with b.if_else(by_rows) as (rows_in_place, other):
        with rows_in_place:
            _row_streamed(e, a, b_, c_base, nj, K, finished)
        with other:
            with b.if_else(by_columns) as (columns_in_place, packed):
                with columns_in_place:
                    _columns_in_place(e, column_tiles, a, b_, c_base, mj, nj, K, N, finished)
                with packed:
                    # (or a job of few rows, whose B rows lie close: packing B costs as much
                    # as those rows' fmas reading it; rows far apart conflict in the caches,
                    # those of a small K block too: attention's v, rows of qkv 6 KiB apart,
                    # took 64 heads' att @ v 288 µs in place on a Zen 3, 255 packed)
                    close = b.icmp_signed("<=", b_[1], _i64(t.in_place_row_bytes // e.align))
                    small = b.icmp_signed("<=", b.mul(e.min(K, t.kc), nj),
                                          _i64(t.in_place_bytes // e.align))
                    few_close = b.and_(b.icmp_signed("<=", mj, _i64(t.in_place_rows)), close)
                    in_cache = b.and_(b.icmp_signed("==", b_[2], _i64(1)),
                                      b.or_(b.or_(b.and_(small, close), few_close), few))
                    with b.if_else(in_cache) as (in_place, pack):
                        with in_place:
                            _blocks_in_place(e, in_place_tiles, a, b_, c_base, mj, nj, K, N,
                                             finished)
                        with pack:
                            _packed_blocks(e, packed_tiles, a, b_, c_base, mj, nj, K, N,
                                           a_pack, b_pack, finished)


def _columns_in_place(e: _Emitter, column_tiles, a, b_, c_base, mj, nj, K, N, finished) -> None:
    """_job's elements by the transposing tiles, all mj rows at once (those of one row where
    it has one), with A and B (whose column stride is 1) read in place, the whole K in
    registers; column_tiles are the tiles (by width) of one row and of mr rows."""
    b, t = e.b, e.tiles
    (a_base, a_row, a_col), (b_base, _, b_col) = a, b_
    wide = COLUMN_VECTORS * t.width
    one_row, all_rows = column_tiles
    with b.if_then(b.icmp_signed(">", K, _i64(0))):
        with e.loop(0, nj, wide, "jt") as jr:
            n = e.min(wide, b.sub(nj, jr))
            arguments = [a_base, a_row, a_col, e.at(b_base, b.mul(jr, b_col)), b_col, K,
                         e.at(c_base, jr), N, ir.Constant(I1, 1), mj, n]
            with b.if_else(b.icmp_signed("==", mj, _i64(1))) as (row, rows):
                with row:
                    _call_narrowest(e, one_row, n, arguments)
                with rows:
                    _call_narrowest(e, all_rows, n, arguments)
        finished(_i64(0), mj)


def _row_streamed(e: _Emitter, a, b_, c_base, nj, K, finished) -> None:
    """_job's one row of C with B (b_col 1) read in place, STREAM_ROWS rows of it at a time
    across all nj columns: B passes once, in the order of its rows, as prefetchers follow, and
    C is loaded and stored once a sweep (STREAM_ROWS fmas). Only the row's last vector goes
    through a mask (with every load and store of C masked the loop ran 2.5 times slower)."""
    b, t = e.b, e.tiles
    (a_base, _, a_col), (b_base, b_row, _) = a, b_
    fma = e.intrinsic(f"llvm.fma.{overload_suffix(e.vec)}", e.vec, [e.vec] * 3)
    zero = ir.Constant(e.vec, [-0.0] * t.width)

    def sweep(k0, rows: int) -> None:
        """C[0, :nj] gains A[0, k]·B[k, :nj] for k = k0, …, k0 + rows - 1."""
        ks = [b.add(k0, _i64(u)) for u in range(rows)]
        a_k = [e.splat(b.load(e.at(a_base, b.mul(k, a_col)), align=e.align)) for k in ks]
        b_k = [e.at(b_base, b.mul(k, b_row)) for k in ks]
        first = b.icmp_signed("==", k0, _i64(0))

        def vector(j, mask=None) -> None:
            load = e.load_vec if mask is None else (lambda at: e.masked_load(at, mask))
            c_at = e.at(c_base, j)
            # ORDER: from -0.0 at k = 0, else from the sum up to k0 as it was stored; then
            # the k of this sweep in increasing order
            acc = b.select(first, zero, load(c_at))
            for u in range(rows):
                acc = b.call(fma, [a_k[u], load(e.at(b_k[u], j)), acc])
            if mask is None:
                e.store_vec(acc, c_at)
            else:
                e.masked_store(acc, c_at, mask)

        # the columns before the first row's first vector-aligned one through a mask: the
        # loop's loads of B are then whole vectors, none across two cache lines (rows of a
        # length in vectors are all so; 1×768×2304 on one thread 0.115 -> 0.106 ms)
        misaligned = b.ptrtoint(b_k[0], I64)
        head = e.min(nj, b.and_(b.sdiv(b.neg(misaligned), _i64(e.align)), _i64(t.width - 1)))
        with b.if_then(b.icmp_signed(">", head, _i64(0))):
            vector(_i64(0), e.lanes_below(head, 0))
        full = b.sub(nj, b.srem(b.sub(nj, head), _i64(t.width)))
        with e.loop(head, full, t.width, "sj") as j:
            vector(j)
        with b.if_then(b.icmp_signed("<", full, nj)):
            vector(full, e.lanes_below(b.sub(nj, full), 0))

    whole = b.sub(K, b.srem(K, _i64(STREAM_ROWS)))
    with e.loop(0, whole, STREAM_ROWS, "sk") as k0:
        sweep(k0, STREAM_ROWS)
    with e.loop(whole, K, 1, "st") as k0:                  # K's last rows
        sweep(k0, 1)
    with b.if_then(b.icmp_signed(">", K, _i64(0))):
        finished(_i64(0), _i64(1))


def _blocks_in_place(e: _Emitter, in_place_tiles, a, b_, c_base, mj, nj, K, N,
                     finished) -> None:
    """_job's elements by register tiles of mr rows that read A and B (whose rows are
    contiguous) where they lie: a product that fits in cache gains nothing from packing."""
    b, t = e.b, e.tiles
    (a_base, a_row, a_col), (b_base, b_row, _) = a, b_
    # ORDER: as in _packed_blocks, the K blocks in increasing order, each once per element; the
    # blocks of mc rows, one after another, hand their rows to the epilogue while in L2
    with e.loop(0, mj, t.mc, "iic") as ic:
        mb = e.min(t.mc, b.sub(mj, ic))
        with e.loop(0, K, t.kc, "ipc") as pc:
            kc = e.min(t.kc, b.sub(K, pc))
            first = b.icmp_signed("==", pc, _i64(0))
            with e.loop(0, nj, t.nr, "ijr") as jr, e.loop(ic, b.add(ic, mb), t.mr, "iir") as ir_:
                n = e.min(t.nr, b.sub(nj, jr))
                _call_narrowest(e, in_place_tiles, n,
                                [e.at(a_base, b.mul(ir_, a_row), b.mul(pc, a_col)), a_row, a_col,
                                 e.at(b_base, b.mul(pc, b_row), jr), b_row, kc,
                                 e.at(c_base, b.mul(ir_, N), jr), N, first,
                                 e.min(t.mr, b.sub(mj, ir_)), n])
        with b.if_then(b.icmp_signed(">", K, _i64(0))):
            finished(ic, mb)


def _packed_blocks(e: _Emitter, tiles_by_width, a, b_, c_base, mj, nj, K, N, a_pack, b_pack,
                   finished) -> None:
    """_job's elements by blocks of packed panels: B's per K block, A's per block of mc rows
    (where the job has more than one column tile)."""
    b, t = e.b, e.tiles
    (a_base, a_row, a_col), (b_base, b_row, b_col) = a, b_
    with e.loop(0, K, t.kc, "pc") as pc:
        kc = e.min(t.kc, b.sub(K, pc))
        first = b.icmp_signed("==", pc, _i64(0))
        # a thread's jobs of one column block and K block (all of a product whose K is at
        # most kc) pack its panel once: GPT's 1024×512×128 on 2 threads packed it 8 times
        # (its shape too says which: a B of stride 0 has one address for every block)
        key = (b.ptrtoint(e.at(b_base, b.mul(pc, b_row)), I64), b.or_(b.shl(kc, _i64(32)), nj))
        held = b.and_(*(b.icmp_unsigned("==", b.load(slot), k) for slot, k in zip(e.packed, key)))
        with b.if_then(b.not_(held)):
            _pack_b(e, e.at(b_base, b.mul(pc, b_row)), b_row, b_col, kc, nj, b_pack)
            for slot, k in zip(e.packed, key):
                b.store(k, slot)
        # ORDER: the row blocks, and the tiles within them, partition the job's elements; each
        # runs this K block once, so the order in which they are visited does not matter.
        with e.loop(0, mj, t.mc, "ic") as ic:
            mb = e.min(t.mc, b.sub(mj, ic))
            c_block = e.at(c_base, b.mul(ic, N))
            a_block = e.at(a_base, b.mul(ic, a_row), b.mul(pc, a_col))
            # A is packed for reuse across column tiles; a job of one column tile reads it
            # in place (packing would cost as much as its fmas where K and N are small), and
            # so does a job of few whose A rows are contiguous (each row a stream the tiles'
            # broadcasts follow: on 2 threads 1024×512×128 0.767 -> 0.729 ms, 512×1024×128
            # 0.826 -> 0.799, 1024×1024×256 the same; with a transposed A 13% slower, and
            # 1-2% at 1024³, whose jobs have 512 columns)
            once = b.or_(b.icmp_signed("<=", nj, _i64(t.nr)),
                         b.and_(b.icmp_signed("==", a_col, _i64(1)),
                                b.icmp_signed("<=", nj, _i64(t.in_place_a_columns))))
            with b.if_then(b.not_(once)):
                _pack_a(e, a_block, a_row, a_col, kc, mb, a_pack)
            with e.loop(0, nj, t.nr, "jr") as jr:
                n_edge = e.min(t.nr, b.sub(nj, jr))
                with e.loop(0, mb, t.mr, "ir") as ir_:
                    _prefetch_next(e, c_block, N, ir_, jr, mb, nj)
                    m_edge = e.min(t.mr, b.sub(mb, ir_))
                    a_tile = b.select(once, e.at(a_block, b.mul(ir_, a_row)),
                                      e.at(a_pack, b.mul(ir_, kc)))
                    a_strides = [b.select(once, a_row, _i64(1)), b.select(once, a_col, _i64(t.mr))]
                    b_tile = e.at(b_pack, b.mul(jr, kc))
                    c_tile = e.at(c_block, b.mul(ir_, N), jr)
                    _call_narrowest(e, tiles_by_width, n_edge,
                                    [a_tile, *a_strides, b_tile, _i64(t.nr), kc, c_tile, N,
                                     first, m_edge, n_edge])
            with b.if_then(b.icmp_signed(">=", b.add(pc, kc), K)):
                finished(ic, mb)


def _call_narrowest(e: _Emitter, tiles_by_width, n, args) -> None:
    """Call the narrowest tile function whose vectors cover n columns: a column edge spends
    no whole tile on a few columns."""
    b = e.b
    done = e.fn.append_basic_block("tile.done")
    cases = [e.fn.append_basic_block(f"tile{nv}") for nv in range(1, len(tiles_by_width) + 1)]
    switch = b.switch(e.ceil_div(n, e.tiles.width), cases[-1])
    for nv, (case, tile) in enumerate(zip(cases, tiles_by_width), start=1):
        switch.add_case(_i64(nv), case)
        b.position_at_end(case)
        b.call(tile, args)
        b.branch(done)
    b.position_at_end(done)


def _prefetch_next(e: _Emitter, c_block, ldc, ir_, jr, mb, nj) -> None:
    """Prefetch (for writing) the C tile after (ir_, jr), which is loaded when the tile at
    (ir_, jr) has run its K block: rows ir_ + mr… or, past the block, column jr + nr."""
    b, t = e.b, e.tiles
    below = b.add(ir_, _i64(t.mr))
    wrap = b.icmp_signed(">=", below, mb)
    i = b.select(wrap, _i64(0), below)
    j = e.min(b.select(wrap, b.add(jr, _i64(t.nr)), jr), b.sub(nj, _i64(1)))
    last = e.min(b.add(j, _i64(t.nr - 1)), b.sub(nj, _i64(1)))
    prefetch = e.intrinsic("llvm.prefetch.p0", ir.VoidType(),
                           [ir.PointerType(), I32, I32, I32])
    line = 64 // e.align
    for r in range(t.mr):
        row = e.at(c_block, b.mul(e.min(b.add(i, _i64(r)), b.sub(mb, _i64(1))), ldc))
        for col in [b.add(j, _i64(c)) for c in range(0, t.nr, line)] + [last]:
            b.call(prefetch, [b.bitcast(e.at(row, e.min(col, last)), ir.PointerType()),
                              ir.Constant(I32, 1), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _pack_b(e: _Emitter, src, ld, col, kc, nj, dst) -> None:
    """dst[q][k][c] = src[k·ld + (q·nr + c)·col] (0 past column nj): panels of nr columns.
    Rows of vectors where col is 1; width × width blocks transposed in registers where ld is 1
    (a transposed B); otherwise element by element."""
    b, t = e.b, e.tiles
    with b.if_else(b.icmp_signed("==", col, _i64(1))) as (rows, other):
        with rows:
            # whole panels load plainly, the last one through masks (masked loads are
            # microcoded on AMD's Zen: 512×1024×128, which packs a panel a K block, 1-2% slower)
            whole = b.sub(nj, b.srem(nj, _i64(t.nr)))
            with e.loop(0, kc, 1, "pbk") as k:
                row, out = e.at(src, b.mul(k, ld)), e.at(dst, b.mul(k, _i64(t.nr)))

                def panel(j, load) -> None:
                    for v in range(t.nv):
                        e.store_vec(load(e.at(row, j, v * t.width), v),
                                    e.at(out, b.mul(j, kc), v * t.width))

                with e.loop(0, whole, t.nr, "pbj") as j:
                    panel(j, lambda at, v: e.load_vec(at))
                with b.if_then(b.icmp_signed("<", whole, nj)):
                    panel(whole, lambda at, v: e.masked_load(at, e.lanes_below(b.sub(nj, whole), v)))
        with other:
            with b.if_else(b.icmp_signed("==", ld, _i64(1))) as (transposed, general):
                with transposed:
                    _pack_b_transposed(e, src, col, kc, nj, dst)
                with general:
                    _pack_b_elements(e, src, ld, col, kc, nj, dst)


def _pack_b_transposed(e: _Emitter, src, col, kc, nj, dst) -> None:
    """_pack_b where ld is 1: each column's run of `width` k is one vector load; a block of
    width columns is transposed by shuffles into width panel rows. A block inside B and the
    K block loads and stores plainly; one at an edge goes through masks (masked loads and
    stores are microcoded on AMD's Zen: through masks everywhere, a 64×32×64 product with a
    transposed B took 40% longer), and a last panel's vectors wholly past nj are not written
    (no tile reads them)."""
    b, t = e.b, e.tiles
    w = t.width
    none = _zeros(ir.VectorType(I1, w))
    with e.loop(0, e.ceil_div(nj, t.nr), 1, "ptq") as q, e.loop(0, kc, w, "ptk") as k0:
        ks = e.lanes_below(b.sub(kc, k0), 0)
        panel = e.at(dst, b.mul(q, b.mul(kc, _i64(t.nr))), b.mul(k0, _i64(t.nr)))
        j0 = b.mul(q, _i64(t.nr))
        with e.loop(0, e.min(t.nv, e.ceil_div(b.sub(nj, j0), w)), 1, "ptv") as v:
            first = b.add(j0, b.mul(v, _i64(w)))
            whole = b.and_(b.icmp_signed("<=", b.add(first, _i64(w)), nj),
                           b.icmp_signed("<=", b.add(k0, _i64(w)), kc))
            with b.if_else(whole) as (plain, edge):
                with plain:
                    columns = [e.load_vec(e.at(src, b.mul(b.add(first, _i64(c)), col), k0))
                               for c in range(w)]
                    for k, row in enumerate(_transpose(e, columns)):
                        e.store_vec(row, e.at(panel, k * t.nr, b.mul(v, _i64(w))))
                with edge:
                    columns = []
                    for c in range(w):
                        j = b.add(first, _i64(c))
                        inside = b.icmp_signed("<", j, nj)
                        at = e.at(src, b.mul(b.select(inside, j, _i64(0)), col), k0)
                        columns.append(e.masked_load(at, b.select(inside, ks, none)))
                    for k, row in enumerate(_transpose(e, columns)):
                        e.masked_store(row, e.at(panel, k * t.nr, b.mul(v, _i64(w))),
                                       b.select(b.icmp_signed("<", _i64(k), b.sub(kc, k0)),
                                                e.splat(ir.Constant(I1, 1), none.type), none))


def _transpose(e: _Emitter, rows: list) -> list:
    """The transpose of a square block of vectors: at each level d = w/2, …, 1 the d × d
    blocks off the diagonal of every 2d × 2d block swap, two shuffles per pair of rows."""
    w, d = len(rows), len(rows) // 2
    while d:
        rows = list(rows)
        for r in (r for r in range(w) if not r & d):
            low, high = rows[r], rows[r + d]
            pick = lambda flip: ir.Constant(ir.VectorType(I32, w), [
                (c + d if flip else c) if not c & d else w + (c if flip else c - d)
                for c in range(w)])
            rows[r] = e.b.shuffle_vector(low, high, pick(False))
            rows[r + d] = e.b.shuffle_vector(low, high, pick(True))
        d //= 2
    return rows


def _pack_b_elements(e: _Emitter, src, ld, col, kc, nj, dst) -> None:
    """_pack_b for any strides, in blocks of PACK_ROWS rows: each column's run of them is
    read in order, and the panel rows they fill stay in L1 while the nr columns are copied."""
    b, t = e.b, e.tiles
    zero = ir.Constant(e.scalar, 0.0)
    with e.loop(0, e.ceil_div(nj, t.nr), 1, "pbq") as q, e.loop(0, kc, PACK_ROWS, "pbb") as k0:
        panel = e.at(dst, b.mul(q, b.mul(kc, _i64(t.nr))), b.mul(k0, _i64(t.nr)))
        rows = e.min(PACK_ROWS, b.sub(kc, k0))
        with e.loop(0, t.nr, 1, "pbc") as c:
            j = b.add(b.mul(q, _i64(t.nr)), c)
            inside = b.icmp_signed("<", j, nj)
            column = e.at(src, b.mul(b.select(inside, j, _i64(0)), col), b.mul(k0, ld))
            with e.loop(0, rows, 1, "pbr") as k:
                value = b.load(e.at(column, b.mul(k, ld)), align=e.align)
                b.store(b.select(inside, value, zero), e.at(panel, b.mul(k, _i64(t.nr)), c),
                        align=e.align)


def _pack_a(e: _Emitter, src, ld, col, kc, mb, dst) -> None:
    """dst[p][k][r] = src[(p·mr + r)·ld + k·col] (0 past row mb): panels of mr rows. A whole
    panel copies one k of its mr rows at a time: as a few vectors where they lie side by side
    (a transposed A, ld 1: a weight's gradient Xᵀ @ dY; mr = 6 as 4 + 2), else element by
    element (vectorised, LLVM would scatter)."""
    b, t = e.b, e.tiles
    zero = ir.Constant(e.scalar, 0.0)
    pieces = _powers_of_two(t.mr)
    with e.loop(0, mb, t.mr, "pap") as i:
        panel = e.at(dst, b.mul(i, kc))
        with b.if_else(b.icmp_signed("<=", b.add(i, _i64(t.mr)), mb)) as (whole, part):
            with whole, b.if_else(b.icmp_signed("==", ld, _i64(1))) as (side_by_side, apart):
                with side_by_side:
                    with e.loop(0, kc, 1, "pav") as k:
                        for r, n in pieces:
                            lanes = ir.VectorType(e.scalar, n).as_pointer()
                            rows = b.load(b.bitcast(e.at(src, b.add(i, _i64(r)), b.mul(k, col)),
                                                    lanes), align=e.align)
                            b.store(rows, b.bitcast(e.at(panel, b.mul(k, _i64(t.mr)), r), lanes),
                                    align=e.align)
                with apart:
                    rows = [e.at(src, b.mul(b.add(i, _i64(r)), ld)) for r in range(t.mr)]
                    with e.loop(0, kc, 1, "pak") as k:
                        out = e.at(panel, b.mul(k, _i64(t.mr)))
                        at = b.mul(k, col)
                        for r, row in enumerate(rows):
                            b.store(b.load(e.at(row, at), align=e.align), e.at(out, r),
                                    align=e.align)
            with part:
                with e.loop(0, kc, 1, "pae") as k:
                    out = e.at(panel, b.mul(k, _i64(t.mr)))
                    for r in range(t.mr):
                        row = b.add(i, _i64(r))
                        inside = b.icmp_signed("<", row, mb)
                        safe = b.select(inside, row, _i64(0))
                        value = b.load(e.at(src, b.mul(safe, ld), b.mul(k, col)), align=e.align)
                        b.store(b.select(inside, value, zero), e.at(out, r), align=e.align)


def _powers_of_two(n: int) -> list[tuple[int, int]]:
    """[0, n) as runs of powers of two, the longest first: (start, length); 6 is (0, 4), (4, 2)."""
    runs, start = [], 0
    for bit in reversed(range(n.bit_length())):
        if n >> bit & 1:
            runs.append((start, 1 << bit))
            start += 1 << bit
    return runs


# ---------------------------------------------------------------------------------------------
# JIT for the host


@dataclass(frozen=True)
class _Layout:
    """What a call passes the kernel for operands of given shapes, strides and dtypes besides
    their addresses: the words batch … b_col, C's shape [batch, M, N] and the result's."""
    words: tuple[int, ...]
    c_shape: tuple[int, ...]
    shape: tuple[int, ...]


class _Block:
    """NAME.task's array of arguments (its next_job in a line of its own after them), scratch
    for `threads` threads, and the word by which NAME.direct takes the block for its caller
    (who frees it once the task has run)."""

    def __init__(self, dtype: str, tiles: Tiles, threads: int = 0):
        self.dtype, self.tiles = dtype, tiles
        self.words = np.zeros(ARGUMENTS + 8, dtype=np.int64)
        self.words[ARGUMENTS - 3] = address(self.words[ARGUMENTS:])
        self.address = address(self.words)
        self.taken = np.zeros(1, dtype=np.int64)
        self.threads = 0
        self.reserve(threads)

    def reserve(self, threads: int) -> None:
        """Scratch for `threads` threads (kept: a fresh buffer costs page faults each call)."""
        if threads > self.threads:
            self.scratch = np.empty(self.tiles.scratch_size(threads), NUMPY[self.dtype])
            self.words[ARGUMENTS - 4] = aligned(self.scratch)
            self.threads = threads


def object_code(dtype: str, part: int, tiles: Tiles | None = None) -> bytes:
    """One of the PARTS of the kernel's object code (from the compile cache where it is there)."""
    tiles = tiles or host_tiles(dtype)
    return cpu.object_code(_key(dtype, part, tiles), lambda: llvm_ir(dtype, part, tiles),
                           PASSES_LEVEL, CODE_LEVEL)


def cached(dtype: str, part: int) -> bool:
    """Whether the compile cache holds that part of the host's kernel for dtype."""
    return cache.load(cpu.jit_key(_key(dtype, part, host_tiles(dtype)), PASSES_LEVEL,
                                  CODE_LEVEL)) is not None


def _key(dtype: str, part: int, tiles: Tiles) -> tuple[str, ...]:
    """What names a part's object code (with backend/cpu.py's jit_key)."""
    return ("matmul", dtype, repr(tiles), f"part {part} of {PARTS}")


def llvm_ir(dtype: str, part: int, tiles: Tiles) -> str:
    """A part's LLVM IR."""
    module = ir.Module(name=f"matmul_{dtype}_{part}")
    module.triple = llvm.get_process_triple()
    module.data_layout = str(cpu.target_machine().target_data)
    build_matmul(module, "matmul", dtype, tiles, part)
    return str(module)


class Matmul:
    """A JIT-compiled kernel and a NumPy front: `kernel(a, b, threads=2)`."""

    def __init__(self, dtype: str, tiles: Tiles | None = None):
        self.dtype, self.tiles = dtype, tiles or host_tiles(dtype)
        self.engine = cpu.link([object_code(dtype, part, self.tiles) for part in range(PARTS)],
                               CODE_LEVEL)
        self.fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 11,
                                   *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 2)(
            self.engine.get_function_address("matmul"))
        self.task = self.engine.get_function_address("matmul.task")
        self._task = Task(self.task)
        self._layouts: dict[tuple, _Layout] = {}
        self._direct = DIRECT(self.engine.get_function_address("matmul.direct"))
        # NAME.direct's product on one thread uses a block of its own: it runs holding the GIL
        # (DIRECT), so no other call can be using it. A longer product runs without the GIL
        # (team().run, on one thread too) in a block NAME.direct takes (its caller frees it);
        # a call that finds it taken, and the checked path, use the locked block, under the lock
        self._alone = _Block(dtype, self.tiles, 1)
        self._shared, self._locked = _Block(dtype, self.tiles), _Block(dtype, self.tiles)
        self._lock = threading.Lock()
        self._shared_context, self._locked_context = (self._direct_context(block)
                                                      for block in (self._shared, self._locked))

    def _direct_context(self, block: _Block) -> tuple[np.ndarray, int]:
        """NAME.direct's context taking `block` for longer products, and its address."""
        # (where NumPy's array objects are not laid out as NAME.direct reads them, no object
        # has its type word 0: every call takes the checked path)
        context = np.array([id(np.ndarray) if numpy_layout_holds() else 0,
                            id(np.dtype(NUMPY[self.dtype])), self._alone.address, block.address,
                            address(block.taken)], dtype=np.int64)
        return context, address(context)


    def worth(self, rows: int, multiply_adds: int, threads: int, in_step: bool = False) -> int:
        """How many of `threads` a product of C's `rows` rows (of each batch entry) and
        `multiply_adds` fmas is worth, called alone (NAME.direct decides alike) or in a native
        step's segment (`in_step`)."""
        per_thread = IN_STEP_MULTIPLY_ADDS_PER_THREAD if in_step else MIN_MULTIPLY_ADDS_PER_THREAD
        if rows <= self.tiles.mr:                  # B read in place, a load an fma a row
            multiply_adds = multiply_adds * MATRIX_VECTOR_COST // max(rows, 1)
            # (and no sooner in a step: 1×512×192 took 5.1 µs on one thread, 6.4-7.7 on two)
            per_thread = MIN_MULTIPLY_ADDS_PER_THREAD
        return min(threads, max(1, multiply_adds // per_thread))

    def direct(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int) -> bool:
        """out = a @ b on at most `threads` threads where a, b and out are NumPy arrays of rank
        2 and the kernel's dtype, out C-contiguous, by one native call (and the team's, where
        it is worth more than one thread): whether it was (nothing is done for other operands)."""
        parts = self._direct(a, b, out, self._shared_context[1], threads)
        if parts == TAKEN:          # (another Python thread's product is running in it)
            with self._lock:
                parts = self._direct(a, b, out, self._locked_context[1], threads)
                if parts < 0:
                    self._run_taken(self._locked, -parts)
        elif parts < 0:
            self._run_taken(self._shared, -parts)
        return parts != 0

    def _run_taken(self, block: _Block, threads: int) -> None:
        """NAME.task on `threads` threads in the block NAME.direct took, then freed."""
        try:
            block.reserve(threads)
            team().run(self.task, block.address, threads)
        finally:
            block.taken[0] = 0

    def call(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, scratch: np.ndarray,
             next_job: np.ndarray, thread_index: int, thread_count: int,
             epilogue: tuple[int, int] = (0, 0)) -> None:
        """One thread's part of c = a @ b: a [batch|1, M, K] and b [batch|1, K, N] of any
        strides, c [batch, M, N] C-contiguous, all of the kernel's dtype; next_job is an
        int64[1], zero before the first thread starts, shared by the thread_count calls;
        epilogue the addresses of a kernel over C's rows and its table (0, 0 for none)."""
        if not 0 <= thread_index < thread_count or next_job.dtype != np.int64 \
                or scratch.dtype != NUMPY[self.dtype] \
                or scratch.size < self.tiles.scratch_size(thread_count):
            raise ValueError(f"thread {thread_index} of {thread_count}, next_job {next_job}, "
                             f"scratch {scratch.dtype} [{scratch.size}]")
        self.fn(*self.arguments(a, b, c), aligned(scratch), address(next_job), *epilogue,
                thread_index, thread_count)

    def arguments(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple:
        """The kernel's arguments A … b_col, checked."""
        dtype = NUMPY[self.dtype]
        if a.dtype != dtype or b.dtype != dtype or c.dtype != dtype or not c.flags.c_contiguous:
            raise ValueError(f"want {self.dtype} arrays (c C-contiguous), got {a.dtype}, "
                             f"{b.dtype}, {c.dtype}")
        (batch, m, n), (a_batch, a_m, k), (b_batch, b_k, b_n) = c.shape, a.shape, b.shape
        if (a_m, b_k, b_n) != (m, k, n) or a_batch not in (1, batch) or b_batch not in (1, batch):
            raise ValueError(f"arguments do not fit: {a.shape} @ {b.shape} -> {c.shape}")
        size = c.itemsize
        (sa, a_row, a_col), (sb, b_row, b_col) = a.strides, b.strides
        return (address(a), address(b), address(c), batch, m, n, k,
                0 if a_batch == 1 else sa // size, 0 if b_batch == 1 else sb // size, m * n,
                a_row // size, a_col // size, b_row // size, b_col // size)

    def __call__(self, a: np.ndarray, b: np.ndarray, threads: int = 1,
                 out: np.ndarray | None = None, epilogue: tuple[int, int] = (0, 0)) -> np.ndarray:
        """a @ b for operands of rank 2 or more (batch axes broadcast as NumPy does), computed
        by `threads` threads (this one and the team's helpers), into `out` (C-contiguous, of
        the result's shape) when given; `epilogue` (a kernel's address and its table's) runs
        on each job's rows where the jobs cover whole rows (`fuses`)."""
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        # A call like one before reuses its checked sizes and strides: at 64³ the checks
        # cost as much as the product.
        key = (type(a), a.shape, a.strides, a.dtype, type(b), b.shape, b.strides, b.dtype,
               None if out is None else (type(out), out.shape, out.strides, out.dtype))
        layout = self._layouts.get(key)
        if layout is None:
            return self._first_call(key, a, b, threads, out, epilogue)
        c = np.empty(layout.c_shape, dtype=NUMPY[self.dtype]) if out is None else out
        self._run((_data(a), _data(b), _data(c)) + layout.words, threads, epilogue)
        return c.reshape(layout.shape)

    def _first_call(self, key: tuple, a: np.ndarray, b: np.ndarray, threads: int,
                    out: np.ndarray | None, epilogue: tuple[int, int]) -> np.ndarray:
        """__call__ for operands of a layout not seen before: checked, and remembered where
        the kernel reads a and b in place."""
        a3, b3, c, shape = self.operands(a, b, out)
        words = self.arguments(a3, b3, c)
        result_shape = shape + (a.shape[-2], b.shape[-1])
        arrays = all(isinstance(x, np.ndarray) for x in (a, b, c))
        if arrays and _data(a3) == _data(a) and _data(b3) == _data(b):   # read in place
            if len(self._layouts) >= LAYOUTS:
                self._layouts.clear()
            self._layouts[key] = _Layout(words[3:], c.shape, result_shape)
        self._run(words, threads, epilogue)
        return c.reshape(result_shape)

    def operands(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None, copy: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]] | None:
        """a, b and C as the kernel takes them ([batch|1, rows, columns], in place where their
        strides allow), and the batch axes of the result; None where an operand would be
        copied and `copy` is false (one asking whether they are in place: the native step's
        analysis, where the copies were 7 ms of the GPT step's warm load)."""
        dtype = NUMPY[self.dtype]
        a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
        if a.ndim == b.ndim == 2:
            shape, a3, b3 = (), a[None], b[None]
        else:
            shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            # one B for every batch entry: the batch is more rows of A (B is packed once)
            rows = _rows(a) if math.prod(b.shape[:-2]) == 1 < math.prod(shape) else None
            if rows is not None:
                a3, b3 = rows, _batched(b, (), copy)
            else:
                a3, b3 = (x[None] if x.ndim == 2 else _batched(x, shape, copy) for x in (a, b))
            if a3 is None or b3 is None:
                return None
        c_shape = (len(a3) if len(b3) == 1 else len(b3), a3.shape[1], b3.shape[2])
        if out is not None and not (out.flags.c_contiguous and out.dtype == NUMPY[self.dtype]
                                    and out.size == math.prod(c_shape)):
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of {c_shape}")
        c = np.empty(c_shape, dtype=NUMPY[self.dtype]) if out is None else out.reshape(c_shape)
        return a3, b3, c, shape

    def _run(self, words: tuple[int, ...], threads: int, epilogue: tuple[int, int]) -> None:
        """The kernel on `threads` threads with the arguments A … b_col."""
        block = self._locked
        with self._lock:                                   # one scratch buffer, one call
            block.reserve(threads)
            # (struct writes the words in a third of the time NumPy's slice assignment takes)
            struct.pack_into(f"{ARGUMENTS - 4}q", block.words, 0, *words)
            # the epilogue's two words, then next_job's (zero before the first call starts)
            struct.pack_into("3q", block.words, 8 * (ARGUMENTS - 2), *epilogue, 0)
            if threads == 1:                               # (team().run's checks cost 0.3 µs)
                self._task(block.address, 0, 1)
            else:
                team().run(self.task, block.address, threads)

    def fuses(self, n: int) -> bool:
        """Whether the kernel calls the epilogue for a product of n columns (its jobs cover
        whole rows); elsewhere the caller runs it after the product."""
        return n <= self.tiles.nc


def _data(x: np.ndarray) -> int:
    """The address of x's first element, read from the array object: NumPy's `data` field
    follows the object header (ndarray.ctypes.data, the documented route, costs 1 µs; this
    0.2 µs, a fifth of the kernel's time at 8³). Checked once at import."""
    return ctypes.c_void_p.from_address(id(x) + DATA_FIELD).value or 0


DATA_FIELD = object.__basicsize__            # the object header's size: 16 bytes in CPython
_probe = np.zeros((2, 3))[:, 1:]
if _data(_probe) != _probe.ctypes.data:      # (a Python whose ids are not addresses)
    def _data(x: np.ndarray) -> int:
        return x.ctypes.data


# (a PYFUNCTYPE keeps the GIL: 0.1 µs less a call than releasing and taking it again, and the
# calls of one kernel exclude each other; the product it runs itself is worth one thread, under
# 2·MIN_MULTIPLY_ADDS_PER_THREAD fmas or about 5 µs, whatever `threads` is)
DIRECT = ctypes.PYFUNCTYPE(ctypes.c_int64, ctypes.py_object, ctypes.py_object, ctypes.py_object,
                           ctypes.c_void_p, ctypes.c_int64)


@functools.cache
def numpy_layout_holds() -> bool:
    """Whether this NumPy's array objects have the fields NAME.direct reads where it reads
    them (OB_TYPE … FLAGS)."""
    word = lambda x, offset, kind=ctypes.c_int64: kind.from_address(id(x) + offset).value
    for x in (np.zeros((3, 5), np.float32)[:, 1:], np.zeros((2, 7), np.float64)):
        if (word(x, OB_TYPE), word(x, DATA), word(x, NDIM, ctypes.c_int32), word(x, DESCR)) \
                != (id(np.ndarray), x.ctypes.data, 2, id(x.dtype)):
            return False                 # (before following a pointer that may not be one)
        dims, strides = (tuple(ctypes.cast(word(x, at), ctypes.POINTER(ctypes.c_int64))[:2])
                         for at in (DIMENSIONS, STRIDES))
        flags = word(x, FLAGS, ctypes.c_int32)
        if (dims, strides, bool(flags & C_CONTIGUOUS), bool(flags & ALIGNED),
                bool(flags & WRITEABLE)) != (x.shape, x.strides, x.flags.c_contiguous,
                                             x.flags.aligned, x.flags.writeable):
            return False
    return True


def aligned(scratch: np.ndarray) -> int:
    """The address of scratch's first element on a cache line (64 elements are spare)."""
    base = address(scratch)
    return base + (-base % 64)


def _batched(x: np.ndarray, shape: tuple[int, ...], copy: bool = True) -> np.ndarray | None:
    """x as [batch|1, rows, columns] for the batch axes `shape`, read in place where its batch
    axes step through memory as one (a transposed or sliced matrix is); a copy otherwise (None
    where `copy` is false and x is not empty)."""
    if math.prod(x.shape[:-2]) == 1:
        return x.reshape((1,) + x.shape[-2:])
    if x.shape[:-2] != shape:
        x = np.broadcast_to(x, shape + x.shape[-2:])
    axes = [(n, s) for n, s in zip(x.shape[:-2], x.strides[:-2]) if n != 1]
    if any(s != n * t for (_, s), (n, t) in zip(axes, axes[1:])):
        if not copy and x.size:
            return None
        x = np.ascontiguousarray(x)
    # a view (NumPy reshapes in place where it can; as_strided would cost ~10 us a call)
    return x.reshape((math.prod(shape),) + x.shape[-2:])


def _rows(x: np.ndarray) -> np.ndarray | None:
    """x [..., rows, columns] as [1, all rows, columns] in place, or None where its rows do not
    step through memory as one axis."""
    axes = [(n, s) for n, s in zip(x.shape[:-1], x.strides[:-1]) if n != 1]
    if any(s != n * t for (_, s), (n, t) in zip(axes, axes[1:])):
        return None
    return x.reshape((1, math.prod(x.shape[:-1]), x.shape[-1]))       # a view, as checked
