"""MatMul, Gemm and FusedMatMul as cuBLAS strided-batched GEMM calls (planned without a GPU).

cuBLAS is column-major; our arrays are row-major. A row-major matrix seen column-major is
its transpose, so C = X @ Y (row-major, [M, K] @ [K, N]) is computed as
C^T = Y^T @ X^T: cuBLAS's A is our Y, its B our X, with m = N, n = M and ldc = N.

    plan_matmul((8, 12, 64, 32), (8, 12, 32, 64))  ->  one call, batch 96
    plan_matmul((4, 128, 768), (768, 3072))         ->  one call, X's batch folded into M
    plan_matmul((2, 1, 5, 3), (1, 4, 3, 6))         ->  2 calls (one per X batch) of batch 4

A GemmCall holds everything cuBLAS's gemmStridedBatchedEx takes except pointers and
types; `emulate` runs one in NumPy with cuBLAS's exact addressing, so tests check the
planning on the host (tests/gpu/test_gpu_gemm.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from autoclust.errors import CompileError

OP_N, OP_T = 0, 1  # cublasOperation_t


@dataclasses.dataclass(frozen=True)
class GemmCall:
    """C[c_off + stride_c*b] = alpha * op(A) op(B) + beta * C for b < batch, column-major,
    where cuBLAS's A is the right operand Y (at y_off) and its B the left operand X."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    batch: int
    y_off: int = 0   # element offsets of this call's first matrices
    x_off: int = 0
    c_off: int = 0


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    calls: tuple[GemmCall, ...]
    out_shape: tuple[int, ...]
    k: int           # the contraction length (0: the product is all zeros)


def _batch_strides(batch: tuple[int, ...], matrix: int) -> list[int]:
    """Element strides of the batch dims of a contiguous [*batch, r, c] array (0 where the
    dim is 1, so it broadcasts)."""
    strides, step = [], matrix
    for d in reversed(batch):
        strides.append(0 if d == 1 else step)
        step *= d
    return strides[::-1]


def plan_matmul(x_shape: tuple[int, ...], y_shape: tuple[int, ...], trans_x: bool = False,
                trans_y: bool = False) -> GemmPlan:
    """Calls computing matmul(op(x), op(y)) (numpy semantics: 1-D operands, broadcasting)
    into a contiguous output."""
    x_shape, y_shape = tuple(x_shape), tuple(y_shape)
    xs = (1,) + x_shape if len(x_shape) == 1 else x_shape
    ys = y_shape + (1,) if len(y_shape) == 1 else y_shape
    m, k = (xs[-1], xs[-2]) if trans_x else (xs[-2], xs[-1])
    k2, n = (ys[-1], ys[-2]) if trans_y else (ys[-2], ys[-1])
    if k != k2:
        raise CompileError(f"MatMul inner dims differ: {x_shape} @ {y_shape}")
    rank = max(len(xs), len(ys)) - 2
    xb = (1,) * (rank - len(xs) + 2) + xs[:-2]
    yb = (1,) * (rank - len(ys) + 2) + ys[:-2]
    batch = tuple(b if a == 1 else a for a, b in zip(xb, yb))
    out = batch + ((m,) if len(x_shape) > 1 else ()) + ((n,) if len(y_shape) > 1 else ())
    lda = k if trans_y else n
    ldb = m if trans_x else k
    ta, tb = (OP_T if trans_y else OP_N), (OP_T if trans_x else OP_N)
    if any(d == 0 for d in out) or m == 0 or n == 0:
        return GemmPlan((), out, k)
    if not trans_x and all(d == 1 for d in yb):  # fold X's batch into M: one plain GEMM
        rows = math.prod(xb) * m
        call = GemmCall(ta, tb, n, rows, k, lda, k, n, 0, 0, 0, 1)
        return GemmPlan((call,), out, k)
    sx, sy = _batch_strides(xb, m * k), _batch_strides(yb, k * n)
    sc = _batch_strides(batch, m * n)
    split = _uniform_suffix(xb, yb, batch)
    inner = math.prod(batch[split:])
    stride_x = m * k if any(d > 1 for d in xb[split:]) else 0
    stride_y = k * n if any(d > 1 for d in yb[split:]) else 0
    calls = []
    for idx in itertools.product(*(range(d) for d in batch[:split])):
        x_off = sum(i * s for i, s in zip(idx, sx))
        y_off = sum(i * s for i, s in zip(idx, sy))
        c_off = sum(i * s for i, s in zip(idx, sc))
        calls.append(GemmCall(ta, tb, n, m, k, lda, ldb, n, stride_y, stride_x, m * n, inner,
                              y_off, x_off, c_off))
    return GemmPlan(tuple(calls), out, k)


def _uniform_suffix(xb: tuple, yb: tuple, batch: tuple) -> int:
    """The first batch dim from which on each operand is either the full batch or
    broadcast over all of it (so one strided call covers those dims)."""
    for split in range(len(batch) + 1):
        ok = True
        for ob in (xb, yb):
            tail, full = ob[split:], batch[split:]
            if not (tail == full or all(d == 1 for d in tail)):
                ok = False
        if ok:
            return split
    return len(batch)


def plan_gemm(a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: bool,
              trans_b: bool) -> GemmPlan:
    """ONNX Gemm (A [M, K] or a bias-folded MatMul's [..., K]; B 2-D)."""
    if len(a_shape) > 2:
        if trans_a:
            raise CompileError(f"Gemm with transA on a {len(a_shape)}-D A")
        flat = (math.prod(a_shape[:-1]), a_shape[-1])
        p = plan_matmul(flat, tuple(b_shape), False, trans_b)
        return GemmPlan(p.calls, tuple(a_shape[:-1]) + (p.out_shape[-1],), p.k)
    return plan_matmul(tuple(a_shape), tuple(b_shape), trans_a, trans_b)


# ---- the reference for tests: cuBLAS's addressing in NumPy --------------------------------

def _matrix(flat: np.ndarray, off: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The column-major rows x cols matrix at flat[off] with leading dimension ld."""
    i = np.arange(rows)[:, None]
    j = np.arange(cols)[None, :]
    return flat[off + i + j * ld]


def emulate(call: GemmCall, x: np.ndarray, y: np.ndarray, c: np.ndarray, alpha: float = 1.0,
            beta: float = 0.0) -> None:
    """Run `call` on flat arrays (x, y inputs; c output) exactly as cuBLAS would."""
    for b in range(call.batch):
        ya = call.y_off + b * call.stride_a
        xb = call.x_off + b * call.stride_b
        cc = call.c_off + b * call.stride_c
        a = (_matrix(y, ya, call.m, call.k, call.lda) if call.transa == OP_N
             else _matrix(y, ya, call.k, call.m, call.lda).T)
        bm = (_matrix(x, xb, call.k, call.n, call.ldb) if call.transb == OP_N
              else _matrix(x, xb, call.n, call.k, call.ldb).T)
        i = np.arange(call.m)[:, None]
        j = np.arange(call.n)[None, :]
        old = c[cc + i + j * call.ldc] if beta else 0.0
        c[cc + i + j * call.ldc] = alpha * (a @ bm) + beta * old
