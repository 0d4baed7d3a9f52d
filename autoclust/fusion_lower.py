"""Lowering of graph ops to kernel IR expressions: one small function per op.

`LOWERINGS[op](builder, node, out_index, idx) -> Expr` returns the expression of output
`out_index` of `node` at logical index `idx` (a tuple of affine forms, one per output
dim). Elementwise ops combine their operands' expressions; layout ops rewrite the index
and read their input there (index maps: Transpose, Expand, Slice, Squeeze, ...);
reductions and normalizations ask the builder for reduction phases.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from autoclust import kernel_ir as kir
from autoclust.ir import Node, Value
from autoclust.kernel_ir import Affine, Const, Op


class NeedRowDomain(Exception):
    """A reduction was reached in an elementwise kernel: rebuild as a row kernel."""

    def __init__(self, value: Value, x: Value, axes: list[int]):
        super().__init__(f"{value.producer.op} needs a row kernel")
        self.value, self.x, self.axes = value, x, sorted(axes)


class Refuse(Exception):
    """The expression cannot be built in this kernel; the node's output must be a buffer."""

    def __init__(self, value: Value, reason: str):
        node = value.producer
        where = f"{node.op} ({node.name})" if node is not None else value.name
        super().__init__(f"{where}: {reason}")
        self.value = value


def broadcast_index(idx: tuple[Affine, ...], out_shape: tuple[int, ...],
                    in_shape: tuple[int, ...]) -> tuple[Affine, ...]:
    """Index into an operand broadcast (numpy rules) to `out_shape`."""
    rank = len(idx[0].coeffs) if idx else None
    lead = len(out_shape) - len(in_shape)
    out = []
    for d, size in enumerate(in_shape):
        if size == 1:
            out.append(Affine(0, (0,) * rank) if rank is not None else None)
        else:
            out.append(idx[d + lead])
    if rank is None:  # 0-d output: the operand is 0-d or all ones too
        return ()
    return tuple(out)


def _zero(b) -> Affine:
    return kir.constant(0, b.rank)


def compute_dtype(dtype: str) -> str:
    """float16 computes in float32."""
    return "float32" if dtype == "float16" else dtype


def const(value, dtype: str) -> Const:
    if dtype == "bool":
        return Const(bool(value), dtype)
    if np.dtype(dtype).kind in "iu":
        return Const(int(value), dtype)
    return Const(float(value), dtype)


def cast(e: kir.Expr, dtype: str) -> kir.Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return const(np.array(e.value).astype(dtype).item(), dtype)
    return Op("cast", (e,), dtype)


def op(name: str, *args: kir.Expr, dtype: str | None = None) -> Op:
    if dtype is None:
        dtype = "bool" if name in kir.COMPARE_OPS else args[-1].dtype
    return Op(name, tuple(args), dtype)


# ---- elementwise -----------------------------------------------------------------------------

ElementFn = Callable[[list, Node, str], kir.Expr]


# Inputs read only for their dtype, never loaded (CastLike(x, like) has x's shape).
_DTYPE_ONLY_INPUTS = {"CastLike": (1,)}


def _elementwise(fn: ElementFn) -> Callable:
    """Lowering of an elementwise op from fn(operand exprs, node, out dtype)."""
    def lower(b, node: Node, k: int, idx: tuple[Affine, ...]) -> kir.Expr:
        out = node.outputs[0]
        skip = _DTYPE_ONLY_INPUTS.get(node.op, ())
        args = [None if v is None or i in skip else b.operand(node, i, idx, out.shape)
                for i, v in enumerate(node.inputs)]
        return fn(args, node, out.dtype.name)
    return lower


def _binary(name: str) -> Callable:
    return _elementwise(lambda a, n, dt: op(name, a[0], a[1], dtype=dt))


def _unary(name: str) -> Callable:
    return _elementwise(lambda a, n, dt: op(name, a[0], dtype=dt))


def _variadic(name: str) -> Callable:
    def fn(args, node, dt):
        acc = args[0]
        for a in args[1:]:
            acc = op(name, acc, a, dtype=dt)
        if node.op == "Mean":
            acc = op("div", acc, const(len(args), dt))
        return acc
    return _elementwise(fn)


def _pow(args, node, dt):
    x, y = args
    if isinstance(y, Const) and y.value == 2:
        return op("mul", x, x)
    if isinstance(y, Const) and y.value == 1:
        return x
    if isinstance(y, Const) and y.value == 0.5:
        return op("sqrt", x)
    return op("pow", x, cast(y, dt))


def _mod(args, node, dt):
    fmod = node.attr("fmod", 0) or np.dtype(dt).kind == "f"
    return op("fmod" if fmod else "mod", args[0], args[1])


