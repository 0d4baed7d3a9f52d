"""Elementwise ops: math, comparison, logic, bitwise, Where, Cast, Clip and activations.

Every op here maps each output element to the elements at the same (broadcast) index of
its inputs. The table at the bottom reads one op per line; the helpers above it build the
infer rule (dtype check + numpy broadcasting, symbolic-aware) and the NumPy reference.

Reference semantics follow onnxruntime's CPU kernels, which the tests check:
- float16 computes in float32 and rounds once at the end (as onnxruntime and our backends);
- integer Div truncates toward zero (C), integer Mod follows the divisor's sign unless fmod=1;
- Pow with an integer base computes in float64 and truncates (`static_cast<T>(std::pow)`);
- Cast from float to int truncates; NaN and out-of-range casts are undefined.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
from onnx import helper

from autoclust import symbolic
from autoclust.errors import InvalidInputError, ShapeInferenceError
from autoclust.ir import Shape
from autoclust.kernel.ir import Expr
from autoclust.kernel.lowering import LowerCtx, LowerFn, cast, const, fold, op, prim, select
from autoclust.ops.table import (
    ALL_TYPES,
    BFLOAT16,
    BOOL,
    COMPILABLE_TYPES,
    ELEMENTWISE,
    FLOAT_TYPES,
    INT_TYPES,
    NARROW_INT_TYPES,
    NUMERIC_TYPES,
    Attrs,
    InferContext,
    InferFn,
    TypeShape,
    broadcast_shapes,
    register,
)
from autoclust.symbolic import is_dim

F16 = np.dtype("float16")
F32 = np.dtype("float32")
F64 = np.dtype("float64")

# dtype groups, as the ONNX type constraints of the ops below (numpy-representable part).
# (bfloat16 is in the float group, as in ONNX since opset 13: onnxruntime's CPU provider has
# no kernels for it, so compiled code is the only way these run on a CPU.)
FLOAT = frozenset(FLOAT_TYPES) | {BFLOAT16}
INT = frozenset(INT_TYPES)
UINT = frozenset(t for t in INT_TYPES if t.kind == "u")
SIGNED = FLOAT | frozenset(t for t in INT_TYPES if t.kind == "i")
NUMERIC = frozenset(NUMERIC_TYPES) | {BFLOAT16}
LOGIC = frozenset({BOOL})
ANY = frozenset(ALL_TYPES) | {BFLOAT16}
POW_BASE = FLOAT | {np.dtype("int32"), np.dtype("int64")}
PRELU = FLOAT | {np.dtype(t) for t in ("int32", "int64", "uint32", "uint64")}

Array = np.ndarray


# ---- infer helpers ----------------------------------------------------------------------

def check_dtype(ctx: InferContext, i: int, allowed: frozenset) -> None:
    """Raise when input i has a dtype outside `allowed` (unknown dtypes pass)."""
    dt = ctx.dtypes[i]
    if dt is not None and np.dtype(dt) not in allowed:
        names = ", ".join(sorted(t.name for t in allowed))
        raise ctx.fail(f"input {i} has dtype {np.dtype(dt).name}; {ctx.op} takes {names}")


def check_same_dtype(ctx: InferContext, idx: Sequence[int]) -> None:
    """Raise when the given inputs do not all share one dtype."""
    known = [(i, np.dtype(ctx.dtypes[i])) for i in idx if ctx.dtypes[i] is not None]
    for i, dt in known[1:]:
        if dt != known[0][1]:
            raise ctx.fail(f"input {i} has dtype {dt.name} but input {known[0][0]} has "
                           f"{known[0][1].name}; they must match")


def broadcast(ctx: InferContext, idx: Sequence[int]) -> Shape:
    """Multidirectional broadcast of the given inputs' shapes, failing with the node's name."""
    shapes = [ctx.shapes[i] for i in idx]
    try:
        return broadcast_shapes(*shapes)
    except ShapeInferenceError as exc:
        raise ctx.fail(f"input shapes {shapes} do not broadcast: {exc}") from None


def _present(ctx: InferContext) -> list[int]:
    return [i for i in range(ctx.n_inputs) if ctx.has(i)]


def infer_rule(allowed: frozenset, out: np.dtype | None = None,
               same: bool = True) -> Callable[[InferContext], list[TypeShape]]:
    """infer for an elementwise op: all present inputs broadcast, input 0's dtype in
    `allowed`, inputs share a dtype when `same`; output dtype `out` or input 0's."""
    def infer(ctx: InferContext) -> list[TypeShape]:
        idx = _present(ctx)
        if not idx:
            raise ctx.fail("needs at least one input")
        check_dtype(ctx, idx[0], allowed)
        if same:
            check_same_dtype(ctx, idx)
        return [(out if out is not None else ctx.dtypes[idx[0]], broadcast(ctx, idx))]
    return infer


