"""Layout ops that select or repeat parts of tensors: Slice, Split, Concat, Tile, Pad, Trilu.

Each has a symbolic-aware infer rule, a NumPy reference that matches onnxruntime, and a
lowering: an index map (Slice, Split), a select over pieces whose loads clamp their loop
index into the piece (Concat, constant/edge Pad), or data-dependent positions computed
from the output index (Tile, reflect/wrap Pad).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoclust import symbolic
from autoclust.errors import InvalidInputError, InvalidShapeError, ShapeInferenceError
from autoclust.ir import Dim
from autoclust.kernel.lowering import LowerCtx, const, op, select
from autoclust.ops.layout import (
    _BIG,
    _axis,
    _dense,
    _fail,
    _ints,
    _refail,
    _same_dim,
    _static_len,
    _unknown_dims,
)
from autoclust.ops.table import (
    LAYOUT,
    Arrays,
    Attrs,
    InferContext,
    TypeShape,
    normalize_axis,
)
from autoclust.ops.table import register as _register
from autoclust.symbolic import is_dim

# ---- Concat, Tile -------------------------------------------------------------------------

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
            ints = {d for d in dims if is_dim(d)}
            if len(ints) > 1:
                raise ctx.fail(f"inputs disagree on dim {k}: {shapes}")
            out.append(_same_dim(dims))
            continue
        nonzero = [d for d in dims if d != 0]
        if all(is_dim(d) for d in dims):
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
    dims = [d * k if is_dim(d) else (d if k == 1 else (0 if k == 0 else None))
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
    if symbolic.is_dim(dim) and all(symbolic.is_dim(x) for x in (start, end)):
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
        if is_dim(dim) and sum(split) != dim:
            raise _fail("Split", f"split {split} does not sum to dim {dim}")
        return list(split)
    if n is None or n <= 0:
        raise _fail("Split", "neither split nor num_outputs given")
    if not is_dim(dim):
        return [None] * n
    chunk = -(-dim // n)  # opset 18: equal chunks, the last one smaller
    sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    if dim > 0 and (n > dim or chunk * (n - 1) >= dim):  # onnxruntime rejects empty
        # chunks of a non-empty dim; a zero-length dim splits into n empty outputs
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
    if split is None and ctx.has(1):  # sizes come from runtime data: only the count is known
        return [(ctx.dtypes[0], x[:axis] + (None,) + x[axis + 1:])] * n
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


def _not_one_element(shape: Any, what: str) -> str:
    """Why an input read as a scalar (Pad's value, Trilu's k) of this shape is not one
    ('' if it is): compiled code would read element 0 of an empty tensor."""
    if shape is not None and all(isinstance(d, int) for d in shape) and \
            int(np.prod(shape, dtype=np.int64)) != 1:
        return f"{what} must have one element, got shape {list(shape)}"
    return ""


def _pad_infer(ctx: InferContext) -> list[TypeShape]:
    x, pads = ctx.shapes[0], ctx.value(1)
    axes = ctx.value(3)
    if ctx.has(2) and _not_one_element(ctx.shapes[2], "constant_value"):
        raise ctx.invalid(_not_one_element(ctx.shapes[2], "constant_value"), fail=True)
    if x is None or pads is None or (ctx.has(3) and axes is None):
        return [(ctx.dtypes[0], _unknown_dims(None if x is None else len(x)))]
    try:
        pairs = _pad_pairs(_ints(pads), None if axes is None else _ints(axes), len(x))
    except ShapeInferenceError as exc:
        raise _refail(ctx, exc) from None
    out = []
    for d, (b, e) in zip(x, pairs):
        if is_dim(d):
            if d + b + e < 0:
                raise ctx.invalid(f"pads {_ints(pads)} crop more than dim {len(out)} of "
                                  f"input {list(x)} holds", fail=True)
            out.append(d + b + e)
        else:
            out.append(d if b == e == 0 else None)
    if all(is_dim(d) for d in x):
        why, fail = _pad_rejected(ctx.attrs.get("mode", "constant"), tuple(x), pairs)
        if why:
            raise ctx.invalid(f"pads {_ints(pads)} on input {list(x)}: {why}", fail=fail)
    return [(ctx.dtypes[0], tuple(out))]


def _kept(n: Any, pads: tuple[int, int]) -> Any:
    """How much of a dim of n the crops (negative pads) leave: Pad's effective extent."""
    return n + min(pads[0], 0) + min(pads[1], 0)


