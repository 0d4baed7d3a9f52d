"""Edge cases a held-out differential fuzzer found (issue 8, repros A-K), and the cases where
the ONNX spec is silent and autoclust does what onnxruntime does.

Each case is a small model run compiled (must_compile, every node in a cluster) and by
onnxruntime on the same inputs: outputs must agree exactly in dtype and shape, and in
value within a tight tolerance; where onnxruntime raises, autoclust must raise a clear
autoclust error too.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import autoclust
from autoclust.errors import AutoclustError

F32, F16, I32, I64 = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32,
                      TensorProto.INT64)


def model(nodes: list, inputs: list, outputs: list, inits: tuple = (), opset: int = 18
          ) -> onnx.ModelProto:
    """A model from (name, elem type, shape) inputs/outputs and onnx.helper nodes."""
    g = helper.make_graph(
        nodes, "edge", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def const(name: str, value) -> TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(value), name)


def run_both(m: onnx.ModelProto, feeds: dict, **flags) -> tuple[list, list]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    flags = {"must_compile": True, "min_cluster_size": 1, **flags}
    sess = autoclust.InferenceSession(m, **flags)
    got = sess.run(None, feeds)
    assert sess.plan.clusters and not sess.plan.reasons, sess.explain()
    assert all(c["fallback"] is None for c in sess.stats()["clusters"]), sess.stats()
    return got, want


def assert_same(got: list, want: list, rtol: float = 1e-6, atol: float = 0.0) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def check(m: onnx.ModelProto, feeds: dict, rtol: float = 1e-6, atol: float = 0.0) -> list:
    got, want = run_both(m, feeds)
    assert_same(got, want, rtol, atol)
    return got


# ---- A: noop_with_empty_axes applies the elementwise part --------------------------------

@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                                "ReduceSum", "ReduceMax", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes", ["absent", "empty"])
def test_a_noop_with_empty_axes(op, axes):
    ins = ["x"] if axes == "absent" else ["x", "axes"]
    inits = () if axes == "absent" else (const("axes", np.zeros(0, np.int64)),)
    m = model([helper.make_node(op, ins, ["y"], noop_with_empty_axes=1)],
              [("x", F32, [2, 3])], [("y", F32, None)], inits)
    x = np.array([[-1.5, 2.0, 0.25], [3.0, -4.0, 0.5]], np.float32)
    got = check(m, {"x": x}, rtol=1e-6)
    assert got[0].shape == (2, 3)


# ---- B, H: reductions over a zero-length axis -------------------------------------------

@pytest.mark.parametrize("op,dtype", [("ReduceMax", I64), ("ReduceMin", I64), ("ReduceMax", F32),
                                      ("ReduceSum", F32), ("ReduceProd", I32),
                                      ("ReduceL1", F32), ("ReduceMean", F32)])
def test_b_reduce_over_empty_axis_gives_identity(op, dtype):
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    m = model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
              [("x", dtype, [0, 5])], [("y", dtype, None)], (const("axes", [0]),))
    for _ in range(3):  # stale memory would differ from run to run
        got = check(m, {"x": np.zeros((0, 5), np_type)})
    assert got[0].shape == (1, 5)


def test_h_per_row_store_beside_empty_reduction():
    """Add(ReduceL1(x over an empty axis), -40): a non-empty per-row result of a kernel
    whose inner loop has no iterations must still be written."""
    m = model([helper.make_node("ReduceL1", ["x", "axes"], ["r"], keepdims=1),
               helper.make_node("Add", ["r", "c"], ["y"])],
              [("x", F32, [5, 0, 7])], [("y", F32, None)],
              (const("axes", [1]), const("c", np.float32(-40))))
    got = check(m, {"x": np.zeros((5, 0, 7), np.float32)})
    assert (got[0] == -40).all() and got[0].shape == (5, 1, 7)


# ---- GE, C, D, E, J: zero sizes and small index tensors ----------------------------------

def test_ge_gather_elements_indices_smaller_than_data():
    m = model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=-2)],
              [("x", F32, [5, 3]), ("i", I64, [1, 1])], [("y", F32, None)])
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    got = check(m, {"x": x, "i": np.array([[4]], np.int64)})
    assert got[0].tolist() == [[12.0]]


@pytest.mark.parametrize("a_shape,b_shape", [((2, 0), (0, 3)), ((0, 4), (4, 3)),
                                             ((0, 2, 4), (4, 3)), ((2, 2, 0), (2, 0, 3))])
def test_c_matmul_with_zero_size_dims(a_shape, b_shape):
    m = model([helper.make_node("MatMul", ["a", "b"], ["y"])],
              [("a", F32, list(a_shape)), ("b", F32, list(b_shape))], [("y", F32, None)])
    check(m, {"a": np.ones(a_shape, np.float32), "b": np.ones(b_shape, np.float32)})


@pytest.mark.parametrize("exclusive,reverse", [(1, 0), (0, 1), (1, 1), (0, 0)])
@pytest.mark.parametrize("shape", [(3, 0), (3, 5)])
def test_d_cumsum(exclusive, reverse, shape):
    m = model([helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive,
                                reverse=reverse)],
              [("x", F32, list(shape))], [("y", F32, None)], (const("axis", np.int64(1)),))
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    check(m, {"x": x})


@pytest.mark.parametrize("mode", ["reflect", "edge", "constant"])  # ort 1.31 lacks "wrap"
def test_e_pad_with_unpadded_zero_dim(mode):
    m = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)],
              [("x", F32, [0, 3])], [("y", F32, None)],
              (const("pads", np.array([0, 1, 0, 1], np.int64)),), opset=19)
    got = check(m, {"x": np.zeros((0, 3), np.float32)})
    assert got[0].shape == (0, 5)


def test_j_zero_size_mul_then_flatten():
    m = model([helper.make_node("Mul", ["x", "x"], ["m"]),
               helper.make_node("Flatten", ["m"], ["y"], axis=1)],
              [("x", F32, [1, 0, 2])], [("y", F32, None)])
    assert check(m, {"x": np.zeros((1, 0, 2), np.float32)})[0].shape == (1, 0)


def test_j_reduce_prod_then_concat_with_empty_inputs():
    m = model([helper.make_node("ReduceProd", ["x", "axes"], ["p"], keepdims=1),
               helper.make_node("Concat", ["p", "e"], ["y"], axis=0)],
              [("x", F32, [3, 4]), ("e", F32, [0, 4])], [("y", F32, None)],
              (const("axes", [0]),))
    x = np.linspace(0.5, 2, 12, dtype=np.float32).reshape(3, 4)
    check(m, {"x": x, "e": np.zeros((0, 4), np.float32)}, rtol=1e-6)


@pytest.mark.parametrize("dtype", [F32, TensorProto.FLOAT16])
def test_j_reduce_prod_of_extremes_in_different_lanes_is_not_nan(dtype):
    """A row of 80 holding 1.4e-43 and 1e-25 sixteen apart (one lane of the vectorized
    product: 0) and 1.75e20 and 4.6e18 sixteen apart (another lane: inf): in float32 the
    lanes' product was NaN where the exact product (-4e-53) rounds to -0.0. Accumulated in
    float64 and rounded once it is -0.0, the spec's answer. onnxruntime's own product runs
    in vector lanes too: NaN for this row, -0.0 for the fuzz's (129/1505, whose order kept
    its lanes apart), so the exact product is the reference here. (float16 rows, computed
    in float32 anyway, check the same path.)"""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.5, (16, 5)) * np.where(rng.random((16, 5)) < 0.5, -1, 1)
    tiny, small, huge = (1.43e-43, 1.03e-25, 3.5e-24), (6e-8, 1e-4, 2e-4), (1.75e20, 4.6e18)
    if dtype == F32:  # flat positions 0 and 16, 2; 3 and 19
        x[0, 0], x[3, 1], x[0, 2] = tiny
        x[0, 3], x[3, 4] = huge
    else:
        x[0, 0], x[3, 1], x[0, 2] = small
        x[0, 3], x[3, 4] = 6e4, 3e4
    x = x.astype(np_type)
    m = model([helper.make_node("ReduceProd", ["x"], ["y"], keepdims=1)],
              [("x", dtype, [16, 5])], [("y", dtype, None)])
    got, _ = run_both(m, {"x": x})
    exact = np.prod(x.astype(np.float64)).astype(np_type)
    assert got[0].shape == (1, 1) and got[0].dtype == np_type
    assert not np.isnan(got[0]).any() and got[0][0, 0] == exact, (got, exact)
    assert np.signbit(got[0][0, 0]) == np.signbit(exact)


# ---- G, I, K: numerics --------------------------------------------------------------------

def test_g_layernorm_over_a_row_holding_1e20():
    m = model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)],
              [("x", F32, [2, 4])], [("y", F32, None)],
              (const("s", np.ones(4, np.float32)), const("b", np.zeros(4, np.float32))))
    x = np.array([[1e20, 1, 2, 3], [1, 2, 3, 4]], np.float32)
    # onnxruntime's float32 square of 7.5e19 overflows (it returns the bias, 0); the exact
    # statistics give the true normalized row (issue 24 item 6)
    sess = autoclust.InferenceSession(m, min_cluster_size=1, must_compile=True)
    got = sess.run(None, {"x": x})[0]
    xd = x.astype(np.float64)
    mu = xd.mean(-1, keepdims=True)
    want = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", [135, 2])
def test_g_layernorm_of_a_nested_row_as_accurate_as_onnxruntime(seed):
    """An edge Pad to [8, 6, 5, 9], then a LayerNorm of the whole tensor whose bias varies
    along the 5: the row stays a loop nest whose last axis (9) is shorter than a vector,
    and its float32 sums ran 240 terms down each lane: 25-3700 float32 steps off in the
    normalized values (fuzz 135/2871). onnxruntime sums in float64 and is within half a
    step; so are we now (float64 statistics for such rows)."""
    m = model([helper.make_node("Pad", ["x", "p"], ["xp"], mode="edge"),
               helper.make_node("LayerNormalization", ["xp", "s", "b"], ["y"], axis=0,
                                epsilon=0.01)],
              [("x", F32, [4, 3, 2, 6])], [("y", F32, None)],
              (const("p", np.array([1, 3, 2, 3, 3, 0, 1, 0], np.int64)),
               const("s", np.ones((1, 1, 1, 1), np.float32)),
               const("b", np.zeros((1, 1, 5, 1), np.float32))))
    x = np.random.default_rng(seed).standard_normal((4, 3, 2, 6)).astype(np.float32)
    got, want = run_both(m, {"x": x})
    xd = np.pad(x.astype(np.float64), [(1, 3), (3, 0), (2, 1), (3, 0)], mode="edge")
    exact = (xd - xd.mean()) / np.sqrt(xd.var() + np.float64(np.float32(0.01)))
    step = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert (np.abs(want[0] - exact) / step).max() <= 0.5        # onnxruntime
    assert (np.abs(got[0] - exact) / step).max() <= 0.5


def test_i_softplus_far_below_zero():
    m = model([helper.make_node("Softplus", ["x"], ["y"])], [("x", F32, [6])],
              [("y", F32, None)])
    x = np.array([-20, -17.5, -30, -87, 30, 100], np.float32)
    got = check(m, {"x": x}, rtol=2e-6)
    assert got[0][0] == pytest.approx(2.0611537e-09, rel=1e-5)


def test_k_float16_rounds_before_a_cast_to_int():
    """fp16 Sub -> Transpose -> Cast(int32): 0.00234 - 100 rounds to -100 in float16."""
    m = model([helper.make_node("Sub", ["a", "b"], ["d"]),
               helper.make_node("Transpose", ["d"], ["t"], perm=[1, 0]),
               helper.make_node("Cast", ["t"], ["y"], to=I32)],
              [("a", F16, [1, 2]), ("b", F16, [1, 2])], [("y", I32, None)])
    a = np.array([[0.00234, 7.3]], np.float16)
    b = np.array([[100, 2]], np.float16)
    assert check(m, {"a": a, "b": b})[0].ravel().tolist() == [-100, 5]


def check_reference(m: onnx.ModelProto, feeds: dict) -> list:
    """Compiled outputs equal the ONNX reference implementation's, exactly."""
    from onnx.reference import ReferenceEvaluator
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    got = sess.run(None, feeds)
    assert_same(got, ReferenceEvaluator(m).run(None, feeds))
    return got


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round"])
def test_k_float16_rounds_before_floor_ceil_round(op):
    """Every float16 result is rounded to float16 (the ONNX reference semantics). onnxruntime
    agrees wherever it runs an op in float16 (the Transpose above); a chain of ops it has no
    float16 CPU kernels for (Mul -> Floor) runs in float32 after its cast insertion, so
    there it can differ by one float16 step: 14.46 * 5.047 rounds to 73, floor 73; ort 72."""
    m = model([helper.make_node("Mul", ["a", "b"], ["p"]), helper.make_node(op, ["p"], ["y"])],
              [("a", F16, [64]), ("b", F16, [64])], [("y", F16, None)])
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(64) * 30).astype(np.float16)
    b = (rng.standard_normal(64) * 3).astype(np.float16)
    got = check_reference(m, {"a": a, "b": b})
    if op == "Floor":
        assert got[0][16] == 73.0


