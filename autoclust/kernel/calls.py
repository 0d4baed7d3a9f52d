"""Library calls in fusion: which MatMuls take their bias Add as one Gemm call, and which
operands and results of a call are decided at the call (strided views, kernel/views.py)."""

from __future__ import annotations

from autoclust.ir import Graph, Node, Value
from autoclust.kernel import views


def feeds_library(graph: Graph, v: Value, library: set[str], view_ops: frozenset) -> bool:
    """Whether only library calls read v: directly, or (when they take views) through
    layout ops they read in place (a bias-added Q projection's head split, or its Slice
    of a sibling-fused QKV projection)."""
    for c in graph.consumers(v):
        if c.name in library:
            continue
        if not view_ops or c.op not in views.READ_OPS or len(c.outputs) != 1 or \
                c.outputs[0] in graph.outputs or \
                not feeds_library(graph, c.outputs[0], library, view_ops):
            return False
    return True


def bias_folds(graph: Graph, library: set[str], mode: str,
               view_ops: frozenset = frozenset()) -> dict[str, Node]:
    """MatMul name -> its only consumer, an Add of a constant bias [N], to run as one Gemm.

    A is [..., K] (batch dims flattened into Gemm's M), B a constant [K, N]; onnxruntime
    fuses the same pattern. The Add's output stands in for the MatMul's. `mode` is the
    backend's policy: "alone" folds only when the Add's result is a graph output or feeds
    library calls only (no loop kernel reads it, so the fold removes a kernel); "always"
    also when a kernel reads it; "" never.
    """
    outputs = {v.name for v in graph.outputs}
    folds: dict[str, Node] = {}
    if not mode:
        return folds
    for node in graph.nodes:
        if node.name not in library or node.op != "MatMul" or node.domain not in ("",
                                                                                "ai.onnx"):
            continue
        a, b = node.inputs[0], node.inputs[1]
        y = node.outputs[0]
        if (a is None or not graph.is_constant(b) or a.shape is None or b.shape is None
                or len(a.shape) < 2 or len(b.shape) != 2 or y.name in outputs
                or y.dtype is None or y.dtype.name not in ("float32", "float64")):
            continue
        users = graph.consumers(y)
        if len(users) != 1 or len(y.uses) != 1:
            continue
        add = users[0]
        if add.op != "Add" or add.domain not in ("", "ai.onnx") or add.name in library:
            continue
        bias = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
        out = add.outputs[0]
        if (bias is y or not graph.is_constant(bias) or bias.shape is None
                or out.shape is None or y.shape is None or tuple(bias.shape) != (b.shape[1],)
                or bias.dtype != y.dtype or tuple(out.shape) != tuple(y.shape)):
            continue
        if mode == "alone" and out.name not in outputs and not feeds_library(
                graph, out, library, view_ops):
            continue
        folds[node.name] = add
    return folds


def deferred_operands(graph: Graph, library: set[str], folds: dict[str, Node],
              view_ops: frozenset) -> set[tuple[str, str]]:
    """(library node, value) pairs whose buffer fusion decides at the call (views.py): an
    operand made by layout ops, a result read only through reshapes and transposes."""
    out: set[tuple[str, str]] = set()
    if not view_ops:
        return out
    for node in graph.nodes:
        if node.name not in library or node.name in folds or \
                not views.takes_views(node, view_ops):
            continue
        out.update((node.name, v.name) for v in node.inputs[:views.view_inputs(node)]
                   if v is not None and views.maybe_view(graph, v))
        if node.op == views.ATTENTION:
            continue
        y = node.outputs[0]
        w = views.chain_end(graph, y)
        if w is not None and (w in graph.outputs or any(
                c.name in library for c in graph.consumers(w))):
            out.add((node.name, y.name))
    return out
