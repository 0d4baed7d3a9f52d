"""Explicitly vectorized max/min row reductions (lane-split accumulators).

LLVM 22's loop vectorizer is unreliable on floating-point max/min reductions: a plain
llvm.maxnum reduction is vectorized with a NaN-checking scheme that drops elements for
some trip counts, an nnan one miscompiles behind an Exp and aborts ("VPlan cost model ...
disagreed") on rows of 75, and a NaN-sanitizing select keeps it scalar (softmax's max
phase ran at 1 element per cycle). So codegen emits these phases as vector code itself and
the loop vectorizer never sees a reduction:

    acc = <-inf x V>
    for t in 0 .. n / V:  x = <V lanes of the phase's expression at i = t*V ...>
                          acc = maxnum_nnan(acc, maxnum(x, -inf))   # NaN -> -inf first
    tail i in n/V*V .. n: scalar, as before;   result = max(horizontal(acc), tail)

Only simple expressions take this path (contiguous or row-invariant loads along the row,
arithmetic, compares, selects, float casts, the mathlib transcendentals); anything else
stays scalar. LLVM does not vectorize a loop that already holds vector code.
"""

from __future__ import annotations

from autoclust.backends.cpu import mathlib
from llvmlite import ir

from autoclust import kernel_ir as kir

I32, I64 = ir.IntType(32), ir.IntType(64)
BITS = 512
ARITH = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv", "div_exact": "fdiv"}
FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
MATHLIB = ("exp", "log", "log1p", "tanh", "sigmoid", "erf")
INTRINSICS = {"abs": "llvm.fabs", "sqrt": "llvm.sqrt", "floor": "llvm.floor",
              "ceil": "llvm.ceil", "round": "llvm.roundeven", "max": "llvm.maximum",
              "min": "llvm.minimum"}
FLOATS = ("float16", "float32", "float64")
_ALIGN = {"float16": 2, "float32": 4, "float64": 8, "bool": 1}


def lanes(dtype: str) -> int:
    return BITS // (64 if dtype == "float64" else 32)


def supported(e: kir.Expr, last: int) -> bool:
    """Whether e can be emitted as vectors along loop dim `last`."""
    return all(_supported(x, last) for x in kir.walk([e]))


def _supported(x: kir.Expr, last: int) -> bool:
    if isinstance(x, kir.Load):
        return not x.dyn and not x.clamps and x.index.coeffs[last] in (0, 1) and \
            x.dtype in FLOATS + ("bool",)
    if isinstance(x, (kir.Const, kir.Reduced)):
        return x.dtype in FLOATS + ("bool",)
    if isinstance(x, kir.Index):
        return True
    name = x.name
    if name == "cast":
        return x.dtype in FLOATS and x.args[0].dtype in FLOATS
    if name in FCMP or name == "ne":
        return x.args[0].dtype in FLOATS
    if name == "select":
        return x.dtype in FLOATS
    return x.dtype in FLOATS and (name in ARITH or name in MATHLIB or name in INTRINSICS
                                  or name == "neg")


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
        vty = self.vec(x.type)
        one = self.b.insert_element(ir.Constant(vty, ir.Undefined), x, I32(0))
        return self.b.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                     ir.Constant(self.vec(I32), [0] * self.v))

    def value(self, e: kir.Expr) -> ir.Value:
        got = self.memo.get(e)
        if got is None:
            got = self._value(e)
            self.memo[e] = got
        return got

    def _value(self, e: kir.Expr) -> ir.Value:
        from autoclust.backends.cpu.codegen import COMPUTE, STORAGE, constant
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
            addr = k._address(e.buf, e.index)
            if e.index.coeffs[last] == 0:
                return self.splat(k.value(e))
            # element alignment: the default for a vector type (its size) would be a lie
            raw = b.load(addr, typ=self.vec(STORAGE[e.dtype]), align=_ALIGN[e.dtype])
            if e.dtype == "float16":
                return b.fpext(raw, self.vec(COMPUTE["float16"]))
            if e.dtype == "bool":
                return b.icmp_unsigned("!=", raw, ir.Constant(raw.type, [0] * self.v))
            return raw
        return self._op(e, [self.value(a) for a in e.args])

    def _op(self, e: kir.Op, args: list[ir.Value]) -> ir.Value:
        from autoclust.backends.cpu.codegen import COMPUTE
        b, name, x = self.b, e.name, args[0]
        if name in ARITH:
            return getattr(b, ARITH[name])(x, args[1], flags=self.k.flags)
        if name == "neg":
            return b.fneg(x, flags=self.k.flags)
        if name == "select":
            return b.select(x, args[1], args[2])
        if name in FCMP:
            return b.fcmp_ordered(FCMP[name], x, args[1])
        if name == "ne":
            return b.fcmp_unordered("!=", x, args[1])
        if name in MATHLIB:
            return mathlib.call(b, name, [x])
        if name in INTRINSICS:
            return self.intrinsic(INTRINSICS[name], args)
        # float -> float cast; to float16 rounds through half
        src, dst = e.args[0].dtype, e.dtype
        if dst == "float16":
            half = b.fptrunc(x, self.vec(ir.HalfType()))
            return b.fpext(half, self.vec(COMPUTE["float16"]))
        want = self.vec(COMPUTE[dst])
        if src == "float64" and dst != "float64":
            return b.fptrunc(x, want)
        if dst == "float64" and src != "float64":
            return b.fpext(x, want)
        return x

    def intrinsic(self, name: str, args: list[ir.Value], fastmath: tuple = ()) -> ir.Value:
        ty = args[0].type
        elem = "f64" if isinstance(ty.element, ir.DoubleType) else "f32"
        full = f"{name}.v{self.v}{elem}"
        module = self.b.module
        try:
            fn = module.get_global(full)
        except KeyError:
            fn = ir.Function(module, ir.FunctionType(ty, [a.type for a in args]), full)
        return self.b.call(fn, args, fastmath=fastmath)

    def horizontal(self, acc: ir.Value, kind: str) -> ir.Value:
        """The max (min) of acc's lanes; no lane holds NaN (sanitized), so nnan holds."""
        name = "llvm.maxnum" if kind == "max" else "llvm.minnum"
        ty = acc.type.element
        suffix = "f64" if isinstance(ty, ir.DoubleType) else "f32"
        module = self.b.module
        try:
            fn = module.get_global(f"{name}.{suffix}")
        except KeyError:
            fn = ir.Function(module, ir.FunctionType(ty, [ty, ty]), f"{name}.{suffix}")
        out = self.b.extract_element(acc, I32(0))
        for j in range(1, self.v):
            out = self.b.call(fn, [out, self.b.extract_element(acc, I32(j))],
                              fastmath=("nnan",))
        return out
