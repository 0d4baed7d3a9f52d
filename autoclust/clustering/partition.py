"""Auto-clustering: TensorFlow's MarkForCompilationPass for ONNX graphs.

`cluster(graph, flags)` returns a Plan: the graph split into Clusters (compiled) and
FallbackSegments (run by onnxruntime), in dependency order, with a reason for every node
that is not clustered. Three concerns are kept apart, as in TF and Inductor:

1. Candidates (`why_not_candidate`): the op is in the table, not a legacy form, has no
   subgraph, its output shapes follow from input shapes and shape-static values (not
   NonZero/Unique, not TopK with a runtime k), its dtypes compile, flags allow it, the
   backend can compile it, and clustering fuel is left.
2. Legality (`_contract_clusters`): clusters grow by contracting producer -> consumer
   edges in a GraphCycles structure (Pearce-Kelly), which refuses any merge that would
   create a cycle through a node outside the cluster; --max_cluster_size caps the size.
   (All clusters of a session target one device, flags.device, so devices never differ.)
   Shape computations (Shape -> Gather -> Concat -> Reshape) contract into their
   consumer first, so they fold once shapes are concrete.
3. Profitability (`why_not_profitable`): a cluster must weigh --min_cluster_size, where
   each op weighs its OpDef.cluster_weight (Identity and Dropout 0, normalizations such as
   Softmax and LayerNormalization 2, the rest 1) and pure shape computations 0. The
   backend's policy leaves some ops to onnxruntime (on the CPU: Conv and pooling with the
   epilogues onnxruntime fuses into them). At --auto_jit=1 a
   cost model must also expect a win. The model counts memory traffic only: fusion wins
   when it removes the write and re-read of a full intermediate tensor. A cluster passes
   when (a) an internal edge carries a tensor that is not a shape value, produced by a
   node that writes a tensor (not a zero-weight node and not a view such as Reshape or
   Squeeze: OpDef.view), and read only inside the cluster, and neither end is a library call (MatMul
   and friends run into materialized buffers, so their operands and results are written
   anyway); or (b) a reduction/normalization reads the output of elementwise work inside
   the cluster (the row is computed in registers instead of round-tripping memory).
   So a MatMul with its shape ops saves nothing and is refused. On a backend that keeps
   values in device memory (the GPU), a cluster sandwiched between onnxruntime segments
   whose copies would cost more than it saves goes back to onnxruntime
   (autoclust/clustering/placement.py).

Control flow (control_flow.py here; autoclust/runtime/control_flow.py runs it): before the three phases, a Loop with a constant
trip count and an elementwise body is unrolled into the graph; after candidates, an
If/Loop/Scan whose bodies cluster (each body clustered recursively) becomes a ControlFlow
step that the runtime runs itself; the others keep a "has a subgraph" reason.

Unclustered nodes are then grouped into as few FallbackSegments as legality allows (each
joins a recent segment when no path through another step separates them), and all steps
are ordered topologically. The result depends only on the graph and the flags.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import weakref
from typing import Any

import numpy as np

from autoclust import ops, registry
from autoclust.clustering import control_flow, placement
from autoclust.clustering.candidates import (
    SUBGRAPH_REASON,
    WhyNot,
    is_shape_computation,
    shape_static_values,
    why_not_candidate,
)
from autoclust.clustering.graph_cycles import GraphCycles
from autoclust.errors import NotCompilableError
from autoclust.flags import Flags
from autoclust.ir import Graph, Node, Value
from autoclust.ops import custom
from autoclust.registry import Policy

# How many recent fallback segments an unclustered node tries to join (bounds the work).
_SEGMENT_TRIES = 4


# ---- the plan ---------------------------------------------------------------------------

@dataclasses.dataclass
class Cluster:
    """A compilable subgraph; compiled per signature by the runtime."""

    id: int
    name: str
    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    fingerprint: Fingerprint | str  # the lazy Fingerprint, or (made elsewhere) its text
    shape_value_inputs: list[Value]


@dataclasses.dataclass
class FallbackSegment:
    """Unclustered nodes run together by one onnxruntime sub-session; with `host`, one
    custom-op node (autoclust.ops.custom) that onnxruntime cannot load, run by our runtime."""

    id: int
    name: str
    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    host: bool = False


@dataclasses.dataclass
class ControlFlow:
    """An If/Loop/Scan node the runtime runs itself, each body with its own Plan
    (autoclust/runtime/control_flow.py); `summary` is its explain line."""

    id: int
    name: str
    nodes: list[Node]  # the control-flow node alone
    inputs: list[Value]
    outputs: list[Value]
    bodies: dict[str, Plan]  # graph attribute name -> the body's plan
    summary: str


@dataclasses.dataclass
class Plan:
    """Steps in dependency order (every node in exactly one) and why nodes stay unclustered."""

    graph: Graph
    steps: list[Cluster | FallbackSegment | ControlFlow]
    clusters: list[Cluster]
    reasons: dict[str, str]
    flags: Flags
    control_flow: list[ControlFlow] = dataclasses.field(default_factory=list)
    unrolled: dict[str, str] = dataclasses.field(default_factory=dict)  # Loop name -> note
    # measured placement decisions of the runs so far (autoclust/runtime/autotune.py)
    placement: list = dataclasses.field(default_factory=list)
    _by_node: dict[str, Cluster] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False)

    def cluster_of(self, node_name: str) -> Cluster | None:
        """The cluster holding the node called `node_name`, or None."""
        if self._by_node is None:
            self._by_node = {n.name: c for c in self.clusters for n in c.nodes}
        return self._by_node.get(node_name)


# ---- graph analysis ---------------------------------------------------------------------

class _Analysis:
    """Per-node facts shared by the three phases; nodes are numbered in graph order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes = graph.nodes
        index = {id(n): i for i, n in enumerate(self.nodes)}
        self.position = index
        self.preds: list[list[int]] = []
        self.succs: list[list[int]] = [[] for _ in self.nodes]
        for i, node in enumerate(self.nodes):
            ps = sorted({index[id(v.producer)] for v in node.all_inputs()
                         if v.producer is not None and id(v.producer) in index})
            self.preds.append(ps)
            for p in ps:
                self.succs[p].append(i)
        self.opdefs = [ops.get(n.op, n.domain) for n in self.nodes]
        self.static = shape_static_values(graph)
        self.is_shape = [is_shape_computation(n, d, self.static)
                         for n, d in zip(self.nodes, self.opdefs)]
        self.weight = [0 if s else (1 if d is None else d.cluster_weight)
                       for d, s in zip(self.opdefs, self.is_shape)]

    def kind(self, i: int) -> str | None:
        """Node i's op kind (ops.ELEMENTWISE, ...), None for an op not in the table."""
        d = self.opdefs[i]
        return None if d is None else d.kind


