"""Second opinions for values where onnxruntime is not the only right answer.

`Arbiter.excuse` clears mismatching elements that one of two other references supports:
  - the ONNX reference implementation (onnx.reference, per-op NumPy): onnxruntime's CPU
    provider runs float16 ops without a float16 kernel in float32 and drops the casts
    between consecutive ones, so Log(Add(x, 1)) in float16 is not rounded after the Add;
    the spec (and the reference) round every op's result. Either is accepted.
  - onnxruntime (the reference where it has no float64 kernel: run_float64) on the model
    promoted to float64, for continuous float32 outputs only:
    onnxruntime's float32 kernels trade accuracy for speed (MLAS's Sigmoid clamps at
    +-18, so Sigmoid(-20) is 1.5e-8 instead of 2.06e-9). An element at least as close to
    the float64 result as onnxruntime's own is accepted (within float32's tolerance of it
    where onnxruntime's is NaN or inf and the float64 one is not), or within 8x the float64
    result's own spread (Arbiter.truth_spread: onnxruntime's zeros from an overflowing
    LayerNorm variance have none to lend to a cancelling mean). "Continuous": float32
    models, outputs whose cone holds no rounding-sensitive op (Floor, Cast to int, a
    comparison, ArgMax, ...); there float32 semantics, not real-number accuracy, decide the
    answer (Cast(x / 0.1) must match a float32 division, not the exact quotient).
Dtypes always follow onnxruntime, shapes too unless the reference gives ours, values and
all (`agrees`); both opinions are computed only when a mismatch needs one.
onnx.reference's own departures from the spec are replaced (spec_fixes: Clip,
GatherElements, GroupNormalization, LayerNormalization, LogSoftmax, Pad, float16 Softmax
and reductions; TopK where a
row holds NaN, which the spec does not order), or its opinion
would condemn a right answer or, where it raises, leave a wrong one of onnxruntime's
standing.

`run_reference` tells onnxruntime's own failures from the feeds' errors: a run that raises
but succeeds with the memory planner's buffer reuse off failed inside onnxruntime.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.tools.fuzz import values as fuzz_values
from onnx import TensorProto, numpy_helper

from autoclust import ops

# Ops whose outputs jump (OpDef.discrete), and Hardmax, which onnxruntime runs for us.
DISCRETE = frozenset({d.op for d in ops.all_ops() if d.discrete} | {"Hardmax"})
FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)
# Ops whose statistics are computed in their stash_type attribute's dtype, from this opset.
STASHED = {"LayerNormalization": 17, "GroupNormalization": 21}
# A spread (how far an output moves when every float input moves by one ulp) counts this
# many times over in a tolerance; it is the largest of JITTER_RUNS jittered runs.
SENSITIVITY = 8.0
JITTER_RUNS = 4


def exact_values(model: onnx.ModelProto) -> set[str]:
    """Values the jitter leaves alone when they hold integers: Pow's exponents. Pow(x, 2)
    of a negative x is x*x, Pow(x, 2.0000002) is NaN: RMSNorm's x^2 in every real export
    then had an infinite spread, and the oracle accepted any answer downstream of it."""
    return {n.input[1] for n in model.graph.node if n.op_type == "Pow" and len(n.input) > 1}


def integral(x: np.ndarray) -> bool:
    """Whether `x` is a float array of finite integers."""
    return x.dtype.kind == "f" and bool(np.all(np.isfinite(x) & (x == np.round(x))))


def ort_session(model: onnx.ModelProto, reuse_memory: bool = True) -> ort.InferenceSession:
    """An onnxruntime session with every graph optimization off, one thread, quiet;
    reuse_memory=False turns the memory planner's buffer reuse off too (run_reference)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # run-time failures are expected; they are reported here
    so.intra_op_num_threads = 1
    so.enable_mem_reuse = reuse_memory
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                  sess: ort.InferenceSession | None = None
                  ) -> tuple[ort.InferenceSession, list[np.ndarray], str]:
    """(session, outputs, "") of onnxruntime with every graph optimization off (`sess`, if
    given, is that session over `model`); where that run raises but one without buffer
    reuse does not, (that session, its outputs, where onnxruntime failed: "op_kernel.cc:87").

    A feed's error (a zero divisor, an index out of range) does not depend on which buffer
    onnxruntime writes a result into, so one that goes away with reuse off was
    onnxruntime's own: 1.31's planner hands a float16 Softmax's [2, 0] buffer to a Cast it
    inserted for a [2, 1] Mul ("Shape mismatch attempting to re-use buffer. {2,0} != {2,1}",
    fuzz 80/163 and 80/591), and the model's answer is the run without reuse (the ONNX
    reference and autoclust agree with it). An error of an op that fails on shapes alone
    (SHAPE_ERRORS_ONLY) where the ONNX reference runs the model is onnxruntime's too: the
    reference's outputs are the answer. Other errors are raised as they came."""
    sess = ort_session(model) if sess is None else sess
    try:
        return sess, sess.run(None, feeds), ""
    except Exception as exc:  # noqa: BLE001 - the feeds' error or onnxruntime's, below
        first = exc
    plain = ort_session(model, reuse_memory=False)
    try:
        outs = plain.run(None, feeds)
    except Exception:  # noqa: BLE001 - the feeds' error, unless the shapes are valid
        outs = _spec_outputs(model, feeds, first)
        if outs is None:
            raise first from None
    return plain, outs, failure_site(first)


