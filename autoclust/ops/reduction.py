"""Reductions: ReduceX (opset 18 form), ArgMax/ArgMin, CumSum, TopK.

Semantics follow onnxruntime 1.31 where the spec leaves room:
- a float Sum (and Mean) of zeros that are all -0.0 is -0.0 over trailing axes, +0.0 over
  leading or middle ones (from_negative_zero), as onnxruntime's sums start.
- empty reductions give the identity: 0 (Sum, Mean, L1, L2, SumSquare), 1 (Prod), -inf
  (Max, LogSum, LogSumExp), +inf (Min); for integers Max/Min give the dtype's lowest /
  highest value.
- axes empty with noop_with_empty_axes=1 reduce over no axes: the elementwise part still
  applies (ReduceL1 -> abs, ReduceSumSquare -> x*x, ReduceLogSum -> log).
- NaN in ReduceMax/ReduceMin propagates, wherever it is in the row: the spec names NumPy's
  semantics and the ONNX reference gives NaN. onnxruntime folds `acc = x if x > acc else
  acc`, so its answer depends on where the NaN falls in its vector lanes (first element:
  NaN; elsewhere: usually skipped); we do not copy that.
- NaN in ArgMax/ArgMin: onnxruntime's fold from the first element, which we copy: a NaN is
  the answer only when it is the first element of its row; otherwise it is skipped. A 1-D
  input without select_last_index takes another onnxruntime path, where the first NaN
  wins ([1.27, nan] -> 1, as np.argmax), which the reference and compiled code copy
  (_lower_arg's first-NaN phase).
- integer Sum, Mean, Prod, L1 and SumSquare accumulate in float64 and convert back with
  saturation, as onnxruntime 1.31 does: int32 [2^30, 2^30, 2^30] sums to 2147483647, an
  int64 sum beyond 2^53 loses its low bits, the integer mean truncates toward zero;
  integer L2/LogSum/LogSumExp compute in float and truncate; float16 computes in float32
  and rounds once.
- TopK breaks ties by lower index and puts NaN last; the order among several NaNs and the
  order of sorted=0 outputs are onnxruntime implementation details we do not copy (the
  reference always returns sorted outputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autoclust.errors import ShapeInferenceError
from autoclust.kernel.lowering import LowerCtx, cast, compute_dtype, const, op, select
from autoclust.ops.table import (
    BFLOAT16,
    DATA_DEPENDENT,
    FLOAT_TYPES,
    INT64,
    NUMERIC_TYPES,
    REDUCTION,
    Arrays,
    InferContext,
    TypeShape,
    normalize_axis,
    register,
)
from autoclust.symbolic import is_dim

AXIS_TYPES = (np.dtype("int32"), np.dtype("int64"))


def _check_dtype(ctx: InferContext,
                 allowed: tuple[np.dtype, ...] = NUMERIC_TYPES + (BFLOAT16,)) -> None:
    dt = ctx.dtypes[0]
    if dt is not None and dt not in allowed:
        raise ctx.fail(f"input 0 has unsupported dtype {dt}")


# ---- ReduceX --------------------------------------------------------------------------

def _reduce_axes(ctx: InferContext, rank: int) -> list[int] | None:
    """Sorted reduced axes, or None when the axes input is not constant."""
    empty = not ctx.has(1) or ctx.shapes[1] == (0,)
    if not empty:
        v = ctx.value(1)
        if v is None:
            return None
        empty = v.size == 0
    if empty:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    axes = {normalize_axis(int(a), rank, ctx) for a in ctx.value(1).ravel()}
    return sorted(axes)


def _infer_reduce(ctx: InferContext) -> list[TypeShape]:
    _check_dtype(ctx)
    shape, keep = ctx.shapes[0], ctx.attr("keepdims", 1)
    if shape is None:
        return [(ctx.dtypes[0], None)]
    axes = _reduce_axes(ctx, len(shape))
    if axes is None:  # axes only known at run time
        if keep:
            return [(ctx.dtypes[0], (None,) * len(shape))]
        n = ctx.shapes[1]
        ok = n is not None and len(n) == 1 and isinstance(n[0], int)
        return [(ctx.dtypes[0], (None,) * (len(shape) - n[0]) if ok else None)]
    if keep:
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return [(ctx.dtypes[0], out)]


def _ref_axes(x: np.ndarray, axes_in: np.ndarray | None, attrs: dict[str, Any]) -> tuple:
    if axes_in is None or axes_in.size == 0:
        return () if attrs.get("noop_with_empty_axes", 0) else tuple(range(x.ndim))
    try:
        return tuple(sorted({normalize_axis(int(a), x.ndim) for a in axes_in.ravel()}))
    except ShapeInferenceError as exc:
        raise ShapeInferenceError(f"reduce axes {axes_in.tolist()}: {exc}") from None


def _max_min(x: np.ndarray, axes: tuple, is_max: bool) -> np.ndarray:
    if x.dtype.kind == "f":  # NaN anywhere in a row gives NaN (module docstring)
        fill = -np.inf if is_max else np.inf
        fn = np.max if is_max else np.min
        return fn(x, axis=axes, keepdims=True, initial=fill).astype(x.dtype)
    info = np.iinfo(x.dtype)
    if is_max:
        return np.max(x, axis=axes, keepdims=True, initial=info.min)
    return np.min(x, axis=axes, keepdims=True, initial=info.max)


def saturate(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 -> integer dtype, truncating toward zero and clamping to the dtype's range.

    float64 has no int64 (uint64) maximum: it rounds to 2^63 (2^64), which a clip leaves in
    place and the conversion wraps to the minimum (the constant-folded ReduceSum of int64
    [[2^63 - 1]] gave -2^63; onnxruntime, and our compiled llvm.fptosi.sat, 2^63 - 1)."""
    info = np.iinfo(dtype)
    t = np.clip(np.trunc(y), info.min, info.max)
    top = t >= float(info.max)  # float(info.max) is the first value past it for 64 bits
    return np.where(top, info.max, np.where(top, 0, t).astype(dtype)).astype(dtype)