# ---- 1. candidates ----------------------------------------------------------------------

def _find_candidates(an: _Analysis, flags: Flags, why_not: WhyNot | None, policy: Policy,
                     reasons: dict[int, str]) -> list[bool]:
    """Candidate flag per node; reasons for the others. Fuel numbers candidates in order."""
    fuel = flags.clustering_fuel
    used = 0
    candidate = []
    left: set[int] = set()
    for i, node in enumerate(an.nodes):
        reason = why_not_candidate(node, an.graph, flags, an.static, why_not, policy.lowers,
                                   policy.library_dtypes)
        if reason is None:
            reason = _left_to_onnxruntime(an, i, flags, policy, left)
        elif node.op in policy.leave_to_onnxruntime:
            left.add(i)  # refused by the backend (GPU: no cuDNN): its epilogues stay with it
        if reason is None and fuel >= 0 and used >= fuel:
            reason = "clustering fuel exhausted"
        if reason is None:
            used += 1
        else:
            reasons[i] = reason
        candidate.append(reason is None)
    return candidate


def _left_to_onnxruntime(an: _Analysis, i: int, flags: Flags, policy: Policy,
                         left: set[int]) -> str | None:
    """Profitability, decided per node: ops the backend's policy leaves to onnxruntime
    (CPU: Conv and pooling, whose NCHWc kernels beat a library call from a cluster) and the
    epilogues onnxruntime fuses into them (never under --must_compile)."""
    if flags.must_compile:
        return None
    node = an.nodes[i]
    if node.op in policy.leave_to_onnxruntime and \
            not (policy.generates is not None and policy.generates(node)):
        left.add(i)
        return (f"kept in onnxruntime: its {node.op} kernels (fused epilogues, blocked "
                "layouts) beat a library call on this device")
    if node.op in policy.onnxruntime_epilogues:
        for p in an.preds[i]:
            if p in left and len(an.succs[p]) == 1:
                left.add(i)
                return (f"kept in onnxruntime with {an.nodes[p].name} "
                        f"(onnxruntime fuses {node.op} into its {an.nodes[p].op})")
    return None


