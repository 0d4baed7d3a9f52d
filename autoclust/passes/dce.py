"""dce: remove dead code.

Cases:
- a node none of whose outputs is used or a graph output is removed (sweeping backwards,
  so whole dead chains go in one pass);
- an initializer nothing reads (and that is neither a graph input nor a graph output) is
  dropped;
- graph.values forgets names nothing refers to any more.
Graph inputs always stay, even unused: they are the executable's calling convention.
"""

from __future__ import annotations

from autoclust.ir import Graph


def dce(graph: Graph) -> Graph:
    """Remove unused nodes and initializers (see the module docstring)."""
    outputs = {id(v) for v in graph.outputs}
    for node in reversed(list(graph.nodes)):
        if not any(v.uses or id(v) in outputs for v in node.outputs):
            graph.remove_node(node)
    keep = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    for node in graph.nodes:
        keep.update(v.name for v in node.all_inputs())
        keep.update(v.name for v in node.outputs)
    for name in [n for n in graph.initializers if n not in keep]:
        del graph.initializers[name]
    graph.values = {n: v for n, v in graph.values.items() if n in keep}
    return graph
