"""fuse_attention: softmax(Q K^T * scale + mask) V -> one FusedAttention node (ops/attention.py).

Run by autoclust.compile.lower_graph for a backend whose Policy.fused_attention is set (the
largest head dim it takes); the patterns are what exporters produce, after specialize and
the optimization rounds (every shape concrete):

    S = MatMul(q, kt)  |  com.microsoft::FusedMatMul(q, k, transB, alpha)
    S = Mul(S, c)  |  Div(S, c)                 optional; c a scalar constant
    S = Add(S, M)  |  Where(C, S, fill)         optional mask; fill a scalar constant
    P = Softmax(S, axis=-1)
    P = Where(IsNaN(P), 0, P)                   optional: torch's guard for rows all -inf
    O = MatMul(P, v)

q and kt may each be Mul(x, c) (the dynamo exporter splits the scale: sqrt(scale) on each).
Then q, kt, v and the mask are traced back through layout ops (Transpose, Reshape,
Unsqueeze, Squeeze, Expand, Identity) to the tensors they view: the fused node reads those
through strided views, so the heads' split, K's transpose (dynamo writes it as Reshape,
Transpose, Reshape) and grouped-query heads' Expand cost nothing. A constant mask that is
exactly "key j visible where j <= i + offset" (offset >= 0) becomes the `causal` attribute
(the kernel then skips the masked keys). Every intermediate (S, P, the guard) must have no
other reader, and the mask's trailing dims broadcast to the scores'.

    BERT (zoo)    MatMul(Transpose(q), Transpose(k)) / 8 + mask -> Softmax -> MatMul(v)
    LLaMA (zoo)   FusedMatMul(q, k, transB=1, alpha=0.25) -> Where(causal, S, -3.4e38) ...
    dynamo        MatMul(q * c, Reshape(Transpose(Reshape(k))) * c) + mask -> Softmax ->
                  Where(IsNaN) -> MatMul(v); GQA: v = Reshape(Expand(Unsqueeze(v)))
"""

from __future__ import annotations

import math
from typing import TypeGuard

import numpy as np

from autoclust import symbolic
from autoclust.ir import Graph, Node, Value
from autoclust.ops import attention as attn
from autoclust.passes.dce import dce
from autoclust.passes.edits import replace_node

Layout = list[list[tuple[int, int]]]   # per axis: sub-dims (size, stride), outermost first
VIEW_OPS = ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Identity")
DTYPES = ("float16", "float32", "bfloat16")
MASKED = -1e30   # a constant mask value at or below this hides its key (as -inf does)


def fuse_attention(graph: Graph, max_head_dim: int = 128, dtypes: tuple[str, ...] = (),
                   min_keys: int = 0, symbolic_sizes: bool = True) -> Graph:
    """`graph` with every matched attention replaced by one FusedAttention node (Q, K and
    V of one of `dtypes`, empty: DTYPES; at least `min_keys` keys; with `symbolic_sizes`
    false, only attention whose scores' shape is concrete, checked before any decision on
    a symbolic size could become a guard of its shape class)."""
    changed = False
    for node in list(graph.nodes):
        if node.op == "Softmax" and node.domain in ("", "ai.onnx") and node in graph.nodes \
                and (symbolic_sizes or not symbolic.has_syms(tuple(node.inputs[0].shape))):
            changed = _fuse(graph, node, max_head_dim, dtypes or DTYPES, min_keys) or changed
    return dce(graph) if changed else graph


# ---- the pattern -------------------------------------------------------------------------

Besides = tuple[Value, Node] | None  # a read that does not count: the torch guard's Equal


def _only_reader(graph: Graph, v: Value, besides: Besides = None) -> Node | None:
    """The one node reading v (once), or None (several readers, or a graph output);
    `besides` (value, node): that node's read of that value does not count."""
    uses = v.uses
    if besides is not None and v is besides[0]:
        uses = [u for u in uses if u[0] is not besides[1]]
    if len(uses) != 1 or v in graph.outputs:
        return None
    return uses[0][0]


def _scalar(graph: Graph, v: Value | None) -> float | None:
    c = graph.constant_value(v)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _is(node: Node | None, op: str) -> TypeGuard[Node]:
    return node is not None and node.op == op and node.domain in ("", "ai.onnx")


