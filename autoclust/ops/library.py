"""Library calls: MatMul, Gemm, Conv, ConvTranspose, pooling, Einsum.

References are vectorized: Conv is im2col over a strided window view plus one matmul per
group; pooling reduces the same window view; ConvTranspose loops over kernel offsets only.
float16 computes in float32 and rounds once, as onnxruntime's MLAS kernels do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from autoclust.errors import ShapeInferenceError
from autoclust.ir import Dim, Shape
from autoclust.ops.table import (
    BFLOAT16,
    FLOAT_TYPES,
    INT64,
    LIBRARY,
    Arrays,
    Attrs,
    InferContext,
    TypeShape,
    broadcast_shapes,
    register,
)
from autoclust.symbolic import is_dim

F32 = np.dtype("float32")
MATMUL_TYPES = FLOAT_TYPES + tuple(np.dtype(t) for t in ("int32", "int64", "uint32", "uint64")) \
    + (BFLOAT16,)  # (compiled only where a backend's Policy.library_dtypes says so: GPU)
# What compiled library calls take (float16 computes in float32); MaxPool's Indices are int64.
GEMM_COMPILED = frozenset(FLOAT_TYPES + (np.dtype("int32"), np.dtype("int64")))
WINDOW_COMPILED = frozenset(FLOAT_TYPES)
POOL_TYPES = FLOAT_TYPES + (np.dtype("int8"), np.dtype("uint8"))


def _check_dtypes(ctx: InferContext, indices: Sequence[int], allowed: tuple) -> None:
    first = ctx.dtypes[indices[0]]
    for i in indices:
        if not ctx.has(i):
            continue
        dt = ctx.dtypes[i]
        if dt is not None and dt not in allowed:
            raise ctx.fail(f"input {i} has unsupported dtype {dt}")
        if dt is not None and first is not None and dt != first:
            raise ctx.fail(f"input {i} has dtype {dt}, input {indices[0]} has {first}")


def _work(x: np.ndarray) -> np.ndarray:
    return x.astype(F32) if x.dtype in (np.float16, BFLOAT16) else x


def _same_dim(a: Dim, b: Dim) -> bool:
    return not (is_dim(a) and is_dim(b) and a != b)


# ---- MatMul / Gemm --------------------------------------------------------------------------

def _infer_matmul(ctx: InferContext) -> list[TypeShape]:
    _check_dtypes(ctx, (0, 1), MATMUL_TYPES)
    a, b = ctx.shapes[0], ctx.shapes[1]
    if a is None or b is None:
        return [(ctx.dtypes[0], None)]
    if not a or not b:
        raise ctx.fail(f"MatMul inputs must have rank >= 1, got {a} and {b}")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if not _same_dim(a2[-1], b2[-2]):
        raise ctx.fail(f"inner dims differ: {a} @ {b}")
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except ShapeInferenceError as exc:
        raise ctx.fail(f"batch dims of {a} and {b}: {exc}") from None
    out = tuple(batch) + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())
    return [(ctx.dtypes[0], out)]


def _matmul_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    with np.errstate(all="ignore"):
        return [np.matmul(_work(a), _work(b)).astype(a.dtype)]

# ---- work estimates (OpDef.flops): 2 x multiply-adds; window reads for pools ---------------

def _size(t: Any) -> int:
    return math.prod(t[1])


def _matmul_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return 2.0 * _size(outs[0]) * ins[0][1][-1]


def _fused_matmul_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return 2.0 * _size(outs[0]) * ins[0][1][-2 if attrs.get("transA", 0) else -1]


def _gemm_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return 2.0 * _size(outs[0]) * ins[0][1][0 if attrs.get("transA", 0) else 1]


def _conv_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return 2.0 * _size(outs[0]) * math.prod(ins[1][1][1:])


def _convt_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return 2.0 * _size(ins[0]) * math.prod(ins[1][1][1:])


def _pool_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return float(_size(outs[0]) * math.prod(attrs.get("kernel_shape", (1,))))


def _global_pool_flops(attrs: Attrs, ins: list, outs: list) -> float:
    return float(_size(ins[0]))


def _einsum_flops(attrs: Attrs, ins: list, outs: list) -> float:
    # rough: every input element meets sqrt(output) partners
    return 2.0 * max(_size(t) for t in ins if t is not None) * _size(outs[0]) ** 0.5



register("MatMul", LIBRARY, _infer_matmul, _matmul_ref, dtypes=GEMM_COMPILED,
         doc="MatMul(A, B): numpy matmul semantics (1-D operands, batch broadcasting).",
         groups=("GEMM",), flops=_matmul_flops)


def _swap_last(shape: Shape, flag: Any) -> Shape:
    if shape is None or not flag or len(shape) < 2:
        return shape
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def _infer_fused_matmul(ctx: InferContext) -> list[TypeShape]:
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise ctx.fail("transBatchA/transBatchB are not supported")
    for i in (0, 1):
        s = ctx.shapes[i]
        if s is not None and len(s) < 2:
            raise ctx.fail(f"input {i} must have rank >= 2, got {s}")
    shapes = [_swap_last(ctx.shapes[0], ctx.attr("transA", 0)),
              _swap_last(ctx.shapes[1], ctx.attr("transB", 0))]
    sub = InferContext("FusedMatMul", ctx.dtypes[:2], shapes, [None, None], {}, [True, True],
                       ctx.node_name)
    _check_dtypes(ctx, (0, 1), FLOAT_TYPES)
    return _infer_matmul(sub)


def _fused_matmul_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = _work(inputs[0]), _work(inputs[1])
    if attrs.get("transA", 0):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transB", 0):
        b = np.swapaxes(b, -1, -2)
    with np.errstate(all="ignore"):
        y = np.matmul(a, b) * np.asarray(attrs.get("alpha", 1.0), a.dtype)
    return [y.astype(inputs[0].dtype)]


# onnxruntime's contrib op: what its optimizer makes of MatMul(A, Transpose(B)) and a scale,
# and what our cluster optimizer does too (passes/simplify.py): no transposed copy.
register("FusedMatMul", LIBRARY, _infer_fused_matmul, _fused_matmul_ref,
         domain="com.microsoft", dtypes=frozenset(FLOAT_TYPES),
         doc="FusedMatMul(A, B) = alpha * op(A) @ op(B); transA, transB swap the last dims.",
         groups=("GEMM",), flops=_fused_matmul_flops)


def _infer_gemm(ctx: InferContext) -> list[TypeShape]:
    _check_dtypes(ctx, (0, 1, 2), MATMUL_TYPES)
    a, b = ctx.shapes[0], ctx.shapes[1]
    for i, s in ((0, a), (1, b)):
        if s is not None and len(s) != 2:
            raise ctx.fail(f"input {i} must be 2-D, got shape {s}")
    m = None if a is None else a[1 if ctx.attr("transA", 0) else 0]
    ka = None if a is None else a[0 if ctx.attr("transA", 0) else 1]
    kb = None if b is None else b[1 if ctx.attr("transB", 0) else 0]
    n = None if b is None else b[0 if ctx.attr("transB", 0) else 1]
    if not _same_dim(ka, kb):
        raise ctx.fail(f"inner dims differ: A {a} (transA={ctx.attr('transA', 0)}), "
                       f"B {b} (transB={ctx.attr('transB', 0)})")
    c = ctx.shapes[2] if ctx.has(2) else None
    if c is not None:
        if len(c) > 2:
            raise ctx.fail(f"C must have rank <= 2, got shape {c}")
        cc = (1,) * (2 - len(c)) + tuple(c)
        for got, want in zip(cc, (m, n)):
            if is_dim(got) and got != 1 and not _same_dim(got, want):
                raise ctx.fail(f"C of shape {c} does not broadcast to ({m}, {n})")
    return [(ctx.dtypes[0], (m, n))]


def _gemm_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    a, b = _work(inputs[0]), _work(inputs[1])
    c = inputs[2] if len(inputs) > 2 else None
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    with np.errstate(all="ignore"):
        y = np.asarray(attrs.get("alpha", 1.0), a.dtype) * (a @ b)
        beta = float(attrs.get("beta", 1.0))
        if c is not None and beta != 0:  # beta = 0: C is not read (its inf/NaN stay out)
            y = y + np.asarray(beta, a.dtype) * _work(c)
    return [y.astype(inputs[0].dtype)]


register("Gemm", LIBRARY, _infer_gemm, _gemm_ref, dtypes=GEMM_COMPILED,
         doc="Gemm(A, B, C?) = alpha * A' @ B' + beta * C.", groups=("GEMM",), flops=_gemm_flops)


# ---- window geometry (Conv, pooling) ----------------------------------------------------

def window_pads(in_dims: Sequence[Dim], kernel: Sequence[int], attrs: dict[str, Any],
                 pool: bool) -> tuple[list[Dim], list[int], list[int]]:
    """(output dims, pads begin, pads end) of a sliding window per spatial dim."""
    n = len(kernel)
    strides = attrs.get("strides") or [1] * n
    dil = attrs.get("dilations") or [1] * n
    auto_pad = attrs.get("auto_pad", "NOTSET")
    pads = list(attrs.get("pads") or [0] * 2 * n)
    ceil_mode = pool and attrs.get("ceil_mode", 0)
    outs, begins, ends = [], [], []
    for i, d in enumerate(in_dims):
        span = (kernel[i] - 1) * dil[i] + 1
        pb, pe = (pads[i], pads[i + n]) if auto_pad == "NOTSET" else (0, 0)
        if not is_dim(d):
            outs.append(None)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-d // strides[i])
            total = max(0, (out - 1) * strides[i] + span - d)
            pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
            outs.append(out)
        else:
            room = d + pb + pe - span
            out = (-(-room // strides[i]) if ceil_mode else room // strides[i]) + 1
            if ceil_mode and (out - 1) * strides[i] >= d + pb:
                out -= 1  # the last window must start inside the input or left pad
            outs.append(max(out, 0))
        begins.append(pb)
        ends.append(pe)
    return outs, begins, ends


def _window_view(xp: np.ndarray, out: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dil: Sequence[int]) -> np.ndarray:
    """View (N, C, *out, *kernel) of the padded input xp (N, C, *spatial)."""
    n = len(kernel)
    st = xp.strides[2:]
    shape = xp.shape[:2] + tuple(out) + tuple(kernel)
    view_strides = (xp.strides[:2] + tuple(st[i] * strides[i] for i in range(n))
                    + tuple(st[i] * dil[i] for i in range(n)))
    return np.lib.stride_tricks.as_strided(xp, shape, view_strides, writeable=False)


def _windows(x: np.ndarray, kernel: Sequence[int], attrs: dict[str, Any], fill: Any,
             pool: bool) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """Window view of x padded with `fill`; also (out dims, pads begin, pads end)."""
    n = len(kernel)
    strides = attrs.get("strides") or [1] * n
    dil = attrs.get("dilations") or [1] * n
    out, pb, pe = window_pads(x.shape[2:], kernel, attrs, pool)
    # ceil_mode windows may run past the end pad: pad them too (they never count).
    need = [(o - 1) * s + (k - 1) * d + 1 if o > 0 else 0
            for o, s, k, d in zip(out, strides, kernel, dil)]
    extra = [max(0, nd - (x.shape[2 + i] + pb[i] + pe[i])) for i, nd in enumerate(need)]
    widths = [(0, 0), (0, 0)] + [(pb[i], pe[i] + extra[i]) for i in range(n)]
    xp = np.pad(x, widths, constant_values=fill)
    return _window_view(xp, out, kernel, strides, dil), out, pb, pe


def _check_spatial(ctx: InferContext, x: Shape, n_spatial: int | None) -> None:
    if x is not None and len(x) < 3:
        raise ctx.fail(f"input must be (N, C, spatial...), got shape {x}")
    if x is not None and n_spatial is not None and len(x) - 2 != n_spatial:
        raise ctx.fail(f"kernel has {n_spatial} spatial dims, input shape {x}")


# ---- Conv -------------------------------------------------------------------------------

def _conv_operands(ctx: InferContext) -> tuple[Shape, Shape, int, list | None]:
    """Conv/ConvTranspose: (x, w, group, kernel); kernel None when not all known ints."""
    _check_dtypes(ctx, (0, 1, 2), FLOAT_TYPES)
    x, w = ctx.shapes[0], ctx.shapes[1]
    group = int(ctx.attr("group", 1))
    kernel = ctx.attr("kernel_shape") or (None if w is None else list(w[2:]))
    _check_spatial(ctx, x, None if kernel is None else len(kernel))
    if kernel is not None and any(not isinstance(k, int) for k in kernel):
        kernel = None
    return x, w, group, kernel


def _unknown_like(ctx: InferContext, x: Shape) -> list[TypeShape]:
    return [(ctx.dtypes[0], None if x is None else (None,) * len(x))]


def _infer_conv(ctx: InferContext) -> list[TypeShape]:
    x, w, group, kernel = _conv_operands(ctx)
    if x is None or kernel is None:
        return _unknown_like(ctx, x)
    if w is not None and not _same_dim(x[1], None if w[1] is None else _mul(w[1], group)):
        raise ctx.fail(f"input channels {x[1]} != weight channels {w[1]} * group {group}")
    m = None if w is None else w[0]
    if is_dim(m) and m % group:
        raise ctx.fail(f"output channels {m} not divisible by group {group}")
    out, _, _ = window_pads(x[2:], kernel, ctx.attrs, pool=False)
    return [(ctx.dtypes[0], (x[0], m, *out))]


def _mul(d: Dim, k: int) -> Dim:
    return d * k if is_dim(d) else None


def _conv_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    # Summed in float64 and rounded once: a float32 window of products near 1e38 (weights
    # fed at run time) overflowed to +inf and -inf in partial sums and gave NaN where one
    # -inf product makes the exact sum -inf, which onnxruntime gives (fuzz 130/1004).
    x, w = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
    bias = inputs[2] if len(inputs) > 2 else None
    group = int(attrs.get("group", 1))
    kernel = list(w.shape[2:])
    win, out, _, _ = _windows(x, kernel, attrs, 0, pool=False)
    n, m, cg, p = x.shape[0], w.shape[0], w.shape[1], math.prod(out)
    mg = m // group
    ys = []
    with np.errstate(all="ignore"):
        for g in range(group):
            cols = win[:, g * cg:(g + 1) * cg]            # (N, cg, *out, *k)
            cols = np.moveaxis(cols, 1, 1 + len(out))     # (N, *out, cg, *k)
            cols = cols.reshape(n * p, cg * math.prod(kernel))
            wg = w[g * mg:(g + 1) * mg].reshape(mg, -1)
            ys.append((cols @ wg.T).reshape(n, p, mg))
        y = np.concatenate(ys, axis=2).transpose(0, 2, 1).reshape(n, m, *out)
        if bias is not None:
            y = y + _work(bias).reshape([1, m] + [1] * len(out))
    return [y.astype(inputs[0].dtype)]


register("Conv", LIBRARY, _infer_conv, _conv_ref, dtypes=WINDOW_COMPILED,
         doc="Conv(X, W, B?): 1-D/2-D/3-D, group, strides, dilations, pads, auto_pad.",
         groups=("WINDOW",), flops=_conv_flops)


# ---- ConvTranspose ------------------------------------------------------------------------

def _convt_pads(in_dims: Sequence[Dim], kernel: Sequence[int], attrs: dict[str, Any]
                ) -> tuple[list[Dim], list[int], list[int]]:
    """(output dims, pads begin, pads end) of ConvTranspose per the ONNX spec."""
    n = len(kernel)
    strides = attrs.get("strides") or [1] * n
    dil = attrs.get("dilations") or [1] * n
    opad = attrs.get("output_padding") or [0] * n
    pads = list(attrs.get("pads") or [0] * 2 * n)
    auto_pad, out_shape = attrs.get("auto_pad", "NOTSET"), attrs.get("output_shape")
    outs, begins, ends = [], [], []
    for i, d in enumerate(in_dims):
        if not is_dim(d):
            outs.append(None)
            begins.append(0)
            ends.append(0)
            continue
        full = strides[i] * (d - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1
        target = None
        if out_shape is not None:
            target = out_shape[-n + i]
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            target = d * strides[i]
        if target is None:
            pb, pe = (pads[i], pads[i + n]) if auto_pad == "NOTSET" else (0, 0)
        else:
            total = full - target
            upper = auto_pad == "SAME_UPPER"
            pb = total // 2 if upper else total - total // 2
            pe = total - pb
        outs.append(full - pb - pe)
        begins.append(pb)
        ends.append(pe)
    return outs, begins, ends


def _infer_convt(ctx: InferContext) -> list[TypeShape]:
    x, w, group, kernel = _conv_operands(ctx)
    if x is None or kernel is None:
        return _unknown_like(ctx, x)
    if w is not None and not _same_dim(x[1], w[0]):
        raise ctx.fail(f"input channels {x[1]} != weight dim 0 {w[0]}")
    m = None if w is None else _mul(w[1], group)
    out, _, _ = _convt_pads(x[2:], kernel, ctx.attrs)
    return [(ctx.dtypes[0], (x[0], m, *out))]


def _convt_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, w = _work(inputs[0]), _work(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    group = int(attrs.get("group", 1))
    kernel = list(w.shape[2:])
    ns = len(kernel)
    strides = attrs.get("strides") or [1] * ns
    dil = attrs.get("dilations") or [1] * ns
    out, pb, pe = _convt_pads(x.shape[2:], kernel, attrs)
    n, cg, mg = x.shape[0], x.shape[1] // group, w.shape[1]
    # Pads are negative when output_shape asks for more than the full result: the output
    # then extends past it with zeros. `shift` makes room before index 0 for that.
    shift = [max(0, -b) for b in pb]
    full = [s + max(o + b + e, o + b) for s, o, b, e in zip(shift, out, pb, pe)]
    y = np.zeros((n, mg * group, *full), x.dtype)
    xg = x.reshape(n, group, cg, *x.shape[2:])
    wg = w.reshape(group, cg, mg, *kernel)
    with np.errstate(all="ignore"):
        # One scatter-add per kernel offset: y[.., off + s*i] += sum_c x[c, i] * w[c, m, off].
        for off in np.ndindex(*kernel):
            contrib = np.einsum("ngc...,gcm->ngm...", xg, wg[(...,) + off])
            idx = tuple(slice(h + o * d, h + o * d + s * (xi - 1) + 1, s) for h, o, d, s, xi
                        in zip(shift, off, dil, strides, x.shape[2:]))
            y[(slice(None), slice(None)) + idx] += contrib.reshape(n, group * mg,
                                                                   *x.shape[2:])
        crop = tuple(slice(h + b, h + b + o) for h, b, o in zip(shift, pb, out))
        y = y[(slice(None), slice(None)) + crop]
        if bias is not None:
            y = y + _work(bias).reshape([1, -1] + [1] * ns)
    return [np.ascontiguousarray(y).astype(inputs[0].dtype)]


register("ConvTranspose", LIBRARY, _infer_convt, _convt_ref, dtypes=WINDOW_COMPILED,
         doc="ConvTranspose(X, W, B?): strides, dilations, pads, output_padding/shape, group.",
         groups=("WINDOW",), flops=_convt_flops)


# ---- MaxPool / AveragePool ----------------------------------------------------------------

def _infer_pool(ctx: InferContext) -> list[TypeShape]:
    allowed = POOL_TYPES if ctx.op == "MaxPool" else FLOAT_TYPES
    _check_dtypes(ctx, (0,), allowed)
    x, kernel = ctx.shapes[0], ctx.attr("kernel_shape")
    if not kernel:
        raise ctx.fail("kernel_shape is required")
    _check_spatial(ctx, x, len(kernel))
    if x is None:
        out = None
    else:
        dims, _, _ = window_pads(x[2:], kernel, ctx.attrs, pool=True)
        out = (x[0], x[1], *dims)
    return [(ctx.dtypes[0], out), (INT64, out)]


def _maxpool_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    kernel = list(attrs["kernel_shape"])
    w = _work(x)
    fill = -np.inf if w.dtype.kind == "f" else np.iinfo(w.dtype).min
    win, out, _, _ = _windows(w, kernel, attrs, fill, pool=True)
    flat = win.reshape(*win.shape[:2 + len(out)], math.prod(kernel))
    if w.dtype.kind == "f" and max(attrs.get("dilations") or [1]) > 1:
        ones = np.ones((1, 1, *x.shape[2:]), np.int8)
        valid = _windows(ones, kernel, attrs, 0, pool=True)[0].reshape(1, 1, *out, -1) > 0
        values, arg = first_tap_max(flat, valid)
    else:
        if w.dtype.kind == "f":  # NaN never wins (pool_max)
            flat = np.where(np.isnan(flat), -np.inf, flat)
        arg = np.argmax(flat, axis=-1)[..., None]  # first maximum, as onnxruntime
        values = np.take_along_axis(flat, arg, axis=-1)[..., 0]
        if w.dtype.kind == "f":
            values = np.maximum(values, np.finfo(w.dtype).min)
    # Indices: the flat (N, C, *spatial) offset of each maximum; padding never wins.
    spatial = x.shape[2:]
    pos = np.arange(math.prod(spatial)).reshape(spatial)
    if attrs.get("storage_order", 0):  # column-major: h + w * H
        pos = np.arange(math.prod(spatial)).reshape(spatial[::-1]).T
    pos = np.broadcast_to(pos, x.shape).copy()
    base = (np.arange(x.shape[0] * x.shape[1]) * math.prod(spatial)).reshape(x.shape[:2])
    pos = pos + base.reshape(*x.shape[:2], *[1] * len(spatial))
    pwin, _, _, _ = _windows(pos, kernel, attrs, -1, pool=True)
    pflat = pwin.reshape(flat.shape)
    indices = np.take_along_axis(pflat, arg, axis=-1)[..., 0].astype(np.int64)
    return [values.astype(x.dtype), indices]


def first_tap_max(taps: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(maximum, tap index [..., 1]) of a dilated MaxPool's windows, onnxruntime's rule
    there: a window's first tap inside the data starts the maximum, a later one replaces
    it only when greater, so a NaN wins as that first tap and never after it, and -inf
    stays -inf ([nan, 2] -> nan, [2, nan] -> 2; fuzz 146/204, 147/25); a window of padding
    only is the lowest float. `taps` [..., K] in kernel order, `valid` broadcasting to it."""
    y = np.full(taps.shape[:-1], np.finfo(taps.dtype).min, taps.dtype)
    arg = np.zeros(taps.shape[:-1], np.int64)
    seen = np.zeros(taps.shape[:-1], bool)
    with np.errstate(invalid="ignore"):
        for k in range(taps.shape[-1]):
            ok = valid[..., k]
            take = ok & (~seen | (taps[..., k] > y))
            y, arg, seen = np.where(take, taps[..., k], y), np.where(take, k, arg), seen | ok
    return y, arg[..., None]