# ---- 2. legality ------------------------------------------------------------------------

class _Contraction:
    """Clusters as GraphCycles supernodes: members per representative, refusal notes."""

    def __init__(self, an: _Analysis, candidate: list[bool], max_size: int):
        self.an = an
        self.candidate = candidate
        self.max_size = max_size
        self.cycles = GraphCycles(len(an.nodes))
        for i, succs in enumerate(an.succs):
            for s in succs:
                self.cycles.insert_edge(i, s)
        self.rep = list(range(len(an.nodes)))
        self.members: dict[int, list[int]] = {i: [i] for i in range(len(an.nodes))}
        self.cycle_reason: dict[int, str] = {}

    def try_merge(self, i: int, j: int) -> bool:
        """Merge the clusters of nodes i -> j when legal; note a cycle refusal."""
        a, b = self.rep[i], self.rep[j]
        if a == b:
            return True
        if self.max_size and len(self.members[a]) + len(self.members[b]) > self.max_size:
            return False
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a  # keep the bigger cluster's representative: less relabelling
        if not self.cycles.contract_nodes(a, b):
            self._note_cycle(i, j)
            return False
        for m in self.members[b]:
            self.rep[m] = a
        self.members[a].extend(self.members.pop(b))
        return True

    def _note_cycle(self, i: int, j: int) -> None:
        if i in self.cycle_reason and j in self.cycle_reason:
            return
        src, dst = self.rep[i], self.rep[j]
        path = self.cycles.find_path(src, dst, skip_direct=True)[1:-1]
        if not path:
            return
        outside = [p for p in path if not self.candidate[p]] or path
        via = self.an.nodes[min(self.members[outside[0]])].name
        for k in (i, j):
            self.cycle_reason.setdefault(k, f"would create a cycle via node {via}")

    def clusters(self) -> list[list[int]]:
        """Candidate clusters (sorted member lists) in order of their first node."""
        out = [sorted(ms) for r, ms in self.members.items() if self.candidate[r]]
        return sorted(out)


def _contract_clusters(an: _Analysis, candidate: list[bool], flags: Flags) -> _Contraction:
    """Grow clusters by contracting candidate edges: shape computations first, then all."""
    con = _Contraction(an, candidate, flags.max_cluster_size)
    # Round 1: shape computations join their consumers' clusters (last first, so a whole
    # Shape -> Gather -> Concat chain lands in the cluster of the op that reads it).
    for i in reversed(range(len(an.nodes))):
        if candidate[i] and an.is_shape[i]:
            for s in an.succs[i]:
                if candidate[s]:
                    con.try_merge(i, s)
    # Round 2: every remaining producer -> consumer edge between candidates.
    for i in range(len(an.nodes)):
        if candidate[i]:
            for s in an.succs[i]:
                if candidate[s]:
                    con.try_merge(i, s)
    return con


# ---- 3. profitability -------------------------------------------------------------------

def _saves_intermediate(an: _Analysis, members: list[int]) -> bool:
    inside = set(members)
    graph_outputs = {v.name for v in an.graph.outputs}
    for i in members:
        node = an.nodes[i]
        d = an.opdefs[i]
        if an.weight[i] == 0 or d is None or d.view or d.kind == ops.LIBRARY:
            continue
        for v in node.outputs:
            if v.name in an.static or v.name in graph_outputs or not v.uses:
                continue
            users = [an.position[id(u)] for u, _ in v.uses]
            if all(u in inside and an.kind(u) != ops.LIBRARY for u in users):
                return True
    return False


def _reduction_fed_by_elementwise(an: _Analysis, members: list[int]) -> bool:
    inside = set(members)
    for i in members:
        if an.kind(i) in (ops.REDUCTION, ops.NORMALIZATION) and any(
                p in inside and an.kind(p) == ops.ELEMENTWISE and an.weight[p]
                for p in an.preds[i]):
            return True
    return False