def test_k_float16_rounds_before_comparisons():
    m = model([helper.make_node("Add", ["a", "b"], ["s"]),
               helper.make_node("Less", ["s", "c"], ["y"])],
              [("a", F16, [3]), ("b", F16, [3]), ("c", F16, [3])],
              [("y", TensorProto.BOOL, None)])
    a = np.array([1024, 2048, 1], np.float16)
    b = np.array([0.75, 1.5, 0.25], np.float16)  # 1024.75 -> 1025 in fp16, 2049.5 -> 2050
    c = np.array([1025, 2050, 1.5], np.float16)
    # unrounded sums would compare [True, True, True]
    assert check_reference(m, {"a": a, "b": b, "c": c})[0].tolist() == [False, False, True]


# ---- where the spec is silent: as onnxruntime ----------------------------------------------

@pytest.mark.parametrize("op", ["Div", "Mod"])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_integer_division_by_zero_raises(op, dtype):
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    m = model([helper.make_node(op, ["a", "b"], ["y"])],
              [("a", dtype, [3]), ("b", dtype, [3])], [("y", dtype, None)])
    ok = {"a": np.array([7, -7, 9], np_type), "b": np.array([2, 3, -4], np_type)}
    check(m, ok)
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    bad = {"a": ok["a"], "b": np.array([2, 0, 1], np_type)}
    with pytest.raises(AutoclustError, match=f"{op}.*by zero"):
        sess.run(None, bad)
    with pytest.raises(Exception, match="by zero"):  # onnxruntime raises too
        ort.InferenceSession(m.SerializeToString()).run(None, bad)


