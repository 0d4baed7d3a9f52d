"""Layout ops: data movement without arithmetic (Reshape, Transpose, Slice, Gather, Pad, ...).

Each op has a symbolic-aware infer rule and a NumPy reference that matches onnxruntime.
Inputs listed in `shape_inputs` decide output shapes by their values; when such a value is
unknown, infer still returns the rank where it can, with None dims.
References return C-contiguous arrays (compiled kernels read them as dense buffers); they
may share memory with their inputs, so callers must not write into them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoclust.errors import ShapeInferenceError
from autoclust.ir import Dim, Shape
from autoclust.ops import (
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

# Slice bounds at or beyond this mean "to the end" (exporters write INT32/INT64 max).
_BIG = 2**31 - 1


def _fail(op: str, message: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"({op}): {message}")


def _ints(v: np.ndarray) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


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
        if isinstance(d, int):
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
    in_syms = [d for d in in_shape if isinstance(d, str)]
    out_syms = [d for d in known if isinstance(d, str)]
    if None in in_shape or None in known:
        return None
    for s in out_syms:  # cancel symbols present on both sides
        if s not in in_syms:
            return None
        in_syms.remove(s)
    in_int = dim_product([d for d in in_shape if isinstance(d, int)])
    out_int = dim_product([d for d in known if isinstance(d, int)])
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
        if any(not isinstance(d, int) for d in x):
            return [(ctx.dtypes[0], None)]  # a symbol may or may not be 1
        axes = [i for i, d in enumerate(x) if d == 1]
    for a in axes:
        if isinstance(x[a], int) and x[a] != 1:
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


# ---- Expand, Concat, Tile ----------------------------------------------------------------

def _expand_infer(ctx: InferContext) -> list[TypeShape]:
    x, spec = ctx.shapes[0], ctx.value(1)
    if spec is None:
        n = _static_len(ctx, 1)
        if x is None or n is None:
            return [(ctx.dtypes[0], None)]
        rank = max(len(x), n)
        padded = (None,) * (rank - len(x)) + tuple(x)
        # An input dim other than 1 survives whatever the shape says (it must be 1 or equal).
        dims = tuple(d if isinstance(d, int) and d != 1 else None for d in padded)
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


def _concat_infer(ctx: InferContext) -> list[TypeShape]:
    shapes = [s for i, s in enumerate(ctx.shapes) if ctx.has(i)]
    dtype = ctx.dtypes[0]
    if any(s is None for s in shapes):
        rank = next((len(s) for s in shapes if s is not None), None)
        return [(dtype, _unknown_dims(rank))]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ctx.fail(f"inputs have different ranks: {shapes}")
    axis = normalize_axis(int(ctx.attr("axis")), rank, ctx)
    out: list[Dim] = []
    for k in range(rank):
        dims = [s[k] for s in shapes]
        if k != axis:
            ints = {d for d in dims if isinstance(d, int)}
            if len(ints) > 1:
                raise ctx.fail(f"inputs disagree on dim {k}: {shapes}")
            out.append(_same_dim(dims))
            continue
        nonzero = [d for d in dims if d != 0]
        if all(isinstance(d, int) for d in dims):
            out.append(sum(dims))
        else:
            out.append(nonzero[0] if len(nonzero) == 1 else None)
    return [(dtype, tuple(out))]


def _concat_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    xs = [x for x in inputs if x is not None]
    axis = _axis("Concat", attrs["axis"], xs[0].ndim)
    try:
        return _dense(np.concatenate(xs, axis=axis))
    except ValueError:
        raise _fail("Concat", f"cannot concatenate {[x.shape for x in xs]} on axis "
                              f"{axis}") from None


def _tile_infer(ctx: InferContext) -> list[TypeShape]:
    x, reps = ctx.shapes[0], ctx.value(1)
    if x is None or reps is None:
        return [(ctx.dtypes[0], _unknown_dims(None if x is None else len(x)))]
    r = _ints(reps)
    if len(r) != len(x):
        raise ctx.fail(f"repeats {r} do not match rank of {x}")
    dims = [d * k if isinstance(d, int) else (d if k == 1 else (0 if k == 0 else None))
            for d, k in zip(x, r)]
    return [(ctx.dtypes[0], tuple(dims))]


def _tile_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, r = inputs[0], _ints(inputs[1])
    if len(r) != x.ndim or min(r, default=0) < 0:
        raise _fail("Tile", f"bad repeats {r} for shape {x.shape}")
    return _dense(np.tile(x, r))


# ---- Slice -------------------------------------------------------------------------------

def _slice_params(starts: list[int], ends: list[int], axes: list[int] | None,
                  steps: list[int] | None, rank: int) -> list[tuple[int, int, int, int]]:
    """(axis, start, end, step) per sliced axis, raw (unclamped)."""
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise _fail("Slice", f"starts {starts}, ends {ends}, axes {axes}, steps {steps} "
                             "differ in length")
    norm = [_axis("Slice", a, rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise _fail("Slice", f"repeated axes {axes}")
    if 0 in steps:
        raise _fail("Slice", f"steps {steps} contain 0")
    return list(zip(norm, starts, ends, steps))


def _clamp_slice(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """ONNX clamping: returns (start, end, length) with end == -1 meaning 'past index 0'."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        n = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        n = max(0, -(-(start - end) // -step))
    return start, end, n


