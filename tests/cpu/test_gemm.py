"""Generated GEMMs (backends/cpu/gemm.py) and the native driver that runs a cluster's native
steps in one call: numbers against NumPy/onnxruntime, row ranges split anywhere, which
calls take the generated path, and that a small cluster costs one driver call."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import executable, gemm, jit
from llvmlite import ir
from onnx import TensorProto, helper

import autoclust
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(5)


def run_generated(spec: gemm.GemmSpec, a, b, bias, splits) -> np.ndarray:
    module = ir.Module("t")
    gemm.emit(module, "g", spec)
    obj, _, _ = jit.compile_object(str(module), "", False)
    engine, addrs = jit.load_object(obj, ["g"])
    fn = executable.KERNEL_FN(addrs["g"])
    c = np.full((spec.rows, spec.n), np.nan, a.dtype)
    ptrs = [a.ctypes.data, b.ctypes.data] + ([bias.ctypes.data] if bias is not None else [])
    arr = (ctypes.c_void_p * 4)(*(ptrs + [c.ctypes.data]))
    edges = [0] + list(splits) + [spec.rows]
    for lo, hi in itertools.pairwise(edges):
        fn(ctypes.addressof(arr), lo, hi)
    del engine
    return c


@pytest.mark.parametrize("m,k,n,batch,b_batched", [
    (2, 64, 128, 1, False), (5, 9, 37, 3, True), (7, 1, 33, 2, False), (4, 16, 1, 5, True),
    (13, 31, 70, 1, False), (1, 3, 16, 4, True)])
@pytest.mark.parametrize("bias,alpha,beta", [("", 1.0, 1.0), ("row", 0.5, 2.0),
                                             ("scalar", 1.0, -1.0)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_generated_gemm_matches_numpy(m, k, n, batch, b_batched, bias, alpha, beta, dtype):
    spec = gemm.GemmSpec(m, n, k, batch, b_batched, bias, alpha, beta, dtype)
    a = RNG.standard_normal((batch * m, k)).astype(dtype)
    bb = RNG.standard_normal((batch if b_batched else 1, k, n)).astype(dtype)
    c_bias = RNG.standard_normal(n if bias == "row" else 1).astype(dtype) if bias else None
    splits = sorted({spec.rows // 3, spec.rows // 2, spec.rows - 1} - {0, spec.rows})
    got = run_generated(spec, a, bb, c_bias, splits)
    want = alpha * np.einsum("bmk,bkn->bmn", a.reshape(batch, m, k),
                             np.broadcast_to(bb, (batch, k, n))).reshape(batch * m, n)
    if bias:
        want = want + beta * (c_bias if bias == "row" else c_bias[0])
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * k)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def _thunk_kinds(sess) -> list[str]:
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    return [t.op if isinstance(t, kir.LibraryCall) else "kernel" for t in exe.program.thunks]


@pytest.mark.parametrize("a_shape,b_shape", [((2, 64), (64, 128)), ((3, 5, 16), (16, 24)),
                                             ((2, 3, 7, 8), (2, 3, 8, 9)), ((6, 4), (4, 1))])
def test_small_matmuls_run_generated_code_and_match_onnxruntime(a_shape, b_shape):
    m = _model([helper.make_node("MatMul", ["a", "b"], ["c"]),
                helper.make_node("Relu", ["c"], ["y"])],
               [("a", TensorProto.FLOAT, a_shape), ("b", TensorProto.FLOAT, b_shape)],
               [("y", TensorProto.FLOAT, None)])
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32),
             "b": RNG.standard_normal(b_shape).astype(np.float32)}
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    got = sess.run(None, feeds)[0]
    want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    assert "generated GEMMs" in exe.dumps[".kernels.txt"]


def test_large_and_broadcast_a_matmuls_stay_library_calls():
    big = [(((256, 256), (256, 256)), False), (((2, 1, 8, 8), (1, 3, 8, 8)), False)]
    for (a_shape, b_shape), _ in big:
        m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                   [("a", TensorProto.FLOAT, a_shape), ("b", TensorProto.FLOAT, b_shape)],
                   [("y", TensorProto.FLOAT, None)])
        feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32),
                 "b": RNG.standard_normal(b_shape).astype(np.float32)}
        sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
        got = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, feeds["a"] @ feeds["b"], rtol=1e-4, atol=1e-3)
        exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
        assert "generated GEMMs" not in exe.dumps[".kernels.txt"]


def test_gemm_spec_refuses_what_it_cannot_generate():
    buf = {i: kir.Buffer(i, f"b{i}", "float32", s, "temp") for i, s in
           enumerate([(8, 4), (4, 6), (8, 6), (6, 4), (8, 4)])}
    mm = kir.LibraryCall("MatMul", (0, 1), (2,), ())
    assert gemm.spec_for(mm, buf) == gemm.GemmSpec(8, 6, 4, 1, False, "", 1.0, 1.0, "float32")
    assert gemm.spec_for(kir.LibraryCall("Gemm", (0, 3), (2,), (("transB", 1),)), buf) is None
    ints = {i: kir.Buffer(i, "i", "int32", b.shape, "temp") for i, b in buf.items()}
    assert gemm.spec_for(mm, ints) is None  # integers: NumPy


def test_small_cluster_runs_in_one_driver_call():
    model = onnx.load("models/mlp_gelu.onnx")
    sess = autoclust.InferenceSession(model)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    assert len(exe.program.thunks) == 5 and len(exe._steps) == 1  # 3 GEMMs + 2 kernels
    x2 = RNG.standard_normal((2, 64)).astype(np.float32)  # a new input array rebinds
    np.testing.assert_allclose(sess.run(None, {"x": x2})[0],
                               ort.InferenceSession(model.SerializeToString()).run(
                                   None, {"x": x2})[0], rtol=1e-5, atol=1e-6)
    x2 += 1  # the same array, changed in place: its address is reused, its data re-read
    np.testing.assert_allclose(sess.run(None, {"x": x2})[0],
                               ort.InferenceSession(model.SerializeToString()).run(
                                   None, {"x": x2})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("perm_b,perm_a,scale", [([1, 0], None, None), ([0, 2, 1], None, 0.125),
                                                 (None, [0, 2, 1], 0.5), ([1, 0], [1, 0], None)])
def test_matmul_of_transposed_operand_reads_it_in_place(perm_b, perm_a, scale):
    """MatMul(A, Transpose(B)) (and a scale after it) becomes one FusedMatMul call with
    transB (alpha): no transposed copy of B; numbers equal onnxruntime's."""
    rank = len(perm_b or perm_a)
    a_shape = (4, 6, 8)[3 - rank:] if perm_a is None else (4, 8, 6)[3 - rank:]
    b_shape = (4, 5, 8)[3 - rank:] if perm_b is not None else (4, 8, 5)[3 - rank:]
    nodes, a, b = [], "a", "b"
    if perm_a is not None:
        nodes.append(helper.make_node("Transpose", ["a"], ["at"], perm=perm_a))
        a = "at"
    if perm_b is not None:
        nodes.append(helper.make_node("Transpose", ["b"], ["bt"], perm=perm_b))
        b = "bt"
    nodes.append(helper.make_node("MatMul", [a, b], ["y" if scale is None else "p"]))
    inits = []
    if scale is not None:
        nodes.append(helper.make_node("Mul", ["p", "s"], ["y"]))
        inits.append(onnx.numpy_helper.from_array(np.float32(scale), "s"))
    m = _model(nodes, [("a", TensorProto.FLOAT, a_shape), ("b", TensorProto.FLOAT, b_shape)],
               [("y", TensorProto.FLOAT, None)], inits)
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32),
             "b": RNG.standard_normal(b_shape).astype(np.float32)}
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    got = sess.run(None, feeds)[0]
    want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want) if scale else \
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    assert [t.op for t in exe.program.thunks] == ["FusedMatMul"], \
        kir.format_program(exe.program)
