"""The NumPy implementations of the CPU backend's library calls ("numpy" and "ref" in
library.py): OpenBLAS matmul with out= (batched MatMul as one 2-D call or a loop of 2-D
calls: NumPy 2.4's stacked matmul does not use BLAS), im2col + matmul Conv, pooling as a
loop over kernel offsets on a preallocated padded buffer, einsum with a precomputed path.
float16 computes in float32 and rounds once, as the op references do. ("ref": the op's
NumPy reference plus a copy, for ConvTranspose and MaxPool Indices.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autoclust import ops
from autoclust.ops.library import first_tap_max, pool_max, window_pads  # the semantics'

TypeShape = tuple[np.dtype, tuple[int, ...]]
Arrays = Sequence[np.ndarray | None]
RunFn = Callable[[Arrays, Sequence[np.ndarray]], None]
INTS = tuple(np.dtype(t) for t in ("int32", "int64"))
F16, F32 = np.dtype("float16"), np.dtype("float32")


def staged(run: RunFn, in_types: list, out_types: list) -> RunFn:
    """float16: compute in float32 into staging buffers, round once into the outputs."""
    if not any(t is not None and t[0] == F16 for t in in_types):
        return run
    stage = [np.empty(s, F32) for _, s in out_types]

    def run_staged(inputs: Arrays, outputs: Sequence[np.ndarray]) -> None:
        wide = [None if x is None else x.astype(F32) for x in inputs]
        run(wide, stage)
        with np.errstate(over="ignore"):  # past 65504 rounds to inf, as float16 does
            for y, s in zip(outputs, stage):
                np.copyto(y, s, casting="unsafe")

    return run_staged


def _work_type(t: TypeShape) -> np.dtype:
    return F32 if t[0] == F16 else t[0]


def _numpy_matmul(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    sa, sb = in_types[0][1], in_types[1][1]
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    m, k, n = a2[-2], a2[-1], b2[-1]
    out_batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    nb = math.prod(out_batch)
    if nb * m * n * k == 0:  # K = 0 sums nothing: zeros (an empty output needs nothing)
        return lambda ins, outs: outs[0].fill(0)
    if in_types[0][0] in INTS or (nb > 1 and m * n * k < 4096):
        # Integers never reach BLAS; tiny stacked problems are cheaper in one ufunc call.
        return lambda ins, outs: np.matmul(ins[0], ins[1], out=outs[0])
    if len(b2) == 2:  # one B for every row of A: a single [batch*M, K] @ [K, N]
        def run2(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
            np.matmul(ins[0].reshape(-1, k), ins[1].reshape(k, n), out=outs[0].reshape(-1, n))
        return run2
    # Broadcast batches: pair each output matrix with its A and B matrices once, here.
    ia = np.broadcast_to(np.arange(math.prod(a2[:-2])).reshape(a2[:-2]), out_batch).ravel()
    ib = np.broadcast_to(np.arange(math.prod(b2[:-2])).reshape(b2[:-2]), out_batch).ravel()
    pairs = list(zip(range(nb), ia.tolist(), ib.tolist()))

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        a3, b3 = ins[0].reshape(-1, m, k), ins[1].reshape(-1, k, n)
        o3 = outs[0].reshape(nb, m, n)
        for o, i, j in pairs:
            np.matmul(a3[i], b3[j], out=o3[o])

    return run


def _numpy_gemm(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    dtype = _work_type(in_types[0])
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
    alpha = np.asarray(attrs.get("alpha", 1.0), dtype)
    beta = np.asarray(attrs.get("beta", 1.0), dtype)
    # beta = 0: C is not read at all (0 * inf would be NaN), as onnxruntime
    has_c = len(in_types) > 2 and in_types[2] is not None and beta != 0

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        a = ins[0].T if trans_a else ins[0]
        b = ins[1].T if trans_b else ins[1]
        y = outs[0]
        np.matmul(a, b, out=y)  # BLAS takes the transposed views without a copy
        if alpha != 1:
            np.multiply(y, alpha, out=y)
        if has_c:
            np.add(y, ins[2] if beta == 1 else ins[2] * beta, out=y)

    return run


def _padded(x_shape: tuple, begins: Sequence[int], sizes: Sequence[int], dtype: np.dtype,
            fill: Any) -> tuple[np.ndarray, tuple]:
    """A buffer (N, C, *sizes) filled with `fill` and the slice where x goes."""
    buf = np.full(tuple(x_shape[:2]) + tuple(sizes), fill, dtype)
    inner = (slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in
                                               zip(begins, x_shape[2:]))
    return buf, inner


def _window_geometry(x_shape: tuple, kernel: Sequence[int], attrs: dict[str, Any],
                     pool: bool) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(out dims, pads begin, padded sizes, strides, dilations) of a sliding window."""
    ns = len(kernel)
    strides = list(attrs.get("strides") or [1] * ns)
    dil = list(attrs.get("dilations") or [1] * ns)
    out, pb, pe = window_pads(x_shape[2:], kernel, attrs, pool)
    # ceil_mode windows may run past the end pad: the buffer covers them too.
    sizes = [max(d + b + e, (o - 1) * s + (k - 1) * dd + 1)
             for d, b, e, o, s, k, dd in zip(x_shape[2:], pb, pe, out, strides, kernel, dil)]
    return out, pb, sizes, strides, dil