def _isinf(args, node, dt):
    x = args[0]
    pos = op("eq", x, const(math.inf, x.dtype))
    neg = op("eq", x, const(-math.inf, x.dtype))
    det_pos, det_neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if det_pos and det_neg:
        return op("or", pos, neg)
    if det_pos:
        return pos
    if det_neg:
        return neg
    return const(False, "bool")


def _clip(args, node, dt):
    x = args[0]
    if len(args) > 1 and args[1] is not None:
        x = op("max", x, args[1])
    if len(args) > 2 and args[2] is not None:
        x = op("min", x, args[2])
    return x


def _select_neg(x, if_neg, if_pos=None):
    return op("select", op("lt", x, const(0, x.dtype)), if_neg, x if if_pos is None else if_pos)


def _expm1(x):
    return op("sub", op("exp", x), const(1, x.dtype))


def _elu(args, node, dt):
    x = args[0]
    return _select_neg(x, op("mul", const(node.attr("alpha", 1.0), dt), _expm1(x)))


def _selu(args, node, dt):
    x = args[0]
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    neg = op("mul", const(alpha, dt), _expm1(x))
    inner = op("select", op("gt", x, const(0, dt)), x, neg)
    return op("mul", const(gamma, dt), inner)


def _celu(args, node, dt):
    x = args[0]
    alpha = node.attr("alpha", 1.0)
    neg = op("mul", const(alpha, dt), _expm1(op("div", x, const(alpha, dt))))
    return op("add", op("max", x, const(0, dt)), op("min", const(0, dt), neg))


def _gelu(args, node, dt):
    x = args[0]
    half = op("mul", const(0.5, dt), x)
    if node.attr("approximate", "none") == "tanh":
        cube = op("mul", op("mul", x, x), x)
        inner = op("add", x, op("mul", const(0.044715, dt), cube))
        t = op("tanh", op("mul", const(math.sqrt(2 / math.pi), dt), inner))
    else:
        t = op("erf", op("mul", x, const(1 / math.sqrt(2), dt)))
    return op("mul", half, op("add", const(1, dt), t))


def _hard_sigmoid(x, alpha, beta, dt):
    y = op("add", op("mul", const(alpha, dt), x), const(beta, dt))
    return op("max", const(0, dt), op("min", const(1, dt), y))


def _softplus(x, dt):
    # max(x, 0) + log(1 + exp(-|x|)): no overflow for large x.
    tail = op("log", op("add", const(1, dt), op("exp", op("neg", op("abs", x)))))
    return op("add", op("max", x, const(0, dt)), tail)


def _shrink(args, node, dt):
    x = args[0]
    lambd, bias = node.attr("lambd", 0.5), node.attr("bias", 0.0)
    lo = op("add", x, const(bias, dt))
    hi = op("sub", x, const(bias, dt))
    inner = op("select", op("gt", x, const(lambd, dt)), hi, const(0, dt))
    return op("select", op("lt", x, const(-lambd, dt)), lo, inner)


def _cast(args, node, dt):
    return cast(args[0], dt)


def _where(args, node, dt):
    return op("select", args[0], args[1], args[2])


def _sign(args, node, dt):
    return op("sign", args[0])


_ELEMENTWISE: dict[str, ElementFn] = {
    "Reciprocal": lambda a, n, dt: op("div", const(1, dt), a[0]),
    "Pow": _pow,
    "Mod": _mod,
    "IsInf": _isinf,
    "Clip": _clip,
    "Where": _where,
    "Cast": _cast,
    "CastLike": _cast,
    "Sign": _sign,
    "Relu": lambda a, n, dt: op("max", a[0], const(0, dt)),
    "LeakyRelu": lambda a, n, dt: _select_neg(a[0], op("mul", a[0],
                                                       const(n.attr("alpha", 0.01), dt))),
    "PRelu": lambda a, n, dt: _select_neg(a[0], op("mul", a[0], a[1])),
    "Elu": _elu,
    "Selu": _selu,
    "Celu": _celu,
    "Gelu": _gelu,
    "HardSigmoid": lambda a, n, dt: _hard_sigmoid(a[0], n.attr("alpha", 0.2),
                                                  n.attr("beta", 0.5), dt),
    "HardSwish": lambda a, n, dt: op("mul", a[0], _hard_sigmoid(a[0], 1 / 6, 0.5, dt)),
    "Softplus": lambda a, n, dt: _softplus(a[0], dt),
    "Softsign": lambda a, n, dt: op("div", a[0], op("add", const(1, dt), op("abs", a[0]))),
    "Mish": lambda a, n, dt: op("mul", a[0], op("tanh", _softplus(a[0], dt))),
    "ThresholdedRelu": lambda a, n, dt: op("select", op("gt", a[0],
                                                        const(n.attr("alpha", 1.0), dt)),
                                           a[0], const(0, dt)),
    "Shrink": _shrink,
}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq",
           "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge",
           "And": "and", "Or": "or", "Xor": "xor", "BitwiseAnd": "bitand",
           "BitwiseOr": "bitor", "BitwiseXor": "bitxor"}