def pool_max(x: np.ndarray, axis: int | tuple[int, ...], keepdims: bool = True) -> np.ndarray:
    """MaxPool's and GlobalMaxPool's maximum, as onnxruntime's CPU kernels and the ONNX
    reference take it: NaN never wins (a window of NaN only, or of -inf, or of padding only
    gives the float's lowest, where onnxruntime's running maximum starts; the reference
    drops NaN too). The spec says nothing of NaN; onnxruntime's 2-D MLAS kernel keeps a NaN
    in some lanes, and our large float32 pools run that same kernel (fuzz 142/772: a window
    of padding only, beside a dilation stepping over a one-row input, was -inf; 141/610,
    142/685 and 30 more: NaN where onnxruntime skipped it)."""
    lowest = np.finfo(np.promote_types(x.dtype, np.float32)).min  # float16: -inf, as there
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.max(np.where(np.isnan(x), -np.inf, x), axis=axis, keepdims=keepdims,
                     initial=-np.inf)
        return np.maximum(top, lowest).astype(x.dtype)


def _avgpool_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x = inputs[0]
    kernel = list(attrs["kernel_shape"])
    w = _work(x)
    win, out, pb, pe = _windows(w, kernel, attrs, 0, pool=True)
    axes = tuple(range(2 + len(out), win.ndim))
    with np.errstate(all="ignore"):
        total = np.sum(win, axis=axes)
        # Divisor: the window's real elements, plus explicit pads with count_include_pad.
        mask = np.ones((1, 1) + x.shape[2:], w.dtype)
        if attrs.get("count_include_pad", 0):
            mask = np.pad(mask, [(0, 0), (0, 0)] + list(zip(pb, pe)), constant_values=1)
            attrs = {**attrs, "pads": [0] * 2 * len(kernel), "auto_pad": "NOTSET"}
            mwin = _windows_fixed(mask, kernel, attrs, out)
        else:
            mwin, _, _, _ = _windows(mask, kernel, attrs, 0, pool=True)
        y = total / np.sum(mwin, axis=axes)
    return [y.astype(x.dtype)]