def _float_mean(x: np.ndarray, axes: tuple) -> np.ndarray:
    s = _sum(x, axes)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return s / n if n else s  # onnxruntime: the mean of nothing is 0, not NaN


def _log_sum_exp(x: np.ndarray, axes: tuple) -> np.ndarray:
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    m = np.max(x, axis=axes, keepdims=True, initial=low)
    shift = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    e = np.exp(x - shift)
    if x.dtype.kind in "iu":
        e = np.trunc(e)  # onnxruntime computes exp in the integer type
    return np.log(np.sum(e, axis=axes, keepdims=True)) + shift


def from_negative_zero(shape: tuple, axes: Sequence[int]) -> bool:
    """Whether a float sum over `axes` (sorted, non-negative) of `shape` starts at -0.0 (a
    row of -0.0 sums to -0.0) rather than +0.0, as onnxruntime's do: its sums over trailing
    axes (the whole tensor included) start from the row's own values, those over leading
    or middle axes (even of length 1) from +0.0, and an empty row sums to +0.0 (fuzz
    121/2925: 1 / ReduceSum([-0.]) is -inf there). A symbolic dim is at least 2 long."""
    rank = len(shape)
    trailing = list(axes) == list(range(rank - len(axes), rank))
    return bool(axes) and trailing and not any(isinstance(shape[a], int) and shape[a] == 0
                                               for a in axes)


def _sum(x: np.ndarray, axes: tuple) -> np.ndarray:
    start = -0.0 if x.dtype.kind == "f" and from_negative_zero(x.shape, axes) else 0
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype, initial=start)


def _prod(x: np.ndarray, axes: tuple) -> np.ndarray:
    """A float32 product in float64, rounded once (the lowering's accumulator: a float32
    product's partials overflow and underflow apart, _accumulate_dtype)."""
    wide = np.float64 if x.dtype.kind == "f" else x.dtype
    return np.prod(x, axis=axes, keepdims=True, dtype=wide)