def why_not_profitable(an: _Analysis, members: list[int], flags: Flags) -> str | None:
    """Why a legal cluster is not worth compiling, or None to keep it.

    Under --must_compile profitability does not apply: the user asked for every node to
    be compiled, even a lone Identity or Shape that weighs 0.
    """
    if flags.must_compile or _fallback_cannot_compute(an, members):
        return None
    weight = sum(an.weight[i] for i in members)
    if weight < flags.min_cluster_size:
        return f"cluster too small ({weight} < min_cluster_size={flags.min_cluster_size})"
    if flags.auto_jit == 1 and not (_saves_intermediate(an, members)
                                    or _reduction_fed_by_elementwise(an, members)):
        return "cost model: no intermediate tensor saved"
    return None


def _fallback_cannot_compute(an: _Analysis, members: list[int]) -> bool:
    """Whether a member computes in a dtype onnxruntime's CPU provider has no kernels for
    (bfloat16: it only casts it): left out, the model could not run at all; or is an
    integer division onnxruntime kills the process on for INT_MIN / -1, or an empty
    InstanceNormalization it segfaults after, which the compiled code answers
    (backends/ort.crashing_node; fuzz 93/2258: Cast(inf) to int64, then Div by -1; fuzz
    148/1653). Shape computations divide dims, never INT_MIN."""
    if any(an.nodes[i].op != "Cast" and v is not None and v.dtype == ops.BFLOAT16
           for i in members for v in (*an.nodes[i].inputs, *an.nodes[i].outputs)):
        return True
    arithmetic = [an.nodes[i] for i in members if not an.is_shape[i]]
    return registry.fallback().crashing_node(an.graph, arithmetic) is not None


# ---- fallback segments and step order ---------------------------------------------------

def _group_fallback(an: _Analysis, clusters: list[list[int]],
                    clustered: list[bool]) -> list[list[int]]:
    """Unclustered nodes grouped into as few cycle-free segments as we can find cheaply."""
    n = len(an.nodes)
    if not clusters:  # nothing can separate unclustered nodes: one segment holds them all
        return [list(range(n))] if n else []
    gc = GraphCycles(n)
    for i, succs in enumerate(an.succs):
        for s in succs:
            gc.insert_edge(i, s)
    for members in clusters:
        # In graph order every merge is legal: a cluster is convex (no path leaves it
        # and comes back), so nothing outside it lies between its merged part and the next.
        for m in members[1:]:
            ok = gc.contract_nodes(members[0], m)
            assert ok, f"cluster of node {an.nodes[members[0]].name} is not convex"
    segments: dict[int, list[int]] = {}
    seg_of: dict[int, int] = {}
    recent: dict[int, None] = {}  # segment representatives, least recently joined first
    for u in range(n):
        if clustered[u]:
            continue
        tries = [seg_of[p] for p in reversed(an.preds[u]) if p in seg_of]
        tries += itertools.islice(reversed(recent), _SEGMENT_TRIES)
        joined = next((s for s in dict.fromkeys(tries) if gc.contract_nodes(s, u)), None)
        if joined is None:
            joined = u
            segments[u] = []
        segments[joined].append(u)
        seg_of[u] = joined
        recent.pop(joined, None)
        recent[joined] = None
    return sorted(segments.values())


