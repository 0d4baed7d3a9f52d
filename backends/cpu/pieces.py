"""Index-set splitting: an elementwise kernel's innermost loop run as consecutive pieces.

A Concat along the innermost dim lowers to a select chain on that loop's index, and each
piece's reads carry a clamp on it (kernel IR Load.clamps) so that no lane reads out of
bounds:

    y[768*i1 + i2] = select(le(idx(i2), 191), a[... | i2 in [0, 191]],
                            select(le(idx(i2), 383), b[... | i2 in [192, 383]], ...))

Emitted as one loop, every element computes every branch at clamped addresses, which LLVM
does not vectorize: Swin's patch merging (four strided quarters concatenated on the
channels, plus the residual Add) ran 3.5-6x slower than onnxruntime's Concat. Split at
the points where a comparison of the index or a clamp changes, each piece's loop knows its
index range: a comparison decided over the whole piece is a constant (the select takes one
arm, the other is never emitted), a clamp that holds the whole piece is dropped, and one
the piece lies outside of pins the index at its bound. What is left is a plain loop that
LLVM vectorizes. The same holds for a Pad or a Slice-and-Concat rotation on that dim
(rotary embeddings' rotate_half).

Only comparisons of an index that moves along the split dim alone with an integer constant
are decided (`lt`, `le`, `gt`, `ge`: monotone in the index, so the two ends of a piece
decide it); anything else is left to run time, which is always correct.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

from autoclust import symbolic
from autoclust.kernel import ir as kir

MAX_PIECES = 9       # more pieces than this: one loop (code size, loop overhead)
_CMP: dict[str, Callable[[int, int], bool]] = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}

Piece = tuple[int, int, int]   # (dim, first index, last index), both ends included


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and not symbolic.is_sym(x)


def _along(e: kir.Expr, d: int) -> tuple[int, int] | None:
    """(coefficient, constant) of an Index that moves along dim d only, else None."""
    if not isinstance(e, kir.Index) or not _int(e.index.const):
        return None
    coeffs = e.index.coeffs
    if not all(_int(c) for c in coeffs) or coeffs[d] == 0 or \
            any(c for k, c in enumerate(coeffs) if k != d):
        return None
    return coeffs[d], e.index.const


def _comparison(e: kir.Expr, d: int) -> Callable[[int], bool] | None:
    """The predicate i -> bool of `e` on dim d's index, when e compares an index along d
    with an integer constant (either side)."""
    if not isinstance(e, kir.Op) or e.name not in _CMP or len(e.args) != 2:
        return None
    a, b = e.args
    cmp = _CMP[e.name]
    lin = _along(a, d)
    if lin is not None and isinstance(b, kir.Const) and _int(b.value):
        c, c0, k = lin[0], lin[1], b.value
        return lambda i: cmp(c * i + c0, k)
    lin = _along(b, d)
    if lin is not None and isinstance(a, kir.Const) and _int(a.value):
        c, c0, k = lin[0], lin[1], a.value
        return lambda i: cmp(k, c * i + c0)
    return None


def _change(pred: Callable[[int], bool], n: int) -> int | None:
    """The first i in 1..n-1 where the monotone pred differs from pred(0), if any."""
    first = pred(0)
    if pred(n - 1) == first:
        return None
    lo, hi = 0, n - 1          # pred(lo) == first, pred(hi) != first
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid) == first:
            lo = mid
        else:
            hi = mid
    return hi


def split(k: kir.Kernel, d: int) -> list[tuple[int, int]] | None:
    """The pieces [start, stop) of dim d of elementwise kernel k, or None for one loop."""
    n = k.shape[d]
    if not _int(n) or n < 2 or k.n_inner or k.reductions or k.scan:
        return None
    points: set[int] = set()
    for e in kir.kernel_exprs(k):
        if isinstance(e, kir.Load):
            for dim, lo, hi in e.clamps:
                if dim == d and _int(lo) and _int(hi):
                    points.update((lo, hi + 1))
        pred = _comparison(e, d)
        if pred is not None:
            p = _change(pred, n)
            if p is not None:
                points.add(p)
    cuts = sorted(p for p in points if 0 < p < n)
    if not cuts or len(cuts) + 1 > MAX_PIECES:
        return None
    bounds = [0] + cuts + [n]
    return list(itertools.pairwise(bounds))


def decided(e: kir.Op, piece: Piece) -> bool | None:
    """e's value over the whole piece when e is a comparison `split` understands and
    the piece's two ends agree on it (monotone: then so does every index between)."""
    d, first, last = piece
    pred = _comparison(e, d)
    if pred is None:
        return None
    v = pred(first)
    return v if pred(last) == v else None


def clamp(lo: int, hi: int, piece: Piece) -> tuple[int, int] | None:
    """A clamp of the piece's dim into [lo, hi], over the piece: None when it holds the
    whole piece (no clamp needed), (b, b) when the piece lies beyond bound b (the index is
    pinned there), else (lo, hi) unchanged."""
    _, first, last = piece
    if not (_int(lo) and _int(hi)):
        return lo, hi
    if lo <= first and last <= hi:
        return None
    if last < lo:
        return lo, lo
    if first > hi:
        return hi, hi
    return lo, hi


def through(lo: int, hi: int, piece: Piece | None) -> Piece | None:
    """The range of the piece's index after a clamp into [lo, hi] (clamping is monotone:
    its two ends clamped), for the next clamp of the same read to be judged on (a Pad's
    edge clamp, then the constant Pad's inside it); None once a bound is not an int."""
    if piece is None or not (_int(lo) and _int(hi)):
        return None
    d, first, last = piece
    return d, min(max(first, lo), hi), min(max(last, lo), hi)
