"""Kernel IR scalar expressions -> C: dtypes, constants and a primitive -> C-expression table.

One table serves both targets of the GPU renderer: CUDA C (NVRTC or nvcc) and plain C (gcc,
for testing the same expressions on the host). Everything target-specific lives in the
prelude (`prelude.py`): float16 conversion, infinities, the `AC_FN` qualifier. Semantics
follow backends/cpu/mathops.py exactly:

- float16 is stored as its bit pattern (unsigned short) and computed in float; the kernel
  IR already rounds after every op (a `cast` to float16 is ac_round_h: to half and back).
  bfloat16 likewise (ac_round_bf: nearest even by bit operations, NaN stays a quiet NaN).
- int8/uint8/int16/uint16 are stored narrow and computed in int; a `cast` to one keeps
  the low bits of the int32 value (float -> int32 first: 300.0 -> int8 44).
- max/min propagate NaN; compares are ordered except `ne`; `round` is rint (half to even).
- integer add/sub/mul/neg wrap (through the unsigned type: signed overflow is undefined
  in C); div/mod never trap (a zero divisor and MIN / -1 are made harmless; a Check
  thunk has already reported zero divisors); shifts by the width or more give 0.
- float -> int32/int64 `cast` is onnxruntime's on x86: NaN and out-of-range give the
  type's minimum; `cast_sat` saturates (NaN -> 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from autoclust.kernel import ir as kir

# dtype -> (storage C type, compute C type)
TYPES: dict[str, tuple[str, str]] = {
    "float16": ("unsigned short", "float"),
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "int32": ("int", "int"),
    "int64": ("long long", "long long"),
    "bool": ("unsigned char", "int"),
    "bfloat16": ("unsigned short", "float"),
    "int8": ("signed char", "int"),
    "uint8": ("unsigned char", "int"),
    "int16": ("short", "int"),
    "uint16": ("unsigned short", "int"),
}
NARROW_INTS = ("int8", "uint8", "int16", "uint16")
UNSIGNED = {"int": "unsigned", "long long": "unsigned long long"}
# bits of the compute type: narrow ints reduce in int, as the CPU backend's accumulators
INT_BITS = {"int32": 32, "int64": 64, "bool": 32, **{t: 32 for t in NARROW_INTS}}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
            "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2}


def storage(dtype: str) -> str:
    return TYPES[dtype][0]


def compute(dtype: str) -> str:
    return TYPES[dtype][1]


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def itemsize(dtype: str) -> int:
    return ITEMSIZE[dtype]


def _computed_as(dtype: str) -> str:
    """The dtype whose C compute value a `dtype` value is (bfloat16: float32, int8: int32)."""
    if dtype == "bfloat16":
        return "float32"
    return "int32" if dtype in NARROW_INTS else dtype


def _fsuffix(dtype: str) -> str:
    """The C math-function suffix of a float compute type: expf, exp."""
    return "" if dtype == "float64" else "f"


def constant(value, dtype: str) -> str:
    """A C literal of `value` in the compute type of dtype."""
    if dtype == "bool":
        return "1" if value else "0"
    if dtype == "bfloat16":  # the register holds the rounded value
        value, dtype = float(np.float32(ml_dtypes.bfloat16(value))), "float32"
    if is_float(dtype):
        f = float(value)
        s = "" if dtype == "float64" else "F"
        if math.isnan(f):
            return f"AC_NAN{s}"
        if math.isinf(f):
            return f"AC_INF{s}" if f > 0 else f"(-AC_INF{s})"
        if dtype == "float64":
            text = repr(f)
        else:  # 9 significant digits round-trip any float32 (and float16) value exactly
            text = f"{float(np.float32(f)):.9g}"
        if not any(c in text for c in ".en"):
            text += ".0"
        return text if dtype == "float64" else text + "f"
    v = int(value)
    if dtype == "int64":
        if v == -(1 << 63):
            return "(-9223372036854775807LL - 1)"
        return f"{v}LL"
    if v == -(1 << 31):
        return "(-2147483647 - 1)"
    return str(v)


def reduce_init(kind: str, dtype: str) -> str:
    """The identity of a reduction kind (the start of max: -inf, of argmin: +inf)."""
    if kind in ("sum", "prod") or is_float(dtype):
        return constant(kir.reduce_identity(kind, dtype), dtype)
    bits = INT_BITS[dtype]
    return constant(kir.reduce_identity(kind, dtype, bits), "int64" if bits == 64 else "int32")


def accumulator(red: kir.Reduction) -> list[tuple[str, str]]:
    """(C type, name suffix) of a reduction's accumulator: value, plus position for arg*."""
    if red.kind.startswith("arg"):
        return [(compute(red.expr.dtype), "v"), ("long long", "i")]
    return [(compute(red.dtype), "")]


