"""siblings: GEMMs that read the same input become one GEMM over concatenated weights.

Attention's Q/K/V projections and a SwiGLU MLP's gate/up projections all read one hidden
state:

    q = x @ Wq + bq,  k = x @ Wk + bk,  v = x @ Wv + bv
 -> qkv = x @ [Wq | Wk | Wv] + [bq | bk | bv]
    q = qkv[..., :Nq],  k = qkv[..., Nq:Nq+Nk],  v = qkv[..., Nq+Nk:]

One wide GEMM packs x once, and N = Nq + Nk + Nv gives the library more columns to split
over threads than the narrow K/V projections of grouped-query attention do. The Slices
are index maps, not copies: fusion reads each projection where it lies in qkv's buffer
(loop kernels through affine loads, library calls through strided views: kernel/views.py).

A sibling is a MatMul whose A is the shared value and whose B is a constant [K, N], or a
FusedMatMul scaled by a power of two (its B scaled instead, exactly), read by someone. When
every sibling's only consumer is an Add of a constant [N] bias, the biases are
concatenated too (the backend then folds the one bias into the GEMM call); when some
siblings have a bias and others none, the others get zeros (x + 0 differs from x only in
the sign of a zero sum, which a dot product of finite values yields as +0 anyway).

The concatenated weights are cached by the identity of the arrays they come from, so a
new input signature (another sequence length) gets the same array, and with it the
library's prepacked copy, instead of a new one per signature.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable

import numpy as np

from autoclust.ir import Graph, Node, Value
from autoclust.passes.edits import detach, new_constant

GEMM_DTYPES = ("float32", "float64")
MAX_CACHED = 256  # concatenated arrays kept (each holds its sources alive)

_CONCAT: collections.OrderedDict = collections.OrderedDict()
_ZEROS: dict[tuple, np.ndarray] = {}
_LOCK = threading.Lock()


def concatenated(arrays: list[np.ndarray], axis: int) -> np.ndarray:
    """np.concatenate(arrays, axis), the same array object for the same source arrays."""
    out = derived((axis, tuple(id(a) for a in arrays)), arrays,
                   lambda: np.concatenate(arrays, axis=axis))
    assert out is not None  # a concatenation always exists
    return out


def derived(key: tuple, sources: list[np.ndarray], make: Callable[[], np.ndarray | None]
             ) -> np.ndarray | None:
    """make() (read-only), the same object while the same source arrays (by identity)
    are asked for under `key`; a None answer is remembered too."""
    with _LOCK:
        hit = _CONCAT.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], sources)):
            _CONCAT.move_to_end(key)
            return hit[1]
    out = make()
    if out is not None:
        out.flags.writeable = False
    with _LOCK:
        _CONCAT[key] = (list(sources), out)  # holding the sources keeps their ids unique
        while len(_CONCAT) > MAX_CACHED:
            _CONCAT.popitem(last=False)
    return out


def _zeros(n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only zero bias, the same array for the same size and dtype (see concatenated)."""
    key = ("zeros", n, np.dtype(dtype).str)
    with _LOCK:
        z = _ZEROS.get(key)
        if z is None:
            z = _ZEROS[key] = np.zeros(n, dtype)
            z.flags.writeable = False
    return z


def _weight(graph: Graph, node: Node) -> np.ndarray | None:
    """B of a sibling candidate, else None: MatMul(A, constant [K, N]) of a float type, or
    FusedMatMul(A, B, alpha) without transposes whose alpha is a power of two (the
    simplifier's form of a scaled projection, `q_proj(x) * scaling` in Whisper, BART and
    their kin), whose B is then alpha * B: exact, as long as no weight leaves the normal
    range, which is checked. A MatMul nobody reads (a simplification left it for DCE) is
    no sibling: fusing it would compute its columns for nothing."""
    alpha = _power_of_two_alpha(node)
    if alpha is None and (node.op != "MatMul" or node.domain not in ("", "ai.onnx")):
        return None
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    w = graph.constant_value(b)
    y = node.outputs[0]
    if not y.uses and y not in graph.outputs:
        return None
    if a is None or w is None or graph.is_constant(a) or w.ndim != 2 or a.rank is None or \
            a.rank < 2 or y.dtype is None or y.dtype.name not in GEMM_DTYPES or \
            w.dtype != y.dtype or a.dtype != y.dtype or 0 in w.shape:
        return None
    return w if alpha is None else _scaled(w, alpha)


