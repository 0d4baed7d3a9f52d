"""specialize: give a cluster graph the concrete input types of one run signature.

    graph (x: float32[batch, 768], s: int64[2])  +  ([float32 (8, 768)], [int64 (2,)]),
    shape_values {"s": [8, 768]}
 -> graph (x: float32[8, 768], s: int64[2]) where every use of s reads a constant [8, 768]
    and every value has a concrete dtype and int shape.

The input list stays as it was (same Values, same order), so an executable takes exactly the
cluster's inputs; an input named in shape_values is simply no longer read. Small values that
follow from constants and shapes (Shape -> Gather -> Concat chains) are evaluated on the way,
because the infer rules of Reshape/Expand/Slice need their *values* to give concrete shapes;
fold_constants later turns them into initializers.
"""

from __future__ import annotations

import math
import os

import numpy as np

from autoclust import ops
from autoclust.errors import InvalidShapeError, ShapeInferenceError
from autoclust.ir import Graph, Node, Shape, Value
from autoclust.passes.edits import copy_graph, new_constant
from autoclust.passes.fold_constants import SMALL_ELEMENTS, evaluate
from autoclust.symbolic import is_dim, is_sym, tensor_dtype

InputType = tuple[np.dtype, tuple[int, ...]]


def _dims(shape: Shape) -> str:
    return "[*]" if shape is None else "[" + ",".join("?" if d is None else str(d)
                                                      for d in shape) + "]"


def _check_declared(what: str, declared_dtype: np.dtype | None, declared: Shape,
                    dtype: np.dtype, shape: tuple) -> None:
    """Raise when a concrete type contradicts the declared one (ints must match)."""
    if declared_dtype is not None and np.dtype(declared_dtype) != np.dtype(dtype):
        raise ShapeInferenceError(f"{what}: declared dtype {declared_dtype}, got {dtype}")
    if declared is None:
        return
    clash = len(declared) != len(shape) or any(
        isinstance(d, int) and d != s for d, s in zip(declared, shape))
    if clash:
        raise ShapeInferenceError(f"{what}: declared shape {_dims(declared)}, got {_dims(shape)}")


def _bind_inputs(graph: Graph, input_types: list[InputType],
                 shape_values: dict[str, np.ndarray]) -> None:
    if len(input_types) != len(graph.inputs):
        raise ShapeInferenceError(f"graph {graph.name} has {len(graph.inputs)} inputs, "
                                  f"got {len(input_types)} input types")
    names = {v.name for v in graph.inputs}
    unknown = sorted(set(shape_values) - names)
    if unknown:
        raise ShapeInferenceError(f"shape_values name {unknown}, which are not inputs of "
                                  f"graph {graph.name}")
    for v, (dtype, shape) in zip(graph.inputs, input_types):
        shape = tuple(d if is_sym(d) else int(d) for d in shape)
        _check_declared(f"input {v.name!r}", v.dtype, v.shape, np.dtype(dtype), shape)
        v.dtype, v.shape = np.dtype(dtype), shape
        if v.name in shape_values:
            array = np.asarray(shape_values[v.name], dtype=v.dtype)
            if array.shape != shape:
                raise ShapeInferenceError(f"input {v.name!r}: shape value has shape "
                                          f"{_dims(array.shape)}, input type says {_dims(shape)}")
            graph.replace_all_uses(v, new_constant(graph, array, v.name))


def _loose(dtype: np.dtype | None, shape: Shape) -> bool:
    return dtype is None or shape is None or not all(is_dim(d) for d in shape)


