"""Indexing layout ops: Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
ReverseSequence.

Split from layout.py to keep modules short; layout.py imports it so the table loads it.
Negative indices count from the end, as ONNX allows; out-of-range ones raise.
"""

from __future__ import annotations

import numpy as np

from autoclust.errors import InvalidInputError, ShapeInferenceError
from autoclust.ir import Dim
from autoclust.ops import (
    LAYOUT,
    Arrays,
    Attrs,
    InferContext,
    TypeShape,
    dense,
    normalize_axis,
    register,
)

_INDEX_TYPES = (np.dtype("int32"), np.dtype("int64"))
_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _axis(op: str, axis: int, rank: int) -> int:
    """normalize_axis with the op named in the error."""
    try:
        return normalize_axis(int(axis), rank)
    except ShapeInferenceError as exc:
        raise ShapeInferenceError(f"({op}): {exc}") from None


def _check_index(idx: np.ndarray, dim: int, op: str) -> np.ndarray:
    """Map negative indices into [0, dim); raise on out-of-range ones."""
    idx = np.asarray(idx).astype(np.int64)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise InvalidInputError(f"({op}): index out of range [{-dim}, {dim - 1}]: "
                                f"min {idx.min()}, max {idx.max()}")
    return np.where(idx < 0, idx + dim, idx)


def _check_index_dtype(ctx: InferContext, i: int) -> None:
    if ctx.dtypes[i] is not None and np.dtype(ctx.dtypes[i]) not in _INDEX_TYPES:
        raise ctx.fail(f"input {i} has dtype {ctx.dtypes[i]}, expected int32 or int64")


# ---- Gather family -----------------------------------------------------------------------

def _gather_infer(ctx: InferContext) -> list[TypeShape]:
    _check_index_dtype(ctx, 1)
    x, idx = ctx.shapes[0], ctx.shapes[1]
    if x is None or idx is None:
        return [(ctx.dtypes[0], None)]
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(x), ctx)
    return [(ctx.dtypes[0], tuple(x[:axis]) + tuple(idx) + tuple(x[axis + 1:]))]


def _gather_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = _axis("Gather", attrs.get("axis", 0), x.ndim)
    idx = _check_index(inputs[1], x.shape[axis], "Gather")
    return [dense(np.take(x, idx, axis=axis))]


def _gather_elements_infer(ctx: InferContext) -> list[TypeShape]:
    _check_index_dtype(ctx, 1)
    x, idx = ctx.shapes[0], ctx.shapes[1]
    if x is not None and idx is not None:
        if len(x) != len(idx):
            raise ctx.fail(f"data {x} and indices {idx} differ in rank")
        normalize_axis(int(ctx.attr("axis", 0)), len(x), ctx)
    return [(ctx.dtypes[0], idx)]


def _gather_elements_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, idx = inputs
    axis = _axis("GatherElements", attrs.get("axis", 0), x.ndim)
    idx = _check_index(idx, x.shape[axis], "GatherElements")
    return [dense(np.take_along_axis(x, idx, axis=axis))]


def _gather_nd_infer(ctx: InferContext) -> list[TypeShape]:
    _check_index_dtype(ctx, 1)
    x, idx = ctx.shapes[0], ctx.shapes[1]
    b = int(ctx.attr("batch_dims", 0))
    if x is None or idx is None or not isinstance(idx[-1] if idx else None, int):
        return [(ctx.dtypes[0], None)]
    k = idx[-1]
    if b + k > len(x) or b >= len(idx):
        raise ctx.fail(f"indices {idx} with batch_dims {b} do not fit data {x}")
    return [(ctx.dtypes[0], tuple(idx[:-1]) + tuple(x[b + k:]))]


def _gather_nd_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, idx = inputs
    b = int(attrs.get("batch_dims", 0))
    k = idx.shape[-1]
    if b + k > x.ndim or x.shape[:b] != idx.shape[:b]:
        raise ShapeInferenceError(f"(GatherND): indices {idx.shape} with batch_dims {b} "
                                  f"do not fit data {x.shape}")
    batch = int(np.prod(x.shape[:b], dtype=np.int64))
    xb = x.reshape((batch,) + x.shape[b:])
    ib = idx.reshape(batch, -1, k)
    coords = [_check_index(ib[..., j], x.shape[b + j], "GatherND") for j in range(k)]
    out = xb[(np.arange(batch)[:, None], *coords)]
    return [dense(out.reshape(idx.shape[:-1] + x.shape[b + k:]))]


# ---- Scatter family ----------------------------------------------------------------------

def _scatter_infer(ctx: InferContext) -> list[TypeShape]:
    _check_index_dtype(ctx, 1)
    if ctx.dtypes[2] is not None and ctx.dtypes[0] is not None and \
            np.dtype(ctx.dtypes[2]) != np.dtype(ctx.dtypes[0]):
        raise ctx.fail(f"updates dtype {ctx.dtypes[2]} differs from data {ctx.dtypes[0]}")
    return [(ctx.dtypes[0], ctx.shapes[0])]