@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_integer_division_by_zero_raises_with_an_empty_dividend(op):
    # nothing is computed, but onnxruntime checks the divisor all the same
    m = model([helper.make_node(op, ["a", "b"], ["y"]),
               helper.make_node("Add", ["y", "y"], ["z"])],
              [("a", I32, ["n", 3]), ("b", I32, [3])], [("z", I32, None)])
    empty = np.zeros((0, 3), np.int32)
    check(m, {"a": empty, "b": np.array([2, 3, -4], np.int32)})
    bad = {"a": empty, "b": np.array([2, 0, 1], np.int32)}
    with pytest.raises(Exception, match="by zero"):
        ort.InferenceSession(m.SerializeToString()).run(None, bad)
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    with pytest.raises(AutoclustError, match=f"{op}.*by zero"):
        sess.run(None, bad)
    assert sess.stats()["clusters"][0]["kernels"] == [0]  # checked, nothing computed


def both_raise(m: onnx.ModelProto, feeds: dict, ort_match: str, ours_match: str) -> None:
    """onnxruntime and the compiled model both raise on `feeds` (ours an AutoclustError)."""
    with pytest.raises(Exception, match=ort_match):
        ort.InferenceSession(m.SerializeToString()).run(None, feeds)
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    with pytest.raises(AutoclustError, match=ours_match):
        sess.run(None, feeds)