def _order_steps(an: _Analysis, groups: list[list[int]]) -> list[int]:
    """Group indices in dependency order (ties: the group whose first node comes first)."""
    step_of = [0] * len(an.nodes)
    for g, members in enumerate(groups):
        for m in members:
            step_of[m] = g
    succ: list[set[int]] = [set() for _ in groups]
    indegree = [0] * len(groups)
    for i, succs in enumerate(an.succs):
        for s in succs:
            a, b = step_of[i], step_of[s]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indegree[b] += 1
    ready = [(groups[g][0], g) for g in range(len(groups)) if indegree[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, g = heapq.heappop(ready)
        order.append(g)
        for b in succ[g]:
            indegree[b] -= 1
            if indegree[b] == 0:
                heapq.heappush(ready, (groups[b][0], b))
    if len(order) != len(groups):
        raise AssertionError("clustering produced a cyclic step graph (a bug)")
    return order


# ---- building steps ---------------------------------------------------------------------

def _boundary(an: _Analysis, members: list[int]) -> tuple[list[Value], list[Value]]:
    """(inputs, outputs) of a step, in the order Graph.extract uses."""
    inside = set(members)
    graph = an.graph
    graph_outputs = {v.name for v in graph.outputs}
    inputs: dict[str, Value] = {}
    outputs: list[Value] = []
    for i in members:
        for v in an.nodes[i].all_inputs():
            p = v.producer
            if p is not None and an.position.get(id(p)) in inside:
                continue
            if not graph.is_constant(v):
                inputs.setdefault(v.name, v)
    for i in members:
        for v in an.nodes[i].outputs:
            outside = any(an.position[id(u)] not in inside for u, _ in v.uses)
            if outside or v.name in graph_outputs:
                outputs.append(v)
    return list(inputs.values()), outputs


def _shape_value_inputs(an: _Analysis, members: list[int], inputs: list[Value]) -> list[Value]:
    """Cluster inputs whose values reach a shape input inside the cluster."""
    inside = set(members)
    found: set[str] = set()
    seen: set[str] = set()
    stack: list[Value] = []
    for i in members:
        opdef = an.opdefs[i]
        node = an.nodes[i]
        reads = () if opdef is None else opdef.shape_inputs
        stack += [v for k, v in enumerate(node.inputs) if k in reads and v is not None]
    while stack:
        v = stack.pop()
        if v.name in seen or an.graph.is_constant(v):
            continue
        seen.add(v.name)
        p = v.producer
        pos = None if p is None else an.position.get(id(p))
        if p is None or pos is None or pos not in inside:
            found.add(v.name)
        elif (d := an.opdefs[pos]) is None or not d.shape_of:  # Shape reads shapes only
            stack += [w for w in p.inputs if w is not None]
    return [v for v in inputs if v.name in found]


def _attr_bytes(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}".encode() + _array_digest(value)
    if hasattr(value, "tobytes"):
        return f"{value.dtype}{value.shape}".encode() + value.tobytes()
    if hasattr(value, "SerializeToString"):
        return value.SerializeToString()
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(_attr_bytes(x) for x in value) + b"]"
    return repr(value).encode()


# id(array) -> (weak reference, sha1): each weight hashed once per process; the weak
# reference tells a live array from a later one reusing a freed array's id.
_DIGESTS: dict[int, tuple[Any, bytes]] = {}


def _array_digest(value: np.ndarray) -> bytes:
    """sha1 of an array's bytes, read in place (no tobytes copy), memoized per array
    (graph constants are never edited in place)."""
    key = id(value)
    hit = _DIGESTS.get(key)
    if hit is not None and hit[0]() is value:
        return hit[1]
    if value.dtype.hasobject:  # strings: no buffer to read
        return hashlib.sha1(repr(value.tolist()).encode()).digest()
    dense = value if value.flags.c_contiguous else np.ascontiguousarray(value)
    digest = hashlib.sha1(dense.data.cast("B") if dense.size else b"").digest()
    try:
        ref = weakref.ref(value, lambda _: _DIGESTS.pop(key, None))
    except TypeError:  # a subclass without weak references: not memoized
        return digest
    _DIGESTS[key] = (ref, digest)
    return digest


class Fingerprint:
    """A cluster's fingerprint (see `fingerprint`), computed on first use: a plan reads
    it only for dumps and cache keys, and hashing every weight of BERT-base costs 0.3-0.75 s
    of session creation. Compares, hashes and prints as its hex string."""

    __slots__ = ("_args", "_text")

    def __init__(self, graph: Graph, nodes: list[Node], inputs: list[Value],
                 outputs: list[Value]):
        self._args: tuple | None = (graph, list(nodes), list(inputs), list(outputs))
        self._text = ""

    def __str__(self) -> str:
        args = self._args  # read once: another thread may finish first
        if args is not None:
            self._text = _fingerprint_now(*args)
            self._args = None  # after _text: a reader seeing None finds the text
        return self._text

    def __repr__(self) -> str:
        return repr(str(self))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Fingerprint, str)):
            return str(self) == str(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))

    def __len__(self) -> int:
        return len(str(self))


