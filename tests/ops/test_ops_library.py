"""MatMul, Gemm, Conv, ConvTranspose, pooling and Einsum against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from support.op_harness import check_op

from autoclust import ops
from autoclust.errors import ShapeInferenceError
from autoclust.ops import InferContext

RNG = np.random.default_rng(1)
TOL = {"rtol": 1e-4, "atol": 1e-4}


def rand(*shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-3, 4, size=shape).astype(dtype)
    return np.asarray(RNG.standard_normal(shape)).astype(dtype)


MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                 ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((1, 4), (2, 4, 3)),
                 ((3, 0), (0, 2)), ((0, 3), (3, 2)), ((1, 1), (1, 1))]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul(sa, sb):
    check_op("MatMul", [rand(*sa), rand(*sb)], **TOL)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_matmul_dtypes(dtype):
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check_op("MatMul", [rand(2, 3, 16, dtype=dtype), rand(16, 5, dtype=dtype)], rtol=tol,
             atol=tol)


def _ctx(op, shapes, attrs=None, dtype="float32"):
    n = len(shapes)
    return InferContext(op, [np.dtype(dtype)] * n, shapes, [None] * n, attrs or {},
                        [True] * n, "n0")


def test_matmul_symbolic_and_errors():
    d = ops.get("MatMul")
    assert d.infer(_ctx("MatMul", [("B", "S", 8), (8, 16)]))[0][1] == ("B", "S", 16)
    assert d.infer(_ctx("MatMul", [("S", 8), ("B", 8, "T")]))[0][1] == ("B", "S", "T")
    with pytest.raises(ShapeInferenceError, match="inner dims"):
        d.infer(_ctx("MatMul", [(3, 4), (5, 6)]))
    with pytest.raises(ShapeInferenceError, match="batch dims"):
        d.infer(_ctx("MatMul", [(2, 3, 4), (3, 4, 6)]))


GEMM_CASES = [({}, (3, 4), (4, 5), (3, 5)), ({"transA": 1}, (4, 3), (4, 5), (5,)),
              ({"transB": 1, "alpha": 0.5, "beta": 2.0}, (3, 4), (5, 4), (3, 1)),
              ({"transA": 1, "transB": 1}, (4, 3), (5, 4), None), ({}, (3, 4), (4, 5), ()),
              ({"beta": 0.0}, (1, 4), (4, 1), (1, 1)), ({}, (0, 4), (4, 5), (5,))]


@pytest.mark.parametrize("attrs,sa,sb,sc", GEMM_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm(attrs, sa, sb, sc, dtype):
    inputs = [rand(*sa, dtype=dtype), rand(*sb, dtype=dtype)]
    if sc is not None:
        inputs.append(rand(*sc, dtype=dtype))
    check_op("Gemm", inputs, attrs, **TOL)


CONV_CASES = [  # (x shape, w shape, attrs)
    ((1, 2, 7), (3, 2, 3), {}),
    ((2, 3, 8, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 8, 9), (4, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 4, 9, 9), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1]}),
    ((1, 4, 9, 9), (4, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 8, 7), (3, 2, 2, 4), {"auto_pad": "SAME_LOWER"}),
    ((1, 2, 8, 7), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 2, 5, 4, 6), (2, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
    ((2, 3, 1, 1), (5, 3, 1, 1), {}),
    ((0, 3, 5, 5), (2, 3, 3, 3), {}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, attrs, bias):
    inputs = [rand(*xs), rand(*ws)] + ([rand(ws[0])] if bias else [])
    check_op("Conv", inputs, attrs, **TOL)


@pytest.mark.parametrize("dtype", [np.float16])  # onnxruntime 1.31 has no float64 Conv
def test_conv_dtypes(dtype):
    tol = 2e-2
    check_op("Conv", [rand(1, 3, 6, 6, dtype=dtype), rand(2, 3, 3, 3, dtype=dtype),
                      rand(2, dtype=dtype)], {"pads": [1, 1, 1, 1]}, rtol=tol, atol=tol)


def test_conv_errors():
    d = ops.get("Conv")
    with pytest.raises(ShapeInferenceError, match="input channels"):
        d.infer(_ctx("Conv", [(1, 3, 5, 5), (2, 4, 3, 3)]))
    with pytest.raises(ShapeInferenceError, match="spatial"):
        d.infer(_ctx("Conv", [(1, 3, 5), (2, 3, 3, 3)]))


CONVT_CASES = [
    ((1, 2, 5), (2, 3, 3), {}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2]}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                  "output_padding": [1, 1]}),
    ((1, 4, 3, 3), (4, 1, 2, 2), {"group": 2, "dilations": [2, 2]}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 8]}),
    # output_shape past the full result (negative pads): ONNX test_convtranspose_output_shape
    ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),
    ((1, 2, 4, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 3, 2), (2, 1, 2, 2, 2), {"strides": [1, 2, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(xs, ws, attrs, bias):
    m = ws[1] * attrs.get("group", 1)
    inputs = [rand(*xs), rand(*ws)] + ([rand(m)] if bias else [])
    check_op("ConvTranspose", inputs, attrs, **TOL)


POOL_CASES = [
    ((1, 2, 9), {"kernel_shape": [3]}),
    ((2, 3, 8, 9), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 3, 8, 9), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1],
                    "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "VALID", "strides": [2, 1]}),
    ((1, 2, 4, 5, 6), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2]}),
    ((1, 1, 1, 1), {"kernel_shape": [1, 1]}),
]


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_max_pool(xs, attrs):
    x = RNG.integers(-5, 5, size=xs).astype(np.float32)  # ties: first maximum wins
    check_op("MaxPool", [x], attrs, n_outputs=2)


@pytest.mark.parametrize("xs,attrs", POOL_CASES[1:5])
def test_max_pool_dilations_storage_order(xs, attrs):
    check_op("MaxPool", [rand(*xs)], {**attrs, "dilations": [2, 1]}, n_outputs=2)
    check_op("MaxPool", [rand(*xs)], {**attrs, "storage_order": 1}, n_outputs=2)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int8, np.uint8])
def test_max_pool_dtypes(dtype):
    x = RNG.integers(0, 100, size=(1, 2, 6, 6)).astype(dtype)
    check_op("MaxPool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(xs, attrs, include_pad):
    check_op("AveragePool", [rand(*xs)], {**attrs, "count_include_pad": include_pad}, **TOL)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("xs", [(2, 3, 4, 5), (1, 2, 7), (2, 1, 2, 3, 4), (3, 2, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])  # no float64 kernel in ORT
def test_global_pool(op, xs, dtype):
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_op(op, [rand(*xs, dtype=dtype)], rtol=tol, atol=tol)


EINSUM_CASES = [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
                ("ij->ji", [(3, 4)]), ("ii->i", [(4, 4)]), ("ij->", [(3, 4)]),
                ("i,j->ij", [(3,), (4,)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
                ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]), ("ij,jk", [(3, 4), (4, 2)]),
                ("...i->...", [(2, 3, 4)]), ("i,i->", [(5,), (5,)])]


@pytest.mark.parametrize("eq,shapes", EINSUM_CASES)
def test_einsum(eq, shapes):
    check_op("Einsum", [rand(*s) for s in shapes], {"equation": eq}, opset=18, **TOL)


def test_einsum_int_and_symbolic():
    check_op("Einsum", [rand(3, 4, dtype=np.int64), rand(4, 2, dtype=np.int64)],
             {"equation": "ij,jk->ik"})
    d = ops.get("Einsum")
    ctx = _ctx("Einsum", [("B", 3, 4), (4, "K")], {"equation": "...ij,jk->...ik"})
    assert d.infer(ctx)[0][1] == ("B", 3, "K")
    with pytest.raises(ShapeInferenceError, match="label 'j'"):
        d.infer(_ctx("Einsum", [(3, 4), (5, 2)], {"equation": "ij,jk->ik"}))


def test_einsum_unknown_output_label_raises():
    with pytest.raises(ShapeInferenceError, match="appear in no input"):
        ops.get("Einsum").infer(_ctx("Einsum", [(3, 4)], {"equation": "ij->iz"}))


def test_pool_requires_kernel_shape():
    with pytest.raises(ShapeInferenceError, match="kernel_shape"):
        ops.get("MaxPool").infer(_ctx("MaxPool", [(1, 2, 4, 4)]))


def _conv_loops(x: np.ndarray, w: np.ndarray, pads: list[int]) -> np.ndarray:
    """Conv (stride 1, group 1) as the spec's sum per window, in float64, rounded once."""
    x64 = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    m, _, kh, kw = w.shape
    oh, ow = x64.shape[2] - kh + 1, x64.shape[3] - kw + 1
    y = np.empty((x.shape[0], m, oh, ow))
    with np.errstate(all="ignore"):
        for i in range(oh):
            for j in range(ow):
                win = x64[:, None, :, i:i + kh, j:j + kw] * w.astype(np.float64)[None]
                y[:, :, i, j] = win.reshape(win.shape[0], m, -1).sum(axis=-1)
    return y.astype(x.dtype)


