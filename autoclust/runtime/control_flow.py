"""Control flow with clustered bodies: If, Loop and Scan run by our runtime.

Clustering refuses a node with a graph attribute ("has a subgraph"). For If, Loop and Scan
`plan_bodies` then imports each body as a graph of its own (the outer-scope values it
reads become inputs, or constants where the enclosing graph has them as constants) and
clusters it with the same flags, recursively, so a Loop inside an If inside a Loop works.
When some body clusters, the node becomes a ControlFlow step; ControlFlowRunner runs it
with NumPy holding the loop state, one Runtime per body:

    Loop(M, cond, v...)  body(i, cond, v...) -> (cond, v..., scan...)
        runs while i < M (M omitted: no bound) and cond (omitted: true); scan outputs are
        the per-iteration values stacked along a new axis 0.
    If(cond)             then_branch() or else_branch() -> outputs
    Scan(s..., x...)     body(s..., x[t]...) -> (s..., y...), t along scan_input_axes
        (reversed where scan_input_directions is 1); y stacked along scan_output_axes.

Each body cluster compiles once per input signature, so iterations 2..N of a loop whose
shapes stay put compile nothing (stats() counts compiles and runs). Body nodes that do not
cluster run in onnxruntime segments of the body. A node whose bodies carry non-tensor
values (sequences, optionals), whose body does not import, or whose bodies have nothing
to cluster stays one onnxruntime segment, with the reason in `autoclust explain`.

A Loop with a constant trip count whose body is elementwise work only (`unroll_static_loops`,
run before clustering) is unrolled into the enclosing graph instead, so fusion makes the
whole loop one kernel that keeps the carried values in registers. The kernel IR
(autoclust/kernel/ir.py) has no loop-carried buffers (a kernel reads its inputs and writes
its outputs once), so unrolling is how a loop becomes one kernel; it is capped at
UNROLL_MAX_NODES nodes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autoclust.errors import AutoclustError, InvalidInputError
from autoclust.flags import Flags
from autoclust.ir import Graph, Node, Value
from autoclust.report.explain import plural

if TYPE_CHECKING:
    from autoclust.clustering.partition import ControlFlow, Plan, WhyNot
    from autoclust.registry import Policy

# The graph attributes of each op our runtime runs, in the order explain lists them.
BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_INT64, _BOOL = np.dtype(np.int64), np.dtype(bool)
# The most nodes an unrolled Loop may add (trip count x body nodes).
UNROLL_MAX_NODES = 256


# ---- planning ---------------------------------------------------------------------------

class _Refusal(Exception):
    """Why a control-flow node stays in onnxruntime (the message ends up in explain)."""


def plan_bodies(node: Node, graph: Graph, flags: Flags, why_not: WhyNot,
                policy: Policy) -> tuple[dict[str, Plan], str] | str:
    """(body plans, explain summary) when our runtime should run `node`, else the reason
    it stays in onnxruntime (starting "has a subgraph")."""
    from autoclust.clustering.partition import SUBGRAPH_REASON, cluster
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
    from autoclust.importers.onnx.load import _outer_reads, import_model
    proto = node.attrs.get(attr)
    if proto is None or not hasattr(proto, "g"):
        raise _Refusal(f"no graph attribute {attr!r}")
    body = onnx.GraphProto()
    body.CopyFrom(proto.g)
    _fill_formal_types(body, _formal_dtypes(node, len(body.input)))
    for name in _outer_reads(proto.g, set()):
        v = graph.values.get(name)
        if v is None:
            raise _Refusal(f"{attr} reads {name!r}, which the enclosing graph lacks")
        if graph.is_constant(v):
            body.initializer.append(numpy_helper.from_array(graph.constant_value(v), name))
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
        sub = import_model(model)
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
    from autoclust.clustering.partition import shape_static_values
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
    if cond is not None and not (graph.is_constant(cond) and bool(
            graph.constant_value(cond).all())):
        return None
    return int(m.reshape(()))


def _unrollable_work(node: Node, body: Graph, flags: Flags, why_not: WhyNot,
                     static: set[str]) -> list[Node] | None:
    """The body nodes to copy per iteration, or None when the body is not elementwise
    candidates only, has scan outputs or computes its condition."""
    from autoclust import ops
    from autoclust.clustering.partition import why_not_candidate
    n_carried = len(node.inputs) - 2
    if len(body.outputs) != 1 + n_carried or len(node.outputs) != n_carried:
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
    carried = list(node.inputs[2:])
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


# ---- running ----------------------------------------------------------------------------

class _Body:
    """One body: its Runtime, formal input names, outer inputs it reads, output names."""

    def __init__(self, plan: Plan, make_runtime: Any, formal: int):
        self.runtime = make_runtime(plan)
        names = [v.name for v in plan.graph.inputs]
        self.formal = names[:formal]
        self.outer = names[formal:]
        self.outputs = [v.name for v in plan.graph.outputs]
        self.device = self.runtime.device

    def run(self, formal: list[np.ndarray], outer: dict[str, np.ndarray],
            run_options: Any) -> list[np.ndarray]:
        feeds = dict(zip(self.formal, formal))
        for name in self.outer:
            feeds[name] = outer[name]
        if self.device is not None:  # a device backend: bring the results to the host
            return self.device.run(feeds, self.outputs, on_device=False)
        env = self.runtime.run(feeds, run_options)
        return [env[n] for n in self.outputs]


class ControlFlowRunner:
    """Runs a ControlFlow step: the loop or branch in Python, its bodies' Runtimes."""

    def __init__(self, step: ControlFlow, graph: Graph, flags: Flags, backend: Any,
                 sess_options: Any = None, providers: Any = None,
                 provider_options: Any = None):
        from autoclust.runtime.runner import Runtime

        def make_runtime(plan: Plan) -> Runtime:
            return Runtime(plan, flags, backend, sess_options, providers, provider_options,
                           whole_plan=False)  # a body is no model of its own

        self.name = step.name
        self.node = graph.nodes[0]
        self.op = self.node.op
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self.constants = dict(graph.initializers)
        formal = {attr: len(self.node.attrs[attr].g.input) for attr in step.bodies}
        self.bodies = {attr: _Body(plan, make_runtime, formal[attr])
                       for attr, plan in step.bodies.items()}
        self.runs = 0
        self.iterations = 0  # body runs over all runs
        self._run = {"Loop": self._loop, "If": self._if, "Scan": self._scan}[self.op]

    def run(self, inputs: list[np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        values = dict(self.constants)
        values.update(zip(self.input_names, inputs))
        args = [None if v is None else values[v.name] for v in self.node.inputs]
        self.runs += 1
        outs = self._run(args, values, run_options)
        by_name = dict(zip([v.name for v in self.node.outputs], outs))
        return [by_name[n] for n in self.output_names]

    def _body(self, attr: str, formal: list[np.ndarray], outer: dict[str, np.ndarray],
              run_options: Any) -> list[np.ndarray]:
        self.iterations += 1
        return self.bodies[attr].run(formal, outer, run_options)

    # ---- the three ops ------------------------------------------------------------------
    def _if(self, args: list[Any], outer: dict[str, Any], run_options: Any) -> list[Any]:
        cond = _scalar(args[0], self.node, "cond")
        return self._body("then_branch" if cond else "else_branch", [], outer, run_options)

    def _loop(self, args: list[Any], outer: dict[str, Any], run_options: Any) -> list[Any]:
        trip = None if len(args) < 1 or args[0] is None else int(_scalar(args[0], self.node,
                                                                          "M"))
        keep = True if len(args) < 2 or args[1] is None else \
            bool(_scalar(args[1], self.node, "cond"))
        carried = list(args[2:])
        n_carried = len(carried)
        scans: list[list[np.ndarray]] = []
        i = 0
        while keep and (trip is None or i < trip):
            outs = self._body("body", [np.array(i, _INT64), np.array(keep), *carried], outer,
                              run_options)
            keep = bool(_scalar(outs[0], self.node, "the body's cond output"))
            carried = outs[1:1 + n_carried]
            scans.append(outs[1 + n_carried:])
            i += 1
        n_scan = len(self.bodies["body"].outputs) - 1 - n_carried
        return carried + [self._stack(k, [s[k] for s in scans], 0, 1 + n_carried + k)
                          for k in range(n_scan)]

    def _scan(self, args: list[Any], outer: dict[str, Any], run_options: Any) -> list[Any]:
        m = int(self.node.attr("num_scan_inputs"))
        n = len(args) - m
        states, xs = list(args[:n]), args[n:]
        in_axes = [_axis(a, x.ndim, self.node) for a, x in
                   zip(self.node.attr("scan_input_axes") or [0] * m, xs)]
        in_rev = list(self.node.attr("scan_input_directions") or [0] * m)
        lengths = {x.shape[a] for x, a in zip(xs, in_axes)}
        if len(lengths) != 1:
            raise InvalidInputError(f"Scan {self.node.name!r}: scan inputs have different "
                                    f"lengths {sorted(lengths)} along their scan axes")
        length = lengths.pop()
        ys: list[list[np.ndarray]] = []
        for t in range(length):
            slices = [np.take(x, length - 1 - t if rev else t, axis=a)
                      for x, a, rev in zip(xs, in_axes, in_rev)]
            outs = self._body("body", [*states, *slices], outer, run_options)
            states, y = outs[:n], outs[n:]
            ys.append(y)
        k = len(self.bodies["body"].outputs) - n
        out_axes = list(self.node.attr("scan_output_axes") or [0] * k)
        out_rev = list(self.node.attr("scan_output_directions") or [0] * k)
        scans = []
        for j in range(k):
            per_step = [y[j] for y in ys]
            if out_rev[j]:
                per_step.reverse()
            scans.append(self._stack(j, per_step, out_axes[j], n + j))
        return states + scans

    def _stack(self, k: int, values: list[np.ndarray], axis: int, out_index: int) -> np.ndarray:
        """Per-iteration values stacked along `axis` (a zero-trip loop: an empty array)."""
        if not values:
            return self._empty_scan(out_index)
        shapes = {v.shape for v in values}
        if len(shapes) != 1:
            raise InvalidInputError(f"{self.op} {self.node.name!r}: scan output {k} changes "
                                    f"shape between iterations: {sorted(shapes)}")
        stacked = np.stack(values)
        return np.moveaxis(stacked, 0, _axis(axis, stacked.ndim, self.node))

    def _empty_scan(self, out_index: int) -> np.ndarray:
        """The scan output of zero iterations: shape (0,) + the body output's static dims,
        as onnxruntime gives it."""
        v = self.bodies["body"].runtime.graph.outputs[out_index]
        dims = v.shape if v.shape is not None else ()
        if not all(isinstance(d, int) for d in dims):
            dims = ()
        return np.zeros((0, *dims), v.dtype)

    # ---- inspection ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Runs, body runs and each body's compile counts (nested control flow included)."""
        return {"name": self.name, "node": self.node.name, "op": self.op, "runs": self.runs,
                "iterations": self.iterations,
                "bodies": {attr: runtime_stats(b.runtime) for attr, b in self.bodies.items()}}

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the bodies' background compiles (--async_compile)."""
        for b in self.bodies.values():
            b.runtime.wait_compiles(timeout)


def runtime_stats(runtime: Any) -> dict[str, Any]:
    """{"clusters": [...], "control_flow": [...]} of a Runtime, as session.stats() counts."""
    clusters = [{"name": r.name, "compiles": r.compiles, "runs": r.runs,
                 "kernels": [getattr(e, "num_kernels", 0) for e in r.cache.values()],
                 "fallback": r.fallback_reason or None} for r in runtime.compiled_clusters()]
    flows = [r.stats() for r in runtime.runners if isinstance(r, ControlFlowRunner)]
    return {"clusters": clusters, "control_flow": flows}


def _scalar(x: Any, node: Node, what: str) -> Any:
    a = np.asarray(x)
    if a.size != 1:
        raise InvalidInputError(f"{node.op} {node.name!r}: {what} must have one element, got "
                                f"shape {a.shape}")
    return a.reshape(()).item()


def _axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < rank:
        raise InvalidInputError(f"{node.op} {node.name!r}: axis {axis} is out of range for "
                                f"rank {rank}")
    return axis % rank
