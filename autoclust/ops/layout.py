"""Layout ops that only re-index: Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Expand,
Identity, Dropout. (Slice, Split, Concat, Tile, Pad, Trilu: ops/slicing.py; Gather,
Scatter, OneHot, DepthToSpace, ...: ops/layout_index.py.)

Each op has a symbolic-aware infer rule, a NumPy reference that matches onnxruntime and a
lowering that is an index map: the output at index idx reads its input at another index.
Inputs listed in `shape_inputs` decide output shapes by their values; when such a value is
unknown, infer still returns the rank where it can, with None dims.
References return C-contiguous arrays (compiled kernels read them as dense buffers); they
may share memory with their inputs, so callers must not write into them.
"""

from __future__ import annotations

import numpy as np

from autoclust import symbolic
from autoclust.errors import ShapeInferenceError
from autoclust.ir import Dim, Graph, Node, Shape
from autoclust.kernel.lowering import LowerCtx, const
from autoclust.ops.table import (
    BOOL,
    LAYOUT,
    Arrays,
    Attrs,
    InferContext,
    TypeShape,
    broadcast_dims,
    dense,
    dim_product,
    normalize_axis,
    register,
    same_as_input,
)
from autoclust.symbolic import is_dim

# Slice bounds at or beyond this mean "to the end" (exporters write INT32/INT64 max).
_BIG = 2**31 - 1


def _fail(op: str, message: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"({op}): {message}")


def _ints(v: np.ndarray) -> list[int]:
    return symbolic.ints(v)  # symbolic dims (Syms) stay symbolic


def _dense(*arrays: np.ndarray) -> list[np.ndarray]:
    """C-contiguous outputs, as a ref's result list."""
    return [dense(a) for a in arrays]


def _refail(ctx: InferContext, exc: ShapeInferenceError) -> ShapeInferenceError:
    """Re-raise a helper's error through ctx.fail (adds the node name, drops the op prefix)."""
    return ctx.fail(str(exc).removeprefix(f"({ctx.op}): "))


def _axis(op: str, axis: int, rank: int) -> int:
    """normalize_axis with the op named in the error."""
    try:
        return normalize_axis(int(axis), rank)
    except ShapeInferenceError as exc:
        raise _fail(op, str(exc)) from None


def _unknown_dims(n: int | None) -> Shape:
    return None if n is None else (None,) * n


def _static_len(ctx: InferContext, i: int) -> int | None:
    """Length of 1-D input i from its static shape (for shape inputs with unknown value)."""
    s = ctx.shapes[i] if ctx.has(i) else None
    if s is None or len(s) != 1 or not isinstance(s[0], int):
        return None
    return s[0]


def _same_dim(dims: list[Dim]) -> Dim:
    """The dim several inputs agree on: a known int wins over symbols."""
    for d in dims:
        if is_dim(d):
            return d
    syms = {d for d in dims if d is not None}
    return syms.pop() if len(syms) == 1 else (dims[0] if dims else None)


# ---- Reshape ---------------------------------------------------------------------------

def _reshape_target(in_shape: tuple, spec: list[int], allowzero: bool, op: str = "Reshape"
                    ) -> list[Dim]:
    """Apply 0 (copy) and keep -1 for the caller; validates the spec."""
    if spec.count(-1) > 1:
        raise _fail(op, f"shape {spec} has more than one -1")
    if allowzero and 0 in spec and -1 in spec:
        raise _fail(op, f"shape {spec} mixes 0 and -1 with allowzero=1")
    out: list[Dim] = []
    for i, s in enumerate(spec):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise _fail(op, f"shape {spec}: 0 at position {i} but input rank is "
                                f"{len(in_shape)}")
            out.append(in_shape[i])
        elif s < -1:
            raise _fail(op, f"shape {spec} has invalid dim {s}")
        else:
            out.append(s)
    return out


def _infer_minus_one(in_shape: tuple, out: list[Dim]) -> Dim:
    """The dim -1 stands for, when it follows from known ints and matching symbols."""
    known = [d for d in out if d != -1]
    if all(symbolic.is_dim(d) for d in list(in_shape) + known):  # ints and Syms
        total, rest = symbolic.product(in_shape), symbolic.product(known)
        return None if rest == 0 or total % rest else total // rest
    in_syms = [d for d in in_shape if isinstance(d, str)]
    out_syms = [d for d in known if isinstance(d, str)]
    if None in in_shape or None in known:
        return None
    for s in out_syms:  # cancel symbols present on both sides
        if s not in in_syms:
            return None
        in_syms.remove(s)
    in_int = dim_product([d for d in in_shape if is_dim(d)])
    out_int = dim_product([d for d in known if is_dim(d)])
    if len(in_syms) > 1 or out_int == 0 or in_int % out_int:
        return None
    ratio = in_int // out_int
    if not in_syms:
        return ratio
    return in_syms[0] if ratio == 1 else None


