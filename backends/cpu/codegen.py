"""Kernel IR -> LLVM IR (llvmlite): one function per kernel, one module per cluster.

Every kernel k becomes `void k(ptr bufs, i64 start, i64 stop)` running outer loop
indices start <= i0 < stop (so threads can split i0), which loads its buffer pointers
from `bufs` and calls `k.body` whose pointer arguments are noalias (vectorization needs
it). Addresses are GEPs. Reductions accumulate in entry-block allocas (SROA turns them
into registers) with the `reassoc` fast-math flag so the loop vectorizer can split them.

Symbolic dims (autoclust/symbolic.py): an extent, index coefficient, clamp bound or integer
constant may be a polynomial in named dims (`768*seq`). The kernel then reads each dim's
value from `bufs` after its buffer pointers (in sorted name order: `code_dims`), computes
the polynomials once in the entry block and uses them like constants, so one compiled
function serves every value of the dims.

Speed: divisions by a row's reduced values carry `arcp` (one reciprocal per row instead
of a vdivps per element), every function prefers 512-bit
vectors, and a row kernel whose store shares a transcendental with a reduction phase
(softmax's exp) stores it in that phase and reloads it instead of recomputing it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from autoclust.backends.cpu import mathops, pieces, vectorize
from autoclust.backends.cpu.llvm_types import (
    COMPUTE,
    I8,
    I32,
    NARROW_INTS,
    PTR,
    STORAGE,
    constant,
    is_float,
)
from autoclust.backends.cpu.loops import I64, entry_alloca, for_nest, not_vectorized, splat
from llvmlite import ir

from autoclust import symbolic
from autoclust.kernel import ir as kir
from autoclust.symbolic import same

REDUCE_FLAGS = ("reassoc", "contract")
VECTOR_BITS = 512
# onnxruntime's ArgMax/ArgMin keep a row's NaN only when it comes first; float max/min
# phases propagate any NaN (the reference's NumPy semantics, which the spec names).
NAN_FIRST_KINDS = ("argmax", "argmin", "argmax_last", "argmin_last")


# --check_bounds: a kernel's pointer array holds one more pointer after its buffers, to an
# int64 guard array: [kind (1 load, 2 store, 0 none), buffer, element, lanes, then each
# buffer's element count]. An access outside its buffer writes the first four and returns.
GUARD_SIZES = 4


def guard_slot(k: kir.Kernel) -> int:
    """The pointer-array index of kernel k's guard (after its buffers, 0..n-1)."""
    return max(_buffers_of(k), default=-1) + 1


