"""The interpreter backend: runs a cluster graph op by op with the NumPy references.

Like XLA's Interpreter platform it is slow and simple on purpose: it defines what a
cluster computes, so `autoclust replay` and the tests compare compiled code against it
(`--device=interpreter`).
"""

from __future__ import annotations

import numpy as np

from autoclust import ops
from autoclust.flags import Flags
from autoclust.ir import Graph, Node
from autoclust.registry import Policy

NAME = "interpreter"
POLICY = Policy(lowers=False)  # runs the optimized graph op by op, no kernel IR


def why_not(node: Node, graph: Graph) -> str | None:
    """Every op with a reference implementation runs here."""
    if ops.get(node.op, node.domain) is None:
        return f"op {node.qualified_op} has no reference implementation"
    return None


def evaluate(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `graph` on `inputs` (graph.inputs order) and return its outputs."""
    env: dict[str, np.ndarray] = dict(graph.initializers)
    for v, x in zip(graph.inputs, inputs):
        env[v.name] = x
    last_use = _last_uses(graph)
    keep = {v.name for v in graph.outputs}
    for i, node in enumerate(graph.nodes):
        args = [None if v is None else env[v.name] for v in node.inputs]
        results = ops.run_ref(node, args)
        for v, r in zip(node.outputs, results):
            env[v.name] = np.asarray(r)
        for name in last_use.get(i, ()):
            if name not in keep:
                env.pop(name, None)
    return [env[v.name] for v in graph.outputs]


def _last_uses(graph: Graph) -> dict[int, list[str]]:
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None:
                last[v.name] = i
    out: dict[int, list[str]] = {}
    for name, i in last.items():
        out.setdefault(i, []).append(name)
    return out


class Executable:
    """A cluster graph ready to interpret."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.num_kernels = len(graph.nodes)
        self.dumps: dict[str, str] = {}

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            outs = evaluate(self.graph, inputs)
        # Never hand out an array that aliases an input or a constant of the graph.
        return [np.array(o, copy=True) for o in outs]


def compile(graph: Graph, flags: Flags) -> Executable:
    """'Compile' for the interpreter: keep the optimized graph."""
    return Executable(graph)
