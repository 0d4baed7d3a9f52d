"""The stand-in CuPy behaves like a GPU where bugs hide, and the backend holds up there:
launch arguments packed by their C size, device arrays that refuse host reads, capture
that refuses synchronization, transfers, allocation and legacy-stream work, FMA
contraction as NVRTC's, asynchronous streams (two threads on two streams at once), and
cuBLAS workspaces that outlive the thread that captured a graph with them.

Each rule here was broken on purpose once (in the backend or the stand-in) and a test
failed; the report of issue 21 lists which.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends import cpu, gpu
from autoclust.backends.gpu import blas, device
from autoclust.models import zoo
from support import fake_cupy, hostsim
from support.compiled import one_node_graph, rand
from support.gpu_render import needs_cc

import autoclust
from autoclust import flags as flags_mod
from autoclust.compile import lower_graph

pytestmark = needs_cc  # the stand-in runs the C rendering through the host C compiler

FLAGS = flags_mod.parse("")


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    yield from fake_cupy.installed(monkeypatch)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _gather_exe():
    x = rand((5, 4))
    idx = np.array([[0, 3]], np.int64)
    program = lower_graph(one_node_graph("Gather", [x, idx], {"axis": 0}), FLAGS, cpu)
    return gpu.compile(program, FLAGS), x, idx


# ---- launch arguments ----------------------------------------------------------------------

def test_launch_arguments_are_checked_against_the_kernel_parameters():
    exe, x, idx = _gather_exe()
    check = next(iter(exe.rendered.checks.values()))
    fn = exe.module.get_function(check)
    cp = device.cupy()
    flags = cp.zeros(1, dtype=cp.int32)
    good = [device.to_device(idx).data.ptr, 2, 0, 1, 0, 4, flags.data.ptr, np.int32(0)]
    fn((1,), (128,), good)
    with pytest.raises(fake_cupy.LaunchError, match=r"parameter 7 is 'int' \(4 bytes\), the "
                       r"argument 0 packs 8 bytes"):
        fn((1,), (128,), good[:7] + [0])  # a Python int is an int64 to CuPy
    kernel = exe.rendered.kernels["k0"]
    fn = exe.module.get_function(kernel.symbol)
    with pytest.raises(fake_cupy.LaunchError, match="'long long' \\(8 bytes\\)"):
        fn((1,), (256,), [0] * len(kernel.args) + [np.int32(2)])  # n0 is a long long
    np.testing.assert_array_equal(device.to_host(exe.run([x, idx])[0]), x[idx])


# ---- device memory -------------------------------------------------------------------------

def test_device_arrays_refuse_host_reads():
    exe, x, idx = _gather_exe()
    (y,) = exe.run([x, idx])
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(y)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.testing.assert_array_equal(y, x[idx])
    np.testing.assert_array_equal(device.to_host(y), x[idx])  # the explicit copy


def test_capture_refuses_synchronization_transfers_allocation_and_the_legacy_stream():
    cp = device.cupy()
    y = cp.zeros(4, dtype=cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(fake_cupy.CudaError, match="allocation while a stream captures"):
                cp.empty(4, dtype=cp.float32)
            with pytest.raises(fake_cupy.CudaError, match="CaptureUnsupported"):
                y.get()
            with pytest.raises(fake_cupy.CudaError, match="CaptureUnsupported"):
                s.synchronize()
            with pytest.raises(RuntimeError, match="H2D transfers are disallowed"):
                cp.asarray(np.ones(4, np.float32))
            with cp.cuda.Stream.null, pytest.raises(fake_cupy.CudaError,
                                                    match="CaptureImplicit"):
                y.fill(1.0)
            y.fill(2.0)  # on the capturing stream: recorded, not run
        finally:
            graph = s.end_capture()
    assert y.get().tolist() == [0.0] * 4
    graph.launch()
    assert y.get().tolist() == [2.0] * 4


# ---- FMA contraction -----------------------------------------------------------------------

@pytest.mark.skipif(not hostsim.CONTRACTS, reason="this CPU has no FMA instructions")
def test_host_rendering_contracts_a_multiply_add_as_nvrtc_does():
    """x * y + z with x = y = 1 + 2^-12, z = -(1 + 2^-11): rounded apart the product is
    1 + 2^-11 (a tie, to even) and the sum 0; fused, 2^-24. NVRTC (--fmad=true) fuses."""
    import onnx
    h = onnx.helper
    v = np.float32(1 + 2.0 ** -12)
    nodes = [h.make_node("Mul", ["x", "y"], ["p"]), h.make_node("Add", ["p", "z"], ["o"])]
    f = onnx.TensorProto.FLOAT
    graph = h.make_graph(nodes, "fma", [h.make_tensor_value_info(n, f, [3]) for n in "xyz"],
                         [h.make_tensor_value_info("o", f, [3])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    feeds = {"x": np.full(3, v), "y": np.full(3, v), "z": np.full(3, -(1 + 2.0 ** -11),
                                                                  np.float32)}
    got = autoclust.InferenceSession(model, device="gpu", must_compile=True).run(None, feeds)
    assert got[0].tolist() == [2.0 ** -24] * 3
    assert _ort(model, feeds)[0].tolist() == [0.0] * 3  # onnxruntime rounds apart


@pytest.mark.skipif(not hostsim.CONTRACTS, reason="this CPU has no FMA instructions")
def test_an_exact_multiply_is_never_contracted():
    """DequantizeLinear's x * scale is kernel IR mul_exact: rounded before the Add that
    follows (as onnxruntime does), even where the renderer contracts everything else."""
    import onnx
    h = onnx.helper
    nodes = [h.make_node("DequantizeLinear", ["q", "s"], ["d"]),
             h.make_node("Add", ["d", "z"], ["o"])]
    f = onnx.TensorProto.FLOAT
    graph = h.make_graph(nodes, "deq", [h.make_tensor_value_info("q", onnx.TensorProto.INT32,
                                                                 [2]),
                                        h.make_tensor_value_info("z", f, [2])],
                         [h.make_tensor_value_info("o", f, [2])],
                         [h.make_tensor("s", f, [], [float(np.float32(1 + 2.0 ** -12))])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
    model.ir_version = 10
    q = np.array([4097, 4097], np.int32)  # 4097 * (1 + 2^-12) = 4098 + 2^-12: rounds apart
    feeds = {"q": q, "z": np.array([-4098.0, -4098.0], np.float32)}
    got = autoclust.InferenceSession(model, device="gpu", must_compile=True,
                                     min_cluster_size=1).run(None, feeds)
    np.testing.assert_array_equal(got[0], _ort(model, feeds)[0])


# ---- streams and threads -------------------------------------------------------------------

def _two_streams(sess, model, seeds=(1, 2)):
    """Each of two threads runs `sess` on a stream of its own with device outputs; both
    runs are queued before either is read, so their kernels interleave as on a GPU."""
    cp = device.cupy()
    feeds = [zoo.feeds(model, seed=s) for s in seeds]
    queued = threading.Barrier(2)
    got: dict[int, list] = {}
    errors = []

    def worker(i: int) -> None:
        try:
            with cp.cuda.Stream(non_blocking=True):
                outs = sess.run(None, feeds[i], output_device="gpu")
                queued.wait()
                got[i] = [device.to_host(y) for y in outs]
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
            queued.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return feeds, got


@pytest.mark.parametrize("name", ["mlp_gelu", "llama_block"])
def test_two_threads_on_two_streams_keep_their_scratch_apart(name):
    """Temps (memory-plan slots), split-row workspaces, check flags and cuBLAS workspaces
    are per stream: two runs overlapping on two streams both give onnxruntime's answer."""
    model = zoo.build(name)
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True,
                                      cuda_graphs=False)
    sess.run(None, zoo.feeds(model))  # compile first: the threads only run
    feeds, got = _two_streams(sess, model)
    for i in range(2):
        for g, w in zip(got[i], _ort(model, feeds[i])):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    assert len(exe._scratch) == 3  # the first run's stream, then one per thread
    lib = blas.get()
    assert len(set(map(id, lib.workspaces.values()))) == len(lib.workspaces) >= 3


