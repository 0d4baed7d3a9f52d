"""patchify: a Conv whose windows tile its input is a MatMul over the patches.

With kernel == strides, no pads and no dilation (one group), every input element falls in
exactly one window: the Conv is a GEMM of the [OH * OW, C * KH * KW] patches by the
[C * KH * KW, M] weights. Vision models open with one (ViT's 16x16/16 and Swin's 4x4/4
patch embeddings, ConvNeXt's 4x4/4 stem) and ConvNeXt downsamples with three (2x2/2):

    x [N, C, H, W] -> Reshape [N, C, OH, KH, OW, KW] -> Transpose [N, OH, OW, C, KH, KW]
      -> Reshape [N, OH, OW, C*KH*KW] -> MatMul W' (+ B) -> Transpose [N, M, OH, OW]

The Transposes are index maps of the kernels around the GEMM (kernel/views.py, fusion),
and where the next op transposes back to channels-last (ConvNeXt's LayerNorm, a patch
embedding's flatten) the simplifier cancels the pair. W' = W reshaped [M, C*KH*KW] and
transposed, made once per weight array (passes/siblings.derived: the same array for every
signature, so the library keeps one prepacked copy). Left to onnxruntime, each such Conv
was a segment of its own between clusters (ConvNeXt-tiny: four segments, 2.6 ms).

Only where the Conv is in a cluster (the CPU's Policy.generates takes it there, `eligible`)
and its sizes are concrete; the bias, when given, is added after the GEMM (fusion folds a
constant one into the call).
"""

from __future__ import annotations

import numpy as np

from autoclust.ir import Graph, Node, Value
from autoclust.passes.edits import detach, new_constant
from autoclust.passes.siblings import derived

DTYPES = ("float32", "float64")


def _attrs_tile(node: Node, kernel: tuple[int, int]) -> bool:
    a = node.attrs
    return (int(a.get("group", 1)) == 1
            and list(a.get("strides") or [1, 1]) == list(kernel)
            and list(a.get("dilations") or [1, 1]) == [1, 1]
            and not any(a.get("pads") or [0])
            and a.get("auto_pad", "NOTSET") in ("NOTSET", "VALID", b"NOTSET", b"VALID"))


def _geometry(node: Node, weight_shape: tuple | None) -> tuple[int, ...] | None:
    """(n, c, oh, kh, ow, kw, m) of a tiling 2-D Conv with these shapes, else None."""
    if node.op != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    x = node.inputs[0]
    if x is None or x.shape is None or weight_shape is None or len(x.shape) != 4 or \
            len(weight_shape) != 4 or x.dtype is None or x.dtype.name not in DTYPES:
        return None
    dims = [d for d in (*x.shape, *weight_shape) if isinstance(d, int)]
    if len(dims) != 8:  # a symbolic or unknown size
        return None
    n, c, h, w, m, wc, kh, kw = dims
    if wc != c or kh * kw < 2 or h % kh or w % kw or 0 in (n, c, h, w, m):
        return None
    return (n, c, h // kh, kh, w // kw, kw, m) if _attrs_tile(node, (kh, kw)) else None


def eligible(node: Node) -> bool:
    """Whether `node` is a tiling Conv with a weight of known shape (the clustering keeps
    it; the pass rewrites it once the weight is a constant of the cluster's graph)."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    return w is not None and w.shape is not None and \
        _geometry(node, tuple(w.shape)) is not None


def _int64(graph: Graph, dims: list[int]) -> Value:
    return new_constant(graph, np.array(dims, np.int64), "patchify_shape")


def _rewrite(graph: Graph, node: Node, geo: tuple[int, ...], w: np.ndarray) -> None:
    n, c, oh, kh, ow, kw, m = geo
    x, y = node.inputs[0], node.outputs[0]
    assert x is not None  # _geometry checked it
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    dt = x.dtype
    at = detach(graph, node)

    def add(op: str, inputs: list, shape: tuple, attrs: dict | None = None,
            out: Value | None = None) -> Value:
        nonlocal at
        v = out or Value(graph.unique_name(f"{node.name}_patch_"), dt, shape)
        graph.add_node(Node(op, inputs, [v], attrs or {}, graph.unique_name(node.name + "_")),
                       at)
        at += 1
        return v

    six = add("Reshape", [x, _int64(graph, [n, c, oh, kh, ow, kw])], (n, c, oh, kh, ow, kw))
    tiles = add("Transpose", [six], (n, oh, ow, c, kh, kw), {"perm": [0, 2, 4, 1, 3, 5]})
    rows = add("Reshape", [tiles, _int64(graph, [n, oh, ow, c * kh * kw])],
               (n, oh, ow, c * kh * kw))
    wt = derived(("patchify", id(w)), [w],
                 lambda: np.ascontiguousarray(w.reshape(m, -1).T))
    assert wt is not None
    out = add("MatMul", [rows, new_constant(graph, wt, "patchify_weight")], (n, oh, ow, m))
    if bias is not None:
        out = add("Add", [out, bias], (n, oh, ow, m))
    add("Transpose", [out], (n, m, oh, ow), {"perm": [0, 3, 1, 2]}, out=y)


def patchify(graph: Graph) -> Graph:
    """Every tiling Conv with a constant weight as a MatMul over its patches."""
    for node in list(graph.nodes):
        w = graph.constant_value(node.inputs[1]) if node.op == "Conv" and \
            len(node.inputs) > 1 else None
        x = node.inputs[0] if node.inputs else None
        if w is None or x is None or w.dtype != x.dtype:
            continue
        geo = _geometry(node, tuple(w.shape))
        bias = node.inputs[2] if geo is not None and len(node.inputs) > 2 else None
        if geo is None or (bias is not None and (bias.shape is None or
                                                 tuple(bias.shape) != (geo[-1],))):
            continue
        _rewrite(graph, node, geo, w)
    return graph
