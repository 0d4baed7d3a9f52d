"""The autoclust IR: Value, Node, Graph.

A Graph is SSA: every Value has at most one producer (a Node, or none for graph inputs
and initializers) and a list of uses. Nodes are kept in topological order. Shapes are
tuples whose entries are int (known), str (a symbolic dim such as "batch") or None
(unknown); a shape of None means the rank is unknown. dtypes are numpy dtypes, or None
for values that are not tensors of a numpy-representable type (sequences, bfloat16, ...).

Graph edits go through use-def links: `Graph.add_node`, `Graph.remove_node`,
`Graph.replace_all_uses`. Passes return a new or edited Graph; nothing here knows about
clustering or backends.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, TypeGuard

import numpy as np

Dim = int | str | None
Shape = tuple[Dim, ...] | None


class Value:
    """A tensor in the graph: name, dtype, shape, producer and uses."""

    __slots__ = ("dtype", "name", "producer", "shape", "type_proto", "uses")

    def __init__(self, name: str, dtype: np.dtype | None = None, shape: Shape = None):
        self.name = name
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.shape = None if shape is None else tuple(shape)
        self.producer: Node | None = None
        self.uses: list[tuple[Node, int]] = []  # (consumer node, input index)
        self.type_proto = None  # the ONNX TypeProto for non-tensor values (opaque ops only)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_static(self) -> bool:
        """True when every dim is a known int."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def type_str(self) -> str:
        dt = "?" if self.dtype is None else self.dtype.name
        if self.shape is None:
            return f"{dt}[*]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{dt}[{dims}]"

    def __repr__(self) -> str:
        return f"%{self.name}:{self.type_str()}"


class Node:
    """One operation: op (ONNX spelling), domain, inputs, outputs, attrs, name.

    `inputs` may hold None for an omitted optional input. `attrs` hold plain Python values
    (int, float, str, bytes, lists of those, numpy arrays for tensors); graph-valued
    attributes (If/Loop/Scan bodies) stay as onnx.AttributeProto and the node is opaque.
    `implicit_inputs` are outer-scope values a subgraph attribute reads: they order the
    node after their producers and travel with it into sub-models, but are not operands.
    `proto` is the original onnx.NodeProto when the node came unchanged from a model;
    the exporter writes it back verbatim so fallback segments keep the model's opset form.
    """

    __slots__ = (
        "attrs",
        "domain",
        "implicit_inputs",
        "inputs",
        "name",
        "op",
        "outputs",
        "proto",
    )

    def __init__(self, op: str, inputs: Iterable[Value | None], outputs: Iterable[Value],
                 attrs: dict[str, Any] | None = None, name: str = "", domain: str = ""):
        self.op = op
        self.domain = domain
        self.inputs: list[Value | None] = list(inputs)
        self.outputs: list[Value] = list(outputs)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.name = name
        self.implicit_inputs: list[Value] = []
        self.proto = None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def all_inputs(self) -> list[Value]:
        """Operands and implicit inputs, without the omitted (None) ones."""
        return [v for v in self.inputs if v is not None] + list(self.implicit_inputs)

    @property
    def qualified_op(self) -> str:
        return self.op if self.domain in ("", "ai.onnx") else f"{self.domain}::{self.op}"

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.qualified_op})"


