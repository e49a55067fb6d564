"""The tensor-core contraction kernel of fast numerics: C[b] = A[b] @ B[b] through the PTX
`mma.sync.aligned` instructions (sm_80 and newer), products summed in f32 in the order the
hardware chooses (docs/numerics.md, "Fast numerics", gives the error bound).

- bf16 and f16 inputs: `mma.m16n8k16.row.col.f32.{bf16,f16}`, the result rounded once from the
  f32 sum to the inputs' dtype; f32 inputs: each rounded to TF32 (`cvt.rna.tf32.f32`), then
  `mma.m16n8k8.row.col.f32.tf32`, the f32 sum the result.
- A block of four warps computes a 64 × 64 tile of C, each warp a 32 × 32 quarter of it as 2 × 4
  mma tiles of 16 × 8, its 32 f32 accumulators in registers. K advances 16 at a time through
  shared memory: A's 64 × 16 tile row-major, B's 16 × 64 tile stored transposed (column n's 16
  k-values together), so that each register of a fragment is two neighbours of one row of a
  shared tile. Elements outside the matrices are 0 (they add nothing).
- The fragments are the PTX ISA's layouts (lane = 4·group + t): for m16n8k16, A's registers
  hold (row, k) = (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8) and the next k of each,
  B's (k, col) = (2t, g), (2t + 8, g) and the next k, C's (g, 2t), (g, 2t + 1), (g + 8, 2t),
  (g + 8, 2t + 1); for m16n8k8 A's are (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4), B's
  (t, g), (t + 4, g). tests/gpu/emulator.py implements the instruction from the same tables,
  and tests/gpu/test_tensorcore.py checks the kernel bit for bit on integer inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from backend.llvm import I32, I64
from backend.nvptx import GPU, MAX_GRID_YZ, MatmulLaunch, Target, _Builder, _entry, assemble, kernel_module

I16 = ir.IntType(16)
F32 = ir.FloatType()
RESULT = ir.LiteralStructType([F32] * 4)
BM = BN = 64                       # a block's tile of C
BK = 16                            # K per shared-memory tile
WM = WN = 32                       # a warp's quarter of it
THREADS = 128
PAD = 2                            # shared rows of BK + PAD elements: fewer bank conflicts


@dataclass(frozen=True)
class Mma:
    """One mma.sync shape for an input dtype: the intrinsic, k per instruction, and how its
    registers hold the inputs."""
    intrinsic: str
    k: int
    register: ir.Type              # of A's four and B's two registers
    stored: ir.Type                # an input element in memory

    @property
    def pairs(self) -> bool:
        """Whether a register holds two 16-bit elements (else one TF32)."""
        return self.k == 16


MMAS = {"bf16": Mma("llvm.nvvm.mma.m16n8k16.row.col.bf16", 16, I32, I16),
        "f16": Mma("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", 16, ir.VectorType(ir.HalfType(), 2),
                   ir.HalfType()),
        "f32": Mma("llvm.nvvm.mma.m16n8k8.row.col.tf32", 8, I32, F32)}
DTYPES = tuple(MMAS)


def entry(dtype: str) -> str:
    return f"dslc_mma_{dtype}"


def shared_bytes(dtype: str) -> int:
    return (BM + BN) * (BK + PAD) * (2 if MMAS[dtype].pairs else 4)


def launch(dtype: str, batch: int, m: int, n: int) -> MatmulLaunch:
    """The tensor-core kernel's launch shape for C [batch, m, n]."""
    rows = -(-m // BM)
    if rows > MAX_GRID_YZ:
        raise ValueError(f"a matrix product of {m} rows is too tall for one launch")
    return MatmulLaunch(entry(dtype), (-(-n // BN), rows, min(batch, MAX_GRID_YZ)), THREADS, shared_bytes(dtype))


def module_ir(dtypes: tuple[str, ...] = DTYPES, target: Target = GPU,
              module: ir.Module | None = None) -> ir.Module:
    """A module of the tensor-core kernels for these input dtypes: `module` with them added
    (a program's kernels: one module to load), else a new one."""
    module, annotations = kernel_module("dslc_mma", target, module)
    for dtype in dtypes:
        _mma_entry(module, dtype, annotations, target)
    return module


def ptx(dtypes: tuple[str, ...] = DTYPES, arch: str = "sm_90") -> str:
    return assemble(str(module_ir(dtypes)), arch)


def _mma_entry(module: ir.Module, dtype: str, annotations, target: Target) -> None:
    """void dslc_mma_T(const T *A, const T *B, T *C, i64 M, i64 N, i64 K, i64 a_stride,
    i64 b_stride, i64 c_stride, i64 batch): the arguments of the exact contraction kernel
    (backend/nvptx.py), bf16 passed as its 16 bits."""
    mma = MMAS[dtype]
    p = mma.stored.as_pointer()
    fn = _entry(module, entry(dtype), [p, p, p] + [I64] * 7, annotations, THREADS)
    A, B, C, M, N, K, sa, sb, sc, batch = fn.args
    g = _Builder(fn, I64, target)
    b, c = g.b, g.c
    row = BK + PAD
    a_tile = g.shared(f"{fn.name}.a", mma.stored, BM * row)        # [m][k]
    b_tile = g.shared(f"{fn.name}.b", mma.stored, BN * row)        # [n][k]
    zero = ir.Constant(mma.stored, 0)
    intrinsic = g.nvvm(mma.intrinsic, RESULT, [mma.register] * 6 + [F32] * 4)
    tiles_m, tiles_n = WM // 16, WN // 8
    acc = g.slot(ir.ArrayType(F32, tiles_m * tiles_n * 4))
    at = lambda array, i: b.gep(array, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True)

    tid = g.sreg("tid.x")
    warp, lane = b.udiv(tid, c(32)), b.urem(tid, c(32))
    group, t = b.udiv(lane, c(4)), b.urem(lane, c(4))
    warp_m, warp_n = b.mul(b.udiv(warp, c(2)), c(WM)), b.mul(b.urem(warp, c(2)), c(WN))

    def element(tile: ir.Value, r: ir.Value, k: ir.Value) -> ir.Value:
        return b.load(g.at(tile, b.add(b.mul(r, c(row)), k)))

    def register(tile: ir.Value, r: ir.Value, k: ir.Value) -> ir.Value:
        """The register of tile row r at k: elements k and k + 1 (low half first), or k alone
        rounded to TF32."""
        if not mma.pairs:
            return b.call(g.nvvm("llvm.nvvm.f2tf32.rna", I32, [F32]), [element(tile, r, k)])
        lo, hi = element(tile, r, k), element(tile, r, b.add(k, c(1)))
        if mma.register is I32:
            return b.or_(b.zext(lo, I32), b.shl(b.zext(hi, I32), ir.Constant(I32, 16)))
        pair = b.insert_element(ir.Constant(mma.register, ir.Undefined), lo, ir.Constant(I32, 0))
        return b.insert_element(pair, hi, ir.Constant(I32, 1))

    def fragments(k0: int) -> None:
        """Every mma tile of this warp gains the products of k0 … k0 + mma.k - 1."""
        step = 8 if mma.pairs else 4                   # the second k of a fragment's rows
        ka = b.add(c(k0), b.mul(t, c(2)) if mma.pairs else t)
        for i in range(tiles_m):
            r = b.add(warp_m, b.add(c(16 * i), group))
            a = [register(a_tile, r, ka), register(a_tile, b.add(r, c(8)), ka)]
            a += [register(a_tile, r, b.add(ka, c(step))), register(a_tile, b.add(r, c(8)), b.add(ka, c(step)))]
            for j in range(tiles_n):
                col = b.add(warp_n, b.add(c(8 * j), group))
                bs = [register(b_tile, col, ka), register(b_tile, col, b.add(ka, c(step)))]
                first = (i * tiles_n + j) * 4
                sums = [b.load(at(acc, first + e)) for e in range(4)]
                d = b.call(intrinsic, a + bs + sums)
                for e in range(4):
                    b.store(b.extract_value(d, e), at(acc, first + e))

    def one_product(z: ir.Value) -> None:
        a_base = b.gep(A, [b.mul(z, sa)], inbounds=True)
        b_base = b.gep(B, [b.mul(z, sb)], inbounds=True)
        c_base = b.gep(C, [b.mul(z, sc)], inbounds=True)
        i0, j0 = b.mul(g.sreg("ctaid.y"), c(BM)), b.mul(g.sreg("ctaid.x"), c(BN))
        for e in range(tiles_m * tiles_n * 4):
            b.store(ir.Constant(F32, 0.0), at(acc, e))

        def stage(k0: ir.Value) -> None:
            """A's and B's tiles at k0 into shared memory, 0 outside the matrices."""
            for q in range(BM * BK // THREADS):
                e = b.add(tid, c(q * THREADS))
                r, kk = b.udiv(e, c(BK)), b.urem(e, c(BK))  # A[i0 + r, k0 + kk] and B[k0 + kk, j0 + r]
                k = b.add(k0, kk)
                for tile, base, inside, offset in (
                        (a_tile, a_base, b.add(i0, r), lambda i: b.add(b.mul(i, K), k)),
                        (b_tile, b_base, b.add(j0, r), lambda j: b.add(b.mul(k, N), j))):
                    bound = M if tile is a_tile else N
                    ok = b.and_(b.icmp_signed("<", inside, bound), b.icmp_signed("<", k, K))
                    where = b.select(ok, offset(inside), c(0))
                    value = b.select(ok, b.load(b.gep(base, [where], inbounds=True)), zero)
                    b.store(value, g.at(tile, b.add(b.mul(r, c(row)), kk)))

        def tile(k0: ir.Value) -> None:
            stage(k0)
            g.barrier()
            for k in range(0, BK, mma.k):
                fragments(k)
            g.barrier()                                # the tiles are free for the next k0

        g.loop(c(0), K, c(BK), tile, "k0")
        for i in range(tiles_m):
            for j in range(tiles_n):
                for e in range(4):                    # C's (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
                    r = b.add(i0, b.add(warp_m, b.add(c(16 * i + 8 * (e // 2)), group)))
                    col = b.add(j0, b.add(warp_n, b.add(c(8 * j + e % 2), b.mul(t, c(2)))))
                    ok = b.and_(b.icmp_signed("<", r, M), b.icmp_signed("<", col, N))
                    with b.if_then(ok):
                        value = _rounded(b, b.load(at(acc, (i * tiles_n + j) * 4 + e)), dtype)
                        b.store(value, b.gep(c_base, [b.add(b.mul(r, N), col)], inbounds=True))

    g.loop(g.sreg("ctaid.z"), batch, g.sreg("nctaid.z"), one_product, "batch")
    b.ret_void()


def _rounded(b: ir.IRBuilder, x: ir.Value, dtype: str) -> ir.Value:
    """The f32 sum in the result's dtype, rounded to nearest even; bf16 by its bits (the same
    integer operations on every target), a NaN as the quiet NaN 0x7fc0."""
    if dtype == "f32":
        return x
    if dtype == "f16":
        return b.fptrunc(x, ir.HalfType())
    bits = b.bitcast(x, I32)
    odd = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    up = b.lshr(b.add(bits, b.add(ir.Constant(I32, 0x7FFF), odd)), ir.Constant(I32, 16))
    nan = b.fcmp_unordered("uno", x, x)
    return b.select(nan, ir.Constant(I16, 0x7FC0), b.trunc(up, I16))
