"""Generated GEMM kernels for small MatMul/Gemm library calls.

A MatMul of a few thousand multiply-adds costs 3-6 us through NumPy or a single-node
onnxruntime session, almost all of it call overhead (measured: [2,64]x[64,128] 4.4 us in
NumPy, 5.9 us in MLAS), while the arithmetic takes a fraction of a microsecond. Below
`MAX_FLOPS` the CPU backend therefore emits its own GEMM in LLVM IR, with the kernel
signature `void f(ptr bufs, i64 start, i64 stop)` over output rows, so it runs natively
beside the loop kernels (and in the same native driver call, see executable.py):

    for each block of RB rows r (never crossing a batch of B):
      for each block of U vectors of VW columns n0:       (masked at the right edge)
        acc[RB][U] = 0
        for k:  b[u] = B[k, n0 + u*VW ...];  acc[j][u] += A[r + j, k] * b[u]
        C[r + j, n0 ...] = alpha * acc[j][u] (+ beta * bias)

Each B vector load feeds RB fused multiply-adds. Larger problems go to MLAS, which packs
and blocks for the caches (~180-210 GFLOP/s per core here).
"""

from __future__ import annotations

import dataclasses
import math

from autoclust.backends.cpu.loops import entry_alloca, for_range
from llvmlite import ir

from autoclust.kernel import ir as kir

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
SCALAR = {"float32": ir.FloatType(), "float64": ir.DoubleType()}
LANES = {"float32": 16, "float64": 8}  # one 512-bit vector
ROWS = 4           # RB: rows sharing each B load
VECTORS = 2        # U: column vectors per block
MAX_FLOPS = 4e6    # below: generated; above: MLAS (measured crossover, see bench_gemm)


@dataclasses.dataclass(frozen=True)
class GemmSpec:
    """C[r, :] = alpha * A[r, :] @ B[batch(r)] + beta * bias, rows r in [0, batch * m)."""

    m: int             # rows per batch
    n: int
    k: int
    batch: int         # batches of rows; B is shared unless b_batched
    b_batched: bool
    bias: str          # "": none, "row": bias[n], "scalar": bias[1]
    alpha: float
    beta: float
    dtype: str

    @property
    def rows(self) -> int:
        return self.batch * self.m

    @property
    def flops(self) -> float:
        return 2 * self.rows * self.n * self.k  # an int: rows may be a symbolic dim


def spec_for(t: kir.LibraryCall, buffers: dict[int, kir.Buffer]) -> GemmSpec | None:
    """The GemmSpec of a MatMul/Gemm call this module can generate, else None."""
    if t.op not in ("MatMul", "Gemm", "FusedMatMul") or len(t.outputs) != 1 or t.views:
        return None  # strided operands go to a library (choice.py)
    attrs = dict(t.attrs)
    ins = [None if b is None else buffers[b] for b in t.inputs]
    a, b, out = ins[0], ins[1], buffers[t.outputs[0]]
    dtype = out.dtype
    if dtype not in SCALAR or any(x is not None and x.dtype != dtype for x in ins):
        return None
    if attrs.get("transA", 0) or attrs.get("transB", 0) or len(b.shape) < 2:
        return None
    if len(a.shape) < 2 or out.size == 0:
        return None
    k, n = b.shape[-2], b.shape[-1]
    if a.shape[-1] != k or out.shape[-1] != n:
        return None
    m = a.shape[-2]
    a_batch, b_batch = a.shape[:-2], b.shape[:-2]
    out_batch = out.shape[:-2]
    if t.op == "Gemm" and len(a.shape) > 2:  # a MatMul with its bias folded in: flat rows
        m, a_batch, out_batch = math.prod(a.shape[:-1]), (), ()
    if tuple(a_batch) != tuple(out_batch):
        return None  # A broadcast over batches: MLAS handles it
    batch = math.prod(out_batch)
    if b_batch and tuple(b_batch) != tuple(out_batch):
        return None
    bias = ""
    if len(ins) > 2 and ins[2] is not None:
        c = ins[2]
        if c.size == 1:
            bias = "scalar"
        elif tuple(c.shape) in ((n,), (1, n)):
            bias = "row"
        else:
            return None
    spec = GemmSpec(m, n, k, batch, bool(b_batch) and batch > 1, bias,
                    float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0)), dtype)
    return spec if spec.flops <= MAX_FLOPS and k > 0 else None


