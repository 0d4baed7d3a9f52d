"""FusedAttention (autoclust/ops/attention.py) as one generated CPU kernel: no scores in memory.

Unfused, attention is three steps: Q.K^T writes the scores, a softmax reads and writes them,
P.V reads them. Whisper-tiny's encoder (6 heads, 750 frames) writes 13.5 MB of scores a
layer that way, and its three steps took 5.3 ms a layer against 3.5-3.8 in OpenVINO's
fused attention (docs/performance.md). Here one kernel takes blocks [start, stop) of the
flat (batch index b, block of RB = 2 * VW query rows: 32 on AVX-512) range -- threads split
whole blocks -- and works across a block's rows: lane r of every vector is query row i0 + r,
so the softmax's row maxima and sums are plain vector operations.

    qt[d] = Q[b, i0 + r, d]                   the block's Q, transposed onto the stack
    m = -inf, l = 0, o[e] = 0                 per row: running maximum, sum, output
    for each tile of BK keys (a causal block stops after its last row's diagonal):
        s[j] = sum_d qt[d] * K[b, j, d]      UJ keys x 2 vectors of accumulators, K[j, d]
                                             broadcast: a register-blocked GEMM, K^T
                                             never packed
        s[j] = s[j] * scale, then + mask | mask ? s : fill, then -inf past Sk and, causal,
               where j > i + offset          (the order of ops/attention.py's reference)
        m' = max(m, max_j s[j]);  c = m' (0 while every score so far is -inf)
        p[j] = exp(s[j] - c), 0 below the smallest normal (as Softmax feeding a GEMM:
               ops/normalization.py)
        a = exp(m - c);  l = l * a + sum_j p[j];  o[e] = o[e] * a + sum_j p[j] * V[b, j, e]
        m = m'
    out[b, i0 + r, e] = o[e] / l             guards: 0 where l is 0 (and, IsNaN's, NaN)

The online softmax (FlashAttention's) rounds differently from the unfused plan: the sums run
tile by tile and each tile's terms are rescaled by a; results agree with onnxruntime's to
~1e-6 relative. A row whose scores are all -inf gives 0/0 = NaN, as Softmax does; with the
exporters' IsNaN guard (nan_to_zero) 0. A NaN score makes its row NaN (or 0 with the
guard: the reference's every p is NaN then), a +inf score too (inf - inf).

Q, K, V and the mask are read in place through their views (head split, K's transpose,
grouped-query heads' repeat: ops/attention.py), with their sizes and strides in the code:
one object per distinct attention shape, shared by a model's layers. Where the call itself
reads Q, K or V through a view (the CPU policy's library_views: ViT's projections are
Slices of one sibling-fused GEMM's result, which a kernel used to copy out, 175 us a
layer on ViT-base), `_compose` maps the op's view through it and the view starts at an
element offset (AttnSpec.bases). float32 only (the CPU
policy fuses nothing else); head dims up to MAX_HEAD_DIM (the stack holds the block's Q,
output and one tile's scores: 48 KB at 128).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from autoclust.backends.cpu import mathlib
from autoclust.backends.cpu.jit import has_avx512
from autoclust.backends.cpu.loops import entry_alloca, for_range, intrinsic, kernel_entry, splat
from llvmlite import ir

from autoclust import symbolic
from autoclust.kernel import ir as kir
from autoclust.ops import attention as attn

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
PTR = ir.PointerType()
MAX_HEAD_DIM = 128
# Fewer keys than this stay three steps (the CPU policy's attention_min_keys): a row of
# scores that short stays in cache anyway, and the fused call then costs kernels the
# unfused plan does without -- the bias adds and head split of Q, K, V, the output's head
# merge, which the GEMMs there read and write in place. One process each, A/B, 2 threads,
# fused against not: Swin's 49-key windows 0.96, GPT-2 (64) 1.00, BERT-base (128) 0.99,
# LLaMA-like 0.99, Qwen2-like 1.02, T5 1.01, ViT (197) 1.01, DeiT 1.01, Whisper (750) 1.05.
MIN_KEYS = 192
BK = 64            # keys per tile: its scores (BK x RB floats) stay in L1
CHECK = 1 << 22    # elements of an operand view _compose checks one by one, at most
LOG_TINY = math.log(float.fromhex("0x1p-126"))  # below: exp gives 0 (float32's smallest
# normal; Softmax feeding a GEMM flushes the same: ops/normalization.py)


@dataclasses.dataclass(frozen=True)
class AttnSpec:
    """Everything the kernel's code depends on (all sizes concrete)."""

    nb: int
    sq: int
    sk: int
    d: int
    dv: int
    views: tuple               # q, k, v (and mask) views: attn.View
    mask: str                  # "", "add" (float32), "select" (bool)
    scale: float
    fill: float
    causal: int
    offset: int
    nan_to_zero: int
    bases: tuple = ()          # element offset of each view in its buffer (empty: 0s)

    @property
    def rows(self) -> int:
        """The kernel's outer range (what threads split): blocks of RB query rows."""
        return self.nb * blocks_per_batch(self)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.sk * (self.d + self.dv)


