"""Candidates: which nodes may be clustered at all, each refusal with its reason.

The first of clustering's three concerns (partition.py has legality and profitability):
the op is in the table, not a legacy form, has no subgraph, its output shapes follow from
input shapes and shape-static values, its dtypes compile, flags allow it and the backend
can compile it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from autoclust import ops
from autoclust.flags import Flags
from autoclust.ir import Graph, Node

WhyNot = Callable[[Node, Graph], "str | None"]

LEGACY_DOMAIN = "autoclust.legacy"
# The refusal of a node with a graph attribute; control_flow.py may run it after all.
SUBGRAPH_REASON = "has a subgraph"


def has_subgraph(node: Node) -> bool:
    if node.implicit_inputs:
        return True
    for a in node.attrs.values():
        items = a if isinstance(a, (list, tuple)) else [a]
        if any(hasattr(x, "SerializeToString") for x in items):
            return True
    return False


def shape_static_values(graph: Graph) -> set[str]:
    """Names of values that follow from input shapes and constants alone.

    A value is shape-static when it is a constant, an output of Shape or Size (whatever
    their input), or an output of a table op with a static output shape whose inputs are
    all shape-static. Such values are cheap to put in a compile signature.
    """
    static = {name for name in graph.initializers if graph.is_constant(graph.values.get(name))}
    for node in graph.nodes:
        d = ops.get(node.op, node.domain)
        if d is not None and d.shape_of:
            static.update(v.name for v in node.outputs)
            continue
        if d is None or d.data_dependent or has_subgraph(node):
            continue
        if all(v.name in static for v in node.inputs if v is not None):
            static.update(v.name for v in node.outputs)
    return static


def is_shape_computation(node: Node, opdef: ops.OpDef | None, static: set[str]) -> bool:
    if opdef is None:
        return False
    if opdef.kind == ops.SHAPE:
        return True
    inputs = [v for v in node.inputs if v is not None]
    return opdef.shape_like and bool(inputs) and all(v.name in static for v in inputs)


def _matches(node: Node, opdef: ops.OpDef, names: Collection[str]) -> bool:
    groups = opdef.group_names()
    return any(n == node.op or n.upper() in groups for n in names)


def _dtype_reason(node: Node, opdef: ops.OpDef, library_dtypes: frozenset = frozenset()
                  ) -> str | None:
    allowed = opdef.compiled_dtypes
    if opdef.kind == ops.LIBRARY:
        allowed = allowed | library_dtypes  # the backend's (Policy.library_dtypes)
    shape_allowed = allowed | ops.COMPILABLE_TYPES  # shape inputs are read at compile time
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        ok = shape_allowed if i in opdef.shape_inputs else allowed
        if v.dtype is None or v.dtype not in ok:
            name = "unknown" if v.dtype is None else v.dtype.name
            return f"dtype {name} of input '{v.name}' not supported"
    for v in node.outputs:
        if v.dtype is None or v.dtype not in allowed:
            name = "unknown" if v.dtype is None else v.dtype.name
            return f"dtype {name} of output '{v.name}' not supported"
    return None


def why_not_lowered(node: Node, graph: Graph, opdef: ops.OpDef) -> str | None:
    """Why compiled code cannot compute `node`: no lowering, or an input the lowering
    needs as a constant is not one."""
    if opdef.lower is None and opdef.kind != ops.LIBRARY:
        return opdef.refuse or f"{node.op} has no lowering"
    for i in opdef.const_inputs:
        v = node.inputs[i] if i < len(node.inputs) else None
        if v is not None and i not in opdef.shape_inputs and not graph.is_constant(v):
            return f"input '{v.name}' of {node.op} must be a constant to compile"
    return None


def why_not_candidate(node: Node, graph: Graph, flags: Flags, shape_static: Collection[str],
                      backend_why_not: WhyNot | None = None,
                      lowers: bool = True, library_dtypes: frozenset = frozenset()
                      ) -> str | None:
    """Why `node` may not be clustered (fuel aside), or None when it is a candidate."""
    if node.domain == LEGACY_DOMAIN:
        return "old opset form"
    if has_subgraph(node):
        return SUBGRAPH_REASON
    opdef = ops.get(node.op, node.domain)
    if opdef is None:
        return f"unsupported op {node.qualified_op}"
    if opdef.data_dependent:
        return f"data-dependent output shape ({node.op})"
    reason = _dtype_reason(node, opdef, library_dtypes) or (
        opdef.refuses(node, graph) if opdef.refuses else None)
    if reason:
        return reason
    for i in opdef.shape_inputs:
        v = node.inputs[i] if i < len(node.inputs) else None
        if v is not None and v.name not in shape_static:
            return (f"data-dependent output shape: shape input '{v.name}' of {node.op} "
                    "comes from runtime data")
    if lowers:
        reason = why_not_lowered(node, graph, opdef)
        if reason:
            return reason
    if flags.ops_to_cluster and not _matches(node, opdef, flags.ops_to_cluster):
        return "not in --ops_to_cluster"
    if flags.cluster_exclude_ops and _matches(node, opdef, flags.cluster_exclude_ops):
        return "excluded by --cluster_exclude_ops"
    if backend_why_not is not None:
        reason = backend_why_not(node, graph)
        if reason:
            return f"device {flags.device}: {reason}"
    return None
