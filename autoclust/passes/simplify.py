"""simplify: algebraic rewrites, as a table of (op, rule) pairs.

A rule looks at one node and returns None (no match), a Value (the node's output *is* that
value: forward it), or (op, inputs, attrs) (compute the output with that node instead).
One guard for every rule, in `_apply`: the result must have exactly the output's dtype and
shape. So `x*1 -> x` never fires when the 1 broadcasts x to a bigger shape, `Cast -> x`
only fires when the dtype is unchanged, and `Expand/Reshape -> x` only when nothing changes.
Rewrites are exact: no reassociation, no rounding change (Div becomes Mul only by an exact
power-of-two reciprocal). Strength reductions an op's lowering already does on constant
inputs (Pow by 1, 2, 3 or 0.5) are not repeated here: each identity is written once, in
the op table (autoclust/ops/elementwise.py, Pow's lowering).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autoclust import ops
from autoclust.errors import AutoclustError
from autoclust.ir import Graph, Node, Value
from autoclust.passes.edits import new_constant, replace_node

Rewrite = tuple  # (op, inputs, attrs) or (op, inputs, attrs, domain)
Result = Value | Rewrite | None
Rule = Callable[[Graph, Node], Result]

# View ops (OpDef.view): the output is the input's elements in the same order.
VIEWS = tuple(d.op for d in ops.all_ops() if d.view and not d.domain)
# Elementwise ops (one of one input moves before a transpose: _unary_before_transpose).
UNARY = tuple(d.op for d in ops.all_ops() if d.kind == ops.ELEMENTWISE and not d.domain)
MATMULS = (("MatMul", ""), ("FusedMatMul", "com.microsoft"))  # (op, domain)


def _is(graph: Graph, v: Value | None, c: float) -> bool:
    """v is a non-empty constant whose every element equals c."""
    a = graph.constant_value(v)
    return a is not None and a.size > 0 and bool(np.all(a == c))


def _made_by(v: Value | None, *op_names: str) -> Node | None:
    p = None if v is None else v.producer
    return p if p is not None and p.domain in ("", "ai.onnx") and p.op in op_names else None


def _div_exact(graph: Graph, n: Node) -> Result:
    x, c = n.inputs[0], graph.constant_value(n.inputs[1])
    if c is None or x is None or x.dtype is None or x.dtype.kind != "f" or c.size == 0:
        return None
    with np.errstate(all="ignore"):
        r = (1 / c).astype(c.dtype)
    ok = np.isfinite(c) & np.isfinite(r) & (np.abs(np.frexp(c)[0]) == 0.5)
    ok &= np.abs(np.frexp(r)[0]) == 0.5  # 1/c is itself a normal power of two: exact
    return ("Mul", [x, new_constant(graph, r, "reciprocal")], {}) if ok.all() else None


def _perm(n: Node) -> list[int] | None:
    x = n.inputs[0]
    rank = None if x is None else x.rank
    perm = n.attr("perm")
    if rank is None:
        return None
    return list(range(rank))[::-1] if perm is None else [int(p) for p in perm]


def _transpose_identity(graph: Graph, n: Node) -> Result:
    perm = _perm(n)
    return n.inputs[0] if perm is not None and perm == sorted(perm) else None


def _transpose_transpose(graph: Graph, n: Node) -> Result:
    inner = _made_by(n.inputs[0], "Transpose")
    if inner is None:
        return None
    p1, p2 = _perm(inner), _perm(n)
    if p1 is None or p2 is None:
        return None
    composed = [p1[i] for i in p2]  # out[i] = y[p2[i]] = x[p1[p2[i]]]
    if composed == list(range(len(composed))):
        return inner.inputs[0]
    return ("Transpose", [inner.inputs[0]], {"perm": composed})


def _reshape_chain(graph: Graph, n: Node) -> Result:
    inner = _made_by(n.inputs[0], *VIEWS)
    out = n.outputs[0]
    if inner is None or out.shape is None or not out.is_static() or 0 in out.shape:
        return None  # a 0 in a Reshape target means "copy", so keep those as they are
    x = inner.inputs[0]
    if x is None:
        return None
    if x.shape == out.shape:
        return x
    return ("Reshape", [x, new_constant(graph, np.array(out.shape, np.int64), "shape")], {})


def _unit_dims_after_transpose(graph: Graph, n: Node) -> Result:
    """V(Transpose(x, p)) -> Transpose(V'(x), q) for a view V that only adds or drops
    dims of size 1, the Transpose read only by V. Attention exports fold the heads into
    the batch around a transpose of K ([1, H, S, D] -> [H, S, D] -> [H, D, S] ->
    [1, H, D, S]); moved next to x, V meets the other views (_reshape_chain) and the two
    transposes compose (_transpose_transpose) into one the GEMM reads (_matmul_of_transpose).
    V' puts x's dims of size > 1, in x's order, where the output has its dims of size > 1."""
    t = _made_by(n.inputs[0], "Transpose")
    out = n.outputs[0]
    perm = None if t is None else _perm(t)
    x = None if t is None else t.inputs[0]
    if t is None or perm is None or x is None or x.shape is None or out.shape is None or \
            len(t.outputs[0].uses) != 1 or t.outputs[0] in graph.outputs or 0 in out.shape:
        return None
    moved = [p for p in perm if x.shape[p] != 1]  # x's dims, in the Transpose's order
    places = [i for i, d in enumerate(out.shape) if d != 1]
    if [x.shape[p] for p in moved] != [out.shape[i] for i in places] or \
            sum(not isinstance(d, int) for d in out.shape) > 1:
        return None
    order = sorted(moved)
    shape = list(out.shape)
    for i, p in zip(places, order):
        shape[i] = x.shape[p]
    q = list(range(len(shape)))
    for i, p in zip(places, moved):
        q[i] = places[order.index(p)]
    if q == sorted(q):
        return None  # the Transpose moved only dims of size 1: _reshape_chain's case
    target = np.array([d if isinstance(d, int) else -1 for d in shape], np.int64)
    early = Value(graph.unique_name(f"{out.name}_early"), out.dtype, tuple(shape))
    graph.add_node(Node("Reshape", [x, new_constant(graph, target, "shape")], [early], {},
                        graph.unique_name(f"{n.name}_early")), graph.nodes.index(n))
    return ("Transpose", [early], {"perm": q})


def _dropout(graph: Graph, n: Node) -> Result:
    training = n.inputs[2] if len(n.inputs) > 2 else None
    if training is not None and not _is(graph, training, False):
        return None
    return n.inputs[0]


def _last_two_swapped(node: Node | None) -> Value | None:
    """The input of a Transpose that swaps only the last two dims, else None."""
    if node is None:
        return None
    perm = _perm(node)
    if perm is None or len(perm) < 2:
        return None
    r = len(perm)
    return node.inputs[0] if perm == list(range(r - 2)) + [r - 1, r - 2] else None


def _rows_kept(graph: Graph, v: Value | None) -> Value | None:
    """For a single-use v = Transpose(x, p) that also moves the batch dims but puts x's
    last dim second to last (attention's K^T: x [B, S, H, D], p [0, 2, 3, 1]): a new
    Transpose(x, p with its last two swapped), whose rows stay x's contiguous rows, so
    that v is that value with its last two dims swapped. Else None."""
    node = _made_by(v, "Transpose")
    perm = None if node is None else _perm(node)
    if v is None or node is None or perm is None or len(perm) < 3 or \
            perm[-2] != len(perm) - 1 or len(v.uses) != 1 or v in graph.outputs:
        return None
    swapped = perm[:-2] + [perm[-1], perm[-2]]
    shape = None if v.shape is None else (*v.shape[:-2], v.shape[-1], v.shape[-2])
    rows = Value(graph.unique_name(f"{v.name}_rows"), v.dtype, shape)
    graph.add_node(Node("Transpose", [node.inputs[0]], [rows], {"perm": swapped},
                        graph.unique_name(f"{node.name}_rows")), graph.nodes.index(node) + 1)
    return rows


def _matmul_of_transpose(graph: Graph, n: Node) -> Result:
    """MatMul reading a transposed operand reads it in place: the library call does. A
    transpose that also moves batch dims keeps only that part (_rows_kept): the last
    two dims' swap becomes the GEMM's trans flag, so a copy of the operand (where one is
    needed) copies whole rows instead of gathering a column per element."""
    fused = n.op == "FusedMatMul"
    if n.outputs[0].dtype is None or n.outputs[0].dtype.kind != "f" or (fused and any(
            n.attrs.get(k) for k in ("transBatchA", "transBatchB"))):
        return None
    inputs = list(n.inputs[:2])
    flags = [int(n.attrs.get(k, 0)) if fused else 0 for k in ("transA", "transB")]
    for k in (0, 1):
        found = None if flags[k] else (_last_two_swapped(_made_by(inputs[k], "Transpose"))
                                       or _rows_kept(graph, inputs[k]))
        if found is not None:
            inputs[k], flags[k] = found, 1
    if inputs == n.inputs[:2]:
        return None
    attrs = {**(n.attrs if fused else {}), "transA": flags[0], "transB": flags[1]}
    return ("FusedMatMul", inputs, attrs, "com.microsoft")


def _scaled_matmul(graph: Graph, n: Node) -> Result:
    """Mul(MatMul(a, b), c) with a scalar c -> FusedMatMul(a, b, alpha=c): the product is
    scaled once either way, so the result is the same to the bit (float32 only: alpha is
    a float32 attribute, and an existing alpha is never combined with c)."""
    for mm, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        p = None if mm is None else mm.producer
        value = graph.constant_value(c)
        if (mm is None or p is None
                or (p.op, p.domain) not in MATMULS
                or len(mm.uses) != 1 or mm in graph.outputs or value is None
                or value.size != 1 or mm.dtype != np.float32 or value.dtype != np.float32
                or p.attrs.get("alpha", 1.0) != 1.0):
            continue
        attrs = {**p.attrs, "alpha": float(value.reshape(()))}
        return ("FusedMatMul", list(p.inputs), attrs, "com.microsoft")
    return None


def _scaled_operand(graph: Graph, v: Value | None) -> tuple[Value, float] | None:
    """(x, c) when v = x * c (or x / c) for a float32 scalar constant c, read only here."""
    p = None if v is None else v.producer
    if v is None or p is None or p.domain not in ("", "ai.onnx") or p.op not in ("Mul", "Div") or \
            len(v.uses) != 1 or v in graph.outputs or v.dtype != np.float32:
        return None
    pairs = [(p.inputs[0], p.inputs[1])] + ([(p.inputs[1], p.inputs[0])] if p.op == "Mul"
                                            else [])
    for x, c in pairs:
        value = graph.constant_value(c)
        if value is None or value.size != 1 or value.dtype != np.float32 or \
                x is None or x.shape != v.shape or x.dtype != v.dtype:
            continue
        scale = float(value.reshape(()))
        if p.op == "Div":
            if scale == 0.0 or not np.isfinite(scale):
                return None
            scale = float(np.float32(1.0) / np.float32(scale))
        return x, scale
    return None


def _matmul_of_scaled(graph: Graph, n: Node) -> Result:
    """MatMul(a * c1, b * c2) -> FusedMatMul(a, b, alpha=c1*c2), as onnxruntime's
    MatMulScaleFusion does: attention scales Q and K by sqrt(scale) each, and the scale
    Muls stood between the GEMM and its operands' strided views (rounding as onnxruntime:
    the scale is applied once, to the product)."""
    is_fused = (n.op, n.domain) == ("FusedMatMul", "com.microsoft")
    if n.outputs[0].dtype != np.float32 or (is_fused and any(
            k in n.attrs for k in ("transBatchA", "transBatchB"))):
        return None
    found = [_scaled_operand(graph, v) for v in n.inputs[:2]]
    if found[0] is None and found[1] is None:
        return None
    alpha = float(np.float32(n.attrs.get("alpha", 1.0)))
    inputs = list(n.inputs[:2])
    for k, hit in enumerate(found):
        if hit is not None:
            inputs[k] = hit[0]
            alpha = float(np.float32(alpha) * np.float32(hit[1]))
    attrs = {**(n.attrs if is_fused else {}), "alpha": alpha}
    return ("FusedMatMul", inputs, attrs, "com.microsoft")


def _feeds_matmul(v: Value, direct: bool = False) -> bool:
    """v reaches a MatMul operand through single-use views and transposes only (`direct`:
    v is that operand)."""
    while len(v.uses) == 1 and v.uses[0][1] >= 0:
        user, slot = v.uses[0]
        if (user.op, user.domain) in MATMULS:
            return slot < 2
        if direct or user.domain or (user.op not in VIEWS and user.op != "Transpose") or \
                slot != 0:
            return False
        v = user.outputs[0]
    return False


def _scale_past_layout(graph: Graph, n: Node) -> Result:
    """L(x * c) -> L(x) * c for a view or transpose L on the way to a MatMul, c a float32
    scalar: attention scales Q and K between their head transposes and the GEMM, so the
    scale kept the transposes materialized; moved next to the MatMul it becomes its alpha
    (_matmul_of_scaled) and the transposes the GEMM's strided operands. Exact: every
    element is multiplied by the same c either way."""
    y = n.inputs[0] if n.inputs else None
    hit = _scaled_operand(graph, y)
    if hit is None or y is None or y.producer is None or not _feeds_matmul(n.outputs[0]):
        return None
    x, scaled = hit[0], y.producer
    out = n.outputs[0]
    moved = Value(graph.unique_name(f"{out.name}_unscaled"), out.dtype, out.shape)
    graph.add_node(Node(n.op, [x, *n.inputs[1:]], [moved], dict(n.attrs),
                        graph.unique_name(f"{n.name}_unscaled"), n.domain),
                   graph.nodes.index(n))
    return (scaled.op, [moved if v is x else v for v in scaled.inputs], dict(scaled.attrs))


def _unary_before_transpose(graph: Graph, n: Node) -> Result:
    """U(Transpose(x)) -> Transpose(U(x)) for a one-input elementwise U read as a MatMul
    operand, the Transpose (read only by U) swapping the last two dims. SegFormer's
    Mix-FFN applies its GELU after the depthwise Conv's NCHW result is transposed back to
    tokens, so a kernel computed the GELU while transposing ([3136, 128]: 0.36 ms); in the
    Conv's own order it runs contiguous and the transpose becomes the GEMM's transA
    (_matmul_of_transpose). Exact: the same function of each element either way."""
    opdef = ops.get(n.op, n.domain)
    t = n.inputs[0] if len(n.inputs) == 1 else None
    swap = _made_by(t, "Transpose")
    x = _last_two_swapped(swap)
    out = n.outputs[0] if len(n.outputs) == 1 else None
    if opdef is None or opdef.kind != ops.ELEMENTWISE or t is None or swap is None or \
            x is None or out is None or len(t.uses) != 1 or t in graph.outputs or \
            not _feeds_matmul(out, direct=True):
        return None
    early = Value(graph.unique_name(f"{out.name}_early"), out.dtype, x.shape)
    graph.add_node(Node(n.op, [x], [early], dict(n.attrs),
                        graph.unique_name(f"{n.name}_early"), n.domain), graph.nodes.index(n))
    return ("Transpose", [early], dict(swap.attrs))


def _neg_neg(graph: Graph, n: Node) -> Result:
    inner = _made_by(n.inputs[0], "Neg")
    return None if inner is None else inner.inputs[0]


def _forward(i: int) -> Rule:
    """The node's output is its input i (the shape/dtype guard decides when)."""
    return lambda graph, n: n.inputs[i]


RULES: list[tuple[str, Rule]] = [
    ("Mul", lambda g, n: n.inputs[0] if _is(g, n.inputs[1], 1) else None),  # x*1 -> x
    ("Mul", lambda g, n: n.inputs[1] if _is(g, n.inputs[0], 1) else None),  # 1*x -> x
    ("Add", lambda g, n: n.inputs[0] if _is(g, n.inputs[1], 0) else None),  # x+0 -> x
    ("Add", lambda g, n: n.inputs[1] if _is(g, n.inputs[0], 0) else None),  # 0+x -> x
    ("Sub", lambda g, n: n.inputs[0] if _is(g, n.inputs[1], 0) else None),  # x-0 -> x
    ("Div", lambda g, n: n.inputs[0] if _is(g, n.inputs[1], 1) else None),  # x/1 -> x
    ("Div", _div_exact),  # x/4 -> x*0.25 (powers of two only)
    ("Transpose", _transpose_identity),  # Transpose(x, perm=[0,1,..]) -> x
    ("Transpose", _transpose_transpose),  # Transpose(Transpose(x)) -> Transpose(x) or x
    *[(op, _forward(0)) for op in VIEWS],  # Reshape(x) to x's own shape -> x, Identity(x) -> x
    *[(op, _reshape_chain) for op in VIEWS],  # Reshape(Reshape(x)) -> Reshape(x) or x
    *[(op, _unit_dims_after_transpose) for op in VIEWS],  # R(T(x)) -> T(R(x)), R adds 1s
    *[(op, _scale_past_layout) for op in (*VIEWS, "Transpose")],  # L(x*c) -> L(x)*c
    ("Cast", _forward(0)),  # Cast(x: T, to=T) -> x
    ("CastLike", _forward(0)),  # CastLike(x: T, y: T) -> x
    ("Dropout", _dropout),  # Dropout(x) -> x (inference)
    ("Neg", _neg_neg),  # -(-x) -> x
    *[(op, _unary_before_transpose) for op in UNARY],  # U(Transpose(x)) -> Transpose(U(x))
    ("MatMul", _matmul_of_transpose),  # MatMul(a, Transpose(b)) -> FusedMatMul(a, b, transB)
    ("FusedMatMul", _matmul_of_transpose),  # the same, for a flag not yet set
    ("Mul", _scaled_matmul),  # MatMul(a, b) * c -> FusedMatMul(a, b, alpha=c)
    ("MatMul", _matmul_of_scaled),  # MatMul(a * c, b) -> FusedMatMul(a, b, alpha=c)
    ("FusedMatMul", _matmul_of_scaled),  # FusedMatMul(a * c, b) -> alpha times c
    ("Expand", _forward(0)),  # Expand(x, shape) -> x when nothing broadcasts
]


def _same_type(a: Value | tuple, out: Value) -> bool:
    dtype, shape = (a.dtype, a.shape) if isinstance(a, Value) else a
    known = shape is not None and all(d is not None for d in shape)
    return known and dtype == out.dtype and tuple(shape) == out.shape


def _apply(graph: Graph, node: Node, result: Value | Rewrite) -> bool:
    """Apply a rule's result when it keeps the output's dtype and shape exactly."""
    out = node.outputs[0]
    if any(v.uses or v in graph.outputs for v in node.outputs[1:]):
        return False  # rules speak for output 0 only (Dropout's mask must be unused)
    if isinstance(result, Value):
        if not _same_type(result, out):
            return False
        graph.replace_all_uses(out, result)
        graph.remove_node(node)
        return True
    op, inputs, attrs, domain = (*result, "")[:4]
    if len(node.outputs) != 1:
        return False
    try:
        types = ops.infer_node(Node(op, inputs, [Value("_")], attrs, node.name, domain), graph)
    except (AutoclustError, ValueError, TypeError, IndexError):
        return False
    if len(types) != 1 or not _same_type(types[0], out):
        return False
    replace_node(graph, node, op, inputs, attrs, domain)
    return True


_BY_OP: dict[str, list[Rule]] = {}
for _op, _rule in RULES:
    _BY_OP.setdefault(_op, []).append(_rule)


def simplify(graph: Graph) -> Graph:
    """Apply the first matching rule of RULES to each node, in one sweep over the graph."""
    for node in list(graph.nodes):
        if not node.outputs or (node.domain not in ("", "ai.onnx") and
                                (node.op, node.domain) != ("FusedMatMul", "com.microsoft")):
            continue
        for rule in _BY_OP.get(node.op, ()):
            result = rule(graph, node)
            if result is not None and _apply(graph, node, result):
                break
    return graph