def fingerprint(graph: Graph, nodes: list[Node], inputs: list[Value],
                outputs: list[Value]) -> Fingerprint:
    """sha1 of ops, attrs, edges and constant bytes (not names), made when first read."""
    return Fingerprint(graph, nodes, inputs, outputs)


def _fingerprint_now(graph: Graph, nodes: list[Node], inputs: list[Value],
                     outputs: list[Value]) -> str:
    h = hashlib.sha1()
    produced = {v.name: (k, j) for k, n in enumerate(nodes) for j, v in enumerate(n.outputs)}
    input_pos = {v.name: k for k, v in enumerate(inputs)}
    for node in nodes:
        h.update(f"{node.domain}::{node.op}(".encode())
        for v in node.inputs:
            if v is None:
                h.update(b"_,")
            elif v.name in produced:
                h.update("n{}.{},".format(*produced[v.name]).encode())
            elif graph.is_constant(v):
                h.update(b"c" + _attr_bytes(graph.constant_value(v)) + b",")
            else:
                h.update(f"i{input_pos[v.name]},".encode())
        for key in sorted(node.attrs):
            h.update(key.encode() + b"=" + _attr_bytes(node.attrs[key]) + b";")
        h.update(b")\n")
    h.update(",".join("{}.{}".format(*produced[v.name]) for v in outputs).encode())
    return h.hexdigest()


def _build_plan(an: _Analysis, kept: list[list[int]], reasons: dict[int, str],
                flags: Flags, flow: dict[int, tuple[dict[str, Plan], str]] | None = None
                ) -> Plan:
    flow = flow or {}
    flow_groups = [[i] for i in sorted(flow)]  # each control-flow node is a step of its own
    clustered = [False] * len(an.nodes)
    for members in kept + flow_groups:
        for m in members:
            clustered[m] = True
    # Custom ops outside clusters are steps of their own: no onnxruntime segment holds one.
    host = [[i] for i, node in enumerate(an.nodes) if not clustered[i] and custom.is_custom(node)]
    for (i,) in host:
        clustered[i] = True
    segments = _group_fallback(an, kept + flow_groups + host, clustered)
    steps: list[Cluster | FallbackSegment | ControlFlow] = []
    for k, members in enumerate(kept):
        inputs, outputs = _boundary(an, members)
        nodes = [an.nodes[i] for i in members]
        steps.append(Cluster(k, f"cluster_{k:04d}", nodes, inputs, outputs,
                             fingerprint(an.graph, nodes, inputs, outputs),
                             _shape_value_inputs(an, members, inputs)))
    for k, members in enumerate(flow_groups):
        inputs, outputs = _boundary(an, members)
        bodies, summary = flow[members[0]]
        steps.append(ControlFlow(k, f"flow_{k:04d}", [an.nodes[members[0]]], inputs, outputs,
                                 bodies, summary))
    for k, members in enumerate(segments):
        inputs, outputs = _boundary(an, members)
        steps.append(FallbackSegment(k, f"segment_{k:04d}", [an.nodes[i] for i in members],
                                     inputs, outputs))
    for k, members in enumerate(host):
        inputs, outputs = _boundary(an, members)
        steps.append(FallbackSegment(k, f"custom_{k:04d}", [an.nodes[members[0]]], inputs,
                                     outputs, host=True))
    order = _order_steps(an, kept + flow_groups + segments + host)
    ordered = [steps[g] for g in order]
    clusters = [s for s in steps if isinstance(s, Cluster)]
    named = {an.nodes[i].name: reasons[i] for i in sorted(reasons)}
    for (i,) in host:
        name = an.nodes[i].name
        named[name] = (named.get(name, "not clustered") + "; runs in autoclust's runtime "
                       "(a custom op onnxruntime cannot load)")
    control = [s for s in steps if isinstance(s, ControlFlow)]
    return Plan(an.graph, ordered, clusters, named, flags, control)


def _backend_rules(flags: Flags, why_not: WhyNot | None, policy: Policy | None
                   ) -> tuple[WhyNot, Policy]:
    """why_not and policy, from the backend flags.device selects where not given."""
    if why_not is None or policy is None:
        backend = registry.get_backend(flags.device)
        why_not = why_not or backend.why_not
        policy = policy or registry.policy(backend)
    return why_not, policy