def _scatter_into(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str,
                  op: str) -> np.ndarray:
    if reduction == "none":
        out[where] = updates
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(out, where, updates)
    else:
        raise ShapeInferenceError(f"({op}): unknown reduction {reduction!r}")
    return out


def _scatter_elements_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, idx, upd = inputs
    axis = _axis("ScatterElements", attrs.get("axis", 0), x.ndim)
    if idx.shape != upd.shape or idx.ndim != x.ndim:
        raise ShapeInferenceError(f"(ScatterElements): indices {idx.shape}, updates "
                                  f"{upd.shape}, data {x.shape} do not match")
    idx = _check_index(idx, x.shape[axis], "ScatterElements")
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    out = _scatter_into(x.copy(), tuple(grid), upd, attrs.get("reduction", "none"),
                        "ScatterElements")
    return [out]


def _scatter_nd_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, idx, upd = inputs
    k = idx.shape[-1]
    if k > x.ndim or upd.shape != idx.shape[:-1] + x.shape[k:]:
        raise ShapeInferenceError(f"(ScatterND): indices {idx.shape}, updates {upd.shape}, "
                                  f"data {x.shape} do not match")
    flat = idx.reshape(-1, k)
    where = tuple(_check_index(flat[:, j], x.shape[j], "ScatterND") for j in range(k))
    upd = upd.reshape((flat.shape[0],) + x.shape[k:])
    out = _scatter_into(x.copy(), where, upd, attrs.get("reduction", "none"), "ScatterND")
    return [out]


# ---- OneHot ------------------------------------------------------------------------------

def _depth(v: np.ndarray) -> int:
    d = int(np.asarray(v).reshape(-1)[0])
    if d <= 0:
        raise ShapeInferenceError(f"(OneHot): depth {d} must be positive")
    return d


def _one_hot_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    dtype = ctx.dtypes[2]
    if x is None:
        return [(dtype, None)]
    axis = normalize_axis(int(ctx.attr("axis", -1)), len(x) + 1, ctx)
    depth_v = ctx.value(1)
    depth: Dim = None if depth_v is None else _depth(depth_v)
    return [(dtype, tuple(x[:axis]) + (depth,) + tuple(x[axis:]))]


def _one_hot_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, depth_v, values = inputs
    depth = _depth(depth_v)
    axis = _axis("OneHot", attrs.get("axis", -1), x.ndim + 1)
    idx = np.asarray(x).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)  # out-of-range indices stay all-off
    hot = idx[..., None] == np.arange(depth)
    off, on = np.asarray(values).reshape(-1)[:2]
    out = np.where(hot, on, off).astype(values.dtype)
    return [dense(np.moveaxis(out, -1, axis))]


# ---- ReverseSequence ---------------------------------------------------------------------

def _reverse_sequence_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is not None and len(x) < 2:
        raise ctx.fail(f"input of shape {x} has rank < 2")
    return [(ctx.dtypes[0], x)]


def _reverse_sequence_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, lens = inputs[0], np.asarray(inputs[1]).astype(np.int64).reshape(-1)
    b_axis = _axis("ReverseSequence", attrs.get("batch_axis", 1), x.ndim)
    t_axis = _axis("ReverseSequence", attrs.get("time_axis", 0), x.ndim)
    steps = x.shape[t_axis]
    if lens.shape != (x.shape[b_axis],) or (lens.size and (lens.min() < 0 or
                                                           lens.max() > steps)):
        raise InvalidInputError(f"(ReverseSequence): sequence_lens {lens.tolist()} do not fit "
                                f"input {x.shape}")
    t = np.arange(steps)
    # src[b, t]: the time step that lands at t: reversed inside the first lens[b] steps.
    src = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)
    if t_axis < b_axis:
        src = src.T
    view = [1] * x.ndim
    view[b_axis], view[t_axis] = x.shape[b_axis], steps
    src = np.broadcast_to(src.reshape(view), x.shape)
    return [dense(np.take_along_axis(x, src, axis=t_axis))]


register("Gather", LAYOUT, _gather_infer, _gather_ref)
register("GatherElements", LAYOUT, _gather_elements_infer, _gather_elements_ref)
register("GatherND", LAYOUT, _gather_nd_infer, _gather_nd_ref)
register("ScatterElements", LAYOUT, _scatter_infer, _scatter_elements_ref)
register("ScatterND", LAYOUT, _scatter_infer, _scatter_nd_ref)
register("OneHot", LAYOUT, _one_hot_infer, _one_hot_ref, shape_inputs=(1,))
register("ReverseSequence", LAYOUT, _reverse_sequence_infer, _reverse_sequence_ref)