def _slice_dim(dim: Dim, start: int, end: int, step: int) -> Dim:
    if isinstance(dim, int):
        return _clamp_slice(dim, start, end, step)[2]
    # Whole-axis slices (x[0:INT_MAX], x[::-1]) keep the symbol; anything else is unknown.
    if step == 1 and (start == 0 or start <= -_BIG - 1) and end >= _BIG:
        return dim
    if step == -1 and start >= _BIG and end <= -_BIG - 1:
        return dim
    return None


def _slice_inputs(get: Any) -> tuple[list[int] | None, ...]:
    vals = [get(i) for i in range(1, 5)]
    return tuple(None if v is None else _ints(v) for v in vals)


def _slice_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is None:
        return [(ctx.dtypes[0], None)]
    starts, ends, axes, steps = _slice_inputs(ctx.value)
    unknown_axes = ctx.has(3) and axes is None
    unknown_steps = ctx.has(4) and steps is None
    if starts is None or ends is None or unknown_axes or unknown_steps:
        return [(ctx.dtypes[0], (None,) * len(x))]
    try:
        params = _slice_params(starts, ends, axes, steps, len(x))
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None
    out = list(x)
    for axis, start, end, step in params:
        out[axis] = _slice_dim(x[axis], start, end, step)
    return [(ctx.dtypes[0], tuple(out))]


def _slice_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    starts, ends, axes, steps = _slice_inputs(
        lambda i: inputs[i] if i < len(inputs) else None)
    index = [slice(None)] * x.ndim
    for axis, start, end, step in _slice_params(starts, ends, axes, steps, x.ndim):
        s, e, _ = _clamp_slice(x.shape[axis], start, end, step)
        index[axis] = slice(s, None if e < 0 else e, step)
    return _dense(x[tuple(index)])


# ---- Split -------------------------------------------------------------------------------

