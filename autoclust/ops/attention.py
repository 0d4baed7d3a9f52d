"""FusedAttention (domain "autoclust"): softmax(Q K^T * scale + mask) V as one library call.

Never in a model: autoclust.passes.attention makes it, at compile time, from the patterns
exports produce, for backends whose policy asks for it (Policy.fused_attention: the GPU,
which runs it as one kernel keeping the scores on chip). Its inputs are the tensors the
pattern read *before* any layout op (Transpose, Reshape, Unsqueeze, Expand): each is read
through a strided view, so the head split, K's transpose and grouped-query heads' repeat
cost no kernel. Attributes:

    batch        the output's batch dims (the scores' leading dims)
    q_view, k_view, v_view, m_view
                 how Q [nb, Sq, D], K [nb, Sk, D], V [nb, Sk, Dv] and the mask [nb, Sq, Sk]
                 sit in their input's elements: view_ints() below (nb = prod(batch))
    scale        scores = (Q K^T) * scale
    mask         "" (none), "add" (scores + mask) or "select" (mask ? scores : fill)
    fill         the select's value for masked-out scores
    causal       key j is masked out (-inf) where j > i + causal_offset (0: no such mask)
    nan_to_zero  1: a row whose scores are all -inf gives 0 (the exporters' IsNaN/Where
                 guard; a NaN row too), else NaN (as Softmax does); 2: rows of -inf
                 scores give 0, NaN rows stay NaN (torch 2.13's decomposition:
                 Where(all(S == -inf), 0, P))

Output: [*batch, Sq, Dv] in Q's dtype. The reference below is the unfused math in float32
(float64 inputs: float64), rounded once to the output dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from autoclust.errors import OutOfBoundsError
from autoclust.ops.table import LIBRARY, Arrays, InferContext, TypeShape, register

DOMAIN = "autoclust"
OP = "FusedAttention"
# A view: batch sub-dims [(size, stride)...] (mixed radix over the flat batch index, last
# fastest; their sizes multiply to nb), then (rows, row stride) and (cols, col stride), in
# elements of the input it reads.
View = tuple[tuple[tuple[int, int], ...], tuple[int, int], tuple[int, int]]


def view_ints(view: View) -> list[int]:
    """A view as an int-list attribute: n, (size, stride) * n, rows, rs, cols, cs."""
    batch, (r, rs), (c, cs) = view
    return [len(batch)] + [x for sd in batch for x in sd] + [r, rs, c, cs]


def view_of(ints: Sequence[int]) -> View:
    """The inverse of view_ints."""
    ints = [int(x) for x in ints]
    n = ints[0]
    batch = tuple((ints[1 + 2 * i], ints[2 + 2 * i]) for i in range(n))
    r, rs, c, cs = ints[1 + 2 * n:5 + 2 * n]
    return batch, (r, rs), (c, cs)


def gather(base: np.ndarray, view: View) -> np.ndarray:
    """[nb, rows, cols]: the elements of `base` a view reads (a copy)."""
    batch, (r, rs), (c, cs) = view
    flat = np.ascontiguousarray(base).reshape(-1)
    last = sum((n - 1) * st for n, st in batch) + (r - 1) * rs + (c - 1) * cs
    if flat.size and last >= flat.size:  # as_strided would read past the buffer
        raise OutOfBoundsError(f"FusedAttention: a view reaching element {last} of an input "
                               f"of {flat.size} elements (shape {tuple(base.shape)})")
    size = flat.itemsize
    shape = tuple(s for s, _ in batch) + (r, c)
    strides = tuple(st * size for _, st in batch) + (rs * size, cs * size)
    if flat.size == 0:
        return np.zeros((math.prod(s for s, _ in batch), r, c), flat.dtype)
    view_arr = np.lib.stride_tricks.as_strided(flat, shape, strides, writeable=False)
    return np.array(view_arr).reshape(-1, r, c)


def _infer(ctx: InferContext) -> list[TypeShape]:
    batch = [int(d) for d in ctx.attr("batch", [])]
    q = view_of(ctx.attr("q_view"))
    v = view_of(ctx.attr("v_view"))
    return [(ctx.dtypes[0], tuple(batch) + (q[1][0], v[2][0]))]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray | None,
              attrs: dict[str, Any]) -> np.ndarray:
    """The unfused math on [nb, ...] operands, in float32 (float64 for float64)."""
    work = np.float64 if q.dtype == np.float64 else np.float32
    with np.errstate(all="ignore"):
        s = np.matmul(q.astype(work), np.swapaxes(k.astype(work), 1, 2))
        s = s * work(attrs.get("scale", 1.0))
        kind = attrs.get("mask", "")
        if kind == "add":
            s = s + m.astype(work)
        elif kind == "select":
            s = np.where(m.astype(bool), s, work(attrs.get("fill", -np.inf)))
        if attrs.get("causal", 0):
            i = np.arange(s.shape[1])[:, None]
            j = np.arange(s.shape[2])[None, :]
            s = np.where(j > i + int(attrs.get("causal_offset", 0)), work(-np.inf), s)
        top = s.max(axis=2, keepdims=True)
        e = np.exp(s - top)
        p = e / e.sum(axis=2, keepdims=True)
        guard = int(attrs.get("nan_to_zero", 0))
        if guard == 1:
            p = np.where(np.isnan(p), work(0), p)
        elif guard == 2:
            p = np.where(np.all(s == -np.inf, axis=2, keepdims=True), work(0), p)
        return np.matmul(p, v.astype(work))


def _ref(inputs: Arrays, attrs: dict[str, Any]) -> list[np.ndarray]:
    q, k, v = (gather(x, view_of(attrs[f"{n}_view"])) for x, n in zip(inputs[:3], "qkv"))
    m = None
    if attrs.get("mask", ""):
        m = gather(inputs[3], view_of(attrs["m_view"]))
    out = attention(q, k, v, m, attrs)
    shape = tuple(int(d) for d in attrs.get("batch", [])) + out.shape[1:]
    return [out.astype(inputs[0].dtype).reshape(shape)]


register(OP, LIBRARY, _infer, _ref, domain=DOMAIN,
         doc="FusedAttention(Q, K, V, mask?): softmax(Q K^T * scale + mask) V through "
             "strided views of its inputs; made by autoclust.passes.attention for backends "
             "whose policy asks for it (see autoclust/ops/attention.py)")
