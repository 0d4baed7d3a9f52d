"""Control flow with clustered bodies, the planning half: If, Loop and Scan.

Clustering refuses a node with a graph attribute ("has a subgraph"). For If, Loop and Scan
`plan_bodies` then imports each body as a graph of its own (the outer-scope values it
reads become inputs, or constants where the enclosing graph has them as constants) and
clusters it with the same flags, recursively, so a Loop inside an If inside a Loop works.
When some body clusters, the node becomes a ControlFlow step, which
autoclust/runtime/control_flow.py runs (the semantics of the three ops are written there).
A node whose bodies carry non-tensor values (sequences, optionals), whose body does not
import, or whose bodies have nothing to cluster stays one onnxruntime segment, with the
reason in `autoclust explain`.

A Loop with a constant trip count whose body is elementwise work only (`unroll_static_loops`,
run before clustering) is unrolled into the enclosing graph instead, so fusion makes the
whole loop one kernel that keeps the carried values in registers. The kernel IR
(autoclust/kernel/ir.py) has no loop-carried buffers (a kernel reads its inputs and writes
its outputs once), so unrolling is how a loop becomes one kernel; it is capped at
UNROLL_MAX_NODES nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autoclust import ops, registry
from autoclust.clustering.candidates import (
    SUBGRAPH_REASON,
    WhyNot,
    shape_static_values,
    why_not_candidate,
)
from autoclust.errors import AutoclustError
from autoclust.flags import Flags
from autoclust.ir import Graph, Node, Value
from autoclust.text import plural

if TYPE_CHECKING:
    from autoclust.clustering.partition import Plan
    from autoclust.registry import Policy

# The graph attributes of each op our runtime runs, in the order explain lists them.
BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_INT64, _BOOL = np.dtype(np.int64), np.dtype(bool)
# The most nodes an unrolled Loop may add (trip count x body nodes).
UNROLL_MAX_NODES = 256


# ---- planning ---------------------------------------------------------------------------

class _Refusal(Exception):
    """Why a control-flow node stays in onnxruntime (the message ends up in explain)."""


def plan_bodies(node: Node, graph: Graph, flags: Flags, why_not: WhyNot, policy: Policy,
                cluster: Callable[..., Plan]) -> tuple[dict[str, Plan], str] | str:
    """(body plans, explain summary) when our runtime should run `node`, else the reason
    it stays in onnxruntime (starting "has a subgraph"). `cluster` is partition.cluster,
    called on each body (bodies nest: a Loop inside an If inside a Loop)."""
    if node.domain not in ("", "ai.onnx") or node.op not in BODIES:
        return SUBGRAPH_REASON
    if node.op == "Scan" and graph.opset.get("", 17) < 9:
        return f"{SUBGRAPH_REASON} (Scan before opset 9 has a batch axis; onnxruntime runs it)"
    try:
        _check_tensors(node.inputs + node.outputs, f"{node.op} {node.name!r}")
        bodies = {}
        for attr in BODIES[node.op]:
            body = body_graph(node, graph, attr)
            bodies[attr] = cluster(body, flags, why_not, policy)
    except _Refusal as exc:
        return f"{SUBGRAPH_REASON}; onnxruntime runs it: {exc}"
    if not any(_runs_in_autoclust(p) for p in bodies.values()):
        first = next((f"{n}: {r}" for p in bodies.values() for n, r in p.reasons.items()),
                     "its bodies are empty")
        return f"{SUBGRAPH_REASON}; nothing in it clusters ({first})"
    return bodies, summary(node.op, bodies)


def _runs_in_autoclust(plan: Plan) -> bool:
    """Whether a body plan needs our runtime: it compiles something, or it holds a custom
    op (a host step: onnxruntime cannot load the body then)."""
    return bool(plan.clusters) or any(getattr(s, "host", False) for s in plan.steps) or any(
        _runs_in_autoclust(b) for step in plan.control_flow for b in step.bodies.values())


def summary(op: str, bodies: dict[str, Plan]) -> str:
    """`Loop runs in autoclust; body: 1 cluster of 5/6 nodes` (the explain line)."""
    parts = []
    for attr, plan in bodies.items():
        covered = sum(len(c.nodes) for c in plan.clusters)
        text = (f"{attr}: {plural(len(plan.clusters), 'cluster')} of "
                f"{covered}/{len(plan.graph.nodes)} nodes")
        if plan.control_flow:
            text += f" and {plural(len(plan.control_flow), 'control-flow node')}"
        parts.append(text)
    return f"{op} runs in autoclust; " + ", ".join(parts)


def _check_tensors(values: list[Any], what: str) -> None:
    for v in values:
        if v is not None and v.dtype is None:
            kind = "a non-tensor" if v.type_proto is not None else "an untyped"
            raise _Refusal(f"{what} has {kind} value {v.name!r} (sequences and optionals "
                           "stay in onnxruntime)")


def body_graph(node: Node, graph: Graph, attr: str) -> Graph:
    """The body in graph attribute `attr` of `node` as a standalone Graph: its formal
    inputs first, then the outer-scope values it reads (outer constants become its own)."""
    onnx_importer = registry.importer("onnx")
    proto = node.attrs.get(attr)
    if proto is None or not hasattr(proto, "g"):
        raise _Refusal(f"no graph attribute {attr!r}")
    body = onnx.GraphProto()
    body.CopyFrom(proto.g)
    _fill_formal_types(body, _formal_dtypes(node, len(body.input)))
    for name in onnx_importer.outer_reads(proto.g):
        v = graph.values.get(name)
        if v is None:
            raise _Refusal(f"{attr} reads {name!r}, which the enclosing graph lacks")
        array = graph.constant_value(v)
        if array is not None:
            body.initializer.append(numpy_helper.from_array(array, name))
            continue
        _check_tensors([v], f"{attr} of {node.name!r}")
        body.input.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(v.dtype),
            None if v.shape is None else [d if isinstance(d, int | str) else None
                                          for d in v.shape]))
    body.name = f"{node.name}.{attr}"
    model = helper.make_model(body, opset_imports=[helper.make_opsetid(d, int(n))
                                                   for d, n in graph.opset.items()])
    model.ir_version = int(graph.doc.get("ir_version") or 10)
    model.functions.extend(graph.doc.get("functions", []))
    quiet = logging.getLogger("autoclust.importers.onnx")
    was_disabled, quiet.disabled = quiet.disabled, True  # the model's import checked it
    try:
        sub = onnx_importer.import_model(model)
    except AutoclustError as exc:
        raise _Refusal(f"{attr} does not import: {exc}") from None
    finally:
        quiet.disabled = was_disabled
    _check_tensors(sub.inputs + sub.outputs, f"{attr} of {node.name!r}")
    return sub


def _formal_dtypes(node: Node, count: int) -> list[np.dtype | None]:
    """The dtypes the node gives its body's formal inputs (for bodies that omit them)."""
    if node.op == "Loop":
        carried = [None if v is None else v.dtype for v in node.inputs[2:]]
        return ([_INT64, _BOOL] + carried)[:count]
    if node.op == "Scan":
        return [None if v is None else v.dtype for v in node.inputs][:count]
    return []