# Ops whose run-time errors depend on their inputs' shapes alone: where onnxruntime raises
# on one and the ONNX reference (NumPy's semantics, which the spec names) runs the model,
# the shapes were valid and the error is onnxruntime's. MatMul of a zero-size [3, 5, 0, 1]
# by a 1-D [1]: "left operand cannot broadcast on dim 2" (fuzz 81/158, 81/185, 82/407),
# where np.matmul's answer is [3, 5, 0]. Squeeze of an axis onnxruntime's ReduceMax over
# an empty axis left 0 long ("Dimension of input 2 must be 1 instead of 0", fuzz 92/2192;
# the spec's keepdims gives 1): np.squeeze raises too where the axis is not 1 long. TopK
# of k = 1 over that axis: "k argument [1] should not be greater than specified axis dim
# value [0]" (fuzz 98/1805); the reference's TopK raises too where k exceeds the axis.
SHAPE_ERRORS_ONLY = frozenset({"MatMul", "Squeeze", "TopK"})


def _spec_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                  exc: BaseException) -> list[np.ndarray] | None:
    """Where onnxruntime's error `exc` comes from an op of SHAPE_ERRORS_ONLY, each output
    of the model cut down to it (only_output): onnxruntime's where that runs, the
    reference's where onnxruntime raises there too; None where the reference fails such a
    cut, or where no cut raised and the reference fails the whole model (the error's op
    unconfirmed). Whole-model reference outputs made its conventions the expected ones
    beside the error: an exclusive CumSum of [-0., -0.] keeps -0 there, onnxruntime (and
    ours) +0, a Reciprocal then -inf against inf (fuzz 97/3101); and its Flatten of a [5,
    5, 0] at axis 3 fails, so a MatMul error elsewhere was expected (97/2198)."""
    found = re.search(r"while running (\w+) node", str(exc))
    if found is None or found.group(1) not in SHAPE_ERRORS_ONLY:
        return None
    outs, confirmed = [], False
    for i in range(len(model.graph.output)):
        cut = only_output(model, i)
        fed = {k: v for k, v in feeds.items() if k in {x.name for x in cut.graph.input}}
        try:
            outs.append(ort_session(cut).run(None, fed)[0])
        except Exception:  # noqa: BLE001 - the error's op is in this output's cone
            ref = evaluate(cut, fed)
            if ref is None:
                return None
            outs.append(ref[0])
            confirmed = True
    return outs if confirmed or evaluate(model, feeds) is not None else None