def accumulator_init(red: kir.Reduction) -> list[str]:
    """The starting values of accumulator(red)'s parts."""
    if red.kind.startswith("arg"):
        return [reduce_init(red.kind, red.expr.dtype), "-1"]
    if red.kind == "sum" and is_float(red.dtype):
        return [constant(kir.sum_start(red), red.dtype)]
    return [reduce_init(red.kind, red.dtype)]


def combine(kind: str, dtype: str, acc: str, x: str) -> str:
    """C expression: accumulator `acc` combined with value `x` (non-arg kinds).

    Float max/min propagate NaN (NumPy semantics, as the reference): a NaN x is taken,
    and a NaN accumulator stays (x > NaN is false). ArgMax/ArgMin's first-NaN rule (as
    onnxruntime) is applied after the row (kernels.py _finish_phase).
    Float sums reassociate across lanes, as the CPU backend's vectorized sums do.
    """
    if kind in ("sum", "prod"):
        sym = "+" if kind == "sum" else "*"
        if is_float(dtype):
            return f"({acc} {sym} {x})"
        t = compute(dtype)
        return f"(({t})(({UNSIGNED[t]}){acc} {sym} ({UNSIGNED[t]}){x}))"
    cmp = ">" if kind == "max" else "<"
    if is_float(dtype):
        return f"(({x}) {cmp} ({acc}) || ({x}) != ({x}) ? ({x}) : ({acc}))"
    return f"(({x}) {cmp} ({acc}) ? ({x}) : ({acc}))"


# ---- the primitive table ------------------------------------------------------------------
# Float templates take {0}, {1}, {2} (argument variables) and {f} (math suffix: "f" for float,
# "" for double). Arguments are always plain variable names or literals, so repeating {0}
# costs nothing.
FLOAT_OPS: dict[str, str] = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "div_exact": "({0} / {1})", "mul_exact": "AC_MUL_RN{f}({0}, {1})", "neg": "(-{0})", "abs": "fabs{f}({0})", "sqrt": "sqrt{f}({0})", "exp": "exp{f}({0})",
    "log": "log{f}({0})", "log1p": "log1p{f}({0})", "tanh": "tanh{f}({0})",
    "erf": "erf{f}({0})", "sigmoid": "ac_sigmoid{f}({0})", "floor": "floor{f}({0})",
    "ceil": "ceil{f}({0})", "round": "rint{f}({0})", "sign": "ac_sign{f}({0})",
    "sin": "sin{f}({0})", "cos": "cos{f}({0})", "tan": "tan{f}({0})",
    "asin": "asin{f}({0})", "acos": "acos{f}({0})", "atan": "atan{f}({0})",
    "sinh": "sinh{f}({0})", "cosh": "cosh{f}({0})", "asinh": "asinh{f}({0})",
    "acosh": "acosh{f}({0})", "atanh": "atanh{f}({0})",
    "pow": "pow{f}({0}, {1})", "max": "ac_max{f}({0}, {1})", "min": "ac_min{f}({0}, {1})",
    "fmod": "fmod{f}({0}, {1})", "mod": "ac_mod{f}({0}, {1})",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "isnan": "({0} != {0})",
    "trap": "ac_trap{f}({0})",
}
# Integer templates take {T} (compute type), {U} (its unsigned twin) and {s} (helper
# suffix: i32 / i64). bool computes as int 0/1 and uses these too.
INT_OPS: dict[str, str] = {
    "add": "(({T})(({U}){0} + ({U}){1}))", "sub": "(({T})(({U}){0} - ({U}){1}))",
    "mul": "(({T})(({U}){0} * ({U}){1}))", "neg": "(({T})(({U})0 - ({U}){0}))",
    "abs": "({0} < 0 ? ({T})(({U})0 - ({U}){0}) : {0})",
    "max": "({0} > {1} ? {0} : {1})", "min": "({0} < {1} ? {0} : {1})",
    "div": "ac_div_{s}({0}, {1})", "mod": "ac_mod_{s}({0}, {1})",
    "fmod": "ac_fmod_{s}({0}, {1})", "sign": "(({T})(({0} > 0) - ({0} < 0)))",
    "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "isnan": "0",
    "and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})",
    "bitand": "({0} & {1})", "bitor": "({0} | {1})", "bitxor": "({0} ^ {1})",
    "not": "(~{0})", "bitnot": "(~{0})", "shl": "ac_shl_{s}({0}, {1})",
    "shr": "ac_shr_{s}({0}, {1})", "trap": "ac_trap_{s}({0})",
}
BOOL_OPS = {"not": "(!{0})", "bitnot": "(!{0})"}  # bool is 0/1: ~1 would be -2


