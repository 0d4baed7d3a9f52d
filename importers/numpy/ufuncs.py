"""NumPy ufuncs on traced arrays -> op-table ops (called from Tracer.__array_ufunc__).

NumPy's own type resolution (`ufunc.resolve_dtypes`, NEP 50 for Python scalars) picks the
loop: operands are cast to the loop's input dtypes (a Python int that does not fit raises
OverflowError, as in NumPy), computed in a type onnxruntime has kernels for (WIDE), and
the result is cast to the loop's output dtype. Each RULES entry maps one ufunc to ops:

    np.add                 Add                     bool loops compute in int32: 1+1 -> True
    np.floor_divide (int)  Div on a safe divisor   x // 0 -> 0 and INT_MIN // -1 wrap, as
                                                   NumPy; no division can trap
    np.floor_divide (flt)  NumPy's npy_divmod      fmod, then the same sign fix-ups
    np.power (int)         repeated multiplication a constant exponent only (wraps as NumPy)
    np.log1p / np.expm1    Goldberg / Kahan forms  accurate near 0, not log(1+x)

Ufuncs not in RULES (log2, arctan2, ...) raise TraceError naming them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.importers.builder import Builder, Operand
from autoclust.importers.numpy.trace import WIDE, TraceContext, Tracer, describe_call, unsupported

from autoclust.errors import InvalidInputError, TraceError

BOOL = np.dtype(bool)


@dataclasses.dataclass
class Call:
    """One ufunc call being lowered: operands in loop dtypes and in compute dtypes."""

    ctx: TraceContext
    name: str
    raw: tuple                 # the arguments as given
    loop: list[np.dtype]       # the loop's input dtypes
    loop_ops: list[Operand]    # operands cast to them
    args: list[Operand]        # operands in the compute dtype (WIDE)

    @property
    def b(self) -> Builder:
        return self.ctx.builder

    @property
    def is_float(self) -> bool:
        return self.loop[0].kind == "f"

    def const(self, value: Any, like: Operand) -> Operand:
        return self.b.constant(np.asarray(value, dtype=like.dtype))


Rule = Callable[[Call], Any]


def _simple(op: str) -> Rule:
    return lambda c: c.b.op(op, *c.args)


def _logical(op: str) -> Rule:
    return lambda c: c.b.op(op, *(c.ctx.cast(a, BOOL) for a in c.loop_ops))


def _float_only(op: str, int_rule: Rule | None = None) -> Rule:
    """An op defined on floats; integer loops use `int_rule`, or are refused."""
    def rule(c: Call) -> Any:
        if c.is_float:
            return c.b.op(op, *c.args)
        if int_rule is None:
            raise unsupported(c.name, c.raw, {}, f"integer loop {c.loop[0]} is not supported")
        return int_rule(c)
    return rule


def _identity(c: Call) -> Operand:
    return c.b.Identity(c.args[0])


def _trunc(c: Call) -> Operand:
    b, x = c.b, c.args[0]
    if not c.is_float:
        return b.Identity(x)
    return b.Where(b.Less(x, c.const(0, x)), b.Ceil(x), b.Floor(x))


def _nan_test(op: str, ints: bool) -> Rule:
    """isnan/isinf/isfinite; integers are never NaN or inf (`ints` is isfinite's answer)."""
    def rule(c: Call) -> Operand:
        b, x = c.b, c.args[0]
        if not c.is_float:
            same = b.Equal(x, x)
            return same if ints else b.Not(same)
        if op == "IsFinite":
            return b.Not(b.Or(b.IsNaN(x), b.IsInf(x)))
        return b.op(op, x)
    return rule


def _not_equal(c: Call) -> Operand:
    return c.b.Not(c.b.Equal(*c.args))


def _nan_ignoring(op: str) -> Rule:
    """fmax/fmin: a NaN operand loses to the other one."""
    def rule(c: Call) -> Operand:
        b, (x, y) = c.b, c.args
        if not c.is_float:
            return b.op(op, x, y)
        return b.Where(b.IsNaN(x), y, b.Where(b.IsNaN(y), x, b.op(op, x, y)))
    return rule


def _scale(factor: float) -> Rule:
    return lambda c: c.b.Mul(c.args[0], c.const(factor, c.args[0]))


def _bitwise(bool_op: str, int_op: str) -> Rule:
    def rule(c: Call) -> Operand:
        if all(dt == BOOL for dt in c.loop):
            return c.b.op(bool_op, *c.loop_ops)
        return c.b.op(int_op, *c.args)
    return rule


def _log1p(c: Call) -> Operand:
    return _log1p_of(c, c.args[0])


def _expm1(c: Call) -> Operand:
    return _expm1_of(c, c.args[0])


def _log1p_of(c: Call, x: Operand) -> Operand:
    # log1p(x) = x * log(u) / (u - 1) with u = 1 + x (Goldberg): exact where u == 1
    b = c.b
    u = b.Add(x, c.const(1, x))
    d = b.Sub(u, c.const(1, x))
    r = b.Where(b.Equal(d, c.const(0, x)), x, b.Div(b.Mul(b.Log(u), x), d))
    return b.Where(b.Equal(u, c.const(np.inf, x)), u, r)


def _expm1_of(c: Call, x: Operand) -> Operand:
    # expm1(x) = (u - 1) * x / log(u) with u = exp(x) (Kahan): exact where u == 1
    b = c.b
    u = b.Exp(x)
    d = b.Sub(u, c.const(1, x))
    r = b.Div(b.Mul(d, x), b.Log(u))
    r = b.Where(b.Equal(d, c.const(-1, x)), d, r)
    r = b.Where(b.Equal(u, c.const(1, x)), x, r)
    return b.Where(b.Equal(u, c.const(np.inf, x)), u, r)


# ---- float64 forms of ops onnxruntime has float32 kernels only for --------------------

F64 = np.dtype(np.float64)
_HUGE = 1e150  # above it x*x overflows: asinh/acosh(x) = log(x) + log(2)


def _f64(op: str, composite: Rule | None) -> Rule:
    """`op`, except for float64 loops, which take `composite` (or are refused)."""
    def rule(c: Call) -> Any:
        if c.args[0].dtype != F64:
            return c.b.op(op, *c.args)
        if composite is None:
            raise unsupported(c.name, c.raw, {}, f"onnxruntime has no float64 {op}; cast to "
                              "float32 first if that precision is enough")
        return composite(c)
    return rule


def _log_huge(c: Call, s: Operand) -> Operand:
    return c.b.Add(c.b.Log(s), c.const(math.log(2), s))


def _asinh64(c: Call) -> Operand:
    # asinh(|x|) = log1p(s + s^2 / (1 + sqrt(1 + s^2))), sign restored (-0.0 kept)
    b, x = c.b, c.args[0]
    s = b.Abs(x)
    s2 = b.Mul(s, s)
    r = _log1p_of(c, b.Add(s, b.Div(s2, b.Add(c.const(1, x), b.Sqrt(b.Add(c.const(1, x),
                                                                           s2))))))
    r = b.Where(b.Greater(s, c.const(_HUGE, x)), _log_huge(c, s), r)
    return b.Where(b.Less(x, c.const(0, x)), b.Neg(r), b.Where(b.Equal(x, c.const(0, x)),
                                                              x, r))


def _acosh64(c: Call) -> Operand:
    # acosh(x) = log1p(t + sqrt(2t + t^2)) with t = x - 1
    b, x = c.b, c.args[0]
    t = b.Sub(x, c.const(1, x))
    r = _log1p_of(c, b.Add(t, b.Sqrt(b.Add(b.Mul(c.const(2, x), t), b.Mul(t, t)))))
    r = b.Where(b.Less(x, c.const(1, x)), c.const(np.nan, x), r)  # t*t overflowed below 1
    return b.Where(b.Greater(x, c.const(_HUGE, x)), _log_huge(c, x), r)


def _atanh64(c: Call) -> Operand:
    # atanh(x) = 0.5 * log1p(2x / (1 - x))
    b, x = c.b, c.args[0]
    q = b.Div(b.Mul(c.const(2, x), x), b.Sub(c.const(1, x), x))
    return b.Mul(c.const(0.5, x), _log1p_of(c, q))


def _sinh64(c: Call) -> Operand:
    # (expm1(x) - expm1(-x)) / 2: no cancellation near 0
    b, x = c.b, c.args[0]
    return b.Mul(c.const(0.5, x), b.Sub(_expm1_of(c, x), _expm1_of(c, b.Neg(x))))


def _cosh64(c: Call) -> Operand:
    b, x = c.b, c.args[0]
    return b.Mul(c.const(0.5, x), b.Add(b.Exp(x), b.Exp(b.Neg(x))))


def _tan64(c: Call) -> Operand:
    return c.b.Div(c.b.Sin(c.args[0]), c.b.Cos(c.args[0]))


# ---- integer and float division --------------------------------------------------------

def _safe_divisor(c: Call, y: Operand) -> tuple[Operand, Operand, Operand]:
    """(divisor with 0 and -1 replaced by 1, y == 0, y == -1): no Div or Mod can trap."""
    b = c.b
    zero, minus_one = b.Equal(y, c.const(0, y)), b.Equal(y, c.const(-1, y))
    return b.Where(b.Or(zero, minus_one), c.const(1, y), y), zero, minus_one


def _int_divmod(c: Call) -> tuple[Operand, Operand]:
    """NumPy's integer floor division and remainder (x // 0 == x % 0 == 0)."""
    b, (x, y) = c.b, c.args
    safe, zero, minus_one = _safe_divisor(c, y)
    q = b.Div(x, safe)
    r = b.Sub(x, b.Mul(q, safe))
    fix = b.And(b.Not(b.Equal(r, c.const(0, r))),
                b.Xor(b.Less(r, c.const(0, r)), b.Less(safe, c.const(0, r))))
    q = b.Where(fix, b.Sub(q, c.const(1, q)), q)
    q = b.Where(minus_one, b.Neg(x), q)
    q = b.Where(zero, c.const(0, q), q)
    return q, b.Where(fix, b.Add(r, safe), r)


def _copysign_zero(c: Call, sign_of: Operand) -> Operand:
    """+0.0 or -0.0 with the sign of `sign_of` (1/x tells -0.0 from +0.0)."""
    b = c.b
    negative = b.Less(b.Div(c.const(1, sign_of), sign_of), c.const(0, sign_of))
    return b.Where(negative, c.const(-0.0, sign_of), c.const(0.0, sign_of))


def _float_divmod(c: Call) -> tuple[Operand, Operand]:
    """NumPy's npy_divmod: floor division and remainder of floats, step by step."""
    b, (x, y) = c.b, c.args
    zero = c.const(0, x)
    mod = b.Mod(x, y, fmod=1)
    div = b.Div(b.Sub(x, mod), y)
    fix = b.And(b.Not(b.Equal(mod, zero)), b.Xor(b.Less(y, zero), b.Less(mod, zero)))
    mod = b.Where(fix, b.Add(mod, y), mod)
    div = b.Where(fix, b.Sub(div, c.const(1, x)), div)
    mod = b.Where(b.Equal(mod, zero), _copysign_zero(c, y), mod)
    floor = b.Floor(div)
    floor = b.Where(b.Greater(b.Sub(div, floor), c.const(0.5, x)),
                    b.Add(floor, c.const(1, x)), floor)
    quotient = b.Div(x, y)
    floor = b.Where(b.Equal(div, zero), _copysign_zero(c, quotient), floor)
    return b.Where(b.Equal(y, zero), quotient, floor), mod


def _divmod(c: Call) -> tuple[Operand, Operand]:
    return _float_divmod(c) if c.is_float else _int_divmod(c)


def _fmod(c: Call) -> Operand:
    b, (x, y) = c.b, c.args
    if c.is_float:
        return b.Mod(x, y, fmod=1)
    safe, zero, minus_one = _safe_divisor(c, y)
    return b.Where(b.Or(zero, minus_one), c.const(0, x), b.Mod(x, safe, fmod=1))


# ---- power --------------------------------------------------------------------------------

def _int_exponent(c: Call) -> int:
    e = c.raw[1]
    if isinstance(e, Tracer):
        raise unsupported(c.name, c.raw, {}, "an integer power needs a constant exponent "
                          "(NumPy raises for negative ones, and wraps on overflow)")
    arr = np.asarray(e)
    if arr.size != 1 or isinstance(c.raw[0], np.ndarray | np.generic | int):
        raise unsupported(c.name, c.raw, {}, "an integer power needs one constant exponent "
                          "and a traced base")
    k = int(arr.reshape(()))
    if k < 0:
        raise InvalidInputError(f"{describe_call(c.name, c.raw, {})}: integers to negative "
                                "integer powers are not allowed (as in NumPy)")
    return k


def _scalar_exponent(c: Call) -> float | None:
    e = c.raw[1]
    if isinstance(e, Tracer) or np.size(e) != 1:
        return None
    return float(np.asarray(e).reshape(()))


def _power(c: Call) -> Operand:
    b, (x, y) = c.b, c.args
    if c.is_float:
        # NumPy's loop takes sqrt for a scalar exponent 0.5: (-inf)**0.5 is nan, not inf
        e = _scalar_exponent(c)
        if e == 0.5:
            return b.Sqrt(x)
        if e == 2:
            return b.Mul(x, x)
        return b.Pow(x, y)
    k = _int_exponent(c)
    result = None
    square = x
    while k:  # square-and-multiply: wraps exactly as NumPy's integer loop
        if k & 1:
            result = square if result is None else b.Mul(result, square)
        k >>= 1
        if k:
            square = b.Mul(square, square)
    if result is None:  # x ** 0 == 1
        result = b.Cast(b.Equal(x, x), to=x.dtype)
    return result


RULES: dict[np.ufunc, Rule] = {
    np.add: _simple("Add"), np.subtract: _simple("Sub"), np.multiply: _simple("Mul"),
    np.true_divide: _simple("Div"), np.maximum: _simple("Max"), np.minimum: _simple("Min"),
    np.fmax: _nan_ignoring("Max"), np.fmin: _nan_ignoring("Min"),
    np.equal: _simple("Equal"), np.not_equal: _not_equal, np.less: _simple("Less"),
    np.greater: _simple("Greater"), np.less_equal: _simple("LessOrEqual"),
    np.greater_equal: _simple("GreaterOrEqual"),
    np.logical_and: _logical("And"), np.logical_or: _logical("Or"),
    np.logical_xor: _logical("Xor"), np.logical_not: _logical("Not"),
    np.bitwise_and: _bitwise("And", "BitwiseAnd"), np.bitwise_or: _bitwise("Or", "BitwiseOr"),
    np.bitwise_xor: _bitwise("Xor", "BitwiseXor"), np.invert: _bitwise("Not", "BitwiseNot"),
    np.absolute: _simple("Abs"), np.negative: _simple("Neg"), np.positive: _identity,
    np.conjugate: _identity, np.sign: _simple("Sign"), np.square: lambda c: c.b.Mul(
        c.args[0], c.args[0]),
    np.exp: _simple("Exp"), np.log: _simple("Log"), np.sqrt: _simple("Sqrt"),
    np.tanh: _simple("Tanh"), np.sin: _simple("Sin"), np.cos: _simple("Cos"),
    np.tan: _f64("Tan", _tan64), np.arcsin: _f64("Asin", None),
    np.arccos: _f64("Acos", None), np.arctan: _f64("Atan", None),
    np.sinh: _f64("Sinh", _sinh64), np.cosh: _f64("Cosh", _cosh64),
    np.arcsinh: _f64("Asinh", _asinh64), np.arccosh: _f64("Acosh", _acosh64),
    np.arctanh: _f64("Atanh", _atanh64),
    np.log1p: _log1p, np.expm1: _expm1,
    np.floor: _float_only("Floor", _identity), np.ceil: _float_only("Ceil", _identity),
    np.rint: _float_only("Round", _identity), np.trunc: _trunc,
    np.reciprocal: _float_only("Reciprocal"),
    np.isnan: _nan_test("IsNaN", False), np.isinf: _nan_test("IsInf", False),
    np.isfinite: _nan_test("IsFinite", True),
    np.deg2rad: _scale(math.pi / 180), np.radians: _scale(math.pi / 180),
    np.rad2deg: _scale(180 / math.pi), np.degrees: _scale(180 / math.pi),
    np.power: _power, np.float_power: _power,
    np.floor_divide: lambda c: _divmod(c)[0], np.remainder: lambda c: _divmod(c)[1],
    np.divmod: _divmod, np.fmod: _fmod,
}


# ---- the call ---------------------------------------------------------------------------

def _loop_key(x: Any) -> Any:
    """What resolve_dtypes takes for one argument: a dtype, or int/float for weak scalars."""
    if isinstance(x, Tracer | np.ndarray | np.generic):
        return x.dtype
    if type(x) is bool:
        return BOOL
    if type(x) in (int, float):
        return type(x)
    if isinstance(x, list | tuple):
        return np.asarray(x).dtype
    return None


def _loop(name: str, uf: np.ufunc, inputs: tuple, dtype: Any) -> list[np.dtype]:
    keys = [_loop_key(x) for x in inputs]
    if any(k is None for k in keys):
        raise unsupported(name, inputs, {}, "arguments must be arrays or Python scalars")
    extra = {}
    if dtype is not None:
        extra["signature"] = (None,) * uf.nin + (np.dtype(dtype),) * uf.nout
    try:
        return list(uf.resolve_dtypes(tuple(keys) + (None,) * uf.nout, **extra))
    except TypeError as exc:
        raise TraceError(f"{describe_call(name, inputs, {})}: {exc}") from None


def _shape(name: str, inputs: tuple) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*(np.shape(x) for x in inputs)))
    except ValueError as exc:
        raise InvalidInputError(f"{describe_call(name, inputs, {})}: {exc}") from None