def test_an_out_of_range_index_raises_behind_an_empty_result():
    # the empty Add computes nothing, but onnxruntime runs the GatherElements it reads and
    # rejects the index; the probe of the empty root gave up where the Gather's data (a
    # Relu) needed a buffer, so the index check was lost (fuzz 93/2324)
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("GatherElements", ["r", "i"], ["g"], axis=0),
               helper.make_node("Add", ["g", "e"], ["y"])],
              [("x", F32, [2, 4]), ("i", I32, [1, 4]), ("e", F32, ["n", 4])],
              [("y", F32, None)])
    x, empty = np.arange(-4, 4, dtype=np.float32).reshape(2, 4), np.zeros((0, 4), np.float32)
    check(m, {"x": x, "i": np.array([[1, 0, -2, -1]], np.int32), "e": empty})
    both_raise(m, {"x": x, "i": np.array([[1, 2, 0, 0]], np.int32), "e": empty},
               "Out of range value in index", r"GatherElements.*index out of range \[-2, 1\]")


def test_an_empty_gather_of_an_empty_computed_value_checks_its_indices():
    # the Gather's data, an empty Reshape, only counts as a buffer while the empty root is
    # probed: materializing it gave a buffer no thunk touched, a hole in the ids the
    # executable binds densely (IndexError, fuzz 95/79); the index check still runs
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("Reshape", ["r", "s"], ["z"], allowzero=1),
               helper.make_node("Gather", ["z", "i"], ["y"], axis=-1)],
              [("x", F32, [1, 0, 1]), ("i", I64, [1, 1])], [("y", F32, None)],
              (const("s", np.array([0, 1])),))
    x = np.zeros((1, 0, 1), np.float32)
    assert check(m, {"x": x, "i": np.array([[-1]])})[0].shape == (0, 1, 1)
    both_raise(m, {"x": x, "i": np.array([[5]])}, "out of data bounds",
               r"Gather.*index out of range \[-1, 0\]")


