"""Branch-free, vectorizable math functions emitted as inline LLVM IR.

LLVM lowers its exp/log/tanh intrinsics to scalar libm calls, which stops the loop vectorizer,
and erf has no intrinsic at all. Every function here is straight-line IR built from
arithmetic, integer bit tricks on bitcasts, selects and the few intrinsics that vectorize
(fabs, rint, copysign, fmuladd, minnum, maxnum), so a fused elementwise loop becomes SIMD.

Works on float, double and vectors of either. Special values (NaN, +-inf, +-0, denormals)
follow libm. Measured max error (asserted in tests/cpu/test_mathlib.py), float32 over a sweep of
every 997th bit pattern / float64 vs long double or mpmath:
exp 1 / 0.88 ulp, log 1 / 0.74, tanh 1 / 1.26, sigmoid 2 / 1.98, erf 1 / 0.67, expm1 2 / 2.05,
log1p 2 / 1.91, softplus 2. Composites (silu, mish, gelu_*) add their condition number.
float32 gelu_erf flushes to -0 below x = -5.66 (|error| < 5e-8). pow is not provided.

exp scales by 2^n with llvm.ldexp where the host has AVX-512 (one vscalefps), else with two
exponent-bit factors; both round once and give the same bits. Results that are exactly 0
are selected, never computed through denormals (microcode assists on Intel cores).

The float64 exp, log and erf use the published fdlibm (FreeBSD msun) coefficients:
Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved. Developed at SunPro, a Sun
Microsystems, Inc. business. Permission to use, copy, modify, and distribute this software is
freely granted, provided that this notice is preserved. The float32 exp uses Cephes' expf
polynomial; the tanh and float32 erf polynomials are our own minimax (Lawson) fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autoclust.backends.cpu.jit import has_avx512
from llvmlite import ir

from autoclust.errors import CompileError, UnsupportedOpError

LOG2E = 1.4426950408889634
SQRT1_2 = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654

# Per-precision constants: clamp bounds, Cody-Waite splits of ln2, polynomial coefficients
# (lowest degree first), and the bit layout used to build 2^n and split exponents.
_F32 = {
    "bits": 32, "mant": 23, "bias": 127, "sqrt_half_bits": 0x3F3504F3,
    "exp_lo": -104.0, "exp_hi": 89.0,  # beyond: exactly 0 / +inf after scaling
    "exp_ln2_hi": 0.693359375, "exp_ln2_lo": -2.12194440e-4,
    # Cephes expf: e^r = 1 + r + r^2 * P(r) on |r| <= ln2/2
    "exp_p": (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
              1.3981999507e-3, 1.9875691500e-4),
    "log_ln2_hi": 6.9313812256e-01, "log_ln2_lo": 9.0580006145e-06,
    "log_denorm_scale": 2.0 ** 25, "log_denorm_exp": -25.0,
    # log(1+f) = f - hfsq + s*(hfsq + z*Lodd(w) + w*Leven(w)), s = f/(2+f), z = s^2, w = z^2
    "log_odd": (0.66666662693, 0.28498786688),
    "log_even": (0.40000972152, 0.24279078841),
    # tanh(x) = x + x^3 * P(x^2) on |x| < 0.625 (relative error 4e-9)
    "tanh_p": (-0.3333328068256378, 0.13331441581249237, -0.05373971164226532,
               0.020639078691601753, -0.005704978480935097),
    # erf(x) = x + x * A(x^2) on |x| < 1 (relative error 1.2e-9); A(0) = 2/sqrt(pi) - 1
    "erf_a": (0.12837916709551257, -0.3761262595653534, 0.1128358542919159,
              -0.026853810995817184, 0.005188327748328447, -0.0008010192541405559,
              7.853859278839082e-05),
    # log(erfc(x)) = B(x) on 1 <= x <= 4 (absolute error 1.2e-8)
    "erf_b": (0.0002910330076701939, -1.130119800567627, -0.6320133805274963,
              -0.1099097728729248, 0.026327550411224365, -0.004727697465568781,
              0.0005902052507735789, -4.529833677224815e-05, 1.5998315348042524e-06),
}

_F64 = {
    "bits": 64, "mant": 52, "bias": 1023, "sqrt_half_bits": 0x3FE6A09E667F3BCD,
    "exp_lo": -746.0, "exp_hi": 710.0,
    "exp_ln2_hi": 6.93147180369123816490e-01, "exp_ln2_lo": 1.90821492927058770002e-10,
    # fdlibm exp: c = r - r^2 * P(r^2); e^r = 1 + r + r*c/(2-c)
    "exp_p": (1.66666666666666019037e-01, -2.77777777770155933842e-03,
              6.61375632143793436117e-05, -1.65339022054652515390e-06,
              4.13813679705723846039e-08),
    "log_ln2_hi": 6.93147180369123816490e-01, "log_ln2_lo": 1.90821492927058770002e-10,
    "log_denorm_scale": 2.0 ** 54, "log_denorm_exp": -54.0,
    "log_odd": (6.666666666666735130e-01, 2.857142874366239149e-01, 1.818357216161805012e-01,
                1.479819860511658591e-01),
    "log_even": (3.999999999940941908e-01, 2.222219843214978396e-01,
                 1.531383769920937332e-01),
    # tanh(x) = x + x^3 * P(x^2) on |x| < 0.625 (relative error 1e-17)
    "tanh_p": (-0.33333333333332854, 0.13333333333262076, -0.0539682539312597,
               0.021869487575914642, -0.008863221000415072, 0.0035919891572435986,
               -0.0014549587992772589, 0.0005863163013677352, -0.00022856376150860432,
               7.714388887069652e-05, -1.6072350398386895e-05),
}

# fdlibm erf/erfc pieces (float64): [0, 0.84375), [0.84375, 1.25), [1.25, 1/0.35), [1/0.35, 28)
_ERF64 = {
    "erx": 8.45062911510467529297e-01,
    "pp": (1.28379167095512558561e-01, -3.25042107247001499370e-01,
           -2.84817495755985104766e-02, -5.77027029648944159157e-03,
           -2.37630166566501626084e-05),
    "qq": (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02,
           5.08130628187576562776e-03, 1.32494738004321644526e-04,
           -3.96022827877536812320e-06),
    "pa": (-2.36211856075265944077e-03, 4.14856118683748331666e-01,
           -3.72207876035701323847e-01, 3.18346619901161753674e-01,
           -1.10894694282396677476e-01, 3.54783043256182359371e-02,
           -2.16637559486879084300e-03),
    "qa": (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01,
           7.18286544141962662868e-02, 1.26171219808761642112e-01,
           1.36370839120290507362e-02, 1.19844998467991074170e-02),
    "ra": (-9.86494403484714822705e-03, -6.93858572707181764372e-01,
           -1.05586262253232909814e+01, -6.23753324503260060396e+01,
           -1.62396669462573470355e+02, -1.84605092906711035994e+02,
           -8.12874355063065934246e+01, -9.81432934416914548592e+00),
    "sa": (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02,
           4.34565877475229228821e+02, 6.45387271733267880336e+02,
           4.29008140027567833386e+02, 1.08635005541779435134e+02,
           6.57024977031928170135e+00, -6.04244152148580987438e-02),
    "rb": (-9.86494292470009928597e-03, -7.99283237680523006574e-01,
           -1.77579549177547519889e+01, -1.60636384855821916062e+02,
           -6.37566443368389627722e+02, -1.02509513161107724954e+03,
           -4.83519191608651397019e+02),
    "sb": (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02,
           1.53672958608443695994e+03, 3.19985821950859553908e+03,
           2.55305040643316442583e+03, 4.74528541206955367215e+02,
           -2.24409524465858183362e+01),
}


class _Ops:
    """Typed arithmetic on one float type (scalar or vector): the vocabulary of the recipes."""

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type) -> None:
        self.b = builder
        self.ty = ty
        self.lanes = ty.count if isinstance(ty, ir.VectorType) else 0
        elem = ty.element if self.lanes else ty
        self.is64 = isinstance(elem, ir.DoubleType)
        self.k = _F64 if self.is64 else _F32
        ielem = ir.IntType(self.k["bits"])
        self.ity = ir.VectorType(ielem, self.lanes) if self.lanes else ielem
        suffix = "f64" if self.is64 else "f32"
        self.suffix = f"v{self.lanes}{suffix}" if self.lanes else suffix

    # constants and intrinsics
    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, [v] * self.lanes if self.lanes else v)

    def ic(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, [v] * self.lanes if self.lanes else v)

    def intr(self, name: str, *args: ir.Value) -> ir.Value:
        fty = ir.FunctionType(self.ty, [self.ty] * len(args))
        return self.b.call(self.declare(f"llvm.{name}.{self.suffix}", fty), list(args))

    def declare(self, name: str, fty: ir.FunctionType) -> ir.Function:
        """The module's function `name` (an intrinsic), declared on first use."""
        fn = self.b.module.globals.get(name)
        return fn if fn is not None else ir.Function(self.b.module, fty, name=name)

    # float arithmetic
    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fsub(a, b)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b)

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fdiv(a, b)

    def neg(self, a: ir.Value) -> ir.Value:
        return self.b.fneg(a)

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        # fmuladd fuses where the target has FMA and stays a mul+add (not a libm call) elsewhere
        return self.intr("fmuladd", a, b, c)

    def poly(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """Horner evaluation; coeffs lowest degree first."""
        acc = self.c(coeffs[-1])
        for coef in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(coef))
        return acc

    def abs(self, a: ir.Value) -> ir.Value:
        return self.intr("fabs", a)

    def min(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.intr("minnum", a, b)

    def max(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.intr("maxnum", a, b)

    def copysign(self, mag: ir.Value, sign: ir.Value) -> ir.Value:
        return self.intr("copysign", mag, sign)

    # comparisons and selects (ordered: false when either side is NaN)
    def cmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered(op, a, b)

    def isnan(self, a: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", a, a)

    def sel(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def keep_nan(self, x: ir.Value, y: ir.Value) -> ir.Value:
        """y, except NaN where x is NaN (min/max clamps would otherwise swallow it)."""
        return self.sel(self.isnan(x), x, y)

    # bit views
    def to_bits(self, a: ir.Value) -> ir.Value:
        return self.b.bitcast(a, self.ity)

    def from_bits(self, a: ir.Value) -> ir.Value:
        return self.b.bitcast(a, self.ty)




def _ldexp(o: _Ops, p: ir.Value, n: ir.Value) -> ir.Value:
    b = o.b
    i32 = ir.IntType(32)
    ity = ir.VectorType(i32, o.lanes) if o.lanes else i32
    isuffix = f"v{o.lanes}i32" if o.lanes else "i32"
    name = f"llvm.ldexp.{o.suffix}.{isuffix}"
    return b.call(o.declare(name, ir.FunctionType(o.ty, [o.ty, ity])), [p, b.fptosi(n, ity)])


def _scale_pow2(o: _Ops, p: ir.Value, n: ir.Value) -> ir.Value:
    """p * 2^n for integral float n in [-1076, 1024]: two factors so each stays normal."""
    b = o.b
    if has_avx512():
        # vscalefps: one instruction, one rounding, denormal and overflow results included
        # (elsewhere llvm.ldexp would become a scalar libm call, so the bit tricks stay)
        return _ldexp(o, p, n)
    ni = b.fptosi(n, o.ity)
    n1 = b.ashr(ni, o.ic(1))
    n2 = b.sub(ni, n1)
    bias, mant = o.ic(o.k["bias"]), o.ic(o.k["mant"])
    s1 = o.from_bits(b.shl(b.add(n1, bias), mant))
    s2 = o.from_bits(b.shl(b.add(n2, bias), mant))
    # p*s1 is exact (normal range); the only rounding is the final one, also for denormals
    return o.mul(o.mul(p, s1), s2)


def _exp(o: _Ops, x: ir.Value, bounded: bool = False, sign: int = 0,
         lo: float | None = None) -> ir.Value:
    """e^x; bounded: the caller guarantees x is finite with a normal result (no clamps);
    sign 1 / -1: the caller guarantees x >= 0 / x <= 0 (or NaN), dropping one clamp;
    lo: x below it gives exactly 0 (at least exp_lo, where e^x leaves the denormals)."""
    k = o.k
    if bounded:
        return _scale_pow2(o, *_exp_reduced(o, x))
    lo = k["exp_lo"] if lo is None else max(lo, k["exp_lo"])
    if _full_zmm(o):
        return _exp_zmm(o, x, sign, lo)
    # Below lo the result is exactly 0. Selecting it (and feeding 0 through the math)
    # keeps such lanes off the denormal path: an underflowing multiply costs a microcode
    # assist of ~100 cycles per instruction on Intel cores (masked softmax hits it per row).
    zero = o.cmp("<", x, o.c(lo)) if sign <= 0 else None
    xc = x if zero is None else o.sel(zero, o.c(0.0), x)
    xc = o.min(xc, o.c(k["exp_hi"])) if sign >= 0 else xc
    y = _scale_pow2(o, *_exp_reduced(o, xc))
    return o.keep_nan(x, y if zero is None else o.sel(zero, o.c(0.0), y))


def _full_zmm(o: _Ops) -> bool:
    """Whether o's type is one full AVX-512 register (16 floats, 8 doubles) on a host that
    has them: the width the explicit vector code (vectorize.py) uses."""
    return o.lanes * o.k["bits"] == 512 and has_avx512()


def _exp_zmm(o: _Ops, x: ir.Value, sign: int, lo: float) -> ir.Value:
    """e^x on a full AVX-512 vector in 4 fewer instructions than the generic recipe (softmax
    rows spend most of their time here): lanes below exp_lo are zeroed by the mask of one
    masked vscalef, which never computes them (an underflowing vscalef costs a microcode
    assist, 25x a normal one: measured), instead of selecting 0 before and after the math;
    the clamp at exp_hi is a compare-select that keeps NaN (no NaN test after); and vscalef
    takes the integral float n as it is (llvm.ldexp converts it to int and back)."""
    k, b = o.k, o.b
    keep = b.not_(o.cmp("<", x, o.c(lo))) if sign <= 0 else None
    # ordered >: NaN is not above, so it stays and runs through the math as NaN
    xc = o.sel(o.cmp(">", x, o.c(k["exp_hi"])), o.c(k["exp_hi"]), x) if sign >= 0 else x
    p, n = _exp_reduced(o, xc)
    mask_ty = ir.IntType(o.lanes)
    mask = b.bitcast(keep, mask_ty) if keep is not None else ir.Constant(mask_ty, -1)
    name = f"llvm.x86.avx512.mask.scalef.{'pd' if o.is64 else 'ps'}.512"
    fn = o.declare(name, ir.FunctionType(o.ty, [o.ty, o.ty, o.ty, mask_ty, ir.IntType(32)]))
    # rounding 4: the current direction (MXCSR), as an unmasked vscalef
    return b.call(fn, [p, n, o.c(0.0), mask, ir.Constant(ir.IntType(32), 4)])


def _exp_reduced(o: _Ops, xc: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(p, n) with e^xc = p * 2^n, n integral, for xc in [exp_lo, exp_hi]."""
    k = o.k
    n = o.intr("rint", o.mul(xc, o.c(LOG2E)))
    # Cody-Waite: n*ln2_hi is exact, so hi carries no rounding error
    hi = o.fma(n, o.c(-k["exp_ln2_hi"]), xc)
    if o.is64:
        lo = o.mul(n, o.c(k["exp_ln2_lo"]))
        r = o.sub(hi, lo)
        t = o.mul(r, r)
        c = o.fma(o.neg(t), o.poly(t, k["exp_p"]), r)
        # e^r = 1 - ((lo - r*c/(2-c)) - hi)
        q = o.div(o.mul(r, c), o.sub(o.c(2.0), c))
        p = o.sub(o.c(1.0), o.sub(o.sub(lo, q), hi))
    else:
        r = o.fma(n, o.c(-k["exp_ln2_lo"]), hi)
        p = o.add(o.fma(o.mul(r, r), o.poly(r, k["exp_p"]), r), o.c(1.0))
    return p, n


def _log_reduce(o: _Ops, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """x = 2^k * (1+f) with 1+f in [sqrt(1/2), sqrt(2)); returns (k as float, f)."""
    b, k = o.b, o.k
    # denormals: scale into the normal range first, undo in k
    tiny = o.cmp("<", x, o.c(2.0 ** (1 - k["bias"])))
    xs = o.sel(tiny, o.mul(x, o.c(k["log_denorm_scale"])), x)
    kadj = o.sel(tiny, o.c(k["log_denorm_exp"]), o.c(0.0))
    ix = o.to_bits(xs)
    tmp = b.sub(ix, o.ic(k["sqrt_half_bits"]))
    ki = b.ashr(tmp, o.ic(k["mant"]))
    exp_mask = -(1 << k["mant"])  # all bits above the mantissa
    m = o.from_bits(b.sub(ix, b.and_(tmp, o.ic(exp_mask))))
    kf = o.add(b.sitofp(ki, o.ty), kadj)
    return kf, o.sub(m, o.c(1.0))


def _log_specials(o: _Ops, x: ir.Value, y: ir.Value) -> ir.Value:
    y = o.sel(o.cmp("==", x, o.c(float("inf"))), x, y)
    y = o.sel(o.cmp("==", x, o.c(0.0)), o.c(float("-inf")), y)
    y = o.sel(o.cmp("<", x, o.c(0.0)), o.c(float("nan")), y)
    return o.keep_nan(x, y)


def _log(o: _Ops, x: ir.Value) -> ir.Value:
    k = o.k
    kf, f = _log_reduce(o, x)
    s = o.div(f, o.add(f, o.c(2.0)))
    z = o.mul(s, s)
    w = o.mul(z, z)
    r = o.add(o.mul(z, o.poly(w, k["log_odd"])), o.mul(w, o.poly(w, k["log_even"])))
    hfsq = o.mul(o.mul(f, f), o.c(0.5))
    # log = k*ln2_hi - ((hfsq - (s*(hfsq+R) + k*ln2_lo)) - f), fdlibm's error-free ordering
    t = o.fma(s, o.add(hfsq, r), o.mul(kf, o.c(k["log_ln2_lo"])))
    y = o.fma(kf, o.c(k["log_ln2_hi"]), o.neg(o.sub(o.sub(hfsq, t), f)))
    return _log_specials(o, x, y)


def _log1p(o: _Ops, x: ir.Value) -> ir.Value:
    # Goldberg: log1p(x) = log(w) * x / (w - 1) with w = 1 + x; the ratio cancels w's rounding
    w = o.add(x, o.c(1.0))
    wm1 = o.sub(w, o.c(1.0))
    y = o.mul(_log(o, w), o.div(x, wm1))
    y = o.sel(o.cmp("==", wm1, o.c(0.0)), x, y)
    return o.sel(o.cmp("==", x, o.c(float("inf"))), x, y)


def _expm1(o: _Ops, x: ir.Value) -> ir.Value:
    # Kahan: expm1(x) = (u - 1) * x / log(u) with u = exp(x); errors in u cancel in the ratio
    u = _exp(o, x)
    um1 = o.sub(u, o.c(1.0))
    y = o.mul(um1, o.div(x, _log(o, u)))
    y = o.sel(o.cmp("==", um1, o.c(0.0)), x, y)
    y = o.sel(o.cmp("==", um1, o.c(-1.0)), um1, y)
    return o.sel(o.cmp("==", u, o.c(float("inf"))), u, y)


def _tanh(o: _Ops, x: ir.Value) -> ir.Value:
    ax = o.abs(x)
    x2 = o.mul(x, x)
    small = o.fma(o.mul(x, x2), o.poly(x2, o.k["tanh_p"]), x)
    # |x| >= 0.625: 1 - 2/(e^2|x| + 1) >= 0.55, so the subtraction loses nothing; inf -> 1
    e = _exp(o, o.add(ax, ax), sign=1)
    big = o.sub(o.c(1.0), o.div(o.c(2.0), o.add(e, o.c(1.0))))
    # copysign also keeps tanh(-0) = -0, which the polynomial's -0*P + -0 would lose
    return o.copysign(o.sel(o.cmp("<", ax, o.c(0.625)), small, big), x)


def _sigmoid(o: _Ops, x: ir.Value) -> ir.Value:
    # e = exp(-|x|) never overflows; x < 0 uses e/(1+e) so tiny results keep full precision
    e = _exp(o, o.neg(o.abs(x)), sign=-1)
    d = o.add(e, o.c(1.0))
    # one division: selecting the numerator first gives the same values as two divisions
    return o.div(o.sel(o.cmp(">=", x, o.c(0.0)), o.c(1.0), e), d)


def _erf_parts32(o: _Ops, ax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(erf(ax), erfc(ax)) for ax >= 0 in float32; erfc flushes to 0 above ax = 4."""
    k = o.k
    # x + x*A: the leading 1 stays exact, so small |x| rounds once
    pa = o.fma(ax, o.poly(o.mul(ax, ax), k["erf_a"]), ax)
    # B on [0, 4] (a NaN ax becomes 4 in minnum) lies in [-18, 0.001]: no clamps needed
    ec = _exp(o, o.poly(o.min(ax, o.c(4.0)), k["erf_b"]), bounded=True)
    small = o.cmp("<", ax, o.c(1.0))
    erf = o.sel(small, pa, o.sub(o.c(1.0), ec))
    erfc = o.sel(small, o.sub(o.c(1.0), pa), o.sel(o.cmp(">", ax, o.c(4.0)), o.c(0.0), ec))
    return erf, erfc


def _ratio(o: _Ops, x: ir.Value, num: str, den: str) -> ir.Value:
    return o.div(o.poly(x, _ERF64[num]), o.poly(x, _ERF64[den]))


def _erfc_tail64(o: _Ops, ax: ir.Value) -> ir.Value:
    """erfc(ax) for 1.25 <= ax (fdlibm); finite garbage below, exactly 0 from 28 up."""
    b = o.b
    at = o.min(o.max(ax, o.c(1.25)), o.c(28.0))
    s = o.div(o.c(1.0), o.mul(at, at))
    rs = o.sel(o.cmp("<", at, o.c(1.0 / 0.35)), _ratio(o, s, "ra", "sa"),
               _ratio(o, s, "rb", "sb"))
    # z = at with the low 32 bits cleared, so z*z is exact and -at^2 = -z*z + (z-at)*(z+at)
    z = o.from_bits(b.and_(o.to_bits(at), o.ic(-(1 << 32))))
    e1 = _exp(o, o.sub(o.neg(o.mul(z, z)), o.c(0.5625)))
    e2 = _exp(o, o.fma(o.sub(z, at), o.add(z, at), rs))
    return o.div(o.mul(e1, e2), at)


def _erf_parts64(o: _Ops, ax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(erf(ax), erfc(ax)) for ax >= 0 in float64."""
    one, erx = o.c(1.0), o.c(_ERF64["erx"])
    # [0, 0.84375): erf = x + x*P/Q(x^2)
    xy = o.mul(ax, _ratio(o, o.mul(ax, ax), "pp", "qq"))
    erf1 = o.add(ax, xy)
    erfc1 = o.sel(o.cmp("<", ax, o.c(0.25)), o.sub(one, erf1),
                  o.sub(o.c(0.5), o.add(xy, o.sub(ax, o.c(0.5)))))
    # [0.84375, 1.25): erf = erx + P/Q(x-1)
    pq = _ratio(o, o.sub(ax, one), "pa", "qa")
    erf2, erfc2 = o.add(erx, pq), o.sub(o.sub(one, erx), pq)
    erfc3 = _erfc_tail64(o, ax)
    erf3 = o.sub(one, erfc3)
    lt1 = o.cmp("<", ax, o.c(0.84375))
    lt2 = o.cmp("<", ax, o.c(1.25))
    erf = o.sel(lt1, erf1, o.sel(lt2, erf2, erf3))
    erfc = o.sel(lt1, erfc1, o.sel(lt2, erfc2, erfc3))
    return erf, erfc


def _erf_parts(o: _Ops, ax: ir.Value) -> tuple[ir.Value, ir.Value]:
    return _erf_parts64(o, ax) if o.is64 else _erf_parts32(o, ax)


def _erf(o: _Ops, x: ir.Value) -> ir.Value:
    erf, _ = _erf_parts(o, o.abs(x))
    return o.keep_nan(x, o.copysign(erf, x))


def _gelu_erf(o: _Ops, x: ir.Value) -> ir.Value:
    # x < 0 uses erfc(|z|) directly: 1 + erf(z) would cancel catastrophically
    erf, erfc = _erf_parts(o, o.abs(o.mul(x, o.c(SQRT1_2))))
    phi2 = o.sel(o.cmp("<", x, o.c(0.0)), erfc, o.add(o.c(1.0), erf))
    return o.keep_nan(x, o.mul(o.mul(x, o.c(0.5)), phi2))


def _gelu_tanh(o: _Ops, x: ir.Value) -> ir.Value:
    # 0.5*x*(1 + tanh(u)) == x*sigmoid(2u): no cancellation for negative x
    x3 = o.mul(o.mul(x, x), x)
    u2 = o.mul(o.fma(x3, o.c(0.044715), x), o.c(2.0 * SQRT_2_OVER_PI))
    return o.mul(x, _sigmoid(o, u2))


def _softplus(o: _Ops, x: ir.Value) -> ir.Value:
    y = o.add(o.max(x, o.c(0.0)), _log1p(o, _exp(o, o.neg(o.abs(x)))))
    return o.keep_nan(x, y)


def _silu(o: _Ops, x: ir.Value) -> ir.Value:
    return o.mul(x, _sigmoid(o, x))


def _mish(o: _Ops, x: ir.Value) -> ir.Value:
    return o.mul(x, _tanh(o, _softplus(o, x)))


_UNARY: dict[str, Callable[[_Ops, ir.Value], ir.Value]] = {
    "exp": _exp, "log": _log, "tanh": _tanh, "sigmoid": _sigmoid, "erf": _erf,
    "expm1": _expm1, "log1p": _log1p, "softplus": _softplus, "gelu_erf": _gelu_erf,
    "gelu_tanh": _gelu_tanh, "mish": _mish, "silu": _silu,
}

SUPPORTED: frozenset[str] = frozenset(_UNARY)


def exp_below(builder: ir.IRBuilder, x: ir.Value, lo: float | None = None,
              nonpositive: bool = False) -> ir.Value:
    """e^x where x < lo gives exactly 0 -- exp(select(x < lo, -inf, x)) in one masked
    step, the same bits (Softmax's flush of results below the smallest normal,
    autoclust/ops/normalization.py) -- and, with `nonpositive`, no clamp at the top:
    the caller guarantees x <= 0 or NaN (x minus the maximum of its row)."""
    if not _is_float_type(x.type):
        raise CompileError(f"mathlib.exp_below: argument type {x.type} is not float/double")
    return _exp(_Ops(builder, x.type), x, sign=-1 if nonpositive else 0, lo=lo)


def _is_float_type(ty: ir.Type) -> bool:
    elem = ty.element if isinstance(ty, ir.VectorType) else ty
    return isinstance(elem, (ir.FloatType, ir.DoubleType))


def call(builder: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
    """Emit branch-free IR for math function `name` on float/double (or vector) args."""
    if name not in SUPPORTED:
        raise UnsupportedOpError(
            f"mathlib: no vectorizable function {name!r}; supported: {sorted(SUPPORTED)}")
    if len(args) != 1:
        raise CompileError(f"mathlib.{name}: expects 1 argument, got {len(args)}")
    ty = args[0].type
    if not _is_float_type(ty):
        raise CompileError(f"mathlib.{name}: argument type {ty} is not float/double")
    return _UNARY[name](_Ops(builder, ty), args[0])