def _reshape_infer(ctx: InferContext) -> list[TypeShape]:
    spec = ctx.value(1)
    x = ctx.shapes[0]
    if spec is None:
        return [(ctx.dtypes[0], _unknown_dims(_static_len(ctx, 1)))]
    spec_l = _ints(spec)
    allowzero = bool(ctx.attr("allowzero", 0))
    if x is None:
        dims = [None if (s in (0, -1) and not allowzero) or s == -1 else s for s in spec_l]
        return [(ctx.dtypes[0], tuple(dims))]
    try:
        out = _reshape_target(x, spec_l, allowzero)
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None
    if -1 in out:
        out[out.index(-1)] = _infer_minus_one(x, out)
    n_in, n_out = dim_product(x), dim_product(out)
    if n_in is not None and n_out is not None and n_in != n_out:
        raise ctx.fail(f"cannot reshape {x} ({n_in} elements) to {spec_l}")
    return [(ctx.dtypes[0], tuple(out))]


def _reshape_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, spec = inputs[0], _ints(inputs[1])
    out = _reshape_target(x.shape, spec, bool(attrs.get("allowzero", 0)))
    if -1 in out:
        rest = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if rest == 0 or x.size % rest:
            raise _fail("Reshape", f"cannot reshape {x.shape} to {spec}")
        out[out.index(-1)] = x.size // rest
    if int(np.prod(out, dtype=np.int64)) != x.size:
        raise _fail("Reshape", f"cannot reshape {x.shape} to {spec}")
    return _dense(x.reshape(tuple(out)))


# ---- Transpose, Squeeze, Unsqueeze, Flatten ----------------------------------------------