@pytest.mark.parametrize("seed", range(6))
def test_conv_reference_sums_windows_of_extremes_exactly(seed):
    """Windows of products near 1e38 beside an inf: summed in float32 (the reference's
    BLAS im2col before) partial sums overflowed to +inf and -inf and gave NaN where the
    exact sum is inf or -inf, as onnxruntime gave (fuzz 130/1004)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 6, 5, 8)).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, 24, replace=False)] = 1e20 * rng.choice([-1, 1], 24)
    x.reshape(-1)[rng.choice(x.size, 3, replace=False)] = [np.inf, -np.inf, np.inf]
    w = rng.standard_normal((2, 6, 3, 3)).astype(np.float32)
    w.reshape(-1)[rng.choice(w.size, 12, replace=False)] = 1e18 * rng.choice([-1, 1], 12)
    got = ops.get("Conv").ref([x, w], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})[0]
    want = _conv_loops(x, w, [1, 1, 1, 1])
    # NaN and the infinities exactly; finite sums to the float64 rounding of 1e38 products
    # (their cancellations depend on the order even in float64)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isposinf(got), np.isposinf(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e24)



# ceil_mode windows that would start in the right padding: onnxruntime drops them, as our
# rule does (ONNX shape inference keeps them: importers/onnx/load._pools_by_onnxruntime)
CEIL_POOLS = [
    ((1, 2, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1],
                    "ceil_mode": 1}),
    ((1, 2, 4), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
    ((1, 2, 5, 3), {"kernel_shape": [2, 3], "strides": [2, 3], "pads": [0, 0, 1, 2],
                    "ceil_mode": 1}),
]


@pytest.mark.parametrize("xs,attrs", CEIL_POOLS)
def test_ceil_mode_pools_drop_windows_starting_in_the_pad(xs, attrs):
    x = rand(*xs)
    check_op("MaxPool", [x], attrs, n_outputs=2)
    for include_pad in (0, 1):
        check_op("AveragePool", [x], {**attrs, "count_include_pad": include_pad}, **TOL)