def _plan_without_clusters(graph: Graph, flags: Flags, why_not: WhyNot | None,
                           policy: Policy | None) -> Plan:
    """--auto_jit=0: nothing clusters, but an If/Loop/Scan whose body holds a custom op
    still runs in our runtime (onnxruntime cannot load it)."""
    an = _Analysis(graph)
    reasons = {i: "auto_jit is 0" for i in range(len(an.nodes))}
    custom_flow = {i: SUBGRAPH_REASON for i, n in enumerate(an.nodes) if custom.in_subgraphs(n)}
    flow: dict[int, tuple[dict[str, Plan], str]] = {}
    if custom_flow:  # the backend (and its imports) only when a body needs it
        why_not, policy = _backend_rules(flags, why_not, policy)
        flow = _plan_control_flow(an, custom_flow, flags, why_not, policy)
    for i in flow:
        del reasons[i]
    return _build_plan(an, [], reasons, flags, flow)


def _plan_control_flow(an: _Analysis, reasons: dict[int, str], flags: Flags, why_not: WhyNot,
                       policy: Policy) -> dict[int, tuple[dict[str, Plan], str]]:
    """If/Loop/Scan nodes whose bodies cluster (each body clustered recursively): they
    become steps of their own; the others keep a "has a subgraph" reason saying why."""
    flow = {}
    for i, reason in list(reasons.items()):
        if reason != SUBGRAPH_REASON:
            continue
        found = control_flow.plan_bodies(an.nodes[i], an.graph, flags, why_not, policy,
                                         cluster)
        if isinstance(found, str):
            reasons[i] = found
        else:
            flow[i] = found
            del reasons[i]
    return flow


# ---- the pass ---------------------------------------------------------------------------

def cluster(graph: Graph, flags: Flags, why_not: WhyNot | None = None,
            policy: Policy | None = None) -> Plan:
    """Partition `graph` into clusters and fallback segments (see the module docstring).

    `why_not(node, graph)` says why the target backend cannot compile a node (None: it
    can) and `policy` is its Policy; by default both come from the backend flags.device
    selects.
    """
    reasons: dict[int, str] = {}
    kept: list[list[int]] = []
    if flags.auto_jit == 0:
        return _plan_without_clusters(graph, flags, why_not, policy)
    why_not, policy = _backend_rules(flags, why_not, policy)
    unrolled = control_flow.unroll_static_loops(graph, flags, why_not)
    an = _Analysis(graph)
    candidate = _find_candidates(an, flags, why_not, policy, reasons)
    flow = _plan_control_flow(an, reasons, flags, why_not, policy)
    con = _contract_clusters(an, candidate, flags)
    for members in con.clusters():
        reason = why_not_profitable(an, members, flags)
        if reason is None:
            kept.append(members)
            continue
        if len(members) == 1 and members[0] in con.cycle_reason:
            reason = con.cycle_reason[members[0]]
        for m in members:
            reasons[m] = reason
    if policy.device_memory and not flags.must_compile:
        kept, moved = placement.copy_bound(an, kept, lambda m: _fallback_cannot_compute(an, m))
        reasons.update(moved)
    plan = _build_plan(an, kept, reasons, flags, flow)
    plan.unrolled = unrolled
    return plan


def check_must_compile(plan: Any) -> None:
    """Under --must_compile: every node must be in a cluster, else NotCompilableError."""
    lines = _unclustered_lines(plan, "")
    if lines:
        raise NotCompilableError(f"{len(lines)} node(s) could not be compiled "
                                 "(--must_compile):\n" + "\n".join(lines))


def _unclustered_lines(plan: Any, prefix: str) -> list[str]:
    """`  name: reason` for every unclustered node, inside control-flow bodies too."""
    lines = [f"  {prefix}{name}: {reason}" for name, reason in plan.reasons.items()]
    for step in getattr(plan, "control_flow", ()):
        for attr, body in step.bodies.items():
            lines += _unclustered_lines(body, f"{prefix}{step.nodes[0].name}.{attr}/")
    return lines
