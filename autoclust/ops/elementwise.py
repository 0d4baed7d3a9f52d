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

import numpy as np
from onnx import helper

from autoclust.errors import ShapeInferenceError
from autoclust.ir import Shape
from autoclust.ops import (
    ALL_TYPES,
    BOOL,
    COMPILABLE_TYPES,
    ELEMENTWISE,
    FLOAT_TYPES,
    INT_TYPES,
    NUMERIC_TYPES,
    Attrs,
    InferContext,
    InferFn,
    TypeShape,
    broadcast_shapes,
    register,
)

F16 = np.dtype("float16")
F32 = np.dtype("float32")
F64 = np.dtype("float64")

# dtype groups, as the ONNX type constraints of the ops below (numpy-representable part).
FLOAT = frozenset(FLOAT_TYPES)
INT = frozenset(INT_TYPES)
UINT = frozenset(t for t in INT_TYPES if t.kind == "u")
SIGNED = FLOAT | frozenset(t for t in INT_TYPES if t.kind == "i")
NUMERIC = frozenset(NUMERIC_TYPES)
LOGIC = frozenset({BOOL})
ANY = frozenset(ALL_TYPES)
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
    """The result as an array of the output dtype."""
    return np.asarray(y).astype(dtype, copy=False)


def unary(op: str, fn: Callable[..., Any], types: frozenset = FLOAT, out: np.dtype | None = None,
          infer: InferFn | None = None, **defaults: Any) -> None:
    """Register a one-input op: y = fn(x, **attrs) with attrs defaulting to `defaults`."""
    def ref(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
        x = inputs[0]
        kw = {k: attrs.get(k, v) for k, v in defaults.items()}
        with np.errstate(all="ignore"):
            y = fn(upcast(x), **kw)
        return [finish(y, out if out is not None else x.dtype)]
    register(op, ELEMENTWISE, infer or infer_rule(types, out), ref,
             dtypes=compilable(types, {out} if out is not None else set()))


def binary(op: str, fn: Callable[..., Any], types: frozenset = NUMERIC,
           out: np.dtype | None = None, infer: InferFn | None = None, **defaults: Any) -> None:
    """Register a two-input broadcasting op: z = fn(a, b, **attrs)."""
    def ref(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
        a, b = inputs[0], inputs[1]
        kw = {k: attrs.get(k, v) for k, v in defaults.items()}
        with np.errstate(all="ignore"):
            z = fn(upcast(a), upcast(b), **kw)
        return [finish(z, out if out is not None else a.dtype)]
    register(op, ELEMENTWISE, infer or infer_rule(types, out), ref,
             dtypes=compilable(types, {out} if out is not None else set()))


def variadic(op: str, fn: Callable[[list[Array]], Any], types: frozenset) -> None:
    """Register an op over 1..N broadcasting inputs (Max, Min, Sum, Mean)."""
    def ref(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
        xs = [upcast(x) for x in inputs if x is not None]
        with np.errstate(all="ignore"):
            y = fn(xs)
        # with one input the reduce returns that input: copy, so outputs never alias inputs
        return [np.array(y, dtype=inputs[0].dtype, copy=True)]
    register(op, ELEMENTWISE, infer_rule(types), ref, dtypes=compilable(types))


# ---- math with onnxruntime's integer semantics ---------------------------------------------

def trunc_div(a: Array, b: Array) -> Array:
    """Div: floats divide; integers truncate toward zero like C (numpy's // floors)."""
    if a.dtype.kind == "f":
        return np.divide(a, b)
    q = np.floor_divide(a, b)
    # floor and trunc differ when the remainder is non-zero and the signs differ
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def mod(a: Array, b: Array, fmod: int = 0) -> Array:
    """Mod: fmod=1 takes the dividend's sign (C fmod), fmod=0 the divisor's (integers only)."""
    return np.fmod(a, b) if fmod or a.dtype.kind == "f" else np.remainder(a, b)


def power(a: Array, b: Array) -> Array:
    """Pow: output has the base's dtype; mixed or integer operands go through float64."""
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


def _ref_cast(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    with np.errstate(all="ignore"):
        return [inputs[0].astype(cast_target(attrs.get("to")))]


def _infer_cast_like(ctx: InferContext) -> list[TypeShape]:
    return [(ctx.dtypes[1], ctx.shapes[0])]


def _ref_cast_like(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    with np.errstate(all="ignore"):
        return [inputs[0].astype(inputs[1].dtype)]


def _infer_clip(ctx: InferContext) -> list[TypeShape]:
    check_dtype(ctx, 0, NUMERIC)
    check_same_dtype(ctx, _present(ctx))
    for i in (1, 2):
        s = ctx.shapes[i] if ctx.has(i) else ()
        if s is not None and any(isinstance(d, int) and d != 1 for d in s):
            raise ctx.fail(f"input {i} (min/max) must be a scalar, got shape {s}")
    return [(ctx.dtypes[0], ctx.shapes[0])]


def _ref_clip(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    x = inputs[0]
    lo, hi = (inputs[i] if len(inputs) > i else None for i in (1, 2))
    y = x
    # min(max(x, lo), hi): NaN stays NaN, and hi wins when lo > hi (as onnxruntime)
    if lo is not None:
        y = np.maximum(y, lo.reshape(()))
    if hi is not None:
        y = np.minimum(y, hi.reshape(()))
    return [np.array(y, dtype=x.dtype, copy=True)]  # no min/max: still a fresh array


# ---- the table ----------------------------------------------------------------------------

binary("Add", np.add)
binary("Sub", np.subtract)
binary("Mul", np.multiply)
binary("Div", trunc_div)
binary("Mod", mod, infer=_infer_mod, fmod=0)
binary("Pow", power, POW_BASE, infer=_infer_pow)
variadic("Max", lambda xs: functools.reduce(np.maximum, xs), NUMERIC)
variadic("Min", lambda xs: functools.reduce(np.minimum, xs), NUMERIC)
variadic("Sum", lambda xs: functools.reduce(np.add, xs), FLOAT)
variadic("Mean", lambda xs: functools.reduce(np.add, xs) / len(xs), FLOAT)

unary("Neg", np.negative, SIGNED)
unary("Abs", np.abs, NUMERIC)
unary("Sign", np.sign, NUMERIC)
unary("Reciprocal", np.reciprocal)
unary("Sqrt", np.sqrt)
unary("Exp", np.exp)
unary("Log", np.log)
unary("Floor", np.floor)
unary("Ceil", np.ceil)
unary("Round", np.round)  # half to even, as ONNX
unary("Erf", erf)
unary("Tanh", np.tanh)
unary("Sin", np.sin)
unary("Cos", np.cos)
unary("Tan", np.tan)
unary("Asin", np.arcsin)
unary("Acos", np.arccos)
unary("Atan", np.arctan)
unary("Sinh", np.sinh)
unary("Cosh", np.cosh)
unary("Asinh", np.arcsinh)
unary("Acosh", np.arccosh)
unary("Atanh", np.arctanh)
unary("IsNaN", np.isnan, out=BOOL)
unary("IsInf", is_inf, out=BOOL, detect_negative=1, detect_positive=1)

binary("Equal", np.equal, ANY, out=BOOL)
binary("Less", np.less, out=BOOL)
binary("Greater", np.greater, out=BOOL)
binary("LessOrEqual", np.less_equal, out=BOOL)
binary("GreaterOrEqual", np.greater_equal, out=BOOL)
binary("And", np.logical_and, LOGIC)
binary("Or", np.logical_or, LOGIC)
binary("Xor", np.logical_xor, LOGIC)
unary("Not", np.logical_not, LOGIC)
binary("BitwiseAnd", np.bitwise_and, INT)
binary("BitwiseOr", np.bitwise_or, INT)
binary("BitwiseXor", np.bitwise_xor, INT)
unary("BitwiseNot", np.invert, INT)
register("BitShift", ELEMENTWISE, _infer_bit_shift,
         lambda ins, attrs: [bit_shift(ins[0], ins[1], attrs.get("direction", ""))],
         dtypes=compilable(UINT))

register("Where", ELEMENTWISE, _infer_where, _ref_where)
register("Cast", ELEMENTWISE, _infer_cast, _ref_cast)
register("CastLike", ELEMENTWISE, _infer_cast_like, _ref_cast_like)
register("Clip", ELEMENTWISE, _infer_clip, _ref_clip)

from autoclust.ops import activations  # noqa: F401  (registers the activations)
