"""Library operands in place: strided views instead of layout kernels around a GEMM.

Attention reshapes and transposes the projections around its two batched MatMuls:

    q = Transpose(Reshape(x @ Wq, [B, S, H, D]), [0, 2, 1, 3])       # [B, H, S, D]
    k = Transpose(Reshape(x @ Wk, [B, S, H, D]), [0, 2, 3, 1])       # [B, H, D, S]
    o = Reshape(Transpose(softmax(q @ k) @ v, [0, 2, 1, 3]), [B, S, H*D])

Each Transpose used to be a kernel copying its tensor before or after the GEMM. With a
backend that takes strided operands (its Policy.library_views), fusion instead
- reads an operand made by layout ops from the buffer it lies in (`input_view`): the
  operand's expression at the identity index, built by the ordinary lowering, is a single
  affine load, whose coefficients are the strides (k above is x @ Wk read with strides
  [., D, 1, H*D]);
- writes a result whose only use is a chain of pure reshapes and transposes straight into
  the buffer at the chain's end (`output_view`): o's MatMul writes [B, H, S, D] with
  strides [., D, H*D, 1] into o's [B, S, H*D] buffer.
A view that does not exist (a Mul in the chain, a Reshape regrouping a transposed
value) makes fusion keep the operand in a buffer as before.
"""

from __future__ import annotations

from collections.abc import Callable

from autoclust import ops, symbolic
from autoclust.ir import Graph, Node, Value
from autoclust.kernel import ir as kir
from autoclust.kernel.indexing import contiguous_strides
from autoclust.ops import attention

# Ops whose consumers see the same elements rearranged: a result's chain of these ends
# in the buffer it can be written into.
CHAIN_OPS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
# Ops an operand may be read through in place: a chain op, or a Slice (one projection of
# a sibling-fused GEMM's output, passes/siblings.py) picking a strided part of the buffer.
READ_OPS = CHAIN_OPS | {"Slice"}

Probe = Callable[[Value, Value | None], kir.Expr | None]


def takes_views(node: Node, ops_with_views: frozenset) -> bool:
    """Whether `node` is a library call whose leading operands (view_inputs) and, unless
    it is attention, result may be views."""
    return node.op in ops_with_views and node.domain in ("", "ai.onnx", "com.microsoft",
                                                         ATTENTION_DOMAIN) \
        and len(node.outputs) == 1


# FusedAttention (ops/attention.py) reads Q, K and V through views of its own; a backend
# taking its operands as views too (the CPU: a sibling-fused QKV projection's Slices,
# read where they lie instead of copied out) composes the two. Its result stays a buffer.
ATTENTION, ATTENTION_DOMAIN = attention.OP, attention.DOMAIN


def view_inputs(node: Node) -> int:
    """How many leading operands of a library call that takes views may be views."""
    return 3 if node.op == ATTENTION else 2


def maybe_view(graph: Graph, v: Value) -> bool:
    """Whether operand v could be a view of another buffer: made by a layout op."""
    node = v.producer
    if node is None or graph.is_constant(v) or 0 in v.shape:
        return False
    opdef = ops.get(node.op, node.domain)
    return opdef is not None and opdef.kind == ops.LAYOUT


def chain_end(graph: Graph, v: Value) -> Value | None:
    """The end of the single-use chain of CHAIN_OPS that reads result v, or None."""
    outputs = {w.name for w in graph.outputs}
    w, moved = v, False
    while len(w.uses) == 1 and w.name not in outputs:
        node = graph.consumers(w)[0]
        if node.op not in CHAIN_OPS or node.domain not in ("", "ai.onnx") or \
                node.inputs[0] is not w or len(node.outputs) != 1:
            break
        w, moved = node.outputs[0], True
    return w if moved and w.dtype == v.dtype else None


def same_order_source(w: Value, v: Value) -> Value:
    """The value before w's trailing reshapes on the chain from v: they keep the flat
    order, so w's buffer holds that value's elements in the same places."""
    while w is not v and w.producer is not None:
        opdef = ops.get(w.producer.op, w.producer.domain)
        if opdef is None or not opdef.view:
            break
        w = w.producer.inputs[0]
    return w


def input_view(x: Value, probe: Probe) -> tuple[int, kir.View] | None:
    """(buffer, view) when operand x is an affine read of one buffer, else None."""
    e = probe(x, None)
    if not isinstance(e, kir.Load) or e.clamps or e.dyn:
        return None
    if not all(symbolic.is_dim(c) for c in e.index.coeffs):
        return None
    return e.buf, kir.View(tuple(x.shape), tuple(e.index.coeffs), e.index.const)


