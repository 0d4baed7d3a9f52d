"""QuantizeLinear and DequantizeLinear (opset 21 forms), fused with their neighbours.

Values are stored as int8/uint8/int16/uint16 and computed in float32 (the CPU backend loads
narrow integers into int32: see backends/cpu/codegen.py NARROW_INTS), so a
DequantizeLinear -> float ops -> QuantizeLinear chain is one kernel reading and writing
bytes. Per-tensor and per-axis scales compile; blocked quantization (block_size) and the
float8/int4 outputs stay in onnxruntime.

Semantics are onnxruntime's CPU kernels (MLAS), checked in tests/ops/test_quantize.py:
QuantizeLinear computes v = x / scale, clamps v to [qmin - zp, qmax - zp] with a NaN
becoming the lower bound (x86 maxps), rounds half to even, then adds zp; DequantizeLinear
computes (x - zp) in int32 and multiplies by the scale in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoclust.kernel.lowering import LowerCtx, cast, const, op, select
from autoclust.ops.table import (
    ELEMENTWISE,
    Arrays,
    InferContext,
    TypeShape,
    normalize_axis,
    register,
)
from autoclust.symbolic import is_dim

F32 = np.dtype("float32")
QUANT_TYPES = tuple(np.dtype(t) for t in ("int8", "uint8", "int16", "uint16"))
_DTYPES = frozenset(QUANT_TYPES + (F32, np.dtype("float16"), np.dtype("int32")))


def _check_params(ctx: InferContext) -> None:
    x, scale = ctx.shapes[0], ctx.shapes[1]
    if ctx.attr("block_size", 0):
        if x is not None and scale is not None and len(scale) != len(x):
            raise ctx.fail(f"blocked scale shape {list(scale)} must have input rank {len(x)}")
        return
    if x is None or scale is None or len(scale) == 0 or scale == (1,):
        return
    if len(scale) != 1:
        raise ctx.fail(f"scale shape {list(scale)}: expected a scalar, [1] or [C] "
                       "(per-axis) without block_size")
    axis = normalize_axis(int(ctx.attr("axis", 1)), len(x), ctx)
    if is_dim(scale[0]) and is_dim(x[axis]) and scale[0] != x[axis]:
        raise ctx.fail(f"scale shape {list(scale)} does not match input dim {axis} "
                       f"({x[axis]}) of shape {list(x)}")
    zp = ctx.shapes[2] if ctx.has(2) else None
    if zp is not None and tuple(zp) != tuple(scale):
        raise ctx.fail(f"zero point shape {list(zp)} differs from scale shape {list(scale)}")


def _infer_quantize(ctx: InferContext) -> list[TypeShape]:
    _check_params(ctx)
    if ctx.has(2):
        out = ctx.dtypes[2]
    else:
        code = int(ctx.attr("output_dtype", 0) or 0)
        out = np.dtype("uint8") if code == 0 else _np_dtype(ctx, code)
    if ctx.dtypes[1] != ctx.dtypes[0] and ctx.dtypes[0] != np.dtype("int32"):
        raise ctx.fail(f"scale dtype {ctx.dtypes[1]} differs from input dtype {ctx.dtypes[0]}")
    return [(out, ctx.shapes[0])]


def _infer_dequantize(ctx: InferContext) -> list[TypeShape]:
    _check_params(ctx)
    if ctx.has(2) and ctx.dtypes[2] != ctx.dtypes[0]:
        raise ctx.fail(f"zero point dtype {ctx.dtypes[2]} differs from input dtype "
                       f"{ctx.dtypes[0]}")
    return [(ctx.dtypes[1], ctx.shapes[0])]


def _np_dtype(ctx: InferContext, code: int) -> np.dtype:
    from onnx import helper
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, TypeError, ValueError):
        raise ctx.fail(f"output_dtype {code} is not a tensor type NumPy holds") from None


def _bounds(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _per_axis(p: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast against x (per tensor or along axis)."""
    if p.size == 1:
        return p.reshape(())
    shape = [1] * x.ndim
    shape[normalize_axis(axis, x.ndim)] = -1
    return p.reshape(shape)


def _blocked(attrs: dict[str, Any]) -> None:
    if attrs.get("block_size", 0):
        from autoclust.errors import UnsupportedOpError
        raise UnsupportedOpError("blocked quantization (block_size) has no NumPy reference "
                                 "here; onnxruntime runs it")


