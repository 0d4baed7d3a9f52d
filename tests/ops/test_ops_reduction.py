"""Reductions, ArgMax/ArgMin, CumSum, TopK and normalizations against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from support.op_harness import check_op, one_node_model, run_ort

from autoclust import ops
from autoclust.errors import ShapeInferenceError
from autoclust.ops import InferContext

RNG = np.random.default_rng(0)
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
# ops whose value at x <= 0 is NaN / not comparable: fed positive data
POSITIVE = ("ReduceLogSum",)


def rand(shape, dtype=np.float32, positive=False):
    if np.dtype(dtype).kind in "iu":
        lo = 1 if positive else -4
        return RNG.integers(lo, 5, size=shape).astype(dtype)
    x = RNG.standard_normal(shape)
    return np.asarray(np.abs(x) + 0.1 if positive else x).astype(dtype)


def axes(*a):
    return np.array(a, np.int64)


REDUCE_CASES = [  # (shape, axes or None, attrs)
    ((3, 4, 5), axes(1), {}),
    ((3, 4, 5), axes(0, 2), {"keepdims": 0}),
    ((3, 4, 5), axes(-1), {}),
    ((3, 4, 5), None, {}),
    ((3, 4, 5), None, {"keepdims": 0}),
    ((3, 4, 5), axes(), {"noop_with_empty_axes": 1}),
    ((3, 4, 5), axes(), {}),
    ((2, 1, 3), axes(1), {"keepdims": 0}),
    ((7,), axes(0), {"keepdims": 0}),
    ((), None, {}),
    ((2, 0, 3), axes(1), {}),
    ((2, 0, 3), axes(0), {"keepdims": 0}),
]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape,ax,attrs", REDUCE_CASES)
def test_reduce_float32(op, shape, ax, attrs):
    x = rand(shape, positive=op in POSITIVE)
    check_op(op, [x] if ax is None else [x, ax], attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_reduce_dtypes(op, dtype):
    x = rand((3, 4), dtype, positive=op in POSITIVE)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    check_op(op, [x, axes(1)], {}, rtol=tol, atol=tol)
    check_op(op, [x, axes(0)], {"keepdims": 0}, rtol=tol, atol=tol)


def test_reduce_int_mean_truncates_toward_zero():
    x = np.array([[3, -4], [-3, 0], [5, 0]], np.int32)
    got = check_op("ReduceMean", [x, axes(1)])[0]
    assert got.ravel().tolist() == [0, -1, 2]


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_nan_inf(op):
    x = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 2.0], [-np.inf, 3.0, 0.5],
                  [np.nan, 1.0, 0.0], [np.inf, -np.inf, 1.0]], np.float32)
    if op in ("ReduceMax", "ReduceMin"):
        # a NaN after the first element: onnxruntime skips it, the spec's NumPy semantics
        # (and the ONNX reference) give NaN, and so do we (test_reduce_max_min_nan_anywhere)
        x = x[1:]
    check_op(op, [x, axes(1)], rtol=1e-5)
    check_op(op, [x.T.copy(), axes(0)], {"keepdims": 0}, rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_reduce_max_min_nan_anywhere(op, dtype):
    # issue 24 item 5: a NaN in the middle of a float64 row gave a number
    from onnx.reference import ReferenceEvaluator
    x = np.array([[1, 2, np.nan, 3, 0], [np.nan, 1, 2, 3, 4], [1, 2, 3, 4, np.nan],
                  [1, 2, 3, 4, 5]], dtype)
    model = one_node_model(op, [x, axes(1)], {"keepdims": 0}, 1, 18, (1,))
    want = ReferenceEvaluator(model).run(None, {"in0": x})[0]
    got = ops.get(op).ref([x, axes(1)], {"keepdims": 0})[0]
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[:3]).all() and not np.isnan(got[3])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_reduce_max_min_small_ints(op, dtype):
    check_op(op, [rand((4, 5), dtype), axes(0, 1)], {"keepdims": 0})
    check_op(op, [np.zeros((2, 0), dtype), axes(1)])


def test_reduce_symbolic_and_runtime_axes():
    d = ops.get("ReduceSum")
    ctx = InferContext("ReduceSum", [np.dtype("float32"), np.dtype("int64")],
                       [("B", 4, "S"), (2,)], [None, np.array([0, -1])], {},
                       [True, True])
    assert d.infer(ctx) == [(np.dtype("float32"), (1, 4, 1))]
    ctx.values[1] = None  # axes only known at run time
    assert d.infer(ctx)[0][1] == (None, None, None)
    ctx.attrs = {"keepdims": 0}
    assert d.infer(ctx)[0][1] == (None,)


def test_reduce_bad_axis_raises():
    d, x = ops.get("ReduceSum"), rand((2, 3))
    with pytest.raises(ShapeInferenceError, match="out of range"):
        d.ref([x, axes(2)], {})
    ctx = InferContext("ReduceSum", [x.dtype, np.dtype("int64")], [x.shape, (1,)],
                       [None, axes(-3)], {}, [True, True], "n0")
    with pytest.raises(ShapeInferenceError, match="n0"):
        d.infer(ctx)


ARG_CASES = [((3, 4, 5), {"axis": 1}), ((3, 4, 5), {"axis": -1, "keepdims": 0}),
             ((3, 4, 5), {}), ((6,), {"keepdims": 0}), ((1, 4), {"axis": 0}),
             ((0, 3), {"axis": 1})]


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,attrs", ARG_CASES)
@pytest.mark.parametrize("last", [0, 1])
def test_arg(op, shape, attrs, last):
    x = RNG.integers(0, 3, size=shape).astype(np.float32)  # many ties
    check_op(op, [x], {**attrs, "select_last_index": last})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64, np.uint8])
def test_arg_dtypes(op, dtype):
    check_op(op, [rand((4, 5), dtype)], {"axis": 1})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_nan(op):
    x = np.array([[1, np.nan, 3], [np.nan, 1, 3], [3, np.nan, 1], [1, 2, np.nan],
                  [np.inf, -np.inf, 0]], np.float32)
    check_op(op, [x], {"axis": 1})
    check_op(op, [x.T.copy()], {"axis": 0, "keepdims": 0})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_nan_1d(op, last):
    # onnxruntime's 1-D path answers the first NaN ([1.27, nan] -> 1, fuzz 97/4831), its fold
    # of higher ranks (and select_last_index) skips a NaN after the first element
    for row in ([1.27, np.nan], [1, np.nan, 3, np.nan, 0], [3, 3, np.nan, 1], [np.nan, 1, 2],
                [np.inf, np.nan, 1], [2, 5, 5, 0]):
        x = np.array(row, np.float32)
        check_op(op, [x], {"axis": 0, "keepdims": 0, "select_last_index": last})
        check_op(op, [x[None]], {"axis": 1, "select_last_index": last})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_1d_float_compiles_with_the_first_nan(op):
    # onnxruntime's 1-D path answers the first NaN wherever it lies; compiled code adds a
    # first-NaN phase to its fold for a 1-D float input (torch's argmax() flattens to one)
    import autoclust
    for row in ([1, np.nan, 3, np.nan, 0], [np.inf, 2, np.nan], [np.nan, 5, 1], [2, 5, 5, 0],
                [-np.inf] * 3):
        for dtype in (np.float32, np.float16, np.float64):
            x = np.array(row, dtype)
            model = one_node_model(op, [x], {"axis": 0, "keepdims": 0}, 1, 13, ())
            sess = autoclust.InferenceSession(model, device="cpu", min_cluster_size=1,
                                              must_compile=True)
            np.testing.assert_array_equal(sess.run(None, {"in0": x})[0],
                                          run_ort(model, {"in0": x})[0], err_msg=str(row))
    x = np.array([1, np.nan, 3, np.nan, 0], np.float32)
    for y, attrs in ((x[None], {"axis": 1}), (x, {"axis": 0, "select_last_index": 1}),
                     (x.astype(np.int32), {"axis": 0})):  # the fold alone
        model = one_node_model(op, [y], attrs, 1, 13, ())
        sess = autoclust.InferenceSession(model, device="cpu", min_cluster_size=1,
                                          must_compile=True)
        np.testing.assert_array_equal(sess.run(None, {"in0": y})[0],
                                      run_ort(model, {"in0": y})[0])


CUMSUM_CASES = [((3, 4), 1, {}), ((3, 4), 0, {"exclusive": 1}), ((3, 4), -1, {"reverse": 1}),
                ((2, 3, 4), 1, {"exclusive": 1, "reverse": 1}), ((5,), 0, {}),
                ((0, 3), 1, {}), ((2, 1), 1, {"exclusive": 1})]


@pytest.mark.parametrize("shape,axis,attrs", CUMSUM_CASES)
@pytest.mark.parametrize("axis_dtype", [np.int32, np.int64])
def test_cumsum(shape, axis, attrs, axis_dtype):
    check_op("CumSum", [rand(shape), np.array(axis, axis_dtype)], attrs, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_cumsum_dtypes(dtype):
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check_op("CumSum", [rand((3, 50), dtype), np.array([1], np.int64)], {"reverse": 1},
             rtol=tol, atol=tol)


TOPK_CASES = [((3, 10), 4, {}), ((3, 10), 10, {"largest": 0}), ((4, 5, 6), 2, {"axis": 1}),
              ((4, 5, 6), 3, {"axis": 0, "largest": 0}), ((7,), 0, {}), ((2, 1), 1, {})]


@pytest.mark.parametrize("shape,k,attrs", TOPK_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_topk(shape, k, attrs, dtype):
    x = RNG.integers(0, 4, size=shape).astype(dtype)  # ties: lower index first
    check_op("TopK", [x, np.array([k], np.int64)], attrs, n_outputs=2)


def test_topk_nan_and_inf_go_where_onnxruntime_puts_them():
    x = np.array([[1, np.nan, 3, 3, -np.inf, np.inf]], np.float32)
    for largest in (0, 1):
        check_op("TopK", [x, np.array([6], np.int64)], {"largest": largest}, n_outputs=2)


def test_topk_unsorted_has_same_elements():
    x, k = rand((3, 12)), np.array([5], np.int64)
    model = one_node_model("TopK", [x, k], {"sorted": 0}, 2, 18, (1,))
    values, idx = run_ort(model, {"in0": x})
    ref_values, ref_idx = ops.get("TopK").ref([x, k], {"sorted": 0})
    np.testing.assert_array_equal(np.sort(values, axis=1), np.sort(ref_values, axis=1))
    np.testing.assert_array_equal(np.sort(idx, axis=1), np.sort(ref_idx, axis=1))


def test_topk_bad_k_raises():
    with pytest.raises(ShapeInferenceError, match="K=5"):
        ops.get("TopK").ref([rand((2, 4)), np.array([5], np.int64)], {})


# ---- normalizations --------------------------------------------------------------------

SOFTMAX_CASES = [((3, 5), {}), ((2, 3, 4), {"axis": 1}), ((2, 3, 4), {"axis": 0}),
                 ((6,), {}), ((2, 1), {}), ((0, 3), {})]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("shape,attrs", SOFTMAX_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_softmax_family(op, shape, attrs, dtype):
    if op == "Hardmax" and dtype == np.float64:
        pytest.skip("onnxruntime 1.31 has no float64 Hardmax kernel")
    tol = 2e-3 if dtype == np.float16 else 1e-5
    x = RNG.integers(-3, 3, size=shape).astype(dtype) if op == "Hardmax" else rand(shape, dtype)
    check_op(op, [x], attrs, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_inf(op):
    x = np.array([[0, np.inf, 1], [-np.inf, -np.inf, -np.inf], [-np.inf, 0, 1]], np.float32)
    check_op(op, [x])


LAYER_NORM_CASES = [((2, 3, 8), {}), ((2, 3, 8), {"axis": 1}), ((4, 6), {"epsilon": 1e-3}),
                    ((2, 3, 8), {"axis": -2}), ((5, 1), {})]


@pytest.mark.parametrize("shape,attrs", LAYER_NORM_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_layer_norm(shape, attrs, with_bias, dtype):
    axis = attrs.get("axis", -1) % len(shape)
    x, scale, bias = rand(shape, dtype), rand(shape[axis:], dtype), rand(shape[axis:], dtype)
    tol = 5e-3 if dtype == np.float16 else 1e-4
    inputs = [x, scale, bias] if with_bias else [x, scale]
    check_op("LayerNormalization", inputs, attrs, n_outputs=3, rtol=tol, atol=tol)


def test_batch_norm():
    for shape, dtype in (((2, 3, 4, 5), np.float32), ((4, 3), np.float64),
                         ((2, 3, 7), np.float16), ((1, 3, 2, 2, 2), np.float32)):
        c = shape[1]
        params = [rand(c, dtype), rand(c, dtype), rand(c, dtype), rand(c, dtype, positive=True)]
        tol = 5e-3 if dtype == np.float16 else 1e-5
        check_op("BatchNormalization", [rand(shape, dtype), *params], {"epsilon": 1e-3},
                 rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7), (1, 4, 2, 2, 3), (3, 2, 1)])
def test_instance_norm(shape):
    c = shape[1]
    check_op("InstanceNormalization", [rand(shape), rand(c), rand(c)], {"epsilon": 1e-4},
             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,groups", [((2, 4, 3), 2), ((2, 6, 2, 3), 3), ((1, 4, 5), 4),
                                           ((3, 4, 2, 2), 1)])
def test_group_norm(shape, groups):
    c = shape[1]
    check_op("GroupNormalization", [rand(shape), rand(c), rand(c)], {"num_groups": groups},
             opset=21, rtol=1e-4, atol=1e-4)


def test_group_norm_bad_groups():
    d = ops.get("GroupNormalization")
    f32 = np.dtype("float32")
    ctx = InferContext("GroupNormalization", [f32] * 3, [("N", 6, 4), (6,), (6,)],
                       [None] * 3, {"num_groups": 4}, [True] * 3, "gn")
    with pytest.raises(ShapeInferenceError, match="num_groups=4"):
        d.infer(ctx)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 4), 1), ((4,), 0)])
def test_lp_norm(p, shape, axis):
    x = rand(shape)
    x[..., 0] = 0  # all-zero slices along axis 0 when shape is 1-D... and a zero element
    check_op("LpNormalization", [x], {"p": p, "axis": axis}, rtol=1e-5)
    check_op("LpNormalization", [np.zeros(shape, np.float32)], {"p": p, "axis": axis})


@pytest.mark.parametrize("shape,attrs", [((2, 3, 4, 5), {}), ((2, 3, 4), {"axes": [1]}),
                                         ((2, 3, 4, 5), {"axes": [2, 3]}),
                                         ((3, 4), {"axes": [0, 1]})])
def test_mean_variance_norm(shape, attrs):
    check_op("MeanVarianceNormalization", [rand(shape)], attrs, rtol=1e-4, atol=1e-4)


# ---- the sign of a zero sum ------------------------------------------------------------

NEG_ZERO_CASES = [  # (shape, axes): onnxruntime keeps -0.0 over trailing axes only
    ((1,), [0]), ((5,), [0]), ((3, 1), [1]), ((3, 17), [1]), ((4, 1000), [1]),
    ((3, 4), [0, 1]), ((2, 1, 3), [1, 2]), ((2, 3, 4), [-1]),
    ((1, 3), [0]), ((2, 3, 1), [1]), ((3, 1, 4), [1]), ((2, 3, 4), [0]), ((2, 3, 4), [0, 2]),
    ((3, 0), [1]),
]


def _reciprocal_of_reduce(op: str, shape: tuple, ax: list, dtype) -> onnx.ModelProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = onnx.helper.make_graph(
        [onnx.helper.make_node(op, ["x", "axes"], ["s"], keepdims=0),
         onnx.helper.make_node("Reciprocal", ["s"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", elem, list(shape))],
        [onnx.helper.make_tensor_value_info("y", elem, None)],
        [onnx.numpy_helper.from_array(np.array(ax, np.int64), "axes")])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("shape,ax", NEG_ZERO_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_sum_of_negative_zeros_has_onnxruntimes_sign(op, shape, ax, dtype):
    # fuzz 121/2925: 1 / ReduceSum([-0.]) is -inf in onnxruntime (its sums over trailing
    # axes start from the row), +inf over leading or middle axes (they start from +0.0)
    import autoclust
    model = _reciprocal_of_reduce(op, shape, ax, dtype)
    feeds = {"x": np.full(shape, -0.0, dtype)}
    (want,) = run_ort(model, feeds)
    compiled = autoclust.InferenceSession(model.SerializeToString(), min_cluster_size=1,
                                          autotune=False)
    (got,) = compiled.run(None, feeds)
    if want.size:
        assert [c["kernels"] for c in compiled.stats()["clusters"]] == [[1]]
    (interpreted,) = autoclust.InferenceSession(model.SerializeToString(),
                                                device="interpreter").run(None, feeds)
    for side in (got, interpreted):
        np.testing.assert_array_equal(side, want)  # +-inf: the zero's sign
        assert side.dtype == want.dtype


@pytest.mark.parametrize("shape,ax", [((5,), [0]), ((4, 1000), [1]), ((2, 3, 4), [0])])
def test_sum_of_negative_zeros_on_the_gpus_kernels(monkeypatch, shape, ax):
    # the GPU backend's C-rendered reduction starts where the CPU's does (hostsim device)
    import autoclust
    from autoclust import registry
    monkeypatch.setitem(registry.BACKENDS, "gpu-sim", "support.gpu_sim_backend")
    model = _reciprocal_of_reduce("ReduceSum", shape, ax, np.float32)
    feeds = {"x": np.full(shape, -0.0, np.float32)}
    (want,) = run_ort(model, feeds)
    sess = autoclust.InferenceSession(model.SerializeToString(), device="gpu-sim",
                                      min_cluster_size=1)
    (got,) = sess.run(None, feeds)
    assert [c["kernels"] for c in sess.stats()["clusters"]] == [[1]]
    np.testing.assert_array_equal(got, want)