def test_a_constant_index_out_of_range_raises_behind_an_empty_result():
    # the Gather's data is empty and its indices constant: the probe of the empty root saw
    # the constant fail its check, refused, and nothing checked it; onnxruntime rejects it
    # on every run (fuzz 122/1108), so compiling it raises, naming the node and the value
    for shape in ([5, 0, 2], [5, 1, 2]):
        m = model([helper.make_node("Tanh", ["x"], ["t"]),
                   helper.make_node("Gather", ["t", "i"], ["y"], axis=-1)],
                  [("x", F32, shape)], [("y", F32, None)], (const("i", np.array([-3, 0])),))
        both_raise(m, {"x": np.zeros(shape, np.float32)}, "out of data bounds",
                   r"Gather.*index out of range \[-2, 1\] in input 'i' \(constant, holds -3\)")


def test_an_index_check_behind_an_empty_pad_runs():
    # a reflect Pad cannot be lowered on its empty domain, so the probe of it found no
    # checks, and the Gather before it returned nothing for an index out of range
    # (fuzz 122/1699); the probe now takes the checks of the empty values Pad reads
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("Gather", ["r", "i"], ["g"], axis=2),
               helper.make_node("Pad", ["g", "pads"], ["y"], mode="reflect")],
              [("x", F32, [1, 0, 2]), ("i", I32, [3])], [("y", F32, None)],
              (const("pads", np.array([0, 0, 1, 0, 0, 1])),))
    x = np.zeros((1, 0, 2), np.float32)
    assert check(m, {"x": x, "i": np.array([1, 0, -1], np.int32)})[0].shape == (1, 0, 5)
    both_raise(m, {"x": x, "i": np.array([9, 0, -1], np.int32)}, "out of data bounds",
               r"Gather.*index out of range \[-2, 1\]")


UNREAD_TAILS = {  # what reads the Gather's empty [0, 1, 1] result: none of its elements
    "concat-slice": [helper.make_node("Concat", ["g", "g"], ["c"], axis=-1),
                     helper.make_node("Slice", ["c", "far", "far", "two"], ["y"])],
    "pad": [helper.make_node("Pad", ["g", "pads"], ["y"])],
    "concat-pad": [helper.make_node("Concat", ["g", "g"], ["c"], axis=0),
                   helper.make_node("Pad", ["c", "pads"], ["y"])],
    "slice-concat": [helper.make_node("Slice", ["g", "far", "far", "two"], ["c"]),
                     helper.make_node("Concat", ["c", "c"], ["y"], axis=2)],
}


@pytest.mark.parametrize("tail", UNREAD_TAILS)
@pytest.mark.parametrize("fed", [False, True])
def test_an_index_check_no_reader_reaches_runs(tail, fed):
    """A Gather whose index is out of range, its result read by nothing: an empty Concat
    sliced past its end, a Pad of an empty tensor (all fill). The readers' lowerings never
    reached the Gather, so its check never ran and the model answered (fuzz 135/4731);
    onnxruntime raises, and so do we now (the Gather is computed on its own)."""
    inits = [const("far", np.array([2 ** 62])), const("two", np.array([2])),
             const("pads", np.array([1, 0, 0, 0, 0, 0]))]
    ins = [("x", F32, [1, 1, 1])]
    if fed:
        ins.append(("i", I64, [1]))
    else:
        inits.append(const("i", np.array([-2])))
    m = model([helper.make_node("Slice", ["x", "s0", "e0", "ax0", "st0"], ["s"]),
               helper.make_node("Gather", ["s", "i"], ["g"], axis=-2)] + UNREAD_TAILS[tail],
              ins, [("y", F32, None)],
              [const("s0", np.array([1, 0])), const("e0", np.array([0, 7])),
               const("ax0", np.array([0, 1])), const("st0", np.array([-1, 2]))] + inits)
    feeds = {"x": np.ones((1, 1, 1), np.float32)} | ({"i": np.array([-2])} if fed else {})
    both_raise(m, feeds, "out of data bounds|out of bounds",
               r"Gather.*index out of range \[-1, 0\]")


