"""Indexing traced arrays: x[1:, ::-1, None, ..., 3], x[idx], np.take.

Basic indexing (ints, slices with any step, None, Ellipsis) becomes one Slice with
constant starts/ends/steps plus a Reshape that drops integer-indexed axes and inserts the
new ones. One advanced index (an integer array, constant or traced, or a constant 1-D
boolean mask, with full slices elsewhere) becomes Gather. NumPy checks every key on a
zero-strided stand-in of the array first, so bounds errors and result shapes are NumPy's.
A traced boolean mask is refused: the result's size would depend on the data.

    x[2:0:-1]  ->  Slice(x, starts=[2], ends=[0], axes=[0], steps=[-1])
    x[:, 0]    ->  Slice(x, [0], [1], [1], [1]) -> Reshape(drop axis 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autoclust.importers.numpy.functions import numpy_says, refuse, stand_in
from autoclust.importers.numpy.trace import Tracer, context_of, unsupported, view_of

INT64_MIN = np.iinfo(np.int64).min  # ONNX's "before the first element" for negative steps


def _stand_in_key(k: Any) -> Any:
    if isinstance(k, Tracer):  # a traced index: valid position 0 of its shape
        return np.zeros(k.shape, dtype=np.intp if k.dtype.kind in "iu" else k.dtype)
    return k


def _is_advanced(k: Any) -> bool:
    return isinstance(k, (Tracer | list | np.ndarray, bool | np.bool_))


def getitem(x: Tracer, key: Any) -> Tracer:
    """x[key] for a traced x."""
    key = key if isinstance(key, tuple) else (key,)
    expected = numpy_says("indexing", [x, key], lambda: stand_in(x)[
        tuple(_stand_in_key(k) for k in key)].shape)
    advanced = [i for i, k in enumerate(key) if _is_advanced(k)]
    if advanced:
        return _advanced(x, key, advanced, tuple(expected))
    return _basic(x, key, tuple(expected))


def _expand_ellipsis(key: tuple, ndim: int) -> list[Any]:
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    out: list[Any] = []
    for k in key:
        if k is Ellipsis:
            out += [slice(None)] * (ndim - used)
        else:
            out.append(k)
    if not any(k is Ellipsis for k in key):
        out += [slice(None)] * (ndim - used)
    return out


def _slice_bounds(k: Any, dim: int) -> tuple[int, int, int] | None:
    """ONNX (start, end, step) for one int or slice on a dim; None when it keeps all."""
    if isinstance(k, slice):
        start, stop, step = k.indices(dim)
        if (start, stop, step) == (0, dim, 1):
            return None
        if step < 0 and stop < 0:
            stop = INT64_MIN
        return start, stop, step
    i = int(k) + dim if int(k) < 0 else int(k)
    return i, i + 1, 1


def _basic(x: Tracer, key: tuple, expected: tuple) -> Tracer:
    ctx = context_of([x])
    b = ctx.builder
    starts, ends, axes, steps = [], [], [], []
    axis = 0
    for k in _expand_ellipsis(key, x.ndim):
        if k is None:
            continue
        bounds = _slice_bounds(k, x.shape[axis])
        if bounds is not None:
            starts.append(bounds[0])
            ends.append(bounds[1])
            steps.append(bounds[2])
            axes.append(axis)
        axis += 1
    op = ctx.operand(x)
    if axes:
        i64 = np.int64
        op = b.Slice(op, np.asarray(starts, i64), np.asarray(ends, i64),
                     np.asarray(axes, i64), np.asarray(steps, i64))
    if tuple(op.shape) != expected:
        op = b.Reshape(op, np.asarray(expected, np.int64), allowzero=int(0 in expected))
    elif not axes:
        return x  # x[...], x[:] or x[()] of an immutable array: the array itself
    return view_of(x, ctx.wrap(op, x.dtype, expected, "indexing"))


def _advanced(x: Tracer, key: tuple, advanced: list[int], expected: tuple) -> Tracer:
    full = _expand_ellipsis(key, x.ndim)
    where = [i for i, k in enumerate(full) if _is_advanced(k)]
    rest_ok = all(isinstance(k, slice) and k == slice(None) for i, k in enumerate(full)
                  if i not in where)
    if len(advanced) != 1 or not rest_ok or any(k is None for k in full):
        raise unsupported("indexing", [x, key], {}, "one index array with full slices ':' "
                          "elsewhere is supported; split the indexing into steps")
    return _gather(x, full[where[0]], where[0], expected, "indexing")


def _gather(x: Any, index: Any, axis: int, expected: tuple, what: str) -> Tracer:
    ctx = context_of([x, index])
    b = ctx.builder
    if isinstance(index, Tracer):
        if index.dtype.kind not in "iu":
            raise unsupported(what, [x, index], {}, "a traced boolean (or float) index: the "
                              "result's size would depend on the data; use np.where")
        idx = ctx.cast(ctx.operand(index), np.int64)
    else:
        array = np.asarray(index)
        if array.dtype == bool:
            if array.ndim != 1:
                raise unsupported(what, [x, index], {}, "a multi-dimensional boolean mask")
            array = np.nonzero(array)[0]
        idx = b.constant(array.astype(np.int64))
    return ctx.wrap(b.Gather(ctx.operand(x), idx, axis=axis), x.dtype, expected, what)


def take(a: Any, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise"
         ) -> Tracer:
    """np.take -> Gather (axis None: of the flattened array)."""
    refuse("np.take", [a, indices], {}, out=(out, None), mode=(mode, "raise"))
    x = np.ravel(a) if axis is None else a
    ax = 0 if axis is None else int(axis) % max(x.ndim, 1)
    expected = numpy_says("np.take", [a, indices], lambda: np.take(
        stand_in(x), _stand_in_key(indices), axis=ax).shape)
    return _gather(x, indices, ax, tuple(expected), "np.take")


FUNCTIONS = {np.take: take}