def _windows_fixed(xp: np.ndarray, kernel: Sequence[int], attrs: dict[str, Any],
                   out: Sequence[int]) -> np.ndarray:
    """Window view of an already padded array, zero-extended for ceil_mode windows."""
    n = len(kernel)
    strides = attrs.get("strides") or [1] * n
    dil = attrs.get("dilations") or [1] * n
    need = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out, strides, kernel, dil)]
    extra = [max(0, nd - xp.shape[2 + i]) for i, nd in enumerate(need)]
    xp = np.pad(xp, [(0, 0), (0, 0)] + [(0, e) for e in extra])
    return _window_view(xp, out, kernel, strides, dil)


register("MaxPool", LIBRARY, _infer_pool, _maxpool_ref,
         dtypes=WINDOW_COMPILED | {np.dtype("int64")},
         doc="MaxPool(X) -> (Y, Indices?): kernel_shape, strides, pads, dilations, ceil_mode.",
         groups=("WINDOW",), flops=_pool_flops)
register("AveragePool", LIBRARY, _infer_pool, _avgpool_ref, dtypes=WINDOW_COMPILED,
         doc="AveragePool(X): kernel_shape, strides, pads, ceil_mode, count_include_pad.",
         groups=("WINDOW",), flops=_pool_flops)


