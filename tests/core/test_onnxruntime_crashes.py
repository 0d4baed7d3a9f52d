"""Graphs on which an onnxruntime optimizer crashes onnxruntime itself (a segmentation
fault: no exception to catch) or makes it answer wrongly are run without that optimizer
(backends/ort.broken_optimizers): autoclust makes onnxruntime sessions over sub-models
(measured placement, fallback segments) and over the whole model, and none of them may
take the process down or change an answer. Nor may measured placement or a fallback
segment hand onnxruntime a division its kernel crashes on (backends/ort.crashing_division)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.backends import ort as ort_backend
from onnx import TensorProto, helper, numpy_helper

import autoclust

RUN = """
import sys, numpy as np, onnx, onnxruntime as ort, autoclust
path, flags = sys.argv[1], eval(sys.argv[2])
x = np.linspace(-2, 2, int(np.prod(eval(sys.argv[3])))).astype(np.float16).reshape(eval(sys.argv[3]))
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
want = ort.InferenceSession(path, so).run(None, {"x": x})[0]
sess = autoclust.InferenceSession(path, **flags)
for _ in range(12):  # measured placement times the cluster against onnxruntime on the way
    got = sess.run(None, {"x": x})[0]
np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
print("ok", got.shape)
"""


def _model(dtype: int, shape: list[int], perm: list[int], w: tuple[int, int],
           between: str = "") -> onnx.ModelProto:
    """Transpose(x) @ w, through an Expand or Identity to the same shape if `between`."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    weight = numpy_helper.from_array(np.linspace(-1, 1, w[0] * w[1]).reshape(w).astype(np_dtype),
                                     "w")
    same = numpy_helper.from_array(np.array([shape[p] for p in perm], np.int64), "same")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
             helper.make_node("MatMul", ["t", "w"], ["y"])]
    if between:
        nodes.insert(1, helper.make_node(between, ["t", "same"][:1 + (between == "Expand")],
                                         ["e"]))
        nodes[2].input[0] = "e"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, None)], [weight, same])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("flags", [{}, {"min_cluster_size": 1}, {"auto_jit": 0},
                                   {"min_cluster_size": 1, "autotune": False}])
@pytest.mark.parametrize("shape,perm,w,between", [([2, 1, 1], [1, 2, 0], (2, 1), ""),
                                                  ([2, 3, 4], [1, 2, 0], (2, 5), ""),
                                                  ([3, 1, 1], [1, 2, 0], (3, 1), "Expand")])