def _perm(attrs: Attrs, rank: int) -> list[int]:
    perm = attrs.get("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(p + rank if p < 0 else p for p in perm) != list(range(rank)):
        raise _fail("Transpose", f"perm {perm} is not a permutation of rank {rank}")
    return [p + rank if p < 0 else p for p in perm]


def _transpose_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is None:
        perm = ctx.attr("perm")
        return [(ctx.dtypes[0], None if perm is None else (None,) * len(perm))]
    return [(ctx.dtypes[0], tuple(x[p] for p in _perm(ctx.attrs, len(x))))]


def _transpose_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    return _dense(np.transpose(x, _perm(attrs, x.ndim)))


def _axes_list(axes: np.ndarray | None, rank: int, op: str) -> list[int] | None:
    if axes is None:
        return None
    out = [_axis(op, a, rank) for a in _ints(axes)]
    if len(set(out)) != len(out):
        raise _fail(op, f"repeated axes {_ints(axes)}")
    return out


def _squeeze_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if ctx.has(1) and ctx.value(1) is None:
        n = _static_len(ctx, 1)
        rank = None if x is None or n is None else len(x) - n
        return [(ctx.dtypes[0], _unknown_dims(rank))]
    if x is None:
        return [(ctx.dtypes[0], None)]
    try:
        axes = _axes_list(ctx.value(1), len(x), "Squeeze")
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None
    if axes is None:
        if any(not is_dim(d) for d in x):
            return [(ctx.dtypes[0], None)]  # a symbol may or may not be 1
        axes = [i for i, d in enumerate(x) if d == 1]
    for a in axes:
        if is_dim(x[a]) and x[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {x[a]} in shape {x}")
    return [(ctx.dtypes[0], tuple(d for i, d in enumerate(x) if i not in axes))]


def _squeeze_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axes = _axes_list(inputs[1] if len(inputs) > 1 else None, x.ndim, "Squeeze")
    if axes is None:
        return _dense(np.squeeze(x))
    if any(x.shape[a] != 1 for a in axes):
        raise _fail("Squeeze", f"axes {axes} of shape {x.shape} are not all 1")
    return _dense(np.squeeze(x, axis=tuple(axes)))


def _unsqueeze_shape(x: tuple, axes_v: np.ndarray) -> tuple:
    rank = len(x) + len(_ints(axes_v))
    axes = _axes_list(axes_v, rank, "Unsqueeze")
    it = iter(x)
    return tuple(1 if i in axes else next(it) for i in range(rank))


def _unsqueeze_infer(ctx: InferContext) -> list[TypeShape]:
    x, axes = ctx.shapes[0], ctx.value(1)
    if axes is None or x is None:
        n = _static_len(ctx, 1) if axes is None else len(_ints(axes))
        return [(ctx.dtypes[0], None if x is None or n is None else (None,) * (len(x) + n))]
    try:
        return [(ctx.dtypes[0], _unsqueeze_shape(x, axes))]
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None


def _unsqueeze_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    return _dense(x.reshape(_unsqueeze_shape(x.shape, inputs[1])))


def _flatten_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is None:
        return [(ctx.dtypes[0], (None, None))]
    axis = int(ctx.attr("axis", 1))
    if not -len(x) <= axis <= len(x):
        raise ctx.fail(f"axis {axis} is out of range for rank {len(x)}")
    axis = axis + len(x) if axis < 0 else axis
    outer, inner = x[:axis], x[axis:]

    def prod(dims: tuple) -> Dim:
        return dims[0] if len(dims) == 1 else dim_product(dims)
    return [(ctx.dtypes[0], (prod(outer), prod(inner)))]


def _flatten_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    axis = int(attrs.get("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis:], dtype=np.int64))
    return _dense(x.reshape(outer, inner))


# ---- Expand ----------------------------------------------------------------

def _expand_infer(ctx: InferContext) -> list[TypeShape]:
    x, spec = ctx.shapes[0], ctx.value(1)
    if spec is None:
        n = _static_len(ctx, 1)
        if x is None or n is None:
            return [(ctx.dtypes[0], None)]
        rank = max(len(x), n)
        padded = (None,) * (rank - len(x)) + tuple(x)
        # An input dim other than 1 survives whatever the shape says (it must be 1 or equal).
        dims = tuple(d if is_dim(d) and d != 1 else None for d in padded)
        return [(ctx.dtypes[0], dims)]
    if x is None:
        return [(ctx.dtypes[0], None)]
    target = tuple(_ints(spec))
    rank = max(len(x), len(target))
    a = (1,) * (rank - len(x)) + tuple(x)
    b = (1,) * (rank - len(target)) + target
    try:
        return [(ctx.dtypes[0], tuple(broadcast_dims(p, q) for p, q in zip(a, b)))]
    except ShapeInferenceError:
        raise ctx.fail(f"cannot expand shape {x} to {list(target)}") from None


def _expand_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, target = inputs[0], tuple(_ints(inputs[1]))
    try:
        shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise _fail("Expand", f"cannot expand shape {x.shape} to {list(target)}") from None
    return _dense(np.broadcast_to(x, shape).copy())


# ---- Identity, Dropout ----

def _identity_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    return _dense(inputs[0])


def _dropout_infer(ctx: InferContext) -> list[TypeShape]:
    return [(ctx.dtypes[0], ctx.shapes[0]), (BOOL, ctx.shapes[0])]


def _dropout_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    # Inference only: output = data, mask all True (the importer rejects training mode).
    x = inputs[0]
    return _dense(x, np.ones(x.shape, dtype=bool))


# ---- lowerings ---------------------------------------------------------------------------

def _lower_view(ctx: LowerCtx):
    """Reshape, Squeeze, Unsqueeze, Flatten: the input read as the output's shape."""
    return ctx.view(0, ctx.shape, ctx.idx)


def _lower_transpose(ctx: LowerCtx):
    perm = _perm(ctx.node.attrs, len(ctx.in_shape(0)))
    idx_in = [None] * len(perm)
    for j, p in enumerate(perm):
        idx_in[p] = ctx.idx[j]
    return ctx.value(0, tuple(idx_in))


def _lower_expand(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    lead = len(ctx.shape) - len(shape)
    return ctx.value(0, tuple(ctx.zero() if d == 1 else ctx.idx[k + lead]
                              for k, d in enumerate(shape)))


def _lower_dropout(ctx: LowerCtx):
    if ctx.out == 0:  # inference: the data itself (clustering refuses training mode)
        return ctx.value(0, ctx.idx)
    return const(True, "bool")


register("Reshape", LAYOUT, _reshape_infer, _reshape_ref, shape_inputs=(1,), lower=_lower_view,
         view=True, shape_like=True, exact="copy")
register("Transpose", LAYOUT, _transpose_infer, _transpose_ref, lower=_lower_transpose,
         exact="copy")
register("Squeeze", LAYOUT, _squeeze_infer, _squeeze_ref, shape_inputs=(1,), lower=_lower_view,
         view=True, shape_like=True, exact="copy")
register("Unsqueeze", LAYOUT, _unsqueeze_infer, _unsqueeze_ref, shape_inputs=(1,),
         lower=_lower_view, view=True, shape_like=True, exact="copy")
register("Flatten", LAYOUT, _flatten_infer, _flatten_ref, lower=_lower_view, view=True,
         exact="copy")
register("Expand", LAYOUT, _expand_infer, _expand_ref, shape_inputs=(1,), lower=_lower_expand,
         shape_like=True, exact="copy")
register("Identity", LAYOUT, same_as_input(0), _identity_ref, lower=lambda c: c.value(0, c.idx),
         view=True, weight=0, shape_like=True, exact="copy")
# weight 0: inference Dropout is removed by simplify; training Dropout is never clustered.
def _dropout_refuses(node: Node, graph: Graph) -> str | None:
    """Dropout in training mode draws random masks: only inference Dropout compiles."""
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return None
    mode = graph.constant_value(node.inputs[2])
    if mode is None:
        return "Dropout training_mode comes from runtime data (training mode is random)"
    if bool(mode.any()):
        return "Dropout in training mode is random (only inference Dropout compiles)"
    return None


register("Dropout", LAYOUT, _dropout_infer, _dropout_ref, lower=_lower_dropout, weight=0,
         refuses=_dropout_refuses)