# keyword arguments a traced ufunc call accepts, with the only value it accepts
_COMPARISONS = (np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal)


def _compare_wide_ints(name: str, inputs: tuple, dts: list[np.dtype]) -> list[np.dtype]:
    """NumPy compares integer arrays with Python ints they cannot hold (int8 < 1000 is
    True) instead of raising: compare in int64 then."""
    loop = dts[0]
    if loop.kind not in "iu":
        return dts
    info = np.iinfo(loop)
    if all(type(x) is not int or info.min <= x <= info.max for x in inputs):
        return dts
    wide = np.iinfo(np.int64)
    if loop == np.uint64 or any(type(x) is int and not wide.min <= x <= wide.max
                                for x in inputs):
        raise unsupported(name, inputs, {}, "a Python int outside int64 in a comparison")
    return [np.dtype(np.int64)] * 2 + dts[2:]


_KWARG_DEFAULTS = {"casting": "same_kind", "order": "K", "subok": True, "where": True}


def _check_kwargs(name: str, inputs: tuple, kwargs: dict[str, Any]) -> None:
    for key, value in kwargs.items():
        if key == "dtype":
            continue
        if key == "out":
            ok = value is None or all(v is None for v in value)
        else:
            ok = key in _KWARG_DEFAULTS and isinstance(value, bool | str) and \
                value == _KWARG_DEFAULTS[key]
        if not ok:
            raise unsupported(name, inputs, kwargs, f"the {key}= argument is not supported "
                              "(traced arrays are immutable; results are new arrays)")


