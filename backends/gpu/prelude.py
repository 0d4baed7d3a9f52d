"""The source prelude of every rendered module: what differs between the CUDA and C targets
(qualifiers, float16 conversion, float bit casts, infinities, traps) and the helpers both
share (bfloat16 rounding, NaN-aware max/min, non-trapping integer division, ONNX casts,
arg-reduction combines).

No header is included on the CUDA side, so the same text compiles with NVRTC (CuPy) and
nvcc: float16 conversion is inline PTX (`cvt.rn.f16.f32`: round to nearest even), the
infinities are bit patterns. The C side uses gcc's _Float16 (the same rounding).
bfloat16 is integer arithmetic on the float's bits (no cuda_bf16.h), the same text on both
targets: only the bit cast (ac_f2u / ac_u2f) differs.
"""

from __future__ import annotations

CUDA_HEAD = r"""
#pragma nv_diag_suppress 177
#define AC_FN static __device__ __forceinline__
#define AC_ALIGN(n) __align__(n)
#define AC_INFF __int_as_float(0x7f800000)
#define AC_NANF __int_as_float(0x7fc00000)
#define AC_INF __longlong_as_double(0x7ff0000000000000LL)
#define AC_NAN __longlong_as_double(0x7ff8000000000000LL)
AC_FN float ac_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
AC_FN unsigned short ac_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
AC_FN unsigned short ac_d2h(double d) {
  unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h;
}
AC_FN unsigned ac_f2u(float f) { return __float_as_uint(f); }
AC_FN float ac_u2f(unsigned u) { return __uint_as_float(u); }
#define AC_TRAP() __trap()
#define AC_MUL_RNf(a, b) __fmul_rn(a, b)
#define AC_MUL_RN(a, b) __dmul_rn(a, b)
"""