def test_float16_transpose_into_matmul_does_not_crash(tmp_path, flags, shape, perm, w,
                                                      between):
    """onnxruntime 1.31 segfaults at ORT_ENABLE_ALL on this float16 graph (the shrunk
    fuzz case 77/598, `autoclust fuzz --seed 77 --features values`; 98/1553 through an
    Expand to the same shape, which onnxruntime removes first); autoclust, whole or
    clustered and measured, answers as onnxruntime does without optimizations."""
    path = tmp_path / "model.onnx"
    onnx.save(_model(TensorProto.FLOAT16, shape, perm, w, between), path)
    proc = subprocess.run([sys.executable, "-c", RUN, str(path), repr(flags), repr(shape)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.startswith("ok")


def test_transpose_optimizer_off_around_a_pad_with_axes():
    """onnxruntime 1.31's transpose optimizer fails a Transpose -> Pad (with an axes input)
    at run time (fuzz 89/76); a Pad without axes, or without a Transpose, keeps it."""
    def model(axes: bool, transpose: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1])] if transpose \
            else [helper.make_node("Identity", ["x"], ["t"])]
        nodes.append(helper.make_node("Pad", ["t", "p", "", "a"] if axes else ["t", "q"],
                                      ["y"], mode="edge"))
        inits = [numpy_helper.from_array(np.array([0, 1, 0, 2], np.int64), "p"),
                 numpy_helper.from_array(np.array([0, 2], np.int64), "a"),
                 numpy_helper.from_array(np.array([0, 1, 0, 0, 2, 0], np.int64), "q")]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [3, 1, 1])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, None)], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        m.ir_version = 10
        return m

    off = ["TransposeOptimizer", "TransposeOptimizer_CPUExecutionProvider"]
    assert ort_backend.broken_optimizers(model(axes=True, transpose=True)) == off
    assert ort_backend.broken_optimizers(model(axes=False, transpose=True)) == []
    assert ort_backend.broken_optimizers(model(axes=True, transpose=False)) == []
    x = np.array([[[-0.0153]], [[1.029]], [[0.1406]]], np.float32)
    sess = ort_backend.create_session(model(axes=True, transpose=True).SerializeToString(),
                                      None)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model(axes=True, transpose=True).SerializeToString(),
                                plain).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def test_broken_optimizers_only_where_they_break():
    f16 = _model(TensorProto.FLOAT16, [2, 3, 4], [1, 2, 0], (2, 5))
    assert ort_backend.broken_optimizers(f16) == ["MatmulTransposeFusion"]
    # float32 with a 2-D B is fine, and so is a float16 MatMul with no Transpose before it
    assert ort_backend.broken_optimizers(
        _model(TensorProto.FLOAT, [2, 3, 4], [1, 2, 0], (2, 5))) == []
    no_transpose = _model(TensorProto.FLOAT16, [2, 3, 4], [1, 2, 0], (2, 5))
    no_transpose.graph.node[1].input[0] = "x"
    assert ort_backend.broken_optimizers(no_transpose) == []
    # float16: through any ops (98/1553 through an Expand, 152/464 through a Concat);
    # float32 only through those onnxruntime removes first, not through arithmetic
    for between, off16, off32 in (("Expand", True, False), ("Identity", True, False),
                                  ("Neg", True, False)):
        for dtype, off in ((TensorProto.FLOAT16, off16), (TensorProto.FLOAT, off32)):
            assert ort_backend.broken_optimizers(_model(
                dtype, [2, 3, 4], [1, 2, 0], (2, 5), between)) == \
                ["MatmulTransposeFusion"] * off, (between, dtype)
    # float32, transposed A, 1-D B: wrong values (below)
    assert ort_backend.broken_optimizers(_vector_b_model(None)) == ["MatmulTransposeFusion"]
    # a B made in the graph without a stated shape: ONNX's shape inference says it is 2-D
    inferred = _vector_b_model(None, b_shape=(3, 4))
    inferred.graph.node.append(helper.make_node("Identity", ["w"], ["w2"]))
    inferred.graph.node[1].input[1] = "w2"
    inferred.graph.node.insert(0, inferred.graph.node.pop())
    assert ort_backend.broken_optimizers(inferred) == []


