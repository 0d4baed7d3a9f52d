"""NumPy layout functions on traced arrays: reshape, transpose, concatenate, stack, ...

Shapes are static while tracing, so every target shape, permutation and padding is a
constant: reshape(-1) is resolved here, expand_dims/squeeze become Reshape, moveaxis and
swapaxes become Transpose. NumPy checks the arguments on a zero-strided stand-in of the
array (no data), so its errors and shapes are NumPy's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from autoclust.importers.numpy.functions import (
    compute_dtype,
    normalize_axes,
    numpy_says,
    refuse,
    stand_in,
)
from autoclust.importers.numpy.trace import Tracer, context_of, unsupported, view_of

from autoclust.errors import InvalidInputError


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, Tracer) else np.shape(x)


def _shape_arg(name: str, shape: Any, args: Sequence[Any]) -> tuple[int, ...]:
    items = shape if isinstance(shape, tuple | list) else (shape,)
    if any(isinstance(d, Tracer) or not isinstance(d, int | np.integer) for d in items):
        raise unsupported(name, args, {}, f"the shape must be constant ints, got {shape!r}")
    return tuple(int(d) for d in items)


def reshape(a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None,
            copy: Any = None) -> Tracer:
    """np.reshape -> Reshape to a constant shape (-1 resolved here)."""
    shape = newshape if shape is None else shape
    if order != "C":
        raise unsupported("np.reshape", [a], {"order": order}, "only order='C'")
    target = list(_shape_arg("np.reshape", shape, [a, shape]))
    size = math.prod(a.shape)
    known = math.prod(d for d in target if d != -1)
    bad = target.count(-1) > 1 or any(d < -1 for d in target)
    if target.count(-1) == 1 and not bad:
        if known == 0 or size % known:
            bad = True
        else:
            target[target.index(-1)] = size // known
    if bad or math.prod(target) != size:
        raise InvalidInputError(f"np.reshape: cannot reshape array of size {size} into "
                                f"shape {tuple(shape) if isinstance(shape, list) else shape}")
    return _reshape(a, tuple(target), "np.reshape")


def _reshape(a: Any, target: tuple[int, ...], what: str) -> Tracer:
    ctx = context_of([a])
    x = ctx.operand(a)
    if tuple(x.shape) == target:
        return a if isinstance(a, Tracer) else ctx.wrap(x, x.dtype, target, what)
    r = ctx.builder.Reshape(x, np.asarray(target, np.int64), allowzero=int(0 in target))
    return view_of(a, ctx.wrap(r, x.dtype, target, what))


def ravel(a: Any, order: str = "C") -> Tracer:
    """np.ravel -> Reshape [-1]."""
    return reshape(a, -1, order=order)


def _transpose(a: Any, perm: Sequence[int], what: str) -> Tracer:
    perm = [int(p) for p in perm]
    if perm == sorted(perm):
        return a
    ctx = context_of([a])
    shape = tuple(a.shape[p] for p in perm)
    r = ctx.builder.Transpose(ctx.operand(a), perm=perm)
    return view_of(a, ctx.wrap(r, a.dtype, shape, what))


def transpose(a: Any, axes: Any = None) -> Tracer:
    """np.transpose / .T -> Transpose."""
    numpy_says("np.transpose", [a], lambda: np.transpose(stand_in(a), axes))
    n = a.ndim
    perm = range(n - 1, -1, -1) if axes is None else [int(x) % n for x in axes]
    return _transpose(a, list(perm), "np.transpose")


def swapaxes(a: Any, axis1: int, axis2: int) -> Tracer:
    """np.swapaxes -> Transpose."""
    numpy_says("np.swapaxes", [a], lambda: np.swapaxes(stand_in(a), axis1, axis2))
    perm = list(range(a.ndim))
    i, j = axis1 % a.ndim, axis2 % a.ndim
    perm[i], perm[j] = perm[j], perm[i]
    return _transpose(a, perm, "np.swapaxes")


def moveaxis(a: Any, source: Any, destination: Any) -> Tracer:
    """np.moveaxis -> Transpose (NumPy's own ordering rule)."""
    numpy_says("np.moveaxis", [a], lambda: np.moveaxis(stand_in(a), source, destination))
    n = a.ndim
    src = [s % n for s in np.atleast_1d(source).tolist()]
    dst = [d % n for d in np.atleast_1d(destination).tolist()]
    order = [i for i in range(n) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return _transpose(a, order, "np.moveaxis")


def _view_shape(name: str, a: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Tracer:
    """A reshape to the shape NumPy's view function `fn` gives (expand_dims, squeeze...)."""
    shape = numpy_says(name, [a], lambda: fn(stand_in(a)).shape)
    return _reshape(a, tuple(shape), name)


def broadcast_to(array: Any, shape: Any, subok: bool = False) -> Tracer:
    """np.broadcast_to -> Expand."""
    target = _shape_arg("np.broadcast_to", shape, [array, shape])
    numpy_says("np.broadcast_to", [array], lambda: np.broadcast_to(stand_in(array), target))
    ctx = context_of([array])
    if tuple(array.shape) == target:
        return array
    r = ctx.builder.Expand(ctx.operand(array), np.asarray(target, np.int64))
    return view_of(array, ctx.wrap(r, array.dtype, target, "np.broadcast_to"))


def broadcast_arrays(*args: Any, subok: bool = False) -> tuple[Any, ...]:
    """np.broadcast_arrays: each traced array expanded to the common shape."""
    shape = numpy_says("np.broadcast_arrays", args,
                       lambda: np.broadcast_shapes(*(shape_of(x) for x in args)))
    return tuple(broadcast_to(x, shape) if isinstance(x, Tracer) else np.broadcast_to(x, shape)
                 for x in args)


def concatenate(arrays: Any, axis: Any = 0, out: Any = None, *, dtype: Any = None,
                casting: str = "same_kind") -> Tracer:
    """np.concatenate -> Concat on the promoted dtype (axis None: flattened)."""
    arrays = list(arrays)
    refuse("np.concatenate", arrays, {}, out=(out, None), casting=(casting, "same_kind"))
    if axis is None:
        arrays, axis = [np.ravel(x) for x in arrays], 0
    res = numpy_says("np.concatenate", arrays, lambda: np.concatenate(
        [np.zeros(_unit(x), stand_in(x, 0).dtype) for x in arrays], axis=axis, dtype=dtype))
    shapes = [shape_of(x) for x in arrays]
    (ax,) = normalize_axes("np.concatenate", axis, len(shapes[0]), arrays)
    for s in shapes[1:]:
        if s[:ax] + s[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:]:
            raise InvalidInputError(f"np.concatenate: all the input array dimensions except "
                                    f"for the concatenation axis must match exactly, got "
                                    f"{shapes}")
    ctx = context_of(arrays)
    dt = np.dtype(res.dtype)
    shape = shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1:]
    ops = [ctx.operand(x, dt) for x in arrays]
    if len(ops) == 1:
        return ctx.wrap(ctx.builder.Identity(ops[0]), dt, shape, "np.concatenate")
    return ctx.wrap(ctx.builder.Concat(*ops, axis=ax), dt, shape, "np.concatenate")


def _unit(x: Any) -> tuple[int, ...]:
    return (1,) * len(shape_of(x))  # the rank check without the data


def stack(arrays: Any, axis: int = 0, out: Any = None, *, dtype: Any = None,
          casting: str = "same_kind") -> Tracer:
    """np.stack: expand_dims each, then concatenate."""
    arrays = list(arrays)
    refuse("np.stack", arrays, {}, out=(out, None), casting=(casting, "same_kind"))
    if not arrays:
        raise InvalidInputError("np.stack: need at least one array to stack")
    shapes = {shape_of(x) for x in arrays}
    if len(shapes) != 1:
        raise InvalidInputError(f"np.stack: all input arrays must have the same shape, got "
                                f"{sorted(shapes)}")
    (ax,) = normalize_axes("np.stack", axis, len(shapes.pop()) + 1, arrays)
    return concatenate([np.expand_dims(x, ax) for x in arrays], axis=ax, dtype=dtype)


def _atleast(n: int) -> Callable[..., Any]:
    fn = {1: np.atleast_1d, 2: np.atleast_2d, 3: np.atleast_3d}[n]

    def atleast(*arys: Any) -> Any:
        out = [_view_shape(fn.__name__, a, fn) if isinstance(a, Tracer) else fn(a)
               for a in arys]
        return out[0] if len(out) == 1 else tuple(out)
    return atleast


def hstack(tup: Any, *, dtype: Any = None, casting: str = "same_kind") -> Tracer:
    """np.hstack: concatenate along axis 0 for 1-D arrays, else axis 1."""
    arrs = [np.atleast_1d(x) for x in tup]
    return concatenate(arrs, axis=0 if np.ndim(arrs[0]) == 1 or (
        isinstance(arrs[0], Tracer) and arrs[0].ndim == 1) else 1, dtype=dtype)


def vstack(tup: Any, *, dtype: Any = None, casting: str = "same_kind") -> Tracer:
    """np.vstack: atleast_2d, then concatenate along axis 0."""
    return concatenate([np.atleast_2d(x) for x in tup], axis=0, dtype=dtype)


def tile(A: Any, reps: Any) -> Tracer:
    """np.tile -> Tile (reps padded with ones, as NumPy)."""
    reps = _shape_arg("np.tile", reps, [A, reps])
    shape = numpy_says("np.tile", [A], lambda: np.tile(np.zeros(_unit(A), A.dtype), reps).shape)
    ctx = context_of([A])
    x = ctx.operand(A)
    lead = len(shape) - A.ndim
    if lead:
        x = ctx.builder.Reshape(x, np.asarray((1,) * lead + tuple(A.shape), np.int64))
    reps = (1,) * (len(shape) - len(reps)) + tuple(reps)
    full = tuple(d * r for d, r in zip(x.shape, reps))
    return ctx.wrap(ctx.builder.Tile(x, np.asarray(reps, np.int64)), A.dtype, full, "np.tile")


def repeat(a: Any, repeats: Any, axis: Any = None) -> Tracer:
    """np.repeat with one constant count: Expand on a new axis, then Reshape."""
    if isinstance(repeats, Tracer) or np.ndim(repeats) != 0:
        raise unsupported("np.repeat", [a, repeats], {}, "repeats must be one constant int")
    r = int(repeats)
    x = np.ravel(a) if axis is None else a
    (ax,) = normalize_axes("np.repeat", 0 if axis is None else axis, x.ndim, [a])
    shape = tuple(x.shape)
    expanded = broadcast_to(np.expand_dims(x, ax + 1), shape[:ax + 1] + (r,) + shape[ax + 1:])
    return reshape(expanded, shape[:ax] + (shape[ax] * r,) + shape[ax + 1:])


_PAD_MODES = {"constant": "constant", "edge": "edge", "reflect": "reflect"}


def pad(array: Any, pad_width: Any, mode: str = "constant", **kwargs: Any) -> Tracer:
    """np.pad with mode constant, edge or reflect -> Pad."""
    if mode not in _PAD_MODES or set(kwargs) - {"constant_values"}:
        raise unsupported("np.pad", [array], {"mode": mode, **kwargs},
                          f"modes {', '.join(_PAD_MODES)} only (one constant value)")
    if isinstance(pad_width, Tracer):
        raise unsupported("np.pad", [array, pad_width], {}, "pad_width must be constant")
    n = array.ndim
    widths = numpy_says("np.pad", [array], lambda: np.broadcast_to(
        np.asarray(pad_width, dtype=np.int64), (n, 2)))
    if (widths < 0).any():
        raise InvalidInputError(f"np.pad: index can't contain negative values: {pad_width}")
    value = kwargs.get("constant_values", 0)
    if isinstance(value, Tracer) or np.ndim(value) != 0:
        raise unsupported("np.pad", [array], kwargs, "constant_values must be one constant")
    ctx = context_of([array])
    dt = np.dtype(array.dtype)
    x = ctx.cast(ctx.operand(array), compute_dtype(dt))
    pads = np.concatenate([widths[:, 0], widths[:, 1]]).astype(np.int64)
    const = ctx.builder.constant(np.asarray(value, dtype=dt).astype(x.dtype))
    r = ctx.builder.Pad(x, pads, const if mode == "constant" else None, mode=_PAD_MODES[mode])
    shape = tuple(int(d + w.sum()) for d, w in zip(array.shape, widths))
    return ctx.wrap(r, dt, shape, "np.pad")


def _trilu(upper: int) -> Callable[..., Tracer]:
    def trilu(m: Any, k: int = 0) -> Tracer:
        name = "np.triu" if upper else "np.tril"
        if m.ndim < 2:
            raise unsupported(name, [m], {}, "arrays of rank < 2")
        ctx = context_of([m])
        dt = np.dtype(m.dtype)
        x = ctx.cast(ctx.operand(m), compute_dtype(dt))
        r = ctx.builder.Trilu(x, np.int64(k), upper=upper)
        return ctx.wrap(r, dt, m.shape, name)
    return trilu


def flip(m: Any, axis: Any = None) -> Tracer:
    """np.flip -> a reversing slice on each axis."""
    axes = normalize_axes("np.flip", axis, m.ndim, [m])
    return m[tuple(slice(None, None, -1) if i in axes else slice(None)
                   for i in range(m.ndim))]


def _squeeze(a: Any, axis: Any = None) -> Tracer:
    return _view_shape("np.squeeze", a, lambda s: np.squeeze(s, axis))


def _expand_dims(a: Any, axis: Any) -> Tracer:
    return _view_shape("np.expand_dims", a, lambda s: np.expand_dims(s, axis))


FUNCTIONS = {
    np.reshape: reshape, np.ravel: ravel, np.transpose: transpose,
    np.permute_dims: transpose, np.swapaxes: swapaxes, np.moveaxis: moveaxis,
    np.matrix_transpose: lambda x: swapaxes(x, -1, -2), np.squeeze: _squeeze,
    np.expand_dims: _expand_dims, np.broadcast_to: broadcast_to,
    np.broadcast_arrays: broadcast_arrays, np.concatenate: concatenate, np.concat: concatenate,
    np.stack: stack, np.hstack: hstack, np.vstack: vstack, np.atleast_1d: _atleast(1),
    np.atleast_2d: _atleast(2), np.atleast_3d: _atleast(3), np.tile: tile,
    np.repeat: repeat, np.pad: pad, np.tril: _trilu(0), np.triu: _trilu(1), np.flip: flip,
}
