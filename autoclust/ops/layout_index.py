"""Indexing layout ops: Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot,
ReverseSequence, DepthToSpace, SpaceToDepth.

Negative indices count from the end, as ONNX allows; out-of-range ones raise (the
reference raises InvalidInputError; compiled code checks the index buffer before the
kernel runs and clamps every data-dependent position, so no load leaves its buffer).
Gathers lower to loads whose position along the gathered axis comes from the index data;
DepthToSpace and SpaceToDepth compute their positions from the output index.
Scatters write to data-dependent positions: they are never compiled.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoclust.errors import InvalidInputError, InvalidShapeError, ShapeInferenceError
from autoclust.ir import Dim
from autoclust.kernel.lowering import LowerCtx, cast, const, op, select
from autoclust.ops.table import (
    LAYOUT,
    Arrays,
    Attrs,
    InferContext,
    TypeShape,
    dense,
    normalize_axis,
    register,
)
from autoclust.symbolic import hint, is_dim

_INDEX_TYPES = (np.dtype("int32"), np.dtype("int64"))
_REDUCE = {"add": np.add, "mul": np.multiply}
# max/min keep the element only where it beats the update, else take the update (NaN
# compares false): onnxruntime's rule, update by update in order. A NaN update wins, a NaN
# already there loses, and a tie of -0 and 0 goes to the update. np.maximum.at would keep
# a NaN already there (fuzz 150/159: MeanVarianceNormalization's NaN, then max).
_KEEPS = {"max": np.greater, "min": np.less}


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


def _shown(dims: Any) -> list:
    """dims as this run has them (a symbolic dim's value), for messages."""
    return [hint(d) for d in dims]


def _elements_shapes(op: str, x: tuple, idx: tuple, axis: int) -> str:
    """Why indices of shape idx cannot index data of shape x off the axis ('' if they can):
    GatherElements/ScatterElements read x at the index's own position on every other dim,
    so a longer dim there reads outside x (onnxruntime rejects it), even where indices are
    empty. A symbolic dim (a cluster compiled for a shape class) is compared too, recording a
    guard: skipping it let [batch, 0] data take [3, 0] indices at batch 2 (fuzz 91/109)."""
    for d, (n, m) in enumerate(zip(x, idx)):
        if d != axis and is_dim(n) and is_dim(m) and m > n:
            x, idx = _shown(x), _shown(idx)
            return (f"indices of shape {idx} exceed data of shape {x} on dim {d} "
                    f"({idx[d]} > {x[d]}); only the axis ({axis}) may be longer")
    return ""


def _elements_infer(ctx: InferContext) -> None:
    _check_index_dtype(ctx, 1)
    x, idx = ctx.shapes[0], ctx.shapes[1]
    if x is not None and idx is not None:
        if len(x) != len(idx):
            raise ctx.fail(f"data {x} and indices {idx} differ in rank")
        axis = normalize_axis(int(ctx.attr("axis", 0)), len(x), ctx)
        why = _elements_shapes(ctx.op, tuple(x), tuple(idx), axis)
        if why:
            raise ctx.invalid(why)


def _gather_elements_infer(ctx: InferContext) -> list[TypeShape]:
    _elements_infer(ctx)
    return [(ctx.dtypes[0], ctx.shapes[1])]


def _gather_elements_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, idx = inputs
    axis = _axis("GatherElements", attrs.get("axis", 0), x.ndim)
    why = _elements_shapes("GatherElements", x.shape, idx.shape, axis)
    if why:
        raise InvalidInputError(f"(GatherElements): {why}")
    idx = _check_index(idx, x.shape[axis], "GatherElements")
    # out[i][j][k] = x[i][idx[i][j][k]][k] (axis 1): indices may be smaller than x on the
    # other dims, so index explicitly rather than with take_along_axis (which broadcasts).
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    return [dense(x[tuple(grid)])]


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
    if ctx.op == "ScatterElements":
        _elements_infer(ctx)
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
    elif reduction in _KEEPS:
        _ordered_fold(out, where, updates, _KEEPS[reduction])
    else:
        raise ShapeInferenceError(f"({op}): unknown reduction {reduction!r}")
    return out


def _ordered_fold(out: np.ndarray, where: tuple, updates: np.ndarray, keeps: np.ufunc) -> None:
    """out[p] = out[p] if keeps(out[p], u) else u for each update u at its position p, in
    the updates' order: in rounds, the r-th update of every position at once."""
    flat = out.reshape(-1)  # out is a fresh contiguous copy: a view
    pos = np.arange(out.size).reshape(out.shape)[where].reshape(-1)
    upd = np.asarray(updates).reshape(-1)  # the positions' shape
    order = np.argsort(pos, kind="stable")
    sorted_pos = pos[order]
    first = np.r_[True, sorted_pos[1:] != sorted_pos[:-1]] if pos.size else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    rank = np.arange(pos.size) - np.repeat(starts, np.diff(np.r_[starts, pos.size]))
    for r in range(int(rank.max()) + 1 if pos.size else 0):
        sel = order[rank == r]
        at, u = pos[sel], upd[sel]
        flat[at] = np.where(keeps(flat[at], u), flat[at], u)


def _scatter_elements_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, idx, upd = inputs
    axis = _axis("ScatterElements", attrs.get("axis", 0), x.ndim)
    if idx.shape != upd.shape or idx.ndim != x.ndim:
        raise ShapeInferenceError(f"(ScatterElements): indices {idx.shape}, updates "
                                  f"{upd.shape}, data {x.shape} do not match")
    why = _elements_shapes("ScatterElements", x.shape, idx.shape, axis)
    if why:
        raise InvalidInputError(f"(ScatterElements): {why}")
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


def _two_values(shape: Any) -> str:
    """Why OneHot's values input of this shape is not [off, on] ('' if it is)."""
    # a symbolic dim is compared too, recording a guard (see _elements_shapes)
    if shape is not None and all(is_dim(d) for d in shape) and math.prod(shape) != 2:
        return f"values must have exactly two elements (off, on), got shape {_shown(shape)}"
    return ""


def _one_hot_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    dtype = ctx.dtypes[2]
    if _two_values(ctx.shapes[2]):
        raise ctx.invalid(_two_values(ctx.shapes[2]), fail=True)
    if x is None:
        return [(dtype, None)]
    axis = normalize_axis(int(ctx.attr("axis", -1)), len(x) + 1, ctx)
    depth_v = ctx.value(1)
    depth: Dim = None if depth_v is None else _depth(depth_v)
    return [(dtype, tuple(x[:axis]) + (depth,) + tuple(x[axis:]))]


def _one_hot_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, depth_v, values = inputs
    if _two_values(values.shape):
        raise InvalidShapeError(f"(OneHot): {_two_values(values.shape)}")
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
    x, lens = ctx.shapes[0], ctx.shapes[1]
    if x is not None and len(x) < 2:
        raise ctx.fail(f"input of shape {x} has rank < 2")
    if x is not None and lens is not None:
        batch = x[normalize_axis(int(ctx.attr("batch_axis", 1)), len(x), ctx)]
        # a symbolic dim is compared too, recording a guard (see _elements_shapes)
        if all(is_dim(d) for d in (batch, *lens)) and tuple(lens) != (batch,):
            raise ctx.invalid(f"sequence_lens of shape {_shown(lens)} does not fit batch "
                              f"dim {hint(batch)} of input {_shown(x)}")
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


# ---- DepthToSpace, SpaceToDepth ----------------------------------------------------------

def _block(ctx_or_attrs: Any) -> int:
    attrs = ctx_or_attrs.attrs if isinstance(ctx_or_attrs, InferContext) else ctx_or_attrs
    b = int(attrs.get("blocksize", 0))
    if b <= 0:
        raise ShapeInferenceError(f"(DepthToSpace): blocksize {b} must be positive")
    return b


def _depth_to_space_infer(ctx: InferContext) -> list[TypeShape]:
    x, b = ctx.shapes[0], _block(ctx)
    if x is None:
        return [(ctx.dtypes[0], (None,) * 4)]
    if len(x) != 4:
        raise ctx.fail(f"input of shape {x} is not 4-D")
    n, c, h, w = x
    if is_dim(c) and c % (b * b):
        raise ctx.fail(f"channels {c} not divisible by blocksize^2 = {b * b}")

    def scale(d: Dim, f: int) -> Dim:
        return d * f if is_dim(d) else None
    c_out = c // (b * b) if is_dim(c) else None
    return [(ctx.dtypes[0], (n, c_out, scale(h, b), scale(w, b)))]


def _depth_to_space_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, b = inputs[0], _block(attrs)
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return _dense1(y.reshape(n, c // (b * b), h * b, w * b))


def _space_to_depth_infer(ctx: InferContext) -> list[TypeShape]:
    x, b = ctx.shapes[0], _block(ctx)
    if x is None:
        return [(ctx.dtypes[0], (None,) * 4)]
    if len(x) != 4:
        raise ctx.fail(f"input of shape {x} is not 4-D")
    n, c, h, w = x
    for d in (h, w):
        if is_dim(d) and d % b:
            raise ctx.fail(f"spatial dims of {x} not divisible by blocksize {b}")
    c_out = c * b * b if is_dim(c) else None
    h_out = h // b if is_dim(h) else None
    w_out = w // b if is_dim(w) else None
    return [(ctx.dtypes[0], (n, c_out, h_out, w_out))]


def _space_to_depth_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, b = inputs[0], _block(attrs)
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    # DCR: the block offset is the outer part of the new channel; CRD (opset 26+): inner.
    perm = (0, 1, 3, 5, 2, 4) if attrs.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    return _dense1(y.transpose(perm).reshape(n, c * b * b, h // b, w // b))




def _dense1(a: np.ndarray) -> list[np.ndarray]:
    return [dense(a)]


# ---- lowerings ----------------------------------------------------------------------------

def _index_at(ctx: LowerCtx, i: int, idx: tuple, dim: int,
              column: tuple[int, int] | None = None) -> Any:
    """Index input i at idx as an int64 position in [0, dim): negative ones count from the
    end; out-of-range data is reported by a check before the kernel and clamped here."""
    ctx.check(i, "range", -dim, dim - 1,
              f"node {ctx.node.name!r} ({ctx.node.op}): index out of range "
              f"[{-dim}, {dim - 1}] in input {ctx.input(i).name!r}", column)
    pos = cast(ctx.value(i, idx), "int64")
    pos = select(op("lt", pos, const(0, "int64")), op("add", pos, const(dim, "int64")), pos)
    return op("max", op("min", pos, const(dim - 1, "int64")), const(0, "int64"))


def _lower_gather(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(shape))
    r = len(ctx.in_shape(1))
    pos = _index_at(ctx, 1, ctx.idx[axis:axis + r], shape[axis])
    idx = ctx.idx[:axis] + (ctx.zero(),) + ctx.idx[axis + r:]
    return ctx.gather(0, idx, {axis: pos})


def _lower_gather_elements(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(shape))
    pos = _index_at(ctx, 1, ctx.idx, shape[axis])
    return ctx.gather(0, ctx.idx[:axis] + (ctx.zero(),) + ctx.idx[axis + 1:], {axis: pos})


def _lower_gather_nd(ctx: LowerCtx):
    shape, ishape = ctx.in_shape(0), ctx.in_shape(1)
    b, k = int(ctx.attr("batch_dims", 0)), ishape[-1]
    lead = ctx.idx[:len(ishape) - 1]
    dyn = {b + j: _index_at(ctx, 1, lead + (ctx.at(j),), shape[b + j], (j, k))
           for j in range(k)}
    idx = ctx.idx[:b] + tuple(ctx.zero() for _ in range(k)) + ctx.idx[len(ishape) - 1:]
    return ctx.gather(0, idx, dyn)


def _lower_one_hot(ctx: LowerCtx):
    depth = int(ctx.ints(1)[0])
    axis = normalize_axis(int(ctx.attr("axis", -1)), len(ctx.shape))
    where = ctx.idx[:axis] + ctx.idx[axis + 1:]
    hot = cast(ctx.value(0, where), "int64")
    hot = select(op("lt", hot, const(0, "int64")), op("add", hot, const(depth, "int64")), hot)
    on = op("eq", ctx.index(ctx.idx[axis]), hot)  # out-of-range indices: all off
    return select(on, ctx.value(2, (ctx.at(1),)), ctx.value(2, (ctx.at(0),)))


def _lower_reverse_sequence(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    b_axis = normalize_axis(int(ctx.attr("batch_axis", 1)), len(shape))
    t_axis = normalize_axis(int(ctx.attr("time_axis", 0)), len(shape))
    steps = shape[t_axis]
    ctx.check(1, "range", 0, steps, f"node {ctx.node.name!r} (ReverseSequence): "
                                    f"sequence_lens must lie in [0, {steps}]")
    n = cast(ctx.value(1, (ctx.idx[b_axis],)), "int64")
    t = ctx.index(ctx.idx[t_axis])
    src = select(op("lt", t, n), op("sub", op("sub", n, const(1, "int64")), t), t)
    src = op("max", op("min", src, const(steps - 1, "int64")), const(0, "int64"))
    idx = ctx.idx[:t_axis] + (ctx.zero(),) + ctx.idx[t_axis + 1:]
    return ctx.gather(0, idx, {t_axis: src})


def _divmod(e, n: int) -> tuple:
    return op("div", e, const(n, "int64")), op("mod", e, const(n, "int64"))


def _lower_depth_to_space(ctx: LowerCtx):
    b = _block(ctx.node.attrs)
    c_out = ctx.shape[1]
    h, i = _divmod(ctx.index(ctx.idx[2]), b)
    w, j = _divmod(ctx.index(ctx.idx[3]), b)
    block = op("add", op("mul", i, const(b, "int64")), j)
    c = ctx.index(ctx.idx[1])
    if ctx.attr("mode", "DCR") == "DCR":  # x[n, (i*b + j)*C' + c, h, w]
        ch = op("add", op("mul", block, const(c_out, "int64")), c)
    else:  # CRD: x[n, c*b*b + i*b + j, h, w]
        ch = op("add", op("mul", c, const(b * b, "int64")), block)
    idx = (ctx.idx[0], ctx.zero(), ctx.zero(), ctx.zero())
    return ctx.gather(0, idx, {1: ch, 2: h, 3: w})


def _lower_space_to_depth(ctx: LowerCtx):
    b = _block(ctx.node.attrs)
    c_in = ctx.in_shape(0)[1]
    oc = ctx.index(ctx.idx[1])
    if ctx.attr("mode", "DCR") == "CRD":  # oc = c*b*b + i*b + j
        c, block = _divmod(oc, b * b)
    else:  # DCR: oc = (i*b + j)*C + c
        block, c = _divmod(oc, c_in)
    i, j = _divmod(block, b)
    hh = op("add", op("mul", ctx.index(ctx.idx[2]), const(b, "int64")), i)
    ww = op("add", op("mul", ctx.index(ctx.idx[3]), const(b, "int64")), j)
    idx = (ctx.idx[0], ctx.zero(), ctx.zero(), ctx.zero())
    return ctx.gather(0, idx, {1: c, 2: hh, 3: ww})


_SCATTER = "scatters write to data-dependent positions: they run in onnxruntime"

register("Gather", LAYOUT, _gather_infer, _gather_ref, lower=_lower_gather, shape_like=True,
         exact="copy", checks=True)
register("GatherElements", LAYOUT, _gather_elements_infer, _gather_elements_ref,
         lower=_lower_gather_elements, exact="copy", checks=True)
register("GatherND", LAYOUT, _gather_nd_infer, _gather_nd_ref, lower=_lower_gather_nd,
         checks=True)
register("ScatterElements", LAYOUT, _scatter_infer, _scatter_elements_ref, refuse=_SCATTER)
register("ScatterND", LAYOUT, _scatter_infer, _scatter_nd_ref, refuse=_SCATTER)
register("OneHot", LAYOUT, _one_hot_infer, _one_hot_ref, shape_inputs=(1,), lower=_lower_one_hot)
register("ReverseSequence", LAYOUT, _reverse_sequence_infer, _reverse_sequence_ref,
         lower=_lower_reverse_sequence, checks=True)
register("DepthToSpace", LAYOUT, _depth_to_space_infer, _depth_to_space_ref,
         lower=_lower_depth_to_space)
register("SpaceToDepth", LAYOUT, _space_to_depth_infer, _space_to_depth_ref,
         lower=_lower_space_to_depth)