def _float_ops() -> dict[str, Callable[[np.ndarray, tuple], np.ndarray]]:
    s = _sum
    return {
        "ReduceSum": s,
        "ReduceMean": _float_mean,
        "ReduceMax": lambda x, a: _max_min(x, a, True),
        "ReduceMin": lambda x, a: _max_min(x, a, False),
        "ReduceProd": _prod,
        "ReduceL1": lambda x, a: s(np.abs(x), a),
        "ReduceL2": lambda x, a: np.sqrt(s(x * x, a)),
        "ReduceLogSum": lambda x, a: np.log(s(x, a)),
        "ReduceLogSumExp": _log_sum_exp,
        "ReduceSumSquare": lambda x, a: s(x * x, a),
    }


_REDUCE_FNS = _float_ops()
# Integer ops that accumulate in float64 and saturate back (module docstring).
_SATURATING = ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceSumSquare")
# Integer ops computed in float64 and truncated (onnxruntime casts the float result).
_VIA_FLOAT = ("ReduceL2", "ReduceLogSum")


def _reduce_ref(op: str) -> Callable[[Arrays, dict[str, Any]], list[np.ndarray]]:
    fn = _REDUCE_FNS[op]

    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        axes = _ref_axes(x, inputs[1] if len(inputs) > 1 else None, attrs)
        with np.errstate(all="ignore"):
            if x.dtype == np.float16:
                y = fn(x.astype(np.float32), axes).astype(x.dtype)
            elif x.dtype.kind in "iu" and op in _SATURATING:
                y = saturate(fn(x.astype(np.float64), axes), x.dtype)
            elif x.dtype.kind in "iu" and op in _VIA_FLOAT:
                y = fn(x.astype(np.float64), axes).astype(x.dtype)
            else:
                y = fn(x, axes).astype(x.dtype)
        if not attrs.get("keepdims", 1):
            y = y.reshape([d for i, d in enumerate(y.shape) if i not in axes])
        return [y]
    return ref


# ---- ReduceX lowering ---------------------------------------------------------------------

# op -> (phase kind, element transform, finish(result, count)): sum(x), max(x), sum(|x|), ...
_LOWER: dict[str, tuple] = {
    "ReduceSum": ("sum", None, None),
    "ReduceMean": ("sum", None, lambda r, n: op("div", r, const(n, r.dtype)) if n else r),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceL1": ("sum", lambda e: op("abs", e), None),
    "ReduceL2": ("sum", lambda e: op("mul", e, e), lambda r, n: op("sqrt", r)),
    "ReduceLogSum": ("sum", None, lambda r, n: op("log", r)),
    "ReduceSumSquare": ("sum", lambda e: op("mul", e, e), None),
}


def reduce_axes(ctx: LowerCtx, rank: int) -> list[int]:
    """Sorted reduced axes of a ReduceX node ([] for a no-op reduction)."""
    axes = ctx.ints(1)
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({a + rank if a < 0 else a for a in axes})


def kept_index(idx: tuple, rank: int, axes: list[int], keepdims: bool) -> dict:
    """Map each kept dim of the reduced input to its index in the output."""
    kept_dims = [d for d in range(rank) if d not in axes]
    if keepdims:
        return {d: idx[d] for d in kept_dims}
    return dict(zip(kept_dims, idx))


def _accumulate_dtype(op_name: str, dtype: str) -> str:
    if dtype[0] in "iu" and op_name in _SATURATING + _VIA_FLOAT:
        return "float64"
    if op_name == "ReduceProd" and dtype in ("float16", "bfloat16", "float32"):
        # A product's partials in float32 overflow and underflow: the vectorized phase
        # multiplies lanes apart, and one lane at inf with another at 0 gave NaN for a
        # row of 1e20s and 1e-43s whose exact product (-1.6e-115) rounds to -0.0, which
        # onnxruntime's sequential product gives (fuzz 129/1505, 129/3). In float64 (range
        # 1e+-308: dozens of float32 extremes) and rounded once, the order rarely matters.
        return "float64"
    return compute_dtype(dtype)


