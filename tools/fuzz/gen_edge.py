"""Fuzz emitters for numeric edge cases: reductions, MatMul, integer math, rounding.

  - emit_reduce: ReduceSum/Mean/Max in the core group; with the reduce group every ReduceX,
    on floats and ints, with explicit, absent or empty axes and noop_with_empty_axes;
  - emit_arg, emit_cumsum: ArgMax/ArgMin (select_last_index), CumSum exclusive/reverse;
  - emit_matmul: 1-D and batched operands, broadcast batch dims, K, M, N or batch of 0;
  - emit_int_arith: int32/int64 Add/Sub/Mul/Max/Min/Abs/Neg/Div/Mod (fmod 0 and 1); in
    error profiles a divisor holds a 0, where onnxruntime raises;
  - emit_rounding: one correctly rounded float16/float32 op (Add, Sub, Mul, Div) on values
    near integers, maybe through a view, into a rounding-sensitive consumer (Cast to int or
    float32, Floor/Ceil/Round, a comparison, ArgMax); out-of-range float->int Casts in the
    wide and special regimes.
Zero-size dims come from the profile (Builder.dim), so every emitter meets them.
"""

from __future__ import annotations

import numpy as np
from autoclust.tools.fuzz import values as fuzz_values
from autoclust.tools.fuzz.build import BOOL, ELEM, F16, F32, I32, I64, Builder, Val, bshape
from onnx import TensorProto

REDUCE_CLASSIC = ("ReduceSum", "ReduceMean", "ReduceMax")
REDUCE_ALL = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
REDUCE_INT = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceSumSquare")
COMPARE = ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual")


def int_input(b: Builder, shape: tuple[int, ...], dtype: np.dtype, lo: int = -20,
              hi: int = 21, zero_free: bool = False) -> Val:
    """A new int graph input with values in [lo, hi)."""
    values = fuzz_values.integers(b.rng, shape, dtype, lo, hi, zero_free)
    return b.new_input(shape, dtype, values)


# ---- reductions ---------------------------------------------------------------------------

def _reduce_axes(b: Builder, shape: tuple, as_input: bool) -> tuple[list[int] | None, int]:
    """(axes or None when absent, noop_with_empty_axes); [] means an empty axes input."""
    r, rank = b.rng.random(), len(shape)
    if rank and r < 0.65:
        n = int(b.rng.integers(1, rank + 1))
        axes = sorted(int(x) for x in b.rng.choice(rank, size=n, replace=False))
        # onnxruntime 1.31 ignores negative axes when the input is empty (its output keeps
        # the axis; test_fuzz_gen pins this): negative axes on non-empty inputs only.
        negative = 0.0 if 0 in shape else 0.3
        return [x - rank if b.rng.random() < negative else x for x in axes], 0
    noop = int(as_input and b.rng.random() < 0.6)
    return ([] if as_input and b.rng.random() < 0.5 else None), noop


def emit_reduce(b: Builder) -> None:
    full = "reduce" in b.profile.groups
    op = str(b.rng.choice(REDUCE_ALL if full else REDUCE_CLASSIC))
    dtype = b.fdt
    if full and op in REDUCE_INT and b.rng.random() < 0.25:
        dtype = I64 if b.rng.random() < 0.6 else I32
    a = b.pick(lambda v: full or len(v.shape) >= 1, dtype)
    rank = len(a.shape)
    as_input = op == "ReduceSum" or b.opset >= 18
    if full:
        axes, noop = _reduce_axes(b, a.shape, as_input)
    else:  # the classic mix: explicit axes only
        axes, _ = _reduce_axes(b, a.shape, as_input)
        axes, noop = axes or [int(b.rng.integers(rank))], 0
    keep = int(b.rng.random() < 0.5)
    if not axes and noop:
        shape = a.shape
    else:
        norm = {x % rank for x in axes} if axes else set(range(rank))
        shape = tuple(1 if i in norm else d for i, d in enumerate(a.shape)
                      if keep or i not in norm)
    attrs: dict = {"keepdims": keep}
    if noop or (as_input and b.rng.random() < 0.1):
        attrs["noop_with_empty_axes"] = noop
    ins = [a.name]
    if axes is not None and as_input:
        ins.append(b.const(np.array(axes, I64)))
    elif axes is not None and axes:
        attrs["axes"] = axes
    b.node(op, ins, [(dtype, shape)], **attrs)