def failure_site(exc: BaseException) -> str:
    """Where onnxruntime says it raised `exc` ("op_kernel.cc:87"), else its message: one
    key for a failure of onnxruntime's that every session over the model may meet."""
    text = str(exc)
    found = re.search(r"\b\w+\.(?:cc|cpp|h):\d+", text)
    return found.group(0) if found else text.split("Status Message:")[-1].strip()[:200]


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime with every graph optimization off: the reference outputs (without buffer
    reuse where onnxruntime's planner fails, run_reference)."""
    return run_reference(model, feeds)[1]


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


def explicit_clip_bounds(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each Clip's missing float bound an initializer holding the spec's value
    (the dtype's lowest or max). Clip makes +-inf feeds +-FLT_MAX, and
      - the jitter (check.spread_of) must move that bound like any constant: a ReduceMean of
        [FLT_MAX, 0.28, -FLT_MAX, -1.27] has no one float32 answer (each order of the
        additions loses another term to FLT_MAX: onnxruntime -0.22, ours 0.05, exactly
        0.08, fuzz 80/597), which only a moved bound shows;
      - to_float64 must keep it FLT_MAX: a missing bound of the float64 model is DBL_MAX,
        whose square overflows where FLT_MAX's does not (fuzz 80/552)."""
    def open_clip(n: onnx.NodeProto) -> bool:
        return n.op_type == "Clip" and n.domain in ("", "ai.onnx") and not (
            len(n.input) == 3 and all(n.input))

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 11 or not any(open_clip(n) for n in model.graph.node):
        return model  # (Clip-6 holds its bounds in attributes)
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no types, no bounds: the model as it is
        return model
    g = typed.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(g.input) + list(g.value_info) + list(g.output)}
    types.update((t.name, t.data_type) for t in g.initializer)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        elem = types.get(node.input[0]) if open_clip(node) else None
        if elem not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            continue
        info = np.finfo(onnx.helper.tensor_dtype_to_np_dtype(elem))
        bounds = list(node.input[1:]) + [""] * (3 - len(node.input))
        for i, (name, value) in enumerate(zip(bounds, (info.min, info.max))):
            if not name:
                bounds[i] = f"{node.output[0]}__clip_bound_{i}"
                out.graph.initializer.append(numpy_helper.from_array(
                    np.array(value, info.dtype), bounds[i]))
        node.input[1:] = bounds
    return out


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float32 tensor, initializer and Cast made float64, Clip's
    missing bounds kept float32's (explicit_clip_bounds), and LayerNormalization's and
    GroupNormalization's statistics in float64 too: their stash_type (float32 by default)
    overflows on the squares of 1e20 or FLT_MAX (fuzz 80/490, 80/552, 80/593, 80/63), where
    autoclust's exact float32 statistics, the deliberate departure of docs/fuzzing.md, answer
    as float64 does."""
    m = onnx.ModelProto()
    m.CopyFrom(explicit_clip_bounds(model))
    g = m.graph
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(t).astype(np.float64)
            g.initializer[i].CopyFrom(numpy_helper.from_array(arr, t.name))
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
        if opset >= STASHED.get(n.op_type, opset + 1):
            kept = [a for a in n.attribute if a.name != "stash_type"]
            del n.attribute[:]
            n.attribute.extend(kept)
            n.attribute.append(onnx.helper.make_attribute("stash_type", TensorProto.DOUBLE))
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
        """`bad` without the elements the reference (one of its opinions, whichever leaves
        fewest: [nan, 3] takes no element from each of [nan, 4] and [4, 3]) or the float64
        result supports; an opinion's own spread counts as onnxruntime's does."""
        left = []
        for order, ref in self.opinions(index):
            if ref.shape != got.shape or ref.dtype != got.dtype:
                continue
            off = bad & ~(distance(got, ref) <= tolerance(ref))
            if off.any():  # Cos(exp(6)) moves 2e-4 with 6's ulp, onnxruntime's Cos(exp(-6))
                spread = self._spread(index, ref, distance, order)  # 3e-10 (fuzz 103/1696)
                off = off & ~(distance(got, ref) <= tolerance(ref) + SENSITIVITY * spread)
            left.append(off)
        bad = min(left, key=np.count_nonzero) if left else bad
        truth = self.truth(index) if bad.any() and want.dtype == np.float32 else None
        if truth is not None and truth.shape == got.shape:
            # As close as onnxruntime's, or within the tolerance of the truth where that is
            # no measure (onnxruntime's NaN from an overflowing variance is infinitely far:
            # any answer was as close).
            off = distance(want, truth)
            near = np.where(np.isfinite(off), off + tolerance(want),
                            tolerance(truth.astype(want.dtype)))
            far = ~(distance(got, truth) <= near)
            if (bad & far).any():  # an ill-conditioned element: the truth's own spread
                near = near + SENSITIVITY * self.truth_spread(index, truth, distance)
                far = ~(distance(got, truth) <= near)
            bad = bad & far
        return bad

    def agrees(self, index: int, got: np.ndarray,
               tolerance: Callable[[np.ndarray], np.ndarray],
               distance: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> bool:
        """Whether the reference gives `got` (its shape, dtype and values) for an output
        whose shape onnxruntime gets wrong: ReduceMax of [1, 4, 0] over its empty last axis
        keeps the 0 there (fuzz 81/558; 79/395), where the spec (and ONNX's own shape
        inference) say [1, 4, 1], holding the empty max, -inf."""
        ref = self.reference(index)
        return (ref is not None and ref.shape == got.shape and ref.dtype == got.dtype
                and bool(np.all(distance(got, ref) <= tolerance(ref))))

    def _feeds(self, model: onnx.ModelProto, dtype: np.dtype | None = None) -> dict:
        names = {v.name for v in model.graph.input}
        return {k: v.astype(dtype) if dtype is not None and v.dtype == np.float32 else v
                for k, v in self.feeds.items() if k in names}

    def reference(self, index: int, nan_order: str = "last") -> np.ndarray | None:
        """Output `index` by the ONNX reference implementation, or None when it fails."""
        model = only_output(self.model, index)
        outs = evaluate(model, self._feeds(model), nan_order)
        return None if outs is None else outs[0]

    def references(self, index: int) -> list[np.ndarray]:
        """The reference's opinions on output `index` (opinions, without their orders)."""
        return [ref for _, ref in self.opinions(index)]

    def opinions(self, index: int) -> list[tuple[str, np.ndarray]]:
        """The reference's opinions on output `index`: one per treatment of NaN that
        autoclust gives, else one; none where it fails. Behind a TopK, onnxruntime's kernel
        too (_top_k_op); behind a ReduceMax, ReduceMin or Sign, onnxruntime's for those and
        TopK ("fallback": _onnxruntime_nan_ops)."""
        orders = ["last"]
        ops_in = {n.op_type for n in only_output(self.model, index).graph.node}
        if "TopK" in ops_in:
            orders.append("onnxruntime")
        if ops_in & FALLBACK_NAN:
            orders.append("fallback")
        return [(o, r) for o, r in ((o, self.reference(index, o)) for o in orders)
                if r is not None]

    def truth(self, index: int) -> np.ndarray | None:
        """The float64 result of a continuous output `index`, or None (no arbiter)."""
        if self._continuous is None:
            self._continuous = continuous_outputs(self.model)
        if not self._continuous[index]:
            return None
        model = to_float64(only_output(self.model, index))
        try:
            return run_float64(model, self._feeds(model, np.float64))
        except Exception:  # noqa: BLE001 - neither runs it: no arbiter
            return None

    def truth_spread(self, index: int, truth: np.ndarray,
                     distance: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """How far the float64 result `truth` of output `index` moves when every float32
        feed and initializer moves by one float32 ulp (0 where a run fails): check's spread
        of onnxruntime's answer, for the float64 one. Where onnxruntime's answer is
        degenerate it has no spread to lend: LayerNorm over [1e20, -8.7e10, -0.67, -1e20,
        ...] is zeros there (its float32 squares overflow), and float32 places the mean,
        -4.1e9, only to within 1e20's ulp (8.8e12), so the normalized -0.67 (1.2e-10) has
        no float32 answer nearer than about 3e-7 (ours, exact statistics summed in float32:
        -1.8e-20, fuzz 89/290)."""
        return self._spread(index, truth, distance, "")

    def _spread(self, index: int, value: np.ndarray,
                distance: Callable[[np.ndarray, np.ndarray], np.ndarray],
                order: str) -> np.ndarray:
        """truth_spread of `value`, the float64 result (order "") or the reference's opinion
        with NaN order `order`."""
        model = explicit_clip_bounds(only_output(self.model, index))
        exact = exact_values(model)
        rng = np.random.default_rng(0)
        spread = np.zeros(value.shape)
        for _ in range(JITTER_RUNS):
            feeds = {k: v if k in exact and integral(v) else fuzz_values.jitter(rng, v)
                     for k, v in self._feeds(model).items()}
            moved = _jittered_initializers(model, rng, exact)
            try:
                out = run_float64(to_float64(moved), {
                    k: v.astype(np.float64) if v.dtype == np.float32 else v
                    for k, v in feeds.items()}) if not order else \
                    (evaluate(moved, feeds, order) or [None])[0]
            except Exception:  # noqa: BLE001 - a jittered shape input, say: no spread
                return np.zeros(value.shape)
            if out is None or out.shape != value.shape:
                return np.zeros(value.shape)
            spread = np.maximum(spread, distance(out, value))
        return spread


def run_float64(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The one output of a to_float64 model: onnxruntime's, or the reference's where
    onnxruntime does not run it. onnxruntime 1.31 has no float64 kernel for Elu, Selu,
    Celu, Gelu, HardSigmoid or Atan, and without a float64 opinion a float32 answer
    nearer the truth than onnxruntime's own failed: Celu(-3.5561604e-4), alpha 1.643, is
    -3.5557756e-4; onnxruntime's float32 exp(x) - 1 cancels to -3.5563097e-4 in its vector
    loop, to -3.55533e-4 in its scalar tail and in the compiled kernel (fuzz 94/223)."""
    try:
        return run_ort(model, feeds)[0]
    except Exception:  # no float64 kernel for some op: the reference's opinion
        outs = evaluate(model, feeds)
        if outs is None:
            raise
        return outs[0]


def _jittered_initializers(model: onnx.ModelProto, rng: np.random.Generator,
                           exact: set[str]) -> onnx.ModelProto:
    """`model` with every float32 initializer moved one ulp (fuzz_values.jitter), but
    those in `exact` that hold integers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type != TensorProto.FLOAT:
            continue
        arr = numpy_helper.to_array(t)
        if not (t.name in exact and integral(arr)):
            t.CopyFrom(numpy_helper.from_array(fuzz_values.jitter(rng, arr), t.name))
    return out


def evaluate(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
             nan_order: str = "last") -> list[np.ndarray] | None:
    """The outputs of `model` by the ONNX reference implementation with spec_fixes (NaN in
    TopK, ReduceMax and ReduceMin as `nan_order` has it), or None when it fails."""
    import warnings

    from onnx.reference import ReferenceEvaluator
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                         onnx.defs.onnx_opset_version())
            evaluator = ReferenceEvaluator(model, new_ops=spec_fixes(nan_order, opset))
            outs = evaluator.run(None, feeds)
    except Exception:  # noqa: BLE001 - an op it lacks or gets wrong: no opinion
        return None
    return [np.asarray(o) for o in outs]


def spec_fixes(nan_order: str = "last", opset: int | None = None) -> list[type]:
    """onnx.reference ops replaced where they depart from the spec's text (and TopK's
    order of NaN, which the spec leaves open: _top_k_op); with the model's `opset`, its
    float16 Softmax and reductions too (_rounded_once_ops), onnxruntime's COPIED_RULES ops
    of NaN or -0, and its FALLBACK_NAN ops of them where `nan_order` is "fallback"
    (_onnxruntime_nan_ops)."""
    return [_gather_elements_op(), _clip_op(), _log_softmax_op(), _pad_op(),
            _layer_normalization_op(), _group_normalization_op(), _top_k_op(nan_order),
            *([] if opset is None else _rounded_once_ops(opset)),
            *([] if opset is None else _onnxruntime_nan_ops(COPIED_RULES, opset)),
            *([] if opset is None or nan_order != "fallback" else
              _onnxruntime_nan_ops(FALLBACK_NAN, opset))]


# Ops whose answer for NaN is onnxruntime's own where a fallback segment runs them.
FALLBACK_NAN = frozenset({"ReduceMax", "ReduceMin", "Sign"})
# Ops whose answer for NaN or -0 is onnxruntime's own wherever they run (ours copy its
# rules): ArgMax/ArgMin's first NaN, CumSum's sign of a zero sum.
COPIED_RULES = frozenset({"ArgMax", "ArgMin", "CumSum"})


def _onnxruntime_nan_ops(names: frozenset, opset: int) -> list[type]:
    """The ops `names` at `opset` by onnxruntime's kernel, on the reference's own input,
    where that holds NaN or -0 (else the reference's). An op autoclust leaves to
    onnxruntime (a fallback segment) gives onnxruntime's, and COPIED_RULES anywhere: ours
    copy ArgMax's and ArgMin's first-NaN rule, which the spec leaves open (NumPy's first
    NaN wins, [nan, 0.58, -0.06, nan] -> 3 with select_last_index; onnxruntime's and ours
    0: after our ReduceMax's NaN, which onnxruntime skips, neither opinion had ours, fuzz
    102/502), and CumSum's +0 where an exclusive scan starts (the reference: -0 for -0 +
    -0; beside our ReduceSum of [-0.], NumPy's +0 where onnxruntime's last-axis sum keeps
    -0, neither opinion had ours, 103/68). FALLBACK_NAN:
      - ReduceMax and ReduceMin: ours give NaN wherever it sits in the row, as the
        reference does, onnxruntime only where it comes first. A ReduceMin of [0.50, nan]
        left to onnxruntime (0.50) beside our ReduceSum of -0 (NumPy's +0), into
        Reciprocal, Div and Max, gave inf, which neither opinion gave alone (96/1396);
      - Sign, which the spec defines for numbers only: onnxruntime's float16 kernel maps
        NaN to 0 (as TensorFlow does), its float32 kernel, NumPy and ours to NaN, and
        onnxruntime runs a float16 Sign next to float32 work (a Reciprocal it has no
        float16 kernel for) in float32: Pow(x, Sign(NaN)) was NaN in the whole model and
        1 where a fallback segment ran Sign alone (94/1877)."""
    from onnx.reference.ops import load_op

    def run(base: type) -> Callable[..., tuple]:
        def _run(self: Any, data: np.ndarray, *inputs: object, **attrs: object) -> tuple:
            if data.dtype.kind != "f" or not (np.isnan(data) | (data == 0) & np.signbit(data)
                                              ).any():
                return base._run(self, data, *inputs, **attrs)
            return _onnxruntime_node(self.onnx_node, [data, *inputs], opset)
        return _run

    return [type(name, (base,), {"op_domain": "", "_run": run(base),
                                 "op_schema": onnx.defs.get_schema(name, opset)})
            for name in sorted(names) for base in [load_op("", name, opset)]]


# Ops whose onnx.reference implementation rounds a float16 intermediate to float16 (a sum,
# the squares, the exponentials); NumPy's float16 sums accumulate in float32, so ReduceSum
# and ReduceL1 round once.
ROUNDED_INTERMEDIATES = ("ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp", "Softmax")


def _rounded_once_ops(opset: int) -> list[type]:
    """onnx.reference's float16 ROUNDED_INTERMEDIATES at `opset`, fixed: the spec rounds
    each op's result once. Its Softmax of [-0.2195, 0.4087] (exponentials in float16) gave
    [0.3481, 0.6523] for [0.348, 0.652], and its ReduceLogSum of [0.348, 0.652] rounded
    the sum, exactly 0.99976, to 1.0: log 0, where the exact -2.44e-4 is ours
    (onnxruntime, not rounding the Softmax, 0: fuzz 97/7157). Computed in float64 and
    rounded once, as _log_softmax_op is. ReduceLogSumExp too in float32, with +-inf as
    +-1e300: it shifts a row by its largest finite element, and a row without one, [inf]
    (1 / +0), was inf - inf, NaN, where the spec's log(sum(exp(x))) is inf (102/633)."""
    from onnx.reference.ops import load_op

    def wide_run(base: type, finite: bool) -> Callable[..., tuple]:
        def _run(self: object, data: np.ndarray, *args: object, **kwargs: object) -> tuple:
            if data.dtype != np.float16 and not (finite and data.dtype == np.float32):
                return base._run(self, data, *args, **kwargs)
            wide = data.astype(np.float64)
            outs = base._run(self, np.clip(wide, -1e300, 1e300) if finite else wide,
                             *args, **kwargs)
            return tuple(np.asarray(o).astype(data.dtype) for o in outs)
        return _run

    out = []
    for name in ROUNDED_INTERMEDIATES:
        base = load_op("", name, opset)
        run = wide_run(base, name == "ReduceLogSumExp")
        out.append(type(name, (base,), {"op_domain": "", "_run": run,
                                        "op_schema": onnx.defs.get_schema(name, opset)}))
    return out


def _layer_normalization_op() -> type:
    """onnx.reference's LayerNormalization, fixed: its float32 statistics overflow on the
    square of 1e20 (zeros, as onnxruntime's), and it refuses any stash_type but float32.
    Computes them exactly (float64) and rounds the normalized X to X's dtype before scale
    and bias, as autoclust does (its deliberate departure, docs/fuzzing.md; the spec fixes
    no summation, and exact statistics are float32's best): a LayerNorm departure behind an
    op without a float64 kernel in onnxruntime (HardSigmoid, Atan, Erf) or a comparison
    (Greater) had no arbiter (fuzz 83/1, 83/41, 83/64, 83/322). onnxruntime's answer
    stays the expected one."""
    from onnx.reference.op_run import OpRun

    class LayerNormalization(OpRun):
        op_domain = ""

        def _run(self, x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=1):
            axes = tuple(range(axis % max(x.ndim, 1), x.ndim))
            normalized, mean, inv_std = _exactly_normalized(x, axes, epsilon)
            y = normalized * scale
            y = y if bias is None else y + bias
            stash = onnx.helper.tensor_dtype_to_np_dtype(stash_type)
            return (y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash))
    return LayerNormalization


def _exactly_normalized(x: np.ndarray, axes: tuple[int, ...], epsilon: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x normalized over `axes` with float64 statistics, rounded to x's dtype; the mean;
    1 / std): the exact statistics of _layer_normalization_op and _group_normalization_op."""
    wide = x.astype(np.float64)
    mean = wide.mean(axis=axes, keepdims=True)
    diff = wide - mean
    inv_std = 1 / np.sqrt((diff * diff).mean(axis=axes, keepdims=True) + epsilon)
    return (diff * inv_std).astype(x.dtype), mean, inv_std


def _group_normalization_op() -> type:
    """onnx.reference's GroupNormalization (the spec's function), fixed as LayerNormalization
    is above: its float32 statistics overflow on the square of 1e20. Computes them exactly
    (float64) and rounds the normalized X to X's dtype before scale and bias, as autoclust
    does (the departure of docs/fuzzing.md): behind a comparison (Less, fuzz 79/216) the
    departure had no arbiter. Scale and bias are per group in opset 18, per channel from
    21; stash_type changes nothing exact statistics already give."""
    from onnx.reference.op_run import OpRun

    class GroupNormalization(OpRun):
        op_domain = ""

        def _run(self, x, scale, bias, epsilon=1e-5, num_groups=1, stash_type=1):
            (n, c), groups, pixels = x.shape[:2], int(num_groups), math.prod(x.shape[2:])
            rows = x.reshape(n, groups, c // groups * pixels)
            y = _exactly_normalized(rows, (2,), epsilon)[0].reshape(n, c, pixels)
            if self.run_params["opsets"].get("", 21) < 21:  # one scale and bias per group
                scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
            y = y * scale.reshape(1, c, 1) + bias.reshape(1, c, 1)
            return (y.astype(x.dtype).reshape(x.shape),)
    return GroupNormalization


def _log_softmax_op() -> type:
    """onnx.reference's LogSoftmax, fixed: it takes the log of its Softmax, which underflows
    to 0 in float16, so [-0.32, 0.24, 7508] gave [-inf, -inf, 0] for the spec's [-7508,
    -7508, 0] (and NaN after a MatMul: no opinion, fuzz 79/622). Computed as
    x - max - log(sum(exp(x - max))) in float64 and rounded once, as the spec's per-op
    rounding has it."""
    from onnx.reference.op_run import OpRun

    class LogSoftmax(OpRun):
        op_domain = ""

        def _run(self, x, axis=-1):
            if not x.size:
                return (x,)
            x64 = x.astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                shifted = x64 - x64.max(axis=axis, keepdims=True)
                out = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
            return (out.astype(x.dtype),)
    return LogSoftmax


def _pad_op() -> type:
    """onnx.reference's Pad, fixed: it hands negative pads (the spec's crop) to np.pad,
    which refuses them, so a Pad that crops left no opinion on anything before it (a
    ReduceMin's NaN, fuzz 80/347). Crops first, then pads what is left, as onnxruntime does
    (reflect pads from the cropped data). The opset 11+ form: pads an input."""
    from onnx.reference.op_run import OpRun

    class Pad(OpRun):
        op_domain = ""

        def _run(self, data, pads, constant_value=None, axes=None, mode="constant"):
            rank = data.ndim
            axes = range(rank) if axes is None else [int(a) % rank for a in axes]
            n = len(axes)
            crop, width = [slice(None)] * rank, [(0, 0)] * rank
            for i, axis in enumerate(axes):
                lo, hi = int(pads[i]), int(pads[n + i])
                start = max(-lo, 0)
                crop[axis] = slice(start, max(data.shape[axis] - max(-hi, 0), start))
                width[axis] = (max(lo, 0), max(hi, 0))
            kept = data[tuple(crop)]
            if mode != "constant":
                return (np.pad(kept, width, mode=mode).astype(data.dtype),)
            value = 0 if constant_value is None else np.asarray(constant_value).reshape(())
            return (np.pad(kept, width, constant_values=value).astype(data.dtype),)
    return Pad


def _top_k_op(nan_order: str = "last") -> type:
    """onnx.reference's TopK where a row holds NaN, which the spec does not order (it orders
    numbers, ties by lower index) and the reference sorts above every number. Two answers
    are autoclust's, so either is an opinion (Arbiter.references):
      - "last": NaN after every number, either way (the op table's TopK: the interpreter
        and constant folding);
      - "onnxruntime": onnxruntime's kernel run on the reference's own input, every value
        upstream still the reference's. Its heap and sort comparisons, all false on a NaN,
        leave it wherever the algorithm does ([nan, 2, -1, 2, 7]: smallest 3 [-1, 2, nan],
        largest 4 without it); a TopK autoclust leaves to onnxruntime (data-dependent:
        never compiled) gives it. A ReduceMax's NaN (the spec's, and ours; onnxruntime
        skips it) before such a TopK was condemned (fuzz 93/915); "fallback" too.
    A TopK without NaN is the reference's own."""
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_topk import topk_sorted_implementation

    class TopK(OpRun):
        op_domain = ""

        def _run(self, x, k, axis=-1, largest=1, sorted=1):
            axis = int(axis) % max(x.ndim, 1)
            if not (x.dtype.kind == "f" and np.isnan(x).any()):
                values, idx = topk_sorted_implementation(x, k, axis, int(largest))
            elif nan_order == "last":
                order = np.lexsort((-x if largest else x, np.isnan(x)), axis=axis)
                idx = np.take(order, np.arange(int(np.ravel(k)[0])), axis=axis)
                values = np.take_along_axis(x, idx, axis=axis)
            else:
                return _onnxruntime_node(self.onnx_node, [x, k],
                                         max(self.run_params["opsets"].get("", 11), 11))
            return (values, idx.astype(np.int64))
    return TopK


