"""cse: merge common subexpressions.

Cases:
- two nodes with the same (domain, op, inputs, attrs) compute the same outputs: the later
  one's uses move to the earlier one's outputs (attrs compare by value, arrays by bytes);
- two small constants with the same dtype, shape and bytes: one initializer is kept.
Only ops in the op table merge (they are deterministic); nodes with subgraphs never do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoclust import ops
from autoclust.ir import Graph, Node, Value

# Constants above this many elements are not hashed (weights are rarely duplicated).
MAX_CONSTANT_ELEMENTS = 1 << 16


def _freeze(a: Any) -> Any:
    """A hashable, type-tagged key for an attribute value (NaN-safe)."""
    if isinstance(a, np.ndarray):
        return ("ndarray", a.dtype.str, a.shape, a.tobytes())
    if isinstance(a, (list, tuple)):
        return ("list", tuple(_freeze(x) for x in a))
    if isinstance(a, float):
        return ("float", a.hex())
    return (type(a).__name__, a)


def _node_key(node: Node) -> tuple | None:
    if ops.get(node.op, node.domain) is None or node.implicit_inputs or not node.outputs:
        return None
    if any(hasattr(a, "SerializeToString") for a in node.attrs.values()):
        return None  # a subgraph attribute
    attrs = tuple(sorted((k, _freeze(a)) for k, a in node.attrs.items()))
    inputs = tuple(None if v is None else id(v) for v in node.inputs)
    return (node.domain, node.op, inputs, attrs, len(node.outputs))


def _merge_constants(graph: Graph) -> None:
    seen: dict[tuple, Value] = {}
    for name, array in list(graph.initializers.items()):
        v = graph.values.get(name)
        if v is None or v in graph.inputs or array.size > MAX_CONSTANT_ELEMENTS:
            continue
        key = (array.dtype.str, array.shape, array.tobytes())
        canonical = seen.setdefault(key, v)
        if canonical is not v:
            graph.replace_all_uses(v, canonical)
            del graph.initializers[name]
            del graph.values[name]


def cse(graph: Graph) -> Graph:
    """Merge identical constants, then identical nodes (see the module docstring)."""
    _merge_constants(graph)
    seen: dict[tuple, Node] = {}
    for node in list(graph.nodes):
        key = _node_key(node)
        if key is None:
            continue
        first = seen.setdefault(key, node)
        if first is node:
            continue
        for old, new in zip(node.outputs, first.outputs):
            if old is not new:  # only a broken graph shares outputs; don't loop on it
                graph.replace_all_uses(old, new)
        graph.remove_node(node)
    return graph