def compilable(*groups: frozenset) -> frozenset | None:
    """OpDef.dtypes: the compilable part of the dtypes an op sees; None when that is all."""
    d = frozenset().union(*groups) & COMPILABLE_TYPES
    return None if d == COMPILABLE_TYPES else d


# ---- ref helpers ------------------------------------------------------------------------

def upcast(x: Array) -> Array:
    """float16 computes in float32 (rounded once at the end, as onnxruntime)."""
    return x.astype(F32) if x.dtype == F16 else x


def finish(y: Any, dtype: np.dtype) -> Array:
    """The result as an array of the output dtype (float -> int as onnxruntime casts).

    An int64 result holding symbolic dims (`1 + seq`, from a shape chain) stays an object
    array of Syms whichever operand brought them: casting would pin the dim."""
    y = np.asarray(y)
    if y.dtype == object and np.dtype(dtype) == np.int64 and symbolic.is_sym_array(y):
        return y
    return y.astype(dtype, copy=False) if y.dtype == dtype else cast_array(y, dtype)


def unary(op: str, fn: Callable[..., Any], types: frozenset = FLOAT, out: np.dtype | None = None,
          infer: InferFn | None = None, lower: LowerFn | None = None, cost: int = 1,
          shape_like: bool = False, facts: dict[str, Any] | None = None,
          **defaults: Any) -> None:
    """Register a one-input op: y = fn(x, **attrs) with attrs defaulting to `defaults`."""
    def ref(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
        x = inputs[0]
        kw = {k: attrs.get(k, v) for k, v in defaults.items()}
        with np.errstate(all="ignore"):
            y = fn(upcast(x), **kw)
        return [finish(y, out if out is not None else x.dtype)]
    register(op, ELEMENTWISE, infer or infer_rule(types, out), ref, lower=lower, cost=cost,
             shape_like=shape_like, dtypes=compilable(types, {out} if out is not None else set()),
             **(facts or {}))


def binary(op: str, fn: Callable[..., Any], types: frozenset = NUMERIC,
           out: np.dtype | None = None, infer: InferFn | None = None,
           lower: LowerFn | None = None, cost: int = 1, shape_like: bool = False,
           facts: dict[str, Any] | None = None, **defaults: Any) -> None:
    """Register a two-input broadcasting op: z = fn(a, b, **attrs)."""
    def ref(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
        a, b = inputs[0], inputs[1]
        kw = {k: attrs.get(k, v) for k, v in defaults.items()}
        with np.errstate(all="ignore"):
            z = fn(upcast(a), upcast(b), **kw)
        return [finish(z, out if out is not None else a.dtype)]
    register(op, ELEMENTWISE, infer or infer_rule(types, out), ref, lower=lower, cost=cost,
             shape_like=shape_like, dtypes=compilable(types, {out} if out is not None else set()),
             **(facts or {}))


def variadic(op: str, fn: Callable[[list[Array], np.dtype], Any], types: frozenset,
             lower: LowerFn, shape_like: bool = False, **facts: Any) -> None:
    """Register an op over 1..N broadcasting inputs (Max, Min, Sum, Mean): y = fn(inputs
    widened by upcast, their dtype)."""
    def ref(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
        xs = [upcast(x) for x in inputs if x is not None]
        with np.errstate(all="ignore"):
            y = fn(xs, inputs[0].dtype)
        # with one input the reduce returns that input: copy, so outputs never alias inputs
        return [np.array(y, dtype=inputs[0].dtype, copy=True)]
    register(op, ELEMENTWISE, infer_rule(types), ref, lower=lower, shape_like=shape_like,
             dtypes=compilable(types), **facts)


# ---- math with onnxruntime's integer semantics ---------------------------------------------

def _nonzero_divisor(b: Array, what: str) -> None:
    """onnxruntime raises on an integer zero divisor; so do the references (numpy would
    return 0 with a warning)."""
    if b.dtype.kind in "iu" and not np.all(b):
        raise InvalidInputError(f"integer {what} by zero")


def trunc_div(a: Array, b: Array) -> Array:
    """Div: floats divide; integers truncate toward zero like C (numpy's // floors)."""
    if a.dtype.kind == "f":
        return np.divide(a, b)
    _nonzero_divisor(b, "division")
    q = np.floor_divide(a, b)
    # floor and trunc differ when the remainder is non-zero and the signs differ
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def mod(a: Array, b: Array, fmod: int = 0) -> Array:
    """Mod: fmod=1 takes the dividend's sign (C fmod), fmod=0 the divisor's (integers only)."""
    _nonzero_divisor(b, "modulo")
    return np.fmod(a, b) if fmod or a.dtype.kind == "f" else np.remainder(a, b)


def power(a: Array, b: Array) -> Array:
    """Pow: output has the base's dtype. As onnxruntime: a scalar exponent of 2 or 3 is x*x
    or x*x*x in the base's type; otherwise mixed or integer operands go through float64."""
    if b.size == 1 and b.reshape(-1)[0] in (2, 3):
        y = a * a
        return y * a if b.reshape(-1)[0] == 3 else y
    if a.dtype.kind == "f" and a.dtype == b.dtype:
        return np.power(a, b)
    # onnxruntime computes static_cast<T>(std::pow(x, y)), i.e. in double, then truncates
    return np.power(a.astype(F64), b.astype(F64))


_erf64 = np.frompyfunc(math.erf, 1, 1)


def erf(x: Array) -> Array:
    """Erf in float64 via math.erf (numpy has none); accurate to float64."""
    return np.asarray(_erf64(x.astype(F64)), dtype=F64)


def is_inf(x: Array, detect_negative: int = 1, detect_positive: int = 1) -> Array:
    """IsInf with the sign filters."""
    return np.isinf(x) & (((x > 0) & bool(detect_positive)) | ((x < 0) & bool(detect_negative)))


def bit_shift(a: Array, b: Array, direction: str = "") -> Array:
    """BitShift: direction LEFT or RIGHT on unsigned integers."""
    if direction == "LEFT":
        return np.left_shift(a, b)
    if direction == "RIGHT":
        return np.right_shift(a, b)
    raise ShapeInferenceError(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")


def _infer_mod(ctx: InferContext) -> list[TypeShape]:
    types = infer_rule(NUMERIC)(ctx)
    dt = ctx.dtypes[0]
    if dt is not None and np.dtype(dt).kind == "f" and not ctx.attr("fmod", 0):
        raise ctx.fail(f"fmod must be 1 for floating point input ({np.dtype(dt).name})")
    return types


def _infer_pow(ctx: InferContext) -> list[TypeShape]:
    # ONNX lets the exponent have its own dtype; the output has the base's
    check_dtype(ctx, 0, POW_BASE)
    check_dtype(ctx, 1, NUMERIC)
    return [(ctx.dtypes[0], broadcast(ctx, [0, 1]))]


def _infer_bit_shift(ctx: InferContext) -> list[TypeShape]:
    if ctx.attr("direction") not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"direction must be LEFT or RIGHT, got {ctx.attr('direction')!r}")
    return infer_rule(UINT)(ctx)


# ---- Where, Cast, CastLike, Clip -------------------------------------------------------

def _infer_where(ctx: InferContext) -> list[TypeShape]:
    check_dtype(ctx, 0, LOGIC)
    check_same_dtype(ctx, [1, 2])
    return [(ctx.dtypes[1], broadcast(ctx, [0, 1, 2]))]


def _ref_where(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    c, x, y = inputs
    return [np.where(c, x, y).astype(x.dtype, copy=False)]


def cast_target(to: Any) -> np.dtype:
    """The numpy dtype of an ONNX elem type int; raises for types numpy cannot hold."""
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ShapeInferenceError(f"Cast: unknown target type to={to!r}") from exc
    if dt not in ANY:
        raise ShapeInferenceError(f"Cast: target type to={to} ({dt}) is not supported")
    return dt


def _infer_cast(ctx: InferContext) -> list[TypeShape]:
    try:
        dt = cast_target(ctx.attr("to"))
    except ShapeInferenceError as exc:
        raise ctx.fail(str(exc)) from None
    return [(dt, ctx.shapes[0])]


# Narrow integer targets of a float Cast go through int32 (onnxruntime on x86: cvttss2si).
_VIA_INT32 = frozenset(np.dtype(t) for t in ("int8", "int16", "uint8", "uint16"))


def cast_array(x: Array, dtype: np.dtype) -> Array:
    """x.astype(dtype) with onnxruntime's float -> int semantics (x86): NaN and values out of
    int32/int64 range give the type's minimum; int8/16 and uint8/16 go through int32 and
    keep the low bits (300.0 -> uint8 44). Other conversions are NumPy's."""
    dtype = np.dtype(dtype)
    if x.dtype.kind != "f" or dtype.kind not in "iu" or dtype.itemsize > 8 \
            or (dtype.kind == "u" and dtype not in _VIA_INT32):
        with np.errstate(all="ignore"):
            return x.astype(dtype)
    wide = np.dtype("int64") if dtype == np.dtype("int64") else np.dtype("int32")
    info = np.iinfo(wide)
    xf = x.astype(np.float64)
    ok = (xf >= info.min) & (xf < float(info.max) + 1.0)  # NaN compares false
    y = np.where(ok, np.trunc(np.where(ok, xf, 0)), 0).astype(wide)
    y = np.where(ok, y, info.min).astype(wide)
    return y.astype(dtype)


def _ref_cast(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    return [cast_array(inputs[0], cast_target(attrs.get("to")))]


def _infer_cast_like(ctx: InferContext) -> list[TypeShape]:
    return [(ctx.dtypes[1], ctx.shapes[0])]


def _ref_cast_like(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    return [cast_array(inputs[0], inputs[1].dtype)]


def _infer_clip(ctx: InferContext) -> list[TypeShape]:
    check_dtype(ctx, 0, NUMERIC)
    check_same_dtype(ctx, _present(ctx))
    for i in (1, 2):
        s = ctx.shapes[i] if ctx.has(i) else ()
        if s is not None and any(is_dim(d) and d != 1 for d in s):
            raise ctx.fail(f"input {i} (min/max) must be a scalar, got shape {s}")
    return [(ctx.dtypes[0], ctx.shapes[0])]


def clip_limits(dtype: Any) -> tuple[float, float] | None:
    """A float dtype's (lowest, max): Clip's missing bounds (the spec's numeric_limits), so
    +inf clips to FLT_MAX (65504 in float16) as in onnxruntime; None for integers."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return None
    info = ml_dtypes.finfo(dt)
    return float(-info.max), float(info.max)


def _ref_clip(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    x = inputs[0]
    lo, hi = (inputs[i] if len(inputs) > i else None for i in (1, 2))
    limits = clip_limits(x.dtype)
    if limits is not None:  # a missing bound is the dtype's lowest / max, never +-inf
        lo = np.asarray(limits[0], x.dtype) if lo is None else lo
        hi = np.asarray(limits[1], x.dtype) if hi is None else hi
    y = x
    # min(max(x, lo), hi): NaN stays NaN, hi wins when lo > hi, and x wins a tie (Clip of
    # -0.0 to [0, 1] is -0.0), as onnxruntime: pick_max gives its second operand there
    if lo is not None:
        y = pick_max(lo.reshape(()), y)
    if hi is not None:
        y = pick_min(hi.reshape(()), y)
    return [np.array(y, dtype=x.dtype, copy=True)]  # no min/max: still a fresh array


# ---- lowerings ------------------------------------------------------------------------

def _int_divisor(ctx: LowerCtx, what: str) -> None:
    """Integer Div/Mod: onnxruntime raises on a zero divisor, so compiled code checks it."""
    if ctx.in_dtype(1)[0] not in "iu":
        return
    divisor = ctx.constant(1)
    if divisor is None:
        ctx.check(1, "nonzero", message=f"node {ctx.node.name!r} ({ctx.node.op}): integer "
                                        f"{what} by zero")
    elif not np.all(divisor):
        ctx.refuse(f"integer {what} by a constant zero (onnxruntime raises)")


def _lower_div(ctx: LowerCtx):
    _int_divisor(ctx, "division")
    a, b = ctx.operand(0), ctx.operand(1)
    return op("div", a, b)


def _lower_mod(ctx: LowerCtx):
    _int_divisor(ctx, "modulo")
    a, b = ctx.operand(0), ctx.operand(1)
    fmod = ctx.attr("fmod", 0) or a.dtype.startswith("float")
    return op("fmod" if fmod else "mod", a, b)


def _lower_pow(ctx: LowerCtx):
    """Pow as onnxruntime computes it: x*x and x*x*x for exponents 2 and 3, std::pow
    otherwise (integer bases through float64, truncated). The constant exponents 1 and 0.5
    take exact shortcuts: pow(x, 0.5) is sqrt(x + 0) except at -inf (+inf, where sqrt gives
    NaN); the + 0 turns -0 into +0 as pow does."""
    x, y = ctx.operand(0), ctx.operand(1)
    dt = x.dtype
    y_const = ctx.constant(1)  # onnxruntime's shortcuts apply to a scalar exponent only
    c = float(y_const.reshape(-1)[0]) if y_const is not None and y_const.size == 1 else None
    if c == 1:
        return x
    if c == 2:
        return op("mul", x, x)
    if c == 3:
        return op("mul", op("mul", x, x), x)
    if dt.startswith("float"):
        if c == 0.5:
            root = op("sqrt", op("add", x, const(0, dt)))
            return select(op("eq", x, const(-math.inf, dt)), const(math.inf, dt), root)
        return op("pow", x, cast(y, dt))
    wide = op("pow", cast(x, "float64"), cast(y, "float64"))
    return cast(wide, dt)


def _lower_isinf(ctx: LowerCtx):
    x = ctx.operand(0)
    pos = op("eq", x, const(math.inf, x.dtype))
    neg = op("eq", x, const(-math.inf, x.dtype))
    det_pos, det_neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if det_pos and det_neg:
        return op("or", pos, neg)
    if det_pos:
        return pos
    if det_neg:
        return neg
    return const(False, "bool")


def _lower_clip(ctx: LowerCtx):
    x, lo, hi = (ctx.operands() + [None, None])[:3]
    limits = clip_limits(ctx.dtype)
    if limits is not None:  # missing bounds clip inf to the dtype's finite range (_ref_clip)
        lo = const(limits[0], x.dtype) if lo is None else lo
        hi = const(limits[1], x.dtype) if hi is None else hi
    if lo is not None:  # the prims give their second operand on a tie: x (_ref_clip)
        x = op("max", lo, x)
    if hi is not None:
        x = op("min", hi, x)
    return x


def pick_max(a: Array, b: Array) -> Array:
    """max(a, b) as the compiled prims: NaN if either is NaN, else b where a == b (-0.0 and
    +0.0). np.maximum's tie differs by dtype (its float16 loop gives a, float32 b)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(a) | np.isnan(b), a + b, np.where(a > b, a, b))


def pick_min(a: Array, b: Array) -> Array:
    """min(a, b) as pick_max: NaN if either is NaN, else b where a == b."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(a) | np.isnan(b), a + b, np.where(a < b, a, b))


def _extremum(pick: Callable[[Array, Array], Array], xs: list[Array], dtype: np.dtype) -> Array:
    """Max/Min folded over xs (pick: pick_max or pick_min): between equal operands (-0.0 and
    +0.0) the later one, as onnxruntime's float32/float64 kernels, and the earlier one in
    float16, as its float16 kernels."""
    if dtype == np.float16:
        return functools.reduce(lambda acc, x: pick(x, acc), xs)
    return functools.reduce(pick, xs)


def _lower_extremum(name: str) -> LowerFn:
    """_extremum's fold: the prims give their second operand on a tie."""
    def lower(ctx: LowerCtx) -> Expr:
        args = [a for a in ctx.operands() if a is not None]
        first_wins = ctx.in_dtype(0) == "float16"
        acc = args[0]
        for a in args[1:]:
            acc = op(name, a, acc) if first_wins else op(name, acc, a)
        return acc
    return lower


def _ref_sign(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    """np.sign: -0.0 gives +0.0 as onnxruntime's; its float16 kernel maps NaN to 0 too."""
    x = inputs[0]
    y = np.sign(upcast(x))
    if x.dtype == np.float16:
        y = np.where(np.isnan(y), 0, y)
    return [finish(y, x.dtype)]


def _lower_sign(ctx: LowerCtx):
    x = ctx.operand(0)
    y = op("sign", x)
    if ctx.in_dtype(0) == "float16":
        y = select(op("isnan", x), const(0, y.dtype), y)
    return y


def _lower_mean(ctx: LowerCtx):
    total = fold("add")(ctx)
    return op("div", total, const(len([a for a in ctx.node.inputs if a is not None]),
                                  total.dtype))


def _lower_cast(ctx: LowerCtx):
    return cast(ctx.operand(0), ctx.dtype)  # CastLike reads its input 1 for the dtype only


def _lower_where(ctx: LowerCtx):
    c, x, y = ctx.operands()
    return select(c, x, y)


def _lower_reciprocal(ctx: LowerCtx):
    x = ctx.operand(0)
    return op("div", const(1, x.dtype), x)


def _lower_bit_shift(ctx: LowerCtx):
    a, b = ctx.operand(0), ctx.operand(1)
    return op("shl" if ctx.attr("direction") == "LEFT" else "shr", a, b)


# ---- the table ----------------------------------------------------------------------------

binary("Add", np.add, lower=prim("add"), shape_like=True,
       facts={"exact": "rounded", "groups": ("CONV_EPILOGUE",)})
binary("Sub", np.subtract, lower=prim("sub"), shape_like=True, facts={"exact": "rounded"})
binary("Mul", np.multiply, lower=prim("mul"), shape_like=True, facts={"exact": "rounded"})
binary("Div", trunc_div, lower=_lower_div, shape_like=True,
       facts={"exact": "rounded", "checks": True})
binary("Mod", mod, infer=_infer_mod, lower=_lower_mod, shape_like=True, fmod=0,
       facts={"discrete": True, "checks": True})
binary("Pow", power, POW_BASE, infer=_infer_pow, lower=_lower_pow, cost=4)
variadic("Max", lambda xs, dt: _extremum(pick_max, xs, dt), NUMERIC, _lower_extremum("max"),
         True, exact="copy")
variadic("Min", lambda xs, dt: _extremum(pick_min, xs, dt), NUMERIC, _lower_extremum("min"),
         True, exact="copy")
variadic("Sum", lambda xs, dt: functools.reduce(np.add, xs), FLOAT, fold("add"))
variadic("Mean", lambda xs, dt: functools.reduce(np.add, xs) / len(xs), FLOAT, _lower_mean)

unary("Neg", np.negative, SIGNED, lower=prim("neg"), shape_like=True, facts={"exact": "copy"})
unary("Abs", np.abs, NUMERIC, lower=prim("abs"), shape_like=True, facts={"exact": "copy"})
register("Sign", ELEMENTWISE, infer_rule(NUMERIC), _ref_sign, lower=_lower_sign,
         dtypes=compilable(NUMERIC), exact="copy", discrete=True)
unary("Reciprocal", np.reciprocal, lower=_lower_reciprocal)
unary("Sqrt", np.sqrt, lower=prim("sqrt"), facts={"exact": "rounded"})
unary("Exp", np.exp, lower=prim("exp"), cost=4)
unary("Log", np.log, lower=prim("log"), cost=4)
unary("Floor", np.floor, lower=prim("floor"), shape_like=True,
      facts={"exact": "copy", "discrete": True})
unary("Ceil", np.ceil, lower=prim("ceil"), shape_like=True,
      facts={"exact": "copy", "discrete": True})
unary("Round", np.round, lower=prim("round"),
      facts={"exact": "copy", "discrete": True})  # half to even, as ONNX
unary("Erf", erf, lower=prim("erf"), cost=4)
unary("Tanh", np.tanh, lower=prim("tanh"), cost=4, facts={"groups": ("CONV_EPILOGUE",)})
unary("Sin", np.sin, lower=prim("sin"), cost=4)
unary("Cos", np.cos, lower=prim("cos"), cost=4)
unary("Tan", np.tan, lower=prim("tan"), cost=4)
unary("Asin", np.arcsin, lower=prim("asin"), cost=4)
unary("Acos", np.arccos, lower=prim("acos"), cost=4)
unary("Atan", np.arctan, lower=prim("atan"), cost=4)
unary("Sinh", np.sinh, lower=prim("sinh"), cost=4)
unary("Cosh", np.cosh, lower=prim("cosh"), cost=4)
unary("Asinh", np.arcsinh, lower=prim("asinh"), cost=4)
unary("Acosh", np.arccosh, lower=prim("acosh"), cost=4)
unary("Atanh", np.arctanh, lower=prim("atanh"), cost=4)
unary("IsNaN", np.isnan, out=BOOL, lower=prim("isnan"), facts={"discrete": True})
unary("IsInf", is_inf, out=BOOL, lower=_lower_isinf, detect_negative=1, detect_positive=1,
      facts={"discrete": True})

binary("Equal", np.equal, ANY, out=BOOL, lower=prim("eq"), shape_like=True,
       facts={"discrete": True})
binary("Less", np.less, out=BOOL, lower=prim("lt"), facts={"discrete": True})
binary("Greater", np.greater, out=BOOL, lower=prim("gt"), facts={"discrete": True})
binary("LessOrEqual", np.less_equal, out=BOOL, lower=prim("le"), facts={"discrete": True})
binary("GreaterOrEqual", np.greater_equal, out=BOOL, lower=prim("ge"), facts={"discrete": True})
binary("And", np.logical_and, LOGIC, lower=prim("and"))
binary("Or", np.logical_or, LOGIC, lower=prim("or"))
binary("Xor", np.logical_xor, LOGIC, lower=prim("xor"))
unary("Not", np.logical_not, LOGIC, lower=prim("not"))
binary("BitwiseAnd", np.bitwise_and, INT, lower=prim("bitand"))
binary("BitwiseOr", np.bitwise_or, INT, lower=prim("bitor"))
binary("BitwiseXor", np.bitwise_xor, INT, lower=prim("bitxor"))
unary("BitwiseNot", np.invert, INT, lower=prim("bitnot"))
register("BitShift", ELEMENTWISE, _infer_bit_shift,
         lambda ins, attrs: [bit_shift(ins[0], ins[1], attrs.get("direction", ""))],
         lower=_lower_bit_shift, dtypes=compilable(UINT))

register("Where", ELEMENTWISE, _infer_where, _ref_where, lower=_lower_where, shape_like=True,
         exact="copy")
register("Cast", ELEMENTWISE, _infer_cast, _ref_cast, lower=_lower_cast, shape_like=True,
         dtypes=COMPILABLE_TYPES | NARROW_INT_TYPES)
register("CastLike", ELEMENTWISE, _infer_cast_like, _ref_cast_like, lower=_lower_cast,
         dtypes=COMPILABLE_TYPES | NARROW_INT_TYPES)
register("Clip", ELEMENTWISE, _infer_clip, _ref_clip, lower=_lower_clip,
         exact="copy", groups=("CONV_EPILOGUE",))