class KernelEmitter:
    """Emits the body of one kernel."""

    def __init__(self, module: ir.Module, kernel: kir.Kernel, fast_math: bool,
                 check_bounds: bool = False):
        self.module = module
        self.kernel = kernel
        self.check_bounds = check_bounds
        self.guard: ir.Value | None = None
        # No `contract`: an FMA of one op's a*b into the next op's + c skips the rounding
        # onnxruntime does between its kernels, and a row kernel recomputes expressions in
        # several phases: LogSoftmax(x * c) took max(x * c) rounded, then computed
        # fma(x, c, -max) = the product's rounding error (-178) where onnxruntime has 0.
        # The math library's polynomials use explicit llvm.fma. nnan/ninf stay off since
        # NaN and inf semantics are tested.
        self.flags = ("fast",) if fast_math else ()
        self.invariant: dict[int, bool] = {}
        self.bufs = sorted(_buffers_of(kernel))
        self.dtypes = buffer_dtypes(kernel)
        self.math = mathops.MathOps(module)
        self.dim_names = code_dims(kernel)
        self.dims: dict = {}  # Sym terms -> its i64 value (computed in the entry block)
        self.piece: pieces.Piece | None = None  # the innermost loop's piece (pieces.py)

    def emit(self) -> None:
        k = self.kernel
        n_dims = len(self.dim_names)
        n_ptrs = len(self.bufs) + self.check_bounds
        argtys = [PTR] * n_ptrs + [I64] * n_dims + [I64, I64]
        body = ir.Function(self.module, ir.FunctionType(ir.VoidType(), argtys), f"{k.name}.body")
        for a in body.args[:len(self.bufs)]:
            a.add_attribute("noalias")
        self.b = ir.IRBuilder(body.append_basic_block("entry"))
        self.ptr = dict(zip(self.bufs, body.args))
        if self.check_bounds:
            self.guard = body.args[len(self.bufs)]
        dim_args = dict(zip(self.dim_names, body.args[n_ptrs:n_ptrs + n_dims]))
        self._dim_values(dim_args)
        start, stop = body.args[-2], body.args[-1]
        n_outer = len(k.shape) - k.n_inner
        ranges = [(start, stop)] + [(_i64(0), self.int(d)) for d in k.shape[1:n_outer]]
        order = _loop_order(k)
        cuts = pieces.split(k, order[-1]) if len(order) > 1 else None
        if cuts is None:
            with for_nest(self.b, [ranges[d] for d in order], "o") as ivs:
                self.outer = [ivs[order.index(d)] for d in range(n_outer)]
                self._row()
        else:  # the innermost loop as consecutive pieces, each knowing its index range
            with for_nest(self.b, [ranges[d] for d in order[:-1]], "o") as ivs:
                for lo, hi in cuts:
                    with for_nest(self.b, [(_i64(lo), _i64(hi))], "p") as last:
                        self.outer = [(ivs + last)[order.index(d)] for d in range(n_outer)]
                        self.piece = (order[-1], lo, hi - 1)
                        self._row()
            self.piece = None
        self.b.ret_void()
        self._wrapper(body)

    def _wrapper(self, body: ir.Function) -> None:
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]),
                         self.kernel.name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        ptrs = []
        slots = self.bufs + ([guard_slot(self.kernel)] if self.check_bounds else [])
        for buf in slots:
            slot = b.gep(fn.args[0], [_i64(buf)], inbounds=True, source_etype=PTR)
            ptrs.append(b.load(slot, typ=PTR))
        # dims follow the buffer pointers (and the guard): executable.Executable._site
        n_slots = max(self.bufs, default=-1) + 1 + self.check_bounds
        for j in range(len(self.dim_names)):
            slot = b.gep(fn.args[0], [_i64(n_slots + j)], inbounds=True, source_etype=PTR)
            ptrs.append(b.load(slot, typ=I64))
        b.call(body, ptrs + [fn.args[1], fn.args[2]])
        b.ret_void()

    def _dim_values(self, args: dict) -> None:
        """Every symbolic int of the kernel, computed once in the entry block."""
        b = self.b
        for sym in symbolic.syms_in(_code_body(self.kernel)):
            total = None
            for mono, c in sym.terms:
                term = _i64(c)
                for name, p in mono:
                    for _ in range(p):
                        term = b.mul(term, args[name], flags=["nsw"])
                total = term if total is None else b.add(total, term, flags=["nsw"])
            self.dims[sym.terms] = total

    def int(self, x) -> ir.Value:
        """An i64 of an int or a symbolic dim."""
        return self.dims[x.terms] if symbolic.is_sym(x) else _i64(x)

    # ---- loop structure ---------------------------------------------------------------
    def _row(self) -> None:
        k = self.kernel
        self.inner_extents = k.shape[len(k.shape) - k.n_inner:]
        inner_ranges = [(_i64(0), self.int(d)) for d in self.inner_extents]
        self.reduced: list[ir.Value] = []
        if k.scan:
            self._scan(inner_ranges)
            return
        self.stash = plan_stash(k, self.dtypes)
        for group in _phase_groups(k, self.stash):
            if len(group) > 1:
                self.reduced.extend(self._fused_sums(group, inner_ranges))
                continue
            phase = group[0]
            self.reduced.append(self._reduction(k.reductions[phase], inner_ranges, phase))
        row_stores = [s for s in k.stores if s.per_row]
        elem_stores = [s for s in k.stores if not s.per_row]
        self.iv = self.outer + [_i64(0)] * k.n_inner
        self.memo: dict = {}
        for s in row_stores:
            self._store(s)
        if elem_stores:
            with for_nest(self.b, inner_ranges, "e") as inner:
                self.iv = self.outer + inner
                self.memo = {}
                for sub, st in self.stash.values():  # computed by a reduction phase
                    self.memo[sub] = self.b.load(self._address(st.buf, st.index),
                                                 typ=STORAGE[self.dtypes[st.buf]])
                for s in elem_stores:
                    self._store(s)

    def _scan(self, inner_ranges: list) -> None:
        """A scan kernel: one running phase; every store runs inside its loop and reads
        the running value (before the element for an exclusive scan, after it otherwise).
        A reversed scan walks the inner index from its end."""
        k, b = self.kernel, self.b
        red = k.reductions[0]
        ty = COMPUTE[red.dtype]
        acc = entry_alloca(b, ty, "scan")
        b.store(_reduce_init(red.kind, red.dtype, ty, red), acc)
        self.stash = {}
        with for_nest(b, inner_ranges, "s") as inner:
            if red.reverse and inner:
                last = b.sub(inner_ranges[0][1], _i64(1), flags=["nsw"])
                inner = [b.sub(last, inner[0], flags=["nsw"])] + inner[1:]
            self.iv = self.outer + inner
            self.memo = {}
            old = b.load(acc)
            new = self._combine(red.kind, old, self.value(red.expr), red.dtype)
            b.store(new, acc)
            self.reduced = [old if red.scan == "exclusive" else new]
            for s in k.stores:
                self._store(s)

    def _fused_sums(self, group: list[int], inner_ranges: list) -> list[ir.Value]:
        """Sum/prod phases that read none of each other's results, in one loop over the
        row: the loads and subexpressions they share are computed once per element
        (LayerNorm's mean correction and squared deviations both read x - mean)."""
        b = self.b
        reds = [self.kernel.reductions[p] for p in group]
        accs = []
        for red in reds:
            acc = entry_alloca(b, COMPUTE[red.dtype], "acc")
            b.store(_reduce_init(red.kind, red.dtype, COMPUTE[red.dtype], red), acc)
            accs.append(acc)
        with for_nest(b, inner_ranges, "r") as inner:
            self.iv = self.outer + inner
            self.memo = {}
            for red, acc in zip(reds, accs):
                x = self.value(red.expr)
                b.store(self._combine(red.kind, b.load(acc), x, red.dtype), acc)
        return [b.load(acc) for acc in accs]

    def _reduction(self, red: kir.Reduction, inner_ranges: list, phase: int) -> ir.Value:
        if self._vector_phase(red, inner_ranges, phase):
            return self._vector_reduction(red, inner_ranges)
        if self._vector_sum_phase(red, inner_ranges, phase):
            return self._vector_sum(red, inner_ranges, phase)
        return self._scalar_reduction(red, inner_ranges, phase)

    def _vector_sum_phase(self, red: kir.Reduction, inner_ranges: list, phase: int) -> bool:
        """A float sum phase stashing a costly value along the row (softmax's exp(x - max)),
        rows of at least 16 or of a symbolic length: full-width vector code (_vector_sum);
        LLVM's loop vectorizer ran it at half the speed of onnxruntime's softmax."""
        stashed = [st for _, st in self._stashed(phase)]
        if red.kind != "sum" or red.dtype not in ("float32", "float64") or not stashed \
                or red.expr.dtype != red.dtype or not inner_ranges or red.scan:
            return False
        n, last = self.inner_extents[-1], len(self.kernel.shape) - 1
        if not symbolic.is_sym(n) and n < vectorize.lanes(red.dtype):
            return False
        return vectorize.supported(red.expr, last) and \
            all(same(st.index.coeffs[last], 1) for st in stashed)

    def _vector_sum(self, red: kir.Reduction, inner_ranges: list, phase: int) -> ir.Value:
        """Vector chunks (_vector_sum_chunks); a row of symbolic length takes them when it is
        at least v long, the scalar loop otherwise, chosen per run (the loop vectorizer took
        134 us for BERT-base's [1536, 128] of symbolic rows, the chunks 70, Intel host)."""
        n = self.inner_extents[-1]
        if not symbolic.is_sym(n):
            return self._vector_sum_chunks(red, inner_ranges, phase, n)
        return self._per_run(red, inner_ranges, phase, lambda length: self._vector_sum_chunks(
            red, inner_ranges, phase, length))

    def _vector_sum_chunks(self, red: kir.Reduction, inner_ranges: list, phase: int,
                           n: int | ir.Value) -> ir.Value:
        """A row of n >= v elements (an int or a symbolic length's run-time value) in chunks of
        v lanes, the stash stored as vectors, the lanes summed after the row. A last chunk
        ends at the row's end, overlapping the one before, and keeps only its new lanes
        (where the stash goes over the input, inplace.py, the overlap reads back stashed
        values: fuzz 159/2416); a scalar tail made Whisper's softmax 1.5x onnxruntime's."""
        b, v, ty = self.b, vectorize.lanes(red.dtype), COMPUTE[red.dtype]
        vx = vectorize.VectorExprs(self, v)
        acc = entry_alloca(b, ir.VectorType(ty, v), "vsum")
        zero = ir.Constant(acc.allocated_type, [-0.0] * v)  # -0.0 + x == x
        b.store(zero, acc)
        lanes = ir.Constant(ir.VectorType(I64, v), list(range(v)))  # to mask the last chunk

        def chunk(start: ir.Value, skip: int | ir.Value) -> None:
            self.iv = self.outer + rows + [start]
            self.memo, vx.memo = {}, {}
            x = vx.value(red.expr)
            # the overlapping last chunk: only its lanes from `skip` on are new; the first
            # `skip` are summed and stashed already (and where the stash is written over
            # the input, inplace.py, this chunk read them back as stashed values)
            masked = not isinstance(skip, int) or skip > 0
            mask = b.icmp_signed(">=", lanes, splat(b, _i64(skip) if isinstance(skip, int)
                                                    else skip, v))
            align = 4 if red.dtype == "float32" else 8  # element alignment, as vectorize's
            for sub, st in self._stashed(phase):
                addr = self._address(st.buf, st.index, lanes=v, store=True)
                value = vx.value(sub)
                if masked:  # the stash's first `skip` lanes stay as the chunk before left them
                    value = b.select(mask, value, b.load(addr, typ=value.type, align=align))
                b.store(value, addr, align=align)
            if masked:
                x = b.select(mask, x, zero)
            b.store(b.fadd(b.load(acc), x, flags=REDUCE_FLAGS), acc)

        with for_nest(b, inner_ranges[:-1], "vrow") as rows:
            full = _i64(n // v) if isinstance(n, int) else b.sdiv(n, _i64(v))
            with for_nest(b, [(_i64(0), full)], "vr") as (c,):
                chunk(b.mul(c, _i64(v), flags=["nsw"]), 0)
            if not isinstance(n, int):  # the remainder known at run time
                rem = b.srem(n, _i64(v))
                with b.if_then(b.icmp_signed("!=", rem, _i64(0))):
                    chunk(b.sub(n, _i64(v)), b.sub(_i64(v), rem))
            elif n % v:
                chunk(_i64(n - v), v - n % v)
        return vx.horizontal_sum(_reduce_init("sum", red.dtype, ty, red), b.load(acc),
                                 REDUCE_FLAGS)

    def _stashed(self, phase: int) -> list[tuple]:
        """(subexpression, store) pairs the reduction phase writes as it goes (plan_stash)."""
        return [pair for key, pair in self.stash.items() if key[0] == phase]

    def _vector_phase(self, red: kir.Reduction, inner_ranges: list, phase: int) -> bool:
        """Float max/min phases over rows of at least 2 elements, with a simple expression
        and nothing stashed in them, are emitted as vector code (vectorize.py)."""
        if red.kind not in ("max", "min") or red.dtype not in vectorize.FLOATS \
                or red.expr.dtype != red.dtype:
            return False
        if not inner_ranges:
            return False
        n = self.inner_extents[-1]
        if not symbolic.is_sym(n) and n < 2:  # a symbolic row has at least 2 elements
            return False
        if self._stashed(phase):
            return False
        return vectorize.supported(red.expr, len(self.kernel.shape) - 1)

    def _vector_reduction(self, red: kir.Reduction, inner_ranges: list) -> ir.Value:
        """A max/min row in chunks of v lanes (see _vector_chunks); a row of symbolic length
        takes them when it is at least v long, the scalar loop otherwise (chosen per run)."""
        n = self.inner_extents[-1]
        if not symbolic.is_sym(n):
            return self._vector_chunks(red, inner_ranges, vectorize.width(red.dtype, n), n)
        return self._per_run(red, inner_ranges, -1, lambda length: self._vector_chunks(
            red, inner_ranges, vectorize.lanes(red.dtype), length))

    def _per_run(self, red: kir.Reduction, inner_ranges: list, phase: int,
                 chunks: Callable[[ir.Value], ir.Value]) -> ir.Value:
        """A row of symbolic length: chunks(its run-time length) when it is at least one
        vector long, the scalar loop (phase's) otherwise, chosen per run."""
        b, length = self.b, inner_ranges[-1][1]
        result = entry_alloca(b, COMPUTE[red.dtype], "vres")
        with b.if_else(b.icmp_signed(">=", length, _i64(vectorize.lanes(red.dtype)))) \
                as (wide, narrow):
            with wide:
                b.store(chunks(length), result)
            with narrow:
                b.store(self._scalar_reduction(red, inner_ranges, phase), result)
        return b.load(result)

    def _vector_chunks(self, red: kir.Reduction, inner_ranges: list, v: int,
                       n: int | ir.Value) -> ir.Value:
        """Full chunks of v lanes over a row of n >= v elements (an int, or the run-time
        value of a symbolic length), then the last v elements (overlapping: max/min are
        idempotent), into one vector accumulator; its lanes reduced after the row, a NaN
        anywhere in the row winning."""
        b = self.b
        vty = ir.VectorType(COMPUTE[red.dtype], v)
        vx = vectorize.VectorExprs(self, v)
        init = ir.Constant(vty, _reduce_init(red.kind, red.dtype, vty.element).constant)
        acc = entry_alloca(b, vty, "vacc")
        b.store(init, acc)
        seen = entry_alloca(b, ir.VectorType(ir.IntType(1), v), "vnan")  # lanes that met NaN
        b.store(ir.Constant(seen.allocated_type, None), seen)
        name = "llvm.maxnum" if red.kind == "max" else "llvm.minnum"

        def chunk(prefix: list, start: ir.Value) -> None:
            self.iv = self.outer + prefix + [start]
            self.memo, vx.memo = {}, {}
            raw = vx.value(red.expr)
            b.store(b.or_(b.load(seen), b.fcmp_unordered("uno", raw, raw)), seen)
            x = vx.intrinsic(name, [raw, init])  # NaN -> the neutral value
            b.store(vx.intrinsic(name, [b.load(acc), x], ("nnan",)), acc)

        with for_nest(b, inner_ranges[:-1], "r") as prefix:
            full = _i64(n // v) if isinstance(n, int) else b.sdiv(n, _i64(v))
            with for_nest(b, [(_i64(0), full)], "vr") as (t,):
                chunk(prefix, b.mul(t, _i64(v), flags=["nsw"]))
            if isinstance(n, int):
                if n % v:
                    chunk(prefix, _i64(n - v))
            else:
                with b.if_then(b.icmp_signed("!=", b.srem(n, _i64(v)), _i64(0))):
                    chunk(prefix, b.sub(n, _i64(v), flags=["nsw"]))
        any_nan = vx.any_lane(b.load(seen))
        return self._nan_wins(any_nan, vx.horizontal(b.load(acc), red.kind))

    def _scalar_reduction(self, red: kir.Reduction, inner_ranges: list,
                          phase: int) -> ir.Value:
        b = self.b
        arg = red.kind.startswith("arg")
        ty = COMPUTE[red.expr.dtype] if arg else COMPUTE[red.dtype]
        acc = entry_alloca(b, ty, "acc")
        b.store(_reduce_init(red.kind, red.expr.dtype, ty, red), acc)
        pos = seen = None
        if arg:
            pos = entry_alloca(b, I64, "pos")
            b.store(_i64(0), pos)
        elif red.kind in ("max", "min") and is_float(red.dtype):
            seen = entry_alloca(b, ir.IntType(1), "nan")  # whether the row held a NaN
            b.store(ir.Constant(ir.IntType(1), 0), seen)
        # A float max/min row left scalar (its expression is not one vectorize.py emits)
        # is marked for LLVM's loop vectorizer to skip: LLVM 22 asserts ("VPlan cost model
        # and legacy cost model disagreed") and aborts the process on some of them (fuzz
        # 154/1577, a max over a QuantizeLinear-DequantizeLinear row), and the select that
        # sanitizes NaN (_combine) keeps the others scalar anyway.
        loop_id = not_vectorized(b.module) if seen is not None else None
        with for_nest(b, inner_ranges, "r", loop_id) as inner:
            self.iv = self.outer + inner
            self.memo = {}
            x = self.value(red.expr)
            for sub, st in self._stashed(phase):
                b.store(self.value(sub), self._address(st.buf, st.index, store=True))
            old = b.load(acc)
            if seen is not None:
                b.store(b.or_(b.load(seen), b.fcmp_unordered("uno", x, x)), seen)
            if pos is None:
                b.store(self._combine(red.kind, old, x, red.dtype), acc)
            else:
                take = self._arg_better(red.kind, x, old, red.expr.dtype)
                b.store(b.select(take, x, old), acc)
                b.store(b.select(take, inner[-1] if inner else _i64(0), b.load(pos)), pos)
        if seen is not None:
            return self._nan_wins(b.load(seen), b.load(acc))
        return self._nan_first(red, inner_ranges, b.load(pos if arg else acc))

    def _nan_wins(self, any_nan: ir.Value, result: ir.Value) -> ir.Value:
        """A float max/min row that held a NaN gives NaN (NumPy semantics, as the reference):
        the accumulation itself skips NaN (see _combine), a flag remembers it."""
        return self.b.select(any_nan, ir.Constant(result.type, math.nan), result)

    def _nan_first(self, red: kir.Reduction, inner_ranges: list, result: ir.Value) -> ir.Value:
        """onnxruntime: an arg* row's NaN is skipped unless it is the first element."""
        # a symbolic extent is at least 2
        nonempty = all(symbolic.is_sym(d) or d > 0 for d in self.inner_extents)
        if red.kind in NAN_FIRST_KINDS and is_float(red.expr.dtype) and nonempty:
            b = self.b
            self.iv = self.outer + [_i64(0)] * len(inner_ranges)
            self.memo = {}
            first = self.value(red.expr)
            first_nan = b.fcmp_unordered("uno", first, first)
            result = b.select(first_nan, _i64(0) if red.kind.startswith("arg") else first,
                              result)
        return result

    def _combine(self, kind: str, acc: ir.Value, x: ir.Value, dtype: str) -> ir.Value:
        b = self.b
        if kind == "sum":
            return b.fadd(acc, x, flags=REDUCE_FLAGS) if is_float(dtype) else b.add(acc, x)
        if kind == "prod":
            return b.fmul(acc, x, flags=REDUCE_FLAGS) if is_float(dtype) else b.mul(acc, x)
        if is_float(dtype):  # NaN-skipping; a flag beside it makes a NaN row NaN (_nan_wins)
            # NaN is replaced by the neutral value here, so neither operand can be NaN and
            # the call is truthfully `nnan`. Not a plain llvm.maxnum reduction: LLVM 22
            # vectorizes that with a NaN-checking scheme that drops elements for some trip
            # counts (11, 14, 15 measured; tests/cpu/test_cpu_backend.py). The price: max/min
            # rows are not vectorized (softmax's max phase). Tried and rejected: sanitizing
            # with maxnum(x, -inf) instead of this select lets LLVM vectorize the nnan
            # reduction, but LLVM 22 then drops elements behind an Exp (the trip-count test
            # fails) and aborts ("VPlan cost model ... disagreed") on softmax rows of 75.
            neutral = ir.Constant(x.type, float("-inf") if kind == "max" else float("inf"))
            x = b.select(b.fcmp_unordered("uno", x, x), neutral, x)
            name = "llvm.maxnum" if kind == "max" else "llvm.minnum"
            return self.math.intrinsic(b, name, [acc, x], fastmath=("nnan",))
        return self.math.minmax(b, kind, acc, x, dtype)

    def _arg_better(self, kind: str, x: ir.Value, best: ir.Value, dtype: str) -> ir.Value:
        last = kind.endswith("_last")
        cmp = (">=" if last else ">") if kind.startswith("argmax") else ("<=" if last else "<")
        if is_float(dtype):  # ordered: a NaN never becomes the best
            return self.b.fcmp_ordered(cmp, x, best)
        return self.b.icmp_signed(cmp, x, best)

    # ---- stores, loads and expressions -----------------------------------------------------
    def _address(self, buf: int, index: kir.Affine, clamps: tuple = (),
                 dyn: tuple = (), lanes: int = 1, store: bool = False) -> ir.Value:
        b = self.b
        off = self.int(index.const)
        ivs = list(self.iv)
        span = self.piece  # the split dim's range so far: clamps of one read chain
        for d, lo, hi in clamps:  # branch-free: min(max(i_d, lo), hi)
            if span is not None and d == span[0]:
                bounds, span = pieces.clamp(lo, hi, span), pieces.through(lo, hi, span)
                if bounds is None:  # the piece lies inside [lo, hi]
                    continue
                lo, hi = bounds
                if isinstance(lo, int) and lo == hi:  # the piece lies beyond it: pinned
                    ivs[d] = _i64(lo)
                    continue
            lo_v, hi_v = self.int(lo), self.int(hi)
            v = b.select(b.icmp_signed("<", ivs[d], lo_v), lo_v, ivs[d])
            ivs[d] = b.select(b.icmp_signed(">", v, hi_v), hi_v, v)
        for c, iv in zip(index.coeffs, ivs):
            if not same(c, 0):
                term = iv if same(c, 1) else b.mul(iv, self.int(c), flags=["nsw"])
                off = b.add(off, term, flags=["nsw"])
        for e, stride in dyn:  # data-dependent positions (gathers), clamped by the lowering
            pos = self.value(e)
            term = pos if same(stride, 1) else b.mul(pos, self.int(stride), flags=["nsw"])
            off = b.add(off, term, flags=["nsw"])
        if self.guard is not None:
            self._bounds(buf, off, lanes, store)
        return b.gep(self.ptr[buf], [off], inbounds=True,
                     source_etype=STORAGE[self.dtypes[buf]])

    def _bounds(self, buf: int, off: ir.Value, lanes: int, store: bool) -> None:
        """--check_bounds: elements off .. off + lanes - 1 must lie in buffer buf; else the
        access goes into the guard array (GUARD_SIZES) and the kernel returns at once."""
        b, guard = self.b, self.guard
        size = b.load(b.gep(guard, [_i64(GUARD_SIZES + buf)], source_etype=I64), typ=I64)
        ok = b.and_(b.icmp_signed(">=", off, _i64(0)),
                    b.icmp_signed("<=", off, b.sub(size, _i64(lanes))))
        with b.if_then(b.not_(ok), likely=False):
            for j, v in enumerate((_i64(2 if store else 1), _i64(buf), off, _i64(lanes))):
                b.store(v, b.gep(guard, [_i64(j)], source_etype=I64))
            b.ret_void()

    def _store(self, s: kir.Store) -> None:
        dtype = self.dtypes[s.buf]
        v = self.value(s.expr)
        b = self.b
        if dtype == "float16":
            v = b.fptrunc(v, STORAGE[dtype])
        elif dtype == "bfloat16":
            v = mathops.bfloat16_bits(b, v)
        elif dtype == "bool":
            v = b.zext(v, I8)
        elif dtype in NARROW_INTS:
            v = b.trunc(v, STORAGE[dtype])
        b.store(v, self._address(s.buf, s.index, store=True))

    def value(self, e: kir.Expr) -> ir.Value:
        """The IR value of expression e in the current loop body (memoized)."""
        v = self.memo.get(e)
        if v is None:
            v = self._value(e)
            self.memo[e] = v
        return v

    def _value(self, e: kir.Expr) -> ir.Value:
        b = self.b
        if isinstance(e, kir.Const):
            if symbolic.is_sym(e.value):  # an integer computed from symbolic dims
                return self.math.cast(b, self.int(e.value), "int64", e.dtype)
            return constant(e.value, e.dtype)
        if isinstance(e, kir.Reduced):
            return self.reduced[e.phase]
        if isinstance(e, kir.Index):
            off = self.int(e.index.const)
            for c, iv in zip(e.index.coeffs, self.iv):
                if not same(c, 0):
                    off = b.add(off, b.mul(iv, self.int(c)))
            return off
        if isinstance(e, kir.Load):
            v = b.load(self._address(e.buf, e.index, e.clamps, e.dyn), typ=STORAGE[e.dtype])
            if e.dtype == "float16":
                return b.fpext(v, COMPUTE["float16"])
            if e.dtype == "bfloat16":
                return mathops.bfloat16_to_float(b, v)
            if e.dtype == "bool":
                return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
            if e.dtype in NARROW_INTS:
                return (b.zext if e.dtype.startswith("u") else b.sext)(v, I32)
            return v
        if self.piece is not None:
            known = self._in_piece(e)
            if known is not None:
                return known
        args = [self.value(a) for a in e.args]
        if e.name == "cast":
            return self.math.cast(b, args[0], e.args[0].dtype, e.dtype)
        if e.name == "cast_sat":  # float64 accumulator -> integer, saturating
            return self.math.intrinsic_ret(b, "llvm.fptosi.sat", COMPUTE[e.dtype], args[0])
        arg_dtype = e.args[-1].dtype if e.name == "select" else e.args[0].dtype
        return self.math.primitive(b, e.name, args, arg_dtype, self.op_flags(e))

    def _in_piece(self, e: kir.Op) -> ir.Value | None:
        """e's value where the current piece of the innermost loop decides it (pieces.py):
        an index comparison, a logic op of decided ones, or a select's taken arm (the
        other is never emitted); None when e depends on the index within the piece."""
        if e.name in ("lt", "le", "gt", "ge"):
            known = pieces.decided(e, self.piece)
            return None if known is None else ir.Constant(ir.IntType(1), int(known))
        if e.name == "select":
            cond = self.value(e.args[0])
            if isinstance(cond, ir.Constant):
                return self.value(e.args[1] if cond.constant else e.args[2])
        elif e.name in ("and", "or", "not") and e.dtype == "bool":
            args = [self.value(a) for a in e.args]
            if all(isinstance(a, ir.Constant) for a in args):  # a Pad's range test
                bits = [bool(a.constant) for a in args]
                got = (not bits[0]) if e.name == "not" else \
                    (all(bits) if e.name == "and" else any(bits))
                return ir.Constant(ir.IntType(1), int(got))
        return None

    def op_flags(self, e: kir.Op) -> tuple:
        """The fast-math flags of op e, the same in scalar and vector code (vectorize.py), so
        a value recomputed in several phases of a row rounds alike: `arcp` on x / c with c
        invariant along the row and _reciprocal_ok (x * (1/c), 1/c hoisted out of the loop:
        no vdivps per element). The vector code took it for any invariant c, so LogSoftmax(x
        / 10) divided in its scalar phases and multiplied by 0.1 in its vector max phase,
        and its count of maxima missed the maximum: 1.2e-3 off (fuzz 123/736)."""
        if e.name == "div" and "fast" not in self.flags and self._invariant(e.args[1]) \
                and _reciprocal_ok(e.args[1]):
            return self.flags + ("arcp",)
        return self.flags

    def _invariant(self, e: kir.Expr) -> bool:
        """Whether e does not change along the innermost loop (constants, per-row values)."""
        key = id(e)
        got = self.invariant.get(key)
        if got is None:
            last = len(self.kernel.shape) - 1
            if isinstance(e, kir.Load):
                got = same(e.index.coeffs[last], 0) and \
                    all(self._invariant(x) for x, _ in e.dyn)
            elif isinstance(e, kir.Index):
                got = same(e.index.coeffs[last], 0)
            elif isinstance(e, kir.Op):
                got = all(self._invariant(a) for a in e.args)
            else:
                got = True
            self.invariant[key] = got
        return got


def _phase_groups(k: kir.Kernel, stash: dict) -> list[list[int]]:
    """The kernel's phases in order, consecutive sum/prod phases that read none of each
    other's results (nor stash a value) grouped to run in one loop (_fused_sums)."""
    groups: list[list[int]] = []
    open_group = False  # whether the last group may take another phase
    for p, red in enumerate(k.reductions):
        fusable = red.kind in ("sum", "prod") and not any(key[0] == p for key in stash)
        reads = {e.phase for e in kir.walk([red.expr]) if isinstance(e, kir.Reduced)}
        if fusable and open_group and not reads & set(groups[-1]):
            groups[-1].append(p)
        else:
            groups.append([p])
            open_group = fusable
    return groups


def _loop_order(k: kir.Kernel) -> list[int]:
    """Outer loop dims, outermost first: i0 first (threads split it), then the rest.

    A transposing kernel (elementwise, rank >= 3) runs innermost over the dim along which
    most of its loads and stores are unit-stride or invariant, not blindly the last one:
    LLaMA's K transpose + rotary read 4 inputs with stride 64-256 along the output's last
    dim (gathers) but contiguously along the one before it.
    """
    rank = len(k.shape)
    order = list(range(rank - k.n_inner))
    if k.n_inner or k.reductions or rank < 3:
        return order
    indices = [e.index for e in kir.kernel_exprs(k) if isinstance(e, kir.Load)] + \
        [s.index for s in k.stores]

    def strided(d: int) -> int:
        return sum(1 for a in indices if not (same(a.coeffs[d], 0) or same(a.coeffs[d], 1)))

    best = min(range(1, rank), key=lambda d: (strided(d), d != rank - 1))
    order.remove(best)
    return order + [best]


def _costly(e: kir.Expr) -> bool:
    """Whether e computes a primitive that costs far more than storing and reloading a
    value that sits in L1/L2 (kernel_ir.COSTLY)."""
    return isinstance(e, kir.Op) and (e.name in kir.COSTLY or any(_costly(a) for a in e.args))


def _subexprs(e: kir.Expr, out: set) -> set:
    if e not in out:
        out.add(e)
        if isinstance(e, kir.Op):
            for a in e.args:
                _subexprs(a, out)
    return out


def plan_stash(k: kir.Kernel, dtypes: dict[int, str]) -> dict:
    """{(phase, store position): (subexpr, store)}: costly values a store shares with phase.

    Softmax computes exp(x - max) in its sum phase and again in the store; the phase writes
    it into the output row (in L1/L2) and the store loop reads it back, so exp runs once.
    Only for float32/float64 outputs (exact round trip), output buffers that the kernel
    does not read, and store maps that move along every inner dim (each element once).
    """
    if not k.reductions or k.scan:
        return {}
    loaded = kir.loaded_buffers(k)
    inner = range(len(k.shape) - k.n_inner, len(k.shape))
    phases = [_subexprs(r.expr, set()) for r in k.reductions]
    plan: dict = {}
    for pos, st in enumerate(k.stores):
        if (st.per_row or st.buf in loaded or dtypes[st.buf] not in ("float32", "float64")
                or sum(1 for x in k.stores if x.buf == st.buf) > 1
                or any(same(st.index.coeffs[d], 0) for d in inner)):
            continue
        found = _shared_costly(st.expr, phases, dtypes[st.buf])
        if found is not None:
            plan[(found[0], pos)] = (found[1], st)
    return plan


def _shared_costly(e: kir.Expr, phases: list[set], dtype: str):
    """(last phase, outermost costly subexpr of e that phase also computes), or None."""
    stack = [e]
    while stack:
        x = stack.pop()
        if x.dtype == dtype and _costly(x):
            hits = [p for p, subs in enumerate(phases) if x in subs]
            if hits:
                return hits[-1], x
        if isinstance(x, kir.Op):
            stack.extend(reversed(x.args))
    return None


def _reciprocal_ok(divisor: kir.Expr) -> bool:
    """Whether x / divisor may become x * (1 / divisor): a row's reduced value (Softmax's
    sum: onnxruntime multiplies by its reciprocal too), or a constant whose reciprocal is
    exact (a power of two). Anything else stays a division: x / 0.1 as x * 10 rounds
    differently, which Ceil/Floor/Cast after it expose (Ceil(-282.3 / 0.1)), and a
    recomputed x / c must round the same in every phase of a row kernel (the vectorized
    max phase divides: Softmax(x / c) with a 1e20 element gave NaN)."""
    leaves = [x for x in kir.walk([divisor]) if not isinstance(x, kir.Op)]
    if any(isinstance(x, kir.Reduced) for x in leaves) and \
            all(isinstance(x, (kir.Reduced, kir.Const)) for x in leaves):
        return True  # computed from the row's reductions: sum, sqrt(var + eps)
    if not isinstance(divisor, kir.Const) or not is_float(divisor.dtype):
        return False
    c = float(divisor.value)
    return c != 0 and math.isfinite(c) and math.frexp(abs(c))[0] == 0.5


def _reduce_init(kind: str, dtype: str, ty: ir.Type,
                 red: kir.Reduction | None = None) -> ir.Constant:
    if kind == "sum" and red is not None and is_float(dtype):
        return constant(kir.sum_start(red), dtype)  # -0.0 for an inclusive scan
    if kind in ("sum", "prod"):
        return constant(kir.reduce_identity(kind, dtype), dtype)
    return ir.Constant(ty, kir.reduce_identity(kind, dtype, getattr(ty, "width", None)))


def _i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def code_dims(k: kir.Kernel) -> list[str]:
    """The symbolic dims kernel k's code reads, in the order its `bufs` array holds them
    after the buffer pointers."""
    return sorted(symbolic.symbols_of(_code_body(k)))


def _code_body(k: kir.Kernel) -> kir.Kernel:
    """k without its outer extent: the caller's range, which the code does not read."""
    return dataclasses.replace(k, shape=k.shape[1:]) if k.shape else k


def _buffers_of(k: kir.Kernel) -> set[int]:
    return {s.buf for s in k.stores} | kir.loaded_buffers(k)


def buffer_dtypes(k: kir.Kernel) -> dict[int, str]:
    out = {e.buf: e.dtype for e in kir.kernel_exprs(k) if isinstance(e, kir.Load)}
    for s in k.stores:
        out[s.buf] = s.expr.dtype
    return out


def build_module(kernels: list[kir.Kernel], fast_math: bool,
                 check_bounds: bool = False) -> ir.Module:
    """One LLVM module holding the given kernels (each access checked with check_bounds)."""
    module = ir.Module(name="autoclust")
    wide = set()
    for k in kernels:
        KernelEmitter(module, k, fast_math, check_bounds).emit()
        if not k.reductions:
            wide.add(k.name)
    for fn in module.functions:
        if fn.is_declaration:
            continue
        # `arcp` is for x / c -> x * (1/c) with 1/c hoisted out of the loop. Without this
        # attribute x86 also turns 1/sqrt(v) into vrsqrt14 plus a Newton step, which is
        # 1-2 ulp off and gives NaN for v = inf (LayerNorm over a row holding 1e20 must
        # give zeros, as onnxruntime does).
        set.add(fn.attributes, '"reciprocal-estimates"="none"')
        if fn.name.split(".")[0] in wide:
            # LLVM's Intel server tuning caps vectors at 256 bits; elementwise kernels are
            # FMA-heavy streams where 512 bits measured 1.3-1.5x faster (GELU, the math
            # chain). Not on row kernels: there LLVM 22's loop vectorizer asserts ("VPlan
            # cost model and legacy cost model disagreed") and aborts the process, e.g. on a
            # Softmax over rows of 75 (tests/cpu/test_cpu_backend.py). On every function of the
            # kernel, since the body is inlined into its callers. llvmlite checks attribute
            # names against a fixed list, so the string attribute goes in directly.
            set.add(fn.attributes, f'"prefer-vector-width"="{VECTOR_BITS}"')
    return module
