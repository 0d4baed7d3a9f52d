"""Random valid ONNX graphs for the differential fuzzer, built from per-op emitters.

`generate(rng, features)` returns a Case: a ModelProto of 2-30 nodes (a little more at
most) at opset 13, 17 or 21, and its feeds. A case first draws a profile
(tools/fuzz/build.py): its float dtype (float32, or float16), the regime of its float
inputs (normal; wide: denormals to 1e20; special: plus inf and NaN; tools/fuzz/values.py),
whether shapes may hold zero-size dims, whether feeds may make onnxruntime raise, and
which emitter groups it uses:
  - core:   elementwise math, Where/Cast/Clip, Softmax/LayerNorm, layout and shape chains,
            NonZero/TopK that must fall back (this module);
  - reduce: every ReduceX (noop_with_empty_axes, absent and empty axes), ArgMax/ArgMin,
            CumSum, MatMul with zero-size dims (tools/fuzz/gen_edge.py);
  - index:  Gather, GatherElements (indices smaller than data), Pad (4 modes), Split,
            Tile, Trilu, Range (tools/fuzz/gen_index.py);
  - int:    integer arithmetic, Div/Mod (zero divisors in error profiles);
  - round:  float16/float32 results into rounding-sensitive consumers;
  - export: embedding lookups, GroupNormalization, Where chains, masked Softmax;
  - optional: Clip with missing bounds, Gemm with alpha/beta 0, signed zeros through
            CumSum, scans into reductions, NaN rows, indices longer than data off the
            axis and absurd Expand shapes in error profiles (tools/fuzz/gen_optional.py);
  - ops:    the rest of the op table: inverse trig, PRelu, Sum/Mean, logical and bitwise
            ops, pools, BatchNorm/InstanceNorm/LpNorm/MVN, DepthToSpace, scatters, OneHot,
            Einsum, ConvTranspose, Quantize/DequantizeLinear, ... (tools/fuzz/gen_ops.py).
Each emitter picks operands from the values built so far (recent ones first, so chains
form), adds a few nodes and records their concrete output shapes; an emitter that cannot
use this profile adds nothing. Operands of restricted domains are made safe first (Log on
|x|+1, Sqrt on |x|, Div by |b|+0.5, Exp on Clip(x, -6, 6)), so with normal inputs every
reference stays finite; the wide and special regimes then push inf and NaN through them.
Data-dependent ops (NonZero, TopK with a runtime k) only feed graph outputs or value-only
chains, so shapes stay known here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from autoclust.tools.fuzz import build as fb
from autoclust.tools.fuzz import gen_edge as fuzz_gen_edge
from autoclust.tools.fuzz import gen_index as fuzz_gen_index
from autoclust.tools.fuzz import gen_ops as fuzz_gen_ops
from autoclust.tools.fuzz import gen_optional as fuzz_gen_optional
from autoclust.tools.fuzz.build import BOOL, ELEM, F32, F64, I64, Builder, Case, Val
from onnx import TensorProto

ALL, CLASSIC, PRESETS, features_from = fb.ALL, fb.CLASSIC, fb.PRESETS, fb.features_from
__all__ = ["ALL", "CLASSIC", "PRESETS", "Builder", "Case", "Val", "case_for", "features_from",
           "generate"]

UNARY = ("Relu", "Neg", "Abs", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Softsign",
         "Softplus", "Atan", "Asinh", "Sinh", "Cosh", "Sign", "HardSwish", "Mish", "Gelu")
UNARY_ATTR = {"LeakyRelu": ("alpha", (0.01, 0.3)), "Elu": ("alpha", (0.5, 1.5)),
              "HardSigmoid": ("alpha", (0.1, 0.4)), "Celu": ("alpha", (0.5, 2.0)),
              "ThresholdedRelu": ("alpha", (0.0, 1.0)), "Selu": ("gamma", (1.0, 1.1))}
BINARY = ("Add", "Sub", "Mul", "Max", "Min")


# ---- emitters: elementwise ----------------------------------------------------------------

def emit_unary(b: Builder) -> None:
    a = b.pick()
    r = b.rng.random()
    if r < 0.55:
        op = str(b.rng.choice(UNARY))
        if b.has(op, a.dtype):
            b.node(op, [a.name], [(a.dtype, a.shape)])
    elif r < 0.7:
        op = str(b.rng.choice(sorted(UNARY_ATTR)))
        key, (lo, hi) = UNARY_ATTR[op]
        if b.has(op, a.dtype):
            b.node(op, [a.name], [(a.dtype, a.shape)], **{key: float(b.rng.uniform(lo, hi))})
    elif r < 0.8:
        lo, hi = b.const(np.array(-6, a.dtype)), b.const(np.array(6, a.dtype))
        clipped = b.node("Clip", [a.name, lo, hi], [(a.dtype, a.shape)])[0]
        b.node("Exp", [clipped.name], [(a.dtype, a.shape)])
    elif r < 0.88:
        b.node("Log", [b.safe_positive(a, 1.0).name], [(a.dtype, a.shape)])
    elif r < 0.94:
        b.node("Sqrt", [b.safe_positive(a, 0.0).name], [(a.dtype, a.shape)])
    else:
        b.node("Reciprocal", [b.safe_positive(a, 0.5).name], [(a.dtype, a.shape)])


def emit_binary(b: Builder) -> None:
    a = b.pick()
    c = b.partner(a)
    x, y = (a, c) if b.rng.random() < 0.7 else (c, a)
    out = [(a.dtype, fb.bshape(x.shape, y.shape))]
    r = b.rng.random()
    if r < 0.12:
        y = b.safe_positive(y, 0.5)
        b.node("Div", [x.name, y.name], out)
    elif r < 0.17:
        b.node("Pow", [b.safe_positive(x, 0.5).name, y.name], out)
    elif r < 0.2:
        b.node("Mod", [x.name, b.safe_positive(y, 0.5).name], out, fmod=1)
    else:
        b.node(str(b.rng.choice(BINARY)), [x.name, y.name], out)


def emit_where_cast_clip(b: Builder) -> None:
    a = b.pick()
    r = b.rng.random()
    if r < 0.4:
        c = b.partner(a)
        op = str(b.rng.choice(["Greater", "Less", "GreaterOrEqual"]))
        (cond,) = b.node(op, [a.name, c.name], [(BOOL, fb.bshape(a.shape, c.shape))])
        other = b.partner(a) if b.rng.random() < 0.5 else b.const_val(np.array(0, a.dtype))
        b.node("Where", [cond.name, a.name, other.name],
               [(a.dtype, fb.bshape(cond.shape, a.shape, other.shape))])
    elif r < 0.6:
        (d,) = b.node("Cast", [a.name], [(F64, a.shape)], to=TensorProto.DOUBLE)
        op = str(b.rng.choice(["Neg", "Abs", "Relu", "Tanh"]))
        (e,) = b.node(op, [d.name], [(F64, a.shape)])
        b.node("Cast", [e.name], [(a.dtype, a.shape)], to=ELEM[a.dtype])
    elif r < 0.75:
        (g,) = b.node("Greater", [a.name, b.const(np.array(0, a.dtype))], [(BOOL, a.shape)])
        b.node("Cast", [g.name], [(a.dtype, a.shape)], to=ELEM[a.dtype])
    else:
        lo = np.array(b.rng.uniform(-2, 0), a.dtype)
        hi = b.const(np.array(b.rng.uniform(0, 2), a.dtype))
        args = [a.name, b.const(lo), hi] if b.rng.random() < 0.7 else [a.name, "", hi]
        b.node("Clip", args, [(a.dtype, a.shape)])


# ---- emitters: normalization ------------------------------------------------------------

def emit_normalization(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    rank = len(a.shape)
    axis = int(b.rng.integers(-rank, rank))
    if b.rng.random() < 0.5 or not b.has("LayerNormalization"):
        op = "Softmax" if b.rng.random() < 0.7 else "LogSoftmax"
        b.node(op, [a.name], [(a.dtype, a.shape)], axis=axis)
        return
    norm_shape = a.shape[axis % rank:]
    if 0 in norm_shape and not b.profile.errors:
        return  # onnxruntime raises on an empty normalized shape
    scale = b.weight(norm_shape, 0.5).name
    args = [a.name, scale] + ([b.weight(norm_shape, 0.5).name] if b.rng.random() < 0.6 else [])
    # Not 1e-5: a constant row (after Expand) turns rounding noise into 3e-5 errors.
    eps = float(b.rng.choice([1e-2, 0.1]))
    b.node("LayerNormalization", args, [(a.dtype, a.shape)], axis=axis, epsilon=eps)


# ---- emitters: layout -------------------------------------------------------------------

def emit_transpose(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 2)
    perm = [int(p) for p in b.rng.permutation(len(a.shape))]
    b.node("Transpose", [a.name], [(a.dtype, tuple(a.shape[p] for p in perm))], perm=perm)


def _reshape_target(b: Builder, shape: list[int]) -> list[int]:
    if len(shape) >= 2 and b.rng.random() < 0.5:  # merge two adjacent dims
        i = int(b.rng.integers(0, len(shape) - 1))
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    else:  # split a dim into two factors, or add a 1
        i = int(b.rng.integers(0, len(shape)))
        d = shape[i]
        f = [x for x in range(1, d + 1) if d % x == 0]
        q = int(b.rng.choice(f)) if f else int(b.rng.integers(1, 3))
        shape[i:i + 1] = [q, d // q] if d else [q, 0][::int(b.rng.choice([1, -1]))]
    return shape


def emit_reshape(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    shape = _reshape_target(b, list(a.shape))
    target = list(shape)
    attrs = {}
    if 0 in a.shape:
        # -1 cannot be inferred from zero elements; a literal 0 copies the input dim
        # unless allowzero=1 (opset 14).
        zeros_copy = all(j < len(a.shape) and a.shape[j] == 0
                         for j, d in enumerate(target) if d == 0)
        if b.opset >= 14 and (not zeros_copy or b.rng.random() < 0.5):
            attrs["allowzero"] = 1
        elif not zeros_copy:
            return
    else:
        j = int(b.rng.integers(0, len(target)))
        if b.rng.random() < 0.5:
            target[j] = -1
        elif j < len(a.shape) and a.shape[j] == target[j] and b.rng.random() < 0.5:
            target[j] = 0  # copy the input dim
    b.node("Reshape", [a.name, b.const(np.array(target, I64))], [(a.dtype, tuple(shape))],
           **attrs)


def emit_slice(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    rank = len(a.shape)
    axes = sorted(int(x) for x in b.rng.choice(rank, size=int(b.rng.integers(1, rank + 1)),
                                               replace=False))
    starts, ends, steps, slices = [], [], [], [slice(None)] * rank
    for ax in axes:
        d = max(a.shape[ax], 1)
        step = int(b.rng.choice([1, 1, 2, -1]))
        if step > 0:
            s = int(b.rng.integers(-d, d))
            e = int(b.rng.choice([int(b.rng.integers(-d, d + 1)), d + 5]))
        else:
            s = int(b.rng.integers(0, d))
            e = int(b.rng.choice([int(b.rng.integers(0, s + 1)), -d - 1]))
        starts.append(s)
        ends.append(e)
        steps.append(step)
        slices[ax] = slice(s, e, step)
    shape = np.empty(a.shape)[tuple(slices)].shape
    if 0 in shape and 0 not in a.shape and not (b.profile.empty and b.rng.random() < 0.5):
        return  # zero-size tensors only where the profile asks for them
    axes = [x - rank if b.rng.random() < 0.3 else x for x in axes]
    args = [a.name, b.const(np.array(starts, I64)), b.const(np.array(ends, I64)),
            b.const(np.array(axes, I64)), b.const(np.array(steps, I64))]
    b.node("Slice", args, [(a.dtype, shape)])


def emit_concat(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = int(b.rng.integers(0, len(a.shape)))
    r = b.rng.random()
    if r < 0.3:
        other = a
    else:
        shape = list(a.shape)
        shape[axis] = b.dim(1, 4)
        other = b.new_input(tuple(shape), a.dtype) if r < 0.6 else b.weight(tuple(shape))
    out = list(a.shape)
    out[axis] += other.shape[axis]
    neg = axis - len(a.shape) if b.rng.random() < 0.3 else axis
    b.node("Concat", [a.name, other.name], [(a.dtype, tuple(out))], axis=neg)


def emit_unsqueeze_squeeze(b: Builder) -> None:
    ones = [v for v in b.pool if 1 in v.shape and v.dtype == b.fdt and not v.dynamic]
    if ones and b.rng.random() < 0.5:
        a = ones[-1]
        axes = [i for i, d in enumerate(a.shape) if d == 1]
        axes = axes[:int(b.rng.integers(1, len(axes) + 1))]
        shape = tuple(d for i, d in enumerate(a.shape) if i not in axes)
        b.node("Squeeze", [a.name, b.const(np.array(axes, I64))], [(a.dtype, shape)])
        return
    a = b.pick(lambda v: len(v.shape) <= 3)
    ax = int(b.rng.integers(0, len(a.shape) + 1))
    shape = a.shape[:ax] + (1,) + a.shape[ax:]
    neg = ax - len(shape) if b.rng.random() < 0.3 else ax
    b.node("Unsqueeze", [a.name, b.const(np.array([neg], I64))], [(a.dtype, shape)])


def emit_expand(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) <= 3)
    target = [int(b.rng.integers(2, 4)) if d == 1 and b.rng.random() < 0.7 else d
              for d in a.shape]
    if b.rng.random() < 0.3:
        target.insert(0, int(b.rng.integers(1, 3)))
    ask = [1 if (i >= len(target) - len(a.shape) and b.rng.random() < 0.3) else t
           for i, t in enumerate(target)]  # Expand also broadcasts a 1 in the shape input
    out = fb.bshape(a.shape, tuple(ask))
    b.node("Expand", [a.name, b.const(np.array(ask, I64))], [(a.dtype, out)])


def emit_flatten(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = int(b.rng.integers(-len(a.shape), len(a.shape) + 1))
    k = axis + len(a.shape) if axis < 0 else axis
    out = (fb.size(a.shape[:k]), fb.size(a.shape[k:]))
    b.node("Flatten", [a.name], [(a.dtype, out)], axis=axis)


def emit_shape_chain(b: Builder) -> None:
    """Shape -> Gather (or Shape(start, end)) -> Concat -> Reshape: keep a prefix of dims."""
    a = b.pick(lambda v: len(v.shape) >= 2 and 0 not in v.shape)
    rank = len(a.shape)
    j = int(b.rng.integers(1, rank))
    kept = a.shape[:j]
    if b.rng.random() < 0.5 or b.opset < 15:
        (s,) = b.node("Shape", [a.name], [(I64, (rank,))])
        (g,) = b.node("Gather", [s.name, b.const(np.arange(j, dtype=I64))], [(I64, (j,))],
                      axis=0)
    else:
        (g,) = b.node("Shape", [a.name], [(I64, (j,))], start=0, end=j)
    (t,) = b.node("Concat", [g.name, b.const(np.array([-1], I64))], [(I64, (j + 1,))], axis=0)
    b.node("Reshape", [a.name, t.name], [(a.dtype, kept + (fb.size(a.shape[j:]),))])


# ---- emitters: data-dependent (must fall back) ----------------------------------------------

def emit_nonzero(b: Builder) -> None:
    # float16: onnxruntime skips the rounding between its float16 ops (a Softmax's 6e-9
    # stays > 0 for the Greater), so the count, a shape, depends on it: exact values only
    a = b.pick(lambda v: len(v.shape) >= 1 and (v.dtype != np.float16 or v.rounding <= 1))
    (g,) = b.node("Greater", [a.name, b.const(np.array(0, a.dtype))], [(BOOL, a.shape)])
    (nz,) = b.node("NonZero", [g.name], [(I64, (len(a.shape), -1))])
    nz.dynamic = True
    if b.rng.random() < 0.5:
        (c,) = b.node("Cast", [nz.name], [(F32, nz.shape)], to=TensorProto.FLOAT)
        c.dynamic = True


def emit_topk(b: Builder) -> None:
    if b.profile.regime != "normal":
        return  # where NaN (also from inf - inf) sorts is unspecified
    a = b.pick(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    axis = int(b.rng.integers(0, len(a.shape)))
    k_in = Val(b.fresh("k"), I64, (1,))
    k = int(b.rng.integers(1, a.shape[axis] + 1))
    b.inputs.append(k_in)
    b.feeds[k_in.name] = np.array([k], I64)
    shape = a.shape[:axis] + (k,) + a.shape[axis + 1:]
    _, idx = b.node("TopK", [a.name, k_in.name], [(a.dtype, shape), (I64, shape)],
                    axis=axis, largest=int(b.rng.random() < 0.7))
    if not a.no_ties:  # tie order may legally differ: never an output, never used
        idx.dynamic = True
        b.used.add(idx.name)


Emitter = Callable[[Builder], None]
# (emitter, weight, group)
EMITTERS: list[tuple[Emitter, float, str]] = [
    (emit_unary, 4, "core"), (emit_binary, 4, "core"), (emit_where_cast_clip, 1.5, "core"),
    (emit_normalization, 1.2, "core"), (emit_transpose, 1, "core"), (emit_reshape, 1, "core"),
    (emit_slice, 1, "core"), (emit_concat, 0.8, "core"), (emit_unsqueeze_squeeze, 0.8, "core"),
    (emit_expand, 0.6, "core"), (emit_flatten, 0.4, "core"), (emit_shape_chain, 0.6, "core"),
    (emit_nonzero, 0.25, "core"), (emit_topk, 0.3, "core"),
    *fuzz_gen_edge.EMITTERS, *fuzz_gen_index.EMITTERS, *fuzz_gen_optional.EMITTERS,
    *fuzz_gen_ops.EMITTERS,
]


def build(rng: np.random.Generator, min_nodes: int = 2, max_nodes: int = 30,
          features: frozenset = ALL) -> Builder:
    """The builder of one random graph (every value's concrete shape is in b.vals)."""
    b = Builder(rng, fb.draw_profile(rng, features))
    target = int(rng.integers(min_nodes, max_nodes + 1))
    chosen = [(f, w) for f, w, group in EMITTERS if group in b.profile.groups]
    fns = [f for f, _ in chosen]
    weights = np.array([w for _, w in chosen])
    for _ in range(20 * max_nodes):  # emitters that do not fit the profile add nothing
        if len(b.nodes) >= target:
            break
        fns[int(rng.choice(len(fns), p=weights / weights.sum()))](b)
    if not fb.outputs(b):  # every value consumed (or hidden): a model needs an output
        emit_binary(b)
    return b


def generate(rng: np.random.Generator, min_nodes: int = 2, max_nodes: int = 30,
             features: frozenset = ALL) -> Case:
    """One random valid graph of min_nodes..max_nodes nodes (a little more at most) + feeds."""
    b = build(rng, min_nodes, max_nodes, features)
    shapes = {v.name: v.shape for v in fb.outputs(b) if not v.dynamic}
    return Case(fb.assemble(b), b.feeds, profile=b.profile, shapes=shapes)


def case_for(seed: int, index: int, features: frozenset = ALL) -> Case:
    """The index-th case of a run with `seed` (deterministic, independent of other cases)."""
    case = generate(np.random.default_rng([seed, index]), features=features)
    case.seed = (seed, index)
    return case