def _offset_views(xp: np.ndarray, out: Sequence[int], kernel: Sequence[int],
                  strides: Sequence[int], dil: Sequence[int]) -> list[np.ndarray]:
    """For each kernel offset, the strided view of xp (N, C, *out) it reads."""
    views = []
    for off in np.ndindex(*kernel):
        idx = tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                    for o, d, s, n in zip(off, dil, strides, out))
        views.append(xp[(slice(None), slice(None)) + idx])
    return views


def _numpy_conv(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    x_shape, w_shape = in_types[0][1], in_types[1][1]
    dtype, kernel = _work_type(in_types[0]), list(w_shape[2:])
    group, has_bias = int(attrs.get("group", 1)), len(in_types) > 2 and in_types[2] is not None
    out, pb, sizes, strides, dil = _window_geometry(x_shape, kernel, attrs, pool=False)
    n, m, cg = x_shape[0], w_shape[0], w_shape[1]
    mg, p, ksize = m // group, math.prod(out), math.prod(kernel)
    needs_pad = list(sizes) != list(x_shape[2:])
    xp, inner = _padded(x_shape, pb, sizes, dtype, 0)
    bias_shape = (1, m) + (1,) * len(out)

    def load(x: np.ndarray) -> np.ndarray:
        if not needs_pad:
            return x
        xp[inner] = x  # the pad border stays zero from allocation
        return xp

    if cg == 1 and group > 1:
        return _depthwise(load, dtype, out, strides, dil, kernel, (n, group, mg), has_bias)
    pointwise = ksize == 1 and not needs_pad and all(s == 1 for s in strides)
    cols = np.empty((cg * ksize, p), dtype)
    # cols (cg, *kernel, *out) <- window view (cg, *out, *kernel): offsets move in front.
    ns = len(out)
    order = (0,) + tuple(range(1 + ns, 1 + 2 * ns)) + tuple(range(1, 1 + ns))
    cols_view = cols.reshape((cg, *kernel, *out))

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        w = ins[1].reshape(group, mg, cg * ksize)
        y = outs[0].reshape(n, group, mg, p)
        src = load(ins[0])
        win = None if pointwise else _window_view(src, out, kernel, strides, dil)
        for b in range(n):
            for g in range(group):
                if pointwise:
                    c = src[b, g * cg:(g + 1) * cg].reshape(cg, p)
                else:
                    np.copyto(cols_view, win[b, g * cg:(g + 1) * cg].transpose(order))
                    c = cols
                np.matmul(w[g], c, out=y[b, g])
        if has_bias:
            np.add(outs[0], ins[2].reshape(bias_shape), out=outs[0])

    return run


def _window_view(xp: np.ndarray, out: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dil: Sequence[int]) -> np.ndarray:
    """Read-only view (N, C, *out, *kernel) of the padded input."""
    ns = len(kernel)
    st = xp.strides[2:]
    shape = xp.shape[:2] + tuple(out) + tuple(kernel)
    view_strides = (xp.strides[:2] + tuple(st[i] * strides[i] for i in range(ns))
                    + tuple(st[i] * dil[i] for i in range(ns)))
    return np.lib.stride_tricks.as_strided(xp, shape, view_strides, writeable=False)


def _depthwise(load: Callable, dtype: np.dtype, out: list[int], strides: list[int],
               dil: list[int], kernel: list[int], ngm: tuple[int, int, int],
               has_bias: bool) -> RunFn:
    """Conv with one input channel per group: a multiply-add per kernel offset, no matmul."""
    n, group, mg = ngm
    ns = len(out)
    tmp = np.empty((n, group, mg, *out), dtype)

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        src = load(ins[0])
        views = _offset_views(src, out, kernel, strides, dil)
        w = ins[1].reshape(group, mg, -1)
        y = outs[0].reshape(n, group, mg, *out)
        for k, v in enumerate(views):
            xk = v.reshape(n, group, 1, *out)
            wk = w[:, :, k].reshape((1, group, mg) + (1,) * ns)
            if k == 0:
                np.multiply(xk, wk, out=y)
            else:
                np.multiply(xk, wk, out=tmp)
                np.add(y, tmp, out=y)
        if has_bias:
            y += ins[2].reshape((1, group, mg) + (1,) * ns)

    return run


def _numpy_pool(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    x_shape, dtype = in_types[0][1], _work_type(in_types[0])
    kernel = list(attrs["kernel_shape"])
    is_max = attrs.get("_op") == "MaxPool"
    out, pb, sizes, strides, dil = _window_geometry(x_shape, kernel, attrs, pool=True)
    if is_max:
        fill = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    else:
        fill = 0
    xp, inner = _padded(x_shape, pb, sizes, dtype, fill)
    views = _offset_views(xp, out, kernel, strides, dil)
    count = None if is_max else _pool_count(x_shape, attrs, pb, sizes, out, strides, dil,
                                            dtype)
    # a float maximum starts at the lowest float and never takes NaN (library.pool_max);
    # dilated, the first tap inside the data starts it (library.first_tap_max)
    float_max = is_max and dtype.kind == "f"
    valid = None
    if float_max and max(dil) > 1:
        mask, mask_inner = _padded((1, 1, *x_shape[2:]), pb, sizes, np.dtype(bool), False)
        mask[mask_inner] = True
        valid = np.stack(_offset_views(mask, out, kernel, strides, dil), axis=-1)

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        xp[inner] = ins[0]
        y = outs[0]
        if float_max:  # the op's own rules (small pools only: stacking the taps is cheap)
            taps = np.stack(views, axis=-1)
            y[...] = pool_max(taps, axis=-1, keepdims=False) if valid is None else \
                first_tap_max(taps, valid)[0]
            return
        np.copyto(y, views[0])
        combine = np.maximum if is_max else np.add
        for v in views[1:]:
            combine(y, v, out=y)
        if count is not None:
            np.divide(y, count, out=y)

    return run


def _pool_count(x_shape: tuple, attrs: dict[str, Any], pb: list[int], sizes: list[int],
                out: list[int], strides: list[int], dil: list[int], dtype: np.dtype
                ) -> np.ndarray:
    """AveragePool divisor per output position: real elements (plus explicit pads)."""
    kernel = list(attrs["kernel_shape"])
    mask = np.zeros((1, 1, *sizes), dtype)
    if attrs.get("count_include_pad", 0):
        _, _, pe = window_pads(x_shape[2:], kernel, attrs, True)
        region = tuple(slice(0, d + b + e) for d, b, e in zip(x_shape[2:], pb, pe))
    else:
        region = tuple(slice(b, b + d) for b, d in zip(pb, x_shape[2:]))
    mask[(slice(None), slice(None)) + region] = 1
    views = _offset_views(mask, out, kernel, strides, dil)
    total = np.zeros((1, 1, *out), dtype)
    for v in views:
        total += v
    return total


def _numpy_global_pool(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    n, c = in_types[0][1][:2]
    is_max = attrs.get("_op") == "GlobalMaxPool"

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        x = ins[0].reshape(n, c, -1)
        if is_max:
            outs[0].reshape(n, c)[...] = pool_max(x, axis=2, keepdims=False)
        else:
            np.mean(x, axis=2, out=outs[0].reshape(n, c))

    return run


def _numpy_einsum(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    eq = attrs["equation"]
    probes = [np.empty(t[1], _work_type(t)) for t in in_types if t is not None]
    path, _ = np.einsum_path(eq, *probes, optimize="greedy")
    if len(path) <= 2:  # one contraction: the default path keeps out= zero-copy
        path = False

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        np.einsum(eq, *[x for x in ins if x is not None], out=outs[0], optimize=path)

    return run


def ref_run(op: str, attrs: dict[str, Any]) -> RunFn:
    """The op's NumPy reference, copied into the outputs (ConvTranspose, MaxPool Indices)."""
    ref = ops.get(op).ref

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        for y, r in zip(outs, ref(list(ins), attrs)):
            np.copyto(y, r, casting="unsafe")

    return run


def _numpy_fused_matmul(attrs: dict[str, Any], in_types: list, out_types: list) -> RunFn:
    alpha = attrs.get("alpha", 1.0)
    trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)

    def run(ins: Arrays, outs: Sequence[np.ndarray]) -> None:
        a = np.swapaxes(ins[0], -1, -2) if trans_a else ins[0]
        b = np.swapaxes(ins[1], -1, -2) if trans_b else ins[1]
        np.matmul(a, b, out=outs[0])
        if alpha != 1.0:
            np.multiply(outs[0], np.asarray(alpha, outs[0].dtype), out=outs[0])

    return run


NUMPY_BUILDERS: dict[str, Callable[[dict, list, list], RunFn]] = {
    "FusedMatMul": _numpy_fused_matmul,
    "MatMul": _numpy_matmul,
    "Gemm": _numpy_gemm,
    "Conv": _numpy_conv,
    "MaxPool": lambda a, i, o: _numpy_pool({**a, "_op": "MaxPool"}, i, o),
    "AveragePool": _numpy_pool,
    "GlobalAveragePool": _numpy_global_pool,
    "GlobalMaxPool": lambda a, i, o: _numpy_global_pool({**a, "_op": "GlobalMaxPool"}, i, o),
    "Einsum": _numpy_einsum,
}