def _regrouped(v: Value, w: Value) -> bool:
    """Whether w is v with its batch dims regrouped (same last two dims, same flat batch
    index): the torch front end's bmm views [B, H, S, S] <-> [B * H, S, S]."""
    a, b = tuple(v.shape), tuple(w.shape)
    return len(a) >= 2 and len(b) >= 2 and a[-2:] == b[-2:] and \
        math.prod(a[:-2]) == math.prod(b[:-2])


def _up(graph: Graph, v: Value, besides: Besides = None) -> Value:
    """v's source through batch-regrouping Reshapes read only there."""
    node = v.producer
    while _is(node, "Reshape") and _only_reader(graph, v, besides) is not None \
            and _regrouped(node.inputs[0], v):
        v = node.inputs[0]
        node = v.producer
    return v


def _down(graph: Graph, v: Value) -> Value:
    """v's consumer through batch-regrouping Reshapes that are its only reader."""
    while True:
        reader = _only_reader(graph, v)
        if not _is(reader, "Reshape") or not _regrouped(v, reader.outputs[0]):
            return v
        v = reader.outputs[0]


def _consumer_chain(graph: Graph, softmax: Node) -> tuple[Node, int, Besides] | None:
    """(the MatMul reading the probabilities, nan_to_zero, the read of the scores by the
    guard of torch's decomposition) after a Softmax."""
    p = softmax.outputs[0]
    guard, besides = 0, None
    torch_guard = _torch_guard(graph, softmax)
    if torch_guard is not None:  # Where(all(S == -inf), 0, P)
        p, guard, besides = torch_guard[0].outputs[0], 2, (softmax.inputs[0], torch_guard[1])
    elif len(p.uses) == 2 and p not in graph.outputs:  # Where(IsNaN(P), 0, P)
        users = {n.op: n for n, _ in p.uses}
        isnan, where = users.get("IsNaN"), users.get("Where")
        if isnan is None or where is None or _only_reader(graph, isnan.outputs[0]) is not where:
            return None
        if where.inputs[0] is not isnan.outputs[0] or where.inputs[2] is not p \
                or _scalar(graph, where.inputs[1]) != 0.0:
            return None
        p, guard = where.outputs[0], 1
    p = _down(graph, p)
    reader = _only_reader(graph, p)
    if _is(reader, "MatMul") and reader.inputs[0] is p:
        return reader, guard, besides
    return None


def _torch_guard(graph: Graph, softmax: Node) -> tuple[Node, Node] | None:
    """(the Where, the Equal) of torch 2.13's guard on the probabilities P of scores S,
    which zeroes the rows whose every score is -inf (NaN rows stay NaN):

        Where(Not(Cast(ReduceMax(Cast(Not(Equal(S, -inf))), axis -1, keepdims))), 0, P)
    """
    s, p = softmax.inputs[0], softmax.outputs[0]
    where = _only_reader(graph, p)
    if not _is(where, "Where") or where.inputs[2] is not p or p in graph.outputs or \
            tuple(where.outputs[0].shape) != tuple(p.shape):  # zeros broadcasting P up (the
        # views below would refuse it too: a defence, no test reaches it alone)
        return None
    if not _zeros(graph, where.inputs[1]):
        return None
    node = where.inputs[0].producer
    for op in ("Not", "Cast", "ReduceMax", "Cast", "Not", "Equal"):
        if not _is(node, op) or len(node.outputs[0].uses) != 1:
            return None
        if op == "ReduceMax" and not _last_axis_kept(graph, node):
            return None
        if op == "Equal":
            break
        node = node.inputs[0].producer
    a, b = node.inputs
    other = b if a is s else a if b is s else None
    c = graph.constant_value(other) if other is not None else None
    if c is None or c.size != 1 or not np.isneginf(c.reshape(-1)[0]):
        return None
    return where, node