def emit_arg(b: Builder) -> None:
    dtype = b.fdt if b.rng.random() < 0.75 else I64
    # A value one rounding away from exact data at most: the index has one right answer.
    a = b.pick(lambda v: len(v.shape) >= 1 and v.rounding <= 1, dtype)
    axis = int(b.rng.integers(-len(a.shape), len(a.shape)))
    if a.shape[axis] == 0 and not b.profile.errors:
        return  # onnxruntime raises on an empty axis: only in error profiles
    if 0 in a.shape:
        axis %= len(a.shape)  # onnxruntime 1.31 ignores a negative axis on empty inputs
    keep = int(b.rng.random() < 0.5)
    ax = axis % len(a.shape)
    shape = tuple(1 if i == ax else d for i, d in enumerate(a.shape) if keep or i != ax)
    op = "ArgMax" if b.rng.random() < 0.6 else "ArgMin"
    b.node(op, [a.name], [(I64, shape)], axis=axis, keepdims=keep,
           select_last_index=int(b.rng.random() < 0.3))


def emit_cumsum(b: Builder) -> None:
    dtype = b.fdt if b.rng.random() < 0.75 else I64
    if not b.has("CumSum", dtype):
        return
    a = b.pick(lambda v: len(v.shape) >= 1, dtype)
    axis = int(b.rng.integers(-len(a.shape), len(a.shape)))
    ax = b.const(np.array(axis, I64 if b.rng.random() < 0.7 else I32))
    b.node("CumSum", [a.name, ax], [(dtype, a.shape)], exclusive=int(b.rng.random() < 0.5),
           reverse=int(b.rng.random() < 0.4))


# ---- MatMul -------------------------------------------------------------------------------

