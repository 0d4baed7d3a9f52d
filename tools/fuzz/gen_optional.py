"""Fuzz emitters for what a held-out fuzzer found beyond the other groups (issue 24): optional
inputs left out next to extreme values, alpha/beta of 0, signed zeros through scans, scans
feeding reductions, indices longer than data off the axis, absurd shapes.

optional group:
  - emit_clip_bounds: Clip with only min, only max or neither, on the case's values (inf in
    the special regime): a missing bound is the dtype's lowest/max, so +inf becomes FLT_MAX;
  - emit_gemm: Gemm with alpha and beta from {0, 0.5, 1, 2}, transA/transB, C absent or of
    shape [N], [1, N], [M, 1] or [M, N], holding inf and NaN when beta is 0 (C is not read);
  - emit_signed_zero_scan: CumSum (exclusive, reverse) or ReduceSum over data holding -0.0,
    then Reciprocal, so the sign of a zero sum shows as -inf / +inf;
  - emit_scan_reduce: CumSum (axes of length 1 too) then ReduceMax/ReduceMin/ReduceSum with
    keepdims over the last axis (a kernel cannot hold a scan and a reduction);
  - emit_nan_rows: ReduceMax/ReduceMin over rows holding a NaN anywhere (it propagates);
  - in empty profiles, emit_empty_slice_of_concat: a Slice that empties a Concat's axis;
  - in error profiles, emit_elements_overhang: GatherElements with indices longer than the
    data on a non-axis dim, and emit_absurd_expand: Expand to a negative dim or past int64
    or memory; onnxruntime raises on both, and autoclust must raise naming the op.
"""

from __future__ import annotations

import numpy as np
from autoclust.tools.fuzz import values as fuzz_values
from autoclust.tools.fuzz.build import F32, I64, Builder
from autoclust.tools.fuzz.gen_index import _indices


def emit_clip_bounds(b: Builder) -> None:
    if b.profile.regime == "normal":
        a = b.pick()
    else:  # infinities where a missing bound matters
        shape = b.random_shape(int(b.rng.integers(1, 3)))
        x = fb_floats(b, shape)
        x[b.rng.random(shape) < 0.3] = np.inf
        x[b.rng.random(shape) < 0.2] = -np.inf
        a = b.new_input(shape, b.fdt, x)
    lo = b.const(np.array(b.rng.uniform(-2, 0), a.dtype))
    hi = b.const(np.array(b.rng.uniform(0, 2), a.dtype))
    args = [[a.name, lo], [a.name, "", hi], [a.name]][int(b.rng.integers(3))]
    b.node("Clip", args, [(a.dtype, a.shape)])


def emit_gemm(b: Builder) -> None:
    if b.fdt != F32:
        return
    m, k, n = b.dim(1, 5), b.dim(1, 5), b.dim(1, 5)
    trans_a, trans_b = (int(b.rng.random() < 0.3) for _ in range(2))
    x = b.new_input((k, m) if trans_a else (m, k))
    w = b.weight((n, k) if trans_b else (k, n), 0.5)
    alpha, beta = (float(b.rng.choice([0.0, 0.5, 1.0, 2.0])) for _ in range(2))
    ins = [x.name, w.name]
    if b.rng.random() < 0.8:
        shape = [(n,), (1, n), (m, 1), (m, n)][int(b.rng.integers(4))]
        c = b.rng.standard_normal(shape).astype(F32)
        if beta == 0.0 and c.size:  # never read: whatever it holds stays out
            c.flat[int(b.rng.integers(c.size))] = float(b.rng.choice([np.inf, np.nan]))
        if b.rng.random() < 0.5:
            v = b.new_input(shape, F32, c)
            v.dynamic = not np.isfinite(c).all()  # others (TopK) must not meet its NaN
            ins.append(v.name)
        else:
            ins.append(b.const(c))
    b.node("Gemm", ins, [(F32, (m, n))], alpha=alpha, beta=beta, transA=trans_a,
           transB=trans_b)


def emit_signed_zero_scan(b: Builder) -> None:
    if not b.has("CumSum", b.fdt):
        return
    shape = b.random_shape(int(b.rng.integers(1, 3)))
    zeros = np.where(b.rng.random(shape) < 0.7, -0.0, 0.0).astype(b.fdt)
    if zeros.size and b.rng.random() < 0.5:
        zeros.flat[int(b.rng.integers(zeros.size))] = float(b.rng.choice([1.0, -2.0]))
    x = b.new_input(shape, b.fdt, zeros)
    x.dynamic = True  # ties everywhere: not an operand of other emitters (TopK)
    axis = int(b.rng.integers(len(shape)))
    if b.rng.random() < 0.7:
        (s,) = b.node("CumSum", [x.name, b.const(np.array(axis, I64))], [(b.fdt, shape)],
                      exclusive=int(b.rng.random() < 0.4), reverse=int(b.rng.random() < 0.4))
    else:
        out = tuple(1 if i == axis else d for i, d in enumerate(shape))
        (s,) = b.node("ReduceSum", [x.name, b.const(np.array([axis], I64))], [(b.fdt, out)],
                      keepdims=1)
    b.node("Reciprocal", [s.name], [(b.fdt, s.shape)])


