"""A GEMM call's epilogue kernel computed in packed.py's store, while the result is in
registers.

A library call's epilogue (kernel IR LibraryCall.epilogue, autoclust/kernel/epilogues.py)
is an elementwise kernel that alone reads the call's result t: BERT's and ViT's bias and
exact GELU, ConvNeXt's GELU and its layer-scale and residual Add, Whisper's GELU. Run after
the call, it reads t back from memory and writes its own result: 0.3-0.6 ns an element on
the Sapphire Rapids class VM (ConvNeXt-tiny's 18 GELU kernels took 4.7 ms of ~47).
OpenVINO applies such epilogues in its GEMMs. Here packed.py's kernel evaluates the
epilogue's store expressions on each result vector instead of storing t:

    t  = alpha * acc + beta * bias                (the GEMM's element, 16 columns at once)
    y  = f(t, r[...], b[...], ...)                (each store of the epilogue kernel)

with the same primitives, on vectors, as the epilogue kernel's own code (mathops,
mathlib: exact erf, no fast-math flags), so results match onnxruntime as the unfused plan
does. t itself is written only between K blocks (partial sums); the last block writes the
epilogue's outputs alone.

An epilogue is taken (`plan`) when every value it reads is, at output element (row, col)
of the [M, N] result, at offset row_offset(row) + c * col with c 0 or 1 (an operand of the
result's shape, a bias row, a per-row scalar, a broadcast over leading dims): the kernel's
loop dims must split at N (each dim's stride a multiple of N, or dividing N). Loads are
float32, plain (no gathers, clamps); the ops are the float ones the vector code emits
(vectorize.FLOAT_OPS, selects, compares); stores are float32 and no stored buffer is read.
Anything else keeps the epilogue a kernel after the call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence

import numpy as np
from autoclust.backends.cpu import mathops, vectorize
from autoclust.backends.cpu.llvm_types import constant
from autoclust.backends.cpu.loops import splat, vector_load, vector_store
from llvmlite import ir

from autoclust.kernel import ir as kir
from autoclust.kernel.epilogues import is_flat, reads_halves
from autoclust.kernel.indexing import contiguous_strides
from autoclust.kernel.passes import renumber

I64 = ir.IntType(64)
F32 = ir.FloatType()
OPS = vectorize.FLOAT_OPS | {"select"}


@dataclasses.dataclass(frozen=True)
class Operand:
    """Where a load reads, at output element (row, col): slot's element
    const + sum(coeff * ((row * N) // stride % size)) + col_stride * col."""

    slot: int                                   # the buffer's renumbered id
    const: int
    rows: tuple[tuple[int, int, int], ...]      # (stride, size, coeff) of the row dims
    col_stride: int                             # 0 (one value per row) or 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """An epilogue packed.py's kernel computes in its store (see the module doc)."""

    kernel: kir.Kernel                # renumbered: buffers 0..n-1 (passes.renumber)
    t: int                            # the call's result, renumbered
    inputs: tuple[int, ...]           # buffers it only reads (original ids): extra inputs
    outputs: tuple[int, ...]          # buffers it writes (original ids)
    slots: tuple[int, ...]            # renumbered id of each input, then each output
    operands: dict                    # kir.Load -> Operand (t's loads excluded)
    sizes: tuple[int, ...]            # elements of each input, then each output
    # the result's halves read (a SwiGLU, kernel/epilogues.reads_halves): packed.py packs
    # the weights' columns in pairs of blocks, half a panel of each half (pair_order)
    pairs: bool = False

    @property
    def key(self) -> str:
        """Digest of what the generated code depends on (packed.code_key)."""
        text = repr((self.kernel.shape, self.kernel.stores, self.t, self.slots, self.pairs))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(k: kir.Kernel, t: int, buffers: dict[int, kir.Buffer], n: int, panel: int
         ) -> Plan | str:
    """The Plan of epilogue kernel k of a call whose result t is [M, n], or why not
    (`panel`: packed.py's panel width, which a SwiGLU's halves must fill by halves)."""
    if k.reductions or k.n_inner or not all(isinstance(d, int) for d in k.shape):
        return "a reduction or symbolic dims"
    canon, order = renumber(k)
    ct = order.index(t) if t in order else -1
    pairs = reads_halves(canon, ct, tuple(buffers[t].shape))
    if pairs and (n // 2) % (panel // 2):
        return f"halves of {n // 2} columns, not a multiple of {panel // 2}"
    n = n // 2 if pairs else n
    stored = {s.buf for s in canon.stores}
    loaded: dict[int, None] = {}
    operands: dict = {}
    for e in kir.walk([s.expr for s in canon.stores]):
        why = _unsupported(e)
        if why:
            return why
        if not isinstance(e, kir.Load):
            continue
        if e.buf == ct:
            if not pairs and not is_flat(e.index, canon):
                return "the result read out of order"
            continue
        if e.buf in stored:
            return "a stored buffer is read"
        where = _operand(e, canon.shape, n)
        if where is None:
            return f"a {list(buffers[order[e.buf]].shape)} operand not at row + column"
        operands[e] = where
        loaded.setdefault(e.buf)
    if any(buffers[order[s]].dtype != "float32" for s in stored):
        return "a result that is not float32"
    slots = tuple(loaded) + tuple(dict.fromkeys(s.buf for s in canon.stores))
    ins, outs = tuple(order[s] for s in loaded), tuple(order[s] for s in slots[len(loaded):])
    sizes = tuple(math.prod(buffers[b].shape) for b in ins + outs)
    return Plan(canon, ct, ins, outs, slots, operands, sizes, pairs)


def _unsupported(e: kir.Expr) -> str:
    if isinstance(e, kir.Load):
        return "" if e.dtype == "float32" and not e.dyn and not e.clamps else \
            f"a {e.dtype} load or a gather"
    if isinstance(e, kir.Const):
        return "" if e.dtype in ("float32", "bool") else f"a {e.dtype} constant"
    if isinstance(e, kir.Op):
        if e.name not in OPS or e.dtype not in ("float32", "bool"):
            return f"op {e.name} on {e.dtype}"
        dtypes = {a.dtype for a in (e.args[1:] if e.name == "select" else e.args)}
        return "" if dtypes <= {"float32"} else f"op {e.name} on {sorted(dtypes)}"
    return f"a {type(e).__name__}"


def _operand(e: kir.Load, shape: tuple[int, ...], n: int) -> Operand | None:
    """Where e reads as row_offset(row) + c * col (Operand), or None."""
    rows, col = [], None
    for stride, size, coeff in zip(contiguous_strides(shape), shape, e.index.coeffs):
        if size == 1:
            continue
        if stride % n == 0:               # a row dim
            if coeff:
                rows.append((stride, size, coeff))
            continue
        if n % stride:
            return None
        if stride * size > n and (stride * size) % n == 0:  # straddles rows: both parts
            if coeff:
                rows.append((stride, size, coeff))
        elif n % (stride * size):
            return None
        c, r = divmod(coeff, stride)      # the col part must be c * col, one c for all dims
        if r or (col is not None and c != col):
            return None
        col = c
    col = col or 0
    return Operand(e.buf, e.index.const, tuple(rows), col) if col in (0, 1) else None


def pair_order(n: int, panel: int) -> np.ndarray:
    """The weights' column order for a Plan with `pairs` (n columns, two halves): each
    panel holds panel / 2 columns of the first half, then the same of the second, so a
    row tile's vectors hold gate and up for the same output columns."""
    half, block = n // 2, panel // 2
    starts = np.arange(0, half, block)
    return np.concatenate([np.r_[j:j + block, half + j:half + j + block] for j in starts])


class Emitter:
    """Emits a Plan's stores for one result vector (16 columns of one row) in packed.py's
    kernel. `ptr`: the pointer of each renumbered slot; `lanes`: the vector width."""

    def __init__(self, b: ir.IRBuilder, p: Plan, n: int, ptr: dict[int, ir.Value],
                 lanes: int):
        self.b, self.p, self.n, self.ptr, self.lanes = b, p, n, ptr, lanes
        self.vty = ir.VectorType(F32, lanes)
        self.math = mathops.MathOps(b.module)

    def row_offsets(self, row: ir.Value) -> dict:
        """Each operand's offset at `row` (computed once a row; shared by equal ones)."""
        b, out = self.b, {}
        for where in dict.fromkeys(self.p.operands.values()):
            off: ir.Value = I64(where.const)
            for stride, size, coeff in where.rows:
                q = b.udiv(row, I64(stride // self.n)) if stride % self.n == 0 else \
                    b.mul(row, I64(self.n // stride))
                off = b.add(off, b.mul(b.urem(q, I64(size)), I64(coeff)))
            out[where] = off
        return out

    def store(self, t: tuple[ir.Value, ...], row: ir.Value, col: ir.Value, offsets: dict,
              mask: ir.Value | None) -> None:
        """The epilogue's stores at (row, col .. col + lanes - 1); t: the GEMM's vector
        there, or with `pairs` its two halves' vectors (gate, up)."""
        memo: dict = {}
        flat = self.b.add(self.b.mul(row, I64(self.n)), col)
        for s in self.p.kernel.stores:
            v = self._value(s.expr, t, col, offsets, mask, memo)
            at = self.b.gep(self.ptr[s.buf], [flat], source_etype=F32)
            vector_store(self.b, v, at, mask)

    def _value(self, e: kir.Expr, t: tuple[ir.Value, ...], col: ir.Value, offsets: dict,
               mask: ir.Value | None, memo: dict) -> ir.Value:
        got = memo.get(e)
        if got is not None:
            return got
        b = self.b
        if isinstance(e, kir.Const):
            v = splat(b, constant(e.value, e.dtype), self.lanes)
        elif isinstance(e, kir.Load):
            v = t[bool(e.index.const)] if e.buf == self.p.t else \
                self._load(e, col, offsets, mask)
        else:
            args = [self._value(a, t, col, offsets, mask, memo) for a in e.args]
            dtype = e.args[-1].dtype if e.name == "select" else e.args[0].dtype
            v = self.math.primitive(b, e.name, args, dtype, ())
        memo[e] = v
        return v

    def _load(self, e: kir.Load, col: ir.Value, offsets: dict, mask: ir.Value | None
              ) -> ir.Value:
        b = self.b
        where = self.p.operands[e]
        off = offsets[where]
        if where.col_stride == 0:
            at = b.gep(self.ptr[e.buf], [off], source_etype=F32)
            return splat(b, b.load(at, typ=F32), self.lanes)
        at = b.gep(self.ptr[e.buf], [b.add(off, col)], source_etype=F32)
        return vector_load(b, at, self.vty, mask)


@dataclasses.dataclass
class Inline:
    """A call whose epilogue packed.py's GEMM can compute (library.make_call_for): every
    implementation of the call then runs the epilogue, so the measurements and in-plan
    trials between them time the same work. A plan calls each with the call's inputs
    plus the Plan's and writes the call's result plus the Plan's outputs; the libraries'
    runs (then_kernel) run the epilogue kernel after the call: `after` on the plan's
    buffers, or `probe` on buffers of its own when timed alone with the call's own
    inputs and outputs (choice.measure)."""

    plan: Plan
    after: Callable[[], None]
    probe: Callable[[], None]
    n_in: int

    def then_kernel(self, build: Callable[..., Callable]) -> Callable[..., Callable]:
        """`build` (a library's builder of run(inputs, outputs)) with the epilogue kernel
        after each run."""
        n_in, after, probe = self.n_in, self.after, self.probe

        def make(**kw) -> Callable:
            run = build(**kw)

            def with_epilogue(inputs: Sequence, outputs: Sequence) -> None:
                run(inputs[:n_in], outputs[:1])
                (after if len(outputs) > 1 else probe)()

            if hasattr(run, "packed"):  # oneDNN's weights not packed yet: library.py's
                with_epilogue.packed = run.packed  # type: ignore[attr-defined]  # _packing_later
            return with_epilogue

        return make
