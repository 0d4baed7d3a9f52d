"""Normalizations: Softmax family (opset 13), LayerNorm, BatchNorm, Instance/Group/Lp/MVN.

float16 inputs compute in float32 and round once, as onnxruntime does. Statistics use the
two-pass mean/variance (what onnxruntime's kernels compute to within float32 rounding).
Hardmax picks the first maximum; onnxruntime's Hardmax of a row holding NaN is not copied.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from autoclust.errors import InvalidInputError
from autoclust.kernel.ir import Expr
from autoclust.kernel.lowering import LowerCtx, cast, compute_dtype, const, op, select
from autoclust.ops.table import (
    BFLOAT16,
    FLOAT_TYPES,
    NORMALIZATION,
    Arrays,
    InferContext,
    TypeShape,
    in_group,
    normalize_axis,
    register,
)
from autoclust.symbolic import is_dim

F32 = np.dtype("float32")
_FLOATS = FLOAT_TYPES + (BFLOAT16,)


def _check_float(ctx: InferContext, indices: tuple[int, ...] = (0,)) -> None:
    for i in indices:
        if ctx.has(i) and ctx.dtypes[i] is not None and ctx.dtypes[i] not in _FLOATS:
            raise ctx.fail(f"input {i} must be float16/32/64 or bfloat16, got {ctx.dtypes[i]}")


def _compute_type(x: np.ndarray) -> np.dtype:
    return F32 if x.dtype == np.float16 else x.dtype


def _floating_ref(fn: Callable[[Arrays, dict[str, Any]], np.ndarray]):
    """Wrap fn(inputs in compute dtype, attrs) -> output in input 0's dtype."""
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        ct = _compute_type(inputs[0])
        work = [None if x is None else x.astype(ct) for x in inputs]
        with np.errstate(all="ignore"):
            return [fn(work, attrs).astype(inputs[0].dtype)]
    return ref


def _infer_axis_op(ctx: InferContext) -> list[TypeShape]:
    _check_float(ctx)
    if ctx.shapes[0] is not None:
        normalize_axis(int(ctx.attr("axis", -1)), len(ctx.shapes[0]), ctx)
    return [(ctx.dtypes[0], ctx.shapes[0])]


# ---- Softmax / LogSoftmax / Hardmax ----------------------------------------------------------

def _axis(x: np.ndarray, attrs: dict[str, Any]) -> int:
    return normalize_axis(int(attrs.get("axis", -1)), max(x.ndim, 1))


