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

The blocks follow the host's registers: on AVX-512 (32 of 512 bits) vectors of 16 floats
and 8 x 2 accumulators for a strided product; on AVX2 (16 of 256 bits) vectors of 8 and
6 x 2 (the 512-bit blocks spilled there: Swin's window P.V ran at half MLAS's speed on a
Zen 3). There the blocks reach ~65 GFLOP/s on 2 threads against the library's 90-130 over
a whole batch, so only products below AVX2_MAX_BATCH_FLOPS a batch (Swin's windows) stay
generated; single products below MAX_FLOPS win on both hosts (no call overhead).

Strided operands (`Strided`, from a call's views: kernel/views.py) take the same blocks one
batch at a time, each operand at its own batch, row and column strides: attention over
small windows, where Swin-tiny's Q.K^T is 192 products of [49, 32] x [32, 49] read in place
from the fused Q/K/V projection. oneDNN ran those at ~55 GFLOP/s and MLAS behind copies
slower still (the call overhead of a product this small); below `MAX_BATCH_FLOPS` per
batch this kernel takes them. A B whose columns are not adjacent (K^T) is first copied,
per batch, into a [k, n] block on the stack (`PACK_MAX` elements at most).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

from autoclust.backends.cpu.jit import has_avx512
from autoclust.backends.cpu.loops import entry_alloca, for_range, intrinsic, kernel_entry, splat
from llvmlite import ir

from autoclust import symbolic
from autoclust.kernel import ir as kir
from autoclust.kernel.indexing import contiguous_strides

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
SCALAR = {"float32": ir.FloatType(), "float64": ir.DoubleType()}
LANES = {"float32": 16, "float64": 8}  # one 512-bit vector (half of it on an AVX2 host)
ROWS = 4           # RB: rows sharing each B load
STRIDED_ROWS = 8   # RB of a strided product (16 accumulators: 4-8% faster on attention)
AVX2_STRIDED_ROWS = 6  # the same on AVX2's 16 registers: 12 accumulators, 2 B, 1 A
VECTORS = 2        # U: column vectors per block
MAX_FLOPS = 4e6    # below: generated; above: MLAS (measured crossover, see bench_gemm)
MAX_BATCH_FLOPS = 1e7  # batched products: below this per batch, generated (measured)
# the same on an AVX2 host (Zen 3, 2 threads, generated / library time): Swin's 49x49x32
# windows 0.87; [64,64]x[64,64] 1.44, [128,32]x[32,128] 1.14, attention's [128,64]x[64,128]
# 1.35, [197,64]x[64,197] 1.86 (the generated blocks reach ~65 GFLOP/s there, the library
# 90-130 over a whole batch); single products below MAX_FLOPS still win (0.52-0.99)
AVX2_MAX_BATCH_FLOPS = 3e5
PACK_MAX = 16384   # elements of one batch's B copied to the stack when its columns are apart


@dataclasses.dataclass(frozen=True)
class Operand:
    """Where element [batch..., row, col] of an operand lives: offset + the index dotted
    with (batch strides..., row, col), in elements of its buffer."""

    offset: int
    batch: tuple[int, ...]
    row: int
    col: int


@dataclasses.dataclass(frozen=True)
class Strided:
    """The layouts of a batched product's A, B and C over `batch` (C's batch dims)."""

    batch: tuple[int, ...]
    a: Operand
    b: Operand
    c: Operand
    # m, n, k read from the descriptor too: a symbolic size's product (a sequence length),
    # one code for every binding, 10-30% slower than sizes in the code
    dynamic: bool = False

    @property
    def pack(self) -> bool:
        """B's columns are not adjacent: copy each batch's B to the stack first."""
        return self.b.col != 1


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
    strided: Strided | None = None  # None: A, B, C dense as their shapes say

    @property
    def rows(self) -> int:
        return self.batch * self.m

    @property
    def flops(self) -> float:
        return 2 * self.rows * self.n * self.k  # an int: rows may be a symbolic dim


def spec_for(t: kir.LibraryCall, buffers: dict[int, kir.Buffer]) -> GemmSpec | None:
    """The GemmSpec of a MatMul/Gemm call this module can generate, else None."""
    if t.op not in ("MatMul", "Gemm", "FusedMatMul") or len(t.outputs) != 1:
        return None
    attrs = dict(t.attrs)
    if any(v is not None for v in t.views) or attrs.get("transA", 0) or attrs.get("transB", 0):
        return _strided_spec(t, buffers)  # a transposed operand is a strided one
    ins = [None if b is None else buffers[b] for b in t.inputs]
    a, b, out = ins[0], ins[1], buffers[t.outputs[0]]
    dtype = out.dtype
    if dtype not in SCALAR or any(x is not None and x.dtype != dtype for x in ins):
        return None
    if len(b.shape) < 2 or len(a.shape) < 2 or out.size == 0:
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
    if k == 0:
        return None
    if spec.flops <= MAX_FLOPS:
        return spec
    # many small products (attention's heads made dense): the strided path's batches
    return _strided_spec(t, buffers) if batch > 1 and not bias else None


def _layout(t: kir.LibraryCall, k: int, buf: kir.Buffer, batch: tuple) -> Operand | None:
    """Operand k's layout over output batch dims `batch`, from its view or, without one,
    its buffer's contiguous strides (broadcast dims: stride 0)."""
    v = t.view(k)
    shape, strides, offset = (tuple(buf.shape), contiguous_strides(tuple(buf.shape)), 0) \
        if v is None else (v.shape, v.strides, v.offset)
    lead = len(batch) - (len(shape) - 2)
    if len(shape) < 2 or lead < 0:
        return None
    bstr = [0] * lead + [0 if d == 1 else st for d, st in zip(shape[:-2], strides[:-2])]
    return Operand(offset, tuple(bstr), strides[-2], strides[-1])


def _strided_spec(t: kir.LibraryCall, buffers: dict[int, kir.Buffer]) -> GemmSpec | None:
    """A batched MatMul/FusedMatMul (operands in place through views, or dense) small per
    batch: the strided GemmSpec (FusedMatMul's transA/transB swap that operand's row and
    column strides); None where a library does better or the code cannot."""
    attrs = dict(t.attrs)
    if t.op == "Gemm" or len(t.inputs) != 2 or any(b is None for b in t.inputs) or \
            attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
        return None
    a, b, out = buffers[t.inputs[0]], buffers[t.inputs[1]], buffers[t.outputs[0]]
    dtype = out.dtype
    if dtype not in SCALAR or a.dtype != dtype or b.dtype != dtype:
        return None
    shapes = [list(v.shape) if v is not None else list(x.shape)
              for v, x in zip([t.view(0), t.view(1), t.view(2)], (a, b, out))]
    if any(len(sh) < 2 for sh in shapes):
        return None
    trans = (attrs.get("transA", 0), attrs.get("transB", 0), 0)
    for sh, tr in zip(shapes, trans):
        if tr:
            sh[-2], sh[-1] = sh[-1], sh[-2]
    (m, k), (k2, n), (m2, n2) = shapes[0][-2:], shapes[1][-2:], shapes[2][-2:]
    batch = tuple(shapes[2][:-2])
    if (k, m, n) != (k2, m2, n2) or 0 in (m, n, k) or math.prod(batch) == 0:
        return None
    layouts = [_layout(t, j, x, batch) for j, x in enumerate((a, b, out))]
    if any(lay is None for lay in layouts):
        return None
    layouts = [dataclasses.replace(lay, row=lay.col, col=lay.row) if tr else lay
               for lay, tr in zip(layouts, trans)]
    # symbolic sizes (decisions below on them are the shape class's guards: a longer
    # sequence than the limits allow is another class, a library's)
    strided = Strided(batch, *layouts, dynamic=symbolic.has_syms((m, n, k)))
    per_batch = 2 * m * n * k
    if not any(st and d > 1 for d, st in zip(batch, layouts[1].batch)):
        return None  # one B for every batch (weights): one big GEMM, a library's (prepacked)
    # (the batch count first: every decision on a symbolic size is a guard of the class)
    most = MAX_BATCH_FLOPS if has_avx512() else min(MAX_BATCH_FLOPS, AVX2_MAX_BATCH_FLOPS)
    if per_batch > most or (math.prod(batch) == 1 and per_batch > MAX_FLOPS):
        return None  # big products, or one alone: a library's blocking pays
    if layouts[2].col != 1 or (strided.pack and k * n > PACK_MAX) or \
            any(v < 0 for op in layouts for v in (op.offset, op.row, op.col, *op.batch)):
        return None  # C's columns apart, B too big for the stack, a step backwards
    return GemmSpec(m, n, k, math.prod(batch), True, "", float(attrs.get("alpha", 1.0)),
                    1.0, dtype, strided)


def code_spec(spec: GemmSpec) -> GemmSpec:
    """What the generated code depends on: the rows are a runtime range, so neither the
    batch count nor (with a shared B) the rows per batch is part of it. A symbolic dim
    left in it needs a library call (the code would hold the symbol as a literal). A
    strided product's code reads its strides, offsets and batch sizes at run time
    (`descriptor`): its m, n, k (constant trip counts and masks: 10-30% faster than read
    at run time), batch rank, whether B is packed, alpha and dtype count, so one object
    serves every layer and head of a shape (each compile costs ~0.1 s)."""
    st = spec.strided
    if st is not None:
        zero = Operand(0, (0,) * len(st.batch), 0, 0)
        code = Strided((0,) * len(st.batch), zero, dataclasses.replace(zero, col=int(
            not st.pack)), zero, st.dynamic)
        if st.dynamic:
            return dataclasses.replace(spec, m=0, n=0, k=0, batch=0, strided=code)
        return dataclasses.replace(spec, batch=0, strided=code)
    return dataclasses.replace(spec, batch=0, m=spec.m if spec.b_batched else 0)


def descriptor(spec: GemmSpec) -> tuple[int, ...]:
    """The run-time values a strided product's code reads after its three pointers: m, n,
    k, then (offset, row, col strides) of A, B, C, then per batch dim its size and the
    three operands' strides. Empty for a dense spec (its numbers are in its code)."""
    st = spec.strided
    if st is None:
        return ()
    head = (spec.m, spec.n, spec.k) + tuple(v for op in (st.a, st.b, st.c)
                                            for v in (op.offset, op.row, op.col))
    return head + tuple(v for d in range(len(st.batch))
                        for v in (st.batch[d], st.a.batch[d], st.b.batch[d], st.c.batch[d]))


def loop_passes(spec: GemmSpec) -> bool:
    """Whether LLVM's loop passes run on the code: not on a dynamic product's, whose
    run-time trip counts they multiply into versions (1 thread, [12 x 128 x 64] x [64 x
    128]: 0.14 s to compile and 6.1 ms to run with them, 0.05 s and 5.3 ms without); a
    product with its sizes in the code runs ~10% faster with them (0.12 s and 4.4 ms
    against 0.04 s and 4.8 ms)."""
    return spec.strided is None or not spec.strided.dynamic


def code_key(spec: GemmSpec) -> str:
    """Text determining the generated code (code_spec's)."""
    return repr(code_spec(spec))


def emit(module: ir.Module, name: str, spec: GemmSpec) -> None:
    """Emit `void name(ptr bufs, i64 start, i64 stop)` computing rows [start, stop)."""
    names = ["a", "b"] + (["bias"] if spec.bias else []) + ["c"]
    b, ptr, fn = kernel_entry(module, name, names, exact_division=True)
    desc: list[ir.Value] = []
    if spec.strided is not None:  # its descriptor's values follow the pointers
        count = 12 + 4 * len(spec.strided.batch)
        desc = [b.load(b.gep(fn.args[0], [I64(len(names) + j)], source_etype=I64), typ=I64)
                for j in range(count)]
    _Emitter(b, spec, ptr, desc).rows(fn.args[1], fn.args[2])
    b.ret_void()


@dataclasses.dataclass(frozen=True)
class _Bases:
    """One batch's operands: element offsets of A, B, C in their buffers and the row (and
    A's column) strides; b_ptr replaces B's buffer when B was copied to the stack."""

    a: ir.Value
    b: ir.Value
    c: ir.Value
    a_row: ir.Value
    a_col: ir.Value
    b_row: ir.Value
    c_row: ir.Value
    b_ptr: ir.Value | None = None


class _Emitter:
    def __init__(self, b: ir.IRBuilder, spec: GemmSpec, ptr: dict[str, ir.Value],
                 desc: list[ir.Value]):
        self.b, self.s, self.p = b, spec, ptr
        self.desc = desc  # a strided product's run-time values (`descriptor`)
        if spec.strided is not None and spec.strided.dynamic:
            self.m, self.n, self.k = desc[:3]
        else:
            self.m, self.n, self.k = I64(spec.m), I64(spec.n), I64(spec.k)
        self.ty = SCALAR[spec.dtype]
        # AVX-512's 32 registers hold 8 x 2 accumulators of 512 bits; an AVX2 host has 16
        # of 256: 16-lane vectors there became pairs, the accumulators spilled, and Swin's
        # window attention P.V ran at half MLAS's speed (Zen 3: 464 us against 253)
        wide = has_avx512()
        self.vw = LANES[spec.dtype] if wide else LANES[spec.dtype] // 2
        self.rb_strided = STRIDED_ROWS if wide else AVX2_STRIDED_ROWS
        self.vty = ir.VectorType(self.ty, self.vw)
        self.align = 4 if spec.dtype == "float32" else 8

    # ---- helpers ----------------------------------------------------------------------
    def _intrinsic(self, name: str, ret: ir.Type, args: list) -> ir.Value:
        return intrinsic(self.b, name, ret, args)

    def _splat(self, x: ir.Value) -> ir.Value:
        """x (a scalar of any type) in every lane of a vector of VW lanes."""
        return splat(self.b, x, self.vw)

    def _suffix(self) -> str:
        return f"v{self.vw}{'f32' if self.s.dtype == 'float32' else 'f64'}"

    def _mask(self, col: ir.Value) -> ir.Value:
        """Lanes col + i < n."""
        lanes = ir.Constant(ir.VectorType(I64, self.vw), list(range(self.vw)))
        return self.b.icmp_signed("<", self.b.add(self._splat(col), lanes),
                                  self._splat(self.n))

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
        if s.strided is not None:
            self.strided_rows(start, stop)
            return
        dense = _Bases(I64(0), I64(0), I64(0), I64(s.k), I64(1), I64(s.n), I64(s.n))
        if not s.b_batched:
            self.segment(start, stop, dense, I64(0))
            return
        with self._batches(start, stop) as (bi, lo, hi, _):
            self.segment(lo, hi, dataclasses.replace(dense, b=b.mul(bi, I64(s.k * s.n))),
                         I64(0))

    @contextlib.contextmanager
    def _batches(self, start: ir.Value, stop: ir.Value):
        """Loop over the batches rows [start, stop) touch: (batch, its first and last+1
        rows clipped to the range, its first row)."""
        b = self.b
        first = b.sdiv(start, self.m)
        last = b.sdiv(b.add(stop, b.sub(self.m, I64(1))), self.m)
        with for_range(b, first, last, "batch") as bi:
            row0 = b.mul(bi, self.m)
            lo = b.select(b.icmp_signed("<", row0, start), start, row0)
            hi = b.add(row0, self.m)
            hi = b.select(b.icmp_signed(">", hi, stop), stop, hi)
            yield bi, lo, hi, row0

    def strided_rows(self, start: ir.Value, stop: ir.Value) -> None:
        """Rows [start, stop) of a strided product, batch by batch: each batch's operand
        bases from its multi-index, its B copied to the stack first when packed."""
        b, d = self.b, self.desc
        (a_off, a_row, a_col, b_off, b_row, b_col, c_off, c_row, _), dims = d[3:12], d[12:]
        scratch = None
        if self.s.strided.pack:
            scratch = entry_alloca(b, self.ty, "packed_b", count=PACK_MAX)
        with self._batches(start, stop) as (bi, lo, hi, row0):
            base = [a_off, b_off, c_off]
            rest = bi
            for j in reversed(range(len(dims) // 4)):  # the multi-index, innermost first
                size, strides = dims[4 * j], dims[4 * j + 1:4 * j + 4]
                idx = b.srem(rest, size) if j else rest
                rest = b.sdiv(rest, size)
                base = [b.add(x, b.mul(idx, st)) for x, st in zip(base, strides)]
            bases = _Bases(base[0], base[1], base[2], a_row, a_col, b_row, c_row)
            if scratch is not None:
                bases = self.pack(scratch, bases, b_col)
            self.segment(lo, hi, bases, row0)

    def pack(self, scratch: ir.Value, bases: _Bases, b_col: ir.Value) -> _Bases:
        """Copy this batch's B (columns b_col apart) into scratch as a dense [k, n]; the
        bases to read it there."""
        b = self.b
        with for_range(b, I64(0), self.n, "pn") as j:
            src_col = b.add(bases.b, b.mul(j, b_col))
            with for_range(b, I64(0), self.k, "pk") as kk:
                src = b.gep(self.p["b"], [b.add(src_col, b.mul(kk, bases.b_row))],
                            inbounds=True, source_etype=self.ty)
                out = b.gep(scratch, [b.add(b.mul(kk, self.n), j)], inbounds=True,
                            source_etype=self.ty)
                b.store(b.load(src, typ=self.ty), out)
        return dataclasses.replace(bases, b=I64(0), b_row=self.n, b_ptr=scratch)

    def segment(self, lo: ir.Value, hi: ir.Value, bases: _Bases, row0: ir.Value) -> None:
        """Rows [lo, hi) of one batch (row0: its first row; 0 where rows are flat)."""
        b = self.b
        rb = ROWS if self.s.strided is None else self.rb_strided
        nblk = b.sdiv(b.sub(hi, lo), I64(rb))
        with for_range(b, I64(0), nblk, "blk") as i:
            self.block(b.sub(b.add(lo, b.mul(i, I64(rb))), row0), rb, bases)
        with for_range(b, b.add(lo, b.mul(nblk, I64(rb))), hi, "one") as r:
            self.block(b.sub(r, row0), 1, bases)

    def block(self, r0: ir.Value, rb: int, at: _Bases) -> None:
        """Rows r0 .. r0 + rb - 1 of one batch (its operands at `at`), every column block."""
        b = self.b
        width = self.vw * VECTORS
        b_ptr = at.b_ptr if at.b_ptr is not None else self.p["b"]
        accs = [[entry_alloca(b, self.vty, f"acc{j}_{u}") for u in range(VECTORS)]
                for j in range(rb)]
        a_rows = [b.add(at.a, b.mul(b.add(r0, I64(j)), at.a_row)) for j in range(rb)]
        blocks = b.sdiv(b.add(self.n, I64(width - 1)), I64(width))
        with for_range(b, I64(0), blocks, "col") as c:
            n0 = b.mul(c, I64(width))
            masks = [self._mask(b.add(n0, I64(u * self.vw))) for u in range(VECTORS)]
            zero = ir.Constant(self.vty, [0.0] * self.vw)
            for row in accs:
                for acc in row:
                    b.store(zero, acc)
            with for_range(b, I64(0), self.k, "k") as kk:
                b_row = b.add(at.b, b.mul(kk, at.b_row))
                bv = [self._load(b_ptr, b.add(b_row, b.add(n0, I64(u * self.vw))), masks[u])
                      for u in range(VECTORS)]
                for j in range(rb):
                    a_addr = b.gep(self.p["a"], [b.add(a_rows[j], b.mul(kk, at.a_col))],
                                   inbounds=True, source_etype=self.ty)
                    av = self._splat(b.load(a_addr, typ=self.ty))
                    for u in range(VECTORS):
                        fma = self._intrinsic(f"llvm.fma.{self._suffix()}", self.vty,
                                              [av, bv[u], b.load(accs[j][u])])
                        b.store(fma, accs[j][u])
            for j in range(rb):
                row_off = b.add(at.c, b.mul(b.add(r0, I64(j)), at.c_row))
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