def code_spec(spec: GemmSpec) -> GemmSpec:
    """What the generated code depends on: the rows are a runtime range, so neither the
    batch count nor (with a shared B) the rows per batch is part of it. A symbolic dim
    left in it needs a library call (the code would hold the symbol as a literal)."""
    return dataclasses.replace(spec, batch=0, m=spec.m if spec.b_batched else 0)


def code_key(spec: GemmSpec) -> str:
    """Text determining the generated code (code_spec's)."""
    return repr(code_spec(spec))


def emit(module: ir.Module, name: str, spec: GemmSpec) -> None:
    """Emit `void name(ptr bufs, i64 start, i64 stop)` computing rows [start, stop)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name)
    set.add(fn.attributes, '"reciprocal-estimates"="none"')
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    names = ["a", "b"] + (["bias"] if spec.bias else []) + ["c"]
    ptr = {nm: b.load(b.gep(fn.args[0], [I64(j)], source_etype=PTR), typ=PTR, name=nm)
           for j, nm in enumerate(names)}
    _Emitter(b, spec, ptr).rows(fn.args[1], fn.args[2])
    b.ret_void()


class _Emitter:
    def __init__(self, b: ir.IRBuilder, spec: GemmSpec, ptr: dict[str, ir.Value]):
        self.b, self.s, self.p = b, spec, ptr
        self.ty = SCALAR[spec.dtype]
        self.vw = LANES[spec.dtype]
        self.vty = ir.VectorType(self.ty, self.vw)
        self.align = 4 if spec.dtype == "float32" else 8
        self.module = b.module

    # ---- helpers ----------------------------------------------------------------------
    def _intrinsic(self, name: str, ret: ir.Type, args: list) -> ir.Value:
        try:
            f = self.module.get_global(name)
        except KeyError:
            f = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return self.b.call(f, args)

    def _splat(self, x: ir.Value) -> ir.Value:
        v = self.b.insert_element(ir.Constant(self.vty, ir.Undefined), x, I32(0))
        return self.b.shuffle_vector(v, ir.Constant(self.vty, ir.Undefined),
                                     ir.Constant(ir.VectorType(I32, self.vw), [0] * self.vw))

    def _suffix(self) -> str:
        return f"v{self.vw}{'f32' if self.s.dtype == 'float32' else 'f64'}"

    def _mask(self, col: ir.Value) -> ir.Value:
        """Lanes col + i < n."""
        lanes = ir.Constant(ir.VectorType(I64, self.vw), list(range(self.vw)))
        b = self.b
        start = b.insert_element(ir.Constant(ir.VectorType(I64, self.vw), ir.Undefined), col,
                                 I32(0))
        start = b.shuffle_vector(start, ir.Constant(ir.VectorType(I64, self.vw), ir.Undefined),
                                 ir.Constant(ir.VectorType(I32, self.vw), [0] * self.vw))
        limit = ir.Constant(ir.VectorType(I64, self.vw), [self.s.n] * self.vw)
        return b.icmp_signed("<", b.add(start, lanes), limit)

    def _load(self, base: ir.Value, off: ir.Value, mask: ir.Value) -> ir.Value:
        addr = self.b.gep(base, [off], inbounds=True, source_etype=self.ty)
        zero = ir.Constant(self.vty, [0.0] * self.vw)
        return self._intrinsic(f"llvm.masked.load.{self._suffix()}.p0", self.vty,
                               [addr, I32(self.align), mask, zero])

    def _store(self, v: ir.Value, base: ir.Value, off: ir.Value, mask: ir.Value) -> None:
        addr = self.b.gep(base, [off], inbounds=True, source_etype=self.ty)
        self._intrinsic(f"llvm.masked.store.{self._suffix()}.p0", ir.VoidType(),
                        [v, addr, I32(self.align), mask])

    # ---- structure ----------------------------------------------------------------------
    def rows(self, start: ir.Value, stop: ir.Value) -> None:
        """Rows [start, stop) in blocks of ROWS rows that never cross a batch of B."""
        b, s = self.b, self.s
        if not s.b_batched:
            self.segment(start, stop)
            return
        m = I64(s.m)
        first = b.sdiv(start, m)
        last = b.sdiv(b.add(stop, I64(s.m - 1)), m)
        with for_range(b, first, last, "batch") as bi:
            lo = b.mul(bi, m)
            lo = b.select(b.icmp_signed("<", lo, start), start, lo)
            hi = b.add(b.mul(bi, m), m)
            hi = b.select(b.icmp_signed(">", hi, stop), stop, hi)
            self.segment(lo, hi)

    def segment(self, lo: ir.Value, hi: ir.Value) -> None:
        b = self.b
        nblk = b.sdiv(b.sub(hi, lo), I64(ROWS))
        with for_range(b, I64(0), nblk, "blk") as i:
            self.block(b.add(lo, b.mul(i, I64(ROWS))), ROWS)
        with for_range(b, b.add(lo, b.mul(nblk, I64(ROWS))), hi, "one") as r:
            self.block(r, 1)

    def block(self, r0: ir.Value, rb: int) -> None:
        """Rows r0 .. r0 + rb - 1 (one batch of B), every column block."""
        b, s = self.b, self.s
        width = self.vw * VECTORS
        b_off = b.mul(b.sdiv(r0, I64(s.m)), I64(s.k * s.n)) if s.b_batched else I64(0)
        accs = [[entry_alloca(b, self.vty, f"acc{j}_{u}") for u in range(VECTORS)]
                for j in range(rb)]
        with for_range(b, I64(0), I64(-(-s.n // width)), "col") as c:
            n0 = b.mul(c, I64(width))
            masks = [self._mask(b.add(n0, I64(u * self.vw))) for u in range(VECTORS)]
            zero = ir.Constant(self.vty, [0.0] * self.vw)
            for row in accs:
                for acc in row:
                    b.store(zero, acc)
            with for_range(b, I64(0), I64(s.k), "k") as kk:
                bv = [self._load(self.p["b"], b.add(b_off, b.add(b.mul(kk, I64(s.n)),
                                                                  b.add(n0, I64(u * self.vw)))),
                                 masks[u]) for u in range(VECTORS)]
                for j in range(rb):
                    a_addr = b.gep(self.p["a"], [b.add(b.mul(b.add(r0, I64(j)), I64(s.k)), kk)],
                                   inbounds=True, source_etype=self.ty)
                    av = self._splat(b.load(a_addr, typ=self.ty))
                    for u in range(VECTORS):
                        fma = self._intrinsic(f"llvm.fma.{self._suffix()}", self.vty,
                                              [av, bv[u], b.load(accs[j][u])])
                        b.store(fma, accs[j][u])
            for j in range(rb):
                row_off = b.mul(b.add(r0, I64(j)), I64(s.n))
                for u in range(VECTORS):
                    col = b.add(n0, I64(u * self.vw))
                    v = self._epilogue(b.load(accs[j][u]), col, masks[u])
                    self._store(v, self.p["c"], b.add(row_off, col), masks[u])

    def _epilogue(self, acc: ir.Value, col: ir.Value, mask: ir.Value) -> ir.Value:
        b, s = self.b, self.s
        if s.alpha != 1.0:
            acc = b.fmul(acc, ir.Constant(self.vty, [s.alpha] * self.vw))
        if s.beta == 0.0:  # C is not read at all: beta * inf would be NaN (onnxruntime)
            return acc
        if s.bias == "row":
            bias = self._load(self.p["bias"], col, mask)
        elif s.bias == "scalar":
            bias = self._splat(b.load(self.p["bias"], typ=self.ty))
        else:
            return acc
        if s.beta != 1.0:
            bias = b.fmul(bias, ir.Constant(self.vty, [s.beta] * self.vw))
        return b.fadd(acc, bias)
