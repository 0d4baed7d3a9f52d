"""onnx.reference (the ONNX reference implementation, per-op NumPy) with its departures from
the spec fixed: the fuzz oracle's second opinion (tools/fuzz/truth.py), where onnxruntime is
not the only right answer.

`evaluate` runs a model on it with `spec_fixes`: ops replaced where the reference departs
from the spec's text (Clip, Erf, Gelu, Flatten, GatherElements, GroupNormalization,
LayerNormalization, LogSoftmax, Pad, float16 Softmax and reductions), or where the spec
leaves an answer open that autoclust gives in onnxruntime's way (TopK, ReduceMax, ReduceMin
and Sign of NaN; ArgMax, ArgMin and CumSum of NaN and -0). Without them its opinion would
condemn a right answer or, where it raises, leave a wrong one of onnxruntime's standing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.backends.ort import ORIGINAL_SESSION


def ort_session(model: onnx.ModelProto, reuse_memory: bool = True) -> ort.InferenceSession:
    """An onnxruntime session with every graph optimization off, one thread, quiet;
    reuse_memory=False turns the memory planner's buffer reuse off too (run_reference)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # run-time failures are expected; they are reported here
    so.intra_op_num_threads = 1
    so.enable_mem_reuse = reuse_memory
    return ORIGINAL_SESSION(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


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
    return [_gather_elements_op(), _clip_op(), _erf_op(), _gelu_op(), _log_softmax_op(),
            _pad_op(), _layer_normalization_op(), _group_normalization_op(), _flatten_op(),
            _conv_op(), _top_k_op(nan_order),
            *([] if opset is None else _rounded_once_ops(opset)),
            *([] if opset is None else _older_quantize_ops(opset)),
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
    (1 / +0), was inf - inf, NaN, where the spec's log(sum(exp(x))) is inf (102/633).
    ReduceMean of an empty row: 0, as onnxruntime (and autoclust) give, where NumPy's mean
    is NaN; the spec calls it undefined (115/1735: behind onnxruntime's own MatMul error,
    the reference's outputs were the expected ones)."""
    from onnx.reference.ops import load_op

    def wide_run(base: type, finite: bool, empty_zero: bool) -> Callable[..., tuple]:
        def _run(self: object, data: np.ndarray, *args: object, **kwargs: object) -> tuple:
            if empty_zero and not data.size:  # every row empty
                return tuple(np.zeros_like(np.asarray(o))
                             for o in base._run(self, data, *args, **kwargs))
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
        run = wide_run(base, name == "ReduceLogSumExp", name == "ReduceMean")
        out.append(type(name, (base,), {"op_domain": "", "_run": run,
                                        "op_schema": onnx.defs.get_schema(name, opset)}))
    return out


def _older_quantize_ops(opset: int) -> list[type]:
    """QuantizeLinear and DequantizeLinear before opset 19, which onnx.reference lacks (it
    raised, leaving no opinion): its opset-19 kernels, whose int8/uint8 semantics are the
    older ones'. Without them onnxruntime's Gemm of an empty inner dim (C unscaled, where
    the spec has beta * C) stood against ours behind a Q/DQ pair (fuzz 149/2441)."""
    if opset >= 19:
        return []
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19
    from onnx.reference.ops.op_quantize_linear import QuantizeLinear_19
    return [type(base.__name__[:-3], (base,), {"op_domain": "", "op_schema":
                                               onnx.defs.get_schema(base.__name__[:-3], opset)})
            for base in (DequantizeLinear_19, QuantizeLinear_19)]


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


def _vector_erf() -> Callable[[np.ndarray], np.ndarray]:
    """erf over a float64 array: scipy's where it is installed (the test extras), one array
    call; else math.erf per element."""
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - scipy is in the test extras
        return np.vectorize(math.erf, otypes=[np.float64])
    return erf


def _erf_op() -> type:
    """onnx.reference's Erf, fixed: it maps math.erf over the elements into float32, so a
    float64 model's Erf (onnxruntime has no float64 kernel for it: run_float64) was rounded
    to float32, and the float64 truth of every GELU 1e-9 from the exact one. Computed in
    float64 and rounded once; one array call where scipy is installed (the Python loop
    took 5.7 s of a BERT-base bisect's 54: 4.7M elements, five runs in a failing trial)."""
    from onnx.reference.op_run import OpRun
    erf = _vector_erf()

    class Erf(OpRun):
        op_domain = ""

        def _run(self, x):
            return (np.asarray(erf(x.astype(np.float64))).astype(x.dtype),)
    return Erf


def _gelu_op() -> type:
    """onnx.reference's Gelu (opset 20), fixed: it runs the spec's function body, whose Erf
    (or Tanh) and products each round to the input's dtype, and whose Erf is the
    reference's float32 one even in a float64 model (the float64 truth of a Gelu, which
    onnxruntime has no float64 kernel for, was float32's). The op's result, computed in
    float64 and rounded once, as the spec rounds an op's result."""
    from onnx.reference.op_run import OpRun
    erf = _vector_erf()

    class Gelu(OpRun):
        op_domain = ""

        def _run(self, x, approximate="none"):
            w = x.astype(np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                if approximate == "tanh":
                    inner = math.sqrt(2 / math.pi) * (w + 0.044715 * w ** 3)
                    y = 0.5 * w * (1 + np.tanh(inner))
                else:
                    y = 0.5 * w * (1 + erf(w / math.sqrt(2)))
            return (np.asarray(y).astype(x.dtype),)
    return Gelu


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


def _flatten_op() -> type:
    """onnx.reference's Flatten, fixed: it reshapes to (rows, -1), which NumPy cannot do
    for an empty tensor with no rows ([0, 3] at axis -1: "cannot reshape array of size 0
    into shape (0,newaxis)"), and the reference then had no opinion beside onnxruntime's
    MatMul error on the [0, 3] result (fuzz 138/1816). The spec's shape, from the dims."""
    from onnx.reference.op_run import OpRun

    class Flatten(OpRun):
        op_domain = ""

        def _run(self, x, axis=1):
            axis = int(axis) + (x.ndim if int(axis) < 0 else 0)
            rows, cols = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
            return (x.reshape(rows, cols),)
    return Flatten


def _conv_op() -> type:
    """onnx.reference's Conv, replaced: its im2col product gave NaN for windows holding no
    inf or NaN, next to ones that do (a padded, dilated Conv over data holding inf: the
    float64 opinion was NaN there, and LayerNormalization after it the bias, so a float32
    answer right where onnxruntime's variance overflows stood condemned, fuzz 140/352).
    Per kernel tap, the tap's weights times the strided view of the zero-padded input."""
    from onnx.reference.op_run import OpRun

    class Conv(OpRun):
        op_domain = ""

        def _run(self, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
            spatial, kernel = x.shape[2:], w.shape[2:]
            n = len(kernel)
            dil, step = list(dilations or [1] * n), list(strides or [1] * n)
            begin, end = _conv_pads(auto_pad, spatial, kernel, dil, step, pads)
            out = [(s + lo + hi - (k - 1) * d - 1) // st + 1
                   for s, lo, hi, k, d, st in zip(spatial, begin, end, kernel, dil, step)]
            xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
            g, m = int(group), w.shape[0]
            cg, mg = x.shape[1] // g, m // g
            y = np.zeros((x.shape[0], m, *out), np.result_type(x, w))
            for tap in np.ndindex(*kernel):
                view = xp[(slice(None), slice(None)) + tuple(
                    slice(t * d, t * d + (o - 1) * st + 1, st)
                    for t, d, o, st in zip(tap, dil, out, step))]
                for i in range(g):
                    wt = w[(slice(i * mg, (i + 1) * mg), slice(None)) + tap]
                    y[:, i * mg:(i + 1) * mg] += np.einsum(
                        "mc,nc...->nm...", wt, view[:, i * cg:(i + 1) * cg])
            if b is not None:
                y += b.reshape((1, m) + (1,) * n)
            return (y.astype(x.dtype),)
    return Conv


def _conv_pads(auto_pad: str, spatial: tuple, kernel: tuple, dil: list, step: list,
               pads: list | None) -> tuple[list[int], list[int]]:
    """Conv's begin and end pads per spatial axis, auto_pad resolved as the spec says."""
    n = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max((-(-s // st) - 1) * st + (k - 1) * d + 1 - s, 0)
                 for s, k, d, st in zip(spatial, kernel, dil, step)]
        small = [t // 2 for t in total]
        big = [t - h for t, h in zip(total, small)]
        return (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return [int(p) for p in pads[:n]], [int(p) for p in pads[n:]]