def test_an_index_check_behind_a_concat_piece_no_reader_reaches_runs():
    """Non-empty: a Slice keeps the second piece of a Concat, and the first is a Gather
    whose index is out of range; a Pad that crops an axis away reads nothing of its
    input. Neither reads the Gather, which still raises, as in onnxruntime."""
    for tail in ([helper.make_node("Concat", ["g", "x"], ["c"], axis=1),
                  helper.make_node("Slice", ["c", "one", "big", "one"], ["y"])],
                 [helper.make_node("Pad", ["g", "crop"], ["y"])]):
        m = model([helper.make_node("Gather", ["x", "i"], ["g"], axis=1)] + tail,
                  [("x", F32, [2, 3]), ("i", I64, [2])], [("y", F32, None)],
                  [const("one", np.array([1])), const("big", np.array([9])),
                   const("crop", np.array([0, -2, 0, 1]))])
        both_raise(m, {"x": np.ones((2, 3), np.float32), "i": np.array([0, 5])},
                   "out of data bounds|out of bounds", r"Gather.*index out of range")


def test_an_empty_tile_of_an_empty_where_runs():
    # Tile reads its input at data-dependent positions: the empty Where is no buffer to
    # materialize (IndexError binding the inputs, fuzz 95/199)
    m = model([helper.make_node("Where", ["cond", "a", "b"], ["w"]),
               helper.make_node("Tile", ["w", "reps"], ["y"])],
              [("cond", TensorProto.BOOL, [0, 1])], [("y", F32, None)],
              (const("a", np.zeros((0, 1), np.float32)), const("b", np.zeros((0, 1), np.float32)),
               const("reps", np.array([2, 1]))))
    assert check(m, {"cond": np.zeros((0, 1), bool)})[0].shape == (0, 1)


def test_an_empty_reduction_of_an_empty_split_compiles():
    # the same, materializing the empty ReduceSum: "IndexError: invalid index" compiling
    # the cluster, which fell back (fuzz 95/1102)
    m = model([helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=0),
               helper.make_node("ReduceSum", ["c", "axes"], ["r"], keepdims=1),
               helper.make_node("Flatten", ["r"], ["y"], axis=0),
               helper.make_node("Abs", ["a"], ["z"])],
              [("x", F32, [2, 1, 1])], [("y", F32, None), ("z", F32, None)],
              (const("sizes", np.array([2, 0, 0])), const("axes", np.array([2]))))
    check(m, {"x": np.array([0.25, -0.5], np.float32).reshape(2, 1, 1)})


def test_an_empty_root_reading_an_empty_constant_runs():
    # probing the empty Where for checks named the constant's buffer, which no thunk then
    # used: a hole in the buffer ids the executable indexes densely (IndexError, fuzz seed
    # 4242 case 117)
    m = model([helper.make_node("Where", ["cond", "c", "x"], ["y"])],
              [("cond", TensorProto.BOOL, [0]), ("x", F32, [0])], [("y", F32, None)],
              inits=(const("c", np.zeros(0, np.float32)),))
    check(m, {"cond": np.zeros(0, bool), "x": np.zeros(0, np.float32)})


def test_cast_float_to_int_out_of_range_and_nan():
    x = np.array([3e9, -3e9, np.nan, np.inf, -np.inf, 65541.7, -70000.7, 2.5, -1.5],
                 np.float32)
    m = model([helper.make_node("Cast", ["x"], ["a"], to=I32),
               helper.make_node("Cast", ["x"], ["b"], to=I64)],
              [("x", F32, [9])], [("a", I32, None), ("b", I64, None)])
    got = check(m, {"x": x})
    assert got[0][:5].tolist() == [-2**31] * 5


@pytest.mark.parametrize("op", ["ReduceProd", "ReduceSum", "ReduceSumSquare", "ReduceL1",
                                "ReduceMean"])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_integer_reduction_overflow_saturates(op, dtype):
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    big = 2**20 if dtype == I32 else 2**40
    x = np.array([[big, big, big, 3], [-big, big, big, 1], [5, -7, 2**53 + 1, 1]],
                 np.int64).astype(np_type)
    m = model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)],
              [("x", dtype, [3, 4])], [("y", dtype, None)], (const("axes", [1]),))
    check(m, {"x": x})


