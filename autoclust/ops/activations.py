"""Activation ops (elementwise): Relu and friends, Gelu, PRelu.

Registered through the helpers of autoclust.ops.elementwise; imported by it. Formulas are
written the way onnxruntime's CPU kernels evaluate them, so NaN and +-inf come out the same
(e.g. Softsign(inf) = inf/inf = NaN, Mish(-inf) = -inf * 0 = NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoclust.kernel.lowering import LowerCtx, cast, const, op, select
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
    pick_max,
    unary,
    upcast,
)
from autoclust.ops.table import ELEMENTWISE, InferContext, TypeShape, register
from autoclust.symbolic import is_dim

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
    # in float32 like onnxruntime (float64 for float64): erf rounds to 1 before 1 + erf, so
    # Gelu(-5.6) is -0.0 there, not the float64 value -5e-8
    ct = F64 if x.dtype == F64 else np.dtype(np.float32)
    xc = x.astype(ct)
    e = erf(xc * ct.type(1 / math.sqrt(2.0))).astype(ct)
    return (ct.type(0.5) * xc * (ct.type(1) + e)).astype(x.dtype)


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
            is_dim(sd) and is_dim(xd) and sd not in (1, xd)
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
    """x where not below 0: Relu(-0.0) is -0.0 and NaN stays, as onnxruntime's."""
    return pick_max(np.zeros((), x.dtype), x)  # the second operand wins a tie


# ---- lowerings (formulas as onnxruntime's CPU kernels evaluate them) --------------------

def _x(ctx: LowerCtx):
    return ctx.operand(0)


def _if_negative(x, if_neg, if_pos=None):
    return select(op("lt", x, const(0, x.dtype)), if_neg, x if if_pos is None else if_pos)


def _exp_minus_one(x):
    return op("sub", op("exp", x), const(1, x.dtype))  # onnxruntime: exp(x) - 1, not expm1


def _hard_sigmoid(x, alpha: float, beta: float):
    y = op("add", op("mul", const(alpha, x.dtype), x), const(beta, x.dtype))
    return op("max", const(0, x.dtype), op("min", const(1, x.dtype), y))


def _softplus(x):
    # max(x, 0) + log1p(exp(-|x|)): no overflow for large x, and exp(x) (not 0) far below 0
    tail = op("log1p", op("exp", op("neg", op("abs", x))))
    return op("add", op("max", x, const(0, x.dtype)), tail)


def _lower_gelu(ctx: LowerCtx):
    x = _x(ctx)
    dt = x.dtype
    half = op("mul", const(0.5, dt), x)
    if ctx.attr("approximate", "none") == "tanh":
        cube = op("mul", op("mul", x, x), x)
        inner = op("add", x, op("mul", const(0.044715, dt), cube))
        t = op("tanh", op("mul", const(_SQRT_2_OVER_PI, dt), inner))
    else:
        t = op("erf", op("mul", x, const(1 / math.sqrt(2), dt)))
    return op("mul", half, op("add", const(1, dt), t))


def _lower_selu(ctx: LowerCtx):
    x = _x(ctx)
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    neg = op("mul", const(alpha, x.dtype), _exp_minus_one(x))
    inner = select(op("gt", x, const(0, x.dtype)), x, neg)
    return op("mul", const(gamma, x.dtype), inner)


def _lower_celu(ctx: LowerCtx):
    x = _x(ctx)
    dt, alpha = x.dtype, ctx.attr("alpha", 1.0)
    neg = op("mul", const(alpha, dt), _exp_minus_one(op("div", x, const(alpha, dt))))
    return op("add", op("max", x, const(0, dt)), op("min", const(0, dt), neg))


def _lower_shrink(ctx: LowerCtx):
    # integer inputs compute in float64 and truncate back, as onnxruntime
    x = _x(ctx)
    xf = x if x.dtype.startswith("float") else cast(x, "float64")
    dt = xf.dtype
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    lo = op("add", xf, const(bias, dt))
    hi = op("sub", xf, const(bias, dt))
    inner = select(op("gt", xf, const(lambd, dt)), hi, const(0, dt))
    return cast(select(op("lt", xf, const(-lambd, dt)), lo, inner), x.dtype)


def _lower_leaky(ctx: LowerCtx):
    x = _x(ctx)
    return _if_negative(x, op("mul", x, const(ctx.attr("alpha", 0.01), x.dtype)))


def _lower_elu(ctx: LowerCtx):
    x = _x(ctx)
    return _if_negative(x, op("mul", const(ctx.attr("alpha", 1.0), x.dtype), _exp_minus_one(x)))


