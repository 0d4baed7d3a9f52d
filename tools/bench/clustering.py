"""Clustering speed on a large graph (moved out of autoclust/clustering/partition.py).

    python -m autoclust.tools.bench.clustering

Clusters a 10,000-node chain of diamonds, each diamond passing through an op outside the
table (so legality, the incremental cycle check, has real work), and prints the time.
tests/core/test_clustering.py bounds it.
"""

from __future__ import annotations

import time

import numpy as np

from autoclust import flags as flags_mod
from autoclust.clustering import partition as clustering
from autoclust.ir import Graph, Node, Value


def chain_and_diamond_graph(num_nodes: int) -> Graph:
    """A chain of diamonds, one through an op outside the table, `num_nodes` nodes long."""
    g = Graph("chain_and_diamond")
    x = g.add_input("x", np.float32, (4, 8))
    f32, shape = np.dtype(np.float32), (4, 8)

    def node(op: str, *args: Value, domain: str = "") -> Value:
        out = Value(f"v{len(g.nodes)}", f32, shape)
        g.add_node(Node(op, args, [out], name=f"{op}_{len(g.nodes)}", domain=domain))
        return out

    while len(g.nodes) + 8 <= num_nodes:
        a = node("Relu", x)
        m = node("Mul", node("Exp", a), node("Tanh", a))
        d = node("Add", m, node("CustomOp", m, domain="com.example"))  # diamond via CustomOp
        x = node("Add", node("Sigmoid", d), a)
    g.outputs.append(x)
    return g


def benchmark_clustering(num_nodes: int = 10_000) -> float:
    """Cluster a `num_nodes` chain-and-diamond graph; print and return the seconds taken."""
    graph = chain_and_diamond_graph(num_nodes)
    flags = flags_mod.parse("", device="interpreter")
    start = time.perf_counter()
    plan = clustering.cluster(graph, flags)
    seconds = time.perf_counter() - start
    print(f"clustered {len(graph.nodes)} nodes into {len(plan.clusters)} clusters and "
          f"{len(plan.steps) - len(plan.clusters)} segments in {seconds * 1e3:.0f} ms")
    return seconds


if __name__ == "__main__":
    benchmark_clustering()