_UNARY = {"Neg": "neg", "Abs": "abs", "Sqrt": "sqrt", "Exp": "exp", "Log": "log",
          "Floor": "floor", "Ceil": "ceil", "Round": "round", "Erf": "erf", "Tanh": "tanh",
          "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos",
          "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh",
          "Atanh": "atanh", "Not": "not", "IsNaN": "isnan", "Sigmoid": "sigmoid",
          "BitwiseNot": "bitnot"}
_VARIADIC = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}


# ---- layout ops as index maps ---------------------------------------------------------------

def _const_ints(b, node: Node, i: int) -> list[int] | None:
    if i >= len(node.inputs) or node.inputs[i] is None:
        return None
    return [int(x) for x in np.asarray(b.graph.constant_value(node.inputs[i])).ravel()]


def _same(b, node, k, idx):
    return b.expr(node.inputs[0], idx)


def _transpose(b, node, k, idx):
    x = node.inputs[0]
    perm = node.attr("perm") or list(reversed(range(len(x.shape))))
    idx_in = [None] * len(perm)
    for j, p in enumerate(perm):
        idx_in[p] = idx[j]
    return b.expr(x, tuple(idx_in))


def _squeeze_like(b, node, k, idx):
    # Squeeze, Unsqueeze and Reshapes that only add or drop size-1 dims.
    x, out = node.inputs[0], node.outputs[0]
    kept = [a for a, d in zip(idx, out.shape) if d != 1]
    idx_in = []
    for d in x.shape:
        idx_in.append(kept.pop(0) if d != 1 else _zero(b))
    return b.expr(x, tuple(idx_in))


def _reshape(b, node, k, idx):
    x, out = node.inputs[0], node.outputs[0]
    if [d for d in x.shape if d != 1] == [d for d in out.shape if d != 1]:
        return _squeeze_like(b, node, k, idx)
    if x.name in b.fusion.materialized and x.name not in b.roots:
        from autoclust.fusion import flat_index  # the flat offset is the same in x and out
        b.loads.add(x.name)
        return kir.Load(b.fusion.buffer_of(x), flat_index(idx, out.shape, b.rank), x.dtype.name,
                        b.clamps)
    idx_in = _split_index(b, x.shape, out.shape, idx)
    if idx_in is None:  # a merge: affine only when the loop nest refines both shapes
        from autoclust.fusion import flat_index
        idx_in = delinearize(flat_index(idx, out.shape, b.rank), x.shape, b.shape)
    if idx_in is None and b.n_inner == 0:
        _probe_rows(b, x)
    if idx_in is None:
        raise Refuse(x, f"Reshape {list(x.shape)} -> {list(out.shape)} of a computed value "
                        "regroups dims")
    return b.expr(x, idx_in)


def _probe_rows(b, x: Value) -> None:
    """Re-raise NeedRowDomain if x (in its own loop nest) needs a row kernel: a refined
    row nest may then make this Reshape affine (GroupNorm's merge, see refined_row_domain)."""
    probe = type(b)(b.fusion, tuple(x.shape), 0)
    try:
        probe.expr(x, tuple(kir.unit(k, len(x.shape)) for k in range(len(x.shape))))
    except NeedRowDomain:
        raise
    except Refuse:
        pass


def _split_index(b, in_shape, out_shape, idx) -> tuple[Affine, ...] | None:
    """x's index when every dim of x is split into (or equal to) a run of output dims.

    Such a Reshape is affine: x's index along a dim is the flat offset of its output run
    (BERT's [8, 128, 256] -> [8, 128, 4, 64]). Merging dims would need div/mod: None.
    """
    # size-1 dims index at 0 on both sides; match the other dims run by run
    out_dims = [k for k, d in enumerate(out_shape) if d != 1]
    idx_in, j = [], 0
    for d in in_shape:
        if d == 1:
            idx_in.append(_zero(b))
            continue
        acc, run = 1, _zero(b)
        while acc < d and j < len(out_dims):
            k = out_dims[j]
            run = run.scaled(out_shape[k]).plus(idx[k])
            acc *= out_shape[k]
            j += 1
        if acc != d:
            return None
        idx_in.append(run)
    return tuple(idx_in)


