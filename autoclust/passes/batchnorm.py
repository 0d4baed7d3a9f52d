"""fold_batchnorm: an inference BatchNormalization after a GEMM goes into the GEMM's weights.

A BatchNorm1d after a bias-free Linear (LeViT's MLPLayerWithBN: 58 of them) exports as

    y = MatMul(x, W)                          [B, N, C], W a constant [K, C]
    f = Reshape(y, [B*N, C])                  flatten(0, 1): channel axis 1 is y's last dim
    z = BatchNormalization(f, g, b, m, v)     z = f * s + t per channel,
                                              s = g / sqrt(v + eps), t = b - m * s
 -> y = MatMul(x, W * s)                      s scales W's columns
    z = Add(Reshape(y, [B*N, C]), t)          a bias Add, which fusion makes the GEMM's
                                              epilogue (a oneDNN post-op)

so the normalization's pass over memory (a kernel of its own, as onnxruntime runs it: its
MatMulBNFusion does not look through the Reshape) is gone. s and t are computed in
float64 and rounded once; the folded result then differs from BatchNormalization's
float32 arithmetic by the rounding of the scaled weights, an ulp or two of each product,
as onnxruntime's own folds (Conv + BatchNormalization) do.

Folded when: BatchNormalization is in inference mode with one used output; its four
parameters are constants of its input's float dtype, and s and t are finite; its input is
[M, C] (channel axis 1) and is the MatMul's result or a Reshape of it whose last dim is C
(row-major, so column c of the Reshape is column c of the result); the MatMul's B is a
constant [K, C] of the same dtype with finite scaled weights, and the MatMul's result, the
Reshape's and the BatchNormalization's input are read by nothing else. Scaled weights are
cached by the identity of the arrays they come from and eps (siblings.derived), so a new
signature shares them and the library's prepacked copy.
"""

from __future__ import annotations

import numpy as np

from autoclust.ir import Graph, Node, Value
from autoclust.passes.edits import detach, new_constant, replace_node
from autoclust.passes.siblings import derived

FLOAT_DTYPES = ("float32", "float64")


def _only_reader(v: Value, graph: Graph) -> Node | None:
    if len(v.uses) != 1 or v in graph.outputs:
        return None
    return v.uses[0][0]


def _gemm_before(graph: Graph, f: Value, channels: int) -> tuple[Node, np.ndarray] | None:
    """(MatMul, its constant B) whose result is f, or f's Reshape source, column for column."""
    node = f.producer
    if node is not None and node.op == "Reshape" and node.domain in ("", "ai.onnx"):
        y = node.inputs[0]
        if y is None or not y.shape or y.shape[-1] != channels or \
                _only_reader(y, graph) is not node:
            return None
        node = y.producer
    if node is None or node.op != "MatMul" or node.domain not in ("", "ai.onnx") or \
            len(node.inputs) != 2 or _only_reader(node.outputs[0], graph) is None:
        return None
    w = graph.constant_value(node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != f.dtype or w.shape[1] != channels or \
            node.inputs[0] is None or node.inputs[0].rank is None or node.inputs[0].rank < 2:
        return None
    return node, w


def _affine(graph: Graph, bn: Node
            ) -> tuple[Value, np.ndarray, np.ndarray, list[np.ndarray], float] | None:
    """(input, s, t, the four parameters, eps) of an inference BatchNormalization over
    [M, C] that alone reads its input (see the module docstring), or None."""
    if int(bn.attrs.get("training_mode", 0)) or len(bn.inputs) != 5 or \
            any(v.uses or v in graph.outputs for v in bn.outputs[1:]):
        return None
    f = bn.inputs[0]
    if f is None or f.dtype is None or f.dtype.name not in FLOAT_DTYPES or \
            f.shape is None or len(f.shape) != 2 or not isinstance(f.shape[1], int) or \
            _only_reader(f, graph) is not bn:
        return None
    found = [graph.constant_value(v) for v in bn.inputs[1:]]
    params = [p for p in found if p is not None and p.shape == (f.shape[1],) and
              p.dtype == f.dtype]
    if len(params) != 4:
        return None
    eps = float(bn.attrs.get("epsilon", 1e-5))
    g, b, m, v = (p.astype(np.float64) for p in params)
    with np.errstate(all="ignore"):
        s = g / np.sqrt(v + eps)
        t = b - m * s
    if not (np.isfinite(s).all() and np.isfinite(t).all()):
        return None
    return f, s, t.astype(f.dtype), params, eps


def _scaled_columns(w: np.ndarray, s: np.ndarray, key: tuple, sources: list[np.ndarray]
                    ) -> np.ndarray | None:
    """w * s column by column (None when a finite weight would overflow), cached."""
    def make() -> np.ndarray | None:
        with np.errstate(all="ignore"):
            out = (w.astype(np.float64) * s).astype(w.dtype)
        return out if np.isfinite(out[np.isfinite(w)]).all() else None
    return derived(key + tuple(id(a) for a in sources), sources, make)


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold each inference BatchNormalization into the GEMM before it (module docstring)."""
    for bn in list(graph.nodes):
        if bn.op != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        affine = _affine(graph, bn)
        if affine is None:
            continue
        f, s, t, params, eps = affine
        found = _gemm_before(graph, f, len(s))  # s: one scale per channel
        if found is None:
            continue
        matmul, w = found
        scaled = _scaled_columns(w, s, ("bn_scaled", eps), [w] + params)
        if scaled is None:
            continue
        replace_node(graph, matmul, "MatMul",
                     [matmul.inputs[0], new_constant(graph, scaled, "bn_weight")])
        shift = new_constant(graph, t, "bn_shift")
        index = detach(graph, bn)  # its unused mean/var outputs go with it
        graph.add_node(Node("Add", [f, shift], bn.outputs[:1], {}, bn.name), index)
    return graph