def test_argmax_and_reduce_max_with_a_leading_nan():
    x = np.array([[np.nan, 1, 3], [2, 9, 1], [np.nan, np.nan, 0]], np.float32)
    m = model([helper.make_node("ArgMax", ["x"], ["a"], axis=1),
               helper.make_node("ReduceMax", ["x", "axes"], ["r"])],
              [("x", F32, [3, 3])], [("a", I64, None), ("r", F32, None)],
              (const("axes", [1]),))
    got = check(m, {"x": x})
    assert got[0].ravel().tolist() == [0, 1, 0]


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0, 3.0, -1.5])
def test_pow_by_constant_special_values(exponent):
    """Pow's lowering reduces x**0.5 to a square root: that must keep pow's values at -0
    and -inf (+0 and +inf; sqrt gives -0 and NaN)."""
    x = np.array([-np.inf, -0.0, 0.0, 4.0, np.inf, np.nan, -2.0, 1e-40], np.float32)
    m = model([helper.make_node("Pow", ["x", "e"], ["y"])], [("x", F32, [8])],
              [("y", F32, None)], (const("e", np.float32(exponent)),))
    got = check(m, {"x": x}, rtol=2e-7)
    np.testing.assert_array_equal(np.signbit(got[0]), np.signbit(
        ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]))


@pytest.mark.parametrize("indices", [[3], [-4]])
def test_gather_out_of_range_raises(indices):
    m = model([helper.make_node("Gather", ["x", "i"], ["y"]),
               helper.make_node("Relu", ["y"], ["z"])],
              [("x", F32, [3, 2]), ("i", I64, [1])], [("z", F32, None)])
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    x = np.ones((3, 2), np.float32)
    assert sess.run(None, {"x": x, "i": np.array([-3], np.int64)})[0].shape == (1, 2)
    with pytest.raises(AutoclustError, match=r"Gather.*out of range \[-3, 2\]"):
        sess.run(None, {"x": x, "i": np.array(indices, np.int64)})


def test_split_sizes_from_runtime_data_stay_unknown_at_import():
    """Split's sizes computed in the graph (the expanded RotaryEmbedding function) are not
    equal chunks: the importer must leave them unknown, not guess, or specializing the
    cluster later contradicts the guess."""
    from autoclust.importers.onnx import import_model
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [1])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")]
    nodes = [helper.make_node("Sub", ["eight", "k"], ["rest"]),
             helper.make_node("Concat", ["k", "rest"], ["sizes"], axis=0),
             helper.make_node("Split", ["x", "sizes"], ["a0", "b0"], axis=1),
             helper.make_node("Neg", ["a0"], ["a"]), helper.make_node("Neg", ["b0"], ["b"])]
    init = [helper.make_tensor("eight", TensorProto.INT64, [1], [8])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, k], outs, init),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    split = next(n for n in import_model(model).nodes if n.op == "Split")
    assert [o.shape for o in split.outputs] == [(2, None), (2, None)]
    feeds = {"x": np.arange(16, dtype=np.float32).reshape(2, 8), "k": np.array([3])}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = autoclust.InferenceSession(model, min_cluster_size=1).run(None, feeds)
    assert [g.shape for g in got] == [(2, 3), (2, 5)]
    assert_same(got, want)


# ---- found by the extended fuzzer (tools/fuzz/command.py presets empty and all) -------------------

def test_reduction_inside_a_concat_piece_sums_its_whole_axis():
    """ReduceLogSum over axes [0, -2] feeding Concat along axis 0: the piece's clamp of the
    concat loop must not cut the reduction's own loads (it summed one row of three)."""
    m = model([helper.make_node("ReduceLogSum", ["x", "axes"], ["r"], keepdims=1),
               helper.make_node("Concat", ["r", "c"], ["y"], axis=0)],
              [("x", F32, [3, 1, 1, 5]), ("c", F32, [2, 1, 1, 5])], [("y", F32, None)],
              [const("axes", np.array([0, -2], np.int64))])
    rng = np.random.default_rng(0)
    check(m, {"x": rng.uniform(0.1, 2, (3, 1, 1, 5)).astype(np.float32),
              "c": rng.standard_normal((2, 1, 1, 5)).astype(np.float32)}, rtol=1e-6)


@pytest.mark.parametrize("mode", ["edge", "reflect"])
def test_trilu_mask_under_a_clamping_pad_reads_the_copied_element(mode):
    """Trilu then an edge Pad: the mask is evaluated at the row and column of the element
    the padding copies, not at the padded position."""
    m = model([helper.make_node("Trilu", ["x", "k"], ["t"], upper=0),
               helper.make_node("Pad", ["t", "pads"], ["y"], mode=mode)],
              [("x", F32, [3, 3])], [("y", F32, None)],
              [const("k", np.array(1, np.int64)),
               const("pads", np.array([2, 0, 2, 1], np.int64))])
    check(m, {"x": np.arange(1, 10, dtype=np.float32).reshape(3, 3)})