def _pad_rejected(mode: str, shape: tuple[int, ...],
                  pairs: list[tuple[int, int]]) -> tuple[str, bool]:
    """Why onnxruntime rejects these pads of a non-empty input in `mode` ('' if it
    does not), and whether it raises Fail (else InvalidArgument). The modes other than
    constant copy from what the crops leave (the effective extent), so none may be
    empty, and reflect mirrors inside it without repeating an edge: an axis it pads
    must keep 2 elements, and neither pad may pass extent - 1."""
    if mode == "constant" or 0 in shape:
        return "", False
    for d, (n, (b, e)) in enumerate(zip(shape, pairs)):
        extent = _kept(n, (b, e))
        if extent <= 0:
            return f"mode {mode} with zero effective input extent on axis {d}", True
        if mode != "reflect" or max(b, e) <= 0:
            continue
        if extent < 2:
            why = f"mode reflect needs 2 elements of axis {d} after cropping, {extent} left"
            return why, False
        if max(b, e) > extent - 1:
            why = (f"mode reflect pads axis {d} by {max(b, e)}, more than its {extent} "
                   "elements minus one")
            return why, False
    return "", False


def _pad_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x, pads = inputs[0], _ints(inputs[1])
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else None
    pairs = _pad_pairs(pads, None if axes is None else _ints(axes), x.ndim)
    mode = attrs.get("mode", "constant")
    why = _not_one_element(None if value is None else value.shape, "constant_value")
    if why or any(d + b + e < 0 for d, (b, e) in zip(x.shape, pairs)):
        raise InvalidShapeError(f"(Pad): {why or f'pads {pads} crop more than {x.shape} holds'}")
    # Negative pads crop; crop first, then pad what remains.
    crop = tuple(slice(-min(b, 0), x.shape[i] + min(e, 0)) for i, (b, e) in enumerate(pairs))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in pairs]
    if mode == "constant":
        fill = x.dtype.type(0) if value is None else np.asarray(value).reshape(-1)[0]
        return _dense(np.pad(x, widths, mode="constant", constant_values=fill))
    if mode not in ("reflect", "edge", "wrap"):
        raise _fail("Pad", f"unknown mode {mode!r}")
    rejected, fail = _pad_rejected(mode, inputs[0].shape, pairs)
    if rejected:
        raise (InvalidShapeError if fail else InvalidInputError)(f"(Pad): {rejected}")
    out_shape = [d + b + e for d, (b, e) in zip(x.shape, widths)]
    if 0 in out_shape:  # nothing to pad into (onnxruntime returns the empty tensor)
        return [np.zeros(out_shape, x.dtype)]
    if x.size == 0 and any(w != (0, 0) for w in widths):
        raise _fail("Pad", f"mode {mode} cannot pad an empty tensor {x.shape}")
    return _dense(np.pad(x, widths, mode=mode))


def _trilu_infer(ctx: InferContext) -> list[TypeShape]:
    x = ctx.shapes[0]
    if x is not None and len(x) < 2:
        raise ctx.fail(f"input of shape {x} has rank < 2")
    if ctx.has(1) and _not_one_element(ctx.shapes[1], "k"):
        raise ctx.invalid(_not_one_element(ctx.shapes[1], "k"), fail=True)
    return [(ctx.dtypes[0], x)]


def _trilu_ref(inputs: Arrays, attrs: Attrs) -> list[np.ndarray]:
    x = inputs[0]
    if len(inputs) > 1 and inputs[1] is not None and _not_one_element(inputs[1].shape, "k"):
        raise InvalidShapeError(f"(Trilu): {_not_one_element(inputs[1].shape, 'k')}")
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if len(inputs) > 1 and \
        inputs[1] is not None else 0
    rows, cols = x.shape[-2:]
    if attrs.get("upper", 1):
        zero = np.tri(rows, cols, k - 1, dtype=bool)  # below diagonal k: j - i < k
    else:
        zero = ~np.tri(rows, cols, k, dtype=bool)     # above diagonal k: j - i > k
    return _dense(np.where(zero, np.zeros((), x.dtype), x))




# ---- lowerings ----------------------------------------------------------------------------

