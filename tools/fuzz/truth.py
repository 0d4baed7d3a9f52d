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
onnx.reference's own departures from the spec are replaced (tools/fuzz/onnx_reference.py),
or its opinion would condemn a right answer or, where it raises, leave a wrong one of
onnxruntime's standing.

`run_reference` tells onnxruntime's own failures from the feeds' errors: a run that raises
but succeeds with the memory planner's buffer reuse off failed inside onnxruntime.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.tools.fuzz import values as fuzz_values
from autoclust.tools.fuzz.onnx_reference import FALLBACK_NAN, evaluate, ort_session
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
JITTER_CACHE_BYTES = 2 << 30  # an output's jittered feeds kept for its next spread


def exact_values(model: onnx.ModelProto) -> set[str]:
    """Values the jitter leaves alone when they hold integers: Pow's exponents. Pow(x, 2)
    of a negative x is x*x, Pow(x, 2.0000002) is NaN: RMSNorm's x^2 in every real export
    then had an infinite spread, and the oracle accepted any answer downstream of it."""
    return {n.input[1] for n in model.graph.node if n.op_type == "Pow" and len(n.input) > 1}


def integral(x: np.ndarray) -> bool:
    """Whether `x` is a float array of finite integers."""
    return x.dtype.kind == "f" and bool(np.all(np.isfinite(x) & (x == np.round(x))))


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
    5, 0] at axis 3 fails, so a MatMul error elsewhere was expected (97/2198). A cut that
    onnxruntime fails in another op raises that error: the feeds' own error (a
    LayerNormalization over an empty row, which onnxruntime and autoclust refuse), hidden
    behind onnxruntime's MatMul error, which it met first (fuzz 121/1036)."""
    if _failed_op(exc) not in SHAPE_ERRORS_ONLY:
        return None
    outs, confirmed = [], False
    for i in range(len(model.graph.output)):
        cut = only_output(model, i)
        fed = {k: v for k, v in feeds.items() if k in {x.name for x in cut.graph.input}}
        try:
            outs.append(ort_session(cut).run(None, fed)[0])
        except Exception as cut_exc:  # an error's op is in this output's cone
            if _failed_op(cut_exc) not in SHAPE_ERRORS_ONLY:
                raise  # the feeds' error onnxruntime's own one hid (fuzz 121/1036)
            ref = evaluate(cut, fed)
            if ref is None:
                return None
            outs.append(ref[0])
            confirmed = True
    return outs if confirmed or evaluate(model, feeds) is not None else None