def _lower_reduce(ctx: LowerCtx):
    shape, dtype = ctx.in_shape(0), ctx.in_dtype(0)
    rank, name = len(shape), ctx.node.op
    ct = _accumulate_dtype(name, dtype)
    axes = reduce_axes(ctx, rank)

    def load(ix: tuple):
        return cast(ctx.value(0, ix), ct)

    if name == "ReduceLogSumExp":
        if not axes:  # log(exp(x - x)) + x, as the reference: x itself
            return _finish_int(load(ctx.idx), name, dtype)
        kept = kept_index(ctx.idx, rank, axes, ctx.attr("keepdims", 1))
        return _finish_int(log_sum_exp(ctx, shape, axes, kept, load, ct), name, dtype)
    kind, pre, finish = _LOWER[name]
    element = load if pre is None else (lambda ix: pre(load(ix)))
    if not axes:  # a no-op reduction (or a 0-d input) applies the element transform only
        r = element(ctx.idx)
        return _finish_int(finish(r, 1) if finish else r, name, dtype)
    kept = kept_index(ctx.idx, rank, axes, ctx.attr("keepdims", 1))
    r = ctx.reduce(kind, shape, axes, kept, element, ct,
                   kind == "sum" and ct[0] == "f" and from_negative_zero(shape, axes))
    if finish:
        r = finish(r, math.prod(shape[a] for a in axes))
    return _finish_int(r, name, dtype)


def _finish_int(r, op_name: str, dtype: str):
    if dtype[0] in "iu" and op_name in _SATURATING:
        return op("cast_sat", r, dtype=dtype)
    return cast(r, dtype) if r.dtype != compute_dtype(dtype) else r


def finite_max(ctx: LowerCtx, shape: tuple, axes: list[int], kept: dict, load, ct: str):
    """The row maximum, or 0 when it is +-inf (so that x - max never gives inf - inf)."""
    m = ctx.reduce("max", shape, axes, kept, load, ct)
    return select(op("eq", op("abs", m), const(math.inf, ct)), const(0, ct), m)


def log_sum_exp(ctx: LowerCtx, shape: tuple, axes: list[int], kept: dict, load, ct: str):
    """log(sum(exp(x - m))) + m over the row, m its finite maximum."""
    m = finite_max(ctx, shape, axes, kept, load, ct)
    s = ctx.reduce("sum", shape, axes, kept, lambda ix: op("exp", op("sub", load(ix), m)), ct)
    return op("add", op("log", s), m)


for _op in _REDUCE_FNS:
    register(_op, REDUCTION, _infer_reduce, _reduce_ref(_op), shape_inputs=(1,),
             lower=_lower_reduce, cost=4 if _op in ("ReduceLogSumExp", "ReduceLogSum") else 1,
             shape_like=_op == "ReduceProd",
             exact="copy" if _op in ("ReduceMax", "ReduceMin") else "",
             doc=f"{_op}(data, axes?) with keepdims and noop_with_empty_axes (opset 18).")


# ---- ArgMax / ArgMin --------------------------------------------------------------------

def _infer_arg(ctx: InferContext) -> list[TypeShape]:
    _check_dtype(ctx)
    shape = ctx.shapes[0]
    if shape is None:
        return [(INT64, None)]
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(shape), ctx)
    if shape[axis] == 0 and not _empty_elsewhere(shape, axis):
        raise ctx.fail(f"cannot take {ctx.op} over empty axis {axis} of shape {shape}")
    if ctx.attr("keepdims", 1):
        return [(INT64, tuple(1 if i == axis else d for i, d in enumerate(shape)))]
    return [(INT64, tuple(d for i, d in enumerate(shape) if i != axis))]


def _empty_elsewhere(shape: Any, axis: int) -> bool:
    """Whether another dim of `shape` is 0: an Arg over an empty axis then has no element
    to answer (onnxruntime returns the empty result; otherwise it is an error)."""
    return any(d == 0 for i, d in enumerate(shape) if i != axis)


