"""fold_constants: evaluate nodes whose inputs are all known with the ops' NumPy references.

Cases:
- every present input is a constant (initializer)      -> outputs become initializers
- Shape/Size of a value with a concrete shape            -> constant, even if the value isn't
- zero-input ops in the table (Constant, ...)            -> initializers
Not folded: ops outside the op table (Random*, custom domains: maybe nondeterministic),
nodes with subgraphs, outputs over MAX_FOLD_ELEMENTS, outputs that grow past their inputs
(Expand/ConstantOfShape/Tile of a small constant: a broadcast is cheaper to compute than to
load; library ops such as MatMul may grow, since left in they cost a library call per run and
block folding what follows, e.g. the cos/sin tables of rotary embeddings; so may the Gathers,
whose every element is an index load, a bounds check and a scattered read per run: LeViT's
attention biases, a [4, 196] table gathered by constant [196, 196] indices into a 600 KB
addend of each softmax, made those softmax kernels 6x onnxruntime's, which folds them),
and nodes whose reference fails or disagrees with the inferred dtype/shape (the node
stays and the backend computes it).
Folded outputs keep their Value and name, so a graph output that folds stays in the output
list, now as an initializer.
"""

from __future__ import annotations

import numpy as np

from autoclust import ops, symbolic
from autoclust.errors import AutoclustError
from autoclust.ir import Graph, Node
from autoclust.passes.edits import detach, set_constant

MAX_FOLD_ELEMENTS = 1 << 20
# Outputs up to this size fold even when larger than their inputs (shape tensors, masks).
SMALL_ELEMENTS = 1024
GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})  # may grow (module docstring)


def _inputs_of(graph: Graph, node: Node, opdef: ops.OpDef, known: dict[str, np.ndarray]
               ) -> list[np.ndarray | None] | None:
    """Input arrays when every present input is known, else None."""
    if opdef.shape_of:
        v = node.inputs[0]
        if v is not None and v.shape is not None and symbolic.has_syms(v.shape):
            return [symbolic.ShapeOnly(v.shape, v.dtype)]  # Shape/Size read only .shape
        if v is not None and v.is_static():
            # A zero-strided view: Shape/Size read only .shape, so nothing is allocated.
            dtype = v.dtype if v.dtype is not None else np.dtype("float32")
            return [np.broadcast_to(np.zeros((), dtype), v.shape)]
    arrays: list[np.ndarray | None] = []
    for v in node.inputs:
        if v is None:
            arrays.append(None)
            continue
        a = known.get(v.name)
        if a is None:
            a = graph.constant_value(v)
        if a is None:
            return None
        arrays.append(a)
    return arrays


def _too_big(size: int, input_size: int, max_elements: int, may_grow: bool = False) -> bool:
    grows = size > SMALL_ELEMENTS and size > input_size and not may_grow
    return size > max_elements or grows


def evaluate(graph: Graph, node: Node, known: dict[str, np.ndarray] | None = None,
             max_elements: int = MAX_FOLD_ELEMENTS) -> list[np.ndarray] | None:
    """`node`'s outputs from its NumPy reference when all inputs are known, else None."""
    opdef = ops.get(node.op, node.domain)
    if opdef is None or node.implicit_inputs:
        return None
    if any(hasattr(a, "SerializeToString") for a in node.attrs.values()):
        return None  # a graph-valued attribute (If/Loop body)
    arrays = _inputs_of(graph, node, opdef, known or {})
    if arrays is None:
        return None
    input_size = 0 if opdef.shape_of else sum(int(a.size) for a in arrays if a is not None)
    may_grow = opdef.kind == ops.LIBRARY or (node.op in GATHERS and node.domain in ("", "ai.onnx"))
    for v in node.outputs:
        if v.shape is not None and symbolic.has_syms(v.shape):
            return None  # its size depends on symbolic dims: computed at run time
        if v.is_static() and _too_big(int(np.prod(v.shape)), input_size, max_elements, may_grow):
            return None
    try:  # a trial: a ref needing a concrete symbolic dim leaves the node (Pinned)
        with np.errstate(all="ignore"), symbolic.trial():
            outs = [np.asarray(o, order="C") for o in opdef.ref(arrays, node.attrs)]
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError, AutoclustError):
        return None  # e.g. an out-of-range Gather index: leave it for run time to report
    if len(outs) < len(node.outputs):
        return None
    outs = outs[:len(node.outputs)]  # a ref may compute optional outputs the node omits
    for o, v in zip(outs, node.outputs):
        if _too_big(o.size, input_size, max_elements, may_grow):
            return None
        dtype = np.dtype(np.int64) if symbolic.is_sym_array(o) else o.dtype
        if (v.dtype is not None and dtype != v.dtype) or (v.is_static() and o.shape != v.shape):
            return None
    return outs


def fold_constants(graph: Graph) -> Graph:
    """Replace nodes computable at compile time by initializers (see the module docstring)."""
    for node in list(graph.nodes):
        outs = evaluate(graph, node)
        if outs is None:
            continue
        detach(graph, node)
        for v, array in zip(node.outputs, outs):
            set_constant(graph, v, array)
    return graph
