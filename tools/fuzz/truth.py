"""Second opinions for values where onnxruntime is not the only right answer.

`Arbiter.excuse` clears mismatching elements that one of two other references supports:
  - the ONNX reference implementation (onnx.reference, per-op NumPy): onnxruntime's CPU
    provider runs float16 ops without a float16 kernel in float32 and drops the casts
    between consecutive ones, so Log(Add(x, 1)) in float16 is not rounded after the Add;
    the spec (and the reference) round every op's result. Either is accepted.
  - onnxruntime on the model promoted to float64, for continuous float32 outputs only:
    onnxruntime's float32 kernels trade accuracy for speed (MLAS's Sigmoid clamps at
    +-18, so Sigmoid(-20) is 1.5e-8 instead of 2.06e-9). An element at least as close to
    the float64 result as onnxruntime's own is accepted. "Continuous": float32 models,
    outputs whose cone holds no rounding-sensitive op (Floor, Cast to int, a comparison,
    ArgMax, ...); there float32 semantics, not real-number accuracy, decide the answer
    (Cast(x / 0.1) must match a float32 division, not the exact quotient).
Shapes and dtypes always follow onnxruntime; both opinions are computed only when a
mismatch needs one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

from autoclust import ops

# Ops whose outputs jump (OpDef.discrete), and Hardmax, which onnxruntime runs for us.
DISCRETE = frozenset({d.op for d in ops.all_ops() if d.discrete} | {"Hardmax"})
FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """An onnxruntime session with every graph optimization off, one thread, quiet."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # run-time failures are expected; they are reported here
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime with every graph optimization off: the reference outputs."""
    return ort_session(model).run(None, feeds)


def _is_discrete(node: onnx.NodeProto) -> bool:
    if node.op_type == "Cast":
        to = next(a.i for a in node.attribute if a.name == "to")
        return to not in FLOATS
    return node.op_type in DISCRETE


def _has_float16(model: onnx.ModelProto) -> bool:
    g = model.graph
    types = [v.type.tensor_type.elem_type for v in list(g.input) + list(g.output)]
    types += [t.data_type for t in g.initializer]
    casts = [a.i for n in g.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    return TensorProto.FLOAT16 in types + casts


def continuous_outputs(model: onnx.ModelProto) -> list[bool]:
    """Per graph output: float32 math only, no rounding-sensitive op in its cone."""
    if _has_float16(model):
        return [False] * len(model.graph.output)
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for o in model.graph.output:
        stack, seen, ok = [o.name], set(), True
        while stack and ok:
            node = producer.get(stack.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            ok = not _is_discrete(node)
            stack.extend(i for i in node.input if i)
        out.append(ok)
    return out


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float32 tensor, initializer and Cast made float64."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(t).astype(np.float64)
            g.initializer[i].CopyFrom(numpy_helper.from_array(arr, t.name))
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    return m


def only_output(model: onnx.ModelProto, index: int) -> onnx.ModelProto:
    """The model cut down to graph output `index` and the nodes, inputs and initializers
    it needs (an op elsewhere that a reference lacks must not cost this output its
    opinion)."""
    g = model.graph
    want = g.output[index]
    needed, keep = {want.name}, []
    for node in reversed(g.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    graph = onnx.helper.make_graph(
        list(reversed(keep)), g.name, [v for v in g.input if v.name in needed], [want],
        [t for t in g.initializer if t.name in needed])
    m = onnx.helper.make_model(graph, opset_imports=model.opset_import)
    m.ir_version = model.ir_version
    return m


class Arbiter:
    """Lazily computed second opinions on a model's outputs (see the module docstring)."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
        self.model = model
        self.feeds = feeds
        self._continuous: list[bool] | None = None

    def excuse(self, index: int, got: np.ndarray, want: np.ndarray, bad: np.ndarray,
               tolerance: Callable[[np.ndarray], np.ndarray],
               distance: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """`bad` without the elements the reference or the float64 result supports."""
        ref = self.reference(index)
        if ref is not None and ref.shape == got.shape and ref.dtype == got.dtype:
            bad = bad & ~(distance(got, ref) <= tolerance(ref))
        truth = self.truth(index) if bad.any() and want.dtype == np.float32 else None
        if truth is not None and truth.shape == got.shape:
            bad = bad & ~(distance(got, truth) <= distance(want, truth) + tolerance(want))
        return bad

    def _feeds(self, model: onnx.ModelProto, dtype: np.dtype | None = None) -> dict:
        names = {v.name for v in model.graph.input}
        return {k: v.astype(dtype) if dtype is not None and v.dtype == np.float32 else v
                for k, v in self.feeds.items() if k in names}

    def reference(self, index: int) -> np.ndarray | None:
        """Output `index` by the ONNX reference implementation, or None when it fails."""
        import warnings

        from onnx.reference import ReferenceEvaluator
        model = only_output(self.model, index)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                evaluator = ReferenceEvaluator(model, new_ops=spec_fixes())
                (out,) = evaluator.run(None, self._feeds(model))
        except Exception:  # noqa: BLE001 - an op it lacks or gets wrong: no opinion
            return None
        return np.asarray(out)

    def truth(self, index: int) -> np.ndarray | None:
        """The float64 result of a continuous output `index`, or None (no arbiter)."""
        if self._continuous is None:
            self._continuous = continuous_outputs(self.model)
        if not self._continuous[index]:
            return None
        model = to_float64(only_output(self.model, index))
        try:
            (out,) = run_ort(model, self._feeds(model, np.float64))
        except Exception:  # noqa: BLE001 - no float64 kernel for some op: no arbiter
            return None
        return out


def spec_fixes() -> list[type]:
    """onnx.reference ops replaced where they depart from the spec's text."""
    return [_gather_elements_op(), _clip_op()]


def _clip_op() -> type:
    """onnx.reference's Clip, fixed: a missing bound is numeric_limits::lowest() / max()
    (the spec), not -inf / +inf, so +inf clips to FLT_MAX (it excused the old answer)."""
    from onnx.reference.op_run import OpRun

    class Clip(OpRun):
        op_domain = ""

        def _run(self, x, lo=None, hi=None):
            if x.dtype.kind == "f":
                info = np.finfo(x.dtype)
                lo = info.min if lo is None else lo
                hi = info.max if hi is None else hi
            y = x if lo is None else np.maximum(x, lo)
            return ((y if hi is None else np.minimum(y, hi)).astype(x.dtype),)
    return Clip


def _gather_elements_op() -> type:
    """onnx.reference's GatherElements, fixed: it refuses indices smaller than the data
    on a non-axis dim, which the spec allows (and which then cost a whole output its
    opinion: a NaN from ReduceMin before such a Gather could not be arbitrated)."""
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):
        op_domain = ""

        def _run(self, data, indices, axis=0):
            axis = int(axis) % max(data.ndim, 1)
            idx = np.where(indices < 0, indices + data.shape[axis], indices)
            grid = list(np.indices(idx.shape, sparse=True))
            grid[axis] = idx
            return (data[tuple(grid)],)
    return GatherElements
