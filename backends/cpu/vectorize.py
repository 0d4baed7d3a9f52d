"""Explicitly vectorized max/min row reductions (lane-split accumulators).

LLVM 22's loop vectorizer is unreliable on floating-point max/min reductions: a plain
llvm.maxnum reduction is vectorized with a NaN-checking scheme that drops elements for
some trip counts, an nnan one miscompiles behind an Exp and aborts ("VPlan cost model ...
disagreed") on rows of 75, and a NaN-sanitizing select keeps it scalar (softmax's max
phase ran at 1 element per cycle). So codegen emits these phases as vector code itself and
the loop vectorizer never sees a reduction:

    acc = <-inf x V>
    for t in 0 .. n / V:  x = <V lanes of the phase's expression at i = t*V ...>
                          seen = seen | isnan(x)
                          acc = maxnum_nnan(acc, maxnum(x, -inf))   # NaN -> -inf first
    if n % V:             the same for the last V elements, i = n - V ... n - 1
    result = any lane of seen ? NaN : horizontal max of acc's lanes

The last chunk overlaps the one before it: max and min are idempotent, so elements seen
twice change nothing, and a row of any length n >= 2 runs as vector code only (no scalar
tail; V is the widest power of two <= n, at most 512 bits). A NaN anywhere in the row makes
the result NaN, as NumPy's max (codegen._nan_wins). Rows of 0 or 1 element stay scalar.

Expressions are emitted through the scalar path's own table (mathops, mathlib), on
vectors: loads contiguous or invariant along the row (floats, bools, integers), Index,
arithmetic, compares, logic, selects, casts, the mathlib transcendentals. Anything else
(gathers, clamped Concat loads, libm calls) keeps the phase scalar. LLVM does not
vectorize a loop that already holds vector code.
"""

from __future__ import annotations

import math

from autoclust.backends.cpu import mathlib
from autoclust.backends.cpu.llvm_types import COMPUTE, NARROW_INTS, STORAGE, constant
from autoclust.backends.cpu.loops import intrinsic, splat
from llvmlite import ir

from autoclust.kernel import ir as kir

I64 = ir.IntType(64)
BITS = 512
FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "uint8", "int16", "uint16", "int32", "int64")
FLOAT_OPS = frozenset({"add", "sub", "mul", "mul_exact", "div", "div_exact", "neg", "lt",
                       "le", "gt", "ge", "eq", "ne", "isnan", "max", "min", "abs", "sqrt",
                       "floor", "ceil", "round", "sign"}) | frozenset(mathlib.SUPPORTED)
INT_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "max", "min", "lt", "le", "gt",
                     "ge", "eq", "ne", "isnan", "and", "or", "xor", "not", "bitand",
                     "bitor", "bitxor", "bitnot"})
_ALIGN = {"float16": 2, "float32": 4, "float64": 8, "bool": 1, "int8": 1, "uint8": 1,
          "int16": 2, "uint16": 2, "int32": 4, "int64": 8}


def lanes(dtype: str) -> int:
    """Vector lanes of a full-width (512-bit) register for a phase computed in dtype."""
    return BITS // (64 if dtype == "float64" else 32)


def width(dtype: str, n: int) -> int:
    """The lanes a row of n elements uses: the widest power of two <= n, at most lanes()."""
    v = lanes(dtype)
    while v > n:
        v //= 2
    return v


def supported(e: kir.Expr, last: int) -> bool:
    """Whether e can be emitted as vectors along loop dim `last`."""
    return all(_supported(x, last) for x in kir.walk([e]))


def _supported(x: kir.Expr, last: int) -> bool:
    if isinstance(x, kir.Load):
        return not x.dyn and not x.clamps and x.index.coeffs[last] in (0, 1) and \
            x.dtype in FLOATS + INTS + ("bool",)
    if isinstance(x, (kir.Const, kir.Reduced)):
        return x.dtype in FLOATS + INTS + ("bool",)
    if isinstance(x, kir.Index):
        return True
    if x.name == "cast":
        return x.dtype in FLOATS + INTS + ("bool",)
    if x.name == "select":
        return True
    operand = x.args[0].dtype
    if operand in FLOATS:
        return x.name in FLOAT_OPS
    return x.name in INT_OPS