def emit_scan_reduce(b: Builder) -> None:
    if not b.has("CumSum", b.fdt) or b.opset < 18:
        return
    a = b.pick(lambda v: len(v.shape) >= 1)
    rank = len(a.shape)
    axis = rank - 1 if b.rng.random() < 0.6 else int(b.rng.integers(rank))
    (c,) = b.node("CumSum", [a.name, b.const(np.array(axis, I64))], [(a.dtype, a.shape)],
                  reverse=int(b.rng.random() < 0.5), exclusive=int(b.rng.random() < 0.3))
    if 0 in a.shape and not b.profile.errors:
        return  # ReduceMax over nothing: only where the profile allows raising feeds
    op = str(b.rng.choice(["ReduceMax", "ReduceMin", "ReduceSum"]))
    shape = a.shape[:-1] + (1,)
    b.node(op, [c.name, b.const(np.array([-1], I64))], [(a.dtype, shape)], keepdims=1)


def emit_nan_rows(b: Builder) -> None:
    if b.opset < 18:
        return
    rows, n = int(b.rng.integers(1, 4)), int(b.rng.choice([2, 5, 17, 40]))
    x = b.rng.standard_normal((rows, n)).astype(b.fdt)
    x[int(b.rng.integers(rows)), int(b.rng.integers(n))] = np.nan
    v = b.new_input((rows, n), b.fdt, x)
    v.dynamic = True  # its NaN stays in this reduction (TopK's NaN order is unspecified)
    op = str(b.rng.choice(["ReduceMax", "ReduceMin"]))
    b.node(op, [v.name, b.const(np.array([1], I64))], [(b.fdt, (rows,))], keepdims=0)


def emit_empty_slice_of_concat(b: Builder) -> None:
    """Concat along an axis, then a Slice that leaves that axis empty (the empty output's
    probe lowered the Concat over a loop of extent 0)."""
    if not b.profile.empty:
        return
    a = b.pick(lambda v: len(v.shape) >= 2 and 0 not in v.shape)
    axis = int(b.rng.integers(len(a.shape)))
    out = list(a.shape)
    out[axis] *= 2
    (c,) = b.node("Concat", [a.name, a.name], [(a.dtype, tuple(out))], axis=axis - len(out))
    start, end, step = [(0, 0, 1), (2 ** 62, 2 ** 62, 1), (0, 2 ** 62, -1)][int(b.rng.integers(3))]
    out[axis] = 0
    args = [c.name] + [b.const(np.array([v], I64)) for v in (start, end, axis, step)]
    b.node("Slice", args, [(a.dtype, tuple(out))])


def emit_elements_overhang(b: Builder) -> None:
    if not b.profile.errors:
        return
    a = b.pick(lambda v: len(v.shape) >= 2)
    ax = int(b.rng.integers(len(a.shape)))
    other = int(b.rng.choice([i for i in range(len(a.shape)) if i != ax]))
    ishape = tuple(a.shape[i] + (int(b.rng.integers(1, 3)) if i == other else 0)
                   for i in range(len(a.shape)))
    idx = b.const(_indices(b, ishape, a.shape[ax]) if a.shape[ax] else np.zeros(ishape, I64))
    (g,) = b.node("GatherElements", [a.name, idx], [(a.dtype, ishape)], axis=ax)
    b.node("Add", [g.name, g.name], [(a.dtype, ishape)])


def emit_absurd_expand(b: Builder) -> None:
    if not b.profile.errors:
        return
    a = b.new_input((1, 1))
    big = [[2 ** 20, 2 ** 20], [2 ** 31, 2 ** 31], [-1, 4], [2 ** 62, 4]]
    target = big[int(b.rng.integers(len(big)))]
    # a shape nobody can hold: no other emitter reads it (dynamic), Relu makes it a buffer
    (e,) = b.node("Expand", [a.name, b.const(np.array(target, I64))], [(a.dtype, (1, 1))])
    e.dynamic = True
    (r,) = b.node("Relu", [e.name], [(a.dtype, (1, 1))])
    r.dynamic = True


EMITTERS = [
    (emit_clip_bounds, 0.8, "optional"), (emit_gemm, 0.8, "optional"),
    (emit_signed_zero_scan, 0.6, "optional"), (emit_scan_reduce, 0.6, "optional"),
    (emit_nan_rows, 0.4, "optional"), (emit_elements_overhang, 0.6, "optional"),
    (emit_absurd_expand, 0.3, "optional"), (emit_empty_slice_of_concat, 0.4, "optional"),
]


def fb_floats(b: Builder, shape: tuple[int, ...]) -> np.ndarray:
    """Random floats of the case's dtype and regime (a writable copy)."""
    return np.array(fuzz_values.floats(b.rng, shape, b.fdt, b.profile.regime))