def _lower_thresholded(ctx: LowerCtx):
    x = _x(ctx)
    return select(op("gt", x, const(ctx.attr("alpha", 1.0), x.dtype)), x, const(0, x.dtype))


def _lower_prelu(ctx: LowerCtx):
    x, slope = ctx.operand(0), ctx.operand(1)
    return _if_negative(x, op("mul", x, slope))


def _sigmoid_ref(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) in float64, rounded once to x's type by the caller: NumPy's float32
    exp is not correctly rounded (exp(1.234e-7) one ulp high), which gave Sigmoid(-1.234e-7)
    = 0.49999994 against onnxruntime's 0.49999997, and a comparison downstream flipped
    (fuzz 108/301). The reference serves the interpreter and constant folding."""
    wide = x.astype(np.float64) if x.dtype.itemsize < 8 else x
    return 1 / (1 + np.exp(-wide))


unary("Relu", _relu, SIGNED, lower=lambda c: op("max", const(0, _x(c).dtype), _x(c)),
      facts={"exact": "copy", "groups": ("CONV_EPILOGUE",)})
unary("LeakyRelu", lambda x, alpha: np.where(x >= 0, x, alpha * x), lower=_lower_leaky,
      alpha=0.01, facts={"groups": ("CONV_EPILOGUE",)})
def _exp_minus_one_ref(x: np.ndarray) -> np.ndarray:
    """exp(x) - 1 as the kernels and onnxruntime take it: exp rounded once to x's dtype,
    then the subtraction in it. expm1 gave Elu(-1.4e-26) = -1.4e-26 where every other
    side gives 0 (fuzz 136/1615), and NumPy's float32 exp is a step off onnxruntime's at
    -1e-6, which the subtraction makes a 6% difference."""
    return np.exp(x.astype(np.float64)).astype(x.dtype) - x.dtype.type(1)


unary("Elu", lambda x, alpha: np.where(x >= 0, x, alpha * _exp_minus_one_ref(x)),
      lower=_lower_elu, cost=4, alpha=1.0)
unary("Selu", lambda x, alpha, gamma: gamma * np.where(x > 0, x, alpha * _exp_minus_one_ref(x)),
      lower=_lower_selu, cost=4, alpha=1.67326319217681884765625,
      gamma=1.05070102214813232421875)
unary("Celu", lambda x, alpha: np.maximum(x, 0) + np.minimum(
      0, alpha * _exp_minus_one_ref(x / x.dtype.type(alpha))), lower=_lower_celu, cost=4,
      alpha=1.0)
unary("Gelu", gelu, infer=_infer_gelu, lower=_lower_gelu, cost=4, approximate="none")
unary("Sigmoid", _sigmoid_ref, lower=lambda c: op("sigmoid", _x(c)), cost=4,
      facts={"groups": ("CONV_EPILOGUE",)})
unary("HardSigmoid", hard_sigmoid,
      lower=lambda c: _hard_sigmoid(_x(c), c.attr("alpha", 0.2), c.attr("beta", 0.5)),
      alpha=0.2, beta=0.5, facts={"groups": ("CONV_EPILOGUE",)})
unary("HardSwish", lambda x: x * hard_sigmoid(x, 1 / 6, 0.5),
      lower=lambda c: op("mul", _x(c), _hard_sigmoid(_x(c), 1 / 6, 0.5)))
unary("Softplus", softplus, lower=lambda c: _softplus(_x(c)), cost=4)
unary("Softsign", lambda x: x / (1 + np.abs(x)),
      lower=lambda c: op("div", _x(c), op("add", const(1, _x(c).dtype), op("abs", _x(c)))))
unary("Mish", lambda x: x * np.tanh(softplus(x)),
      lower=lambda c: op("mul", _x(c), op("tanh", _softplus(_x(c)))), cost=4)
unary("ThresholdedRelu", lambda x, alpha: np.where(x > alpha, x, 0), lower=_lower_thresholded,
      alpha=1.0)
unary("Shrink", shrink, NUMERIC, lower=_lower_shrink, bias=0.0, lambd=0.5)
unary("Swish", lambda x, alpha: x / (1 + np.exp(-alpha * x)),  # opset 24: x * sigmoid(a*x)
      lower=lambda c: op("mul", _x(c), op("sigmoid", op("mul", const(c.attr("alpha", 1.0),
                                                                 _x(c).dtype), _x(c)))),
      cost=4, alpha=1.0)
register("PRelu", ELEMENTWISE, _infer_prelu, _ref_prelu, lower=_lower_prelu,
         dtypes=compilable(PRELU))
