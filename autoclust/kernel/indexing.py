"""Index algebra of the kernel IR: affine maps between a loop nest and tensor layouts.

Every function here is pure arithmetic on `kernel_ir.Affine` forms (const + sum of
coeff * loop index); fusion and the op lowerings use them to turn layout ops into index
maps instead of copies:

    flat_index((i0, i1), (8, 64))             -> 64*i0 + i1
    broadcast_index((i0, i1), (8, 64), (64,)) -> (i1,)
    split_index: x [8, 256] read as [8, 4, 64] -> (i0, 64*i1 + i2)
    delinearize(64*i0 + i1, (512,), ...)      -> (64*i0 + i1,)  (None when not affine)

A "row domain" is the loop nest of a row kernel: the kept dims of a reduced tensor outer,
its reduced dims inner. `refined_row_domain` finds a nest that refines two shapes at once
(GroupNorm reads x [N, G, C/G*H*W] but stores y [N, C, H, W]).
"""

from __future__ import annotations

import itertools
import math

from autoclust.kernel import ir as kir
from autoclust.kernel.ir import Affine

Idx = tuple[Affine, ...]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def identity_index(shape: tuple[int, ...]) -> Idx:
    """(i0, i1, ...): the index of a loop nest over `shape` into a tensor of that shape."""
    return tuple(kir.unit(k, len(shape)) for k in range(len(shape)))


def flat_index(idx: Idx, shape: tuple[int, ...], rank: int) -> Affine:
    """The flat element offset of logical index `idx` in a contiguous array of `shape`."""
    out = kir.constant(0, rank)
    for a, s, d in zip(idx, contiguous_strides(shape), shape):
        if d != 1:
            out = out.plus(a, s)
    return out


def broadcast_index(idx: Idx, out_shape: tuple[int, ...], in_shape: tuple[int, ...],
                    rank: int) -> Idx:
    """Index into an operand broadcast (numpy rules) to `out_shape`."""
    lead = len(out_shape) - len(in_shape)
    return tuple(kir.constant(0, rank) if size == 1 else idx[d + lead]
                 for d, size in enumerate(in_shape))


def split_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...], idx: Idx,
                rank: int) -> Idx | None:
    """x's index when x (in_shape) is read as out_shape and every dim of x is split into
    (or equal to) a run of output dims: BERT's [8, 128, 256] -> [8, 128, 4, 64]. Merging
    dims would need div/mod: None."""
    out_dims = [k for k, d in enumerate(out_shape) if d != 1]  # size-1 dims index at 0
    idx_in, j = [], 0
    for d in in_shape:
        if d == 1:
            idx_in.append(kir.constant(0, rank))
            continue
        acc, run = 1, kir.constant(0, rank)
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
                extents: tuple[int, ...]) -> Idx | None:
    """The index into a contiguous `shape` of flat offset `flat`, or None if not affine.

    Each loop index i_k (in [0, extents[k])) must land in one dim: its coefficient is a
    multiple of that dim's stride and the dim's terms stay below its size, so no carry
    crosses dims. [4, 8 | 8, 1024] reads x[4, 8, 8192] at (i0, i1, 1024*i2 + i3).
    An empty `shape` (a zero dim) is never read: any index does.
    """
    rank = len(flat.coeffs)
    if 0 in shape:
        return tuple(kir.constant(0, rank) for _ in shape)
    strides = contiguous_strides(shape)
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


def reshape_index(idx: Idx, out_shape: tuple[int, ...], in_shape: tuple[int, ...],
                  extents: tuple[int, ...]) -> Idx | None:
    """x's index when x (in_shape) is read as out_shape at idx; None if not affine."""
    rank = len(extents)
    got = split_index(in_shape, out_shape, idx, rank)
    if got is None:  # a merge: affine only when the loop nest refines both shapes
        got = delinearize(flat_index(idx, out_shape, rank), in_shape, extents)
    return got


def reduced_index(inner: tuple[int, ...], sizes: tuple[int, ...], rank: int) -> Idx | None:
    """Indices of reduced dims `sizes` over the inner loops `inner` (a refinement of them)."""
    if math.prod(inner) != math.prod(sizes):
        return None
    coeffs, acc = [0] * rank, 1
    for k in range(len(inner) - 1, -1, -1):
        coeffs[rank - len(inner) + k] = acc
        acc *= inner[k]
    extents = (1,) * (rank - len(inner)) + tuple(inner)
    return delinearize(Affine(0, tuple(coeffs)), sizes, extents)


def row_domain(v_shape: tuple[int, ...], x_shape: tuple[int, ...],
               axes: list[int]) -> tuple[tuple[int, ...], Idx] | None:
    """(loop shape, root index) of a row kernel reducing `axes` of x: kept dims outer,
    reduced dims inner. The root v must have x's shape (stored per element, like Softmax)
    or the reduction's output shape (stored per row, like ReduceMean); else None."""
    kept = [d for d in range(len(x_shape)) if d not in axes]
    order = kept + list(axes)
    shape = tuple(x_shape[d] for d in order)
    rank = len(shape)
    pos = {d: order.index(d) for d in order}
    if tuple(v_shape) == tuple(x_shape):
        return shape, tuple(kir.unit(pos[d], rank) for d in range(len(x_shape)))
    keep_shape = tuple(1 if d in axes else x_shape[d] for d in range(len(x_shape)))
    if tuple(v_shape) == keep_shape:
        return shape, tuple(kir.constant(0, rank) if d in axes else kir.unit(pos[d], rank)
                            for d in range(len(x_shape)))
    if tuple(v_shape) == tuple(x_shape[d] for d in kept):
        return shape, tuple(kir.unit(pos[d], rank) for d in kept)
    return None


def _boundaries(shape: tuple[int, ...]) -> set[int]:
    """Suffix products of `shape`: the flat strides where its dims start."""
    out, acc = {1}, 1
    for d in reversed(shape):
        acc *= d
        out.add(acc)
    return out


def refined_row_domain(v_shape: tuple[int, ...], x_shape: tuple[int, ...],
                       axes: list[int]) -> tuple[tuple[int, ...], int, Idx] | None:
    """(loop shape, n_inner, root index) of a row kernel reducing x's trailing `axes`
    whose root `v` is a Reshape of x (GroupNorm: x [4, 8, 8192], v [4, 64, 32, 32]).

    The loop nest is the common refinement of both shapes ([4, 8 | 8, 32, 32]) so that
    Reshapes either way are affine index maps (see delinearize); None if there is none.
    """
    n = len(x_shape)
    total = math.prod(x_shape)
    if (not axes or axes != list(range(n - len(axes), n)) or 0 in x_shape
            or math.prod(v_shape) != total):
        return None
    cuts = sorted(_boundaries(x_shape) | _boundaries(v_shape), reverse=True)
    if any(a % b for a, b in itertools.pairwise(cuts)):
        return None
    shape = tuple(a // b for a, b in itertools.pairwise(cuts))
    row = math.prod(x_shape[n - len(axes):])
    n_inner = sum(1 for c in cuts[1:] if c < row)
    if n_inner == 0:
        # one-element rows leave no cut inside the row (GroupNorm of one channel per
        # group over 1x1 pixels: x [2, 3, 1], v [2, 3, 1, 1]): a unit inner loop
        shape, cuts, n_inner = shape + (1,), cuts + [1], 1
    flat = Affine(0, tuple(cuts[1:]))
    idx = delinearize(flat, tuple(v_shape), shape)
    return (shape, n_inner, idx) if idx is not None else None