def _failed_op(exc: BaseException) -> str:
    """The op type onnxruntime names in its run-time error `exc`, or ""."""
    found = re.search(r"while running (\w+) node", str(exc))
    return found.group(1) if found else ""


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
        self._lifted: tuple[onnx.ModelProto, dict[str, np.ndarray]] | None = None
        self._cones: dict[int, tuple[onnx.ModelProto, dict[str, np.ndarray]]] = {}
        self._jitters: dict[int, list[dict[str, np.ndarray]]] = {}

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

    def _cone(self, index: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        """Output `index`'s cone (only_output, Clip's bounds explicit) with its float32
        initializers graph inputs (lift_initializers), and their values. Every opinion runs
        on it, fed the values (or their jitter): BERT-base's 440 MB of weights are read
        once per Arbiter, not copied into new protos (only_output, to_float64, the jitter)
        per opinion and jittered run, which made a failing bisect trial 21 s, 11 s of it
        copies."""
        if self._lifted is None:
            self._lifted = lift_initializers(self.model)
        if index not in self._cones:
            whole, values = self._lifted
            cone, bounds = lift_initializers(explicit_clip_bounds(only_output(whole, index)))
            self._cones[index] = cone, {**values, **bounds}
        return self._cones[index]

    def _feeds(self, index: int, dtype: type | None = None) -> dict:
        """The feeds of output `index`'s cone (_cone): its lifted initializers, then the
        model's feeds (an initializer that is also an input is overridden), float32 ones
        cast to `dtype` if given."""
        cone, values = self._cone(index)
        names = {v.name for v in cone.graph.input}
        return {k: v.astype(dtype) if dtype is not None and v.dtype == np.float32 else v
                for k, v in {**values, **self.feeds}.items() if k in names}

    def reference(self, index: int, nan_order: str = "last") -> np.ndarray | None:
        """Output `index` by the ONNX reference implementation, or None when it fails."""
        outs = evaluate(self._cone(index)[0], self._feeds(index), nan_order)
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
        ops_in = {n.op_type for n in self._cone(index)[0].graph.node}
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
        try:
            return run_float64(to_float64(self._cone(index)[0]), self._feeds(index, np.float64))
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
        cone = self._cone(index)[0]
        model64 = to_float64(cone) if not order else cone
        spread = np.zeros(value.shape)
        for feeds in self._jittered(index):
            try:
                out = run_float64(model64, {
                    k: v.astype(np.float64) if v.dtype == np.float32 else v
                    for k, v in feeds.items()}) if not order else \
                    (evaluate(cone, feeds, order) or [None])[0]
            except Exception:  # noqa: BLE001 - a jittered shape input, say: no spread
                return np.zeros(value.shape)
            if out is None or out.shape != value.shape:
                return np.zeros(value.shape)
            spread = np.maximum(spread, distance(out, value))
        return spread


    def _jittered(self, index: int) -> Iterator[dict[str, np.ndarray]]:
        """The JITTER_RUNS jittered feeds of output `index`'s cone (every float32 feed and
        lifted initializer one ulp off, but exact_values holding integers), the same for
        every spread of the output: kept after the first spread where they take at most
        JITTER_CACHE_BYTES (an opinion's spread and the truth's then jitter once: BERT-base's
        440 MB of weights took ~0.6 s a run), else drawn again."""
        cached = self._jitters.get(index)
        if cached is not None:
            yield from cached
            return
        exact = exact_values(self._cone(index)[0])
        feeds = self._feeds(index)
        keep = sum(v.nbytes for v in feeds.values()) * JITTER_RUNS <= JITTER_CACHE_BYTES
        rng, drawn = np.random.default_rng(0), []
        for _ in range(JITTER_RUNS):
            moved = {k: v if k in exact and integral(v) else fuzz_values.jitter(rng, v)
                     for k, v in feeds.items()}
            if keep:
                drawn.append(moved)
            yield moved
        if keep:
            self._jitters[index] = drawn


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


def lift_initializers(model: onnx.ModelProto, types: tuple[int, ...] = (TensorProto.FLOAT,),
                      outputs: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """`model` with its initializers of element `types` graph inputs, and their values (to
    feed): a run that moves them one ulp (Arbiter._spread, check.spread_of) feeds moved
    values rather than writing them into a copy of the model. Kept: those of exact_values
    that hold integers (the jitter leaves them), and graph outputs unless `outputs`."""
    g, exact = model.graph, exact_values(model)
    keep = set() if outputs else {o.name for o in g.output}
    values, kept, elem = {}, [], {}
    for t in g.initializer:
        if t.data_type in types and t.name not in keep:
            arr = numpy_helper.to_array(t)
            if not (t.name in exact and integral(arr)):
                values[t.name], elem[t.name] = arr, t.data_type
                continue
        kept.append(t)
    if not values:
        return model, {}
    inputs = list(g.input) + [
        onnx.helper.make_tensor_value_info(name, elem[name], arr.shape)
        for name, arr in values.items() if name not in {v.name for v in g.input}]
    graph = onnx.helper.make_graph(list(g.node), g.name, inputs, list(g.output), kept,
                                   value_info=list(g.value_info))
    out = onnx.helper.make_model(graph, opset_imports=model.opset_import,
                                 functions=model.functions)
    out.ir_version = model.ir_version
    return out, values