C_HEAD = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>
#define AC_FN static inline
#define AC_ALIGN(n) __attribute__((aligned(n)))
#define __restrict__ restrict
#define AC_INFF ((float)INFINITY)
#define AC_NANF ((float)NAN)
#define AC_INF ((double)INFINITY)
#define AC_NAN ((double)NAN)
AC_FN float ac_h2f(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
AC_FN unsigned short ac_f2h(float f) {
  _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h;
}
AC_FN unsigned short ac_d2h(double d) {
  _Float16 x = (_Float16)d; unsigned short h; memcpy(&h, &x, 2); return h;
}
AC_FN unsigned ac_f2u(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
AC_FN float ac_u2f(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
#define AC_TRAP() abort()
/* a product rounded on its own: the volatile store keeps gcc's -ffp-contract=fast (which
   the host rendering uses, as NVRTC contracts) from fusing it into an FMA */
AC_FN float ac_mul_rnf(float a, float b) { volatile float r = a * b; return r; }
AC_FN double ac_mul_rn(double a, double b) { volatile double r = a * b; return r; }
#define AC_MUL_RNf(a, b) ac_mul_rnf(a, b)
#define AC_MUL_RN(a, b) ac_mul_rn(a, b)
"""

# bfloat16 is the upper half of a float32: rounding adds 0x7fff plus the lowest kept bit
# (ties to even; a carry into the exponent gives inf on overflow), then drops the low half.
# NaN is set quiet instead (adding could carry it into inf), keeping its sign.
SHARED = r"""
AC_FN float ac_round_h(float x) { return ac_h2f(ac_f2h(x)); }
AC_FN float ac_bf2f(unsigned short h) { return ac_u2f((unsigned)h << 16); }
AC_FN unsigned ac_bf_bits(float x) {
  const unsigned u = ac_f2u(x);
  if (x != x) return (u | 0x00400000u) & 0xffff0000u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}
AC_FN float ac_round_bf(float x) { return ac_u2f(ac_bf_bits(x)); }
AC_FN unsigned short ac_f2bf(float x) { return (unsigned short)(ac_bf_bits(x) >> 16); }
"""

# float helpers, written once for float ({t} = float, {f} = f) and double ({f} = "")
FLOAT_HELPERS = r"""
AC_FN {t} ac_max{f}({t} a, {t} b) {{  /* NaN-propagating; b where a == b (+0, -0) */
  if (a != a || b != b) return a + b;
  return a > b ? a : b;
}}
AC_FN {t} ac_min{f}({t} a, {t} b) {{
  if (a != a || b != b) return a + b;
  return a < b ? a : b;
}}
AC_FN {t} ac_sigmoid{f}({t} x) {{ return ({t})1 / (({t})1 + exp{f}(-x)); }}
AC_FN {t} ac_sign{f}({t} x) {{ return x > 0 ? ({t})1 : (x < 0 ? ({t})-1 : (x == x ? ({t})0 : x)); }}
AC_FN {t} ac_mod{f}({t} x, {t} y) {{  /* the result takes the divisor's sign */
  {t} r = fmod{f}(x, y);
  return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}}
AC_FN {t} ac_trap{f}({t} x) {{ AC_TRAP(); return x; }}
AC_FN int ac_{p}2i32({t} x) {{  /* onnxruntime on x86: NaN, out of range -> INT_MIN */
  return (x >= -2147483648.0{fl} && x < 2147483648.0{fl}) ? (int)x : (-2147483647 - 1);
}}
AC_FN long long ac_{p}2i64({t} x) {{
  return (x >= -9223372036854775808.0{fl} && x < 9223372036854775808.0{fl})
      ? (long long)x : (-9223372036854775807LL - 1);
}}
AC_FN int ac_sat_{p}2i32({t} x) {{
  return x != x ? 0 : (x <= -2147483648.0{fl} ? (-2147483647 - 1)
      : (x >= 2147483647.0{fl} ? 2147483647 : (int)x));
}}
AC_FN long long ac_sat_{p}2i64({t} x) {{
  return x != x ? 0 : (x <= -9223372036854775808.0{fl} ? (-9223372036854775807LL - 1)
      : (x >= 9223372036854775807.0{fl} ? 9223372036854775807LL : (long long)x));
}}
"""

# integer helpers for {t} = int / long long ({s} = i32 / i64, {u} its unsigned twin)
INT_HELPERS = r"""
AC_FN {t} ac_div_{s}({t} x, {t} y) {{
  /* never traps: y == 0 divides by 1 (a Check thunk reports it), x / -1 is -x wrapping */
  if (y == -1) return ({t})(({u})0 - ({u})x);
  return x / (y == 0 ? 1 : y);
}}
AC_FN {t} ac_fmod_{s}({t} x, {t} y) {{ return (y == 0 || y == -1) ? 0 : x % y; }}
AC_FN {t} ac_mod_{s}({t} x, {t} y) {{
  {t} r = ac_fmod_{s}(x, y);
  return (r != 0 && ((r < 0) != (y < 0))) ? ({t})(({u})r + ({u})y) : r;
}}
AC_FN {t} ac_shl_{s}({t} x, {t} y) {{
  return (y < 0 || y >= {bits}) ? 0 : ({t})(({u})x << y);
}}
AC_FN {t} ac_shr_{s}({t} x, {t} y) {{
  return (y < 0 || y >= {bits}) ? 0 : ({t})(({u})x >> y);
}}
AC_FN {t} ac_trap_{s}({t} x) {{ AC_TRAP(); return x; }}
"""

# Arg reductions keep (value, position); position -1 means "nothing yet". NaN never becomes
# the best (as the CPU backend's ordered compare); ties go to the lower position, or the
# higher one for the *_last kinds. The combine is symmetric, so lanes combined in any order
# agree.
ARG_HELPER = r"""
AC_FN void ac_{kind}_{s}({t}* v, long long* i, {t} x, long long j) {{
  if (x != x || j < 0) return;
  if (*i < 0 || x {cmp} *v || (x == *v && j {tie} *i)) {{ *v = x; *i = j; }}
}}
"""
ARG_KINDS = {"argmax": (">", "<"), "argmax_last": (">", ">"), "argmin": ("<", "<"),
             "argmin_last": ("<", ">")}
ARG_TYPES = {"f": "float", "d": "double", "i32": "int", "i64": "long long"}


def arg_suffix(dtype: str) -> str:
    """The helper suffix of an arg reduction over values of `dtype`."""
    if dtype in ("int8", "uint8", "int16", "uint16", "bool"):
        return "i32"
    return {"float16": "f", "bfloat16": "f", "float32": "f", "float64": "d", "int32": "i32",
            "int64": "i64"}[dtype]


def prelude(target: str) -> str:
    """Everything a rendered module's kernels may call, for target "cuda" or "c"."""
    parts = [CUDA_HEAD if target == "cuda" else C_HEAD, SHARED]
    for t, f, p, fl in (("float", "f", "f", "f"), ("double", "", "d", "")):
        parts.append(FLOAT_HELPERS.format(t=t, f=f, p=p, fl=fl))
    for t, s, u, bits in (("int", "i32", "unsigned", 32),
                          ("long long", "i64", "unsigned long long", 64)):
        parts.append(INT_HELPERS.format(t=t, s=s, u=u, bits=bits))
    for kind, (cmp, tie) in ARG_KINDS.items():
        for s, t in ARG_TYPES.items():
            parts.append(ARG_HELPER.format(kind=kind, s=s, t=t, cmp=cmp, tie=tie))
    return "".join(parts)