def _format_attr(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return f"{value.dtype.name}{list(value.shape)}{value.ravel().tolist()}"
        return f"{value.dtype.name}{list(value.shape)}"
    if isinstance(value, float):
        return f"{value:g}"
    if hasattr(value, "SerializeToString"):  # onnx.AttributeProto holding a graph
        return "<graph>"
    return repr(value)


class Graph:
    """Inputs, outputs, nodes in topological order, initializers and opset imports."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.values: dict[str, Value] = {}
        self.opset: dict[str, int] = {"": 17}
        self.doc: dict[str, Any] = {}  # model metadata carried for export (producer, ir_version)

    # ---- construction -------------------------------------------------------------
    def value(self, name: str, dtype: np.dtype | None = None, shape: Shape = None) -> Value:
        """The value called `name`, created when new."""
        v = self.values.get(name)
        if v is None:
            v = Value(name, dtype, shape)
            self.values[name] = v
        return v

    def add_input(self, name: str, dtype: np.dtype | None, shape: Shape) -> Value:
        v = self.value(name, dtype, shape)
        self.inputs.append(v)
        return v

    def add_initializer(self, name: str, array: np.ndarray) -> Value:
        array = np.asarray(array)
        v = self.value(name, array.dtype, array.shape)
        v.dtype, v.shape = array.dtype, tuple(array.shape)
        self.initializers[name] = array
        return v

    def add_node(self, node: Node, index: int | None = None) -> Node:
        """Insert `node` (at the end or at `index`), linking producer and uses."""
        for i, v in enumerate(node.inputs):
            if v is not None:
                self.values.setdefault(v.name, v)
                v.uses.append((node, i))
        for v in node.implicit_inputs:
            self.values.setdefault(v.name, v)
            v.uses.append((node, -1))
        for v in node.outputs:
            self.values.setdefault(v.name, v)
            v.producer = node
        if not node.name:
            node.name = self.unique_name(f"{node.op}_")
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    def make_node(self, op: str, inputs: list[Value | None], n_outputs: int = 1,
                  attrs: dict | None = None, name: str = "", domain: str = "") -> Node:
        """Create and append a node with fresh output values (types left to inference)."""
        base = name or f"{op}_"
        outs = [Value(self.unique_name(f"{base}out")) for _ in range(n_outputs)]
        return self.add_node(Node(op, inputs, outs, attrs, name or self.unique_name(base),
                                  domain))

    def remove_node(self, node: Node) -> None:
        """Unlink `node`; its outputs must have no remaining uses."""
        for v in node.outputs:
            if v.uses:
                raise ValueError(f"cannot remove {node}: {v.name} still used")
            v.producer = None
        for x in node.all_inputs():
            x.uses = [(n, i) for n, i in x.uses if n is not node]
        self.nodes.remove(node)

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every use of `old` (and graph outputs) at `new`."""
        if old is new:
            return
        for node, i in old.uses:
            if i >= 0:
                node.inputs[i] = new
            else:
                node.implicit_inputs = [new if v is old else v for v in node.implicit_inputs]
            new.uses.append((node, i))
        old.uses = []
        self.outputs = [new if v is old else v for v in self.outputs]

    _counter = itertools.count()

    def unique_name(self, base: str) -> str:
        """A value/node name not used in this graph."""
        names = self.values.keys() | {n.name for n in self.nodes}
        while True:
            candidate = f"{base}{next(Graph._counter)}"
            if candidate not in names:
                return candidate

    # ---- queries ----------------------------------------------------------------------
    def is_constant(self, v: Value | None) -> TypeGuard[Value]:
        """True for initializers that are not also (overridable) graph inputs."""
        return v is not None and v.name in self.initializers and v not in self.inputs

    def constant_value(self, v: Value | None) -> np.ndarray | None:
        return self.initializers[v.name] if self.is_constant(v) else None

    def consumers(self, v: Value) -> list[Node]:
        seen: dict[int, Node] = {}
        for node, _ in v.uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def topo_sort(self) -> None:
        """Reorder nodes topologically (stable: keeps the current order where legal)."""
        index = {id(n): i for i, n in enumerate(self.nodes)}
        pending = {id(n): 0 for n in self.nodes}
        for n in self.nodes:
            for v in n.all_inputs():
                if v.producer is not None and id(v.producer) in index:
                    pending[id(n)] += 1
        import heapq
        ready = [(index[id(n)], n) for n in self.nodes if pending[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for v in n.outputs:
                for user, _ in v.uses:
                    if id(user) in pending:
                        pending[id(user)] -= 1
                        if pending[id(user)] == 0:
                            heapq.heappush(ready, (index[id(user)], user))
        if len(order) != len(self.nodes):
            stuck = [n.name for n in self.nodes if pending[id(n)] > 0][:5]
            raise ValueError(f"graph has a cycle through nodes {stuck}")
        self.nodes = order

    def verify(self) -> None:
        """Check SSA, topological order, use-def links and initializer types; raise ValueError."""
        defined = {v.name for v in self.inputs} | set(self.initializers)
        produced: set[str] = set()
        for node in self.nodes:
            for i, v in enumerate(node.inputs):
                if v is None:
                    continue
                if v.name not in defined:
                    raise ValueError(f"node {node.name} ({node.op}) input {i} {v.name!r} "
                                     "is used before it is defined")
                if (node, i) not in [(n, j) for n, j in v.uses]:
                    raise ValueError(f"use-def link missing: {v.name} -> {node.name}")
            for v in node.implicit_inputs:
                if v.name not in defined:
                    raise ValueError(f"node {node.name} reads {v.name!r} before definition")
            for v in node.outputs:
                if v.name in produced or v.name in self.initializers or v in self.inputs:
                    raise ValueError(f"value {v.name!r} is defined twice (not SSA)")
                if v.producer is not node:
                    raise ValueError(f"value {v.name!r} has the wrong producer")
                produced.add(v.name)
                defined.add(v.name)
        for v in self.outputs:
            if v.name not in defined:
                raise ValueError(f"graph output {v.name!r} is never defined")
        for name, arr in self.initializers.items():
            v = self.values.get(name)
            if v is None:
                raise ValueError(f"initializer {name!r} has no value")
            if v.dtype is not None and v.dtype != arr.dtype:
                raise ValueError(f"initializer {name!r}: value says {v.dtype}, array {arr.dtype}")

    # ---- printing ---------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"graph {self.name} ("]
        lines += [f"  {v!r}," for v in self.inputs]
        lines.append(") {")
        for name, arr in self.initializers.items():
            if name in self.values and self.values[name].uses:
                lines.append(f"  %{name} = constant {_format_attr(arr)}")
        for n in self.nodes:
            outs = ", ".join(repr(v) for v in n.outputs)
            ins = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
            attrs = ", ".join(f"{k}={_format_attr(a)}" for k, a in sorted(n.attrs.items()))
            attrs = f" {{{attrs}}}" if attrs else ""
            lines.append(f"  {outs} = {n.qualified_op}({ins}){attrs}  # {n.name}")
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    # ---- subgraphs --------------------------------------------------------------------
    def extract(self, nodes: Iterable[Node], name: str = "subgraph",
                extra_outputs: Iterable[Value] = ()) -> Graph:
        """A standalone Graph of `nodes`, with boundary values as its inputs and outputs.

        Inputs are the values the nodes read that none of them produces (constants become
        initializers of the subgraph). Outputs are the values they produce that a node
        outside the set, or a graph output, reads; plus `extra_outputs`. Value objects
        are copied, so the subgraph can be edited without touching this graph.
        """
        wanted = {id(n) for n in nodes}
        chosen = [n for n in self.nodes if id(n) in wanted]
        if len(chosen) != len(wanted):
            raise ValueError(f"extract({name}): some nodes are not in graph {self.name}")
        return _extract(self, chosen, name, list(extra_outputs))


class ValueCopier:
    """Copies Values into `graph` by name, each once: `copy(v)` returns the copy."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.copies: dict[str, Value] = {}

    def __call__(self, v: Value) -> Value:
        c = self.copies.get(v.name)
        if c is None:
            c = Value(v.name, v.dtype, v.shape)
            c.type_proto = v.type_proto
            self.copies[v.name] = c
            self.graph.values[v.name] = c
        return c


def _extract(graph: Graph, chosen: list[Node], name: str, extra: list[Value]) -> Graph:
    ids = {id(n) for n in chosen}
    sub = Graph(name)
    sub.opset = dict(graph.opset)
    sub.doc = dict(graph.doc)
    copy = ValueCopier(sub)
    copies = copy.copies

    graph_outputs = {v.name for v in graph.outputs}
    for node in chosen:
        for v in node.all_inputs():
            producer_inside = v.producer is not None and id(v.producer) in ids
            if producer_inside or v.name in copies:
                continue
            c = copy(v)
            if graph.is_constant(v):
                sub.initializers[v.name] = graph.initializers[v.name]
            else:
                sub.inputs.append(c)
    for node in chosen:
        new = Node(node.op, [None if v is None else copy(v) for v in node.inputs],
                   [copy(v) for v in node.outputs], dict(node.attrs), node.name, node.domain)
        new.implicit_inputs = [copy(v) for v in node.implicit_inputs]
        new.proto = node.proto
        sub.add_node(new)
    extra_names = {v.name for v in extra}
    for node in chosen:
        for v in node.outputs:
            outside = any(id(u) not in ids for u, _ in v.uses)
            if outside or v.name in graph_outputs or v.name in extra_names:
                sub.outputs.append(copies[v.name])
    return sub
