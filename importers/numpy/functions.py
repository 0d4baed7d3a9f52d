"""NumPy functions on traced arrays -> op-table ops (Tracer.__array_function__).

FUNCTIONS maps each supported NumPy function to its lowering; each takes NumPy's own
parameters and refuses the ones it cannot honour (out=, where=, ...) by name. Result
dtypes come from NumPy itself, run on one-element or zero-strided stand-ins of the
arguments (never on their data), so promotion, default accumulator types (np.sum of int32
is int64) and argument checks (axes, shapes) are NumPy's. This module holds reductions,
elementwise-like functions (where, clip, astype, round), products (matmul, dot, einsum)
and array creation from a traced array's shape; layout functions are in shapes.py and
indexing in index.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from autoclust.importers.builder import Operand
from autoclust.importers.numpy.trace import (
    WIDE,
    TraceContext,
    Tracer,
    context_of,
    describe_call,
    unsupported,
)

from autoclust.errors import InvalidInputError
from autoclust.kernel.ir import reduce_identity

_NO = np._NoValue  # NumPy's "argument not given"
INT64 = np.dtype(np.int64)
BOOL = np.dtype(bool)
# reductions and products compute uint64 in int64 (same bits) and small types in WIDE
COMPUTE = {**WIDE, np.dtype(np.uint64): INT64}


def compute_dtype(dt: np.dtype) -> np.dtype:
    return COMPUTE.get(np.dtype(dt), np.dtype(dt))


def numpy_says(name: str, args: Sequence[Any], fn: Callable[[], Any]) -> Any:
    """Run a NumPy shape/dtype oracle; its complaints become InvalidInputError."""
    try:
        return fn()
    except (ValueError, IndexError, TypeError) as exc:
        raise InvalidInputError(f"{describe_call(name, args, {})}: {exc}") from None


def stand_in(x: Any, size: int | None = None) -> Any:
    """A data-free array with x's dtype: zero-strided with its shape, or of `size` elems.
    Python scalars stay as they are (NumPy treats them as weak)."""
    if type(x) in (bool, int, float):
        return x
    dt = np.dtype(x.dtype) if isinstance(x, Tracer | np.ndarray | np.generic) \
        else np.asarray(x).dtype
    if size is not None:
        return np.zeros(size, dt)
    return np.broadcast_to(np.zeros((), dt), np.shape(x) if not isinstance(x, Tracer)
                           else x.shape)


def refuse(name: str, args: Sequence[Any], kwargs: dict[str, Any],
           **given: Any) -> None:
    """Raise for keyword arguments that are given with a value other than their default."""
    for key, (value, default) in given.items():
        if value is not default and not (isinstance(value, bool | str | int | type(None))
                                         and value == default):
            raise unsupported(name, args, kwargs, f"{key}= is not supported")


def normalize_axes(name: str, axis: Any, ndim: int, args: Sequence[Any]) -> tuple[int, ...]:
    """axis (None, int or tuple) as sorted non-negative axes; NumPy's errors otherwise."""
    if axis is None:
        return tuple(range(ndim))
    items = tuple(axis) if isinstance(axis, tuple | list) else (axis,)
    out = []
    for a in items:
        if isinstance(a, Tracer) or not isinstance(a, int | np.integer):
            raise unsupported(name, args, {}, f"axis must be a constant int, got {a!r}")
        if not -ndim <= a < ndim:
            raise InvalidInputError(f"{name}: axis {a} is out of bounds for array of "
                                    f"dimension {ndim}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise InvalidInputError(f"{name}: repeated axis in {axis}")
    return tuple(sorted(out))


def reduced_shape(shape: tuple, axes: tuple[int, ...], keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# What a reduction over no elements gives (the graph gets it as a constant: compiled
# reductions over a zero-size axis do not write their output yet).
EMPTY_REDUCTION = {"ReduceSum": reduce_identity("sum", "float32"),
                   "ReduceProd": reduce_identity("prod", "float32"), "ReduceMean": np.nan}


def filled(ctx: TraceContext, value: Any, dtype: np.dtype, shape: tuple) -> Operand:
    """A `shape` array of `value`: Expand of a scalar constant."""
    const = ctx.builder.constant(np.asarray(value, dtype=dtype))
    return ctx.builder.Expand(const, np.asarray(shape, dtype=np.int64))


def _reduce_op(ctx: TraceContext, op: str, x: Operand, axes: tuple[int, ...],
               keepdims: bool) -> Operand:
    if not axes:
        return ctx.builder.Identity(x)
    shape = tuple(x.shape)
    if math.prod(shape[i] for i in axes) == 0 and op in EMPTY_REDUCTION:
        return filled(ctx, EMPTY_REDUCTION[op], x.dtype, reduced_shape(shape, axes, keepdims))
    return ctx.builder.op(op, x, list(axes), keepdims=int(keepdims))


def _reduction(name: str, op: str, a: Any, axis: Any, keepdims: bool, out_dtype: np.dtype,
               *, nonempty: bool = False) -> Tracer:
    ctx = context_of([a])
    x = ctx.operand(a)
    shape = tuple(x.shape)
    axes = normalize_axes(name, axis, len(shape), [a])
    if nonempty and any(shape[i] == 0 for i in axes):
        raise InvalidInputError(f"{name}: zero-size array to reduction operation {op} which "
                                "has no identity")
    x = ctx.cast(x, compute_dtype(out_dtype))
    r = _reduce_op(ctx, op, x, axes, bool(keepdims))
    if op in ("ReduceMax", "ReduceMin") and x.dtype.kind == "f" and axes:
        r = _propagate_nan(ctx, x, r, axes, bool(keepdims))
    return ctx.wrap(r, out_dtype, reduced_shape(shape, axes, bool(keepdims)), name)


def _propagate_nan(ctx: TraceContext, x: Operand, r: Operand, axes: tuple[int, ...],
                   keepdims: bool) -> Operand:
    """NaN where a reduced row has one (onnxruntime's full ReduceMax skips NaNs)."""
    b = ctx.builder
    nan = b.ReduceMax(b.Cast(b.IsNaN(x), to=np.int32), list(axes), keepdims=int(keepdims))
    return b.Where(b.Greater(nan, b.constant(np.int32(0))),
                   b.constant(np.asarray(np.nan, x.dtype)), r)


def _accumulator(fn: Callable[..., Any], a: Any, dtype: Any) -> np.dtype:
    return np.dtype(fn(stand_in(a, 1), dtype=dtype).dtype)


def reduce_sum(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
               keepdims: bool = False, initial: Any = _NO, where: Any = _NO) -> Tracer:
    """np.sum -> ReduceSum (ints accumulate in int64, as NumPy)."""
    refuse("np.sum", [a], {}, out=(out, None), initial=(initial, _NO), where=(where, _NO))
    dt = numpy_says("np.sum", [a], lambda: _accumulator(np.sum, a, dtype))
    return _reduction("np.sum", "ReduceSum", a, axis, keepdims, dt)


def reduce_prod(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
                keepdims: bool = False, initial: Any = _NO, where: Any = _NO) -> Tracer:
    """np.prod -> ReduceProd."""
    refuse("np.prod", [a], {}, out=(out, None), initial=(initial, _NO), where=(where, _NO))
    dt = numpy_says("np.prod", [a], lambda: _accumulator(np.prod, a, dtype))
    return _reduction("np.prod", "ReduceProd", a, axis, keepdims, dt)


def reduce_max(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False,
               initial: Any = _NO, where: Any = _NO) -> Tracer:
    """np.max -> ReduceMax (NaN propagates, as in NumPy)."""
    refuse("np.max", [a], {}, out=(out, None), initial=(initial, _NO), where=(where, _NO))
    return _reduction("np.max", "ReduceMax", a, axis, keepdims, np.dtype(a.dtype),
                      nonempty=True)


def reduce_min(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False,
               initial: Any = _NO, where: Any = _NO) -> Tracer:
    """np.min -> ReduceMin."""
    refuse("np.min", [a], {}, out=(out, None), initial=(initial, _NO), where=(where, _NO))
    return _reduction("np.min", "ReduceMin", a, axis, keepdims, np.dtype(a.dtype),
                      nonempty=True)


def reduce_mean(a: Any, axis: Any = None, dtype: Any = None, out: Any = None,
                keepdims: bool = False, *, where: Any = _NO) -> Tracer:
    """np.mean -> ReduceMean (ints in float64; float16 accumulates in float32)."""
    refuse("np.mean", [a], {}, out=(out, None), where=(where, _NO))
    dt = numpy_says("np.mean", [a], lambda: _accumulator(np.mean, a, dtype))
    return _reduction("np.mean", "ReduceMean", a, axis, keepdims, dt)


def _count(ctx: TraceContext, a: Any, flip: bool) -> Operand:
    b = ctx.builder
    x = ctx.cast(ctx.operand(a), BOOL)
    return b.Cast(b.Not(x) if flip else x, to=INT64)


def _any_all(name: str, a: Any, axis: Any, keepdims: bool, is_all: bool) -> Tracer:
    ctx = context_of([a])
    shape = tuple(a.shape)
    axes = normalize_axes(name, axis, len(shape), [a])
    b = ctx.builder
    counted = _reduce_op(ctx, "ReduceSum", _count(ctx, a, is_all), axes, bool(keepdims))
    zero = b.constant(np.int64(0))
    r = b.Equal(counted, zero) if is_all else b.Greater(counted, zero)
    return ctx.wrap(r, BOOL, reduced_shape(shape, axes, bool(keepdims)), name)


def reduce_any(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, *,
               where: Any = _NO) -> Tracer:
    """np.any: a count of true elements > 0 (empty: False)."""
    refuse("np.any", [a], {}, out=(out, None), where=(where, _NO))
    return _any_all("np.any", a, axis, keepdims, False)


def reduce_all(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, *,
               where: Any = _NO) -> Tracer:
    """np.all: a count of false elements == 0 (empty: True)."""
    refuse("np.all", [a], {}, out=(out, None), where=(where, _NO))
    return _any_all("np.all", a, axis, keepdims, True)


def count_nonzero(a: Any, axis: Any = None, *, keepdims: bool = False) -> Tracer:
    """np.count_nonzero -> ReduceSum of a bool->int64 cast."""
    ctx = context_of([a])
    shape = tuple(a.shape)
    axes = normalize_axes("np.count_nonzero", axis, len(shape), [a])
    r = _reduce_op(ctx, "ReduceSum", _count(ctx, a, False), axes, bool(keepdims))
    return ctx.wrap(r, INT64, reduced_shape(shape, axes, bool(keepdims)), "np.count_nonzero")


def _arg_reduce(name: str, op: str, a: Any, axis: Any, keepdims: bool) -> Tracer:
    ctx = context_of([a])
    b = ctx.builder
    x = ctx.operand(a)
    if axis is None:
        x, keep_shape = b.Reshape(x, [-1]), (1,) * len(a.shape)
        axis = 0
    shape = tuple(x.shape)
    (ax,) = normalize_axes(name, axis, len(shape), [a]) or (0,)
    if shape[ax] == 0:
        raise InvalidInputError(f"{name}: attempt to get {name[3:]} of an empty sequence")
    x = ctx.cast(x, compute_dtype(x.dtype))
    r = b.op(op, x, axis=ax, keepdims=int(bool(keepdims)))
    if np.dtype(a.dtype).kind == "f":  # NumPy answers the first NaN; ArgMax skips NaNs
        nan = b.Cast(b.IsNaN(x), to=np.int32)
        has_nan = b.Greater(b.ReduceMax(nan, [ax], keepdims=int(bool(keepdims))),
                            b.constant(np.int32(0)))
        r = b.Where(has_nan, b.ArgMax(nan, axis=ax, keepdims=int(bool(keepdims))), r)
    out_shape = reduced_shape(shape, (ax,), bool(keepdims))
    if keepdims and len(shape) != len(a.shape):
        r, out_shape = b.Reshape(r, list(keep_shape)), keep_shape
    return ctx.wrap(r, INT64, out_shape, name)


def argmax(a: Any, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Tracer:
    """np.argmax -> ArgMax (first maximum; the first NaN when there is one)."""
    refuse("np.argmax", [a], {}, out=(out, None))
    return _arg_reduce("np.argmax", "ArgMax", a, axis, keepdims)


def argmin(a: Any, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Tracer:
    """np.argmin -> ArgMin."""
    refuse("np.argmin", [a], {}, out=(out, None))
    return _arg_reduce("np.argmin", "ArgMin", a, axis, keepdims)


def cumsum(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> Tracer:
    """np.cumsum -> CumSum (axis None: of the flattened array)."""
    refuse("np.cumsum", [a], {}, out=(out, None))
    ctx = context_of([a])
    b = ctx.builder
    dt = numpy_says("np.cumsum", [a], lambda: _accumulator(np.cumsum, a, dtype))
    x = ctx.operand(a)
    if axis is None:
        x, axis = b.Reshape(x, [-1]), 0
    shape = tuple(x.shape)
    (ax,) = normalize_axes("np.cumsum", axis, len(shape), [a]) or (0,)
    x = ctx.cast(x, compute_dtype(dt))
    if not shape:
        return ctx.wrap(b.Identity(x), dt, shape, "np.cumsum")
    return ctx.wrap(b.CumSum(x, np.int64(ax)), dt, shape, "np.cumsum")


def _moments(name: str, a: Any, axis: Any, dtype: Any, ddof: Any, keepdims: bool,
             root: bool) -> Tracer:
    ctx = context_of([a])
    b = ctx.builder
    dt = numpy_says(name, [a], lambda: np.dtype(np.var(stand_in(a, 2), dtype=dtype).dtype))
    x = ctx.cast(ctx.operand(a), compute_dtype(dt))
    shape = tuple(a.shape)
    axes = normalize_axes(name, axis, len(shape), [a])
    n = math.prod(shape[i] for i in axes)
    d = b.Sub(x, _reduce_op(ctx, "ReduceMean", x, axes, True)) if axes else b.Sub(x, x)
    total = _reduce_op(ctx, "ReduceSum", b.Mul(d, d), axes, bool(keepdims))
    r = b.Div(total, b.constant(np.asarray(max(n - ddof, 0), dtype=x.dtype)))
    if root:
        r = b.Sqrt(r)
    return ctx.wrap(r, dt, reduced_shape(shape, axes, bool(keepdims)), name)


def var(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0,
        keepdims: bool = False, *, where: Any = _NO, mean: Any = _NO, correction: Any = _NO
        ) -> Tracer:
    """np.var: sum((x - mean)^2) / (n - ddof), NumPy's two passes."""
    refuse("np.var", [a], {}, out=(out, None), where=(where, _NO), mean=(mean, _NO),
           correction=(correction, _NO))
    return _moments("np.var", a, axis, dtype, ddof, keepdims, False)


def std(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0,
        keepdims: bool = False, *, where: Any = _NO, mean: Any = _NO, correction: Any = _NO
        ) -> Tracer:
    """np.std: the square root of np.var."""
    refuse("np.std", [a], {}, out=(out, None), where=(where, _NO), mean=(mean, _NO),
           correction=(correction, _NO))
    return _moments("np.std", a, axis, dtype, ddof, keepdims, True)


# ---- elementwise-like functions ------------------------------------------------------------

def where(condition: Any, x: Any = _NO, y: Any = _NO) -> Tracer:
    """np.where(c, x, y) -> Where on the promoted dtype (1-argument where is refused)."""
    args = [condition, x, y]
    if x is _NO or y is _NO:
        raise unsupported("np.where", [condition], {}, "np.where(condition) returns indices "
                          "whose number depends on the data; pass x and y")
    ctx = context_of(args)
    dt = numpy_says("np.where", args, lambda: np.where(
        stand_in(condition, 0).astype(bool), stand_in(x, 0), stand_in(y, 0)).dtype)
    shape = numpy_says("np.where", args, lambda: np.broadcast_shapes(
        *(np.shape(v) if not isinstance(v, Tracer) else v.shape for v in args)))
    b = ctx.builder
    wide = WIDE.get(dt, dt)
    c = ctx.cast(ctx.operand(condition), BOOL)
    r = b.Where(c, ctx.cast(ctx.operand(x, dt), wide), ctx.cast(ctx.operand(y, dt), wide))
    return ctx.wrap(r, dt, tuple(shape), "np.where")


def clip(a: Any, a_min: Any = _NO, a_max: Any = _NO, out: Any = None, *, min: Any = _NO,
         max: Any = _NO, **kwargs: Any) -> Tracer:
    """np.clip = np.minimum(np.maximum(a, a_min), a_max) (NaN propagates, as in NumPy)."""
    refuse("np.clip", [a], kwargs, out=(out, None))
    if kwargs:
        raise unsupported("np.clip", [a], kwargs, "only a, a_min and a_max are supported")
    lo = min if a_min is _NO else a_min
    hi = max if a_max is _NO else a_max
    r = a
    if lo is not _NO and lo is not None:
        r = np.maximum(r, lo)
    if hi is not _NO and hi is not None:
        r = np.minimum(r, hi)
    return r if r is not a else np.positive(a)


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None,
           casting: str = "unsafe") -> Tracer:
    """x.astype(dtype) / np.astype -> Cast."""
    ctx = context_of([x])
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise unsupported("astype", [x, dtype], {}, str(exc)) from None
    if dt.kind not in "biuf" or dt.itemsize > 8:
        raise unsupported("astype", [x, dtype], {}, f"cannot trace arrays of dtype {dt}")
    if not np.can_cast(x.dtype, dt, casting=casting):
        raise InvalidInputError(f"astype: cannot cast {x.dtype} to {dt} under "
                                f"casting={casting!r}")
    return ctx.wrap(ctx.operand(x), dt, x.shape, "astype")


def around(a: Any, decimals: int = 0, out: Any = None) -> Tracer:
    """np.round: rint(x * 10**d) / 10**d, as NumPy computes it."""
    refuse("np.round", [a, decimals], {}, out=(out, None))
    if not isinstance(decimals, int | np.integer):
        raise unsupported("np.round", [a, decimals], {}, "decimals must be a constant int")
    if np.dtype(a.dtype).kind != "f":
        if decimals >= 0:
            return np.positive(a)
        raise unsupported("np.round", [a, decimals], {}, "negative decimals on integers")
    if decimals == 0:
        return np.rint(a)
    f = np.asarray(10.0 ** abs(decimals), dtype=a.dtype)
    return np.rint(a * f) / f if decimals > 0 else np.rint(a / f) * f


def _like(name: str, fill: Any) -> Callable[..., Tracer]:
    def like(a: Any, dtype: Any = None, order: str = "K", subok: bool = True,
             shape: Any = None, *, device: Any = None, fill_value: Any = fill) -> Tracer:
        ctx = context_of([a])
        dt = np.dtype(a.dtype if dtype is None else dtype)
        shape = tuple(a.shape) if shape is None else tuple(np.atleast_1d(shape).tolist())
        value = ctx.builder.constant(np.asarray(fill_value, dtype=dt))
        r = ctx.builder.Expand(value, np.asarray(shape, dtype=np.int64))
        return ctx.wrap(r, dt, shape, name)
    return like


def full_like(a: Any, fill_value: Any, dtype: Any = None, order: str = "K",
              subok: bool = True, shape: Any = None, *, device: Any = None) -> Tracer:
    """np.full_like -> Expand of a scalar constant."""
    return _like("np.full_like", fill_value)(a, dtype, order, subok, shape)


# ---- products ------------------------------------------------------------------------------

def matmul(a: Any, b: Any, /, out: Any = None, **kwargs: Any) -> Tracer:
    """a @ b -> MatMul (small ints in int32, bool as a count of matches > 0)."""
    args = [a, b]
    refuse("np.matmul", args, kwargs, out=(out, None))
    ctx = context_of(args)
    res = numpy_says("np.matmul", args, lambda: np.matmul(_mm_stand_in(a), _mm_stand_in(b)))
    dt, shape = np.dtype(res.dtype), _matmul_shape(np.shape(a) if not isinstance(
        a, Tracer) else a.shape, b.shape if isinstance(b, Tracer) else np.shape(b))
    wide = compute_dtype(dt)
    if (a.shape if isinstance(a, Tracer) else np.shape(a))[-1] == 0:  # sums of nothing
        return ctx.wrap(filled(ctx, 0, dt, shape), dt, shape, "np.matmul")
    r = ctx.builder.MatMul(ctx.cast(ctx.operand(a, dt), wide), ctx.cast(ctx.operand(b, dt),
                                                                        wide))
    return ctx.wrap(r, dt, shape, "np.matmul")


def _mm_stand_in(x: Any) -> np.ndarray:
    # dtype and rank checks without the data: every dim 1 (shapes are checked apart)
    s = stand_in(x, 1) if type(x) not in (bool, int, float) else np.asarray(x)
    return s.reshape((1,) * len(np.shape(x) if not isinstance(x, Tracer) else x.shape))


def _matmul_shape(sa: tuple, sb: tuple) -> tuple:
    if not sa or not sb:
        raise InvalidInputError("np.matmul: input operand does not have enough dimensions")
    a2 = (1,) + tuple(sa) if len(sa) == 1 else tuple(sa)
    b2 = tuple(sb) + (1,) if len(sb) == 1 else tuple(sb)
    if a2[-1] != b2[-2]:
        raise InvalidInputError(f"np.matmul: mismatch in its core dimension: {tuple(sa)} @ "
                                f"{tuple(sb)} (size {a2[-1]} is different from {b2[-2]})")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError as exc:
        raise InvalidInputError(f"np.matmul: {tuple(sa)} @ {tuple(sb)}: {exc}") from None
    core = (a2[-2],) if len(sa) > 1 else ()
    core += (b2[-1],) if len(sb) > 1 else ()
    return tuple(batch) + core


def dot(a: Any, b: Any, out: Any = None) -> Tracer:
    """np.dot: a product with a 0-d operand, or matmul for 1-D and 2-D operands."""
    refuse("np.dot", [a, b], {}, out=(out, None))
    na, nb = np.ndim(a) if not isinstance(a, Tracer) else a.ndim, \
        np.ndim(b) if not isinstance(b, Tracer) else b.ndim
    if na == 0 or nb == 0:  # np.dot converts Python scalars to (float64) arrays first
        return np.multiply(*(np.asarray(v) if type(v) in (bool, int, float) else v
                             for v in (a, b)))
    if na <= 2 and nb <= 2:
        return matmul(a, b)
    raise unsupported("np.dot", [a, b], {}, "N-d dot (use np.matmul or np.einsum)")


def einsum(*operands: Any, out: Any = None, dtype: Any = None, order: str = "K",
           casting: str = "safe", optimize: Any = False) -> Tracer:
    """np.einsum with explicit output subscripts ("ij,jk->ik") -> Einsum."""
    if not operands or not isinstance(operands[0], str):
        raise unsupported("np.einsum", operands, {}, "the subscripts must come first")
    spec, arrays = operands[0].replace(" ", ""), list(operands[1:])
    refuse("np.einsum", arrays, {}, out=(out, None), dtype=(dtype, None))
    ins, arrow, result = spec.partition("->")
    terms = ins.split(",")
    if not arrow or "." in spec or len(terms) != len(arrays):
        raise unsupported("np.einsum", operands, {}, "subscripts need '->' and one term per "
                          "operand, without '...'")
    ctx = context_of(arrays)
    dims: dict[str, int] = {}
    for term, x in zip(terms, arrays):
        shape = x.shape if isinstance(x, Tracer) else np.shape(x)
        if len(term) != len(shape):
            raise InvalidInputError(f"np.einsum: term {term!r} has {len(term)} subscripts for "
                                    f"an operand of rank {len(shape)}")
        for ch, d in zip(term, shape):
            if dims.setdefault(ch, d) != d:
                raise InvalidInputError(f"np.einsum: subscript {ch!r} has sizes {dims[ch]} "
                                        f"and {d}")
    dt = np.result_type(*(stand_in(x, 0) for x in arrays))
    wide = compute_dtype(dt)
    ops_ = [ctx.cast(ctx.operand(x, dt), wide) for x in arrays]
    r = ctx.builder.Einsum(*ops_, equation=spec)
    return ctx.wrap(r, dt, tuple(dims[ch] for ch in result), "np.einsum")


def outer(a: Any, b: Any, out: Any = None) -> Tracer:
    """np.outer: ravel(a)[:, None] * ravel(b)[None, :]."""
    refuse("np.outer", [a, b], {}, out=(out, None))
    return np.multiply(np.reshape(a, (-1, 1)), np.reshape(b, (1, -1)))


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Tracer:
    """np.linalg.norm for ord=None (2-norm / Frobenius): sqrt(sum(x * x))."""
    if ord is not None:
        raise unsupported("np.linalg.norm", [x], {"ord": ord}, "only ord=None")
    if np.dtype(x.dtype).kind != "f":
        x = x.astype(np.float64)
    return np.sqrt(reduce_sum(x * x, axis=axis, keepdims=keepdims))


def _static(fn: Callable[[Any], Any]) -> Callable[..., Any]:
    return lambda a, *args, **kwargs: fn(a)


FUNCTIONS = {
    np.sum: reduce_sum, np.prod: reduce_prod, np.max: reduce_max, np.amax: reduce_max,
    np.min: reduce_min, np.amin: reduce_min, np.mean: reduce_mean, np.any: reduce_any,
    np.all: reduce_all, np.argmax: argmax, np.argmin: argmin, np.cumsum: cumsum,
    np.var: var, np.std: std, np.count_nonzero: count_nonzero,
    np.where: where, np.clip: clip, np.round: around, np.around: around,
    np.astype: astype, np.matmul: matmul, np.dot: dot, np.einsum: einsum,
    np.outer: outer, np.linalg.norm: norm,
    np.zeros_like: _like("np.zeros_like", 0), np.ones_like: _like("np.ones_like", 1),
    np.empty_like: _like("np.empty_like", 0), np.full_like: full_like,
    np.shape: _static(lambda a: tuple(a.shape)), np.ndim: _static(lambda a: a.ndim),
    np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
    np.copy: lambda a, order="K", subok=False: np.positive(a),
    np.result_type: lambda *args: np.result_type(*(stand_in(x, 0) if isinstance(
        x, Tracer) else x for x in args)),
}


