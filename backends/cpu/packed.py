"""Our own large GEMM over prepacked constant weights, prefetching the next weight panel.

A transformer's GEMMs read their weights once a run: BERT-base streams 340 MB of them,
far more than the 2 MB of L2 a core has. Alone in a loop a GEMM finds its weights in
cache; in a plan they come from L3 or memory. Measured on the Sapphire Rapids class VM
(2 threads, one weight matrix called in a loop against twelve called in turn): MLAS's
[128, 768] x [768, 3072] went 1.83 -> 2.16 ms, [49, 768] x [768, 3072] 0.83 -> 1.14 ms.
OpenVINO's GEMMs lose the same. The loss is the weights' first read: a GEMM's kernel
uses each weight row for one block of A's rows from L2, but the first block waits for
the row from memory at ~30 GB/s a core, three times slower than its FMAs consume it.

This kernel packs B (a constant: MatMul's weights, Gemm's) once into panels of NP = 32
columns, [panel][k][32] floats, and while the first two row tiles of a panel run it
prefetches the next panel into L2 (`llvm.prefetch`, two lines per k), so every panel but
a chunk's first is already there when its tiles start. The same shapes in turn, against
MLAS: 1.99 against 2.16 ms, 0.91 against 1.14 (docs/performance.md, twenty-seventh
session). Which of MLAS, oneDNN and this serves a call is measured in the plan
(inplan.py), call by call and then as a whole plan, as between the two libraries.

    chunk c (threads claim chunks): rows of M block c // PC, panels of group c % PC
      for each K block (KC <= 768 rows of B: A's block stays in L2):
        for each panel p of the group:
          for each tile of <= RB rows (RB = 14: 28 accumulators of 16 floats):
            acc = 0, or C's values after the first K block
            for k in the K block:   b0, b1 = Bp[p, k, 0:16], [16:32]
                                    acc[r][u] += A[row r, k] * b_u
                                    (tiles 0, 1: prefetch lines of Bp[p + 1])
            C = acc, at the last K block alpha * acc + beta * bias
    the last panel's columns past N are masked (its packed columns are zeros)

Sizes are concrete (one object code per shape: rows, K, N, bias kind, alpha and beta);
the packed weights belong to the call. float32 only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
from autoclust.backends.cpu import jit, pool
from autoclust.backends.cpu import packed_epilogue as epi
from autoclust.backends.cpu.jit import has_avx512
from autoclust.backends.cpu.loops import (
    entry_alloca,
    for_range,
    intrinsic,
    kernel_entry,
    splat,
    vector_load,
    vector_store,
)
from llvmlite import ir

from autoclust.kernel import ir as kir
from autoclust.runtime import disk_cache as cache

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
NP = 32            # columns of a packed panel: two 512-bit vectors (four 256-bit on AVX2)
KC = 768           # rows of B per K block: an A block of 128 x 768 floats is 384 KB
A_BLOCK = 1 << 20  # bytes of A per M block (L2 is 2 MB a core here)
SMALL_A_BLOCK = 1 << 17  # the same where B is at most SMALL_B bytes (m_block_rows)
SMALL_B = 1 << 20
PREFETCH_TILES = 2  # tiles of a panel that prefetch the next one
MIN_FLOPS = 2e7    # below: call overhead and the unprefetched first panel dominate
# The pool of the plan's split kernels under --cpu_allow_spinning (pool.py), while a plan
# run keeps its helpers polling (its LINGER word): a chunk never waits for a futex wake-up
# (A/B against --cpu_packed_gemm=false: LLaMA 1.05 on it, 0.96-0.98 on the normal pool;
# Qwen2 1.05, against 0.87-1.01). Otherwise -- the flag off, a plan calling oneDNN, whose
# OpenMP threads starve SCHED_IDLE helpers -- the normal-priority pool's helpers.
POLLING = True
# Which calls it takes, measured in whole plans (one process, A/B against
# --cpu_packed_gemm=false, 2 threads): it wins where the weights' first read dominates,
# few rows (K blocks included, in one chunk a thread: see panel_group). Past 512 rows
# (Whisper's 1500 frames, ConvNeXt's 3136 and 784 positions) it won alone in turn
# (Whisper's [1500, 384] x [384, 1536] 6.6 against 7.2 ms) but the plans read 1-2% slower
# than with those calls left to MLAS (ConvNeXt 1.029 against 1.044, Whisper 1.005
# against 1.023, two A/Bs each). There it runs level with MLAS (320-340 GFLOP/s), so it
# wins where it computes the call's epilogue in its store: the pass over the result that
# it saves (a GELU over [3136, 384] read and written again, ~0.3 ns an element in this VM)
# is worth more than the rows' cache effects. With an epilogue inside it takes up to
# MAX_ROWS_EPILOGUE rows (A/B against 512, one process, 12 rounds: Swin 1.094 and 1.081,
# ConvNeXt 1.021, Whisper 0.990 and 1.022).
MAX_ROWS = 512
MAX_ROWS_EPILOGUE = 4096


def rows_per_tile() -> int:
    """RB: 14 rows x 2 vectors = 28 accumulators of AVX-512's 32 registers; AVX2 has 16
    registers of 8 floats, a panel is 4 of them there: 3 rows x 4 = 12."""
    return 14 if has_avx512() else 3


@dataclasses.dataclass(frozen=True)
class PackedSpec:
    """C[m, n] = alpha * A[m, k] @ B[k, n] + beta * bias (bias: "", "row" [n], "scalar")."""

    m: int
    k: int
    n: int
    bias: str = ""
    alpha: float = 1.0
    beta: float = 1.0

    @property
    def panels(self) -> int:
        return -(-self.n // NP)

    def kblocks(self) -> list[tuple[int, int]]:
        count = -(-self.k // KC)
        step = -(-self.k // count)
        return [(s, min(self.k, s + step)) for s in range(0, self.k, step)]

    def mblocks(self) -> list[tuple[int, int]]:
        step = self.m_block_rows()
        return [(s, min(self.m, s + step)) for s in range(0, self.m, step)]

    def m_block_rows(self) -> int:
        """Rows of an M block: its A block (rows x K block) within A_BLOCK bytes, or
        SMALL_A_BLOCK where B is small (SMALL_B): re-reading B per M block costs little
        then, and a smaller A block stays in L2 beside the C it writes."""
        kc = self.kblocks()[0][1]
        rb = rows_per_tile()
        limit = SMALL_A_BLOCK if 4 * self.k * self.n <= SMALL_B else A_BLOCK
        return max(rb, limit // (4 * kc) // rb * rb)

    def panel_group(self, threads: int) -> int:
        """Panels per chunk: at least 4 chunks a thread over all M blocks (claimed
        dynamically: a helper that starts late takes fewer), at least 2 panels each (a
        chunk's first panel is not prefetched). With K blocks, one chunk a thread: each
        chunk reads all of A once a K block, and A is then larger than L2 (197 x 3072
        floats, 2.4 MB). Alone, twelve weights in turn, against MLAS: [197, 3072] x [3072,
        768] 3.40 against 3.59 ms, [128, 2048] x [2048, 512] 1.02 against 1.20; with 4
        chunks a thread 4.21 against 3.60 and 1.09 against 1.21 (in ViT's plan trial
        4.4 against 2.9)."""
        want = (1 if len(self.kblocks()) > 1 else 4) * max(threads, 1)
        per_m = max(1, -(-want // len(self.mblocks())))
        return max(2, -(-self.panels // per_m))

    def chunks(self, threads: int) -> int:
        return len(self.mblocks()) * -(-self.panels // self.panel_group(threads))


def spec_for(op: str, attrs: dict, in_types: list, out_types: list,
             constants: dict[int, np.ndarray], epilogue: bool = False) -> PackedSpec | None:
    """The PackedSpec of a MatMul or Gemm call with a constant 2-D B, else None;
    `epilogue`: one computed in the store (more rows: MAX_ROWS_EPILOGUE)."""
    if op not in ("MatMul", "Gemm") or 1 not in constants or len(out_types) != 1:
        return None
    types = [t for t in in_types if t is not None] + list(out_types)
    if any(np.dtype(t[0]) != np.float32 for t in types):
        return None
    (_, sa), (_, sb) = in_types[0], in_types[1]
    if len(sb) != 2 or len(sa) < 2 or attrs.get("transA", 0) or 0 in sa or 0 in sb:
        return None
    if op == "Gemm" and len(sa) != 2:
        return None
    k, n = (sb[1], sb[0]) if attrs.get("transB", 0) else sb
    m = math.prod(sa[:-1])
    if sa[-1] != k or 2 * m * k * n < MIN_FLOPS or \
            m > (MAX_ROWS_EPILOGUE if epilogue else MAX_ROWS):
        return None
    bias, alpha, beta = "", float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if op == "Gemm" and len(in_types) > 2 and in_types[2] is not None:
        shape = tuple(in_types[2][1])
        if math.prod(shape) == 1:
            bias = "scalar"
        elif shape in ((n,), (1, n)):
            bias = "row"
        else:
            return None  # a full C: MLAS's
    return PackedSpec(m, k, n, bias, alpha, beta)


def builder(op: str, attrs: dict, in_types: list, out_types: list, threads: int,
            constants: dict[int, np.ndarray], layouts: tuple,
            epilogue: epi.Plan | None = None) -> Callable[[], Callable[..., None]] | None:
    """library.make_call's builder of this GEMM's run function for a call (dense operands,
    spec_for's calls), or None. With `epilogue` the run computes it in its store (see
    runner)."""
    if any(lay is not None for lay in layouts):
        return None
    spec = spec_for(op, attrs, in_types, out_types, constants, epilogue is not None)
    if spec is None:
        return None
    bias = constants.get(2) if spec.bias else None
    trans_b = bool(attrs.get("transB", 0))
    n_in = len(in_types)
    return lambda: runner(spec, constants[1], trans_b, max(threads, 1), bias, epilogue, n_in)


def inline_epilogue(call: kir.LibraryCall, by_id: dict[int, kir.Buffer],
                    after: Callable[[], None] | None, probe: Callable[[], None] | None,
                    in_types: list, out_types: list, consts: dict[int, np.ndarray]
                    ) -> epi.Inline | None:
    """The call's epilogue computed in this GEMM's store (library.make_call_for; `after`:
    the epilogue kernel's step, `probe`: the same on buffers of its own), when this GEMM
    takes the call (spec_for) and the epilogue (packed_epilogue.plan); else None."""
    if call.epilogue is None or after is None or probe is None or \
            any(v is not None for v in call.views):
        return None
    flat = list(in_types)
    if call.op == "Gemm" and len(flat[0][1]) > 2:  # as library._flattened_gemm passes it on
        flat[0] = (flat[0][0], (math.prod(flat[0][1][:-1]), flat[0][1][-1]))
    spec = spec_for(call.op, dict(call.attrs), flat, out_types, consts, epilogue=True)
    if spec is None:
        return None
    plan = epi.plan(call.epilogue, call.outputs[0], by_id, spec.n, NP)
    if isinstance(plan, str) or plan.pairs and (spec.bias or spec.alpha != 1.0):
        return None
    return epi.Inline(plan, after, probe, len(call.inputs))


def pack(b: np.ndarray, trans_b: bool = False, order: np.ndarray | None = None
         ) -> np.ndarray:
    """B [k, n] (or [n, k] with trans_b) as [panels, k, NP] float32, 64-byte aligned,
    the columns past n zero; `order`: B's columns in this order (packed_epilogue's
    pair_order)."""
    w = np.asarray(b, np.float32)
    if trans_b:
        w = w.T
    if order is not None:
        w = w[:, order]
    k, n = w.shape
    panels = -(-n // NP)
    raw = np.zeros(panels * k * NP + 16, np.float32)
    skip = (-raw.ctypes.data // 4) % 16
    out = raw[skip:skip + panels * k * NP].reshape(panels, k, NP)
    full = n // NP
    out[:full] = w[:, :full * NP].reshape(k, full, NP).transpose(1, 0, 2)
    if n % NP:
        out[full, :, :n % NP] = w[:, full * NP:]
    return out


def code_key(spec: PackedSpec, threads: int, epilogue: epi.Plan | None = None) -> str:
    return f"packed|{spec}|{rows_per_tile()}|{spec.panel_group(threads)}" + \
        (f"|epilogue {epilogue.key}" if epilogue is not None else "")


KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
# code key -> (engine, function address): the calls of one shape (BERT-base's twelve layers)
# share one loaded kernel instead of an engine each (1.4 ms to load one)
_LOADED: dict[str, tuple[object, int]] = {}
_LOADED_LOCK = threading.Lock()


def _kernel(spec: PackedSpec, threads: int, epilogue: epi.Plan | None = None
            ) -> tuple[object, int]:
    """(engine, address) of the shape's kernel: loaded once per process, its object code
    compiled or found in memory or the sessions' --cache_dir (pool.cache_dir())."""
    key = cache.make_key(code_key(spec, threads, epilogue), jit.version_key())
    sym = f"p_{key[:20]}"

    def build() -> str:
        module = ir.Module(name="autoclust_packed")
        emit(module, sym, spec, threads, epilogue)
        return str(module)

    # found in memory at once; also stores it in a --cache_dir met since
    obj = jit.kernel_object(key, build, pool.cache_dir(), False)[0]
    with _LOADED_LOCK:
        hit = _LOADED.get(key)
    if hit is not None:
        return hit
    engine, addrs = jit.load_object(obj, [sym])
    with _LOADED_LOCK:
        return _LOADED.setdefault(key, (engine, addrs[sym]))


def runner(spec: PackedSpec, b: np.ndarray, trans_b: bool, threads: int,
           bias: np.ndarray | None = None, epilogue: epi.Plan | None = None, n_in: int = 2
           ) -> Callable[[Sequence[np.ndarray | None], Sequence[np.ndarray]], None]:
    """run(inputs, outputs) of the call: its kernel (_kernel) and B packed now; inputs are
    A, B (unused: packed here) and Gemm's bias unless `bias` (a constant one) is given,
    outputs C (C-contiguous, as LibraryFn passes them).

    With `epilogue`, a plan calls it with the epilogue's inputs after the call's
    (`n_in`) and its outputs after C: C is then written only as partial sums between K
    blocks. Called with the call's own inputs and outputs alone (choice.measure, timing
    it), the epilogue writes buffers of its own."""
    engine, fn = _kernel(spec, threads, epilogue)
    pairs = epilogue is not None and epilogue.pairs
    packed = pack(b, trans_b, epi.pair_order(spec.n, NP) if pairs else None)
    kernel = KERNEL(fn)
    polling = pool.get(threads, polling=True) if threads > 1 and POLLING else None
    plain = pool.get(threads) if threads > 1 else None
    lingering = polling.state if polling is not None else np.zeros(pool.STATE_WORDS, np.int64)
    count = spec.chunks(threads)
    bounds = np.stack([np.arange(count), np.arange(1, count + 1)], 1).astype(np.int64)
    extra = (len(epilogue.slots) if epilogue is not None else 0)
    bufs = (ctypes.c_void_p * (4 + extra))()
    fixed = None if bias is None else np.ascontiguousarray(bias, np.float32).reshape(-1)
    last: list = [None]
    own: list = []  # the epilogue's buffers when timed alone

    def operands(inputs: Sequence, outputs: Sequence) -> tuple:
        if epilogue is None:
            return ()
        if len(outputs) > 1:
            return tuple(inputs[n_in:]) + tuple(outputs[1:])
        if not own:
            own.extend(np.zeros(size, np.float32) for size in epilogue.sizes)
        return tuple(own)

    def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        a = inputs[0] if inputs[0].flags.c_contiguous else np.ascontiguousarray(inputs[0])
        c = (() if not spec.bias else (fixed,) if fixed is not None else
             (np.ascontiguousarray(inputs[2]),))
        arrays = (a, packed) + c + (outputs[0],) + operands(inputs, outputs)
        ptrs = tuple(x.ctypes.data for x in arrays)
        if ptrs != last[0]:
            for j, at in enumerate(ptrs):
                bufs[j] = at
            last[0] = ptrs
        workers = polling if lingering[pool.LINGER] > 0 else plain
        if workers is None:
            kernel(ctypes.addressof(bufs), 0, count)
        else:
            workers.run(fn, ctypes.addressof(bufs), bounds)

    run.keep = (engine, packed, fixed, own)  # type: ignore[attr-defined]  # alive while run is
    return run


def emit(module: ir.Module, name: str, spec: PackedSpec, threads: int,
         epilogue: epi.Plan | None = None) -> None:
    """`void name(ptr bufs, i64 start, i64 stop)` over chunks [start, stop) (chunks()):
    bufs = A, packed B, (bias,) C, then the epilogue's inputs and outputs."""
    names = ["a", "bp"] + (["bias"] if spec.bias else []) + ["c"]
    slots = [f"e{s}" for s in epilogue.slots] if epilogue is not None else []
    b, ptr, fn = kernel_entry(module, name, names + slots, exact_division=True)
    _Emitter(b, spec, ptr, spec.panel_group(threads), epilogue).chunks(fn.args[1], fn.args[2])
    b.ret_void()


class _Emitter:
    def __init__(self, b: ir.IRBuilder, spec: PackedSpec, ptr: dict, group: int,
                 epilogue: epi.Plan | None = None):
        self.b, self.spec, self.ptr, self.group = b, spec, ptr, group
        self.vw = 16 if has_avx512() else 8
        self.u = NP // self.vw
        self.vty = ir.VectorType(F32, self.vw)
        self.rb = rows_per_tile()
        self.acc = entry_alloca(b, self.vty, "acc", count=self.rb * self.u)
        self.epi = None if epilogue is None else epi.Emitter(
            b, epilogue, spec.n // 2 if epilogue.pairs else spec.n,
            {s: ptr[f"e{s}"] for s in epilogue.slots}, self.vw)
        self.pairs = epilogue is not None and epilogue.pairs

    def chunks(self, start: ir.Value, stop: ir.Value) -> None:
        b, spec = self.b, self.spec
        per_m = -(-spec.panels // self.group)
        with for_range(b, start, stop, "c") as c:
            mb = b.sdiv(c, I64(per_m))
            g = b.srem(c, I64(per_m))
            p0 = b.mul(g, I64(self.group))
            p1 = b.select(b.icmp_signed("<", b.add(p0, I64(self.group)), I64(spec.panels)),
                          b.add(p0, I64(self.group)), I64(spec.panels))
            for i, (m0, m1) in enumerate(spec.mblocks()):
                with b.if_then(b.icmp_signed("==", mb, I64(i))):
                    for kb in spec.kblocks():
                        with for_range(b, p0, p1, "p") as p:
                            # the block prefetched: panel p + 1's, after the group's last
                            # panel the group's first at the next K block
                            later = b.icmp_signed("<", b.add(p, I64(1)), p1)
                            nxt = b.select(later, b.add(p, I64(1)), p0)
                            k_next = b.select(later, I64(kb[0]), I64(kb[1]))
                            self.panel(p, m0, m1, kb, b.add(b.mul(nxt, I64(spec.k * NP)),
                                                            b.mul(k_next, I64(NP))))

    def panel(self, p: ir.Value, m0: int, m1: int, kb: tuple[int, int], nxt: ir.Value
              ) -> None:
        """Every tile of rows [m0, m1) for panel p, K block kb; `nxt`: the element offset
        in the packed B of the block to prefetch."""
        b = self.b
        count = -(-(m1 - m0) // self.rb)
        rows = -(-(m1 - m0) // count)         # balanced: 49 rows are 13 + 13 + 13 + 10
        full, rest = (m1 - m0) // rows, (m1 - m0) % rows
        pf = min(PREFETCH_TILES, count)
        for t in range(min(pf, full)):          # the prefetching tiles, each its own code
            self.tile(p, I64(m0 + t * rows), rows, kb, (nxt, t, pf))
        if full > pf:
            with for_range(b, I64(pf), I64(full), "t") as t:
                self.tile(p, b.add(I64(m0), b.mul(t, I64(rows))), rows, kb, None)
        if rest:
            self.tile(p, I64(m0 + full * rows), rest, kb, (nxt, full, pf) if full < pf else None)

    def tile(self, p: ir.Value, r0: ir.Value, rows: int, kb: tuple[int, int],
             prefetch: tuple[ir.Value, int, int] | None) -> None:
        b, spec, vty, acc = self.b, self.spec, self.vty, self.acc
        k0, k1 = kb
        first, last = k0 == 0, k1 == spec.k
        col0 = b.mul(p, I64(NP))
        mask = self._mask(col0)
        for j in range(rows):
            for u in range(self.u):
                slot = b.gep(acc, [I64(j * self.u + u)], source_etype=vty)
                b.store(ir.Constant(vty, [0.0] * self.vw) if first else
                        self._load_c(b.add(r0, I64(j)), col0, u, mask), slot)
        base = b.add(b.mul(p, I64(spec.k * NP)), I64(k0 * NP))
        with for_range(b, I64(0), I64(k1 - k0), "k") as k:
            at = b.add(base, b.mul(k, I64(NP)))
            bv = [b.load(b.gep(self.ptr["bp"], [b.add(at, I64(u * self.vw))], source_etype=F32),
                         typ=vty, align=4 * self.vw) for u in range(self.u)]
            if prefetch is not None:
                self._prefetch(k, k1 - k0, *prefetch)
            for j in range(rows):
                a_at = b.add(b.mul(b.add(r0, I64(j)), I64(spec.k)), b.add(k, I64(k0)))
                av = splat(b, b.load(b.gep(self.ptr["a"], [a_at], source_etype=F32), typ=F32),
                           self.vw)
                for u in range(self.u):
                    slot = b.gep(acc, [I64(j * self.u + u)], source_etype=vty)
                    b.store(intrinsic(b, f"llvm.fma.v{self.vw}f32", vty,
                                      [av, bv[u], b.load(slot, typ=vty)]), slot)
        for j in range(rows):
            row = b.add(r0, I64(j))
            offsets = self.epi.row_offsets(row) if last and self.epi is not None else None
            vs = [b.load(b.gep(acc, [I64(j * self.u + u)], source_etype=vty), typ=vty)
                  for u in range(self.u)]
            if offsets is None:
                for u, v in enumerate(vs):
                    self._store_c(self._finish(v, col0, u, mask) if last else v,
                                  row, col0, u, mask)
            elif self.pairs:  # vectors u and u + U/2: the same output columns' gate, up
                half = self.u // 2
                for u in range(half):
                    self.epi.store((vs[u], vs[u + half]), row,
                                   b.add(b.mul(p, I64(NP // 2)), I64(u * self.vw)), offsets,
                                   None)
            else:  # the epilogue's outputs instead of C
                for u, v in enumerate(vs):
                    self.epi.store((self._finish(v, col0, u, mask),), row,
                                   b.add(col0, I64(u * self.vw)), offsets,
                                   None if mask is None else mask[u])

    def _prefetch(self, k: ir.Value, kc: int, nxt: ir.Value, t: int, tiles: int) -> None:
        """Tile t of `tiles` prefetches its share of the next block's 2 * kc lines (kc
        rows of a panel): line t * kc * per + k * per + q."""
        b = self.b
        lines_per_k = -(-(NP * 4 // 64) // tiles)
        for q in range(lines_per_k):
            line = b.add(I64(t * kc * lines_per_k + q), b.mul(k, I64(lines_per_k)))
            at = b.gep(self.ptr["bp"], [b.add(nxt, b.mul(line, I64(16)))], source_etype=F32)
            intrinsic(b, "llvm.prefetch.p0", ir.VoidType(), [at, I32(0), I32(2), I32(1)])

    def _mask(self, col0: ir.Value) -> list[ir.Value] | None:
        """Per vector of the panel, its lanes inside N (None: N a multiple of NP)."""
        if self.spec.n % NP == 0:
            return None
        b = self.b
        lanes = ir.Constant(ir.VectorType(I64, self.vw), list(range(self.vw)))
        out = []
        for u in range(self.u):
            cols = b.add(splat(b, b.add(col0, I64(u * self.vw)), self.vw), lanes)
            out.append(b.icmp_signed("<", cols, splat(b, I64(self.spec.n), self.vw)))
        return out

    def _c_ptr(self, row: ir.Value, col0: ir.Value, u: int) -> ir.Value:
        b = self.b
        at = b.add(b.mul(row, I64(self.spec.n)), b.add(col0, I64(u * self.vw)))
        return b.gep(self.ptr["c"], [at], source_etype=F32)

    def _load_c(self, row: ir.Value, col0: ir.Value, u: int, mask: list | None) -> ir.Value:
        return vector_load(self.b, self._c_ptr(row, col0, u), self.vty,
                           None if mask is None else mask[u])

    def _store_c(self, v: ir.Value, row: ir.Value, col0: ir.Value, u: int,
                 mask: list | None) -> None:
        vector_store(self.b, v, self._c_ptr(row, col0, u), None if mask is None else mask[u])

    def _finish(self, v: ir.Value, col0: ir.Value, u: int, mask: list | None) -> ir.Value:
        """alpha * acc + beta * bias, as Gemm computes it (MatMul: acc)."""
        b, spec, vty = self.b, self.spec, self.vty
        if spec.alpha != 1.0:
            v = b.fmul(v, splat(b, F32(spec.alpha), self.vw))
        if not spec.bias:
            return v
        if spec.bias == "scalar":
            bias = splat(b, b.load(self.ptr["bias"], typ=F32), self.vw)
        else:
            at = b.gep(self.ptr["bias"], [b.add(col0, I64(u * self.vw))], source_etype=F32)
            bias = vector_load(b, at, vty, None if mask is None else mask[u])
        if spec.beta != 1.0:
            bias = b.fmul(bias, splat(b, F32(spec.beta), self.vw))
        return b.fadd(v, bias)