def _fill_formal_types(body: onnx.GraphProto, dtypes: list[np.dtype | None]) -> None:
    for vi, dtype in zip(body.input, dtypes):
        if dtype is not None and not vi.type.HasField("tensor_type") and \
                not vi.type.HasField("sequence_type") and not vi.type.HasField("optional_type"):
            vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(dtype)


# ---- unrolling ------------------------------------------------------------------------

def unroll_static_loops(graph: Graph, flags: Flags, why_not: WhyNot) -> dict[str, str]:
    """Unroll each Loop with a constant trip count, no scan outputs and an elementwise
    body into `graph` (edited in place); returns loop name -> the explain note."""
    notes = {}
    for node in [n for n in graph.nodes if n.op == "Loop" and n.domain in ("", "ai.onnx")]:
        trip = _static_trip(node, graph)
        if trip is None:
            continue
        try:
            body = body_graph(node, graph, "body")
        except _Refusal:
            continue
        work = _unrollable_work(node, body, flags, why_not, shape_static_values(body))
        if work is None or trip * len(work) > UNROLL_MAX_NODES:
            continue
        _unroll(graph, node, body, work, trip)
        notes[node.name] = (f"unrolled: {plural(trip, 'iteration')} of an elementwise body of "
                            f"{plural(len(work), 'node')} (constant trip count)")
    return notes


