"""cuBLAS call planning (backends/gpu/gemm.py), checked on the host: each planned
gemmStridedBatchedEx call is run by gemm.emulate with cuBLAS's exact column-major
addressing (leading dimensions, operations, batch strides, offsets) and compared with NumPy.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from autoclust.backends.gpu import gemm, library

from autoclust.errors import CompileError
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(3)
SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
          ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (1, 5, 4, 2)),
          ((5, 3, 4), (1, 4, 2)), ((1, 3, 4), (6, 4, 2)), ((2, 3, 1, 3, 4), (3, 5, 4, 2)),
          ((0, 3, 4), (4, 5)), ((3, 0), (0, 5)), ((2, 3, 4), (1, 1, 4, 5)), ((3, 1, 4), (1, 4, 2))]


def run_plan(plan: gemm.GemmPlan, x: np.ndarray, y: np.ndarray, alpha: float = 1.0,
             c0: np.ndarray | None = None, beta: float = 0.0) -> np.ndarray:
    c = np.full(int(np.prod(plan.out_shape)), np.nan) if c0 is None else c0.ravel().copy()
    if plan.k == 0:
        c[:] = 0 if c0 is None else beta * c
    for call in plan.calls:
        gemm.emulate(call, x.ravel(), y.ravel(), c, alpha, beta)
    return c.reshape(plan.out_shape)


# FusedMatMul transposes only operands of rank >= 2
MATMULS = [(xs, ys, tx, ty) for xs, ys in SHAPES
           for tx, ty in itertools.product([False, True], repeat=2)
           if (len(xs) > 1 or not tx) and (len(ys) > 1 or not ty)]


@pytest.mark.parametrize("x_shape,y_shape,trans_x,trans_y", MATMULS)
def test_matmul_plan_matches_numpy(x_shape, y_shape, trans_x, trans_y):
    xe, ye = RNG.standard_normal(x_shape), RNG.standard_normal(y_shape)
    x = np.ascontiguousarray(np.swapaxes(xe, -1, -2) if trans_x else xe)  # as stored
    y = np.ascontiguousarray(np.swapaxes(ye, -1, -2) if trans_y else ye)
    plan = gemm.plan_matmul(x.shape, y.shape, trans_x, trans_y)
    want = np.matmul(xe, ye)
    assert plan.out_shape == want.shape
    np.testing.assert_allclose(run_plan(plan, x, y, alpha=0.5), 0.5 * want, atol=1e-12)


def test_plan_call_counts():
    assert len(gemm.plan_matmul((4, 128, 768), (768, 3072)).calls) == 1  # batch folded into M
    assert gemm.plan_matmul((4, 128, 768), (768, 3072)).calls[0].n == 512
    batched = gemm.plan_matmul((8, 12, 64, 32), (8, 12, 32, 64))
    assert len(batched.calls) == 1 and batched.calls[0].batch == 96
    assert len(gemm.plan_matmul((2, 1, 5, 3), (1, 4, 3, 6)).calls) == 2


@pytest.mark.parametrize("a_shape,b_shape,trans_a,trans_b", [
    ((3, 4), (4, 5), False, False), ((4, 3), (5, 4), True, True),
    ((2, 6, 4), (4, 5), False, False), ((2, 6, 4), (5, 4), False, True)])
def test_gemm_plan_with_bias(a_shape, b_shape, trans_a, trans_b):
    a, b = RNG.standard_normal(a_shape), RNG.standard_normal(b_shape)
    plan = gemm.plan_gemm(a_shape, b_shape, trans_a, trans_b)
    ae = a.T if trans_a else a
    be = b.T if trans_b else b
    bias = RNG.standard_normal(plan.out_shape[-1])
    c0 = np.broadcast_to(0.25 * bias, plan.out_shape)  # the pre-fill: beta * C
    got = run_plan(plan, a, b, alpha=2.0, c0=np.ascontiguousarray(c0), beta=1.0)
    np.testing.assert_allclose(got, 2.0 * (ae @ be) + 0.25 * bias, atol=1e-12)


def test_gemm_plan_refuses_transposed_batched_a():
    with pytest.raises(CompileError, match="transA"):
        gemm.plan_gemm((2, 4, 3), (4, 5), True, False)


def test_library_support_and_compute_types():
    assert library.supported("MatMul") is None
    assert "cuDNN" in library.supported("Conv")
    assert library.compute_type("float32", False) == library.COMPUTE_32F_PEDANTIC
    assert library.compute_type("float32", True) == library.COMPUTE_32F_FAST_TF32
    assert library.compute_type("float16", False) == library.COMPUTE_32F  # fp32 accumulate
    with pytest.raises(CompileError, match="cuDNN"):
        buf = {0: kir.Buffer(0, "x", "float32", (1, 1, 4, 4), "input"),
               1: kir.Buffer(1, "y", "float32", (1, 1, 4, 4), "output")}
        library.make_step(kir.LibraryCall("Conv", (0,), (1,), (), ("conv",)), buf, False)