def call(ctx: TraceContext, uf: np.ufunc, inputs: tuple, kwargs: dict[str, Any]) -> Any:
    """Lower `uf(*inputs, **kwargs)`; returns a Tracer (a tuple of them for divmod)."""
    name = f"np.{uf.__name__}"
    _check_kwargs(name, inputs, kwargs)
    if uf is np.matmul:
        from autoclust.importers.numpy import functions as numpy_functions
        return numpy_functions.matmul(*inputs)
    rule = RULES.get(uf)
    if rule is None:
        raise unsupported(name, inputs, kwargs, "this ufunc is not supported")
    dts = _loop(name, uf, inputs, kwargs.get("dtype"))
    if uf in _COMPARISONS:
        dts = _compare_wide_ints(name, inputs, dts)
    shape = _shape(name, inputs)
    loop_ops = [ctx.operand(x, dt) for x, dt in zip(inputs, dts)]
    args = [ctx.cast(op, WIDE.get(dt, dt)) for op, dt in zip(loop_ops, dts)]
    out = rule(Call(ctx, name, inputs, dts[:uf.nin], loop_ops, args))
    if uf.nout == 1:
        return ctx.wrap(out, dts[uf.nin], shape, name)
    return tuple(ctx.wrap(o, dt, shape, name) for o, dt in zip(out, dts[uf.nin:]))