def _split_sizes(dim: Dim, split: list[int] | None, n: int | None) -> list[Dim]:
    if split is not None:
        if isinstance(dim, int) and sum(split) != dim:
            raise _fail("Split", f"split {split} does not sum to dim {dim}")
        return list(split)
    if n is None or n <= 0:
        raise _fail("Split", "neither split nor num_outputs given")
    if not isinstance(dim, int):
        return [None] * n
    chunk = -(-dim // n)  # opset 18: equal chunks, the last one smaller
    sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    if n > dim or chunk * (n - 1) >= dim:  # onnxruntime rejects empty chunks
        raise _fail("Split", f"cannot split dim {dim} into {n} outputs")
    return sizes


def _split_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    split = ctx.value(1)
    n = ctx.attr("num_outputs")
    if split is None and ctx.has(1):
        n = _static_len(ctx, 1)
    if split is None and n is None:
        raise ctx.fail("cannot count outputs: no num_outputs and no split of known length")
    if x is None:
        return [(ctx.dtypes[0], None)] * (n if split is None else len(_ints(split)))
    axis = normalize_axis(int(ctx.attr("axis", 0)), len(x), ctx)
    try:
        sizes = _split_sizes(x[axis], None if split is None else _ints(split), n)
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None
    return [(ctx.dtypes[0], x[:axis] + (s,) + x[axis + 1:]) for s in sizes]


def _split_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    split = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    axis = _axis("Split", attrs.get("axis", 0), x.ndim)
    sizes = _split_sizes(x.shape[axis], None if split is None else _ints(split),
                         attrs.get("num_outputs"))
    bounds = np.cumsum([0] + sizes)
    return _dense(*(np.take(x, np.arange(bounds[i], bounds[i + 1]), axis=axis)
                    for i in range(len(sizes))))


# ---- Pad ---------------------------------------------------------------------------------

def _pad_pairs(pads: list[int], axes: list[int] | None, rank: int) -> list[tuple[int, int]]:
    """(begin, end) per axis of the data, from pads and the optional axes input."""
    axes = list(range(rank)) if axes is None else [_axis("Pad", a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise _fail("Pad", f"pads {pads} must have 2 x {len(axes)} entries")
    pairs = [(0, 0)] * rank
    for k, a in enumerate(axes):
        pairs[a] = (pads[k], pads[k + len(axes)])
    return pairs


def _pad_infer(ctx: InferContext) -> list[TypeShape]:
    x, pads = ctx.shapes[0], ctx.value(1)
    axes = ctx.value(3)
    if x is None or pads is None or (ctx.has(3) and axes is None):
        return [(ctx.dtypes[0], _unknown_dims(None if x is None else len(x)))]
    try:
        pairs = _pad_pairs(_ints(pads), None if axes is None else _ints(axes), len(x))
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None
    out = []
    for d, (b, e) in zip(x, pairs):
        if isinstance(d, int):
            out.append(d + b + e)
        else:
            out.append(d if b == e == 0 else None)
    return [(ctx.dtypes[0], tuple(out))]


def _pad_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, pads = inputs[0], _ints(inputs[1])
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else None
    pairs = _pad_pairs(pads, None if axes is None else _ints(axes), x.ndim)
    mode = attrs.get("mode", "constant")
    # Negative pads crop; crop first, then pad what remains.
    crop = tuple(slice(-min(b, 0), x.shape[i] + min(e, 0)) for i, (b, e) in enumerate(pairs))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in pairs]
    if mode == "constant":
        fill = x.dtype.type(0) if value is None else np.asarray(value).reshape(-1)[0]
        return _dense(np.pad(x, widths, mode="constant", constant_values=fill))
    if mode not in ("reflect", "edge", "wrap"):
        raise _fail("Pad", f"unknown mode {mode!r}")
    if x.size == 0 and any(w != (0, 0) for w in widths):
        raise _fail("Pad", f"mode {mode} cannot pad an empty tensor {x.shape}")
    return _dense(np.pad(x, widths, mode=mode))


# ---- Trilu, Identity, Dropout, DepthToSpace, SpaceToDepth ---------------------------------

def _trilu_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is not None and len(x) < 2:
        raise ctx.fail(f"input of shape {x} has rank < 2")
    return [(ctx.dtypes[0], x)]


def _trilu_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if len(inputs) > 1 and \
        inputs[1] is not None else 0
    rows, cols = x.shape[-2:]
    if attrs.get("upper", 1):
        zero = np.tri(rows, cols, k - 1, dtype=bool)  # below diagonal k: j - i < k
    else:
        zero = ~np.tri(rows, cols, k, dtype=bool)     # above diagonal k: j - i > k
    return _dense(np.where(zero, np.zeros((), x.dtype), x))


def _identity_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    return _dense(inputs[0])


def _dropout_infer(ctx: InferContext) -> list[TypeShape]:
    return [(ctx.dtypes[0], ctx.shapes[0]), (BOOL, ctx.shapes[0])]


def _dropout_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    # Inference only: output = data, mask all True (the importer rejects training mode).
    x = inputs[0]
    return _dense(x, np.ones(x.shape, dtype=bool))


def _block(ctx_or_attrs: Any) -> int:
    attrs = ctx_or_attrs.attrs if isinstance(ctx_or_attrs, InferContext) else ctx_or_attrs
    b = int(attrs.get("blocksize", 0))
    if b <= 0:
        raise _fail("DepthToSpace", f"blocksize {b} must be positive")
    return b


def _depth_to_space_infer(ctx: InferContext) -> list[TypeShape]:
    x, b = ctx.shapes[0], _block(ctx)
    if x is None:
        return [(ctx.dtypes[0], (None,) * 4)]
    if len(x) != 4:
        raise ctx.fail(f"input of shape {x} is not 4-D")
    n, c, h, w = x
    if isinstance(c, int) and c % (b * b):
        raise ctx.fail(f"channels {c} not divisible by blocksize^2 = {b * b}")

    def scale(d: Dim, f: int) -> Dim:
        return d * f if isinstance(d, int) else None
    c_out = c // (b * b) if isinstance(c, int) else None
    return [(ctx.dtypes[0], (n, c_out, scale(h, b), scale(w, b)))]


def _depth_to_space_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, b = inputs[0], _block(attrs)
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return _dense(y.reshape(n, c // (b * b), h * b, w * b))


def _space_to_depth_infer(ctx: InferContext) -> list[TypeShape]:
    x, b = ctx.shapes[0], _block(ctx)
    if x is None:
        return [(ctx.dtypes[0], (None,) * 4)]
    if len(x) != 4:
        raise ctx.fail(f"input of shape {x} is not 4-D")
    n, c, h, w = x
    for d in (h, w):
        if isinstance(d, int) and d % b:
            raise ctx.fail(f"spatial dims of {x} not divisible by blocksize {b}")
    c_out = c * b * b if isinstance(c, int) else None
    h_out = h // b if isinstance(h, int) else None
    w_out = w // b if isinstance(w, int) else None
    return [(ctx.dtypes[0], (n, c_out, h_out, w_out))]


def _space_to_depth_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, b = inputs[0], _block(attrs)
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    # DCR: the block offset is the outer part of the new channel; CRD (opset 26+): inner.
    perm = (0, 1, 3, 5, 2, 4) if attrs.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    return _dense(y.transpose(perm).reshape(n, c * b * b, h // b, w // b))


register("Reshape", LAYOUT, _reshape_infer, _reshape_ref, shape_inputs=(1,))
register("Transpose", LAYOUT, _transpose_infer, _transpose_ref)
register("Squeeze", LAYOUT, _squeeze_infer, _squeeze_ref, shape_inputs=(1,))
register("Unsqueeze", LAYOUT, _unsqueeze_infer, _unsqueeze_ref, shape_inputs=(1,))
register("Flatten", LAYOUT, _flatten_infer, _flatten_ref)
register("Expand", LAYOUT, _expand_infer, _expand_ref, shape_inputs=(1,))
register("Concat", LAYOUT, _concat_infer, _concat_ref)
register("Tile", LAYOUT, _tile_infer, _tile_ref, shape_inputs=(1,))
register("Slice", LAYOUT, _slice_infer, _slice_ref, shape_inputs=(1, 2, 3, 4))
register("Split", LAYOUT, _split_infer, _split_ref, shape_inputs=(1,))
register("Pad", LAYOUT, _pad_infer, _pad_ref, shape_inputs=(1, 3))
register("Trilu", LAYOUT, _trilu_infer, _trilu_ref)
register("Identity", LAYOUT, same_as_input(0), _identity_ref)
register("Dropout", LAYOUT, _dropout_infer, _dropout_ref)
register("DepthToSpace", LAYOUT, _depth_to_space_infer, _depth_to_space_ref)
register("SpaceToDepth", LAYOUT, _space_to_depth_infer, _space_to_depth_ref)

# Gather/Scatter/OneHot live next door; imported here so the op table loads them.
from autoclust.ops import layout_index  # noqa: F401