def _zeros(graph: Graph, v: Value | None) -> bool:
    """Whether v is a constant of +0s: an initializer, or a ConstantOfShape of 0 (torch's
    full_like, left unfolded: it outgrows its input)."""
    node = v.producer if v is not None else None
    if _is(node, "ConstantOfShape"):
        fill = node.attr("value", None)
        return fill is None or (np.asarray(fill).size == 1 and
                                float(np.asarray(fill).reshape(-1)[0]) == 0.0 and
                                not np.signbit(np.asarray(fill).reshape(-1)[0]))
    c = graph.constant_value(v)
    return c is not None and c.size > 0 and not np.any(c != 0) and not np.any(np.signbit(c))


def _last_axis_kept(graph: Graph, node: Node) -> bool:
    """Whether a ReduceMax reduces its input's last axis alone, keeping it."""
    rank = len(node.inputs[0].shape)
    axes = node.attr("axes", None)
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        c = graph.constant_value(node.inputs[1])
        axes = None if c is None else [int(x) for x in c.reshape(-1)]
    return axes is not None and [a % rank for a in axes] == [rank - 1] and \
        node.attr("keepdims", 1) == 1


def _from_scores(v: Value) -> bool:
    """Whether v is a scores MatMul's output, or a scaling (or regrouping) of one."""
    node = v.producer
    for _ in range(3):
        if node is None or node.op in ("MatMul", "FusedMatMul"):
            break
        node = node.inputs[0].producer if node.op in ("Mul", "Div", "Reshape") and \
            node.inputs[0] is not None else None
    return node is not None and node.op in ("MatMul", "FusedMatMul")


def _scores(graph: Graph, s: Value, attrs: dict, besides: Besides = None
            ) -> tuple[Node, float] | None:
    """Walk up from the Softmax input through the mask and scale to the scores' MatMul:
    (that node, the scale), filling attrs' mask entries (the mask with the shape it is
    added at)."""
    scale = 1.0
    s = _up(graph, s, besides)
    node = s.producer
    if _is(node, "Add") and _only_reader(graph, s, besides) is not None:
        x, m = node.inputs
        if _from_scores(m) and not _from_scores(x):
            x, m = m, x   # Add(mask, S)
        attrs.update(mask="add", _mask=(m, tuple(s.shape[:-2])))
        s = x
    elif _is(node, "Where") and _scalar(graph, node.inputs[2]) is not None \
            and _only_reader(graph, s, besides) is not None:
        attrs.update(mask="select", _mask=(node.inputs[0], tuple(s.shape[:-2])),
                     fill=_scalar(graph, node.inputs[2]))
        s = node.inputs[1]
    s = _up(graph, s, besides)
    node = s.producer
    if node is None or _only_reader(graph, s, besides) is None:
        return None
    if (_is(node, "Mul") or _is(node, "Div")) and _scalar(graph, node.inputs[1]) is not None:
        c = _scalar(graph, node.inputs[1])
        scale = c if node.op == "Mul" else 1.0 / c
        s = _up(graph, node.inputs[0])
        node = s.producer
        if node is None or _only_reader(graph, s, besides) is None:
            return None
    if _is(node, "MatMul") or (node.op == "FusedMatMul" and node.domain == "com.microsoft"
                               and not node.attr("transA", 0)):
        alpha = float(node.attr("alpha", 1.0)) if node.op == "FusedMatMul" else 1.0
        return node, scale * alpha
    return None


def _prescaled(graph: Graph, v: Value) -> tuple[Value, float]:
    """(x, c) when v = Mul(x, c) with c a scalar constant read only here; else (v, 1)."""
    node = v.producer
    if _is(node, "Mul") and _only_reader(graph, v) is not None:
        for i in (0, 1):
            c = _scalar(graph, node.inputs[1 - i])
            if c is not None:
                return node.inputs[i], c
    return v, 1.0