def _arg_ref(is_max: bool) -> Callable[[Arrays, dict[str, Any]], list[np.ndarray]]:
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        axis = normalize_axis(int(attrs.get("axis", 0)), x.ndim)
        if x.ndim and x.shape[axis] == 0:
            if not _empty_elsewhere(x.shape, axis):
                raise ShapeInferenceError(f"Arg{'Max' if is_max else 'Min'} over empty axis "
                                          f"{axis} of shape {x.shape}")
            keep = attrs.get("keepdims", 1)
            return [np.zeros([1 if i == axis else d for i, d in enumerate(x.shape)
                              if keep or i != axis], np.int64)]
        nan_first = None
        if x.dtype.kind == "f":
            nan_first = np.take(np.isnan(x), [0], axis=axis) if x.ndim else np.isnan(x)
            x = np.where(np.isnan(x), -np.inf if is_max else np.inf, x)
        fn = np.argmax if is_max else np.argmin
        if attrs.get("select_last_index", 0) and x.ndim:
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=True)
        else:
            idx = fn(x, axis=axis, keepdims=True) if x.ndim else np.asarray(0)
        if nan_first is not None:
            idx = np.where(nan_first, 0, idx)  # a leading NaN is never replaced
        if _nan_wins(inputs[0], attrs):
            idx = np.argmax(np.isnan(inputs[0]), keepdims=True)  # the first NaN (fuzz 97/4831)
        idx = idx.astype(np.int64)
        if not attrs.get("keepdims", 1) and x.ndim:
            idx = np.squeeze(idx, axis)
        return [idx]
    return ref


def _nan_wins(x: np.ndarray, attrs: dict[str, Any]) -> bool:
    """Whether onnxruntime's Arg of `x` is its first NaN: a 1-D float input holding one,
    without select_last_index (elsewhere its fold skips a NaN after the first element)."""
    return (x.ndim == 1 and x.dtype.kind == "f" and not attrs.get("select_last_index", 0)
            and bool(np.isnan(x).any()))