def delinearize(flat: Affine, shape: tuple[int, ...],
                extents: tuple[int, ...]) -> tuple[Affine, ...] | None:
    """The index into a contiguous `shape` of flat offset `flat`, or None if not affine.

    Each loop index i_k (in [0, extents[k])) must land in one dim: its coefficient is a
    multiple of that dim's stride and the dim's terms stay below its size, so no carry
    crosses dims. [4, 8 | 8, 1024] reads x[4, 8, 8192] at (i0, i1, 1024*i2 + i3).
    """
    strides = _strides(shape)
    rank = len(flat.coeffs)
    coeffs = [[0] * rank for _ in shape]
    if flat.const < 0 or not shape:
        return None if flat.const or any(flat.coeffs) else ()
    consts, rest = [], flat.const
    for s in strides:
        consts.append(rest // s)
        rest %= s
    for k, c in enumerate(flat.coeffs):
        if c == 0 or extents[k] == 1:
            continue
        j = next((j for j, s in enumerate(strides) if c >= s and c % s == 0), None)
        if c < 0 or j is None:
            return None
        coeffs[j][k] = c // strides[j]
    out = []
    for j, size in enumerate(shape):
        top = consts[j] + sum(c * (extents[k] - 1) for k, c in enumerate(coeffs[j]))
        if top >= size:
            return None
        out.append(Affine(consts[j], tuple(coeffs[j])))
    return tuple(out)


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def _expand(b, node, k, idx):
    return b.operand(node, 0, idx, node.outputs[0].shape)


def _slice(b, node, k, idx):
    x = node.inputs[0]
    rank = len(x.shape)
    starts = _const_ints(b, node, 1)  # ends only decide the (known) output shape
    axes = _const_ints(b, node, 3) or list(range(len(starts)))
    steps = _const_ints(b, node, 4) or [1] * len(starts)
    idx_in = list(idx)
    for s, a, st in zip(starts, axes, steps):
        a = a + rank if a < 0 else a
        dim = x.shape[a]
        s = s + dim if s < 0 else s
        s = min(max(s, 0), dim) if st > 0 else min(max(s, 0), dim - 1)
        idx_in[a] = kir.constant(s, b.rank).plus(idx[a], st)
    return b.expr(x, tuple(idx_in))


def _concat(b, node, k, idx):
    """A select chain over the pieces; each piece's loads clamp the axis loop index into
    the piece's own range, so no lane reads out of bounds (select drops those lanes)."""
    out = node.outputs[0]
    axis = node.attr("axis")
    axis = axis + len(out.shape) if axis < 0 else axis
    a = idx[axis]
    moving = [d for d, c in enumerate(a.coeffs) if c]
    if len(moving) != 1 or a.coeffs[moving[0]] != 1:
        raise Refuse(out, f"Concat axis index {a} is not one loop index")
    j = moving[0]
    extent = b.shape[j]
    pieces, off = [], 0  # (value, offset, lo, hi): loop index range of each piece
    for v in node.inputs:
        n = v.shape[axis]
        lo, hi = max(off - a.const, 0), min(off + n - 1 - a.const, extent - 1)
        if n and lo <= hi:
            pieces.append((v, off, lo, hi))
        off += n
    if not pieces:  # an empty output: the loop never runs
        return const(0, out.dtype.name)
    result = None
    for v, off, lo, hi in reversed(pieces):
        idx_p = idx[:axis] + (Affine(a.const - off, a.coeffs),) + idx[axis + 1:]
        saved = b.clamps
        if len(pieces) > 1:
            b.clamps = saved + ((j, lo, hi),)
        try:
            e = b.expr(v, idx_p)
        finally:
            b.clamps = saved
        if result is None:
            result = e
        else:
            cond = op("le", kir.Index(kir.unit(j, b.rank)), const(hi, "int64"))
            result = op("select", cond, e, result)
    return result


def _dropout(b, node, k, idx):
    if k == 0:
        return b.expr(node.inputs[0], idx)
    return const(True, "bool")


_LAYOUT = {"Identity": _same, "Transpose": _transpose, "Squeeze": _squeeze_like,
           "Unsqueeze": _squeeze_like, "Reshape": _reshape, "Flatten": _reshape,
           "Expand": _expand, "Slice": _slice, "Dropout": _dropout, "Concat": _concat}
# Inputs that must be constants for the index map (specialization folds them).
CONST_INPUTS = {"Slice": (1, 2, 3, 4), "Reshape": (1,), "Expand": (1,), "Squeeze": (1,),
                "Unsqueeze": (1,)}


def elementwise_lowerings() -> dict[str, Callable]:
    """Lowerings of the elementwise and layout ops."""
    table: dict[str, Callable] = {}
    table.update({k: _binary(v) for k, v in _BINARY.items()})
    table.update({k: _unary(v) for k, v in _UNARY.items()})
    table.update({k: _variadic(v) for k, v in _VARIADIC.items()})
    table.update({k: _elementwise(fn) for k, fn in _ELEMENTWISE.items()})
    table.update(_LAYOUT)
    return table