def _softmax(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    ax = _axis(x, attrs)
    if x.size == 0:  # np.max has no identity for a zero-length axis
        return x.copy()
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    return e / np.sum(e, axis=ax, keepdims=True)


def _log_softmax(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    ax = _axis(x, attrs)
    if x.size == 0:
        return x.copy()
    xs = x.astype(np.float32) if x.dtype == np.float16 else x
    m = np.max(xs, axis=ax, keepdims=True)
    s = xs - m
    # as the compiled kernel (_lower_softmax): the maxima counted, not summed as 1 + ...
    top = xs == m
    small = np.sum(np.where(top, s, np.exp(s)), axis=ax, keepdims=True)
    k = np.sum(top, axis=ax, keepdims=True).astype(s.dtype)
    t = small + (k - 1)
    one = s.dtype.type(1)
    with np.errstate(invalid="ignore"):
        return (s - np.where(one + t == one, 0, np.log1p(t))).astype(x.dtype)


def _hardmax(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    ax = _axis(x, attrs)
    if x.size == 0:
        return np.zeros_like(x)
    idx = np.argmax(x, axis=ax, keepdims=True)
    return (np.arange(x.shape[ax]).reshape([-1 if i == ax else 1 for i in range(x.ndim)])
            == idx).astype(x.dtype)


def _loader(ctx: LowerCtx, ct: str, i: int = 0) -> Callable:
    """idx -> input i at idx in compute dtype ct."""
    return lambda ix: cast(ctx.value(i, ix), ct)


def _axis_row(ctx: LowerCtx) -> tuple[tuple[int, ...], int, dict, str]:
    """(input shape, normalized axis, kept index, compute dtype) of a one-axis row op."""
    shape = ctx.in_shape(0)
    rank = len(shape)
    axis = int(ctx.attr("axis", -1))
    axis = axis + rank if axis < 0 else axis
    kept = {d: ctx.idx[d] for d in range(rank) if d != axis}
    return shape, axis, kept, compute_dtype(ctx.in_dtype(0))


def _lower_softmax(ctx: LowerCtx):
    shape, axis, kept, ct = _axis_row(ctx)
    load = _loader(ctx, ct)
    m = ctx.reduce("max", shape, [axis], kept, load, ct)
    # Probabilities below the smallest normal number that only ever enter GEMM sums are
    # lost in their rounding; as denormals they run the GEMM and this kernel through
    # microcode assists, ~10x slower (Swin-tiny's window attention). Such a softmax drops
    # them: its sum keeps its bits (it is at least 1, the row's maximum giving e^0, and a
    # row's denormals add up to far less than half its last place), and its answers stay
    # within 2^-126 of onnxruntime's. Every other softmax keeps them, as onnxruntime does.
    flush = ctx.node.op == "Softmax" and ctx.dtype in ("float32", "float64") \
        and ctx.only_read_by(in_group("GEMM") - {"Einsum"})  # Einsum may not sum: "ij->ij"
    tiny = float(np.finfo(ct).tiny)

    def exp_of(x: Expr) -> Expr:
        if flush:
            x = select(op("lt", x, const(math.log(tiny), ct)), const(float("-inf"), ct), x)
        return op("exp", x)

    shifted = op("sub", load(ctx.idx), m)
    if ctx.node.op == "LogSoftmax":
        # A row one element dominates sums to 1 + s with s small; rounded, 1 + s keeps s
        # to ~1e-7 / s relative, and log(1 + s) ~ s passes that on (a LogSoftmax of -4.5e-4
        # off by 2e-4 relative, fuzz 109/750; onnxruntime's too). So the maxima's terms
        # (exactly 1 each) are left out of the sum and counted: log(k + s) = log1p(s + k - 1),
        # s the others' share. A maximum's term is its x - max (0, or NaN for an inf max,
        # as exp(inf - inf) gives), so NaN rows stay NaN (_log_softmax does the same).
        # Where 1 + s rounds to 1 the log is 0, as onnxruntime, the ONNX reference and
        # torch give: the maximum's log-probability is exactly 0, not -s (a -1.8e-18 for
        # onnxruntime's 0, fuzz 114/232).
        def top(ix: Any) -> Expr:
            return op("eq", load(ix), m)

        def term(ix: Any) -> Expr:
            d = op("sub", load(ix), m)
            return select(top(ix), d, op("exp", d))
        small = ctx.reduce("sum", shape, [axis], kept, term, ct)
        maxima = ctx.reduce("sum", shape, [axis], kept,
                            lambda ix: select(top(ix), const(1, ct), const(0, ct)), ct)
        t = op("add", small, op("sub", maxima, const(1, ct)))
        vanish = op("eq", op("add", const(1, ct), t), const(1, ct))
        return op("sub", shifted, select(vanish, const(0, ct), op("log1p", t)))
    s = ctx.reduce("sum", shape, [axis], kept, lambda ix: exp_of(op("sub", load(ix), m)), ct)
    # One division per row, a multiply per element.
    y = op("mul", exp_of(shifted), op("div", const(1, ct), s))
    return select(op("lt", y, const(tiny, ct)), const(0, ct), y) if flush else y


def _lower_hardmax(ctx: LowerCtx):
    shape, axis, kept, ct = _axis_row(ctx)
    first = ctx.reduce("argmax", shape, [axis], kept, _loader(ctx, ct), "int64")
    hit = op("eq", ctx.index(ctx.idx[axis]), first)
    return select(hit, const(1, ct), const(0, ct))


for _op, _fn, _lower in (("Softmax", _softmax, _lower_softmax),
                         ("LogSoftmax", _log_softmax, _lower_softmax),
                         ("Hardmax", _hardmax, _lower_hardmax)):
    register(_op, NORMALIZATION, _infer_axis_op, _floating_ref(_fn), lower=_lower,
             cost=4 if _op != "Hardmax" else 1,
             doc=f"{_op}(x) along one axis (opset 13 form, axis=-1).")


# ---- LayerNormalization -------------------------------------------------------------------

def check_params(ctx: InferContext, indices: tuple[int, ...]) -> None:
    """Scale/bias inputs must broadcast (numpy rules, one way) to X: compiled code reads
    them at X's index, so a [3] scale of a row of 4 read past its end (onnxruntime
    rejects it)."""
    x = ctx.shapes[0]
    for i in indices:
        p = ctx.shapes[i] if ctx.has(i) else None
        if x is None or p is None:
            continue
        if len(p) > len(x) or any(isinstance(a, int) and isinstance(b, int) and a not in (1, b)
                                  for a, b in zip(reversed(p), reversed(x))):
            raise ctx.invalid(f"input {i} of shape {list(p)} does not broadcast to X of "
                              f"shape {list(x)}")


def _infer_layer_norm(ctx: InferContext) -> list[TypeShape]:
    _check_float(ctx, (0, 1, 2))
    check_params(ctx, (1, 2))
    shape = ctx.shapes[0]
    out = [(ctx.dtypes[0], shape)]
    stat_type = F32 if ctx.attr("stash_type", 1) == 1 else ctx.dtypes[0]
    if shape is None:
        stat_shape = None
    else:
        axis = normalize_axis(int(ctx.attr("axis", -1)), len(shape), ctx)
        stat_shape = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
        if all(is_dim(d) for d in shape[axis:]):  # known (specialized): check
            try:
                _empty_rows(shape, axis)
            except InvalidInputError as exc:
                raise InvalidInputError(f"node {ctx.node_name!r}: {exc}") from None
    return out + [(stat_type, stat_shape)] * 2


def _empty_rows(shape: tuple, axis: int) -> None:
    """onnxruntime rejects normalizing over zero elements (and the mean would be 0/0)."""
    if math.prod(shape[axis:]) == 0:
        raise InvalidInputError(f"LayerNormalization: Size of X.shape[axis:] must be at least "
                                f"1, got 0 (X is {list(shape)}, axis {axis})")


def _layer_norm_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = normalize_axis(int(attrs.get("axis", -1)), x.ndim)
    _empty_rows(x.shape, axis)
    stash = F32 if attrs.get("stash_type", 1) == 1 else x.dtype
    ct = np.promote_types(stash, _compute_type(x))
    axes = tuple(range(axis, x.ndim))
    with np.errstate(all="ignore"):  # statistics in float64: no overflow, exact x - mean
        xs = x.astype(np.float64)
        mean = np.mean(xs, axis=axes, keepdims=True)
        var = np.mean(np.square(xs - mean), axis=axes, keepdims=True)
        inv_std = 1.0 / np.sqrt(var + float(np.asarray(attrs.get("epsilon", 1e-5), ct)))
        y = ((xs - mean) * inv_std).astype(ct) * scale.astype(ct)
        if bias is not None:
            y = y + bias.astype(ct)
    return [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)]


def moments(ctx: LowerCtx, shape: tuple[int, ...], axes: list[int], kept: dict,
            load: Callable, ct: str, eps: float | None, var_ct: str | None = None) -> tuple:
    """(mean, 1/sqrt(var + eps)) of the row, the variance in two passes for accuracy;
    var_ct="float64" squares and sums the deviations in float64 (no overflow above 1.8e19)."""
    n = math.prod(shape[a] for a in axes)
    mean = op("div", ctx.reduce("sum", shape, axes, kept, load, ct), const(n, ct))
    vt = var_ct or ct
    sq = ctx.reduce("sum", shape, axes, kept,
                    lambda ix: _square(cast(op("sub", load(ix), mean), vt)), vt)
    var = op("div", sq, const(n, vt))
    root = op("sqrt", var if eps is None else op("add", var, const(eps, vt)))
    return mean, cast(op("div", const(1, vt), root), ct)


_BIG = 2.0 ** 32  # deviations below this add nothing to an overflowed sum of squares


def scaled_moments(ctx: LowerCtx, shape: tuple[int, ...], axes: list[int], kept: dict,
                   load: Callable, ct: str, eps: float) -> tuple:
    """(mean, 1/sqrt(var + eps), idx -> (x - mean) * inv) of the row, accurate in ct.

    Two passes, each pass's sums fused in one loop (backends run phases that read none of
    each other together):
      s = sum(x * 2^-e), a = sum(|x| * 2^-e), 2^e >= n (no overflow)       m = s / n * 2^e
      c = sum(d), q = sum(d^2), q' = sum((d * 2^-k)^2 for |d| > 2^32), d = g * x - g * m
    c corrects m's rounding: a row 1000 +- 0.01 kept its digits only in float64 before.
    q' stands in for q when a square overflowed: x = [-1, 3.4e38] normalizes to [-1, 1]
    (the float32 square gave inv = 0: the output was the bias); 2^-k brings n squares of
    deviations up to 2^129 into range. Deviations below 2^32 are left out of q' (they are
    below its rounding then) so that it never makes denormals: they are slow, and q' is
    read only when q overflowed. g is 1, or 1/2 in a row whose magnitudes sum past half
    the largest float, where x - m itself can overflow ([-3.4e38, 0, 3.4e38, -3.4e38]:
    3.4e38 + 8.5e37 gave inf, the row NaN and 0, onnxruntime [-0.9, 0.3, 1.51, -0.9]);
    the deviations are then taken halved, and eps with them (a quarter): the normalized
    row is the same. Costs 1.35x the plain float32 two-pass kernel, where float64
    statistics cost 3x (measured on 4 LayerNorms of [4096, 768]).
    """
    n = math.prod(shape[a] for a in axes)
    nc, zero = const(n, ct), const(0, ct)
    shift = 2.0 ** -math.ceil(math.log2(max(n, 1)))
    scale = 2.0 ** -(66 + math.ceil(math.log2(max(n, 1)) / 2))
    s = ctx.reduce("sum", shape, axes, kept,
                   lambda ix: op("mul", load(ix), const(shift, ct)), ct)
    a = ctx.reduce("sum", shape, axes, kept,
                   lambda ix: op("mul", op("abs", load(ix)), const(shift, ct)), ct)
    # x * g is exact for g = 1 (denormals too) and, in a row this large, for g = 1/2
    g = select(op("gt", a, const(float(np.finfo(ct).max) / 2 * shift, ct)), const(0.5, ct),
               const(1, ct))
    m = op("mul", op("div", s, nc), const(1 / shift, ct))

    def dev(ix: tuple):
        return op("sub", op("mul", load(ix), g), op("mul", m, g))

    def big(ix: tuple):
        d = dev(ix)
        wide = op("gt", op("abs", d), const(_BIG, ct))
        return _square(select(wide, op("mul", d, const(scale, ct)), zero))

    c = op("div", ctx.reduce("sum", shape, axes, kept, dev, ct), nc)
    c = select(_finite(c, ct), c, zero)  # deviations summing past the range: no correction
    q = ctx.reduce("sum", shape, axes, kept, lambda ix: _square(dev(ix)), ct)
    q_big = ctx.reduce("sum", shape, axes, kept, big, ct)
    var = op("max", op("sub", op("div", q, nc), _square(c)), zero)
    one = const(1, ct)
    eps_g = op("mul", const(eps, ct), _square(g))
    inv = select(_finite(q, ct), op("div", one, op("sqrt", op("add", var, eps_g))),
                 op("mul", op("div", one, op("sqrt", op("div", q_big, nc))), const(scale, ct)))
    # mean and 1/sqrt(var + eps) in x's units: the statistics are of g * x
    return op("add", m, op("div", c, g)), op("mul", inv, g), \
        lambda ix: op("mul", op("sub", dev(ix), c), inv)


def _finite(e, ct: str):
    return op("lt", op("abs", e), const(math.inf, ct))


def _square(e):
    return op("mul", e, e)


# A row over several axes whose last is shorter than a vector: where a scale or bias varies
# along another of its axes, the row stays a loop nest and its sums run down each lane of
# the short last axis, 240 terms deep for [8, 6, 5, 9] (3e-6 off in the variance, fuzz
# 135/2871; onnxruntime sums in float64, 6e-8). Such rows take float64 statistics: odd
# shapes, where the speed does not matter; hidden-size rows keep float32.
SHORT_LAST, LONG_ROW = 16, 256


def _lower_layer_norm(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    rank = len(shape)
    axis = int(ctx.attr("axis", -1))
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    ct = compute_dtype(ctx.in_dtype(0))
    if ctx.attr("stash_type", 1) == 1 and ct != "float64":
        ct = "float32"
    wide = ct == "float32" and shape[-1] < SHORT_LAST and math.prod(shape[axis:]) > LONG_ROW
    if wide:
        ct = "float64"
    kept = {d: ctx.idx[d] for d in range(axis)}
    load = _loader(ctx, ct)
    # x = [-1, 3.4e38] overflowed a float32 square (the output was the bias) and a float32
    # mean rounded rows like 1000 +- 0.01; float64 statistics fixed both but ran the
    # LayerNorm kernels 3x slower: scaled_moments does it in float32 (docs/fuzzing.md)
    mean, inv, normalized = scaled_moments(ctx, shape, axes, kept, load, ct,
                                           ctx.attr("epsilon", 1e-5))
    if ctx.out == 1:
        return cast(mean, ctx.dtype)
    if ctx.out == 2:
        return cast(inv, ctx.dtype)
    y = op("mul", normalized(ctx.idx), _broadcast(ctx, 1, len(shape), ct))
    if ctx.has(2):
        y = op("add", y, _broadcast(ctx, 2, len(shape), ct))
    return cast(y, "float32") if wide else y


def _broadcast(ctx: LowerCtx, i: int, rank: int, ct: str):
    """Input i broadcast to x's shape (rank `rank`), at idx, in ct."""
    shape = ctx.in_shape(i)
    lead = rank - len(shape)
    idx = tuple(ctx.zero() if d == 1 else ctx.idx[k + lead] for k, d in enumerate(shape))
    return cast(ctx.value(i, idx), ct)


register("LayerNormalization", NORMALIZATION, _infer_layer_norm, _layer_norm_ref,
         lower=_lower_layer_norm,
         doc="LayerNormalization(X, Scale, B?) -> (Y, Mean?, InvStdDev?) (opset 17).")


# ---- RMSNormalization (opset 23) -------------------------------------------------------------

def _infer_rms_norm(ctx: InferContext) -> list[TypeShape]:
    _check_float(ctx, (0, 1))
    check_params(ctx, (1,))
    if ctx.shapes[0] is not None:
        normalize_axis(int(ctx.attr("axis", -1)), len(ctx.shapes[0]), ctx)
    return [(ctx.dtypes[0], ctx.shapes[0])]


def _rms_norm_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale = inputs[0], inputs[1]
    axes = tuple(range(normalize_axis(int(attrs.get("axis", -1)), x.ndim), x.ndim))
    ct = np.promote_types(F32 if attrs.get("stash_type", 1) == 1 else x.dtype, x.dtype)
    with np.errstate(all="ignore"):
        xs = x.astype(ct)
        rms = np.sqrt(np.mean(xs * xs, axis=axes, keepdims=True) +
                      np.asarray(attrs.get("epsilon", 1e-5), ct))
        return [(xs / rms * scale.astype(ct)).astype(x.dtype)]


def _lower_rms_norm(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    rank = len(shape)
    axis = normalize_axis(int(ctx.attr("axis", -1)), rank)
    axes = list(range(axis, rank))
    ct = "float64" if ctx.in_dtype(0) == "float64" else "float32"
    load = _loader(ctx, ct)
    n = math.prod(shape[a] for a in axes)
    sq = ctx.reduce("sum", shape, axes, {d: ctx.idx[d] for d in range(axis)},
                    lambda ix: _square(load(ix)), ct)
    eps = const(ctx.attr("epsilon", 1e-5), ct)
    rms = op("sqrt", op("add", op("div", sq, const(n, ct)), eps))
    return op("mul", op("div", load(ctx.idx), rms), _broadcast(ctx, 1, rank, ct))


register("RMSNormalization", NORMALIZATION, _infer_rms_norm, _rms_norm_ref,
         lower=_lower_rms_norm, doc="RMSNormalization(X, scale): X / rms(X) * scale (opset 23).")


# ---- BatchNorm / InstanceNorm / GroupNorm --------------------------------------------------

def _channel_shape(x: np.ndarray) -> list[int]:
    """Broadcast shape of a per-channel (axis 1) vector against x."""
    return [-1 if i == 1 else 1 for i in range(x.ndim)]


def _batch_norm(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x, scale, bias, mean, var = inputs[:5]
    cs = _channel_shape(x)
    inv = scale.reshape(cs) / np.sqrt(var.reshape(cs) + attrs.get("epsilon", 1e-5))
    return (x - mean.reshape(cs)) * inv + bias.reshape(cs)


def _normalize_groups(x: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) with statistics per (n, group) over the rest."""
    if x.size == 0:  # nothing to normalize (and np.mean of nothing warns)
        return x.copy()
    g = x.reshape(x.shape[0], groups, -1)
    mean = np.mean(g, axis=2, keepdims=True)
    d = g - mean
    wide = np.promote_types(d.dtype, np.float64)  # a float32 square overflows above 1.8e19
    var = np.mean(np.square(d.astype(wide)), axis=2, keepdims=True)
    return (d * (1 / np.sqrt(var + eps)).astype(d.dtype)).reshape(x.shape)


def _instance_norm(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x, scale, bias = inputs[:3]
    cs = _channel_shape(x)
    y = _normalize_groups(x, x.shape[1], attrs.get("epsilon", 1e-5))
    return y * scale.reshape(cs) + bias.reshape(cs)


def _group_norm(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x, scale, bias = inputs[:3]
    cs = _channel_shape(x)
    y = _normalize_groups(x, int(attrs["num_groups"]), attrs.get("epsilon", 1e-5))
    return y * scale.reshape(cs) + bias.reshape(cs)


def _infer_channel_norm(n_params: int) -> Callable[[InferContext], list[TypeShape]]:
    def infer(ctx: InferContext) -> list[TypeShape]:
        _check_float(ctx, tuple(range(1 + n_params)))
        shape = ctx.shapes[0]
        if shape is not None and len(shape) < 2:
            raise ctx.fail(f"input must have rank >= 2 (N, C, ...), got shape {shape}")
        c = None if shape is None else shape[1]
        for i in range(1, 1 + n_params):
            p = ctx.shapes[i]
            bad = p is not None and (len(p) != 1 or is_dim(c) and
                                     is_dim(p[0]) and p[0] != c)
            if bad:
                raise ctx.fail(f"input {i} has shape {p}, expected ({c},)")
        groups = ctx.attr("num_groups")
        bad_groups = groups is None or groups <= 0 or (is_dim(c) and c % groups)
        if ctx.op == "GroupNormalization" and bad_groups:
            raise ctx.fail(f"num_groups={groups} does not divide channels {c}")
        return [(ctx.dtypes[0], shape)]
    return infer


def _channel(ctx: LowerCtx, i: int, ct: str):
    """Per-channel parameter input i ([C] or [1]) at the channel (dim 1) of idx."""
    c = ctx.idx[1] if ctx.in_shape(i)[0] != 1 else ctx.zero()
    return cast(ctx.value(i, (c,)), ct)


def _lower_batch_norm(ctx: LowerCtx):
    ct = compute_dtype(ctx.dtype)
    scale, bias, mean, var = (_channel(ctx, i, ct) for i in range(1, 5))
    eps = const(ctx.attr("epsilon", 1e-5), ct)
    inv = op("div", const(1, ct), op("sqrt", op("add", var, eps)))
    y = op("mul", op("sub", _loader(ctx, ct)(ctx.idx), mean), op("mul", inv, scale))
    return op("add", y, bias)


def _lower_channel_norm(ctx: LowerCtx):
    """InstanceNormalization (groups = C) and GroupNormalization: statistics per (n, group)
    over x read as [N, G, C/G * spatial] (an affine view in the refined row domain)."""
    shape = ctx.in_shape(0)
    ct = compute_dtype(ctx.dtype)
    groups = shape[1] if ctx.node.op == "InstanceNormalization" else int(ctx.attr("num_groups"))
    vshape = (shape[0], groups, math.prod(shape[1:]) // max(groups, 1))  # no channels: empty
    ctx.rows(vshape, [2])
    vidx = ctx.reindex(ctx.idx, shape, vshape)
    load = lambda ix: cast(ctx.view(0, vshape, ix), ct)
    # float64 variance: a group holding 1e20 gave the bias (a float32 square overflowed);
    # the group statistics are one pass of a few per row, so the cost is small
    mean, inv = moments(ctx, vshape, [2], {0: vidx[0], 1: vidx[1]}, load, ct,
                        ctx.attr("epsilon", 1e-5), var_ct="float64")
    y = op("mul", op("sub", _loader(ctx, ct)(ctx.idx), mean), inv)
    return op("add", op("mul", y, _channel(ctx, 1, ct)), _channel(ctx, 2, ct))


register("BatchNormalization", NORMALIZATION, _infer_channel_norm(4),
         _floating_ref(_batch_norm), lower=_lower_batch_norm,
         doc="BatchNormalization(X, scale, B, mean, var), inference form (opset 15).",
         groups=("CONV_EPILOGUE",))
register("InstanceNormalization", NORMALIZATION, _infer_channel_norm(2),
         _floating_ref(_instance_norm), lower=_lower_channel_norm,
         doc="InstanceNormalization(input, scale, B): per (n, c) statistics.")
register("GroupNormalization", NORMALIZATION, _infer_channel_norm(2),
         _floating_ref(_group_norm), lower=_lower_channel_norm,
         doc="GroupNormalization(X, scale[C], bias[C]) with num_groups (opset 21).")


# ---- LpNormalization / MeanVarianceNormalization -------------------------------------------

def _lp_norm(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    ax = _axis(x, attrs)
    p = int(attrs.get("p", 2))
    if p == 1:
        norm = np.sum(np.abs(x), axis=ax, keepdims=True)
    else:
        norm = np.sqrt(np.sum(x * x, axis=ax, keepdims=True))
    # onnxruntime leaves an all-zero slice at zero instead of 0/0.
    return np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm))


def _infer_lp(ctx: InferContext) -> list[TypeShape]:
    if ctx.attr("p", 2) not in (1, 2):
        raise ctx.fail(f"p must be 1 or 2, got {ctx.attr('p')}")
    return _infer_axis_op(ctx)


def _mvn(inputs: Arrays, attrs: dict[str, Any]) -> np.ndarray:
    x = inputs[0]
    axes = tuple(normalize_axis(int(a), x.ndim) for a in attrs.get("axes", [0, 2, 3]))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(x - mean), axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var)


def _infer_mvn(ctx: InferContext) -> list[TypeShape]:
    _check_float(ctx)
    shape = ctx.shapes[0]
    if shape is not None:
        for a in ctx.attr("axes", [0, 2, 3]):
            normalize_axis(int(a), len(shape), ctx)
    return [(ctx.dtypes[0], shape)]


def _lower_lp(ctx: LowerCtx):
    shape, axis, kept, ct = _axis_row(ctx)
    load = _loader(ctx, ct)
    if int(ctx.attr("p", 2)) == 1:
        norm = ctx.reduce("sum", shape, [axis], kept, lambda ix: op("abs", load(ix)), ct)
    else:
        norm = op("sqrt", ctx.reduce("sum", shape, [axis], kept,
                                     lambda ix: _square(load(ix)), ct))
    zero = op("eq", norm, const(0, ct))  # onnxruntime leaves an all-zero slice at zero
    # a true division: a denormal norm (p = 1) has no float32 reciprocal, and x * (1 / n)
    # gave NaN and -inf where onnxruntime gives 0 and -1 (fuzz 141/100)
    return select(zero, const(0, ct), op("div_exact", load(ctx.idx), norm))


def _lower_mvn(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    rank = len(shape)
    axes = sorted({int(a) + rank if int(a) < 0 else int(a)
                   for a in ctx.attr("axes", [0, 2, 3])})
    ct = compute_dtype(ctx.dtype)
    load = _loader(ctx, ct)
    kept = {d: ctx.idx[d] for d in range(rank) if d not in axes}
    mean, inv = moments(ctx, shape, axes, kept, load, ct, None)
    return op("mul", op("sub", load(ctx.idx), mean), inv)


register("LpNormalization", NORMALIZATION, _infer_lp, _floating_ref(_lp_norm), lower=_lower_lp,
         doc="LpNormalization(x): x / ||x||_p along axis (p in 1, 2).")
register("MeanVarianceNormalization", NORMALIZATION, _infer_mvn, _floating_ref(_mvn),
         lower=_lower_mvn,
         doc="MeanVarianceNormalization(x): (x - mean) / std over axes (default [0, 2, 3]).")