def test_a_graph_keeps_its_cublas_workspace_after_the_capturing_thread_exits():
    model = zoo.build("bert_encoder")
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True)
    feeds = [zoo.feeds(model, seed=s) for s in range(3)]
    sess.run(None, feeds[0])
    worker = threading.Thread(target=lambda: sess.run(None, feeds[1]))  # the capture
    worker.start()
    worker.join()
    del worker
    gc.collect()
    graphs = sess._runtime.device.graphs
    assert graphs.replays == 1 and graphs.reason == ""
    captured = next(iter(graphs.graphs.values()))
    assert captured.keep and captured.keep[0] is blas.get().workspaces[captured.stream.ptr]
    for g, w in zip(sess.run(None, feeds[2]), _ort(model, feeds[2])):  # replayed here
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    assert graphs.replays == 2


# ---- Conv: im2col and cuBLAS, or onnxruntime, chosen by timing --------------------------

def _timers(gpu_ms: float, ort_ms: float) -> dict:
    """Injected timers: each runs the candidate and reports a fixed time."""
    def timer(ms: float):
        def run(fn) -> float:
            fn()
            return ms
        return run
    return {"gpu": timer(gpu_ms), "onnxruntime": timer(ort_ms)}


def _conv_model(x_shape, w_shape, dtype=np.float32, **attrs):
    import onnx
    h = onnx.helper
    rng = np.random.default_rng(4)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    t = h.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [h.make_node("Mul", ["x", "two"], ["xm"]),
             h.make_node("Conv", ["xm", "w", "b"], ["c"], **attrs),
             h.make_node("Relu", ["c"], ["y"])]
    graph = h.make_graph(nodes, "conv", [h.make_tensor_value_info("x", t, list(x_shape))],
                         [h.make_tensor_value_info("y", t, None)],
                         [onnx.numpy_helper.from_array(w, "w"),
                          onnx.numpy_helper.from_array(b, "b"),
                          onnx.numpy_helper.from_array(np.array(2, dtype), "two")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


CONVS = [  # id, x shape, w shape, attrs
    ("3x3-pad", (2, 3, 9, 7), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("stride-dilation", (1, 4, 13, 11), (6, 4, 3, 2), {"strides": [2, 3], "dilations": [2, 1],
                                                       "pads": [2, 0, 1, 1]}),
    ("groups", (1, 6, 8, 8), (9, 2, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    ("depthwise", (2, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER"}),
    ("1-D", (2, 5, 17), (3, 5, 4), {"strides": [2], "pads": [1, 2]}),
    ("1x1", (1, 8, 5, 5), (16, 8, 1, 1), {}),
]


@pytest.mark.parametrize("case_id,x_shape,w_shape,attrs", CONVS, ids=[c[0] for c in CONVS])
def test_conv_on_the_gpu_path_matches_onnxruntime(monkeypatch, case_id, x_shape, w_shape,
                                                  attrs):
    from autoclust.backends.gpu import conv
    monkeypatch.setattr(conv, "TIMERS", _timers(1.0, 5.0))
    model = _conv_model(x_shape, w_shape, **attrs)
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True,
                                      min_cluster_size=1)
    for seed in range(2 * conv.RUNS + 2):  # both paths while timing, then the GPU's
        feeds = {"x": np.random.default_rng(seed).standard_normal(x_shape).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds)[0],
                                   rtol=1e-4, atol=1e-5)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    assert [c.chosen for c in exe.choices] == ["gpu"]


def test_conv_in_float16_on_the_gpu_path(monkeypatch):
    from autoclust.backends.gpu import conv
    monkeypatch.setattr(conv, "TIMERS", _timers(1.0, 5.0))
    model = _conv_model((1, 8, 10, 10), (8, 8, 3, 3), np.float16, pads=[1, 1, 1, 1])
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True,
                                      min_cluster_size=1)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 10, 10)).astype(np.float16)}
    for _ in range(2):  # run 1 on the GPU path
        got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got.astype(np.float32), _ort(model, feeds)[0].astype(np.float32),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("gpu_ms,ort_ms,chosen", [(1.0, 5.0, "gpu"), (4.0, 2.0, "onnxruntime")])
def test_conv_is_placed_by_its_timings(monkeypatch, gpu_ms, ort_ms, chosen):
    """Each candidate runs RUNS times by turns; the smaller median wins, the note says so,
    and only a plan whose Conv stays on the GPU is captured as a CUDA graph afterwards."""
    from autoclust.backends.gpu import conv
    monkeypatch.setattr(conv, "TIMERS", _timers(gpu_ms, ort_ms))
    model = zoo.build("diffusion_block")
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True)
    runs = 2 * conv.RUNS + 3
    for seed in range(runs):
        feeds = zoo.feeds(model, seed=seed)
        for g, w in zip(sess.run(None, feeds), _ort(model, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    assert [c.chosen for c in exe.choices] == [chosen, chosen]
    assert exe.notes[0] == (f"Conv /conv1/Conv: {chosen} chosen by timing (median ms: gpu "
                            f"{gpu_ms:.3g}, onnxruntime {ort_ms:.3g})")
    graphs = sess._runtime.device.graphs
    if chosen == "gpu":  # decided after 2 * RUNS runs; the next captures (and launches) it
        assert graphs.reason == "" and graphs.replays == runs - 2 * conv.RUNS
    else:
        assert graphs.replays == 0 and graphs.reason == f"cluster_0000: {exe.notes[0]}"


# ---- cuBLASLt epilogues, bfloat16 GEMMs ---------------------------------------------------

def test_bias_gemms_run_as_cublaslt_bias_epilogues():
    """BERT's Q/K/V projections are Gemm calls with a bias row: one cuBLASLt matmul each
    (epilogue BIAS), captured into the CUDA graph with everything else (main's siblings
    pass, which joins Q/K/V into one GEMM, is off here: it is the per-GEMM path under test)."""
    from autoclust.backends.gpu import blaslt
    model = zoo.build("bert_encoder")
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True,
                                      disable_passes="siblings")
    for seed in range(3):
        feeds = zoo.feeds(model, seed=seed)
        for g, w in zip(sess.run(None, feeds), _ort(model, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    calls = blaslt.get().lib.calls
    assert {c["epilogue"] for c in calls} == {blaslt.BIAS}
    assert len(calls) == 2 * 6  # 3 per layer, 2 layers: the eager run and the capture
    assert sess._runtime.device.graphs.replays == 2


@pytest.mark.parametrize("epilogue", ["BIAS", "GELU", "GELU_BIAS"])
def test_cublaslt_epilogues_through_the_binding(epilogue):
    """y = epilogue(x @ w + b) for y [5, 6] = x [5, 8] @ w [8, 6]: cuBLASLt's GELU is the
    tanh approximation; the plan's layouts are gemm.py's column-major ones."""
    from autoclust.backends.gpu import blaslt, gemm, library
    from support import fake_cublas
    cp = device.cupy()
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((8, 6)).astype(
        np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    (call,) = gemm.plan_matmul(x.shape, w.shape).calls
    lt = blaslt.get()
    plan = lt.plan(call, 0, library.COMPUTE_32F, 0, getattr(blaslt, epilogue))
    dx, dw, db = cp.asarray(x), cp.asarray(w), cp.asarray(b)
    y = cp.empty((5, 6), dtype=cp.float32)
    one, zero = np.array([1.0], np.float32), np.array([0.0], np.float32)
    ws = blas.get().workspace(0)
    lt.matmul(plan, one.ctypes.data, dw.data.ptr, dx.data.ptr, zero.ctypes.data, y.data.ptr,
              db.data.ptr, ws.data.ptr, 0)
    want = x.astype(np.float64) @ w.astype(np.float64)
    if "BIAS" in epilogue:
        want = want + b
    if "GELU" in epilogue:
        want = fake_cublas.gelu_tanh(want)
    np.testing.assert_allclose(y.get(), want, rtol=1e-6, atol=1e-6)


def test_bfloat16_gemm_end_to_end():
    """bfloat16 in, MatMul (cuBLAS CUDA_R_16BF, float32 accumulation) and a bias Add, out
    as ml_dtypes bfloat16; onnxruntime's CPU provider has no bfloat16 MatMul, so the
    reference is float64 on the same values, rounded once."""
    import ml_dtypes
    import onnx
    h = onnx.helper
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((32, 16)).astype(bf16)
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])]
    bt = onnx.TensorProto.BFLOAT16
    graph = h.make_graph(nodes, "bf", [h.make_tensor_value_info("x", bt, [4, 32])],
                         [h.make_tensor_value_info("y", bt, [4, 16])],
                         [onnx.numpy_helper.from_array(w, "w")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True)
    x = rng.standard_normal((4, 32)).astype(bf16)
    for _ in range(3):  # eager, captured, replayed: the bfloat16 feed through every path
        (got,) = sess.run(None, {"x": x})
        assert got.dtype == bf16
        want = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0).astype(bf16)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=2 ** -7, atol=1e-6)
    assert sess._runtime.device.graphs.replays == 2
    y = sess.run(None, {"x": device.to_device(x)}, output_device="gpu")[0]
    assert isinstance(y, device.BF16Array) and y.dtype == bf16
    np.testing.assert_array_equal(device.to_host(y), got)
