"""--check_numerics' report: which node first makes a NaN or inf, and what the inputs
held (ClusterRunner warns with both when a compiled cluster's output is not finite)."""

from __future__ import annotations

import numpy as np

from autoclust.ir import Graph


def nonfinite(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" and x.size > 0 and not np.isfinite(x).all()


def first_nonfinite(graph: Graph, inputs: list[np.ndarray]) -> str:
    """Which node makes the first NaN/inf: the graph re-run node by node with the references."""
    from autoclust import ops
    env = {**graph.initializers, **{v.name: x for v, x in zip(graph.inputs, inputs)}}
    first = "an input has it"
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            args = [None if v is None else env[v.name] for v in node.inputs]
            for v, r in zip(node.outputs, ops.run_ref(node, args)):
                env[v.name] = r = np.asarray(r)
                if first.startswith("an input") and nonfinite(r):
                    fed = any(nonfinite(a) for a in args if a is not None)
                    first = (f"first made by node {node.name!r} ({node.op}) output {v.name!r} "
                             f"from {'NaN/inf' if fed else 'finite'} inputs")
    if not any(nonfinite(env[v.name]) for v in graph.outputs):
        return "the op references give finite outputs from these inputs: the compiled code " \
            "made the NaN/inf"
    return first


def value_ranges(names: list[str], arrays: list[np.ndarray]) -> str:
    """min/max (of the finite values) and NaN and inf counts of each array."""
    parts = []
    for name, x in zip(names, arrays):
        text = f"{name} {x.dtype}{list(x.shape)}"
        if x.size and x.dtype.kind in "fiub":
            finite = x[np.isfinite(x)] if x.dtype.kind == "f" else x
            if finite.size:
                text += f" min {finite.min():.4g} max {finite.max():.4g}"
            if x.dtype.kind == "f":
                text += f" NaN {int(np.isnan(x).sum())} inf {int(np.isinf(x).sum())}"
        parts.append(text)
    return ", ".join(parts)