def emit_matmul(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    k = a.shape[-1]
    n = b.dim(1, 7)
    r = b.rng.random()
    if len(a.shape) >= 2 and r < 0.3:  # batched: both operands are runtime tensors
        batch = list(a.shape[:-2])
        if batch and b.rng.random() < 0.3:
            batch[int(b.rng.integers(len(batch)))] = 1  # broadcast one batch dim
        w = b.new_input(tuple(batch) + (k, n))
    elif r < 0.4 and k:
        # matrix-vector: the last dim goes away. Not with K=0: onnxruntime 1.31 returns
        # uninitialized memory (or raises) for a vector operand of length 0.
        w = b.new_input((k,))
    else:
        w = b.weight((k, n), 1.0 / np.sqrt(max(k, 1)))
    x, y = (a, w)
    if len(a.shape) == 2 and r >= 0.4 and b.rng.random() < 0.15:
        x, y = b.new_input((n, a.shape[0])), a  # a as the right operand
    shape = np.matmul(np.zeros(x.shape, np.int8), np.zeros(y.shape, np.int8)).shape
    b.node("MatMul", [x.name, y.name], [(a.dtype, shape)])


# ---- integer arithmetic -------------------------------------------------------------------

def _divisor(b: Builder, shape: tuple[int, ...], dtype: np.dtype) -> Val:
    """Nonzero ints, or (error profiles, half the time) a tensor holding a 0."""
    if b.profile.errors and b.rng.random() < 0.5:
        v = int_input(b, shape, dtype, -3, 4)
        if b.feeds[v.name].size:
            b.feeds[v.name].flat[int(b.rng.integers(b.feeds[v.name].size))] = 0
        return v
    if b.rng.random() < 0.4:
        return b.const_val(np.array(int(b.rng.choice([2, 3, -2, 7, -5])), dtype))
    return int_input(b, shape, dtype, -7, 8, zero_free=True)


def emit_int_arith(b: Builder) -> None:
    dtype = I64 if b.rng.random() < 0.6 else I32
    a = b.pick(lambda v: True, dtype)
    r = b.rng.random()
    if r < 0.45:
        sub = a.shape[int(b.rng.integers(0, len(a.shape) + 1)):]
        d = _divisor(b, sub, dtype)
        op = "Div" if b.rng.random() < 0.5 else "Mod"
        attrs = {"fmod": int(b.rng.random() < 0.4)} if op == "Mod" else {}
        (out,) = b.node(op, [a.name, d.name], [(dtype, bshape(a.shape, d.shape))], **attrs)
    elif r < 0.8:
        c = b.partner(a)
        op = str(b.rng.choice(["Add", "Sub", "Mul", "Max", "Min"]))
        (out,) = b.node(op, [a.name, c.name], [(dtype, bshape(a.shape, c.shape))])
    else:
        (out,) = b.node(str(b.rng.choice(["Abs", "Neg"])), [a.name], [(dtype, a.shape)])
    if b.rng.random() < 0.4:  # back into float math
        b.node("Cast", [out.name], [(b.fdt, out.shape)], to=ELEM[b.fdt])


# ---- rounding-sensitive consumers ----------------------------------------------------------

def _rounded_operand(b: Builder) -> Val:
    """One correctly rounded op on values near integers (or an exact pool value)."""
    dt = b.fdt
    if b.rng.random() < 0.3:
        return b.pick(lambda v: v.rounding <= 1)
    shape = b.random_shape()
    x = b.new_input(shape, dt, fuzz_values.near_integers(b.rng, shape, dt))
    op = str(b.rng.choice(["Add", "Sub", "Mul", "Div"]))
    if op == "Div" or b.rng.random() < 0.5:
        c = float(b.rng.choice([100.0, 3.0, 7.0, 0.1, 0.025, -6.0, 10.0]))
        y = b.const_val(np.array(c if op != "Mul" else c / 64, dt))
    else:
        sub = shape[int(b.rng.integers(0, len(shape) + 1)):]
        y = b.new_input(sub, dt, fuzz_values.near_integers(b.rng, sub, dt))
    x, y = (x, y) if op == "Div" or b.rng.random() < 0.7 else (y, x)
    (out,) = b.node(op, [x.name, y.name], [(dt, bshape(x.shape, y.shape))])
    if len(out.shape) >= 2 and b.rng.random() < 0.4:  # a view in between
        perm = [int(p) for p in b.rng.permutation(len(out.shape))]
        (out,) = b.node("Transpose", [out.name], [(dt, tuple(out.shape[p] for p in perm))],
                        perm=perm)
    return out


def emit_rounding(b: Builder) -> None:
    if b.profile.regime != "normal" and b.rng.random() < 0.25:
        a = b.pick(lambda v: v.rounding <= 1)  # inf, NaN, 1e20 into Cast: out of range
        b.node("Cast", [a.name], [(I32, a.shape)], to=TensorProto.INT32)
        return
    a = _rounded_operand(b)
    r = b.rng.random()
    if r < 0.3:
        to = I32 if b.rng.random() < 0.5 else I64
        b.node("Cast", [a.name], [(to, a.shape)], to=ELEM[to])
    elif r < 0.45:
        wider, narrower = (F32, F16)
        to = wider if a.dtype == F16 else narrower
        (c,) = b.node("Cast", [a.name], [(to, a.shape)], to=ELEM[to])
        if to == F16:  # float32 -> float16 -> int: the first Cast must round
            b.node("Cast", [c.name], [(I32, a.shape)], to=TensorProto.INT32)
    elif r < 0.7:
        op = str(b.rng.choice(["Floor", "Ceil", "Round"]))
        b.node(op, [a.name], [(a.dtype, a.shape)])
    elif r < 0.9:
        c = float(b.rng.choice([-100.0, 0.0, 2.0, 10.0, 0.5]))
        op = str(b.rng.choice(COMPARE))
        b.node(op, [a.name, b.const(np.array(c, a.dtype))], [(BOOL, a.shape)])
    elif a.shape and 0 not in a.shape:
        axis = int(b.rng.integers(len(a.shape)))
        shape = a.shape[:axis] + a.shape[axis + 1:]
        b.node("ArgMax", [a.name], [(I64, shape)], axis=axis, keepdims=0)


EMITTERS = [
    (emit_reduce, 1.5, "core"), (emit_matmul, 1.0, "core"),
    (emit_arg, 0.6, "reduce"), (emit_cumsum, 0.6, "reduce"),
    (emit_int_arith, 1.2, "int"), (emit_rounding, 1.2, "round"),
]