def output_view(v: Value, w: Value, probe: Probe) -> kir.View | None:
    """The view of result v inside w's buffer, when w is a rearrangement of v's elements
    (each element of v lands at one element of w, and the landing places are strided).

    w's expression reads v at flat index sum(c_k * i_k) over w's loop dims. It is a
    rearrangement when the c_k are the place values of a mixed radix over w's dims
    (1, n_a, n_a*n_b, ...: each a product of the sizes below it). A dim l of v (place
    value sv_l, size m_l) then lies inside one such digit k when c_k divides sv_l and
    sv_l*m_l divides c_k*n_k: stepping it moves w's element by w's stride of dim k times
    sv_l / c_k. Everything is exact polynomial arithmetic, so symbolic dims stay symbolic.
    """
    w = same_order_source(w, v)
    if w is v:
        return kir.View(tuple(v.shape), contiguous_strides(tuple(v.shape)), 0)
    e = probe(w, v)
    if not isinstance(e, kir.Load) or e.clamps or e.dyn or not w.shape or not v.shape:
        return None
    n = symbolic.product(w.shape)
    if not symbolic.same(e.index.const, 0) or not symbolic.same(n, symbolic.product(v.shape)):
        return None
    digits = _digits(tuple(w.shape), e.index.coeffs)
    if digits is None:
        return None
    ws = contiguous_strides(tuple(w.shape))
    strides = []
    for sv, m in zip(contiguous_strides(tuple(v.shape)), v.shape):
        if symbolic.same(m, 1):
            strides.append(0)
            continue
        stride = None
        for k, c in digits:
            q = _quotient(sv, c)
            if q is not None and _quotient(c * w.shape[k], sv * m) is not None:
                stride = ws[k] * q
                break
        if stride is None:
            return None
        strides.append(stride)
    return kir.View(tuple(v.shape), tuple(strides), 0)


def transposed_result(node: Node, ins: tuple, found: tuple) -> tuple[str, tuple, tuple, tuple]:
    """(op, attrs, inputs, views) of the library call for `node` (`ins`, `found`: its
    buffers and views): the transposed product when its result view is a transposed
    dense block, else the node's own.

    The libraries write C-order results, so such a view costs a dense stand-in and a
    transposing copy after the call: SegFormer writes x @ W1 ([3136, 128]) into the NCHW
    buffer of its depthwise Conv, and the copy took 0.44 ms against the GEMM's 0.21.
    C^T = alpha * op(B)^T @ op(A)^T is the same product with the operands swapped and
    their trans flags flipped (FusedMatMul's transA, transB), its result in C order."""
    attrs = node.attrs
    own = node.op, tuple(sorted(attrs.items())), ins, found
    out = found[2] if len(found) == 3 else None
    if node.op not in ("MatMul", "FusedMatMul") or len(ins) != 2 or out is None or \
            attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0) or \
            any(v is None or len(v.shape) < 2 for v in node.inputs):  # 1-D: no matrix
        return own
    shape = (*out.shape[:-2], out.shape[-1], out.shape[-2])
    strides = (*out.strides[:-2], out.strides[-1], out.strides[-2])
    dense = contiguous_strides(shape)
    if not all(symbolic.same(d, 1) or symbolic.same(s, c)
               for d, s, c in zip(shape, strides, dense)):
        return own
    flipped = {"alpha": float(attrs.get("alpha", 1.0)), "transA": 1 - int(attrs.get("transB", 0)),
               "transB": 1 - int(attrs.get("transA", 0))}
    return "FusedMatMul", tuple(sorted(flipped.items())), (ins[1], ins[0]), \
        (found[1], found[0], kir.View(shape, dense, out.offset))


def _digits(shape: tuple, coeffs: tuple) -> list[tuple[int, object]] | None:
    """[(dim k, place value c_k)] of w's dims (size > 1) as a mixed radix from the least
    significant, or None when the coefficients are not one."""
    left = [k for k, d in enumerate(shape) if not symbolic.same(d, 1)]
    place, out = 1, []
    while left:
        k = next((k for k in left if symbolic.same(coeffs[k], place)), None)
        if k is None:
            return None
        out.append((k, place))
        place = place * shape[k]
        left.remove(k)
    return out


def _quotient(a: object, b: object) -> object | None:
    """a / b when b divides a exactly (as polynomials when symbolic), else None."""
    if symbolic.is_sym(a) or symbolic.is_sym(b):
        return symbolic.exact_quotient(a, b)
    return a // b if b and a % b == 0 else None


def is_plain(view: kir.View, buffer: kir.Buffer) -> bool:
    """Whether the view is the whole buffer in its own layout (a reshape at most)."""
    return view.offset == 0 and view.shape == buffer.shape and \
        view.strides == contiguous_strides(view.shape)
