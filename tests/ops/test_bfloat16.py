"""bfloat16 storage with float32 math in compiled clusters (issue 12 part 7).

onnxruntime's CPU provider has no bfloat16 kernels except Cast, so a bfloat16 model runs on
a CPU only through compiled code. The oracle is still onnxruntime: `emulated(model)` is
the same graph in float32 with every bfloat16 result rounded through onnxruntime's own
Cast(float -> bfloat16 -> float) right where it is produced, which is what "stored as
bfloat16, computed in float32" means (onnxruntime's CUDA bfloat16 kernels compute so too).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support.bfloat16 import (
    BF,
    BF16,
    EDGE,
    UNARY,
    F,
    model,
    ort_plain,
    ort_reference,
)

import autoclust
from autoclust.errors import NotCompilableError


def compiled(m, feeds, **flags):
    sess = autoclust.InferenceSession(m.SerializeToString(), must_compile=True,
                                      min_cluster_size=1, **flags)
    return sess, sess.run(None, feeds)


def assert_matches(got, want, ulps=0):
    """Equal to the reference, NaN where it has NaN; `ulps` bfloat16 steps allowed where
    float32 transcendental results may differ by an ulp before rounding."""
    got = got.astype(np.float32) if got.dtype == BF16 else got
    if ulps == 0:
        np.testing.assert_array_equal(got, want)
        return
    np.testing.assert_allclose(got, want, rtol=ulps * 2.0 ** -7, atol=1e-30)




def test_float_to_bfloat16_rounds_like_onnxruntime_cast():
    # ties to even (1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6), NaN, inf, overflow to inf,
    # denormals, -0.0: compiled Cast -> Relu-free path -> back to float
    m = model([helper.make_node("Cast", ["x"], ["a"], to=BF),
               helper.make_node("Identity", ["a"], ["b"]),
               helper.make_node("Cast", ["b"], ["y"], to=F)],
              [("x", F, [None])], [("y", F, [None])])
    feeds = {"x": EDGE}
    sess, (got,) = compiled(m, feeds)
    (want,) = ort_reference(m, feeds)
    assert_matches(got, want)
    assert len(sess.plan.clusters) == 1
    # and the same as ml_dtypes' conversion, bit for bit (NaN aside)
    ours = EDGE.astype(BF16).astype(np.float32)
    np.testing.assert_array_equal(got, ours)
    assert np.signbit(got[EDGE == 0]).tolist() == np.signbit(EDGE[EDGE == 0]).tolist()


@pytest.mark.parametrize("target", [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32,
                                    TensorProto.INT64, TensorProto.BOOL, TensorProto.INT8])
def test_casts_from_bfloat16(target):
    m = model([helper.make_node("Cast", ["x"], ["y"], to=target)],
              [("x", BF, [None])], [("y", target, [None])])
    x = np.array([1.5, -2.75, 0.0, -0.0, 300.0, -129.0, 1e-39, 70000.0, 1e20], np.float32)
    feeds = {"x": x.astype(BF16)}
    _, (got,) = compiled(m, feeds)
    # onnxruntime casts bfloat16 itself (Cast is its one bfloat16 kernel): the plain model
    want = ort_plain(m, feeds)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("source", [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT32,
                                    TensorProto.INT64, TensorProto.BOOL])
def test_casts_to_bfloat16(source):
    m = model([helper.make_node("Cast", ["x"], ["y"], to=BF)],
              [("x", source, [None])], [("y", BF, [None])])
    dtype = helper.tensor_dtype_to_np_dtype(source)
    raw = np.array([1.5, -2.75, 0.0, 257.0, 259.0, -129.0, 16777217.0, 1, 3], np.float64)
    with np.errstate(over="ignore"):  # 16777217 -> float16 inf, on purpose
        x = raw.astype(dtype) if dtype != np.bool_ else raw != 0
    feeds = {"x": x}
    _, (got,) = compiled(m, feeds)
    want = ort_plain(m, feeds)
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def _unary(op, **attrs):
    return [helper.make_node("Cast", ["x"], ["a"], to=BF),
            helper.make_node(op, ["a"], ["b"], **attrs),
            helper.make_node("Cast", ["b"], ["y"], to=F)]




@pytest.mark.parametrize("op", UNARY)
def test_unary_ops_in_bfloat16(op):
    attrs, ulps = UNARY[op]
    m = model(_unary(op, **attrs), [("x", F, [4, 5])], [("y", F, [4, 5])])
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 5)) * 3).astype(np.float32)
    x.flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-39]
    feeds = {"x": x}
    _, (got,) = compiled(m, feeds)
    (want,) = ort_reference(m, feeds)
    assert_matches(got, want, ulps)


def test_binary_chain_rounds_after_every_op():
    # (a*b + a) / (b - 3) with bfloat16 inputs and output: a rounding skipped anywhere
    # (float32 kept across two ops) changes the last bits of many elements
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]),
             helper.make_node("Add", ["m", "a"], ["s"]),
             helper.make_node("Sub", ["b", "three"], ["d"]),
             helper.make_node("Div", ["s", "d"], ["q"]),
             helper.make_node("Max", ["q", "a"], ["y"])]
    three = onnx.numpy_helper.from_array(np.array(3.0, BF16), "three")
    m = model(nodes, [("a", BF, [64, 33]), ("b", BF, [1, 33])], [("y", BF, [64, 33])],
              [three])
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((64, 33)).astype(BF16),
             "b": (rng.standard_normal((1, 33)) * 5).astype(BF16)}
    sess, (got,) = compiled(m, feeds)
    (want,) = ort_reference(m, feeds)
    assert got.dtype == BF16 and got.shape == (64, 33)
    assert_matches(got, want)
    assert len(sess.plan.clusters) == 1
    # without the per-op rounding the answer differs: the test can tell
    wide = {k: v.astype(np.float32) for k, v in feeds.items()}
    unrounded = np.maximum((wide["a"] * wide["b"] + wide["a"]) / (wide["b"] - 3), wide["a"])
    assert not np.array_equal(unrounded.astype(BF16).astype(np.float32), want)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
def test_reductions_accumulate_in_float32(op):
    # a bfloat16 accumulator would lose the 1s added to 256 (bfloat16 has 8 bits)
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    m = model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)],
              [("x", BF, [3, 300])], [("y", BF, [3])], [axes])
    x = np.ones((3, 300), np.float32)
    x[0, 0] = 256.0
    x[1, 7] = np.nan
    x[2] = np.linspace(-4, 4, 300)
    feeds = {"x": x.astype(BF16)}
    _, (got,) = compiled(m, feeds)
    (want,) = ort_reference(m, feeds)
    if op in ("ReduceMax", "ReduceMin"):  # the NaN propagates (onnxruntime skips it)
        want = np.array(want)
        want[1] = np.nan
    assert_matches(got, want, ulps=1 if op == "ReduceMean" else 0)
    if op == "ReduceSum":
        assert float(got[0]) == 556.0  # 256 + 299 ones, exact in float32, rounded once


def test_softmax_and_layernorm_in_bfloat16():
    scale = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 48).astype(BF16), "scale")
    bias = onnx.numpy_helper.from_array(np.linspace(-1, 1, 48).astype(BF16), "bias")
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=-1),
             helper.make_node("Softmax", ["n"], ["y"], axis=-1)]
    m = model(nodes, [("x", BF, [2, 8, 48])], [("y", BF, [2, 8, 48])], [scale, bias])
    x = np.random.default_rng(2).standard_normal((2, 8, 48)).astype(BF16)
    sess, (got,) = compiled(m, {"x": x})
    (want,) = ort_reference(m, {"x": x})
    assert_matches(got, want, ulps=2)
    assert len(sess.plan.clusters) == 1


def test_layout_ops_move_bfloat16_bits_unchanged():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "t"], ["c"], axis=0),
             helper.make_node("Slice", ["c", "starts", "ends"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "starts"),
             onnx.numpy_helper.from_array(np.array([7], np.int64), "ends")]
    m = model(nodes, [("x", BF, [3, 4])], [("y", BF, [6, 3])], inits)
    x = EDGE[:12].reshape(3, 4).astype(BF16)
    _, (got,) = compiled(m, {"x": x})
    want = np.concatenate([x.T, x.T])[1:7]
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_matmul_in_bfloat16_is_refused_with_a_reason():
    # no library call takes bfloat16 and onnxruntime's CPU provider has no bfloat16 MatMul
    m = model([helper.make_node("MatMul", ["a", "b"], ["y"])],
              [("a", BF, [2, 3]), ("b", BF, [3, 2])], [("y", BF, [2, 2])])
    with pytest.raises(NotCompilableError, match="MatMul.*dtype bfloat16 of input 'a' not "
                       "supported"):
        autoclust.InferenceSession(m.SerializeToString(), must_compile=True)


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_small_bfloat16_cluster_is_kept_at_default_flags(device):
    # 3 weight units < min_cluster_size=4 would normally go to onnxruntime, which cannot
    # run Relu/Softmax in bfloat16 (the model would not load): clustering keeps it
    m = model(_unary("Relu")[:2] + [helper.make_node("Softmax", ["b"], ["c"]),
                                      helper.make_node("Cast", ["c"], ["y"], to=F)],
              [("x", F, [2, 4])], [("y", F, [2, 4])])
    x = np.array([[1, -2, 3.3, 0.5], [np.nan, 0, 0, 0]], np.float32)
    sess = autoclust.InferenceSession(m.SerializeToString(), device=device)
    assert len(sess.plan.clusters) == 1 and not sess.plan.reasons
    (got,) = sess.run(None, {"x": x})
    (want,) = ort_reference(m, {"x": x})
    # the interpreter rounds inside Softmax too (NumPy on bfloat16 arrays): 2 steps
    assert_matches(got, want, ulps=0 if device == "cpu" else 2)
    assert np.isnan(got[1]).all()