def _fuse(graph: Graph, softmax: Node, max_head_dim: int, dtypes: tuple[str, ...],
          min_keys: int) -> bool:
    axis = softmax.attr("axis", -1)
    rank = len(softmax.inputs[0].shape)
    if axis not in (-1, rank - 1) or rank < 2:
        return False
    chain = _consumer_chain(graph, softmax)
    if chain is None:
        return False
    out_mm, nan_to_zero, besides = chain
    attrs: dict = {"nan_to_zero": nan_to_zero}
    found = _scores(graph, softmax.inputs[0], attrs, besides)
    if found is None:
        return False
    mm, scale = found
    q, cq = _prescaled(graph, mm.inputs[0])
    kt, ck = _prescaled(graph, mm.inputs[1])
    k_rows_last = not (mm.op == "FusedMatMul" and mm.attr("transB", 0))  # kt is [.., D, Sk]
    views = _views(graph, mm.outputs[0], q, kt, k_rows_last, out_mm, attrs.get("_mask"))
    if views is None:
        return False
    (qb, qv), (kb, kv), (vb, vv), mask = views
    d, dv = qv[2][0], vv[2][0]
    if q.dtype.name not in dtypes or not q.dtype == kt.dtype == out_mm.inputs[1].dtype \
            or max(d, dv) > max_head_dim or kv[1][0] < min_keys:
        return False
    attrs.update(scale=scale * cq * ck, batch=list(out_mm.outputs[0].shape[:-2]),
                 q_view=attn.view_ints(qv), k_view=attn.view_ints(kv),
                 v_view=attn.view_ints(vv))
    inputs = [qb, kb, vb]
    attrs.pop("_mask", None)
    if mask is not None:
        m = _mask_input(graph, mask, attrs)
        if m is not None:
            inputs.append(m)
    if not attrs.get("mask"):
        attrs.pop("fill", None)
    replace_node(graph, out_mm, attn.OP, inputs, attrs, attn.DOMAIN)
    return True


# ---- views ---------------------------------------------------------------------------------

def _contiguous(shape: tuple[int, ...]) -> Layout:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return [[(d, s)] for d, s in zip(shape, reversed(strides))]