def _power_of_two_alpha(node: Node) -> float | None:
    """FusedMatMul's alpha when the node is a plain scaled product by a power of two."""
    if (node.op, node.domain) != ("FusedMatMul", "com.microsoft") or \
            any(int(node.attrs.get(k, 0)) for k in ("transA", "transB", "transBatchA",
                                                     "transBatchB")):
        return None
    alpha = float(node.attrs.get("alpha", 1.0))
    return alpha if alpha > 0 and math.frexp(alpha)[0] == 0.5 else None


def _scaled(w: np.ndarray, alpha: float) -> np.ndarray | None:
    """alpha * w, the same array for the same w and alpha (see concatenated); None when
    scaling would round a weight (a denormal or an overflow on the way)."""
    def make() -> np.ndarray | None:
        with np.errstate(all="ignore"):
            out = w * w.dtype.type(alpha)
            exact = bool(np.array_equal(out / w.dtype.type(alpha), w, equal_nan=True)) and \
                not np.any((out != 0) & (np.abs(out) < np.finfo(w.dtype).tiny))
        return out if exact else None
    return derived(("scaled", id(w), alpha), [w], make)


def _bias(graph: Graph, node: Node) -> tuple[Node, np.ndarray] | None:
    """(Add, bias) when the MatMul's only consumer adds a constant [N] bias, else None."""
    y = node.outputs[0]
    if len(y.uses) != 1 or y in graph.outputs:
        return None
    add = y.uses[0][0]
    if add.op != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    b = graph.constant_value(other)
    if other is y or other is None or b is None or y.shape is None or \
            add.outputs[0].shape is None:
        return None
    if b.shape != (y.shape[-1],) or b.dtype != y.dtype or \
            tuple(add.outputs[0].shape) != tuple(y.shape):
        return None
    return add, b


def groups(graph: Graph) -> list[list[Node]]:
    """MatMuls with constant weights grouped by their shared A (groups of two or more)."""
    by_input: dict[str, list[Node]] = {}
    for node in graph.nodes:
        w, a = _weight(graph, node), node.inputs[0]
        if w is not None and a is not None and a.shape is not None and \
                a.shape[-1] == w.shape[0]:
            by_input.setdefault(a.name, []).append(node)
    return [g for g in by_input.values() if len(g) > 1]


def _slice(graph: Graph, src: Value, start: int, stop: int, like: Node) -> None:
    """Replace `like` by Slice(src, [start], [stop], [-1]), producing like's outputs."""
    index = detach(graph, like)
    args = [src] + [new_constant(graph, np.array([v], np.int64), "sibling")
                    for v in (start, stop, -1)]
    graph.add_node(Node("Slice", args, like.outputs, {}, like.name), index)


def _fuse(graph: Graph, group: list[Node]) -> None:
    found = [_weight(graph, n) for n in group]
    biases = [_bias(graph, n) for n in group]
    a, y0 = group[0].inputs[0], group[0].outputs[0]
    weights = [w for w in found if w is not None]
    if len(weights) != len(group) or a is None or y0.shape is None:
        return  # groups() found every weight; this keeps the types honest
    total = sum(w.shape[1] for w in weights)
    shape = tuple(y0.shape[:-1]) + (total,)
    at = graph.nodes.index(group[0])
    w = new_constant(graph, concatenated(weights, 1), "siblings_weight")
    fused = Value(graph.unique_name("siblings_out_"), y0.dtype, shape)
    graph.add_node(Node("MatMul", [a, w], [fused], {}, graph.unique_name("siblings_")), at)
    out = fused
    if any(b is not None for b in biases):
        parts = [b[1] if b is not None else _zeros(wi.shape[1], wi.dtype)
                 for b, wi in zip(biases, weights)]
        bias = new_constant(graph, concatenated(parts, 0), "siblings_bias")
        out = Value(graph.unique_name("siblings_sum_"), y0.dtype, shape)
        graph.add_node(Node("Add", [fused, bias], [out], {},
                            graph.unique_name("siblings_bias_")), at + 1)
    start = 0
    for node, w_i, b in zip(group, weights, biases):
        stop = start + w_i.shape[1]
        if b is None:
            _slice(graph, out, start, stop, node)
        else:
            _slice(graph, out, start, stop, b[0])  # the Add's output is the slice
            graph.remove_node(node)
        start = stop


def fuse_siblings(graph: Graph) -> Graph:
    """Concatenate the weights of GEMMs sharing an input (see the module docstring)."""
    for group in groups(graph):
        _fuse(graph, group)
    return graph