def _static_trip(node: Node, graph: Graph) -> int | None:
    """The trip count of a Loop whose M is a constant >= 1 and whose cond is absent or a
    constant true, else None."""
    m = graph.constant_value(node.inputs[0]) if node.inputs and node.inputs[0] else None
    cond = node.inputs[1] if len(node.inputs) > 1 else None
    if m is None or m.size != 1 or int(m.reshape(())) < 1:
        return None
    c = None if cond is None else graph.constant_value(cond)
    if cond is not None and (c is None or not bool(c.all())):
        return None
    return int(m.reshape(()))


def _unrollable_work(node: Node, body: Graph, flags: Flags, why_not: WhyNot,
                     static: set[str]) -> list[Node] | None:
    """The body nodes to copy per iteration, or None when the body is not elementwise
    candidates only, has scan outputs or computes its condition."""
    n_carried = len(node.inputs) - 2
    if len(body.outputs) != 1 + n_carried or len(node.outputs) != n_carried or \
            any(v is None for v in node.inputs[2:]):  # an omitted carried value: malformed
        return None
    cond_in, cond_out = body.inputs[1], body.outputs[0]
    cond_node = cond_out.producer
    if cond_out is not cond_in and not (cond_node is not None and cond_node.op == "Identity"
                                        and cond_node.inputs[0] is cond_in):
        return None  # the body decides when to stop
    work = [n for n in body.nodes if n is not cond_node]
    for n in work:
        opdef = ops.get(n.op, n.domain)
        if opdef is None or opdef.kind != ops.ELEMENTWISE or \
                why_not_candidate(n, body, flags, static, why_not) is not None or \
                any(v is cond_in for v in n.inputs):
            return None
    return work if work else None


def _unroll(graph: Graph, node: Node, body: Graph, work: list[Node], trip: int) -> None:
    """Replace `node` by `trip` copies of `work` (iteration i as a constant), then
    Identity nodes giving the loop's own output values the last iteration's results."""
    outer = {v.name: graph.values[v.name] for v in body.inputs[2 + len(node.inputs) - 2:]}
    for name, array in body.initializers.items():
        known = graph.values.get(name)
        if known is None or not graph.is_constant(known):
            known = graph.add_initializer(graph.unique_name(f"{node.name}_{name}_"), array)
        outer[name] = known
    carried = [v for v in node.inputs[2:] if v is not None]  # none omitted: _unrollable_work
    index = graph.nodes.index(node)
    for k in range(trip):
        env = dict(outer)
        env[body.inputs[0].name] = graph.add_initializer(
            graph.unique_name(f"{node.name}_i{k}_"), np.array(k, _INT64))
        env.update((v.name, c) for v, c in zip(body.inputs[2:], carried))
        for bn in work:
            outs = [Value(graph.unique_name(f"{node.name}_{k}_{v.name}_"), v.dtype,
                          v.shape if v.is_static() else None) for v in bn.outputs]
            copy = Node(bn.op, [None if v is None else env[v.name] for v in bn.inputs], outs,
                        dict(bn.attrs), graph.unique_name(f"{node.name}_{k}_{bn.name}_"),
                        bn.domain)
            graph.add_node(copy, index)
            index += 1
            env.update((v.name, c) for v, c in zip(bn.outputs, outs))
        carried = [env[v.name] for v in body.outputs[1:]]
    for v in node.all_inputs():
        v.uses = [(n, i) for n, i in v.uses if n is not node]
    graph.nodes.remove(node)
    for k, (result, out) in enumerate(zip(carried, node.outputs)):
        graph.add_node(Node("Identity", [result], [out], name=graph.unique_name(
            f"{node.name}_result{k}_")), index + k)