def _infer_global_pool(ctx: InferContext) -> list[TypeShape]:
    _check_dtypes(ctx, (0,), FLOAT_TYPES)
    x = ctx.shapes[0]
    _check_spatial(ctx, x, None)
    return [(ctx.dtypes[0], None if x is None else (x[0], x[1]) + (1,) * (len(x) - 2))]


def _global_pool_ref(fn: Any):
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        with np.errstate(all="ignore"):
            y = fn(_work(x), axis=tuple(range(2, x.ndim)), keepdims=True)
        return [y.astype(x.dtype)]
    return ref


register("GlobalAveragePool", LIBRARY, _infer_global_pool, _global_pool_ref(np.mean),
         dtypes=WINDOW_COMPILED,
         doc="GlobalAveragePool(X): mean over all spatial dims, kept as size 1.",
         groups=("WINDOW",), flops=_global_pool_flops)
register("GlobalMaxPool", LIBRARY, _infer_global_pool, _global_pool_ref(pool_max),
         dtypes=WINDOW_COMPILED,
         doc="GlobalMaxPool(X): max over all spatial dims, kept as size 1.", groups=("WINDOW",),
         flops=_global_pool_flops)


# ---- Einsum -------------------------------------------------------------------------------

def _parse_einsum(eq: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Terms with '...' expanded to upper-case letters, and the explicit output term."""
    eq = eq.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeInferenceError(f"Einsum equation {eq!r} has {len(terms)} terms for "
                                  f"{len(ranks)} inputs")
    n_ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = "".join(chr(ord("A") + i) for i in range(n_ell))
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - (len(t) - 3)
            t = t.replace("...", ell[n_ell - k:])
        if len(t) != r:
            raise ShapeInferenceError(f"Einsum term {t!r} of {eq!r} does not match rank {r}")
        out_terms.append(t)
    if "->" in eq:
        out = rhs.replace("...", ell)
    else:  # implicit: broadcast dims, then letters seen once, alphabetically
        letters = "".join(out_terms)
        out = ell + "".join(sorted(c for c in set(letters) if c.islower()
                                   and letters.count(c) == 1))
    return out_terms, out


def _infer_einsum(ctx: InferContext) -> list[TypeShape]:
    _check_dtypes(ctx, tuple(range(ctx.n_inputs)), MATMUL_TYPES)
    if any(s is None for s in ctx.shapes):
        return [(ctx.dtypes[0], None)]
    try:
        terms, out = _parse_einsum(ctx.attr("equation", ""), [len(s) for s in ctx.shapes])
    except ShapeInferenceError as exc:
        raise ctx.fail(str(exc)) from None
    dims: dict[str, Dim] = {}
    for t, s in zip(terms, ctx.shapes):
        for c, d in zip(t, s):
            prev = dims.get(c, 1)
            if c.isupper():  # ellipsis dims broadcast
                dims[c] = broadcast_shapes((prev,), (d,))[0]
            elif c in dims and not _same_dim(prev, d):
                raise ctx.fail(f"label {c!r} has dims {prev} and {d}")
            else:
                dims[c] = d if is_dim(d) or c not in dims else prev
    missing = [c for c in out if c not in dims]
    if missing:
        raise ctx.fail(f"output labels {missing} of {ctx.attr('equation')!r} appear in no input")
    return [(ctx.dtypes[0], tuple(dims[c] for c in out))]


def _einsum_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    xs = [_work(x) for x in inputs]
    with np.errstate(all="ignore"):
        y = np.einsum(attrs["equation"], *xs)
    return [np.asarray(y).astype(inputs[0].dtype)]


register("Einsum", LIBRARY, _infer_einsum, _einsum_ref, dtypes=GEMM_COMPILED,
         doc="Einsum(inputs...): equation attr, numpy einsum semantics incl. '...'.",
         groups=("GEMM",), flops=_einsum_flops)
