"""GEMMs around attention: strided operands instead of transpose kernels (kernel/views.py),
scale Muls folded into alpha, and the measured GEMM choice among MLAS, NumPy and oneDNN
(backends/cpu/choice.py, onednn.py), each checked against onnxruntime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import choice, library, onednn
from autoclust.models import zoo
from onnx import TensorProto, helper, numpy_helper

import autoclust
from autoclust.errors import UnsupportedOpError
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(11)
HAS_DNNL = onednn.unavailable() is None
needs_dnnl = pytest.mark.skipif(not HAS_DNNL, reason="oneDNN not installed")


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _kernels(sess: autoclust.InferenceSession) -> list:
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    return kir.kernels(exe.program.thunks)  # library calls' epilogues included


def _calls(sess: autoclust.InferenceSession) -> list:
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    return [t for t in exe.program.thunks if type(t).__name__ == "LibraryCall"]


def _attention(s: int = 16, heads: int = 4, d: int = 8, scale: str = "after") -> onnx.ModelProto:
    """x -> Q/K/V projections, heads split by Reshape + Transpose (K^T by perm [0,2,3,1]),
    softmax(Q K^T * c), merge heads by Transpose + Reshape, output projection. Q and K are
    scaled by c after their head transposes (`scale="after"`), before them ("before", as
    torch's attention decomposition leaves a scale between layout ops) or not at all."""
    h = heads * d
    w = {n: numpy_helper.from_array(RNG.standard_normal((h, h)).astype(np.float32) * 0.2, n)
         for n in ("wq", "wk", "wv", "wo")}
    inits = list(w.values()) + [
        numpy_helper.from_array(np.array([1, s, heads, d], np.int64), "split"),
        numpy_helper.from_array(np.array([1, s, h], np.int64), "merge"),
        numpy_helper.from_array(np.array(d ** -0.25, np.float32), "c"),
        numpy_helper.from_array(RNG.standard_normal(h).astype(np.float32), "bk")]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q0"]), n("MatMul", ["x", "wk"], ["k0"]),
             n("Add", ["k0", "bk"], ["k1"]), n("MatMul", ["x", "wv"], ["v0"]),
             n("Reshape", ["q0", "split"], ["q1"]), n("Reshape", ["k1", "split"], ["k2"]),
             n("Reshape", ["v0", "split"], ["v1"]), n("Transpose", ["v1"], ["v2"], perm=[0, 2, 1, 3])]
    if scale == "before":
        nodes += [n("Mul", ["q1", "c"], ["q1s"]), n("Mul", ["k2", "c"], ["k2s"])]
    q1, k2 = ("q1s", "k2s") if scale == "before" else ("q1", "k2")
    nodes += [n("Transpose", [q1], ["q2"], perm=[0, 2, 1, 3]),
              n("Transpose", [k2], ["k3"], perm=[0, 2, 3, 1])]
    if scale == "after":
        nodes += [n("Mul", ["q2", "c"], ["q3"]), n("Mul", ["k3", "c"], ["k4"])]
    nodes += [n("MatMul", ["q3", "k4"] if scale == "after" else ["q2", "k3"], ["sc"]),
              n("Softmax", ["sc"], ["p"], axis=-1), n("MatMul", ["p", "v2"], ["o0"]),
              n("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              n("Reshape", ["o1", "merge"], ["o2"]), n("MatMul", ["o2", "wo"], ["y"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, s, h])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, s, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("scale", ["after", "before", "none"])
def test_attention_has_no_transpose_kernels(scale):
    model = _attention(scale=scale)
    x = RNG.standard_normal((1, 16, 32)).astype(np.float32)
    sess = autoclust.InferenceSession(model, must_compile=True)
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _ort(model, {"x": x})[0], rtol=2e-5, atol=2e-5)
    kernels = _kernels(sess)
    assert len(kernels) == 1 and "Softmax" in " ".join(kernels[0].nodes)  # the softmax only
    calls = _calls(sess)
    # Q, K and V: one Gemm over concatenated weights (passes/siblings.py), K's bias with it
    assert [c.op for c in calls].count("Gemm") == 1 and len(calls) == 4
    viewed = [c for c in calls if c.views]
    assert len(viewed) == 2  # Q K^T reads both in place; P V writes into the merged heads
    qk = viewed[0]
    # K [1, 4, 16, 8] read in place from the fused QKV result [1, 16, 96], transposed by
    # the GEMM's flag (simplify._rows_kept): every scale form reaches the same call
    assert qk.views[1].strides[1:] == (8, 96, 1) and dict(qk.attrs).get("transB") == 1
    assert qk.op == "FusedMatMul" and ("alpha" in dict(qk.attrs)) == (scale != "none")


def test_bert_encoder_kernels_and_output():
    model = onnx.load("models/bert_encoder.onnx")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, must_compile=True)
    got = sess.run(None, feeds)
    for g, w in zip(got, _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    kernels = _kernels(sess)
    # per layer: softmax, 2 LayerNorms, GELU (was 8 with 4 transposing kernels), + embedding
    assert len(kernels) == 9
    assert not any("Transpose" in " ".join(k.nodes) for k in kernels)


def _strided(shape: tuple, perm: tuple) -> np.ndarray:
    """A random array of `shape` that is a transposed view of a contiguous buffer."""
    base = RNG.standard_normal([shape[p] for p in perm]).astype(np.float32)
    inverse = np.argsort(perm)
    return base.transpose(inverse)


CASES = [  # (a shape, b shape, a perm, b perm): perm None = contiguous
    ((1, 4, 16, 8), (1, 4, 8, 16), (0, 2, 1, 3), (0, 3, 1, 2)),  # attention Q K^T
    ((2, 3, 5, 7), (7, 6), None, (1, 0)),  # batched A, transposed shared B
    ((3, 1, 5, 7), (1, 4, 7, 6), None, None),  # batch broadcasting both ways
    ((33, 70), (70, 65), (1, 0), None),  # transposed A
    ((1, 6, 9), (6, 9, 4), None, None),  # A broadcast over B's batch
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl", ["mlas", "numpy", "onednn"])
def test_each_gemm_on_strided_operands(case, impl):
    sa, sb, pa, pb = case
    a = _strided(sa, pa) if pa else RNG.standard_normal(sa).astype(np.float32)
    b = _strided(sb, pb) if pb else RNG.standard_normal(sb).astype(np.float32)
    a.flat[0], b.flat[-1] = np.nan, np.inf  # non-finite values propagate like onnxruntime's
    want = _ort_matmul(np.ascontiguousarray(a), np.ascontiguousarray(b))
    layouts = (_elems(a), _elems(b), None)
    if impl == "onednn" and not HAS_DNNL:
        pytest.skip("oneDNN not installed")
    fn = library.make_call("MatMul", {}, [(a.dtype, a.shape), (b.dtype, b.shape)],
                           [(want.dtype, want.shape)], 2, impl=impl, layouts=layouts)
    y = np.full(want.shape, 7, np.float32)
    fn([a, b], [y])
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def _elems(x: np.ndarray) -> tuple | None:
    return None if x.flags.c_contiguous else tuple(s // x.itemsize for s in x.strides)


def _ort_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm", [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape)),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return _ort(model, {"a": a, "b": b})[0]


@needs_dnnl
@pytest.mark.parametrize("epilogue", [[], [("add", (24,))], [("add", (5, 24)), ("relu", ())],
                                      [("gelu_erf", ())], [("silu", ())], [("mul", (5, 24))]])
def test_onednn_epilogues(epilogue):
    a = RNG.standard_normal((5, 12)).astype(np.float32)
    w = RNG.standard_normal((12, 24)).astype(np.float32)
    extras = [RNG.standard_normal(shape).astype(np.float32) for kind, shape in epilogue if shape]
    y = np.empty((5, 24), np.float32)
    mm = onednn.Matmul(onednn.Operand(a.shape), onednn.Operand(w.shape),
                       onednn.Operand(y.shape), 0.5, epilogue, weights=w, threads=2)
    mm([a, y, *extras])
    want, it = 0.5 * (a @ w), iter(extras)
    for kind, _ in epilogue:
        from scipy.special import erf
        want = {"add": lambda t: t + next(it), "mul": lambda t: t * next(it),
                "relu": lambda t: np.maximum(t, 0), "silu": lambda t: t / (1 + np.exp(-t)),
                "gelu_erf": lambda t: 0.5 * t * (1 + erf(t / np.sqrt(2)))}[kind](want)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_primitives_share_the_packing_of_one_weights_array():
    """Two primitives packing the same weights array into the same layout (two sequence
    lengths of one binding) share one packed copy; a different array packs its own, a
    packing goes with its last primitive, and every result is a @ w."""
    import gc
    w = RNG.standard_normal((256, 512)).astype(np.float32)

    def matmul(rows, weights):
        a = RNG.standard_normal((rows, 256)).astype(np.float32)
        y = np.empty((rows, 512), np.float32)
        mm = onednn.Matmul(onednn.Operand(a.shape), onednn.Operand(weights.shape),
                           onednn.Operand(y.shape), weights=weights, threads=2)
        mm([a, y])
        np.testing.assert_allclose(y, a @ weights, rtol=1e-4, atol=1e-3)
        return mm

    first, second = matmul(128, w), matmul(96, w)
    assert second._packed[0] is first._packed[0]
    other = matmul(96, w.copy())
    assert other._packed[0] is not first._packed[0]
    import weakref
    packed = weakref.ref(first._packed[0])
    del first, second
    gc.collect()
    assert packed() is None  # the cache did not keep it
    matmul(64, w)  # packs again, and is right
    del w
    gc.collect()
    assert not any(owner() is None for owner, _ in onednn._PACKINGS.values())


@needs_dnnl
def test_weights_dying_inside_the_packing_lock_do_not_hang_the_thread():
    """A weights array's finalizer runs wherever it dies: here inside a region holding
    the packing lock (as a garbage collection set off by an allocation there does). It
    used to wait for that lock and hang the thread; now the packings go at the next
    lookup."""
    import gc
    import threading
    w = np.random.default_rng(5).standard_normal((256, 512)).astype(np.float32)
    a = np.ones((8, 256), np.float32)
    y = np.empty((8, 512), np.float32)
    mm = onednn.Matmul(onednn.Operand(a.shape), onednn.Operand(w.shape),
                       onednn.Operand(y.shape), weights=w, threads=1)
    key = id(w)
    assert key in onednn._PACKINGS
    del mm

    def die_inside_the_lock() -> None:
        nonlocal w
        with onednn._PACKED_LOCK:
            del w  # the finalizer runs here, the lock held
            gc.collect()

    t = threading.Thread(target=die_inside_the_lock, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the finalizer waited for the lock its own thread held"
    assert key in onednn._PACKINGS  # left for the next lookup ...
    other = np.zeros((256, 512), np.float32)
    onednn.Matmul(onednn.Operand(a.shape), onednn.Operand(other.shape),
                  onednn.Operand(y.shape), weights=other, threads=1)([a, y])
    assert not any(owner() is None for owner, _ in onednn._PACKINGS.values())  # ... gone


@needs_dnnl
def test_a_packing_under_way_holds_back_only_its_own_weights(monkeypatch):
    """While one thread reorders weights (the background packing of a warm first run), a
    primitive looking for an earlier packing of them does not wait (it reads the weights
    as they are), another weights array packs meanwhile, and a second packing of the same
    weights waits for the first and shares it: one reorder."""
    import threading
    w, other = (RNG.standard_normal((256, 512)).astype(np.float32) for _ in range(2))
    gate, started, reorders = threading.Event(), threading.Event(), []
    real = onednn.Matmul._reorder

    def slow(self, weights, b, md):
        reorders.append(weights is w)
        if weights is w:
            started.set()
            assert gate.wait(10)
        return real(self, weights, b, md)

    monkeypatch.setattr(onednn.Matmul, "_reorder", slow)

    def matmul(weights, pack=True):
        a = RNG.standard_normal((64, 256)).astype(np.float32)
        y = np.empty((64, 512), np.float32)
        mm = onednn.Matmul(onednn.Operand(a.shape), onednn.Operand(weights.shape),
                           onednn.Operand(y.shape), weights=weights, threads=2, pack=pack)
        mm([a, y] if mm.skip_b else [a, weights, y])
        np.testing.assert_allclose(y, a @ weights, rtol=1e-4, atol=1e-3)
        return mm

    made: list = []
    threads = [threading.Thread(target=lambda: made.append(matmul(w))) for _ in range(2)]
    threads[0].start()
    assert started.wait(30)
    threads[1].start()
    plain = matmul(w, pack=False)  # returns while the reorder is held back
    assert not plain.skip_b
    matmul(other)  # packs its own weights meanwhile
    gate.set()
    for t in threads:
        t.join(30)
    assert len(made) == 2 and made[0]._packed[0] is made[1]._packed[0]
    assert reorders.count(True) == 1 and matmul(w, pack=False).skip_b


def test_empty_and_one_dimensional_gemms_fall_back():
    a, b = np.zeros((0, 8), np.float32), RNG.standard_normal((8, 4)).astype(np.float32)
    fn = library.make_call("MatMul", {}, [(a.dtype, a.shape), (b.dtype, b.shape)],
                           [(a.dtype, (0, 4))], 2)
    fn([a, b], [np.empty((0, 4), np.float32)])
    assert fn.impl != "onednn"
    with pytest.raises(UnsupportedOpError, match="onednn"):
        library.make_call("MatMul", {}, [(a.dtype, (8,)), (b.dtype, b.shape)],
                          [(a.dtype, (4,))], 2, impl="onednn")


def test_missing_onednn_is_one_clear_reason(monkeypatch):
    monkeypatch.setattr(onednn, "_STATE", {"why": "oneDNN not installed (pip install x)"})
    a, b = np.ones((256, 256), np.float32), np.ones((256, 512), np.float32)
    library._DECISIONS.clear()
    fn = library.make_call("MatMul", {}, [(a.dtype, a.shape), (b.dtype, b.shape)],
                           [(a.dtype, (256, 512))], 2, {1: b}, packed_gemm=False)
    assert fn.impl == "mlas" and "onednn: oneDNN not installed" in fn.note
    library._DECISIONS.clear()


@needs_dnnl
def test_measured_choice_is_cached_on_disk(tmp_path):
    a, b = np.ones((128, 256), np.float32), RNG.standard_normal((256, 512)).astype(np.float32)
    assert library.wait_background(60)  # an earlier test's measurement would write here
    choice.use_cache_dir(str(tmp_path))
    try:
        library._DECISIONS.clear()
        fn = library.make_call("MatMul", {}, [(a.dtype, a.shape), (b.dtype, b.shape)],
                               [(a.dtype, (128, 512))], 2, {1: b})
        assert fn.impl == "mlas"  # until the background measurement says otherwise
        assert library.wait_background(30)
        assert fn.impl in ("mlas", "onednn", "packed") and fn.note.startswith("measured"), \
            fn.note
        entries = json.loads((tmp_path / "gemm_choices.json").read_text())
        assert [v[0] for v in entries.values()] == [fn.impl]
        library._DECISIONS.clear()
        choice.use_cache_dir(str(tmp_path))  # a new process: the file answers
        again = library.make_call("MatMul", {}, [(a.dtype, a.shape), (b.dtype, b.shape)],
                                  [(a.dtype, (128, 512))], 2, {1: b})
        assert again.impl == fn.impl and again.note.endswith("(--cache_dir)")
    finally:
        choice.use_cache_dir(None)
        library._DECISIONS.clear()


def test_operand_view_of_a_graph_input_reads_that_input():
    """(Q c) @ (K^T c) with K a graph input: the probe that finds K's view names K's
    buffer before any other, and gives the id back; the call must still read K (it once
    read its own output buffer: the ONNX node suite's expanded Attention cases)."""
    n = helper.make_node
    nodes = [n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), n("Mul", ["q", "c"], ["qc"]),
             n("Mul", ["kt", "c"], ["ktc"]), n("MatMul", ["qc", "ktc"], ["s"]),
             n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3, t, 8])
              for name, t in (("q", 4), ("k", 6), ("v", 6))]
    graph = helper.make_graph(nodes, "qk", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [2, 3, 4, 8])], [numpy_helper.from_array(
            np.array(8 ** -0.25, np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    feeds = {"q": RNG.standard_normal((2, 3, 4, 8)).astype(np.float32),
             "k": RNG.standard_normal((2, 3, 6, 8)).astype(np.float32),
             "v": RNG.standard_normal((2, 3, 6, 8)).astype(np.float32)}
    sess = autoclust.InferenceSession(model, must_compile=True, min_cluster_size=1)
    np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds)[0], rtol=2e-5,
                               atol=2e-5)
    assert [k for k in _kernels(sess) if "Transpose" in str(k)] == []


def _transposed_result(case: str) -> tuple[onnx.ModelProto, dict]:
    """A GEMM whose result is read only through a transpose of its last two dims, as
    SegFormer's x @ W1 is (into the NCHW input of its depthwise Conv)."""
    n = helper.make_node
    w = numpy_helper.from_array(RNG.standard_normal((32, 96)).astype(np.float32), "w")
    if case == "nchw":  # [1, 400, 32] @ [32, 96] -> [1, 96, 20, 20]
        x_shape, inits, y_shape = [1, 400, 32], [w, numpy_helper.from_array(
            np.array([1, 96, 20, 20], np.int64), "shape")], [1, 96, 20, 20]
        nodes = [n("MatMul", ["x", "w"], ["y0"]), n("Transpose", ["y0"], ["y1"], perm=[0, 2, 1]),
                 n("Reshape", ["y1", "shape"], ["y"])]
    elif case == "heads":  # per-head [1, 3, 24, 16] @ [1, 3, 16, 40], each head transposed
        x_shape, inits, y_shape = [1, 3, 24, 16], [numpy_helper.from_array(
            RNG.standard_normal((1, 3, 16, 40)).astype(np.float32), "w")], [1, 3, 40, 24]
        nodes = [n("MatMul", ["x", "w"], ["y0"]), n("Transpose", ["y0"], ["y"], perm=[0, 1, 3, 2])]
    elif case == "symbolic":  # [1, S, 32] @ [32, 96] -> [1, 96, S], S a symbolic dim
        x_shape, inits, y_shape = [1, "S", 32], [w], [1, 96, "S"]
        nodes = [n("MatMul", ["x", "w"], ["y0"]), n("Transpose", ["y0"], ["y"], perm=[0, 2, 1])]
    elif case == "fused":  # FusedMatMul's own flags and alpha carry over
        x_shape, inits, y_shape = [1, 32, 300], [w], [1, 96, 300]
        nodes = [n("FusedMatMul", ["x", "w"], ["y0"], domain="com.microsoft", transA=1,
                   alpha=0.5), n("Transpose", ["y0"], ["y"], perm=[0, 2, 1])]
    else:  # "vector": [32] @ [4, 32, 96] -> [4, 96]: a 1-D operand is not transposed
        x_shape, inits, y_shape = [32], [numpy_helper.from_array(
            RNG.standard_normal((4, 32, 96)).astype(np.float32), "w")], [96, 4]
        nodes = [n("MatMul", ["x", "w"], ["y0"]), n("Transpose", ["y0"], ["y"], perm=[1, 0])]
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    concrete = [37 if d == "S" else d for d in x_shape]
    return model, {"x": RNG.standard_normal(concrete).astype(np.float32)}


@pytest.mark.parametrize("case", ["nchw", "heads", "symbolic", "fused", "vector"])
def test_a_result_written_transposed_is_computed_transposed(case):
    """C^T = op(B)^T @ op(A)^T: the call's result lands in C order, where the libraries
    write it, instead of a dense stand-in and a transposing copy (kernel/views.py
    transposed_result); onnxruntime's outputs either way (a symbolic dim at two sizes)."""
    model, feeds = _transposed_result(case)
    sess = autoclust.InferenceSession(model, must_compile=True, min_cluster_size=1)
    more = [feeds, {"x": RNG.standard_normal((1, 300, 32)).astype(np.float32)}]
    for f in more if case == "symbolic" else more[:1]:
        np.testing.assert_allclose(sess.run(None, f)[0], _ort(model, f)[0], rtol=2e-5,
                                   atol=2e-4)
    [call] = [c for c in _calls(sess) if c.op in ("MatMul", "FusedMatMul")]
    out = call.view(len(call.inputs))
    if case == "vector":
        assert call.op == "MatMul" and out is not None and out.strides[-1] != 1
        return
    attrs = dict(call.attrs)
    assert call.op == "FusedMatMul" and attrs["transA"] == 1  # 1 - B's own flag
    assert attrs["transB"] == (0 if case == "fused" else 1)  # 1 - A's own flag
    assert attrs["alpha"] == (0.5 if case == "fused" else 1.0)
    assert out is not None and out.strides[-1] == 1 and out.strides[-2] == out.shape[-1]