def _quantize_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    _blocked(attrs)
    x, scale = inputs[0], inputs[1]
    zp_in = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    out = zp_in.dtype if zp_in is not None else (
        np.dtype(_np_code(attrs)) if attrs.get("output_dtype") else np.dtype("uint8"))
    axis = int(attrs.get("axis", 1))
    zp = np.zeros((), np.int32) if zp_in is None else _per_axis(zp_in, x, axis).astype(np.int32)
    qmin, qmax = _bounds(out)
    with np.errstate(all="ignore"):
        v = x.astype(F32) / _per_axis(scale, x, axis).astype(F32)
        lo, hi = (qmin - zp).astype(F32), (qmax - zp).astype(F32)
        v = np.where(v > lo, v, lo)  # NaN -> lo, as maxps
        v = np.where(v < hi, v, hi)
        q = np.round(v).astype(np.int32) + zp
    return [q.astype(out)]


def _np_code(attrs: dict[str, Any]) -> Any:
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(int(attrs["output_dtype"]))


def _dequantize_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    _blocked(attrs)
    x, scale = inputs[0], inputs[1]
    axis = int(attrs.get("axis", 1))
    zp = 0 if len(inputs) < 3 or inputs[2] is None else \
        _per_axis(inputs[2], x, axis).astype(np.int64)
    with np.errstate(all="ignore"):
        diff = (x.astype(np.int64) - zp).astype(np.int32)  # int32 arithmetic, wrapping
        y = diff.astype(F32) * _per_axis(scale, x, axis).astype(F32)
    return [y.astype(scale.dtype)]


def _param(ctx: LowerCtx, i: int):
    """Input i (scale or zero point) at this element: per tensor or along `axis`."""
    shape = ctx.in_shape(i)
    if int(ctx.attr("block_size", 0) or 0):
        ctx.refuse("blocked quantization (block_size) stays in onnxruntime")
    if len(shape) == 0 or shape == (1,):
        return ctx.value(i, tuple(ctx.zero() for _ in shape))
    axis = normalize_axis(int(ctx.attr("axis", 1)), len(ctx.shape))
    return ctx.value(i, (ctx.idx[axis],))


def _lower_quantize(ctx: LowerCtx):
    out = ctx.dtype
    qmin, qmax = _bounds(np.dtype(out))
    zp = cast(_param(ctx, 2), "int32") if ctx.has(2) else const(0, "int32")
    # a true division (not x * (1/scale)): onnxruntime rounds x / scale, 1 ulp moves a tie
    v = op("div_exact", cast(ctx.value(0, ctx.idx), "float32"),
           cast(_param(ctx, 1), "float32"))
    lo = cast(op("sub", const(qmin, "int32"), zp), "float32")
    hi = cast(op("sub", const(qmax, "int32"), zp), "float32")
    v = select(op("gt", v, lo), v, lo)  # NaN -> lo, as onnxruntime (x86 maxps)
    v = select(op("lt", v, hi), v, hi)
    q = op("add", cast(op("round", v), "int32"), zp)
    return cast(q, out)


def _lower_dequantize(ctx: LowerCtx):
    x = cast(ctx.value(0, ctx.idx), "int32")
    if ctx.has(2):
        x = op("sub", x, cast(_param(ctx, 2), "int32"))
    # rounded before whatever consumes it: an FMA with a following Add moves ties
    # (0.25000018 instead of 0.25, one quantization step after a QuantizeLinear)
    y = op("mul_exact", cast(x, "float32"), cast(_param(ctx, 1), "float32"))
    return y


def _refuses(node: Any, graph: Any) -> str | None:
    if node.attrs.get("block_size", 0):
        return "blocked quantization (block_size) stays in onnxruntime"
    return None


register("QuantizeLinear", ELEMENTWISE, _infer_quantize, _quantize_ref,
         lower=_lower_quantize, dtypes=_DTYPES, refuses=_refuses,
         doc="QuantizeLinear(x, y_scale, y_zero_point?) = saturate(round(x / scale) + zp); "
             "axis (per-axis scales), output_dtype (opset 21).")
register("DequantizeLinear", ELEMENTWISE, _infer_dequantize, _dequantize_ref,
         lower=_lower_dequantize, dtypes=_DTYPES, refuses=_refuses,
         doc="DequantizeLinear(x, x_scale, x_zero_point?) = (x - zp) * scale; axis.")
