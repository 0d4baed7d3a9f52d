"""What clustering did and why: the text and JSON behind `autoclust explain`.

    Built 2 clusters covering 9/12 nodes (75.0%)
      cluster_0000: 5 nodes  Add x2, Exp, Mul, Relu
      cluster_0001: 4 nodes  Mul, ReduceMean, Sqrt, Sub
    Unclustered ops: Identity, NonZero, TopK
    Unclustered nodes:
      nz (NonZero): data-dependent output shape (NonZero)
      ...
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from autoclust.errors import AutoclustError
from autoclust.runtime import transfers
from autoclust.text import plural

if TYPE_CHECKING:
    from autoclust.clustering.partition import Plan
    from autoclust.ir import Node


def _histogram(nodes: list[Node]) -> dict[str, int]:
    """op -> count, most frequent first (ties by op name), so output is stable."""
    counts = Counter(n.op for n in nodes)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _format_histogram(hist: dict[str, int]) -> str:
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in hist.items()) or "-"


def _unclustered(plan: Plan) -> list[Node]:
    return [n for n in plan.graph.nodes if n.name in plan.reasons]


def reason(plan: Plan, node: Node) -> str:
    """Why `node` is in no cluster: never an empty line (`Add_2 (Add): ` was printed once;
    whatever recorded an empty reason is a bug, and the line says so)."""
    text = plan.reasons.get(node.name, "").strip()
    return text or "no reason recorded (a clustering bug: please report it with the model)"


def explain_text(plan: Plan) -> str:
    """A human summary: clusters with op histograms, then every unclustered node and why."""
    total = len(plan.graph.nodes)
    covered = sum(len(c.nodes) for c in plan.clusters)
    share = 100.0 * covered / total if total else 0.0
    summary = f"Built {plural(len(plan.clusters), 'cluster')} covering {covered}/{total} nodes"
    flow = getattr(plan, "control_flow", [])
    tail = f"; {plural(len(flow), 'control-flow node')} with clustered bodies" if flow else ""
    lines = [f"{summary} ({share:.1f}%){tail}"]
    for c in plan.clusters:
        ops = _format_histogram(_histogram(c.nodes))
        lines.append(f"  {c.name}: {plural(len(c.nodes), 'node')}  {ops}")
    lines += _control_flow_lines(flow)
    unrolled = getattr(plan, "unrolled", {})
    if unrolled:
        lines.append("Loops unrolled into the graph:")
        lines += [f"  {name} (Loop): {note}" for name, note in unrolled.items()]
    left = _unclustered(plan)
    lines.append(f"Unclustered ops: {_format_histogram(_histogram(left))}")
    if left:
        lines.append("Unclustered nodes:")
        lines += [f"  {n.name} ({n.op}): {reason(plan, n)}" for n in left]
    placement = getattr(plan, "placement", [])
    if placement:
        lines.append("Measured placement (each cluster against onnxruntime on its subgraph):")
        lines += [f"  {d.text()}" + ("" if d.source == "measured" else f" [{d.source}]")
                  for d in placement]
    copies = _device_copies(plan)
    if copies is not None:
        lines.append(transfers.copies_text(copies))
    return "\n".join(lines)


def _control_flow_lines(flow: list[Any]) -> list[str]:
    """Each If/Loop/Scan our runtime runs, with its bodies' explanations indented."""
    if not flow:
        return []
    lines = ["Control flow run by autoclust:"]
    for step in flow:
        node = step.nodes[0]
        lines.append(f"  {node.name} ({node.op}): {step.summary}")
        for attr, body in step.bodies.items():
            lines.append(f"    {attr}: " + explain_text(body).replace("\n", "\n      "))
    return lines


def _device_copies(plan: Plan) -> list[transfers.Copy] | None:
    """The host <-> device copies of one run, for a backend with its own memory (else None)."""
    from autoclust import registry
    try:
        backend = registry.get_backend(plan.flags.device)
    except AutoclustError:
        return None
    if not registry.policy(backend).device_memory or not plan.clusters:
        return None
    return transfers.plan_copies(plan)


def explain_json(plan: Plan) -> dict[str, Any]:
    """The same facts as plain JSON-ready data (see the ARCHITECTURE explain format)."""
    clusters = [{"id": c.id, "name": c.name, "nodes": [n.name for n in c.nodes],
                 "ops": _histogram(c.nodes), "inputs": [v.name for v in c.inputs],
                 "outputs": [v.name for v in c.outputs]} for c in plan.clusters]
    unclustered = [{"node": n.name, "op": n.op, "reason": reason(plan, n)}
                   for n in _unclustered(plan)]
    out = {"nodes": len(plan.graph.nodes), "clusters": clusters, "unclustered": unclustered}
    if getattr(plan, "unrolled", None):
        out["unrolled"] = dict(plan.unrolled)
    flow = getattr(plan, "control_flow", [])
    if flow:
        out["control_flow"] = [{"node": s.nodes[0].name, "op": s.nodes[0].op,
                                "summary": s.summary,
                                "bodies": {a: explain_json(b) for a, b in s.bodies.items()}}
                               for s in flow]
    if getattr(plan, "placement", None):
        out["placement"] = [d.as_json() for d in plan.placement]
    copies = _device_copies(plan)
    if copies is not None:
        out["copies"] = [{"value": c.value, "dtype": c.dtype, "shape": list(c.shape),
                          "direction": c.direction, "bytes": c.nbytes(), "for": c.reader}
                         for c in copies]
    return out
