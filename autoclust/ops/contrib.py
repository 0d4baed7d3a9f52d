"""onnxruntime's contrib ops that exporters and onnxruntime's own optimizer emit.

com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu (elementwise), SkipLayerNormalization,
SkipSimplifiedLayerNormalization (normalization rows over input + skip + bias), the
default-domain SimplifiedLayerNormalization (onnxruntime registers this RMSNorm under the
ONNX domain), and com.microsoft Attention, which keeps onnxruntime's fused kernel: it has a
type rule, so everything after it still clusters, and a NumPy reference for the plain
forms, but no lowering. FusedMatMul lives with the library calls (autoclust/ops/library.py).

Formulas follow onnxruntime's CPU kernels (checked against them in tests/ops/test_contrib_ops.py):
the Gelu family computes x * (...) so -inf gives NaN as there; the Skip norms' optional
outputs are the row mean (0 for the simplified form, which has none), 1/sqrt(var + eps)
and the sum input + skip + bias; mean and inv_std are float32 for float16 inputs.
One deliberate difference: the Skip norms' variance takes two passes, as LayerNormalization's
does here; onnxruntime's kernel takes one (E[x^2] - E[x]^2 in float32), which overflows on a
row holding 1e20 (its outputs for that row are 0 or garbage; ours are the exact ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from autoclust.errors import UnsupportedOpError
from autoclust.kernel.lowering import LowerCtx, cast, const, op
from autoclust.ops.activations import gelu
from autoclust.ops.elementwise import FLOAT, check_dtype, compilable, upcast
from autoclust.ops.normalization import check_params, scaled_moments
from autoclust.ops.table import (
    ELEMENTWISE,
    NORMALIZATION,
    Arrays,
    InferContext,
    TypeShape,
    normalize_axis,
    register,
)
from autoclust.symbolic import is_dim

MS = "com.microsoft"
F32 = np.dtype("float32")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# ---- Gelu family --------------------------------------------------------------------------

def _infer_biased(ctx: InferContext) -> list[TypeShape]:
    """X (and an optional bias over X's last dim) -> X's type."""
    check_dtype(ctx, 0, FLOAT)
    x = ctx.shapes[0]
    if ctx.has(1):
        if ctx.dtypes[1] != ctx.dtypes[0]:
            raise ctx.fail(f"bias dtype {ctx.dtypes[1]} differs from input dtype "
                           f"{ctx.dtypes[0]}")
        b = ctx.shapes[1]
        if x is not None and b is not None and (len(b) != 1 or not x or
                                                 _differs(b[0], x[-1])):
            raise ctx.fail(f"bias shape {list(b)} must be [{x[-1] if x else '?'}] "
                           f"(the input's last dim; input shape {list(x)})")
    return [(ctx.dtypes[0], x)]


def _differs(a: Any, b: Any) -> bool:
    return is_dim(a) and is_dim(b) and a != b


def _biased_ref(fn: Callable[..., np.ndarray]) -> Callable[[Arrays, dict], list[np.ndarray]]:
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        with np.errstate(all="ignore"):
            t = upcast(x)
            if len(inputs) > 1 and inputs[1] is not None:
                t = t + upcast(inputs[1])
            return [np.asarray(fn(t, attrs)).astype(x.dtype)]
    return ref


def _biased_operand(ctx: LowerCtx):
    """Input 0 plus the optional bias (broadcast over the last dim), in compute dtype."""
    x = ctx.operand(0)
    return op("add", x, ctx.operand(1)) if ctx.has(1) else x


def _tanh_gelu(x):
    dt = x.dtype
    cube = op("mul", op("mul", x, x), x)
    inner = op("add", x, op("mul", const(0.044715, dt), cube))
    t = op("tanh", op("mul", const(_SQRT_2_OVER_PI, dt), inner))
    return op("mul", op("mul", const(0.5, dt), x), op("add", const(1, dt), t))


def _erf_gelu(x):
    dt = x.dtype
    t = op("erf", op("mul", x, const(1 / math.sqrt(2), dt)))
    return op("mul", op("mul", const(0.5, dt), x), op("add", const(1, dt), t))


def _quick_gelu(x, alpha: float):
    return op("mul", x, op("sigmoid", op("mul", x, const(alpha, x.dtype))))


def _quick_gelu_ref(t: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    alpha = np.asarray(attrs.get("alpha", 1.702), t.dtype)
    return t * (1 / (1 + np.exp(-alpha * t)))


_DTYPES = compilable(FLOAT)
for _name, _ref, _lower, _doc in (
        ("Gelu", lambda t, a: gelu(t), lambda c: _erf_gelu(_biased_operand(c)),
         "Gelu(X) = 0.5 x (1 + erf(x / sqrt 2)) (com.microsoft)."),
        ("BiasGelu", lambda t, a: gelu(t), lambda c: _erf_gelu(_biased_operand(c)),
         "BiasGelu(X, bias) = Gelu(X + bias) (com.microsoft)."),
        ("FastGelu", lambda t, a: gelu(t, "tanh"), lambda c: _tanh_gelu(_biased_operand(c)),
         "FastGelu(X, bias?) = tanh-approximated Gelu of X + bias (com.microsoft)."),
        ("QuickGelu", _quick_gelu_ref,
         lambda c: _quick_gelu(_biased_operand(c), c.attr("alpha", 1.702)),
         "QuickGelu(X) = x * sigmoid(alpha x), alpha 1.702 (com.microsoft).")):
    register(_name, ELEMENTWISE, _infer_biased, _biased_ref(_ref), domain=MS, lower=_lower,
             cost=4, dtypes=_DTYPES, doc=_doc)


# ---- SkipLayerNormalization, SkipSimplifiedLayerNormalization ----------------------------

def _infer_skip_norm(ctx: InferContext) -> list[TypeShape]:
    """(input, skip, gamma, beta?, bias?) -> (output, mean?, inv_std?, input_skip_bias_sum?)."""
    check_dtype(ctx, 0, FLOAT)
    x, dt = ctx.shapes[0], ctx.dtypes[0]
    for i in range(1, len(ctx.dtypes)):
        if ctx.has(i) and ctx.dtypes[i] != dt:
            raise ctx.fail(f"input {i} dtype {ctx.dtypes[i]} differs from input dtype {dt}")
    if x is not None:
        if len(x) < 2:
            raise ctx.fail(f"input must have rank >= 2, got shape {list(x)}")
        skip = ctx.shapes[1]
        if skip is not None and (len(skip) > len(x) or any(
                _differs(s, d) and s != 1 for s, d in zip(skip[::-1], x[::-1]))):
            raise ctx.fail(f"skip shape {list(skip)} does not broadcast to input {list(x)}")
        for i in (2, 3, 4):
            v = ctx.shapes[i] if ctx.has(i) else None
            if v is not None and (len(v) != 1 or _differs(v[0], x[-1])):
                raise ctx.fail(f"input {i} shape {list(v)} must be [{x[-1]}]")
    stat = None if x is None else tuple(x[:-1]) + (1,)
    return [(dt, x), (F32, stat), (F32, stat), (dt, x)]


def _skip_sum(inputs: Arrays, with_beta: bool) -> np.ndarray:
    t = inputs[0].astype(F32) + inputs[1].astype(F32)
    bias_at = 4 if with_beta else 3
    if len(inputs) > bias_at and inputs[bias_at] is not None:
        t = t + inputs[bias_at].astype(F32)
    return t


def _skip_norm_ref(simplified: bool) -> Callable[[Arrays, dict], list[np.ndarray]]:
    def ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
        x = inputs[0]
        eps = np.float32(attrs.get("epsilon", 1e-12))
        with np.errstate(all="ignore"):
            t = _skip_sum(inputs, not simplified)
            t_out = t.astype(x.dtype).astype(F32)  # the sum is stored, then normalized
            if simplified:
                mean = np.zeros(t.shape[:-1] + (1,), F32)
                inv = 1 / np.sqrt(np.mean(t_out * t_out, axis=-1, keepdims=True) + eps)
                y = t_out * inv * inputs[2].astype(F32)
            else:  # statistics in float64, as LayerNormalization's
                wide = t_out.astype(np.float64)
                mean = np.mean(wide, axis=-1, keepdims=True)
                var = np.mean(np.square(wide - mean), axis=-1, keepdims=True)
                inv = 1 / np.sqrt(var + float(eps))
                y = ((wide - mean) * inv).astype(F32) * inputs[2].astype(F32)
                if len(inputs) > 3 and inputs[3] is not None:
                    y = y + inputs[3].astype(F32)
        return [y.astype(x.dtype), mean.astype(F32), inv.astype(F32), t.astype(x.dtype)]
    return ref


def _at(ctx: LowerCtx, i: int, ix: tuple, ct: str):
    """Input i broadcast against input 0 (trailing dims) at index ix, in ct."""
    shape = ctx.in_shape(i)
    lead = len(ctx.in_shape(0)) - len(shape)
    idx = tuple(ctx.zero() if d == 1 else ix[k + lead] for k, d in enumerate(shape))
    return cast(ctx.value(i, idx), ct)


def _lower_skip_norm(simplified: bool) -> Callable[[LowerCtx], Any]:
    def lower(ctx: LowerCtx):
        shape = ctx.in_shape(0)
        rank = len(shape)
        ct = "float64" if ctx.in_dtype(0) == "float64" else "float32"
        store = ctx.in_dtype(0)
        bias_at = 3 if simplified else 4

        def total(ix: tuple):
            s = op("add", _at(ctx, 0, ix, ct), _at(ctx, 1, ix, ct))
            if ctx.has(bias_at):
                s = op("add", s, _at(ctx, bias_at, ix, ct))
            return s

        def stored(ix: tuple):  # the sum as the sum output holds it (float16 rounds)
            s = total(ix)
            return s if store == ct else cast(cast(s, store), ct)

        if ctx.out == 3:
            return total(ctx.idx)
        kept = {d: ctx.idx[d] for d in range(rank - 1)}
        eps = ctx.attr("epsilon", 1e-12)
        if simplified:
            n = shape[-1]
            sq = ctx.reduce("sum", shape, [rank - 1], kept,
                            lambda ix: op("mul", stored(ix), stored(ix)), ct)
            mean = const(0, ct)
            inv = op("div", const(1, ct),
                     op("sqrt", op("add", op("div", sq, const(n, ct)), const(eps, ct))))

            def normalized(ix: tuple):
                return op("mul", stored(ix), inv)
        else:  # LayerNormalization's float32 statistics: no overflow, exact mean
            mean, inv, normalized = scaled_moments(ctx, shape, [rank - 1], kept, stored, ct,
                                                   eps)
        if ctx.out == 1:
            return cast(mean, ctx.dtype)
        if ctx.out == 2:
            return cast(inv, ctx.dtype)
        y = op("mul", normalized(ctx.idx), _at(ctx, 2, ctx.idx, ct))
        if not simplified and ctx.has(3):
            y = op("add", y, _at(ctx, 3, ctx.idx, ct))
        return y
    return lower


register("SkipLayerNormalization", NORMALIZATION, _infer_skip_norm, _skip_norm_ref(False),
         domain=MS, lower=_lower_skip_norm(False), dtypes=_DTYPES,
         doc="SkipLayerNormalization(input, skip, gamma, beta?, bias?) -> (output, mean?, "
             "inv_std_var?, input_skip_bias_sum?): LayerNorm of input + skip + bias over the "
             "last dim, epsilon 1e-12 (com.microsoft).")
register("SkipSimplifiedLayerNormalization", NORMALIZATION, _infer_skip_norm,
         _skip_norm_ref(True), domain=MS, lower=_lower_skip_norm(True), dtypes=_DTYPES,
         doc="SkipSimplifiedLayerNormalization(input, skip, gamma, bias?) -> (output, mean?, "
             "inv_std_var?, input_skip_bias_sum?): RMSNorm of input + skip + bias "
             "(com.microsoft).")


# ---- SimplifiedLayerNormalization (onnxruntime's RMSNorm, ONNX domain) --------------------

def _infer_simplified(ctx: InferContext) -> list[TypeShape]:
    check_dtype(ctx, 0, FLOAT)
    check_params(ctx, (1,))
    x = ctx.shapes[0]
    stat = None
    if x is not None:
        axis = normalize_axis(int(ctx.attr("axis", -1)), len(x), ctx)
        stat = tuple(x[:axis]) + (1,) * (len(x) - axis)
    stash = F32 if ctx.attr("stash_type", 1) == 1 else ctx.dtypes[0]
    return [(ctx.dtypes[0], x), (stash, stat)]


def _simplified_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    x, scale = inputs[0], inputs[1]
    axes = tuple(range(normalize_axis(int(attrs.get("axis", -1)), x.ndim), x.ndim))
    stash = F32 if attrs.get("stash_type", 1) == 1 else x.dtype
    ct = np.promote_types(stash, upcast(x).dtype)
    with np.errstate(all="ignore"):
        xs = x.astype(ct)
        inv = 1 / np.sqrt(np.mean(xs * xs, axis=axes, keepdims=True) +
                          np.asarray(attrs.get("epsilon", 1e-5), ct))
        return [(xs * inv * scale.astype(ct)).astype(x.dtype), inv.astype(stash)]


def _lower_simplified(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    rank = len(shape)
    axis = normalize_axis(int(ctx.attr("axis", -1)), rank)
    axes = list(range(axis, rank))
    ct = "float64" if ctx.in_dtype(0) == "float64" else "float32"
    n = math.prod(shape[a] for a in axes)

    def load(ix: tuple):
        return cast(ctx.value(0, ix), ct)

    sq = ctx.reduce("sum", shape, axes, {d: ctx.idx[d] for d in range(axis)},
                    lambda ix: op("mul", load(ix), load(ix)), ct)
    eps = const(ctx.attr("epsilon", 1e-5), ct)
    inv = op("div", const(1, ct), op("sqrt", op("add", op("div", sq, const(n, ct)), eps)))
    if ctx.out == 1:
        return cast(inv, ctx.dtype)
    return op("mul", op("mul", load(ctx.idx), inv), _at(ctx, 1, ctx.idx, ct))


register("SimplifiedLayerNormalization", NORMALIZATION, _infer_simplified, _simplified_ref,
         lower=_lower_simplified, dtypes=_DTYPES,
         doc="SimplifiedLayerNormalization(X, scale) -> (Y, inv_std_var?): onnxruntime's "
             "RMSNorm, registered in the ONNX domain; epsilon 1e-5.")


# ---- Attention (com.microsoft): typed, left to onnxruntime's fused kernel ----------------

def _infer_attention(ctx: InferContext) -> list[TypeShape]:
    """input [B, S, D], weights [D, Dq + Dk + Dv], bias -> output [B, S, Dv], present?"""
    check_dtype(ctx, 0, FLOAT)
    x, w = ctx.shapes[0], ctx.shapes[1]
    sizes = ctx.attr("qkv_hidden_sizes")
    v_hidden = None
    if sizes:
        v_hidden = int(sizes[2])
    elif w is not None and is_dim(w[1]):
        if w[1] % 3:
            raise ctx.fail(f"weights shape {list(w)}: last dim not divisible by 3 and no "
                           "qkv_hidden_sizes")
        v_hidden = w[1] // 3
    if x is not None and len(x) != 3:
        raise ctx.fail(f"input must be [batch, sequence, hidden], got shape {list(x)}")
    out = None if x is None else (x[0], x[1], v_hidden)
    heads = int(ctx.attr("num_heads", 0) or 0)
    if heads <= 0:
        raise ctx.fail("num_heads attribute must be positive")
    present = None
    past = ctx.shapes[4] if ctx.has(4) else None
    if x is not None and v_hidden is not None and not sizes:
        total = x[1] if past is None else (
            past[3] + x[1] if is_dim(past[3]) and is_dim(x[1]) else None)
        present = (2, x[0], heads, total, v_hidden // heads)
    return [(ctx.dtypes[0], out), (ctx.dtypes[0], present)]


def _attention_ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    """The plain form: no past, mask absent or [B, S] of 1 (keep) / 0 (mask out)."""
    x, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    extra = [i for i in range(4, len(inputs)) if inputs[i] is not None]
    mask = inputs[3] if len(inputs) > 3 else None
    if extra or attrs.get("qkv_hidden_sizes") or (mask is not None and mask.ndim != 2):
        raise UnsupportedOpError("Attention reference: only the plain form (no past, no "
                                 "attention bias, mask absent or [batch, sequence])")
    heads = int(attrs["num_heads"])
    xs = upcast(x).astype(np.float32)
    qkv = xs @ w.astype(np.float32) + (0 if b is None else b.astype(np.float32))
    bsz, seq, _ = x.shape
    hidden = qkv.shape[-1] // 3
    q, k, v = (qkv[..., i * hidden:(i + 1) * hidden].reshape(bsz, seq, heads, -1)
               .transpose(0, 2, 1, 3) for i in range(3))
    scale = attrs.get("scale") or 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(0, 1, 3, 2) * np.float32(scale)
    if mask is not None:
        scores = scores + np.where(mask[:, None, None, :] == 0,
                                   np.float32(attrs.get("mask_filter_value", -10000.0)), 0)
    if attrs.get("unidirectional", 0):
        upper = np.triu(np.ones((seq, seq), bool), 1)
        scores = np.where(upper, np.float32(-10000.0), scores)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, hidden)
    present = np.stack([k, v]).astype(x.dtype)
    return [out.astype(x.dtype), present]


register("Attention", NORMALIZATION, _infer_attention, _attention_ref, domain=MS,
         refuse="Attention keeps onnxruntime's fused kernel (com.microsoft)",
         doc="Attention(input, weights, bias, mask_index?, past?, ...) -> (output, present?): "
             "typed so the nodes after it cluster; runs in onnxruntime (com.microsoft).")