def primitive(name: str, args: list[str], arg_dtype: str) -> str:
    """The C expression of primitive `name` on argument variables whose dtype is arg_dtype
    (select, cast and cast_sat are handled by the caller)."""
    if is_float(arg_dtype):
        template = FLOAT_OPS.get(name)
        if template is None:
            raise NotImplementedError(f"float primitive {name}")
        return template.format(*args, f=_fsuffix(arg_dtype))
    template = (BOOL_OPS.get(name) if arg_dtype == "bool" else None) or INT_OPS.get(name)
    if template is None:
        raise NotImplementedError(f"integer primitive {name}")
    t = compute(arg_dtype)
    return template.format(*args, T=t, U=UNSIGNED[t], s="i64" if t == "long long" else "i32")


def cast(x: str, src: str, dst: str) -> str:
    """ONNX Cast from compute value x of dtype src to dtype dst (float16, bfloat16: rounded;
    narrow ints: the low bits of the int32 value, as the CPU backend's mathops.cast)."""
    if src == dst:
        return x
    src = _computed_as(src)
    if src == dst:
        return x
    if dst in NARROW_INTS:
        return f"((int)({storage(dst)}){cast(x, src, 'int32')})"
    if dst == "bfloat16":  # through float32 (float64: rounded twice, as on the CPU)
        return f"ac_round_bf({cast(x, src, 'float32')})"
    if dst == "bool":
        return f"({x} != {'0.0' if src == 'float64' else '0.0f'})" if is_float(src) \
            else f"({x} != 0)"
    if dst == "float16":
        if src == "float64":
            return f"ac_h2f(ac_d2h({x}))"  # one rounding, as LLVM's fptrunc double -> half
        return f"ac_round_h({x})" if is_float(src) else f"ac_round_h((float){x})"
    if dst == "float32":
        return x if src == "float16" else f"((float){x})"
    if dst == "float64":
        return f"((double){x})"
    if is_float(src):
        frm = "d" if src == "float64" else "f"
        return f"ac_{frm}2{'i64' if dst == 'int64' else 'i32'}({x})"
    return f"(({compute(dst)}){x})"


def cast_sat(x: str, src: str, dst: str) -> str:
    """float -> integer, saturating (integer reductions accumulate in float64)."""
    frm = "d" if src == "float64" else "f"
    return f"ac_sat_{frm}2{'i64' if dst == 'int64' else 'i32'}({x})"


# ---- affine indices -----------------------------------------------------------------------

def affine(a: kir.Affine, ivs: list[str]) -> str:
    """C text of const + sum(coeff * i_k), with loop index names ivs."""
    terms = []
    for c, iv in zip(a.coeffs, ivs):
        if c == 1:
            terms.append(iv)
        elif c:
            terms.append(f"{c} * {iv}")
    if a.const or not terms:
        terms.append(str(a.const))
    return " + ".join(terms)


def clamp(iv: str, lo: int, hi: int) -> str:
    """min(max(iv, lo), hi), branch-free in the generated code (a select each)."""
    return f"({iv} < {lo} ? {lo} : ({iv} > {hi} ? {hi} : {iv}))"