def _infer(graph: Graph, node: Node, known: dict[str, np.ndarray],
           outs: list[np.ndarray] | None) -> None:
    """Set concrete types on `node`'s outputs; raise ShapeInferenceError naming the node.

    `outs` are the outputs already evaluated (or None): they must agree with the infer rule,
    and they type outputs the rule leaves open (NonZero of a constant).
    """
    where = f"node {node.name!r} ({node.qualified_op})"
    try:
        types = ops.infer_node(node, graph, known)
    except ShapeInferenceError as exc:
        if node.name in str(exc):
            raise
        raise ShapeInferenceError(f"{where}: {exc}") from exc
    if len(types) < len(node.outputs):  # more is fine: optional outputs left off
        raise ShapeInferenceError(f"{where}: infer gave {len(types)} types for "
                                  f"{len(node.outputs)} outputs")
    for i, (v, (dtype, shape)) in enumerate(zip(node.outputs, types)):
        if outs is not None:
            a = outs[i]
            a_dtype = tensor_dtype(a)  # an object array of Syms is an int64 tensor
            if not _loose(dtype, shape) and (a_dtype != dtype or a.shape != tuple(shape)):
                raise ShapeInferenceError(
                    f"{where} output {v.name!r}: the reference gives {a_dtype}{_dims(a.shape)}, "
                    f"the infer rule {dtype}{_dims(shape)}")
            dtype, shape = a_dtype, a.shape
            known[v.name] = a
        if _loose(dtype, shape):
            raise ShapeInferenceError(f"{where}: no concrete type for output {v.name!r} "
                                      f"(got {dtype}{_dims(shape)}); are its shape inputs "
                                      "known?")
        _check_declared(f"{where} output {v.name!r}", v.dtype, v.shape, dtype, tuple(shape))
        v.dtype, v.shape = np.dtype(dtype), tuple(shape)


def specialize(graph: Graph, input_types: list[InputType],
               shape_values: dict[str, np.ndarray]) -> Graph:
    """A copy of `graph` with concrete input types; shape_values inputs become constants."""
    graph = copy_graph(graph)
    _bind_inputs(graph, input_types, shape_values)
    known: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        outs = evaluate(graph, node, known, max_elements=SMALL_ELEMENTS)
        _infer(graph, node, known, outs)
    return graph


def check_sizes(graph: Graph, limit: int) -> None:
    """Raise InvalidShapeError naming the node for an output whose concrete shape has a
    negative dim or whose buffer would pass `limit` bytes (0: this machine's memory) or
    int64 (Python ints: the product cannot overflow here), before anything allocates it:
    NumPy raised a bare MemoryError or ValueError there, onnxruntime its Fail."""
    cap = limit or physical_memory()
    where = (f"--max_buffer_bytes={limit}" if limit else
             f"this machine's memory ({_human(cap)}; --max_buffer_bytes sets a limit)")
    for node in graph.nodes:
        for v in node.outputs:
            why = _size_problem(v, cap)
            if why:
                raise InvalidShapeError(f"node {node.name!r} ({node.qualified_op}): output "
                                        f"{v.name!r} of shape {_dims(v.shape)} {why}"
                                        + (f", more than {where}" if why.startswith("needs")
                                           and "int64" not in why else ""))


def _size_problem(v: Value, limit: int) -> str:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return ""
    if any(d < 0 for d in v.shape):
        return "has a negative dim"
    nbytes = math.prod(v.shape) * (v.dtype.itemsize if v.dtype is not None else 1)
    if nbytes >= 1 << 63:
        return f"needs {nbytes} bytes: more than int64 holds"
    if nbytes > limit:
        return f"needs {nbytes} bytes ({_human(nbytes)} of {v.dtype})"
    return ""


def physical_memory() -> int:
    """Bytes of RAM on this machine (no single buffer may be larger by default)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 1 << 62


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.2f} {unit}" if unit != "bytes" else f"{n} bytes"
        n /= 1024
    return f"{n} bytes"


def not_concrete(graph: Graph) -> list[Value]:
    """Values (inputs, initializers' values, node outputs) without a concrete dtype+shape."""
    values = list(graph.inputs) + [graph.values[n] for n in graph.initializers
                                   if n in graph.values]
    values += [v for node in graph.nodes for v in node.outputs]
    return [v for v in values if v.dtype is None or not v.is_static()]
