"""The GPU backend on a real GPU (`pytest -m gpu`); every test skips, with the reason, where
CuPy or a CUDA GPU is missing.

Every lowered op and edge case of tests/gpu/test_gpu_render.py under the launch the renderer
picks and under forced strategies (one thread / warp / block per row, 64-bit indices,
scalar instead of vector), every zoo model against onnxruntime with pinned kernel counts,
device arrays in and out (CuPy, torch CUDA tensors), CUDA graph replay, device-side checks,
denormals, and the --cache_dir cache.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends import cpu, gpu
from autoclust.backends.gpu import device, nvrtc
from autoclust.models import zoo
from support.compiled import one_node_graph, rand
from support.gpu_models import (
    HALF_MODELS,
    KERNELS,
    assert_no_fallback,
    half_feeds,
    strict_session,
    to_float16,
)
from support.gpu_render import CASE_LIST, VARIANTS, assert_matches

import autoclust
from autoclust import flags as flags_mod
from autoclust.compile import lower_graph
from autoclust.errors import InvalidInputError

REASON = device.available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=REASON or "-")]
FLAGS = flags_mod.parse("")
_BUILT: dict[str, list] = {}


def _host(outs: list) -> list:
    return [device.to_host(y) for y in outs]


@pytest.fixture(scope="module")
def programs() -> list:
    for c in CASE_LIST:
        if c.program is None:
            from support.compiled import run_onnxruntime
            c.program = lower_graph(c.graph, FLAGS, cpu)
            c.expected = [np.asarray(e) for e in run_onnxruntime(c.graph, c.feeds)]
    return CASE_LIST


@pytest.mark.parametrize("variant", ["chosen", "block", "thread-wide", "scalar-wide", "warp"])
@pytest.mark.parametrize("index", range(len(CASE_LIST)), ids=[c.id for c in CASE_LIST])
def test_lowered_op_on_the_gpu(programs, variant, index):
    if variant not in _BUILT:  # one NVRTC module per variant
        _BUILT[variant] = gpu.compile_many([c.program for c in programs], FLAGS,
                                           VARIANTS[variant])
    case = programs[index]
    assert_matches(case, _host(_BUILT[variant][index].run(case.feeds)), variant)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_zoo_model_on_the_gpu(name):
    model = zoo.build(name)
    feeds = zoo.feeds(model)
    sess = strict_session(name, model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):  # eager, captured, replayed
        for g, w in zip(sess.run(None, feeds), ref.run(None, feeds)):
            assert type(g) is np.ndarray
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    assert [c["kernels"] for c in sess.stats()["clusters"]] == KERNELS[name]
    assert_no_fallback(sess)


@pytest.mark.parametrize("name", HALF_MODELS)
def test_zoo_model_in_float16(name):
    """float16 storage, float32 math rounded after every op, fp16 cuBLAS (fp32 accumulate):
    within float16 rounding of onnxruntime."""
    model = to_float16(zoo.build(name))
    feeds = half_feeds(model)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    got = autoclust.InferenceSession(model, device="gpu", must_compile=True).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == np.float16
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-2,
                                   atol=2e-2)


@pytest.mark.parametrize("name", [n for n in HALF_MODELS if n in ("bert_encoder", "llama_block")])
@pytest.mark.parametrize("mma", [False, True], ids=["cuda-cores", "tensor-cores"])
def test_float16_attention_on_both_kernels(name, mma):
    """The zoo's attention models in float16 with the fused kernel on CUDA cores and on
    tensor cores (--gpu_mma_attention): onnxruntime's answer within float16 rounding."""
    model = to_float16(zoo.build(name))
    feeds = half_feeds(model)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True,
                                      gpu_mma_attention=mma)
    for g, w in zip(sess.run(None, feeds), want):
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-2,
                                   atol=2e-2)
    texts = [exe.dumps[".cu"] for r in sess._runtime.compiled_clusters()
             for exe in r.cache.values()]
    assert any("mma.sync" in t for t in texts) == mma