def _lower_arg(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    rank = len(shape)
    if rank == 0:
        return const(0, "int64")
    axis = int(ctx.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    kind = "argmax" if ctx.node.op == "ArgMax" else "argmin"
    if ctx.attr("select_last_index", 0):
        kind += "_last"
    kept = kept_index(ctx.idx, rank, [axis], ctx.attr("keepdims", 1))
    ct = compute_dtype(ctx.in_dtype(0))
    arg = ctx.reduce(kind, shape, [axis], kept, lambda ix: cast(ctx.value(0, ix), ct), "int64")
    if rank != 1 or ctx.attr("select_last_index", 0) or np.dtype(ct).kind != "f":
        return arg
    # onnxruntime's 1-D path (np.argmax's): the first NaN wins wherever it lies; its fold
    # of higher ranks, which `kind` copies, takes a NaN only as the first element
    none = const(1 << 62, "int64")
    first_nan = ctx.reduce("min", shape, [0], kept, lambda ix: select(
        op("isnan", cast(ctx.value(0, ix), ct)), ctx.index(ix[0]), none), "int64")
    return select(op("lt", first_nan, none), first_nan, arg)


register("ArgMax", REDUCTION, _infer_arg, _arg_ref(True), lower=_lower_arg,
         discrete=True, doc="ArgMax(data): int64 indices along axis; keepdims, select_last_index.")
register("ArgMin", REDUCTION, _infer_arg, _arg_ref(False), lower=_lower_arg,
         discrete=True, doc="ArgMin(data): int64 indices along axis; keepdims, select_last_index.")


# ---- CumSum ---------------------------------------------------------------------------

_CUMSUM_TYPES = FLOAT_TYPES + (BFLOAT16,) + tuple(np.dtype(t) for t in ("int32", "int64", "uint32",
                                                          "uint64"))


def _infer_cumsum(ctx: InferContext) -> list[TypeShape]:
    _check_dtype(ctx, _CUMSUM_TYPES)
    if ctx.dtypes[1] not in AXIS_TYPES:
        raise ctx.fail(f"axis input must be int32 or int64, got {ctx.dtypes[1]}")
    if ctx.shapes[1] is not None and len(ctx.shapes[1]) > 1:
        raise ctx.fail(f"axis input must be a scalar or 1 element, got shape {ctx.shapes[1]}")
    v, rank = ctx.value(1), ctx.rank(0)
    if v is not None and rank is not None:
        normalize_axis(int(v.ravel()[0]), rank, ctx)
    return [(ctx.dtypes[0], ctx.shapes[0])]


def _scan_ref(fn: Callable, identity: int) -> Callable:
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        return [_scan(fn, identity, inputs, attrs)]
    return ref


def _scan(fn: Callable, identity: int, inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    """CumSum / CumProd: running fn along axis; exclusive, reverse."""
    x = inputs[0]
    axis = normalize_axis(int(inputs[1].ravel()[0]), x.ndim)
    work = x.astype(np.float32) if x.dtype == np.float16 else x
    if attrs.get("reverse", 0):
        work = np.flip(work, axis)
    with np.errstate(all="ignore"):
        y = fn(work, axis=axis, dtype=work.dtype)
    if attrs.get("exclusive", 0) and y.shape[axis]:
        # [a, b, c] -> [identity, a, a+b]
        first = np.full_like(np.take(y, [0], axis=axis), identity)
        rest = np.take(y, np.arange(y.shape[axis] - 1), axis=axis)
        if identity == 0:  # onnxruntime starts an exclusive sum at +0.0: 0.0 + -0.0 is +0.0
            rest = rest + y.dtype.type(0)
        y = np.concatenate([first, rest], axis=axis)
    if attrs.get("reverse", 0):
        y = np.flip(y, axis)
    return np.ascontiguousarray(y).astype(x.dtype)


def _lower_scan(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    axis = ctx.ints(1)[0]
    axis = axis + len(shape) if axis < 0 else axis
    ct = compute_dtype(ctx.in_dtype(0))
    kind = "sum" if ctx.node.op == "CumSum" else "prod"
    return ctx.scan(kind, shape, axis, lambda ix: cast(ctx.value(0, ix), ct), ct,
                    exclusive=bool(ctx.attr("exclusive", 0)),
                    reverse=bool(ctx.attr("reverse", 0)))


register("CumProd", REDUCTION, _infer_cumsum, _scan_ref(np.cumprod, 1), shape_inputs=(1,),
         lower=_lower_scan,
         doc="CumProd(x, axis): running product along axis; exclusive, reverse (opset 26).")
register("CumSum", REDUCTION, _infer_cumsum, _scan_ref(np.cumsum, 0), shape_inputs=(1,),
         lower=_lower_scan,
         doc="CumSum(x, axis): running sum along axis; exclusive, reverse attrs.")


# ---- TopK -----------------------------------------------------------------------------

def _infer_topk(ctx: InferContext) -> list[TypeShape]:
    _check_dtype(ctx)
    if ctx.dtypes[1] != INT64:
        raise ctx.fail(f"K must be int64, got {ctx.dtypes[1]}")
    shape, k = ctx.shapes[0], ctx.value(1)
    if shape is None:
        return [(ctx.dtypes[0], None), (INT64, None)]
    axis = normalize_axis(int(ctx.attr("axis", -1)), len(shape), ctx)
    dim = None
    if k is not None:
        dim = int(k.ravel()[0])
        n = shape[axis]
        if dim < 0 or (is_dim(n) and dim > n):
            raise ctx.fail(f"K={dim} is out of range for axis {axis} of shape {shape}")
    out = tuple(dim if i == axis else d for i, d in enumerate(shape))
    return [(ctx.dtypes[0], out), (INT64, out)]


def _sort_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """Stable order along axis: largest/smallest first, ties by lower index, NaN last."""
    if x.dtype.kind == "f":
        key = -x if largest else x
        return np.lexsort((key, np.isnan(x)), axis=axis)
    key = ~x if largest else x  # ~ reverses order for signed and unsigned ints alike
    return np.argsort(key, axis=axis, kind="stable")


def _topk_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, k = inputs[0], int(inputs[1].ravel()[0])
    axis = normalize_axis(int(attrs.get("axis", -1)), x.ndim)
    if not 0 <= k <= x.shape[axis]:
        raise ShapeInferenceError(f"TopK: K={k} is out of range for axis {axis} of shape "
                                  f"{x.shape}")
    with np.errstate(all="ignore"):
        order = _sort_order(x, axis, bool(attrs.get("largest", 1)))
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=axis), idx]


register("TopK", DATA_DEPENDENT, _infer_topk, _topk_ref, shape_inputs=(1,),
         refuse="TopK's output depends on the data (sorting): it runs in onnxruntime",
         doc="TopK(X, K) -> (values, int64 indices); axis, largest, sorted.", discrete=True)