def _reshape(layout: Layout, shape: tuple[int, ...]) -> Layout | None:
    """The layout of a Reshape of `layout` to `shape` (None: not a strided view)."""
    flat = [sd for ax in layout for sd in ax if sd[0] != 1]
    out, i = [], 0
    for n in shape:
        ax, need = [], n
        while need > 1:
            if i >= len(flat):
                return None
            size, stride = flat[i]
            if need % size == 0:
                ax.append((size, stride))
                need //= size
                i += 1
            elif size % need == 0:  # split a sub-dim: its outer part here
                ax.append((need, stride * (size // need)))
                flat[i] = (size // need, stride)
                need = 1
            else:
                return None
        out.append(ax or [(1, 0)])
    return out if i == len(flat) else None


def _through(graph: Graph, node: Node, layout: Layout) -> Layout | None:
    """The layout of `node`'s output given its input 0's (a view op)."""
    out_shape = tuple(node.outputs[0].shape)
    op = node.op
    if op == "Identity":
        return layout
    if op == "Transpose":
        perm = node.attr("perm") or list(range(len(layout)))[::-1]
        return [layout[p] for p in perm]
    if op == "Reshape":
        return _reshape(layout, out_shape)
    if op in ("Unsqueeze", "Squeeze"):
        return _reshape(layout, out_shape)  # only size-1 axes come or go
    if op == "Expand":
        pad = [[(1, 0)]] * (len(out_shape) - len(layout)) + layout
        return [ax if math.prod(s for s, _ in ax) == n else [(n, 0)]
                for ax, n in zip(pad, out_shape)]
    return None


def _trace(graph: Graph, v: Value) -> tuple[Value, Layout]:
    """(the tensor v views, v's layout in its elements), through layout ops."""
    node = v.producer
    if node is not None and node.op in VIEW_OPS and node.domain in ("", "ai.onnx") \
            and node.inputs and node.inputs[0] is not None:
        base, layout = _trace(graph, node.inputs[0])
        moved = _through(graph, node, layout)
        if moved is not None:
            return base, moved
    return v, _contiguous(tuple(v.shape))


def _axis(ax: list[tuple[int, int]]) -> tuple[int, int] | None:
    """One (size, stride) for an axis read with a single stride (None: it needs several)."""
    subs = [sd for sd in ax if sd[0] != 1]
    if not subs:
        return (1, 0)
    return subs[0] if len(subs) == 1 else None


def _batch(layout: Layout, batch: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """The sub-dims covering the flat index of `batch` for an operand whose leading axes
    are `layout` (right-aligned, broadcasting size 1)."""
    if len(layout) > len(batch):
        return None
    pad = [[(1, 0)]] * (len(batch) - len(layout)) + layout
    out: list[tuple[int, int]] = []
    for ax, n in zip(pad, batch):
        size = math.prod(s for s, _ in ax)
        if size == n:
            out += [sd for sd in ax if sd[0] != 1]
        elif size == 1:
            out.append((n, 0))
        else:
            return None
    return [sd for sd in out if sd[0] != 1]


def _view(graph: Graph, v: Value, batch: tuple[int, ...], swap: bool = False,
          rows: int | None = None, cols: int | None = None
          ) -> tuple[Value, attn.View] | None:
    """(base, view) of the [.., rows, cols] operand v (its last two axes swapped first
    when `swap`; a size-1 row or column axis broadcast to `rows` / `cols`)."""
    base, layout = _trace(graph, v)
    if len(layout) < 2:
        return None
    r_ax, c_ax = (layout[-1], layout[-2]) if swap else (layout[-2], layout[-1])
    r, c = _axis(r_ax), _axis(c_ax)
    b = _batch(layout[:-2], batch)
    if r is None or c is None or b is None:
        return None
    if rows is not None and r[0] != rows:
        r = (rows, 0) if r[0] == 1 else None
    if cols is not None and c is not None and c[0] != cols:
        c = (cols, 0) if c[0] == 1 else None
    if r is None or c is None:
        return None
    return base, (tuple(b), r, c)


def _views(graph: Graph, s: Value, q: Value, kt: Value, k_rows_last: bool, out_mm: Node,
           mask: tuple[Value, tuple[int, ...]] | None) -> tuple | None:
    """The views of q, k, v and the mask, each over the batch dims of the node it joins
    at (any two of them regroup the same flat batch index: _regrouped)."""
    batch = tuple(s.shape[:-2])
    sq, sk = s.shape[-2], s.shape[-1]
    qv = _view(graph, q, batch)
    kv = _view(graph, kt, batch, swap=k_rows_last)
    vv = _view(graph, out_mm.inputs[1], tuple(out_mm.outputs[0].shape[:-2]))
    if qv is None or kv is None or vv is None:
        return None
    if qv[1][1][0] != sq or kv[1][1][0] != sk or vv[1][1][0] != sk or kv[1][2][0] != qv[1][2][0]:
        return None
    if math.prod(out_mm.outputs[0].shape[:-2]) != math.prod(batch):
        return None  # (V broadcasting the scores' batch: left unfused)
    mv = None
    if mask is not None:
        m, at = mask
        if m.shape is None or len(m.shape) < 2:
            return None  # (a 1-D mask broadcasts over rows: rare; left unfused)
        mv = _view(graph, m, at, rows=sq, cols=sk)
        if mv is None:
            return None
    return qv, kv, vv, mv


def _mask_input(graph: Graph, mask: tuple[Value, attn.View], attrs: dict) -> Value:
    """The mask's base as the node's 4th input (m_view set), or a constant causal mask
    turned into the `causal` attribute (then the mask input is dropped: None)."""
    base, view = mask
    offset = _causal_offset(graph, base, view, attrs)
    if offset is not None:
        attrs.update(causal=1, causal_offset=offset, mask="")
        return None
    attrs["m_view"] = attn.view_ints(view)
    return base


def _causal_offset(graph: Graph, base: Value, view: attn.View, attrs: dict) -> int | None:
    """The offset when a constant mask is exactly causal (key j visible iff j <= i + offset,
    offset >= 0, the same for every batch index); else None."""
    const = graph.constant_value(base)
    if const is None:
        return None
    m = attn.gather(const, view)
    if attrs["mask"] == "add":
        visible = m == 0
        if not np.all(visible | (m <= MASKED)):
            return None
    else:
        if attrs.get("fill", 0.0) > MASKED:
            return None
        visible = m.astype(bool)
    if not np.all(visible == visible[:1]):
        return None
    rows, cols = visible.shape[1:]
    for offset in range(cols):
        want = np.arange(cols)[None, :] <= np.arange(rows)[:, None] + offset
        if np.array_equal(visible[0], want):
            return offset
    return None
