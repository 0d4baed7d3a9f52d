"""Kernel IR primitives -> LLVM instructions: a table from primitive name to emitter.

exp, log, log1p, tanh, sigmoid and erf go to mathlib (branch-free, vectorizable); the rarer
transcendentals to LLVM intrinsics or libm. Integer division and remainder never trap: a
zero divisor is replaced by 1 (a Check thunk has already rejected zero divisors, as
onnxruntime raises on them). Float -> int casts follow onnxruntime on x86: NaN and values
out of range give the integer type's minimum ("cast_sat" saturates instead).

Every emitter works on scalars and on vectors of them alike (vectorize.py emits row
reductions as explicit vector code through the same table, so both paths round alike).
"""

from __future__ import annotations

import ctypes.util

from autoclust.backends.cpu import mathlib
from autoclust.backends.cpu.llvm_types import COMPUTE, NARROW_INTS
from llvmlite import binding as llvm
from llvmlite import ir

MATHLIB_OPS = ("exp", "log", "log1p", "tanh", "sigmoid", "erf")
INTRINSIC_UNARY = {"sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil",
                   "round": "llvm.roundeven", "sin": "llvm.sin", "cos": "llvm.cos",
                   "abs": "llvm.fabs", "tan": "llvm.tan"}
LIBM_UNARY = ("asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}

_libm_loaded = False


def load_libm() -> None:
    """Make libm symbols (erff, asinf, ...) visible to the JIT."""
    global _libm_loaded
    if not _libm_loaded:
        llvm.load_library_permanently(ctypes.util.find_library("m"))
        _libm_loaded = True


def _elem(ty: ir.Type) -> ir.Type:
    """The element type of a vector type; a scalar type itself."""
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _shaped(like: ir.Type, elem: ir.Type) -> ir.Type:
    """`elem`, as a vector of like's lane count when `like` is a vector type."""
    return ir.VectorType(elem, like.count) if isinstance(like, ir.VectorType) else elem


def _is_float(ty: ir.Type) -> bool:
    return isinstance(_elem(ty), (ir.FloatType, ir.DoubleType, ir.HalfType))


def _suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    return {ir.FloatType: "f32", ir.DoubleType: "f64", ir.HalfType: "f16"}[type(ty)] \
        if _is_float(ty) else f"i{ty.width}"


class MathOps:
    """Emits primitives into a module (declaring intrinsics and libm functions once)."""

    def __init__(self, module: ir.Module):
        self.module = module

    def _fn(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        try:
            return self.module.get_global(name)
        except KeyError:
            return ir.Function(self.module, ir.FunctionType(ret, args), name)

    def intrinsic(self, b: ir.IRBuilder, name: str, args: list[ir.Value],
                  fastmath: tuple[str, ...] = ()) -> ir.Value:
        ty = args[0].type
        fn = self._fn(f"{name}.{_suffix(ty)}", ty, [a.type for a in args])
        return b.call(fn, args, fastmath=fastmath)

    def libm(self, b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
        """libm's double `name` of x; a float is widened first and the result rounded once:
        glibc's float versions are not correctly rounded (sinhf(-0.038549937) is an ulp
        low, and Atan(x) - Sinh(x) there cancels it up to 1.3e-4 relative, fuzz 115/1612),
        where the double ones are within an ulp of double."""
        load_libm()
        if isinstance(x.type, ir.FloatType):
            wide = b.fpext(x, ir.DoubleType())
            return b.fptrunc(b.call(self._fn(name, wide.type, [wide.type]), [wide]), x.type)
        return b.call(self._fn(name, x.type, [x.type]), [x])

    def minmax(self, b: ir.IRBuilder, which: str, x: ir.Value, y: ir.Value,
               dtype: str) -> ir.Value:
        """max/min for floats as np.maximum and onnxruntime's float kernels: NaN if either
        is NaN, and y where x and y compare equal (max(+0.0, -0.0) is -0.0, as
        onnxruntime's Max; llvm.maximum's IEEE order gave +0.0); signed for ints."""
        if _is_float(x.type):
            pick = b.select(b.fcmp_ordered(">" if which == "max" else "<", x, y), x, y)
            return b.select(b.fcmp_unordered("uno", x, y), b.fadd(x, y), pick)
        if _elem(x.type).width == 1:
            return b.or_(x, y) if which == "max" else b.and_(x, y)
        return self.intrinsic(b, "llvm.smax" if which == "max" else "llvm.smin", [x, y])

    def primitive(self, b: ir.IRBuilder, name: str, args: list[ir.Value], dtype: str,
                  flags: tuple) -> ir.Value:
        """Emit primitive `name` on args whose (operand) dtype is `dtype`."""
        x = args[0]
        if name == "select":
            return b.select(args[0], args[1], args[2])
        if name == "trap":  # the testing-only fault injector: abort when this code runs
            b.call(self._fn("llvm.trap", ir.VoidType(), []), [])
            return x
        if _is_float(x.type):
            return self._float(b, name, args, flags)
        return self._int(b, name, args)

    def _float(self, b: ir.IRBuilder, name: str, args: list[ir.Value],
               flags: tuple) -> ir.Value:
        x = args[0]
        y = args[1] if len(args) > 1 else None
        simple = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv,
                  "div_exact": b.fdiv}
        if name in simple:
            return simple[name](x, y, flags=flags)
        if name == "mul_exact":  # rounded on its own: no contract (FMA) flag
            return b.fmul(x, y, flags=tuple(f for f in flags if f not in ("contract", "fast")))
        if name == "neg":
            return b.fneg(x, flags=flags)
        if name in FCMP:
            return b.fcmp_ordered(FCMP[name], x, y)
        if name == "ne":
            return b.fcmp_unordered("!=", x, y)
        if name == "isnan":
            return b.fcmp_unordered("uno", x, x)
        if name in ("max", "min"):
            return self.minmax(b, name, x, y, "")
        if name == "fmod":
            return b.frem(x, y)
        if name == "mod":  # result takes the divisor's sign (Python/numpy mod)
            r = b.frem(x, y)
            zero = ir.Constant(x.type, 0.0)
            fix = b.and_(b.fcmp_ordered("!=", r, zero),
                         b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero)))
            return b.select(fix, b.fadd(r, y), r)
        if name == "pow":
            return self.intrinsic(b, "llvm.pow", [x, y])
        if name == "sign":  # -0.0 gives +0.0, NaN stays NaN (onnxruntime's Sign)
            one, zero = ir.Constant(x.type, 1.0), ir.Constant(x.type, 0.0)
            same = b.select(b.fcmp_ordered("==", x, x), zero, x)
            neg = b.select(b.fcmp_ordered("<", x, zero), ir.Constant(x.type, -1.0), same)
            return b.select(b.fcmp_ordered(">", x, zero), one, neg)
        if name in MATHLIB_OPS:
            return mathlib.call(b, name, [x])
        if name in INTRINSIC_UNARY:
            return self.intrinsic(b, INTRINSIC_UNARY[name], [x])
        if name in LIBM_UNARY:
            return self.libm(b, name, x)
        raise NotImplementedError(f"float primitive {name}")

    def _int(self, b: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
        x = args[0]
        y = args[1] if len(args) > 1 else None
        ty = x.type
        simple = {"add": b.add, "sub": b.sub, "mul": b.mul, "and": b.and_, "or": b.or_,
                  "xor": b.xor, "bitand": b.and_, "bitor": b.or_, "bitxor": b.xor,
                  "shl": b.shl, "shr": b.lshr}
        if name in simple:
            return simple[name](x, y)
        if name in ICMP:
            return b.icmp_signed(ICMP[name], x, y)
        if name in ("not", "bitnot"):
            return b.xor(x, ir.Constant(ty, -1))
        if name == "neg":
            return b.sub(ir.Constant(ty, 0), x)
        if name == "abs":
            return self.intrinsic(b, "llvm.abs", [x, ir.Constant(ir.IntType(1), 0)])
        if name in ("max", "min"):
            return self.minmax(b, name, x, y, "")
        if name == "sign":
            zero = ir.Constant(ty, 0)
            pos = b.zext(b.icmp_signed(">", x, zero), ty)
            neg = b.zext(b.icmp_signed("<", x, zero), ty)
            return b.sub(pos, neg)
        if name in ("div", "mod", "fmod"):
            return self._int_divide(b, name, x, y)
        if name == "isnan":
            return ir.Constant(_shaped(ty, ir.IntType(1)), 0)
        raise NotImplementedError(f"integer primitive {name}")

    def _int_divide(self, b: ir.IRBuilder, name: str, x: ir.Value, y: ir.Value) -> ir.Value:
        ty = x.type
        zero, one = ir.Constant(ty, 0), ir.Constant(ty, 1)
        low = ir.Constant(ty, -(1 << (_elem(ty).width - 1)))
        # y == 0 and MIN / -1 would trap: divide by 1 there instead.
        bad = b.or_(b.icmp_signed("==", y, zero),
                    b.and_(b.icmp_signed("==", y, ir.Constant(ty, -1)),
                           b.icmp_signed("==", x, low)))
        safe = b.select(bad, one, y)
        if name == "div":
            q = b.sdiv(x, safe)
            return b.select(b.icmp_signed("==", y, ir.Constant(ty, -1)), b.sub(zero, x), q)
        r = b.srem(x, safe)
        r = b.select(bad, zero, r)
        if name == "fmod":
            return r
        fix = b.and_(b.icmp_signed("!=", r, zero),
                     b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
        return b.select(fix, b.add(r, y), r)

    def cast(self, b: ir.IRBuilder, x: ir.Value, src: str, dst: str) -> ir.Value:
        """Convert between compute types; float16 rounds through half; narrow integers
        (computed in int32) wrap as onnxruntime's Cast does (through int32, low bits)."""
        ty = _shaped(x.type, COMPUTE[dst])
        if src == dst:
            return x
        if dst in NARROW_INTS:
            wide = self.cast(b, x, src, "int32")
            low = b.trunc(wide, _shaped(x.type, NARROW_INTS[dst]))
            return (b.zext if dst.startswith("u") else b.sext)(low, ty)
        if dst == "bool":
            if _is_float(x.type):
                return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
            return b.icmp_signed("!=", x, ir.Constant(x.type, 0))
        if dst == "bfloat16":  # through float32, then rounded to nearest even
            return round_bfloat16(b, self.cast(b, x, src, "float32"))
        if dst.startswith("float"):
            store_ty = _shaped(x.type, ir.HalfType()) if dst == "float16" else ty
            if _is_float(x.type):
                v = _fconvert(b, x, store_ty)
            elif src == "bool":
                v = b.uitofp(x, store_ty)
            else:
                v = b.sitofp(x, store_ty)
            return b.fpext(v, ty) if dst == "float16" else v
        if _is_float(x.type):
            return self.float_to_int(b, x, ty)
        width, to = _elem(x.type).width, _elem(ty).width
        if width < to:
            return b.zext(x, ty) if src == "bool" else b.sext(x, ty)
        return b.trunc(x, ty) if width > to else x

    def float_to_int(self, b: ir.IRBuilder, x: ir.Value, ty: ir.IntType) -> ir.Value:
        """onnxruntime's Cast on x86 (cvttss2si): truncate toward zero; NaN and values
        outside int32 (int64 for 64-bit targets) give its minimum; narrower targets go
        through int32 and keep the low bits (300.0 -> int8 44)."""
        bits = 64 if _elem(ty).width == 64 else 32
        wide = _shaped(ty, ir.IntType(bits))
        low = float(-(1 << (bits - 1)))
        ok = b.and_(b.fcmp_ordered(">=", x, ir.Constant(x.type, low)),
                    b.fcmp_ordered("<", x, ir.Constant(x.type, -low)))
        v = self.intrinsic_ret(b, "llvm.fptosi.sat", wide, x)  # in range: plain truncation
        v = b.select(ok, v, ir.Constant(wide, -(1 << (bits - 1))))
        return b.trunc(v, ty) if _elem(ty).width < bits else v

    def intrinsic_ret(self, b: ir.IRBuilder, name: str, ret: ir.Type, x: ir.Value) -> ir.Value:
        fn = self._fn(f"{name}.{_suffix(ret)}.{_suffix(x.type)}", ret, [x.type])
        return b.call(fn, [x])


_I16, _I32 = ir.IntType(16), ir.IntType(32)


def bfloat16_to_float(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The float32 value of bfloat16 bits (i16): they are its upper half, exactly."""
    return b.bitcast(b.shl(b.zext(bits, _I32), ir.Constant(_I32, 16)), ir.FloatType())


def _bfloat16_rounded_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """float32 x rounded to bfloat16 (nearest, ties to even; NaN stays a quiet NaN of the
    same sign; overflow gives inf), as its 32 bits with the low half zero."""
    bits = b.bitcast(x, _I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(_I32, 16)), ir.Constant(_I32, 1))
    rounded = b.add(b.add(bits, ir.Constant(_I32, 0x7FFF)), lsb)
    quiet = b.or_(bits, ir.Constant(_I32, 0x00400000))
    pick = b.select(b.fcmp_unordered("uno", x, x), quiet, rounded)
    return b.and_(pick, ir.Constant(_I32, -0x10000))  # 0xFFFF0000


def round_bfloat16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """float32 x rounded to the nearest bfloat16, kept as a float32 (the compute form)."""
    return b.bitcast(_bfloat16_rounded_bits(b, x), ir.FloatType())


def bfloat16_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """float32 x rounded to bfloat16, as the i16 that is stored."""
    return b.trunc(b.lshr(_bfloat16_rounded_bits(b, x), ir.Constant(_I32, 16)), _I16)


def _fconvert(b: ir.IRBuilder, x: ir.Value, ty: ir.Type) -> ir.Value:
    width = {ir.HalfType: 16, ir.FloatType: 32, ir.DoubleType: 64}
    if width[type(_elem(x.type))] < width[type(_elem(ty))]:
        return b.fpext(x, ty)
    if width[type(_elem(x.type))] > width[type(_elem(ty))]:
        return b.fptrunc(x, ty)
    return x