def _vector_b_model(x_dims: list | None, b_shape: tuple = (3,)) -> onnx.ModelProto:
    """Transpose(x [batch, 2]) @ w, w a constant of b_shape (fuzz case 80/682)."""
    w = numpy_helper.from_array(np.array([0.618, -1.34, 1.404, 0.5][:b_shape[0]] * (
        1 if len(b_shape) == 1 else b_shape[1]), np.float32).reshape(
            b_shape[::-1]).T.copy(), "w")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
         helper.make_node("MatMul", ["t", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims or ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("flags", [{}, {"min_cluster_size": 1}, {"auto_jit": 0},
                                   {"min_cluster_size": 1,
                                    "cluster_exclude_ops": ["MatMul", "Transpose"]}])
def test_transposed_a_times_a_vector_is_right(flags):
    """onnxruntime 1.31's MatmulTransposeFusion answers Transpose(x) @ v wrongly for a 1-D
    v ([0.014, 1.365] for [-0.690, 0.985], fuzz 80/682); every autoclust path, onnxruntime
    segments included, answers as onnxruntime does without optimizations."""
    model = _vector_b_model(None)
    x = np.array([[-1.51, -0.79], [0.42, 0.97], [-0.23, 0.48]], np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]
    plain = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert not np.allclose(plain, want, atol=1e-3)  # onnxruntime's bug, still there
    sess = autoclust.InferenceSession(model, **flags)
    for _ in range(12):  # measured placement times the cluster against onnxruntime
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


DIVIDE = """
import sys, numpy as np, autoclust
from onnx import TensorProto, helper
dtype = sys.argv[1]
T = {"int32": TensorProto.INT32, "int64": TensorProto.INT64}[dtype]
nodes = [helper.make_node(sys.argv[2], ["a", "b"], ["q"]),
         helper.make_node("Cast", ["q"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["f", "f"], ["m"]), helper.make_node("Add", ["m", "f"], ["y"])]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, T, [2]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 10
sess = autoclust.InferenceSession(model, min_cluster_size=1, **eval(sys.argv[3]))
lo = np.iinfo(dtype).min
a, b = np.array([lo, 7], dtype), np.array([-1, 2], dtype)
for _ in range(12):  # measured placement would time onnxruntime from the second run on
    y = sess.run(None, {"a": a, "b": b})[0]
q = np.array([lo, 3] if sys.argv[2] == "Div" else [0, 1], np.float32)  # INT_MIN / -1 wraps
np.testing.assert_array_equal(y, q * q + q)
print("ok", sess.explain().count("not measured"))
"""


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op", ["Div", "Mod"])
@pytest.mark.parametrize("flags", [{}, {"async_compile": True}])
def test_integer_division_onnxruntime_crashes_on_is_not_measured(dtype, op, flags):
    """onnxruntime 1.31's int32/int64 Div (and Mod) of INT_MIN by -1 raises SIGFPE (fuzz
    81/371); the compiled cluster answers INT_MIN (as NumPy), so neither measured placement
    nor --async_compile's stand-in may run onnxruntime on the same inputs."""
    proc = subprocess.run([sys.executable, "-c", DIVIDE, dtype, op, repr(flags)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split() == ["ok", "1"], proc.stdout


def test_crashing_division_spares_constants_that_cannot_trap():
    from autoclust.importers.onnx import import_model

    def graph(divisor: np.ndarray | None, dividend: np.ndarray | None = None,
              op: str = "Div", dtype: int = TensorProto.INT64, **attrs):
        inits = [numpy_helper.from_array(v, n) for n, v in (("a", dividend), ("b", divisor))
                 if v is not None]
        inputs = [helper.make_tensor_value_info(n, dtype, [2]) for n, v in
                  (("a", dividend), ("b", divisor)) if v is None]
        g = helper.make_graph([helper.make_node(op, ["a", "b"], ["q"], **attrs)], "g", inputs,
                              [helper.make_tensor_value_info("q", dtype, [2])], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 10
        return import_model(m)

    assert "SIGFPE" in ort_backend.crashing_division(graph(None))
    assert "SIGFPE" in ort_backend.crashing_division(graph(np.array([3, -1], np.int64)))
    assert "SIGFPE" in ort_backend.crashing_division(graph(None, op="Mod"))
    assert ort_backend.crashing_division(graph(np.array([3, 2], np.int64))) is None
    assert ort_backend.crashing_division(graph(None, np.array([5, 6], np.int64))) is None
    assert ort_backend.crashing_division(graph(None, op="Mod", fmod=1)) is None
    assert ort_backend.crashing_division(graph(None, dtype=TensorProto.INT8)) is None
    assert ort_backend.crashing_division(graph(None, dtype=TensorProto.FLOAT)) is None


SMALL_DIVIDE = """
import sys, numpy as np, onnxruntime as ort, autoclust
from onnx import TensorProto, helper
T = {"int32": TensorProto.INT32, "int64": TensorProto.INT64}[sys.argv[1]]
nodes = [helper.make_node("Cast", ["x"], ["c"], to=T), helper.make_node(sys.argv[2], ["c", "b"], ["q"])]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                                       helper.make_tensor_value_info("b", T, [3])],
                          [helper.make_tensor_value_info("q", T, [3])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 10
sess = autoclust.InferenceSession(model)  # the default --min_cluster_size=4: 2 nodes
x, b = np.array([9, -7, 5], np.float32), np.array([2, 2, -1], sys.argv[1])
want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "b": b})[0]
np.testing.assert_array_equal(sess.run(None, {"x": x, "b": b})[0], want)
lo = np.iinfo(sys.argv[1]).min  # a float32 exactly; onnxruntime would crash on it
got = sess.run(None, {"x": np.array([lo, 7, 1], np.float32), "b": b[[2, 0, 2]]})[0]
np.testing.assert_array_equal(got, [lo, 3, -1] if sys.argv[2] == "Div" else [0, 1, 0])
print("ok", sess.explain().count("cluster_0000: 2 nodes"))
"""


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_integer_division_onnxruntime_crashes_on_stays_compiled_below_min_cluster_size(
        dtype, op):
    """fuzz 93/2258: Cast to int64, then Div, a cluster of 2 (< --min_cluster_size=4) went
    to an onnxruntime segment, whose Div of INT_MIN by -1 killed the process (SIGFPE);
    the cluster is kept at any size, and answers INT_MIN (as NumPy)."""
    proc = subprocess.run([sys.executable, "-c", SMALL_DIVIDE, dtype, op],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split() == ["ok", "1"], proc.stdout


@pytest.mark.parametrize("flags", [{}, {"auto_jit": 0}, {"min_cluster_size": 1},
                                   {"cluster_exclude_ops": ["MatMul", "Add"]}])
@pytest.mark.parametrize("reshape", ["gemm_input_reshape", "gemm_output_reshape"])
def test_matmul_add_fusion_off_where_its_reshape_cannot_load(flags, reshape):
    """onnxruntime's MatMulAddFusion reshapes A to 2-D and the Gemm's result back; a
    reshape to a shape with a 0 its own shape inference refuses at load, at every level
    above ORT_DISABLE_ALL: a 1-D A of length 0 (a Split's empty output, fuzz 100/794) to
    [1, 0], a result of N = 0 columns back to A's rank (fuzz 165/2033). autoclust's
    sessions are made again without the fusion."""
    if reshape == "gemm_input_reshape":
        nodes = [helper.make_node("Split", ["x", "s"], ["p", "q"], axis=0),
                 helper.make_node("MatMul", ["q", "w"], ["m"])]
        x, w, b = np.array([0.5], np.float32), np.zeros((0, 2), np.float32), \
            np.array([1.13, -0.83], np.float32)
        want_y = b
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
        x, w, b = np.ones((1, 2, 3, 4), np.float32), np.zeros((4, 0), np.float32), \
            np.zeros(0, np.float32)
        want_y = np.zeros((1, 2, 3, 0), np.float32)
    graph = helper.make_graph(
        nodes + [helper.make_node("Add", ["m", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 0], np.int64), "s"),
         numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    with pytest.raises(Exception, match=reshape):  # fixed in onnxruntime?
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feeds = {"x": x}
    want = ort.InferenceSession(model.SerializeToString(), plain).run(None, feeds)[0]
    np.testing.assert_array_equal(want, want_y)
    got = autoclust.InferenceSession(model, **flags).run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("flags", [{}, {"auto_jit": 0}, {"min_cluster_size": 1}])
def test_matmul_add_fusion_off_where_its_reshape_fails_a_run(flags):
    """MatMulAddFusion's Reshape of a zero-size 3-D A to 2-D infers its -1 wrongly ({2, 0, 4}
    to {2, 4}) and fails every run, plain onnxruntime's too; autoclust's sessions (the
    whole model at --auto_jit=0 and with nothing clustered, measured placement's side of a
    cluster) are made again without the fusion, with one warning, and answer."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"]),
         helper.make_node("Relu", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5), "w"),
         numpy_helper.from_array(np.linspace(-1, 1, 5, dtype=np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    feeds = {"x": np.zeros((2, 0, 4), np.float32)}
    with pytest.raises(Exception, match="gemm_input_reshape"):  # fixed in onnxruntime?
        ort.InferenceSession(model.SerializeToString(),
                             providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = autoclust.InferenceSession(model, **flags)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [sess.run(None, feeds)[0] for _ in range(3)]
    assert sum("MatMulAddFusion inserted" in str(w.message) for w in caught) == 1
    for y in got:
        assert y.shape == (2, 0, 5) and y.dtype == np.float32


def _empty_model(x_shape: list[int], perm: list[int], other: tuple[str, list[int]]
                 ) -> onnx.ModelProto:
    """Transpose(x) @ other, with x of a zero-size dim: a graph input, or a constant."""
    name, shape = other
    inits = [numpy_helper.from_array(np.linspace(-1, 1, int(np.prod(shape)))
                                     .astype(np.float32).reshape(shape), name)] \
        if name == "c" else []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if name != "c":
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
         helper.make_node("MatMul", ["t", name], ["y"])], "g", inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("flags", [{}, {"min_cluster_size": 1},
                                   {"min_cluster_size": 1,
                                    "cluster_exclude_ops": ["MatMul", "Transpose"]}])
@pytest.mark.parametrize("x_shape,perm,other", [
    ([2, 0, 2], [0, 2, 1], ("w", [2, 0, 1])),  # K = 0: zeros (fuzz 105/1295)
    ([0, 2, 1], [0, 2, 1], ("c", [2, 1])),     # an empty batch (fuzz 105/1067)
])
def test_transpose_into_matmul_over_an_empty_operand(flags, x_shape, perm, other):
    """onnxruntime 1.31's MatmulTransposeFusion makes a FusedMatMul that leaves a K = 0
    product unwritten (garbage where zeros are due) and refuses an empty batch ("left
    operand cannot broadcast on dim 0"); it is off where the graph states a zero-size
    operand, so every autoclust path, onnxruntime segments included, answers as
    onnxruntime does without optimizations."""
    model = _empty_model(x_shape, perm, other)
    assert ort_backend.broken_optimizers(model) == ["MatmulTransposeFusion"]
    feeds = {"x": np.zeros(x_shape, np.float32)}
    if other[0] != "c":
        feeds[other[0]] = np.ones(other[1], np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)[0]
    sess = autoclust.InferenceSession(model, **flags)
    for _ in range(12):  # measured placement times onnxruntime on the way
        got = sess.run(None, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # a nonempty operand keeps the fusion (attention's K^T)
    assert ort_backend.broken_optimizers(_empty_model([2, 3, 2], perm, ("w", [2, 3, 1]))) == []


# fuzz 119/1338: onnxruntime 1.31's memory planner hands a float16 Softmax's empty buffer to
# a node of another shape ("Shape mismatch attempting to re-use buffer. {0} != {1}")
PLANNER_CASE = """<ir_version: 10, opset_import: ["" : 18]>
g (float16[1] x) => (float16[?] s0, float16[?] s1, float16[?] e, float16[?] p)
<int64[1] one = {1}, int64[1] three = {3}, int64[2] no_pads = {0, 0}, float16[0] empty = {},
 float16[1] zero = {0}>
{
   ex = Expand (x, one)
   s0 = Softmax <axis = -1> (empty)
   s1 = Softmax <axis = -1> (zero)
   d = Sub (x, ex)
   e = Expand (d, three)
   p = Pad <mode = "reflect"> (d, no_pads)
}"""


@pytest.mark.parametrize("retry", [True, False])
def test_a_segment_onnxruntimes_planner_fails_runs_without_buffer_reuse(monkeypatch, retry):
    """A fallback segment whose session fails in onnxruntime's own memory planner (the
    whole model only warns in onnxruntime; our segment of it, the float16 Softmaxes and
    their neighbours, fails) is rebuilt once with buffer reuse off, with one warning, and
    answers as onnxruntime does. Without the rebuild (retry False) the run raises."""
    import onnx.parser
    model = onnx.parser.parse_model(PLANNER_CASE)
    feeds = {"x": np.array([0.5], np.float16)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    if not retry:
        monkeypatch.setattr(ort_backend, "PLANNER_FAILURE", "no such message")
    sess = autoclust.InferenceSession(model.SerializeToString(), autotune=False)
    if not retry:
        with pytest.raises(ort_backend.Fail, match="re-use buffer"):
            sess.run(None, feeds)
        return
    with pytest.warns(RuntimeWarning, match="memory planner failed") as caught:
        got = sess.run(None, feeds)
    assert sum("memory planner" in str(w.message) for w in caught) == 1
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    again = sess.run(None, feeds)  # the rebuilt session serves from now on, silently
    for g, w in zip(again, want):
        np.testing.assert_array_equal(g, w)


# fuzz 154/217: onnxruntime over the whole model fails in its memory planner too (the empty
# Mean's buffer handed to the MatMul of the same [2, 5, ?] shape)
WHOLE_MODEL_PLANNER_CASE = """<ir_version: 10, opset_import: ["" : 17]>
g (float16[1,0] x) => (float16[?,?,?] mean, float16[?,?,?] soft, float16[?,?,?] out)
<float16[2,5,1] c = {1,2,3,4,5,6,7,8,9,10}, float16[5,0] e = {}, float16[1,0,1] w = {},
 int64[2,1] idx = {1,0}, float16[2,5,1] upd = {1,2,3,4,5,6,7,8,9,10}, float16[2,5,0] z = {}>
{
   mean = Mean (x, c, e)
   prod = MatMul (mean, w)
   soft = Softmax <axis = -1> (z)
   out = ScatterND (prod, idx, upd)
}"""


@pytest.mark.parametrize("retry", [True, False])
@pytest.mark.parametrize("flags", [{}, {"auto_jit": 0}])
def test_a_whole_model_session_whose_planner_fails_runs_without_buffer_reuse(
        monkeypatch, flags, retry):
    """Without a plan (no cluster, or --auto_jit=0) the model runs in one onnxruntime
    session; where onnxruntime's planner fails on it (a plain onnxruntime session raises),
    that session is rebuilt once with buffer reuse off, with one warning, and answers what
    onnxruntime without reuse answers. Without the rebuild (retry False) it raises."""
    import onnx.parser
    model = onnx.parser.parse_model(WHOLE_MODEL_PLANNER_CASE).SerializeToString()
    feeds = {"x": np.zeros((1, 0), np.float16)}
    with pytest.raises(ort_backend.Fail, match="re-use buffer"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    plain = ort.SessionOptions()
    plain.enable_mem_reuse = False
    want = ort.InferenceSession(model, plain, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert [w.shape for w in want] == [(2, 5, 0), (2, 5, 0), (2, 5, 1)]
    if not retry:
        monkeypatch.setattr(ort_backend, "PLANNER_FAILURE", "no such message")
    user = ort.SessionOptions()
    user.intra_op_num_threads = 1
    user.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = autoclust.InferenceSession(model, user, **flags)
    assert sess.plan is None or not sess.plan.clusters
    if not retry:
        with pytest.raises(ort_backend.Fail, match="re-use buffer"):
            sess.run(None, feeds)
        return
    with pytest.warns(RuntimeWarning, match=r"planner failed in the whole model \(Shape "
                      r"mismatch attempting to re-use buffer. \{2,5,0\} != \{2,5,1\}\)") as caught:
        got = sess.run(None, feeds)
    assert sum("memory planner" in str(w.message) for w in caught) == 1
    rebuilt = sess._full_session().get_session_options()  # the user's settings, reuse off
    assert not rebuilt.enable_mem_reuse and rebuilt.intra_op_num_threads == 1
    assert rebuilt.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    for _ in range(2):  # the rebuilt session serves from now on, silently
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = sess.run(None, feeds)


EMPTY_INSTANCE_NORM = """
import sys, numpy as np, onnxruntime as ort, autoclust
from onnx import TensorProto, helper, numpy_helper
dt = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[sys.argv[1]]
npd = np.dtype(sys.argv[1])
nodes = [helper.make_node("Mish", ["x"], ["m"]),
         helper.make_node("InstanceNormalization", ["m", "s", "b"], ["n"], epsilon=0.1),
         helper.make_node("Min", ["c", "n"], ["y"])]
inits = [numpy_helper.from_array(v.astype(npd), name) for name, v in
         (("s", np.ones(4)), ("b", np.zeros(4)), ("c", np.full((1, 1, 1), -0.5)))]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dt, [1, 4, 5, 0])],
                          [helper.make_tensor_value_info("y", dt, None)], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
model.ir_version = 10
sess = autoclust.InferenceSession(model, **eval(sys.argv[2]))  # 3 nodes: below the default size
for _ in range(12):  # measured placement would time the cluster against onnxruntime
    y = sess.run(None, {"x": np.zeros((1, 4, 5, 0), npd)})[0]
print("ok", y.shape)
"""


@pytest.mark.parametrize("flags", [{}, {"autotune": False}, {"min_cluster_size": 1}])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_empty_instance_norm_never_reaches_onnxruntime(dtype, flags):
    """onnxruntime 1.31 segfaults in the node after an InstanceNormalization of an empty
    tensor (fuzz 148/1653: Mish -> InstanceNormalization of [1, 4, 5, 0] -> Min): the
    cluster is kept at any size and never timed against onnxruntime; it answers the empty
    [1, 4, 5, 0] itself."""
    proc = subprocess.run([sys.executable, "-c", EMPTY_INSTANCE_NORM, dtype, repr(flags)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split() == ["ok", "(1,", "4,", "5,", "0)"], proc.stdout


CONCAT_CASE = """
import sys, numpy as np, onnx.parser, autoclust
from autoclust.errors import InvalidInputError
model = onnx.parser.parse_model('''<ir_version: 10, opset_import: ["" : 13]>
g (float16[batch,1,1] x) => (float16[?,?,?] m, float16[?,?] y) {  # float16 bits below
    c8 = Constant <value = int64[2] {0, 1}> ()  c11 = Constant <value = int64[1] {-1}> ()
    c18 = Constant <value = float16[1,1] {45302}> ()
    c21 = Constant <value = float16[1,1,1] {47627}> ()  b = Constant <value = float16[1] {13570}> ()
    s = Shape (x)  g = Gather <axis = 0> (s, c8)  shape = Concat <axis = 0> (g, c11)
    r = Reshape (x, shape)  t = Transpose <perm = [1, 2, 0]> (r)  m = MatMul (r, c18)
    c = Concat <axis = 2> (t, c21)  y = MatMul (c, b) }''')
sess = autoclust.InferenceSession(model, **eval(sys.argv[1]))
try:
    sess.run(None, {"x": np.ones((1, 1, 1), np.float16)})
except InvalidInputError as exc:  # onnxruntime rejects these shapes too
    print("raised", str(exc)[:200])
except Exception as exc:  # --auto_jit=0: onnxruntime's own error, as plain onnxruntime
    print("onnxruntime raised", type(exc).__name__, str(exc)[:200])
"""


@pytest.mark.parametrize("flags", [{}, {"min_cluster_size": 1}, {"auto_jit": 0}])
def test_float16_transpose_through_a_concat_does_not_crash(flags):
    """fuzz 152/464: a float16 Transpose reaching a MatMul through a Concat; the cluster's
    fallback segment (made to ask onnxruntime whether it rejects these shapes too, as it
    does: [1, 1, 2] @ [1]) segfaulted onnxruntime's session creation in
    MatmulTransposeFusion. The fusion is off there now, and the bad shapes are an error."""
    proc = subprocess.run([sys.executable, "-c", CONCAT_CASE, repr(flags)], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    want = "onnxruntime raised Fail" if flags.get("auto_jit") == 0 else "raised"
    assert proc.stdout.startswith(want) and "MatMul" in proc.stdout, proc.stdout