_REDUCE = {np.add: "sum", np.multiply: "prod", np.maximum: "max", np.minimum: "min",
           np.logical_and: "all", np.logical_or: "any"}


def lower(ctx: TraceContext, uf: np.ufunc, method: str, inputs: tuple,
          kwargs: dict[str, Any]) -> Any:
    """Tracer.__array_ufunc__: `uf.method(*inputs, **kwargs)` on traced arrays."""
    from autoclust.importers.numpy import functions as fns
    if method == "__call__":
        return call(ctx, uf, inputs, kwargs)
    name = f"np.{uf.__name__}.{method}"
    if method == "reduce" and uf in _REDUCE and len(inputs) == 1:
        kwargs = {"axis": 0, **kwargs}
        return getattr(fns, "reduce_" + _REDUCE[uf])(inputs[0], **kwargs)
    if method == "accumulate" and uf is np.add and len(inputs) == 1:
        return fns.cumsum(inputs[0], **{"axis": 0, **kwargs})
    if method == "outer" and uf in RULES and len(inputs) == 2 and not kwargs:
        a, b = inputs
        a_shape = np.shape(a)
        a = np.reshape(a, a_shape + (1,) * len(np.shape(b)))
        return uf(a, b)
    raise unsupported(name, inputs, kwargs, "this ufunc method is not supported")