def block_rows() -> int:
    """RB: query rows a block works on, two vectors' lanes."""
    return 32 if has_avx512() else 16


def blocks_per_batch(spec: AttnSpec) -> int:
    return -(-spec.sq // block_rows())


def spec_for(t: kir.LibraryCall, buffers: dict[int, kir.Buffer]) -> AttnSpec | None:
    """The AttnSpec of a FusedAttention call this module generates, else None (the call
    then runs the op's NumPy reference: library.py's "ref")."""
    if t.op != attn.OP or len(t.outputs) != 1 or any(b is None for b in t.inputs[:3]):
        return None
    a = dict(t.attrs)
    views = [attn.view_of(a[f"{n}_view"]) for n in "qkv"]
    mask = a.get("mask", "")
    if mask:
        if len(t.inputs) < 4 or t.inputs[3] is None:
            return None
        views.append(attn.view_of(a["m_view"]))
        want = "float32" if mask == "add" else "bool"
        if buffers[t.inputs[3]].dtype != want:
            return None
    ids = list(t.inputs[:3]) + list(t.outputs)
    if any(buffers[b].dtype != "float32" for b in ids):
        return None
    bases = [0] * len(views)
    for j in range(3):  # operands the call reads in place (kernel/views.py): compose
        call_view = t.view(j)
        if call_view is not None:
            composed = _compose(views[j], call_view)
            if composed is None:
                return None
            views[j], bases[j] = composed
    q, k, v = views[:3]
    nb = math.prod(int(x) for x in a.get("batch", []))
    sq, sk, d, dv = q[1][0], k[1][0], q[2][0], v[2][0]
    ints = [nb, sq, sk, d, dv] + [x for view in views for x in attn.view_ints(view)]
    if symbolic.has_syms(ints) or min(nb, sq, sk, d, dv) < 1 or max(d, dv) > MAX_HEAD_DIM \
            or min(ints) < 0 or k[2][0] != d or v[1][0] != sk:
        return None
    if any(base + _last(view) >= buffers[b].size
           for view, base, b in zip(views, bases, t.inputs)) or \
            buffers[t.outputs[0]].size != nb * sq * dv:
        return None  # a view past its buffer: the code would read outside it
    return AttnSpec(nb, sq, sk, d, dv, tuple(views), mask, float(a.get("scale", 1.0)),
                    float(a.get("fill", -math.inf)), int(a.get("causal", 0)),
                    int(a.get("causal_offset", 0)), int(a.get("nan_to_zero", 0)),
                    tuple(bases) if any(bases) else ())


@functools.lru_cache(maxsize=256)
def _compose(view: attn.View, call: kir.View) -> tuple[attn.View, int] | None:
    """The op's view of an operand (over the operand's own contiguous elements) through
    the call's view of that operand in a larger buffer (ViT's Q, a Slice of the fused
    QKV projection: rows 2304 apart from element 0, 768 or 1536): (view over the
    buffer, element offset), or None where a sub-dim would walk across the operand's
    axes. Each sub-dim (n, s) walks one axis a of the operand (s a multiple of the axis's
    place value p, the walk inside it): in the buffer it steps s / p * call.strides[a];
    the result is checked element by element against the two maps composed. Cached: a
    model's layers ask for the same few (the check takes ~1 ms a view)."""
    shape = tuple(int(x) for x in call.shape)
    if symbolic.has_syms(list(call.strides) + [call.offset]) or 0 in shape:
        return None
    place = [math.prod(shape[i + 1:]) for i in range(len(shape))]

    def moved(n: int, st: int) -> tuple[int, int] | None:
        if n == 1 or st == 0:
            return (n, 0)
        for a, p in enumerate(place):  # outermost first: the largest place value fitting
            if st % p == 0 and (n - 1) * (st // p) < shape[a]:
                return (n, st // p * int(call.strides[a]))
        return None

    dims = (*view[0], view[1], view[2])
    subs = [moved(n, st) for n, st in dims]
    if any(sd is None for sd in subs) or math.prod(n for n, _ in dims) > CHECK:
        return None
    # every element: the op's offset in the operand, its digits by the operand's shape
    # mapped by the call's strides, against the composed view's offset (both without
    # the call's offset, which they share); the index ranges broadcast to the full grid
    ranges = [np.arange(n).reshape((-1,) + (1,) * (len(dims) - 1 - i))
              for i, (n, _) in enumerate(dims)]
    inner = sum(r * st for r, (_, st) in zip(ranges, dims))
    if int(np.max(inner)) >= math.prod(shape):
        return None
    want = sum(inner // p % n * int(st) for p, n, st in zip(place, shape, call.strides))
    got = sum(r * st for r, (_, st) in zip(ranges, subs))
    out = (tuple(subs[:-2]), subs[-2], subs[-1])
    return (out, int(call.offset)) if np.array_equal(got, want) else None


def _last(view: attn.View) -> int:
    """The largest element offset a view reads."""
    batch, (r, rs), (c, cs) = view
    return sum((n - 1) * st for n, st in batch) + (r - 1) * rs + (c - 1) * cs


def code_key(spec: AttnSpec) -> str:
    return f"attention|{spec!r}|avx512={has_avx512()}"


def emit(module: ir.Module, name: str, spec: AttnSpec) -> None:
    """Emit `void name(ptr bufs, i64 start, i64 stop)` over blocks of query rows
    (AttnSpec.rows); bufs holds the q, k, v (, mask) and output pointers."""
    names = ["q", "k", "v"] + (["m"] if spec.mask else []) + ["o"]
    b, ptr, fn = kernel_entry(module, name, names, exact_division=True)
    _Emitter(b, spec, ptr).rows(fn.args[1], fn.args[2])
    b.ret_void()


class _Emitter:
    def __init__(self, b: ir.IRBuilder, spec: AttnSpec, ptr: dict[str, ir.Value]):
        self.b, self.s, self.p = b, spec, ptr
        wide = has_avx512()
        self.vw = 16 if wide else 8
        self.uj = 8 if wide else 4    # keys per S block: 2 x UJ accumulators
        self.ue = 8 if wide else 4    # output dims per P.V block
        self.vty = ir.VectorType(F32, self.vw)
        self.ity = ir.VectorType(I64, self.vw)
        self.rb = block_rows()
        # per output dim e, the last key j whose V[j, e] is NaN or +-inf (-1: none), where
        # keys the kernel skips would have made onnxruntime's P.V NaN (0 * inf, 0 * NaN):
        # keys past a causal block's diagonal, and the zeroed rows of the NaN guard
        self.bad = entry_alloca(b, I64, "bad", count=spec.dv) \
            if spec.causal or spec.nan_to_zero else None
        self.qt = entry_alloca(b, self.vty, "qt", count=2 * spec.d)     # [d][2] vectors
        self.ot = entry_alloca(b, self.vty, "ot", count=2 * spec.dv)    # [e][2]
        self.st = entry_alloca(b, self.vty, "st", count=2 * BK)         # [j][2]

    # ---- helpers ----------------------------------------------------------------------
    def c(self, x: float) -> ir.Constant:
        return ir.Constant(self.vty, [x] * self.vw)

    def splat(self, x: ir.Value) -> ir.Value:
        return splat(self.b, x, self.vw)

    def fma(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        return intrinsic(self.b, f"llvm.fma.v{self.vw}f32", self.vty, [x, y, z])

    def maxnum(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return intrinsic(self.b, f"llvm.maxnum.v{self.vw}f32", self.vty, [x, y])

    def slot(self, base: ir.Value, idx: ir.Value) -> ir.Value:
        return self.b.gep(base, [idx], inbounds=True, source_etype=self.vty)

    def elem(self, name: str, off: ir.Value, ty: ir.Type = F32) -> ir.Value:
        return self.b.gep(self.p[name], [off], inbounds=True, source_etype=ty)

    def lanes(self, i0: ir.Value, h: int) -> ir.Value:
        """i0 + h * VW + (0, 1, ...): the rows of vector h."""
        step = ir.Constant(self.ity, [h * self.vw + r for r in range(self.vw)])
        return self.b.add(self.splat(i0), step)

    def vgep(self, name: str, offs: ir.Value, ty: ir.Type = F32) -> ir.Value:
        """A vector of addresses into buffer `name` (llvmlite types a GEP's result from its
        base alone: the vector of pointers is set by hand)."""
        addrs = self.b.gep(self.p[name], [offs], inbounds=True, source_etype=ty)
        addrs.type = ir.VectorType(PTR, self.vw)
        return addrs

    def gather(self, name: str, offs: ir.Value, valid: ir.Value, ty: ir.Type = F32
               ) -> ir.Value:
        """The elements at offsets `offs` (an i64 vector) of buffer `name`, 0 where not
        valid."""
        vty = ir.VectorType(ty, self.vw)
        addrs = self.vgep(name, offs, ty)
        zero = ir.Constant(vty, [0.0 if ty == F32 else 0] * self.vw)
        suffix = "f32" if ty == F32 else "i8"
        return intrinsic(self.b, f"llvm.masked.gather.v{self.vw}{suffix}.v{self.vw}p0", vty,
                         [addrs, I32(4 if ty == F32 else 1), valid, zero])

    def offsets(self, bi: ir.Value) -> list[ir.Value]:
        """Each view's element offset of batch index bi (its base, then a mixed radix over
        its batch sub-dims, last fastest)."""
        b, out = self.b, []
        bases = self.s.bases or (0,) * len(self.s.views)
        for (batch, _, _), base in zip(self.s.views, bases):
            off, rest = I64(base), bi
            for size, stride in reversed(batch):
                off = b.add(off, b.mul(b.urem(rest, I64(size)), I64(stride)))
                rest = b.udiv(rest, I64(size))
            out.append(off)
        return out

    # ---- structure ----------------------------------------------------------------------
    def rows(self, start: ir.Value, stop: ir.Value) -> None:
        b, per = self.b, I64(blocks_per_batch(self.s))
        sq = I64(self.s.sq)
        first = b.udiv(start, per)
        last = b.udiv(b.add(stop, I64(blocks_per_batch(self.s) - 1)), per)
        with for_range(b, first, last, "batch") as bi:
            b0 = b.mul(bi, per)
            lo = b.sub(b.select(b.icmp_signed("<", b0, start), start, b0), b0)
            hi = b.sub(b.select(b.icmp_signed(">", b.add(b0, per), stop), stop, b.add(b0, per)), b0)
            offs = self.offsets(bi)
            if self.bad is not None:
                self.scan_values(offs)
            with for_range(b, lo, hi, "blk") as blk:
                i0 = b.mul(blk, I64(self.rb))
                n = b.sub(sq, i0)
                n = b.select(b.icmp_signed(">", n, I64(self.rb)), I64(self.rb), n)
                self.block(b.mul(bi, sq), offs, i0, n)

    def scan_values(self, offs: list[ir.Value]) -> None:
        """bad[e] for this batch index's V."""
        b, s = self.b, self.s
        (_, (_, v_rs), (_, v_cs)) = s.views[2]
        with for_range(b, I64(0), I64(s.dv), "be") as e:
            b.store(I64(-1), b.gep(self.bad, [e], inbounds=True, source_etype=I64))
        with for_range(b, I64(0), I64(s.sk), "bj") as j:
            row = b.add(offs[2], b.mul(j, I64(v_rs)))
            with for_range(b, I64(0), I64(s.dv), "be") as e:
                x = b.load(self.elem("v", b.add(row, b.mul(e, I64(v_cs)))), typ=F32)
                wild = b.fcmp_unordered("uno", b.fsub(x, x), b.fsub(x, x))  # NaN or inf
                at = b.gep(self.bad, [e], inbounds=True, source_etype=I64)
                b.store(b.select(wild, j, b.load(at, typ=I64)), at)

    def block(self, row0: ir.Value, offs: list[ir.Value], i0: ir.Value, n: ir.Value) -> None:
        """Query rows i0 .. i0 + n - 1 (n <= RB) of one batch index."""
        b, s = self.b, self.s
        rows = [self.lanes(i0, h) for h in range(2)]
        lane = [self.lanes(I64(0), h) for h in range(2)]
        valid = [b.icmp_signed("<", lane[h], self.splat(n)) for h in range(2)]
        (_, (_, q_rs), (_, q_cs)) = s.views[0]
        with for_range(b, I64(0), I64(s.d), "qd") as d:
            base = b.add(offs[0], b.mul(d, I64(q_cs)))
            for h in range(2):
                at = b.add(self.splat(base), b.mul(rows[h], self.splat(I64(q_rs))))
                b.store(self.gather("q", at, valid[h]), self.slot(self.qt, b.add(
                    b.mul(d, I64(2)), I64(h))))
        with for_range(b, I64(0), I64(2 * s.dv), "oz") as e:
            b.store(self.c(0.0), self.slot(self.ot, e))
        m = [entry_alloca(b, self.vty, f"m{h}") for h in range(2)]
        lsum = [entry_alloca(b, self.vty, f"l{h}") for h in range(2)]
        for h in range(2):
            b.store(self.c(-math.inf), m[h])
            b.store(self.c(0.0), lsum[h])
        kend = I64(s.sk)
        if s.causal:  # keys past the block's last row's diagonal are hidden from every row
            seen = b.add(b.add(i0, n), I64(s.offset))
            kend = b.select(b.icmp_signed("<", seen, kend), seen, kend)
        tiles = b.sdiv(b.add(kend, I64(BK - 1)), I64(BK))
        with for_range(b, I64(0), tiles, "tile") as t:
            j0 = b.mul(t, I64(BK))
            nk = b.sub(kend, j0)
            nk = b.select(b.icmp_signed(">", nk, I64(BK)), I64(BK), nk)
            self.tile(offs, rows, valid, j0, nk, kend, m, lsum)
        self.finish(row0, rows, valid, lsum, kend)

    def tile(self, offs: list[ir.Value], rows: list[ir.Value], valid: list[ir.Value],
             j0: ir.Value, nk: ir.Value, kend: ir.Value, m: list, lsum: list) -> None:
        """Keys j0 .. j0 + nk - 1: their scores, the running softmax, the P.V update."""
        b = self.b
        tmax = [entry_alloca(b, self.vty, f"tmax{h}") for h in range(2)]
        for h in range(2):
            b.store(self.c(-math.inf), tmax[h])
        groups = b.sdiv(b.add(nk, I64(self.uj - 1)), I64(self.uj))
        with for_range(b, I64(0), groups, "grp") as g:
            self.scores(offs, rows, valid, j0, b.mul(g, I64(self.uj)), kend, tmax)
        used = b.mul(groups, I64(self.uj))  # scores written (those past kend are -inf)
        cs, alpha = [], []
        for h in range(2):
            old = b.load(m[h])
            new = self.maxnum(old, b.load(tmax[h]))
            b.store(new, m[h])
            c = b.select(b.fcmp_ordered("==", new, self.c(-math.inf)), self.c(0.0), new)
            cs.append(c)
            alpha.append(mathlib.exp_below(b, b.fsub(old, c), LOG_TINY, True))
        part = [entry_alloca(b, self.vty, f"part{h}") for h in range(2)]
        for h in range(2):
            b.store(self.c(0.0), part[h])
        with for_range(b, I64(0), used, "pj") as j:
            for h in range(2):
                at = self.slot(self.st, b.add(b.mul(j, I64(2)), I64(h)))
                p = mathlib.exp_below(b, b.fsub(b.load(at, typ=self.vty), cs[h]), LOG_TINY,
                                      True)
                b.store(p, at)
                b.store(b.fadd(b.load(part[h]), p), part[h])
        for h in range(2):
            b.store(self.fma(b.load(lsum[h]), alpha[h], b.load(part[h])), lsum[h])
        for e0 in range(0, self.s.dv, self.ue):
            self.pv(offs, j0, nk, e0, min(self.ue, self.s.dv - e0), alpha)

    def scores(self, offs: list[ir.Value], rows: list[ir.Value], valid: list[ir.Value],
               j0: ir.Value, g0: ir.Value, kend: ir.Value, tmax: list) -> None:
        """Scores of keys j0 + g0 .. + UJ - 1 into the tile (st), their maxima into tmax."""
        b, s = self.b, self.s
        (_, (_, k_rs), (_, k_cs)) = s.views[1]
        keys = [b.add(b.add(j0, g0), I64(u)) for u in range(self.uj)]
        last = I64(s.sk - 1)  # keys past Sk read the last key (their scores are -inf)
        kbase = [b.add(offs[1], b.mul(b.select(b.icmp_signed(">", j, last), last, j),
                                      I64(k_rs))) for j in keys]
        acc = [[entry_alloca(b, self.vty, f"s{u}_{h}") for h in range(2)]
               for u in range(self.uj)]
        for row in acc:
            for a in row:
                b.store(self.c(0.0), a)
        with for_range(b, I64(0), I64(s.d), "sd") as d:
            qv = [b.load(self.slot(self.qt, b.add(b.mul(d, I64(2)), I64(h))), typ=self.vty)
                  for h in range(2)]
            dk = b.mul(d, I64(k_cs))
            for u in range(self.uj):
                kv = self.splat(b.load(self.elem("k", b.add(kbase[u], dk)), typ=F32))
                for h in range(2):
                    b.store(self.fma(qv[h], kv, b.load(acc[u][h])), acc[u][h])
        for u, j in enumerate(keys):
            hidden = b.icmp_signed(">=", j, kend)
            for h in range(2):
                sc = self.masked(b.load(acc[u][h]), offs, rows[h], valid[h], j, hidden)
                b.store(sc, self.slot(self.st, b.add(b.mul(b.add(g0, I64(u)), I64(2)),
                                                     I64(h))))
                b.store(self.maxnum(b.load(tmax[h]), sc), tmax[h])

    def masked(self, sc: ir.Value, offs: list[ir.Value], rows: ir.Value, valid: ir.Value,
               j: ir.Value, hidden: ir.Value) -> ir.Value:
        """A vector of dot products of key j scaled and masked as the reference does."""
        b, s = self.b, self.s
        if s.scale != 1.0:
            sc = b.fmul(sc, self.c(s.scale))
        if s.mask:
            (_, (_, m_rs), (_, m_cs)) = s.views[3]
            jj = b.select(b.icmp_signed(">", j, I64(s.sk - 1)), I64(s.sk - 1), j)
            base = b.add(offs[3], b.mul(jj, I64(m_cs)))
            ty = F32 if s.mask == "add" else I8
            if m_rs == 0:  # one value for every row (a padding mask): one load
                mv = self.splat(b.load(self.elem("m", base, ty), typ=ty))
            else:
                at = b.add(self.splat(base), b.mul(rows, self.splat(I64(m_rs))))
                mv = self.gather("m", at, valid, ty)
            if s.mask == "add":
                sc = b.fadd(sc, mv)
            else:
                keep = b.icmp_unsigned("!=", mv,
                                       ir.Constant(ir.VectorType(I8, self.vw), [0] * self.vw))
                sc = b.select(keep, sc, self.c(s.fill))
        gone = self.splat(hidden)
        if s.causal:
            past = b.icmp_signed(">", self.splat(j), b.add(rows, self.splat(I64(s.offset))))
            gone = b.or_(gone, past)
        return b.select(gone, self.c(-math.inf), sc)

    def pv(self, offs: list[ir.Value], j0: ir.Value, nk: ir.Value, e0: int, ue: int,
           alpha: list[ir.Value]) -> None:
        """Output dims e0 .. e0 + ue - 1: o = o * a + sum over the tile's keys p[j] V[j]."""
        b, s = self.b, self.s
        (_, (_, v_rs), (_, v_cs)) = s.views[2]
        acc = [[entry_alloca(b, self.vty, f"o{u}_{h}") for h in range(2)] for u in range(ue)]
        for row in acc:
            for a in row:
                b.store(self.c(0.0), a)
        with for_range(b, I64(0), nk, "vj") as j:
            p = [b.load(self.slot(self.st, b.add(b.mul(j, I64(2)), I64(h))), typ=self.vty) for h in range(2)]
            vrow = b.add(offs[2], b.mul(b.add(j0, j), I64(v_rs)))
            for u in range(ue):
                vv = self.splat(b.load(self.elem("v", b.add(vrow, I64((e0 + u) * v_cs))), typ=F32))
                for h in range(2):
                    b.store(self.fma(p[h], vv, b.load(acc[u][h])), acc[u][h])
        for u in range(ue):
            for h in range(2):
                at = self.slot(self.ot, I64(2 * (e0 + u) + h))
                b.store(self.fma(b.load(at, typ=self.vty), alpha[h], b.load(acc[u][h])), at)

    def finish(self, row0: ir.Value, rows: list[ir.Value], valid: list[ir.Value], lsum: list,
               kend: ir.Value) -> None:
        """out[b, i0 + r, e] = o[e] / l for the block's valid rows; NaN where a V value
        the block skipped was not finite (bad[e] >= kend), and under the NaN guard 0 in
        rows whose every p is NaN -- or NaN where any V[:, e] is not finite (bad[e] >= 0),
        as 0 * V gives in the reference."""
        b, s = self.b, self.s
        dv = I64(s.dv)
        for h in range(2):
            lv = b.load(lsum[h])
            out_rows = b.mul(b.add(rows[h], self.splat(row0)), self.splat(dv))
            zero = None
            if s.nan_to_zero:  # the reference's p are all NaN there: its guard gives 0
                zero = b.fcmp_ordered("==", lv, self.c(0.0))  # every score -inf
                if s.nan_to_zero == 1:  # the IsNaN guard: a NaN row too (torch's: not)
                    zero = b.or_(zero, b.fcmp_unordered("uno", lv, lv))
            with for_range(b, I64(0), dv, "fe") as e:
                o = b.load(self.slot(self.ot, b.add(b.mul(e, I64(2)), I64(h))), typ=self.vty)
                y = b.fdiv(o, lv)
                if self.bad is not None:
                    bad = b.load(b.gep(self.bad, [e], inbounds=True, source_etype=I64), typ=I64)
                    nan = self.c(math.nan)
                    if zero is not None:
                        gone = b.select(b.icmp_signed(">=", bad, I64(0)), nan, self.c(0.0))
                        y = b.select(zero, gone, y)
                    y = b.select(b.icmp_signed(">=", bad, kend), nan, y)
                addrs = self.vgep("o", b.add(out_rows, self.splat(e)))
                intrinsic(b, f"llvm.masked.scatter.v{self.vw}f32.v{self.vw}p0", ir.VoidType(),
                          [y, addrs, I32(4), valid[h]])
