"""Shape computations (Shape, Size, ConstantOfShape, Range, EyeLike) and data-dependent ops
(NonZero, Unique).

Ops registered with `shape_like=True` (here and in the other modules: Gather, Concat,
Reshape, Cast, Add, ...) are shape computations when fed only by values that follow from
shapes: clustering pulls them into their consumer's cluster and constant folding evaluates
them once shapes are concrete. Once folded they never reach a kernel; their lowerings
cover the rest (ConstantOfShape of a big shape, a Range too long to fold).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoclust.errors import ShapeInferenceError
from autoclust.kernel.lowering import LowerCtx, cast, const, op, select
from autoclust.ops.table import (
    DATA_DEPENDENT,
    INT64,
    SHAPE,
    Arrays,
    Attrs,
    InferContext,
    TypeShape,
    dim_product,
    normalize_axis,
    register,
)
from autoclust.symbolic import is_sym, sym_array


def _tensor_attr(value: Any) -> np.ndarray:
    """A tensor attribute as numpy: the importer gives arrays; raw TensorProtos convert."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "raw_data") and hasattr(value, "data_type"):
        from onnx import numpy_helper  # only for attrs that skipped the importer
        return numpy_helper.to_array(value)
    return np.asarray(value)


def _np_dtype(elem_type: int) -> np.dtype:
    from onnx import helper
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(elem_type)))


# ---- Shape, Size -------------------------------------------------------------------------

def _shape_range(attrs: Attrs, rank: int) -> range:
    # Python slicing clamps start/end exactly as ONNX Shape-15 does.
    return range(rank)[slice(int(attrs.get("start", 0)), attrs.get("end"))]


def _shape_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    return [(INT64, (None if x is None else len(_shape_range(ctx.attrs, len(x))),))]


def _shape_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    dims = [x.shape[i] for i in _shape_range(attrs, x.ndim)]
    if any(is_sym(d) for d in dims):  # symbolic dims (a compile for a shape class)
        return [sym_array(dims)]
    return [np.array(dims, dtype=np.int64)]


def _size_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    size = inputs[0].size
    return [sym_array([size], ()) if is_sym(size) else np.array(size, dtype=np.int64)]


# ---- ConstantOfShape, Range, EyeLike -----------------------------------------------------

def _fill_value(attrs: Attrs) -> np.ndarray:
    v = attrs.get("value")
    if v is None:
        return np.zeros((), np.float32)
    v = _tensor_attr(v)
    if v.size != 1:
        raise ShapeInferenceError(f"(ConstantOfShape): value has {v.size} elements, not 1")
    return v.reshape(())


def _constant_of_shape_infer(ctx: InferContext) -> list[TypeShape]:
    dtype = _fill_value(ctx.attrs).dtype
    dims = ctx.value(0)
    if dims is None:
        s = ctx.shapes[0]
        n = s[0] if s is not None and len(s) == 1 and isinstance(s[0], int) else None
        return [(dtype, None if n is None else (None,) * n)]
    dims_l = [int(d) for d in np.asarray(dims).reshape(-1)]
    if any(d < 0 for d in dims_l):
        raise ctx.fail(f"negative dim in shape {dims_l}")
    return [(dtype, tuple(dims_l))]


def _constant_of_shape_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    value = _fill_value(attrs)
    dims = [int(d) for d in np.asarray(inputs[0]).reshape(-1)]
    return [np.full(dims, value, dtype=value.dtype)]