@pytest.mark.parametrize("col", range(5))
def test_edge_pad_read_through_a_one_column_slice(col):
    """Pad(edge) then Split/Slice down to one column: the column's loop dim has size 1 and is
    dropped from the kernel, and its clamp must become part of the index constant (the
    fuzzer's Pad -> Split read 2 elements before the input)."""
    m = model([helper.make_node("Pad", ["x", "pads"], ["p"], mode="edge"),
               helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["y"])],
              [("x", F32, [2, 2])], [("y", F32, None)],
              [const("pads", np.array([1, 2, 3, 1], np.int64)),
               const("starts", np.array([col], np.int64)),
               const("ends", np.array([col + 1], np.int64)),
               const("axes", np.array([1], np.int64))])
    check(m, {"x": np.array([[1, 2], [3, 4]], np.float32)})


PAD_SLICES = [(mode, pads, cols) for mode in ("constant", "edge") for pads, cols in (
    ([-3, 0, -7, 2], (3, 4)), ([-3, 0, -7, 2], (2, 4)), ([-3, 3, -7, 0], (0, 2)),
    ([-1, 0, -1, 2], (2, 4)), ([-3, 2, -7, 2], (1, 5)))] + [("constant", [-3, -2, -7, 2], (0, 2))]


@pytest.mark.parametrize("mode,pads,cols", PAD_SLICES,
                         ids=[f"{m}{p}{c}" for m, p, c in PAD_SLICES])
def test_pad_read_only_in_its_padding_under_a_flatten(mode, pads, cols):
    """A Slice keeps only padded columns (or a crop leaves none of x's): every element
    reads one column of x, or none. Clamping the loop index there took it out of the
    loop's range, where the Flatten's and the Expand's index maps below do not hold:
    a fused Gather read the wrong row (a silently wrong answer) or the bounds proof
    refused the kernel (fuzz 134/2384)."""
    m = model([helper.make_node("Gather", ["c", "i"], ["g"]),
               helper.make_node("Abs", ["g"], ["a"]),
               helper.make_node("Expand", ["a", "s"], ["e"]),
               helper.make_node("Flatten", ["e"], ["f"], axis=2),
               helper.make_node("Pad", ["f", "pads"], ["p"], mode=mode),
               helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["y"])],
              [("i", I64, [1, 4])], [("y", F32, None)],
              [const("c", np.array([[-2, -0.5], [1, 2.5], [4, 5.5]], np.float32)),
               const("s", np.array([3, 1, 2], np.int64)),
               const("pads", np.array(pads, np.int64)),
               const("starts", np.array([cols[0]], np.int64)),
               const("ends", np.array([cols[1]], np.int64)),
               const("axes", np.array([1], np.int64))])
    got, want = run_both(m, {"i": np.array([[1, 0, 2, -1]], np.int64)}, check_bounds=True)
    assert_same(got, want)


@pytest.mark.parametrize("flags", [{"must_compile": True, "min_cluster_size": 1},
                                   {"min_cluster_size": 1},
                                   {"device": "interpreter", "min_cluster_size": 1}])
def test_layernorm_over_zero_elements_raises_like_onnxruntime(flags):
    """onnxruntime rejects LayerNormalization over an empty normalized shape; so do we, at
    run time, naming the node, and the cluster keeps compiling for good shapes."""
    m = model([helper.make_node("LayerNormalization", ["x", "s"], ["n"], axis=1, name="ln"),
               helper.make_node("Relu", ["n"], ["y"])],
              [("x", F32, [2, "k"])], [("y", F32, None)], [const("s", np.ones(1, np.float32))],
              opset=18)
    bad = {"x": np.zeros((2, 0), np.float32)}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="at least 1"):
        ort.InferenceSession(m.SerializeToString(),
                             providers=["CPUExecutionProvider"]).run(None, bad)
    sess = autoclust.InferenceSession(m, **flags)
    with pytest.raises(autoclust.InvalidInputError, match=r"'ln'.*at least 1, got 0") as info:
        sess.run(None, bad)
    assert isinstance(info.value, ort.capi.onnxruntime_pybind11_state.InvalidArgument)
    good = {"x": np.array([[3.0], [-1.0]], np.float32)}  # one element per row: (x - x) = 0
    (y,) = sess.run(None, good)
    np.testing.assert_array_equal(y, np.zeros((2, 1), np.float32))
    assert all(c["fallback"] is None for c in sess.stats()["clusters"])