class ExprEmitter:
    """Emits `const T vN = ...;` lines for expressions of one loop body (memoized).

    `ivs` names the loop indices i0..i(r-1) in this scope, `reduced` the Reduced values,
    `load_override(load) -> str | None` lets the vector path substitute a lane of an
    already loaded vector for a Load.
    """

    def __init__(self, lines: list[str], indent: str, ivs: list[str], reduced: list[str],
                 buf_dtypes: dict[int, str],
                 load_override: Callable[[kir.Load], str | None] | None = None,
                 prefix: str = "v"):
        self.lines = lines
        self.indent = indent
        self.ivs = ivs
        self.reduced = reduced
        self.buf_dtypes = buf_dtypes
        self.load_override = load_override
        self.memo: dict = {}
        self.prefix = prefix
        self.count = 0

    def value(self, e: kir.Expr) -> str:
        """A variable (or literal) holding e's compute value in this scope."""
        got = self.memo.get(e)
        if got is None:
            got = self._value(e)
            self.memo[e] = got
        return got

    def _emit(self, dtype: str, text: str) -> str:
        name = f"{self.prefix}{self.count}"
        self.count += 1
        self.lines.append(f"{self.indent}const {compute(dtype)} {name} = {text};")
        return name

    def address(self, buf: int, index: kir.Affine, clamps: tuple = (), dyn: tuple = ()) -> str:
        """The element offset of buf[index] (clamped loop dims, data-dependent terms)."""
        ivs = list(self.ivs)
        for d, lo, hi in clamps:
            ivs[d] = clamp(ivs[d], lo, hi)
        text = affine(index, ivs)
        if dyn:  # gather positions are int64 values: the sum is done in 64 bits
            parts = [f"(long long)({text})"]
            for e, stride in dyn:
                v = self.value(e)
                parts.append(v if stride == 1 else f"{v} * {stride}LL")
            text = " + ".join(parts)
        return text

    def load(self, e: kir.Load) -> str:
        raw = f"b{e.buf}[{self.address(e.buf, e.index, e.clamps, e.dyn)}]"
        return from_storage(raw, e.dtype)

    def _value(self, e: kir.Expr) -> str:
        if isinstance(e, kir.Const):
            return constant(e.value, e.dtype)
        if isinstance(e, kir.Reduced):
            return self.reduced[e.phase]
        if isinstance(e, kir.Index):
            return self._emit("int64", f"(long long)({affine(e.index, self.ivs)})")
        if isinstance(e, kir.Load):
            if self.load_override is not None:
                got = self.load_override(e)
                if got is not None:
                    return got
            return self._emit(e.dtype, self.load(e))
        args = [self.value(a) for a in e.args]
        if e.name == "select":
            return self._emit(e.dtype, f"({args[0]} ? {args[1]} : {args[2]})")
        if e.name == "cast":
            return self._emit(e.dtype, cast(args[0], e.args[0].dtype, e.dtype))
        if e.name == "cast_sat":
            return self._emit(e.dtype, cast_sat(args[0], e.args[0].dtype, e.dtype))
        return self._emit(e.dtype, primitive(e.name, args, e.args[0].dtype))

    def store(self, s: kir.Store, dtype: str, value: str | None = None) -> None:
        """Emit buf[index] = expr (converted to the storage type)."""
        v = self.value(s.expr) if value is None else value
        self.lines.append(f"{self.indent}b{s.buf}[{self.address(s.buf, s.index)}] = "
                          f"{to_storage(v, dtype)};")


def to_storage(v: str, dtype: str) -> str:
    """A compute value converted to its storage type (float16 and bfloat16 bits, bool
    bytes, narrow ints: their low bits)."""
    if dtype == "float16":
        return f"ac_f2h({v})"
    if dtype == "bfloat16":
        return f"ac_f2bf({v})"
    if dtype == "bool" or dtype in NARROW_INTS:
        return f"({storage(dtype)})({v})"
    return v


def from_storage(raw: str, dtype: str) -> str:
    """A stored element as its compute value (narrow ints sign- or zero-extend to int)."""
    if dtype == "float16":
        return f"ac_h2f({raw})"
    if dtype == "bfloat16":
        return f"ac_bf2f({raw})"
    if dtype == "bool":
        return f"({raw} != 0)"
    if dtype in NARROW_INTS:
        return f"((int){raw})"
    return raw