def _onnxruntime_node(node: onnx.NodeProto, inputs: list[Any], opset: int) -> tuple:
    """onnxruntime's outputs of `node` alone on `inputs` (a one-node model, optimizations
    off): its kernel's answer where a fallback segment runs the op."""
    names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
    fed = {n: np.asarray(x) for n, x in zip([n for n in names if n], inputs)}
    one = onnx.helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))])
    one.attribute.extend(node.attribute)
    graph = onnx.helper.make_graph(
        [one], node.op_type,
        [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(x.dtype),
                                            None) for n, x in fed.items()],
        [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in one.output])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    return tuple(ort_session(model).run(None, fed))


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
    opinion: a NaN from ReduceMin before such a Gather could not be arbitrated). Indices
    longer than the data off the axis are refused, as onnxruntime and ours do, empty or
    not: NumPy's fancy indexing returns an empty [2, 0] for [0, 0] data, which beside
    onnxruntime's own MatMul error (_spec_outputs) was expected (fuzz 96/2584)."""
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):
        op_domain = ""

        def _run(self, data, indices, axis=0):
            axis = int(axis) % max(data.ndim, 1)
            if any(i > d for k, (i, d) in enumerate(zip(indices.shape, data.shape))
                   if k != axis):
                raise ValueError(f"GatherElements: indices {indices.shape} exceed data "
                                 f"{data.shape} off axis {axis}")
            idx = np.where(indices < 0, indices + data.shape[axis], indices)
            grid = list(np.indices(idx.shape, sparse=True))
            grid[axis] = idx
            return (data[tuple(grid)],)
    return GatherElements
