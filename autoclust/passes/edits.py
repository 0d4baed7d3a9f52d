"""Small graph edits the passes share: copy a graph, swap a node, add a constant.

They go through the use-def links of autoclust.ir; what they add is keeping a node's output
Values (and so their names and uses) when the node that produces them changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoclust import symbolic
from autoclust.ir import Graph, Node, Value, ValueCopier


def copy_graph(graph: Graph) -> Graph:
    """A deep copy of `graph`'s structure: same names and order; arrays are shared."""
    out = Graph(graph.name)
    out.opset = dict(graph.opset)
    out.doc = dict(graph.doc)
    copy = ValueCopier(out)

    out.inputs = [copy(v) for v in graph.inputs]
    for name, array in graph.initializers.items():
        copy(graph.values.get(name) or Value(name, array.dtype, array.shape))
        out.initializers[name] = array
    for node in graph.nodes:
        new = Node(node.op, [None if v is None else copy(v) for v in node.inputs],
                   [copy(v) for v in node.outputs], dict(node.attrs), node.name, node.domain)
        new.implicit_inputs = [copy(v) for v in node.implicit_inputs]
        new.proto = node.proto
        out.add_node(new)
    out.outputs = [copy(v) for v in graph.outputs]
    return out


def detach(graph: Graph, node: Node) -> int:
    """Remove `node` but keep its output Values and their uses; return its old index.

    The caller then gives the outputs a new producer (another node or an initializer).
    """
    index = graph.nodes.index(node)
    kept = [(v, v.uses) for v in node.outputs]
    for v in node.outputs:
        v.uses = []
    graph.remove_node(node)
    for v, uses in kept:
        v.uses = uses
    return index


def replace_node(graph: Graph, node: Node, op: str, inputs: list[Value | None],
                 attrs: dict[str, Any] | None = None, domain: str = "") -> Node:
    """Put `op(inputs)` in `node`'s place, producing the same output Values."""
    index = detach(graph, node)
    new = Node(op, inputs, node.outputs, attrs, node.name, domain)
    return graph.add_node(new, index)


def set_constant(graph: Graph, v: Value, array: np.ndarray) -> None:
    """Make the (producer-less) Value `v` an initializer holding `array`."""
    graph.initializers[v.name] = array
    graph.values[v.name] = v
    v.dtype, v.shape = symbolic.tensor_dtype(array), tuple(array.shape)


def new_constant(graph: Graph, array: np.ndarray, base: str = "const") -> Value:
    """A fresh initializer holding `array`."""
    return graph.add_initializer(graph.unique_name(f"{base}_"), np.asarray(array))
