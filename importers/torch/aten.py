"""Core ATen -> the op table: one lowering per ATen op (see torch_lowering.Lowering).

Each lowering receives the FX node's arguments (fx.Nodes for tensors and symbolic ints,
Python values for the rest) and emits op-table nodes; one that cannot express its arguments
raises `Unmapped(reason)`, and the node runs as eager torch with that reason in `explain`.
Only ops that core ATen decompositions leave are here (silu, hardswish, linear, ... arrive
decomposed).

    aten.addmm(bias, a, b)          -> Gemm(a, b, bias, alpha, beta)
    aten.view(x, [s0, 8, 64])       -> Reshape(x, Concat(Shape(x, 0, 1), [8], [64]))
    aten.amax(x, [-1], True)        -> Where(any NaN, NaN, ReduceMax(x))   (torch propagates NaN)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from autoclust.importers.torch.lowering import INT64_MAX, Lowering, Unmapped, promoted, sym_expr

from autoclust.ir import Value

aten = torch.ops.aten
prims = torch.ops.prims

# ---- the table --------------------------------------------------------------------------

LowerFn = Callable[..., Any]
LOWERINGS: dict[Any, LowerFn] = {}


def lowers(*targets: Any) -> Callable[[LowerFn], LowerFn]:
    """Register a lowering for ATen overloads (or whole overload packets)."""
    def register(fn: LowerFn) -> LowerFn:
        for t in targets:
            LOWERINGS[t] = fn
        return fn
    return register


def lowering_for(target: Any) -> LowerFn | None:
    """The lowering of an FX call_function target, or None."""
    fn = LOWERINGS.get(target)
    if fn is None and hasattr(target, "overloadpacket"):
        fn = LOWERINGS.get(target.overloadpacket)
    return fn


# ---- elementwise ----------------------------------------------------------------------

_UNARY = {
    aten.neg: "Neg", aten.exp: "Exp", aten.log: "Log", aten.sqrt: "Sqrt",
    aten.sigmoid: "Sigmoid", aten.tanh: "Tanh", aten.erf: "Erf", aten.abs: "Abs",
    aten.relu: "Relu", aten.sin: "Sin", aten.cos: "Cos", aten.tan: "Tan",
    aten.floor: "Floor", aten.ceil: "Ceil", aten.reciprocal: "Reciprocal", aten.sign: "Sign",
    aten.asin: "Asin", aten.acos: "Acos", aten.atan: "Atan", aten.sinh: "Sinh",
    aten.cosh: "Cosh", aten.asinh: "Asinh", aten.acosh: "Acosh", aten.atanh: "Atanh",
    aten.isnan: "IsNaN", aten.logical_not: "Not",
}


def _unary(op: str) -> LowerFn:
    def lower(lo: Lowering, x: Any) -> Value:
        dt = lo.out_dtype()
        src = np.dtype(bool) if op in ("Not",) else (lo.tensor(x).dtype if op == "IsNaN" else dt)
        return lo.one(op, lo.cast(lo.tensor(x), src))
    return lower


for _target, _op in _UNARY.items():
    lowers(_target)(_unary(_op))
lowers(aten.round.default)(_unary("Round"))  # both round half to even
lowers(aten.bitwise_not.default)(
    lambda lo, x: lo.one("Not" if lo.out_dtype() == np.bool_ else "BitwiseNot", lo.tensor(x)))


@lowers(aten.rsqrt)
def _rsqrt(lo: Lowering, x: Any) -> Value:
    return lo.one("Reciprocal", lo.one("Sqrt", lo.cast(lo.tensor(x), lo.out_dtype())))


_BINARY = {
    aten.mul: "Mul", aten.maximum: "Max", aten.minimum: "Min",
    aten.eq: "Equal", aten.lt: "Less", aten.le: "LessOrEqual", aten.gt: "Greater",
    aten.ge: "GreaterOrEqual", aten.logical_and: "And", aten.logical_or: "Or",
    aten.logical_xor: "Xor", aten.fmod: "Mod",
}
_LOGICAL = ("And", "Or", "Xor")


def _binary(op: str) -> LowerFn:
    def lower(lo: Lowering, a: Any, b: Any) -> Value:
        dt = np.dtype(bool) if op in _LOGICAL else promoted(a, b)
        attrs = {"fmod": 1} if op == "Mod" else {}
        return lo.cast(lo.one(op, lo.operand(a, dt), lo.operand(b, dt), **attrs),
                       lo.out_dtype())
    return lower


for _target, _op in _BINARY.items():
    lowers(_target)(_binary(_op))


@lowers(aten.ne)
def _ne(lo: Lowering, a: Any, b: Any) -> Value:
    dt = promoted(a, b)
    return lo.one("Not", lo.one("Equal", lo.operand(a, dt), lo.operand(b, dt)))


@lowers(aten.bitwise_and, aten.bitwise_or, aten.bitwise_xor)
def _bitwise(lo: Lowering, a: Any, b: Any) -> Value:
    name = lo.node.target.overloadpacket.__name__.split("_")[1].capitalize()
    dt = lo.out_dtype()
    op = name if dt == np.bool_ else f"Bitwise{name}"
    return lo.one(op, lo.operand(a, dt), lo.operand(b, dt))


@lowers(aten.add, aten.sub)
def _add_sub(lo: Lowering, a: Any, b: Any, alpha: Any = 1) -> Value:
    op = "Add" if lo.node.target.overloadpacket is aten.add else "Sub"
    dt = lo.out_dtype()
    rhs = lo.operand(b, dt)
    if alpha != 1:
        rhs = lo.one("Mul", rhs, lo.operand(alpha, dt))
    return lo.one(op, lo.operand(a, dt), rhs)


@lowers(aten.div)
def _div(lo: Lowering, a: Any, b: Any, rounding_mode: str | None = None) -> Value:
    dt = lo.out_dtype()
    if dt.kind != "f":
        return _int_div(lo, lo.operand(a, dt), lo.operand(b, dt), rounding_mode)
    q = lo.one("Div", lo.operand(a, dt), lo.operand(b, dt))
    if rounding_mode == "floor":
        return lo.one("Floor", q)
    if rounding_mode == "trunc":  # trunc(q) = sign(q) * floor(|q|)
        return lo.one("Mul", lo.one("Sign", q), lo.one("Floor", lo.one("Abs", q)))
    return q


def _int_div(lo: Lowering, a: Value, b: Value, rounding_mode: str | None) -> Value:
    """Integer Div truncates toward zero; floor subtracts 1 where the signs differ and the
    division is not exact."""
    q = lo.one("Div", a, b)
    if rounding_mode == "trunc":
        return q
    zero = lo.const(np.array(0, a.dtype))
    r = lo.one("Mod", a, b, fmod=1)
    inexact = lo.one("Not", lo.one("Equal", r, zero))
    signs = lo.one("Xor", lo.one("Less", r, zero), lo.one("Less", b, zero))
    return lo.one("Sub", q, lo.cast(lo.one("And", inexact, signs), a.dtype))


@lowers(aten.remainder)
def _remainder(lo: Lowering, a: Any, b: Any) -> Value:
    dt = lo.out_dtype()
    if dt.kind == "f":  # ONNX has only C fmod for floats; torch takes the divisor's sign
        raise Unmapped("floating-point remainder (Python sign rule)")
    return lo.one("Mod", lo.operand(a, dt), lo.operand(b, dt), fmod=0)


@lowers(aten.pow)
def _pow(lo: Lowering, a: Any, b: Any) -> Value:
    dt = lo.out_dtype()
    return lo.one("Pow", lo.operand(a, dt), lo.operand(b, dt))


@lowers(aten.where.self)
def _where(lo: Lowering, cond: Any, a: Any, b: Any) -> Value:
    dt = lo.out_dtype()
    c = lo.cast(lo.tensor(cond), np.dtype(bool))
    return lo.one("Where", c, lo.operand(a, dt), lo.operand(b, dt))


@lowers(aten.clamp.default)
def _clamp(lo: Lowering, x: Any, lo_: Any = None, hi: Any = None) -> Value:
    if lo_ is None or hi is None:  # ONNX Clip clips inf to a missing bound's FLT_MAX;
        return _clamp_tensor(lo, x, lo_, hi)  # torch.clamp keeps it: Max/Min instead
    dt = lo.out_dtype()
    return lo.one("Clip", lo.cast(lo.tensor(x), dt), lo.operand(lo_, dt), lo.operand(hi, dt))


@lowers(aten.clamp.Tensor)
def _clamp_tensor(lo: Lowering, x: Any, lo_: Any = None, hi: Any = None) -> Value:
    dt = lo.out_dtype()
    y = lo.cast(lo.tensor(x), dt)
    if lo_ is not None:
        y = lo.one("Max", y, lo.operand(lo_, dt))
    if hi is not None:
        y = lo.one("Min", y, lo.operand(hi, dt))
    return y


@lowers(aten.gelu)
def _gelu(lo: Lowering, x: Any, approximate: str = "none") -> Value:
    return lo.one("Gelu", lo.tensor(x), approximate=approximate)


@lowers(aten.leaky_relu)
def _leaky_relu(lo: Lowering, x: Any, slope: float = 0.01) -> Value:
    return lo.one("LeakyRelu", lo.tensor(x), alpha=float(slope))


@lowers(aten.hardtanh)
def _hardtanh(lo: Lowering, x: Any, lo_: float = -1.0, hi: float = 1.0) -> Value:
    dt = lo.out_dtype()
    return lo.one("Clip", lo.tensor(x), lo.operand(lo_, dt), lo.operand(hi, dt))


@lowers(aten.elu)
def _elu(lo: Lowering, x: Any, alpha: float = 1.0, scale: float = 1.0,
         input_scale: float = 1.0) -> Value:
    if scale != 1 or input_scale != 1:
        raise Unmapped("elu with scale or input_scale other than 1")
    return lo.one("Elu", lo.tensor(x), alpha=float(alpha))


@lowers(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(lo: Lowering, x: Any, dtype: Any = None, **kw: Any) -> Value:
    device = kw.get("device")
    if device is not None and torch.device(device).type != "cpu":
        raise Unmapped(f"copy to device {device}")
    return lo.cast(lo.tensor(x), lo.out_dtype())


@lowers(aten.clone, aten.alias, aten.lift_fresh_copy)
def _identity(lo: Lowering, x: Any, **kw: Any) -> Value:
    return lo.one("Identity", lo.tensor(x))


# ---- reductions and normalizations ----------------------------------------------------

def _axes(dims: Any, rank: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % rank if rank else 0 for d in dims]


def _reduce(op: str) -> LowerFn:
    def lower(lo: Lowering, x: Any, dims: Any = None, keepdim: bool = False,
              **kw: Any) -> Value:
        v = lo.cast(lo.tensor(x), lo.out_dtype())
        axes = _axes(dims, len(v.shape))
        if not axes:  # a 0-d input: nothing to reduce
            return lo.one("Identity", v)
        return lo.one(op, v, lo.ints(axes), keepdims=int(bool(keepdim)))
    return lower


lowers(aten.sum.dim_IntList)(_reduce("ReduceSum"))
lowers(aten.mean.dim, aten.mean.default)(_reduce("ReduceMean"))
lowers(aten.prod.dim_int)(_reduce("ReduceProd"))


@lowers(aten.any, aten.all)
def _any_all(lo: Lowering, x: Any, dims: Any = None, keepdim: bool = False) -> Value:
    """any/all as ReduceMax/ReduceMin of x != 0 in int32 (NaN counts as true, as in torch)."""
    v = lo.tensor(x)
    if v.dtype != np.bool_:
        v = lo.one("Not", lo.one("Equal", v, lo.const(np.array(0, v.dtype))))
    axes = _axes(dims, len(v.shape))
    if not axes:  # a 0-d input
        return lo.one("Identity", v)
    op = "ReduceMax" if lo.node.target.overloadpacket is aten.any else "ReduceMin"
    r = lo.one(op, lo.cast(v, np.dtype(np.int32)), lo.ints(axes), keepdims=int(bool(keepdim)))
    return lo.cast(r, lo.out_dtype())


@lowers(aten.var.correction)
def _var(lo: Lowering, x: Any, dims: Any = None, correction: Any = 1,
         keepdim: bool = False) -> Value:
    v = lo.tensor(x)
    if v.dtype.kind != "f":
        raise Unmapped(f"variance of {v.dtype}")
    axes = _axes(dims, len(v.shape))
    n = [v.shape[a] for a in axes]
    if not all(isinstance(d, int) for d in n):
        raise Unmapped("variance over a symbolic size")
    count = int(np.prod(n)) - (1 if correction is None else correction)
    ax = lo.ints(axes)
    centered = lo.one("Sub", v, lo.one("ReduceMean", v, ax, keepdims=1))
    total = lo.one("ReduceSum", lo.one("Mul", centered, centered), ax,
                   keepdims=int(bool(keepdim)))
    return lo.one("Div", total, lo.const(np.array(max(count, 0), v.dtype)))


@lowers(aten.cumsum.default)
def _cumsum(lo: Lowering, x: Any, dim: int, dtype: Any = None) -> Value:
    v = lo.cast(lo.tensor(x), lo.out_dtype())
    return lo.one("CumSum", v, lo.const(np.array(dim % max(len(v.shape), 1), np.int64)))


@lowers(aten.amax, aten.amin)
def _amax(lo: Lowering, x: Any, dims: Any = (), keepdim: bool = False) -> Value:
    # onnxruntime's ReduceMax skips NaN; torch.amax returns NaN when the row holds one
    op = "ReduceMax" if lo.node.target.overloadpacket is aten.amax else "ReduceMin"
    v = lo.tensor(x)
    axes = lo.ints(_axes(dims, len(v.shape)))
    m = lo.one(op, v, axes, keepdims=int(bool(keepdim)))
    if v.dtype.kind != "f":
        return m
    nan = lo.one("ReduceMax", lo.cast(lo.one("IsNaN", v), v.dtype), axes,
                 keepdims=int(bool(keepdim)))
    return lo.one("Where", lo.cast(nan, np.dtype(bool)), lo.const(np.array(np.nan, v.dtype)), m)


@lowers(aten.argmax, aten.argmin)
def _argmax(lo: Lowering, x: Any, dim: int | None = None, keepdim: bool = False) -> Value:
    op = "ArgMax" if lo.node.target.overloadpacket is aten.argmax else "ArgMin"
    v = lo.tensor(x)
    if dim is None:
        v, dim = lo.one("Reshape", v, lo.ints([-1])), 0
        if keepdim:
            raise Unmapped("argmax over all dims with keepdim")
    return lo.one(op, v, axis=int(dim), keepdims=int(bool(keepdim)))


@lowers(aten._softmax, aten._log_softmax)
def _softmax(lo: Lowering, x: Any, dim: int, half_to_float: bool = False) -> Value:
    op = "Softmax" if lo.node.target.overloadpacket is aten._softmax else "LogSoftmax"
    return lo.one(op, lo.cast(lo.tensor(x), lo.out_dtype()), axis=int(dim))


def _ones_or(lo: Lowering, a: Any, shape: Sequence[int], fill: float, dt: np.dtype) -> Value:
    if a is not None:
        return lo.tensor(a)
    if not all(isinstance(d, int) for d in shape):
        raise Unmapped("normalization without weight over a symbolic size")
    return lo.const(np.full(tuple(shape), fill, dt))


@lowers(aten.native_layer_norm.default)
def _layer_norm(lo: Lowering, x: Any, shape: Sequence[Any], w: Any, b: Any,
                eps: float) -> list[Value | None]:
    v = lo.tensor(x)
    used = lo.used_items()
    n_out = 1 + max([i for i in used if i > 0], default=0)
    dims = [sym_expr(d) for d in shape]
    w_v = _ones_or(lo, w, dims, 1.0, v.dtype)
    outs = lo.emit("LayerNormalization", [v, w_v, None if b is None else lo.tensor(b)],
                   n_out, axis=-len(dims), epsilon=float(eps), stash_type=1)
    return [o if i == 0 or i in used else None for i, o in enumerate(outs)] + \
        [None] * (3 - n_out)


def _first_output_only(lo: Lowering) -> None:
    if lo.used_items() - {0}:
        raise Unmapped("its statistics outputs are used (only the normalized output maps)")


@lowers(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(lo: Lowering, x: Any, w: Any, b: Any, mean: Any, var: Any,
                momentum: float, eps: float) -> list[Value | None]:
    _first_output_only(lo)
    v = lo.tensor(x)
    c = [v.shape[1]]
    y = lo.one("BatchNormalization", v, _ones_or(lo, w, c, 1.0, v.dtype),
               _ones_or(lo, b, c, 0.0, v.dtype), lo.tensor(mean), lo.tensor(var),
               epsilon=float(eps))
    return [y, None, None]


@lowers(aten.native_batch_norm.default)
def _native_batch_norm(lo: Lowering, x: Any, w: Any, b: Any, mean: Any, var: Any,
                       training: bool, momentum: float, eps: float) -> list[Value | None]:
    if training:
        raise Unmapped("batch norm in training mode (updates running statistics)")
    return _batch_norm(lo, x, w, b, mean, var, momentum, eps)


@lowers(aten.native_group_norm.default)
def _group_norm(lo: Lowering, x: Any, w: Any, b: Any, n: Any, c: Any, hw: Any, groups: int,
                eps: float) -> list[Value | None]:
    _first_output_only(lo)
    v = lo.tensor(x)
    cs = [v.shape[1]]
    y = lo.one("GroupNormalization", v, _ones_or(lo, w, cs, 1.0, v.dtype),
               _ones_or(lo, b, cs, 0.0, v.dtype), num_groups=int(groups), epsilon=float(eps))
    return [y, None, None]


# ---- layout ---------------------------------------------------------------------------

@lowers(aten.view.default)
def _view(lo: Lowering, x: Any, sizes: Sequence[Any]) -> Value:
    allowzero = int(any(isinstance(s, int) and s == 0 for s in sizes))
    return lo.one("Reshape", lo.tensor(x), lo.dims(sizes), allowzero=allowzero)


@lowers(aten.permute)
def _permute(lo: Lowering, x: Any, dims: Sequence[int]) -> Value:
    v = lo.tensor(x)
    return lo.one("Transpose", v, perm=[d % len(v.shape) for d in dims])


@lowers(aten.expand)
def _expand(lo: Lowering, x: Any, sizes: Sequence[Any], implicit: bool = False) -> Value:
    v = lo.tensor(x)
    lead = len(sizes) - len(v.shape)
    # -1 keeps the input dim, and so does 1 under ONNX's broadcasting; so does a size equal to
    # the input's own (symbolic) dim, which saves a shape computation
    target = [1 if (isinstance(s, int) and s == -1) or
              (i >= lead and ir_dim_of(s) == v.shape[i - lead]) else s
              for i, s in enumerate(sizes)]
    return lo.one("Expand", v, lo.dims(target))


def ir_dim_of(s: Any) -> Any:
    """The IR dim a size argument stands for (int or symbol text)."""
    e = sym_expr(s)
    return e if isinstance(e, int) else str(e)


@lowers(aten.slice.Tensor)
def _slice(lo: Lowering, x: Any, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Value:
    v = lo.tensor(x)
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    return lo.one("Slice", v, lo.dim(start), lo.dim(end), lo.ints([dim % len(v.shape)]),
                  lo.ints([step]))


@lowers(aten.select.int)
def _select(lo: Lowering, x: Any, dim: int, index: Any) -> Value:
    if not isinstance(index, int):
        raise Unmapped("select with a symbolic index")
    v = lo.tensor(x)
    return lo.one("Gather", v, lo.const(np.array(index, np.int64)), axis=dim % len(v.shape))


@lowers(aten.unsqueeze)
def _unsqueeze(lo: Lowering, x: Any, dim: int) -> Value:
    v = lo.tensor(x)
    return lo.one("Unsqueeze", v, lo.ints([dim % (len(v.shape) + 1)]))


@lowers(aten.squeeze.dims)
def _squeeze(lo: Lowering, x: Any, dims: Any = None) -> Value:
    v = lo.tensor(x)
    rank = len(v.shape)
    axes = _axes(dims, rank)
    if any(not isinstance(v.shape[a], int) for a in axes):
        raise Unmapped("squeeze of a symbolic dim (a no-op unless it is 1 at run time)")
    axes = [a for a in axes if v.shape[a] == 1]  # torch ignores dims that are not 1
    if not axes:
        return lo.one("Identity", v)
    return lo.one("Squeeze", v, lo.ints(axes))


@lowers(aten.cat)
def _cat(lo: Lowering, tensors: Sequence[Any], dim: int = 0) -> Value:
    dt = lo.out_dtype()
    rank = len(lo.val.shape)
    # torch skips 1-D empty tensors in cat whatever the other ranks are
    keep = [t for t in tensors if not (t.meta["val"].dim() == 1 and rank != 1 and
                                       t.meta["val"].shape[0] == 0)]
    return lo.one("Concat", *[lo.cast(lo.tensor(t), dt) for t in keep], axis=dim % rank)


@lowers(aten.split_with_sizes.default)
def _split(lo: Lowering, x: Any, sizes: Any, dim: int = 0) -> list[Value]:
    v = lo.tensor(x)
    axis = dim % len(v.shape)
    if any(not isinstance(s, int) for s in sizes):
        raise Unmapped("split with symbolic sizes")
    return lo.emit("Split", [v, lo.ints(sizes)], len(sizes), axis=axis)


@lowers(aten.index.Tensor)
def _index(lo: Lowering, x: Any, indices: Sequence[Any]) -> Value:
    given = [i for i, t in enumerate(indices) if t is not None]
    idx = [lo.tensor(indices[i]) for i in given]
    for v in idx:
        if v.dtype.kind not in "iu":
            raise Unmapped(f"indexing with a {v.dtype} tensor (a mask has a data-dependent "
                           "shape)")
    if len(given) == 1:
        return lo.one("Gather", lo.tensor(x), idx[0], axis=given[0])
    shape = torch.broadcast_shapes(*[indices[i].meta["val"].shape for i in given])
    return _index_nd(lo, lo.tensor(x), given, idx, list(shape))


def _index_nd(lo: Lowering, v: Value, given: list[int], idx: list[Value], shape: list[Any]
              ) -> Value:
    """x[i0, i1, ...] over several dims: the indexed dims moved to the front, one GatherND of
    the broadcast indices stacked on a last axis, and the result's dims put where torch puts
    them (in place of the indexed dims when those are adjacent, else first)."""
    rank, k = len(v.shape), len(given)
    rest = [d for d in range(rank) if d not in given]
    if given != list(range(k)):
        v = lo.one("Transpose", v, perm=given + rest)
    target = lo.dims(shape)
    coords = [lo.one("Unsqueeze", lo.one("Expand", lo.cast(i, np.dtype(np.int64)), target),
                     lo.ints([-1])) for i in idx]
    y = lo.one("GatherND", v, lo.one("Concat", *coords, axis=-1))
    first = given[0]
    if given != list(range(first, first + k)) or first == 0:
        return y  # broadcast dims first: torch's rule for separated index tensors too
    n = len(shape)  # y: [*bcast, *x.shape[:first], *after]: bring x.shape[:first] forward
    perm = list(range(n, n + first)) + list(range(n)) + list(range(n + first, n + len(rest)))
    return lo.one("Transpose", y, perm=perm)


@lowers(aten.embedding.default)
def _embedding(lo: Lowering, weight: Any, indices: Any, *rest: Any) -> Value:
    return lo.one("Gather", lo.tensor(weight), lo.tensor(indices), axis=0)


@lowers(aten.gather.default)
def _gather(lo: Lowering, x: Any, dim: int, index: Any, sparse_grad: bool = False) -> Value:
    v = lo.tensor(x)
    return lo.one("GatherElements", v, lo.tensor(index), axis=dim % len(v.shape))


@lowers(aten.constant_pad_nd)
def _pad(lo: Lowering, x: Any, pad: Sequence[int], value: float = 0.0) -> Value:
    v = lo.tensor(x)
    rank = len(v.shape)
    begins, ends = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):  # torch lists (begin, end) pairs from the last dim back
        begins[rank - 1 - k], ends[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    return lo.one("Pad", v, lo.dims(begins + ends), lo.operand(value, v.dtype),
                  mode="constant")


@lowers(aten.repeat)
def _repeat(lo: Lowering, x: Any, repeats: Sequence[Any]) -> Value:
    v = lo.tensor(x)
    extra = len(repeats) - len(v.shape)
    if extra:
        v = lo.one("Unsqueeze", v, lo.ints(list(range(extra))))
    return lo.one("Tile", v, lo.dims(repeats))


@lowers(aten.flip)
def _flip(lo: Lowering, x: Any, dims: Sequence[int]) -> Value:
    v = lo.tensor(x)
    k = len(dims)
    return lo.one("Slice", v, lo.ints([-1] * k), lo.ints([-INT64_MAX] * k),
                  lo.ints([d % len(v.shape) for d in dims]), lo.ints([-1] * k))


# ---- library calls ----------------------------------------------------------------------

@lowers(aten.mm, aten.bmm)
def _mm(lo: Lowering, a: Any, b: Any) -> Value:
    return lo.one("MatMul", lo.tensor(a), lo.tensor(b))


@lowers(aten.addmm)
def _addmm(lo: Lowering, bias: Any, a: Any, b: Any, beta: float = 1, alpha: float = 1
           ) -> Value:
    return lo.one("Gemm", lo.tensor(a), lo.tensor(b), lo.tensor(bias), alpha=float(alpha),
                  beta=float(beta))


def _ints(v: Any, n: int) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * n if len(v) == 1 else v


@lowers(aten.convolution.default)
def _convolution(lo: Lowering, x: Any, w: Any, b: Any, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> Value:
    wv = lo.tensor(w)
    n = len(wv.shape) - 2
    attrs: dict[str, Any] = {"strides": _ints(stride, n), "pads": _ints(padding, n) * 2,
                             "dilations": _ints(dilation, n), "group": int(groups)}
    if any(not isinstance(d, int) for d in wv.shape[2:]):
        raise Unmapped("convolution with a symbolic kernel size")
    attrs["kernel_shape"] = list(wv.shape[2:])
    inputs = [lo.tensor(x), wv, None if b is None else lo.tensor(b)]
    if transposed:
        return lo.one("ConvTranspose", *inputs, output_padding=_ints(output_padding, n),
                      **attrs)
    return lo.one("Conv", *inputs, **attrs)


@lowers(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(lo: Lowering, x: Any, kernel: Sequence[int], stride: Sequence[int] = (),
              padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> list:
    _first_output_only(lo)
    n = len(lo.tensor(x).shape) - 2
    k = _ints(kernel, n)
    y = lo.one("MaxPool", lo.tensor(x), kernel_shape=k, strides=_ints(stride or k, n),
               pads=_ints(padding, n) * 2, dilations=_ints(dilation, n),
               ceil_mode=int(bool(ceil_mode)))
    return [y, None]


@lowers(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(lo: Lowering, x: Any, kernel: Sequence[int], stride: Sequence[int] = (),
              padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: Any = None) -> Value:
    if ceil_mode or divisor_override is not None:
        raise Unmapped("avg_pool with ceil_mode or divisor_override")
    n = len(lo.tensor(x).shape) - 2
    k = _ints(kernel, n)
    return lo.one("AveragePool", lo.tensor(x), kernel_shape=k, strides=_ints(stride or k, n),
                  pads=_ints(padding, n) * 2, count_include_pad=int(bool(count_include_pad)))


@lowers(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(lo: Lowering, x: Any, size: Sequence[int]) -> Value:
    if any(s != 1 for s in size):
        raise Unmapped(f"adaptive average pooling to {list(size)} (only to 1)")
    return lo.one("GlobalAveragePool", lo.tensor(x))


# ---- factories ----------------------------------------------------------------------------

@lowers(aten.full.default)
def _full(lo: Lowering, size: Sequence[Any], value: Any, **kw: Any) -> Value:
    dt = lo.out_dtype()
    return lo.one("ConstantOfShape", lo.dims(size), value=np.array([value], dt))


@lowers(aten.full_like.default)
def _full_like(lo: Lowering, x: Any, value: Any, **kw: Any) -> Value:
    dt = lo.out_dtype()
    return lo.one("ConstantOfShape", lo.dims(lo.val.shape), value=np.array([value], dt))


@lowers(aten.arange.start_step)
def _arange(lo: Lowering, start: Any, end: Any, step: Any = 1, **kw: Any) -> Value:
    dt = lo.out_dtype()
    if dt.kind == "f":
        raise Unmapped("floating-point arange with a symbolic bound")
    scalars = [lo.cast(lo.one("Reshape", lo.dim(s), lo.ints([])), dt) for s in
               (start, end, step)]
    return lo.one("Range", *scalars)


