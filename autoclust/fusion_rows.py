"""Lowering of reductions and normalizations to row-kernel phases, and the full table.

Each op asks the kernel builder for reduction phases over its reduced axes
(`builder.reduce`) and combines their results in an elementwise expression:

    LayerNorm:  r0 = sum(x); mean = r0 / n
                r1 = sum((x - mean)^2); y = (x - mean) / sqrt(r1 / n + eps) * scale + bias
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from autoclust import kernel_ir as kir
from autoclust.fusion_lower import (
    CONST_INPUTS,
    cast,
    compute_dtype,
    const,
    delinearize,
    elementwise_lowerings,
    op,
)
from autoclust.ir import Graph, Node, Value
from autoclust.kernel_ir import Affine

SUPPORTED_DTYPES = frozenset({"float16", "float32", "float64", "int32", "int64", "bool"})
FLOAT_ONLY = frozenset({"Pow", "ReduceLogSumExp", "ReduceL2", "ReduceLogSum", "Softmax",
                        "LogSoftmax", "LayerNormalization", "BatchNormalization",
                        "InstanceNormalization", "ReduceMean"})


def _axes_of(b, node: Node, rank: int) -> list[int] | None:
    """Reduced axes (sorted, non-negative); None for a no-op reduction."""
    axes = None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = [int(a) for a in np.asarray(b.graph.constant_value(node.inputs[1])).ravel()]
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(a + rank if a < 0 else a for a in axes)


def _kept(idx: tuple[Affine, ...], rank: int, axes: list[int], keepdims: bool) -> dict:
    """Map each kept dim of the reduced input to its index in the output."""
    kept_dims = [d for d in range(rank) if d not in axes]
    if keepdims:
        return {d: idx[d] for d in kept_dims}
    return dict(zip(kept_dims, idx))


def _loaded(x: Value, ct: str) -> Callable:
    return lambda b, ix: cast(b.expr(x, ix), ct)


def _count(x: Value, axes: list[int]) -> int:
    return int(np.prod([x.shape[a] for a in axes], dtype=np.int64))


# Reduce ops: (phase kind, element transform, finish(result, count, dtype)).
_REDUCE: dict[str, tuple] = {
    "ReduceSum": ("sum", None, None),
    "ReduceMean": ("sum", None, lambda r, n, ct: op("div", r, const(n, ct)) if n else r),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceL1": ("sum", lambda e: op("abs", e), None),
    "ReduceL2": ("sum", lambda e: op("mul", e, e), lambda r, n, ct: op("sqrt", r)),
    "ReduceLogSum": ("sum", None, lambda r, n, ct: op("log", r)),
    "ReduceSumSquare": ("sum", lambda e: op("mul", e, e), None),
}


def _reduce(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
    x, out = node.inputs[0], node.outputs[0]
    rank, ct = len(x.shape), compute_dtype(out.dtype.name)
    axes = _axes_of(b, node, rank)
    if axes is None:
        return b.expr(x, idx)
    kind, pre, finish = _REDUCE.get(node.op, (None, None, None))
    if not axes:  # 0-d input: reducing nothing applies the element transform only
        e = _loaded(x, ct)(b, idx)
        e = pre(e) if pre else e
        return cast(finish(e, 1, ct) if finish else e, out.dtype.name)
    kept = _kept(idx, rank, axes, node.attr("keepdims", 1))
    if node.op == "ReduceLogSumExp":
        return cast(_logsumexp(b, out, x, axes, kept, ct), out.dtype.name)
    element = _loaded(x, ct)
    if pre:
        element = _then(element, pre)
    r = b.reduce(out, kind, x, axes, kept, element, ct)
    if finish:
        r = finish(r, _count(x, axes), ct)
    return cast(r, out.dtype.name)


def _then(element: Callable, fn: Callable) -> Callable:
    return lambda b, ix: fn(element(b, ix))


def _finite_max(b, out, x, axes, kept, ct) -> kir.Expr:
    m = b.reduce(out, "max", x, axes, kept, _loaded(x, ct), ct)
    # An all -inf (or +inf) row would give inf - inf = NaN: shift by 0 instead.
    return op("select", op("eq", op("abs", m), const(math.inf, ct)), const(0, ct), m)


def _logsumexp(b, out, x, axes, kept, ct) -> kir.Expr:
    m = _finite_max(b, out, x, axes, kept, ct)
    s = b.reduce(out, "sum", x, axes, kept,
                 lambda bb, ix: op("exp", op("sub", _loaded(x, ct)(bb, ix), m)), ct)
    return op("add", op("log", s), m)


def _arg(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
    x, out = node.inputs[0], node.outputs[0]
    rank = len(x.shape)
    if rank == 0:
        return const(0, "int64")
    axis = node.attr("axis", 0)
    axis = axis + rank if axis < 0 else axis
    kind = "argmax" if node.op == "ArgMax" else "argmin"
    if node.attr("select_last_index", 0):
        kind += "_last"
    kept = _kept(idx, rank, [axis], node.attr("keepdims", 1))
    ct = compute_dtype(x.dtype.name)
    return b.reduce(out, kind, x, [axis], kept, _loaded(x, ct), "int64")


def _softmax(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
    x, out = node.inputs[0], node.outputs[0]
    rank, ct = len(x.shape), compute_dtype(out.dtype.name)
    axis = node.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    kept = {d: idx[d] for d in range(rank) if d != axis}
    m = b.reduce(out, "max", x, [axis], kept, _loaded(x, ct), ct)
    load = _loaded(x, ct)
    s = b.reduce(out, "sum", x, [axis], kept,
                 lambda bb, ix: op("exp", op("sub", load(bb, ix), m)), ct)
    shifted = op("sub", load(b, idx), m)
    if node.op == "LogSoftmax":
        return cast(op("sub", shifted, op("log", s)), out.dtype.name)
    # One division per row, a multiply per element.
    return cast(op("mul", op("exp", shifted), op("div", const(1, ct), s)), out.dtype.name)


def _moments(b, out: Value, x: Value, axes: list[int], kept: dict, ct: str,
             eps: float) -> tuple[kir.Expr, kir.Expr]:
    """(mean, 1/sqrt(var + eps)) of the row, variance in two passes for accuracy."""
    n = _count(x, axes)
    load = _loaded(x, ct)
    mean = op("div", b.reduce(out, "sum", x, axes, kept, load, ct), const(n, ct))
    sq = b.reduce(out, "sum", x, axes, kept,
                  lambda bb, ix: _square(op("sub", load(bb, ix), mean)), ct)
    var = op("div", sq, const(n, ct))
    inv = op("div", const(1, ct), op("sqrt", op("add", var, const(eps, ct))))
    return mean, inv


def _square(e: kir.Expr) -> kir.Expr:
    return op("mul", e, e)


def _layernorm(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
    x = node.inputs[0]
    out = node.outputs[k]
    rank = len(x.shape)
    axis = node.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    ct = "float32" if x.dtype.name == "float16" else compute_dtype(x.dtype.name)
    kept = {d: idx[d] for d in range(axis)}
    mean, inv = _moments(b, out, x, axes, kept, ct, node.attr("epsilon", 1e-5))
    if k == 1:
        return cast(mean, out.dtype.name)
    if k == 2:
        return cast(inv, out.dtype.name)
    y = op("mul", op("sub", _loaded(x, ct)(b, idx), mean), inv)
    y = op("mul", y, cast(b.operand_to(node.inputs[1], idx, x.shape), ct))
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        y = op("add", y, cast(b.operand_to(node.inputs[2], idx, x.shape), ct))
    return cast(y, out.dtype.name)


def _channel(b, v: Value, idx: tuple[Affine, ...], ct: str) -> kir.Expr:
    """Per-channel parameter v[C] at the channel (dim 1) of idx."""
    return cast(b.expr(v, (idx[1],) if v.shape[0] != 1 else (kir.constant(0, b.rank),)), ct)


def _instancenorm(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
    x, out = node.inputs[0], node.outputs[0]
    rank, ct = len(x.shape), compute_dtype(out.dtype.name)
    axes = list(range(2, rank))
    kept = {0: idx[0], 1: idx[1]}
    mean, inv = _moments(b, out, x, axes, kept, ct, node.attr("epsilon", 1e-5))
    y = op("mul", op("sub", _loaded(x, ct)(b, idx), mean), inv)
    y = op("add", op("mul", y, _channel(b, node.inputs[1], idx, ct)),
           _channel(b, node.inputs[2], idx, ct))
    return cast(y, out.dtype.name)


def _batchnorm(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
    x, out = node.inputs[0], node.outputs[0]
    ct = compute_dtype(out.dtype.name)
    scale, bias, mean, var = (_channel(b, v, idx, ct) for v in node.inputs[1:5])
    inv = op("div", const(1, ct), op("sqrt", op("add", var, const(node.attr("epsilon", 1e-5),
                                                                   ct))))
    y = op("mul", op("sub", _loaded(x, ct)(b, idx), mean), op("mul", inv, scale))
    return cast(op("add", y, bias), out.dtype.name)


def _boundaries(shape: tuple[int, ...]) -> set[int]:
    """Suffix products of `shape`: the flat strides where its dims start."""
    out, acc = {1}, 1
    for d in reversed(shape):
        acc *= d
        out.add(acc)
    return out


def refined_row_domain(v_shape: tuple[int, ...], x_shape: tuple[int, ...],
                       axes: list[int]) -> tuple[tuple[int, ...], int, tuple] | None:
    """(loop shape, n_inner, root index) of a row kernel reducing x's trailing `axes`
    whose root `v` is a Reshape of x (GroupNorm: x [4, 8, 8192], v [4, 64, 32, 32]).

    The loop nest is the common refinement of both shapes ([4, 8 | 8, 32, 32]) so that
    Reshapes either way are affine index maps (see delinearize); None if there is none.
    """
    n = len(x_shape)
    total = int(np.prod(x_shape, dtype=np.int64))
    if (not axes or axes != list(range(n - len(axes), n)) or 0 in x_shape
            or int(np.prod(v_shape, dtype=np.int64)) != total):
        return None
    cuts = sorted(_boundaries(x_shape) | _boundaries(v_shape), reverse=True)
    if any(a % b for a, b in itertools.pairwise(cuts)):
        return None
    shape = tuple(a // b for a, b in itertools.pairwise(cuts))
    row = int(np.prod(x_shape[n - len(axes):], dtype=np.int64))
    n_inner = sum(1 for c in cuts[1:] if c < row)
    flat = Affine(0, tuple(cuts[1:]))
    idx = delinearize(flat, tuple(v_shape), shape)
    return (shape, n_inner, idx) if idx is not None else None


def reduced_index(inner: tuple[int, ...], sizes: tuple[int, ...],
                  rank: int) -> tuple[Affine, ...] | None:
    """Indices of reduced dims `sizes` over the inner loops `inner` (a refinement of them)."""
    if int(np.prod(inner, dtype=np.int64)) != int(np.prod(sizes, dtype=np.int64)):
        return None
    coeffs, acc = [0] * rank, 1
    for k in range(len(inner) - 1, -1, -1):
        coeffs[rank - len(inner) + k] = acc
        acc *= inner[k]
    extents = (1,) * (rank - len(inner)) + tuple(inner)
    return delinearize(Affine(0, tuple(coeffs)), sizes, extents)


LOWERINGS: dict[str, Callable] = elementwise_lowerings()
LOWERINGS.update({name: _reduce for name in (*_REDUCE, "ReduceLogSumExp")})
LOWERINGS.update({"ArgMax": _arg, "ArgMin": _arg, "Softmax": _softmax,
                  "LogSoftmax": _softmax, "LayerNormalization": _layernorm,
                  "InstanceNormalization": _instancenorm, "BatchNormalization": _batchnorm})


def why_not_lower(node: Node, graph: Graph) -> str | None:
    """None when `node` lowers to loop-nest expressions, else the reason it does not."""
    if node.domain not in ("", "ai.onnx") or node.op not in LOWERINGS:
        return f"no loop lowering for {node.qualified_op}"
    for v in node.inputs + node.outputs:
        if v is None:
            continue
        if v.dtype is None or v.dtype.name not in SUPPORTED_DTYPES:
            return f"{node.op} ({node.name}): dtype {v.dtype} of {v.name} is not supported"
        if v.shape is None or not all(isinstance(d, int) for d in v.shape):
            return f"{node.op} ({node.name}): {v.name} has no concrete shape"
    for i in CONST_INPUTS.get(node.op, ()) + ((1,) if node.op.startswith("Reduce") else ()):
        if i < len(node.inputs) and node.inputs[i] is not None \
                and not graph.is_constant(node.inputs[i]):
            return f"{node.op} ({node.name}): input {i} must be a constant"
    x = node.inputs[0]
    if node.op in FLOAT_ONLY and x is not None and x.dtype.kind != "f":
        return f"{node.op} ({node.name}): only float inputs are compiled, got {x.dtype}"
    if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1].uses:
        return None
    return None