def _range_count(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> int:
    if delta == 0:
        raise ShapeInferenceError("(Range): delta is 0")
    if any(is_sym(np.asarray(v).item()) for v in (start, limit, delta)):
        # integer bounds from symbolic dims: ceil((limit - start) / delta) stays symbolic
        start, limit, delta = (np.asarray(v).item() for v in (start, limit, delta))
        if delta > 0:
            return max((limit - start + delta - 1) // delta, 0)
        return max((start - limit - delta - 1) // -delta, 0)
    # onnxruntime: ceil((limit - start) / delta) in double, the difference in the input type.
    return max(int(np.ceil(np.float64(limit - start) / np.float64(delta))), 0)


def _range_infer(ctx: InferContext) -> list[TypeShape]:
    vals = [ctx.value(i) for i in range(3)]
    if any(v is None for v in vals):
        return [(ctx.dtypes[0], (None,))]
    if len({np.dtype(ctx.dtypes[i]) for i in range(3)}) != 1:
        raise ctx.fail(f"start, limit, delta dtypes differ: {ctx.dtypes}")
    try:
        return [(ctx.dtypes[0], (_range_count(*(np.asarray(v).reshape(()) for v in vals)),))]
    except ShapeInferenceError as exc:
        raise ctx.fail(str(exc).removeprefix("(Range): ")) from None


def _range_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs)
    n = _range_count(start, limit, delta)
    if n == 0:
        return [np.zeros(0, start.dtype)]
    # Sequential accumulation (value += delta), as onnxruntime does: matters for floats.
    steps = np.full(n, delta, dtype=start.dtype)
    steps[0] = start
    return [np.cumsum(steps, dtype=start.dtype)]


def _eye_like_dtype(ctx_dtype: np.dtype, attrs: Attrs) -> np.dtype:
    dt = attrs.get("dtype")
    return np.dtype(ctx_dtype) if dt is None else _np_dtype(dt)


def _eye_like_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is not None and len(x) != 2:
        raise ctx.fail(f"input of shape {x} is not 2-D")
    return [(_eye_like_dtype(ctx.dtypes[0], ctx.attrs), x)]


def _eye_like_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    if x.ndim != 2:
        raise ShapeInferenceError(f"(EyeLike): input of shape {x.shape} is not 2-D")
    dtype = _eye_like_dtype(x.dtype, attrs)
    return [np.eye(x.shape[0], x.shape[1], int(attrs.get("k", 0)), dtype=dtype)]


# ---- NonZero, Unique (data-dependent) ----------------------------------------------------

def _non_zero_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    # onnxruntime treats a 0-d input as shape (1,): its output has 1 row, not 0.
    return [(INT64, (None if x is None else max(len(x), 1), None))]


def _non_zero_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    if x.ndim == 0:  # onnxruntime treats a 0-d input as shape (1,)
        return [np.zeros((1, int(bool(x))), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _unique_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    axis = ctx.attr("axis")
    if axis is None:
        n = None if x is None else dim_product(x)
        return [(ctx.dtypes[0], (None,)), (INT64, (None,)), (INT64, (n,)), (INT64, (None,))]
    if x is None:
        return [(ctx.dtypes[0], None)] + [(INT64, (None,))] * 3
    a = normalize_axis(int(axis), len(x), ctx)
    y = tuple(None if i == a else d for i, d in enumerate(x))
    return [(ctx.dtypes[0], y), (INT64, (None,)), (INT64, (x[a],)), (INT64, (None,))]


def _unique_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = attrs.get("axis")
    if axis is not None:
        axis = int(axis) + x.ndim if int(axis) < 0 else int(axis)
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not attrs.get("sorted", 1):
        # Order unique values by first occurrence instead of by value.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    as64 = [np.asarray(a, dtype=np.int64) for a in (first, inverse, counts)]
    return [y if y.flags.c_contiguous else y.copy(order="C")] + as64


# ---- lowerings ----------------------------------------------------------------------------

def _lower_shape(ctx: LowerCtx):
    """The shape as a select chain over the output position (folding normally gets there
    first: Shape of a concrete shape is a constant)."""
    dims = ctx.in_shape(0)
    values = [dims[i] for i in _shape_range(ctx.node.attrs, len(dims))]
    if not values:
        return const(0, "int64")
    pos = ctx.index(ctx.idx[0])
    e = const(values[-1], "int64")
    for k in range(len(values) - 2, -1, -1):
        e = select(op("eq", pos, const(k, "int64")), const(values[k], "int64"), e)
    return e


def _lower_constant_of_shape(ctx: LowerCtx):
    value = _fill_value(ctx.node.attrs)
    return const(value.item(), value.dtype.name)


def _lower_range(ctx: LowerCtx):
    """start + i*delta for integers; floats accumulate sequentially (value += delta), as
    onnxruntime does, through a scan: element 0 is start, every later one is delta."""
    start, delta = (np.asarray(ctx.constant(i)).reshape(()) for i in (0, 2))
    dt = ctx.dtype
    pos = ctx.index(ctx.idx[0])
    if dt[0] in "iu":
        step = op("mul", cast(pos, dt), const(delta.item(), dt))
        return op("add", const(start.item(), dt), step)

    def element(ix: tuple):
        first = op("eq", ctx.index(ix[0]), const(0, "int64"))
        return select(first, const(start.item(), dt), const(delta.item(), dt))
    return ctx.scan("sum", ctx.shape, 0, element, dt)


def _lower_eye_like(ctx: LowerCtx):
    k = int(ctx.attr("k", 0))
    diff = op("sub", ctx.index(ctx.idx[1]), ctx.index(ctx.idx[0]))
    return select(op("eq", diff, const(k, "int64")), const(1, ctx.dtype), const(0, ctx.dtype))


_DATA = "the output's shape depends on the data: it runs in onnxruntime"

register("Shape", SHAPE, _shape_infer, _shape_ref, lower=_lower_shape, shape_of=True,
         shape_like=True)
register("Size", SHAPE, lambda ctx: [(INT64, ())], _size_ref, shape_of=True, shape_like=True,
         lower=lambda c: const(math.prod(c.in_shape(0)), "int64"))
register("ConstantOfShape", SHAPE, _constant_of_shape_infer, _constant_of_shape_ref,
         shape_inputs=(0,), lower=_lower_constant_of_shape, shape_like=True)
register("Range", SHAPE, _range_infer, _range_ref, shape_inputs=(0, 1, 2), lower=_lower_range,
         shape_like=True)
register("EyeLike", SHAPE, _eye_like_infer, _eye_like_ref, lower=_lower_eye_like)
register("NonZero", DATA_DEPENDENT, _non_zero_infer, _non_zero_ref, data_dependent=True,
         refuse=_DATA, discrete=True)
register("Unique", DATA_DEPENDENT, _unique_infer, _unique_ref, data_dependent=True,
         refuse=_DATA, discrete=True)