def _lower_slice(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    starts, ends, axes, steps = (ctx.ints(i) for i in (1, 2, 3, 4))
    idx_in = list(ctx.idx)
    for axis, start, end, step in _slice_params(starts, ends, axes, steps, len(shape)):
        s, _, _ = _clamp_slice(shape[axis], start, end, step)
        idx_in[axis] = ctx.at(s).plus(ctx.idx[axis], step)  # start + step * i
    return ctx.value(0, tuple(idx_in))


def _lower_split(ctx: LowerCtx):
    rank = len(ctx.in_shape(0))
    axis = normalize_axis(int(ctx.attr("axis", 0)), rank)
    offset = sum(ctx.node.outputs[m].shape[axis] for m in range(ctx.out))
    idx_in = list(ctx.idx)
    idx_in[axis] = ctx.at(offset).plus(ctx.idx[axis])
    return ctx.value(0, tuple(idx_in))


def _lower_concat(ctx: LowerCtx):
    """A select chain over the pieces; each piece's loads clamp the axis loop index into
    the piece's own range, so no lane reads out of bounds (select drops those lanes)."""
    axis = normalize_axis(int(ctx.attr("axis")), len(ctx.shape))
    a = ctx.idx[axis]
    pieces, off = [], 0  # (input, offset)
    for i in range(len(ctx.node.inputs)):
        n = ctx.in_shape(i)[axis]
        if n:
            pieces.append((i, off))
        off += n
    if not pieces:  # an empty output: never read
        return const(0, ctx.dtype)
    if not any(a.coeffs):  # a fixed position along the axis: one piece holds it
        i, off = next((i, o) for i, o in reversed(pieces) if o <= a.const)
        return ctx.value(i, _moved(ctx.idx, axis, a.plus(ctx.at(off), -1)))
    j = a.single()
    if j is None:
        ctx.refuse(f"Concat axis index {a} is not one loop index")
    extent = ctx.extents[j]
    spans = []  # (input, offset, lo, hi): the loop index range of each piece
    for i, off in pieces:
        n = ctx.in_shape(i)[axis]
        lo, hi = max(off - a.const, 0), min(off + n - 1 - a.const, extent - 1)
        if lo <= hi:
            spans.append((i, off, lo, hi))
    if not spans:  # an empty loop along the axis (a probe of an empty output): never read
        return const(0, ctx.dtype)
    result = None
    for i, off, lo, hi in reversed(spans):
        idx_p = _moved(ctx.idx, axis, a.plus(ctx.at(off), -1))
        if len(spans) > 1:
            with ctx.clamped(j, lo, hi):
                e = ctx.value(i, idx_p)
        else:
            e = ctx.value(i, idx_p)
        if result is None:
            result = e
        else:
            cond = op("le", ctx.index(ctx.unit(j)), const(hi, "int64"))
            result = select(cond, e, result)
    return result


def _moved(idx: tuple, axis: int, a) -> tuple:
    return idx[:axis] + (a,) + idx[axis + 1:]


def _lower_tile(ctx: LowerCtx):
    shape = ctx.in_shape(0)
    idx_in, dyn = [], {}
    for d, (n, r) in enumerate(zip(shape, ctx.ints(1))):
        if n == 1:
            idx_in.append(ctx.zero())
        elif r == 1:
            idx_in.append(ctx.idx[d])
        else:  # position within the repeated block
            idx_in.append(ctx.zero())
            dyn[d] = op("mod", ctx.index(ctx.idx[d]), const(n, "int64"))
    return ctx.gather(0, tuple(idx_in), dyn) if dyn else ctx.value(0, tuple(idx_in))


def _lower_pad(ctx: LowerCtx):
    shape, mode = ctx.in_shape(0), ctx.attr("mode", "constant")
    pairs = _pad_pairs(ctx.ints(1), ctx.ints(3), len(shape))
    fill = ctx.value(2, tuple(ctx.zero() for _ in ctx.in_shape(2))) if ctx.has(2) \
        else const(0, ctx.dtype)
    if 0 in shape:
        if mode != "constant":
            ctx.refuse(f"mode {mode} cannot pad an empty tensor {list(shape)}")
        return fill
    rejected, _ = _pad_rejected(mode, tuple(shape), pairs)
    if rejected:
        ctx.refuse(rejected)
    if any(_kept(n, p) <= 0 for p, n in zip(pairs, shape)):
        return fill  # constant: the crops leave nothing of some axis, all is fill
    idx_in, dyn, inside, clamps = list(ctx.idx), {}, [], []
    for d, ((pb, pe), n) in enumerate(zip(pairs, shape)):
        a = ctx.idx[d]
        if pb == pe == 0:
            continue
        shifted = a.plus(ctx.at(pb), -1)
        if mode in ("constant", "edge"):
            pos = ctx.index(shifted)
            if mode == "constant":
                if pb > 0:
                    inside.append(op("ge", pos, const(0, "int64")))
                if pe > 0:
                    inside.append(op("le", pos, const(n - 1, "int64")))
            j = a.single()
            if j is not None:  # clamp the loop index: an affine, vectorizable load
                lo, hi = pb - a.const, pb - a.const + n - 1  # where it reads inside x
                if hi < 0 or lo > ctx.extents[j] - 1:
                    # The loop never reaches x along d: a clamp would take the loop index
                    # out of its range, where the index maps of the ops below (a Flatten's
                    # carries, an Expand's broadcast) do not hold. One position is read.
                    if mode == "constant":
                        return fill
                    idx_in[d] = ctx.at(n - 1 if hi < 0 else 0)  # past its end, before it
                    continue
                clamps.append((j, lo, hi))
                idx_in[d] = shifted
                continue
            pos = op("max", op("min", pos, const(n - 1, "int64")), const(0, "int64"))
        else:  # reflect, wrap: inside what the crops leave, [crop, crop + extent)
            crop, extent = max(-pb, 0), _kept(n, (pb, pe))
            pos = ctx.index(a.plus(ctx.at(max(pb, 0)), -1))
            pos = _reflect(pos, extent) if mode == "reflect" else \
                op("mod", pos, const(extent, "int64"))
            if crop:
                pos = op("add", pos, const(crop, "int64"))
        idx_in[d], dyn[d] = ctx.zero(), pos
    e = _clamped_load(ctx, tuple(idx_in), dyn, clamps)
    for cond in inside:
        e = select(cond, e, fill)
    return e


def _clamped_load(ctx: LowerCtx, idx: tuple, dyn: dict, clamps: list):
    if clamps:
        (j, lo, hi), rest = clamps[0], clamps[1:]
        with ctx.clamped(j, lo, hi):
            return _clamped_load(ctx, idx, dyn, rest)
    return ctx.gather(0, idx, dyn) if dyn else ctx.value(0, idx)


def _reflect(pos, n: int):
    """Mirror an int64 position into [0, n) without repeating the edge (mode reflect)."""
    if n == 1:
        return const(0, "int64")
    period = 2 * (n - 1)
    t = op("mod", op("abs", pos), const(period, "int64"))
    return select(op("lt", t, const(n, "int64")), t, op("sub", const(period, "int64"), t))


def _lower_trilu(ctx: LowerCtx):
    k = ctx.value(1, tuple(ctx.zero() for _ in ctx.in_shape(1))) if ctx.has(1) \
        else const(0, "int64")  # a scalar, constant or not
    row, col = ctx.index(ctx.idx[-2]), ctx.index(ctx.idx[-1])
    diff = op("sub", col, row)  # j - i
    keep = op("ge", diff, k) if ctx.attr("upper", 1) else op("le", diff, k)
    return select(keep, ctx.value(0, ctx.idx), const(0, ctx.dtype))


_register("Concat", LAYOUT, _concat_infer, _concat_ref, lower=_lower_concat, shape_like=True,
          exact="copy")
_register("Tile", LAYOUT, _tile_infer, _tile_ref, shape_inputs=(1,), lower=_lower_tile,
          shape_like=True, exact="copy")
_register("Slice", LAYOUT, _slice_infer, _slice_ref, shape_inputs=(1, 2, 3, 4),
          lower=_lower_slice, shape_like=True, exact="copy")
_register("Split", LAYOUT, _split_infer, _split_ref, shape_inputs=(1,), lower=_lower_split,
          exact="copy")
_register("Pad", LAYOUT, _pad_infer, _pad_ref, shape_inputs=(1, 3), lower=_lower_pad, exact="copy")
_register("Trilu", LAYOUT, _trilu_infer, _trilu_ref, lower=_lower_trilu, exact="copy")