def test_device_arrays_in_and_out():
    cp = device.cupy()
    model = zoo.build("gelu")
    x = zoo.feeds(model)["x"]
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y = sess.run(None, {"x": cp.asarray(x)}, output_device="gpu")[0]
    assert isinstance(y, cp.ndarray)
    copied = sess._runtime.device.last_copies
    assert (copied.h2d, copied.d2h) == (0, 0)
    np.testing.assert_allclose(cp.asnumpy(y), want, rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    y = sess.run(None, {"x": torch.from_numpy(x).cuda()}, output_device="gpu")[0]
    np.testing.assert_allclose(torch.from_dlpack(y).cpu().numpy(), want, rtol=1e-5,
                               atol=1e-6)


def test_cuda_graph_replay():
    model = zoo.build("rmsnorm_gate")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = autoclust.InferenceSession(model, device="gpu", must_compile=True)
    graphs = sess._runtime.device.graphs
    assert graphs is not None and graphs.reason == ""
    for seed in range(4):  # new data every run: the replay must read the new feeds
        feeds = zoo.feeds(model, seed=seed)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0],
                                   rtol=1e-4, atol=1e-5)
    assert graphs.replays == 3 and len(graphs.graphs) == 1
    off = autoclust.InferenceSession(model, device="gpu", cuda_graphs=False)
    assert off._runtime.device.graphs is None
    # GEMMs are captured too (blas.py's own handles): BERT replays from its second run
    bert = autoclust.InferenceSession(zoo.build("bert_encoder"), device="gpu",
                                      must_compile=True)
    for _ in range(3):
        bert.run(None, zoo.feeds(zoo.build("bert_encoder")))
    bert_graphs = bert._runtime.device.graphs
    assert bert_graphs.reason == "" and bert_graphs.replays == 2


def test_device_side_check_raises_the_cpu_message():
    x = rand((5, 4))
    idx = np.array([[0, 7]], np.int64)
    program = lower_graph(one_node_graph("Gather", [x, idx], {"axis": 0}), FLAGS, cpu)
    with pytest.raises(InvalidInputError) as got:
        gpu.compile(program, FLAGS).run([x, idx])
    with pytest.raises(InvalidInputError) as want:
        cpu.compile(program, FLAGS).run([x, idx])
    assert str(got.value) == str(want.value)


def test_denormals_survive():
    """NVRTC's defaults through our options: no flush-to-zero (CuPy's RawModule adds
    -ftz=true; we compile ourselves to keep IEEE denormals)."""
    x = np.array([1e-40, -3e-42, 1e-38], np.float32)
    program = lower_graph(one_node_graph("Neg", [x]), FLAGS, cpu)
    y = device.to_host(gpu.compile(program, FLAGS).run([x])[0])
    np.testing.assert_array_equal(y, -x)


def test_cache_dir_reuses_compiled_modules(tmp_path):
    x = rand((6, 7))
    program = lower_graph(one_node_graph("Softplus", [x]), FLAGS, cpu)
    flags = flags_mod.parse("", cache_dir=str(tmp_path))
    gpu.compile(program, flags)
    nvrtc._MODULES.clear()
    hits = nvrtc.COUNTS["disk_hits"]
    exe = gpu.compile(program, flags)
    assert nvrtc.COUNTS["disk_hits"] == hits + 1
    assert list((tmp_path / "gpu").iterdir())
    np.testing.assert_allclose(device.to_host(exe.run([x])[0]), np.log1p(np.exp(x)),
                               rtol=1e-5)


def test_float32_gemm_is_full_precision():
    a, b = rand((64, 256)), rand((256, 48))
    program = lower_graph(one_node_graph("MatMul", [a, b]), FLAGS, cpu)
    y = device.to_host(gpu.compile(program, FLAGS).run([a, b])[0])
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)  # TF32 would be ~1e-3
