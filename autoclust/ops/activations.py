"""Activation ops (elementwise): Relu and friends, Gelu, PRelu.

Registered through the helpers of autoclust.ops.elementwise; imported by it. Formulas are
written the way onnxruntime's CPU kernels evaluate them, so NaN and +-inf come out the same
(e.g. Softsign(inf) = inf/inf = NaN, Mish(-inf) = -inf * 0 = NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoclust.ops import ELEMENTWISE, InferContext, TypeShape, register
from autoclust.ops.elementwise import (
    F64,
    FLOAT,
    NUMERIC,
    PRELU,
    SIGNED,
    Array,
    Attrs,
    check_dtype,
    check_same_dtype,
    compilable,
    erf,
    finish,
    infer_rule,
    unary,
    upcast,
)

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def hard_sigmoid(x: Array, alpha: float = 0.2, beta: float = 0.5) -> Array:
    """max(0, min(1, alpha*x + beta)); NaN propagates."""
    return np.maximum(0, np.minimum(1, alpha * x + beta))


def softplus(x: Array) -> Array:
    """log(1 + exp(x)) without overflow for large x."""
    return np.logaddexp(0, x)


def gelu(x: Array, approximate: str = "none") -> Array:
    """Gelu (opset 20): exact with erf, or the tanh approximation."""
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2.0)))


def shrink(x: Array, bias: float = 0.0, lambd: float = 0.5) -> Array:
    """Shrink; integer inputs compute in float64 and truncate back (as onnxruntime)."""
    xf = x if x.dtype.kind == "f" else x.astype(F64)
    return np.where(xf < -lambd, xf + bias, np.where(xf > lambd, xf - bias, 0))


def _infer_gelu(ctx: InferContext) -> list[TypeShape]:
    if ctx.attr("approximate", "none") not in ("none", "tanh"):
        raise ctx.fail(f"approximate must be 'none' or 'tanh', got {ctx.attr('approximate')!r}")
    return infer_rule(FLOAT)(ctx)


def _infer_prelu(ctx: InferContext) -> list[TypeShape]:
    # slope broadcasts unidirectionally to X: the output always has X's shape
    check_dtype(ctx, 0, PRELU)
    check_same_dtype(ctx, [0, 1])
    x, s = ctx.shapes[0], ctx.shapes[1]
    if x is not None and s is not None:
        bad = len(s) > len(x) or any(
            isinstance(sd, int) and isinstance(xd, int) and sd not in (1, xd)
            for xd, sd in zip(x[len(x) - len(s):], s))
        if bad:
            raise ctx.fail(f"slope shape {s} does not broadcast to X shape {x}")
    return [(ctx.dtypes[0], x)]


def _ref_prelu(inputs: list[Array | None], attrs: Attrs) -> list[Array]:
    x, slope = inputs[0], inputs[1]
    with np.errstate(all="ignore"):
        y = np.where(upcast(x) < 0, upcast(slope) * upcast(x), upcast(x))
    return [finish(np.broadcast_to(y, x.shape), x.dtype)]


def _relu(x: Array) -> Any:
    return np.maximum(x, 0)


unary("Relu", _relu, SIGNED)
unary("LeakyRelu", lambda x, alpha: np.where(x >= 0, x, alpha * x), alpha=0.01)
unary("Elu", lambda x, alpha: np.where(x >= 0, x, alpha * (np.exp(x) - 1)), alpha=1.0)
unary("Selu", lambda x, alpha, gamma: gamma * np.where(x > 0, x, alpha * (np.exp(x) - 1)),
      alpha=1.67326319217681884765625, gamma=1.05070102214813232421875)
unary("Celu", lambda x, alpha: np.maximum(x, 0) + np.minimum(0, alpha * (np.exp(x / alpha) - 1)),
      alpha=1.0)
unary("Gelu", gelu, infer=_infer_gelu, approximate="none")
unary("Sigmoid", lambda x: 1 / (1 + np.exp(-x)))
unary("HardSigmoid", hard_sigmoid, alpha=0.2, beta=0.5)
unary("HardSwish", lambda x: x * hard_sigmoid(x, 1 / 6, 0.5))
unary("Softplus", softplus)
unary("Softsign", lambda x: x / (1 + np.abs(x)))
unary("Mish", lambda x: x * np.tanh(softplus(x)))
unary("ThresholdedRelu", lambda x, alpha: np.where(x > alpha, x, 0), alpha=1.0)
unary("Shrink", shrink, NUMERIC, bias=0.0, lambd=0.5)
register("PRelu", ELEMENTWISE, _infer_prelu, _ref_prelu, dtypes=compilable(PRELU))