class VectorExprs:
    """Emits kernel-IR expressions as <V x T> values along the innermost loop index."""

    def __init__(self, emitter, v: int):
        self.k = emitter  # the codegen.KernelEmitter (its iv, reduced, _address, flags)
        self.b = emitter.b
        self.v = v
        self.memo: dict = {}

    def vec(self, ty: ir.Type) -> ir.VectorType:
        return ir.VectorType(ty, self.v)

    def splat(self, x: ir.Value) -> ir.Value:
        return splat(self.b, x, self.v)

    def value(self, e: kir.Expr) -> ir.Value:
        got = self.memo.get(e)
        if got is None:
            got = self._value(e)
            self.memo[e] = got
        return got

    def _value(self, e: kir.Expr) -> ir.Value:
        b, k = self.b, self.k
        last = len(k.iv) - 1
        if isinstance(e, kir.Const):
            return self.splat(constant(e.value, e.dtype))
        if isinstance(e, kir.Reduced):
            return self.splat(k.reduced[e.phase])
        if isinstance(e, kir.Index):
            base = k.value(e)  # the scalar index at lane 0
            step = ir.Constant(self.vec(I64), [e.index.coeffs[last] * j for j in range(self.v)])
            return b.add(self.splat(base), step)
        if isinstance(e, kir.Load):
            if e.index.coeffs[last] == 0:
                return self.splat(k.value(e))
            addr = k._address(e.buf, e.index, lanes=self.v)
            # element alignment: the default for a vector type (its size) would be a lie
            raw = b.load(addr, typ=self.vec(STORAGE[e.dtype]), align=_ALIGN[e.dtype])
            if e.dtype == "float16":
                return b.fpext(raw, self.vec(COMPUTE["float16"]))
            if e.dtype == "bool":
                return b.icmp_unsigned("!=", raw, ir.Constant(raw.type, 0))
            if e.dtype in NARROW_INTS:
                widen = b.zext if e.dtype.startswith("u") else b.sext
                return widen(raw, self.vec(COMPUTE[e.dtype]))
            return raw
        if e.name == "exp" and e.dtype in ("float32", "float64"):
            return self._exp(e.args[0])
        args = [self.value(a) for a in e.args]
        if e.name == "cast":
            return k.math.cast(b, args[0], e.args[0].dtype, e.dtype)
        arg_dtype = e.args[-1].dtype if e.name == "select" else e.args[0].dtype
        return k.math.primitive(b, e.name, args, arg_dtype, k.op_flags(e))

    def _exp(self, x: kir.Expr) -> ir.Value:
        """e^x, Softmax's shape of it in fewer instructions (its rows spend most of their
        time here): exp(select(d < c, -inf, d)) as one masked exp of d zeroing lanes below
        c, and d = X - max(X) over the row (no lane above 0) without the overflow clamp.
        The same bits either way (tests/cpu/test_mathlib.py). A c that is not finite
        (a graph's own Where(x < NaN, -inf, x)) keeps the select."""
        lo = None
        if isinstance(x, kir.Op) and x.name == "select" and isinstance(x.args[0], kir.Op) \
                and x.args[0].name == "lt" and x.args[0].args[0] == x.args[2] \
                and isinstance(x.args[0].args[1], kir.Const) \
                and math.isfinite(float(x.args[0].args[1].value)) \
                and isinstance(x.args[1], kir.Const) and x.args[1].value == float("-inf"):
            lo, x = float(x.args[0].args[1].value), x.args[2]
        return mathlib.exp_below(self.b, self.value(x), lo, self._row_max_shifted(x))

    def _row_max_shifted(self, x: kir.Expr) -> bool:
        """Whether x is X - r with r this kernel's max reduction of X over the row: never
        above 0 (X = +inf gives inf - inf = NaN, which the exp keeps)."""
        if not (isinstance(x, kir.Op) and x.name == "sub" and isinstance(x.args[1], kir.Reduced)):
            return False
        red = self.k.kernel.reductions[x.args[1].phase]
        return red.kind == "max" and red.expr == x.args[0] and red.dtype == x.dtype

    def intrinsic(self, name: str, args: list[ir.Value], fastmath: tuple = ()) -> ir.Value:
        ty = args[0].type
        elem = "f64" if isinstance(ty.element, ir.DoubleType) else "f32"
        return self._call(f"{name}.v{self.v}{elem}", ty, args, fastmath)

    def any_lane(self, mask: ir.Value) -> ir.Value:
        """Whether any lane of an i1 vector is set (llvm.vector.reduce.or)."""
        return self._call(f"llvm.vector.reduce.or.v{self.v}i1", ir.IntType(1), [mask], ())

    def horizontal(self, acc: ir.Value, kind: str) -> ir.Value:
        """The max (min) of acc's lanes (a shuffle tree); no lane holds NaN (sanitized),
        so nnan holds."""
        ty = acc.type.element
        elem = "f64" if isinstance(ty, ir.DoubleType) else "f32"
        name = f"llvm.vector.reduce.f{kind}.v{self.v}{elem}"
        return self._call(name, ty, [acc], ("nnan",))

    def horizontal_sum(self, start: ir.Value, acc: ir.Value, fastmath: tuple) -> ir.Value:
        """start plus the sum of acc's lanes (llvm.vector.reduce.fadd; reassoc: a tree)."""
        elem = "f64" if isinstance(start.type, ir.DoubleType) else "f32"
        return self._call(f"llvm.vector.reduce.fadd.v{self.v}{elem}", start.type,
                          [start, acc], fastmath)

    def _call(self, name: str, ret: ir.Type, args: list[ir.Value],
              fastmath: tuple) -> ir.Value:
        return intrinsic(self.b, name, ret, args, fastmath)
