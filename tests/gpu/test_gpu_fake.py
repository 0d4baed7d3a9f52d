"""The GPU backend's Python side run for real on a stand-in CuPy (tests/support/fake_cupy.py), whose
"kernels" are their C rendering: the executable (buffers, slots, launch arguments, grids,
check flags), the cuBLAS calls' pointers and strides, NVRTC caching and dumps, the
runtime's moves and the CUDA graph capture and replay. What it cannot tell -- whether the
CUDA code is right on the chip -- is tests/gpu/test_gpu.py's job on a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends import cpu, gpu
from autoclust.backends.gpu import blas, device, nvrtc
from autoclust.models import zoo
from support import fake_cupy
from support.compiled import one_node_graph, rand
from support.gpu_models import KERNELS
from support.gpu_render import (
    CASE_LIST,
    VARIANTS,
    assert_matches,
    needs_cc,
)

import autoclust
from autoclust import flags as flags_mod
from autoclust.compile import lower_graph
from autoclust.errors import InvalidInputError
from autoclust.runtime import transfers

pytestmark = needs_cc  # the C rendering runs through the host C compiler

FLAGS = flags_mod.parse("")
_BUILT: dict[str, list] = {}


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    yield from fake_cupy.installed(monkeypatch)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("variant", ["chosen", "block"])
@pytest.mark.parametrize("index", range(len(CASE_LIST)), ids=[c.id for c in CASE_LIST])
def test_lowered_op_through_the_gpu_executable(variant, index):
    case = CASE_LIST[index]
    if case.program is None:
        from support.compiled import run_onnxruntime
        for c in CASE_LIST:
            c.program = c.program or lower_graph(c.graph, FLAGS, cpu)
            c.expected = c.expected or [np.asarray(e) for e in
                                        run_onnxruntime(c.graph, c.feeds)]
    if variant not in _BUILT:
        _BUILT[variant] = gpu.compile_many([c.program for c in CASE_LIST], FLAGS,
                                           VARIANTS[variant])
    outs = _BUILT[variant][index].run(case.feeds)
    assert all(isinstance(y, fake_cupy.FakeArray) for y in outs)
    assert_matches(case, [device.to_host(y) for y in outs], variant)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_zoo_model_with_device_gpu(name):
    model = zoo.build(name)
    sess = autoclust.InferenceSession(model, device="gpu")
    for seed in range(3):  # eager, then captured and replayed where the plan allows
        feeds = zoo.feeds(model, seed=seed)
        for g, w in zip(sess.run(None, feeds), _ort(model, feeds)):
            assert type(g) is np.ndarray
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
        if sess._runtime is not None:
            copied = sess._runtime.device.last_copies
            assert copied.copies == len(transfers.plan_copies(sess.plan))
    # (data-dependent shapes recompile per seed: compare each cluster's first compile)
    assert [c["kernels"][:1] for c in sess.stats()["clusters"]] == KERNELS[name]


def test_cuda_graph_capture_and_replay():
    model = zoo.build("rmsnorm_gate")
    sess = autoclust.InferenceSession(model, device="gpu")
    graphs = sess._runtime.device.graphs
    assert graphs.reason == ""
    for seed in range(4):  # new data every run: a replay must read the new feeds
        feeds = zoo.feeds(model, seed=seed)
        got = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)
    assert graphs.replays == 3 and len(graphs.graphs) == 1
    assert sess.stats()["clusters"][0]["runs"] == 4
    first = sess.run(None, zoo.feeds(model, seed=0), output_device="gpu")[0]
    kept = device.to_host(first)
    sess.run(None, zoo.feeds(model, seed=1), output_device="gpu")
    assert graphs.replays == 5
    # device outputs handed out are copies: the next replay does not overwrite them
    np.testing.assert_array_equal(device.to_host(first), kept)
    assert autoclust.InferenceSession(model, device="gpu",
                                      cuda_graphs=False)._runtime.device.graphs is None
    mixed = autoclust.InferenceSession(zoo.build("mixed_dynamic"), device="gpu")
    assert "onnxruntime" in mixed._runtime.device.graphs.reason


def _bert_runs(runs: int, after_first: Any = None) -> Any:
    """A BERT session on device gpu run `runs` times on new data, checked each time;
    after_first() is called after the first (eager) run."""
    model = zoo.build("bert_encoder")
    sess = autoclust.InferenceSession(model, device="gpu")
    for seed in range(runs):
        feeds = zoo.feeds(model, seed=seed)
        for g, w in zip(sess.run(None, feeds), _ort(model, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
        if seed == 0 and after_first is not None:
            after_first()
    return sess


def test_cuda_graphs_capture_cublas_gemms(monkeypatch):
    # the GEMMs go through blas.py's own handles, which capture accepts
    eager = []
    sess = _bert_runs(4, lambda: eager.append(blas.get().lib.calls))
    graphs = sess._runtime.device.graphs
    assert graphs.reason == "" and graphs.replays == 3 and len(graphs.graphs) == 1  # runs 2-4
    lib = blas.get().lib
    assert eager[0] >= 6 and lib.calls == 2 * eager[0]  # eager + captured; replays add none
    assert set(lib.workspace) == set(lib.stream)  # every handle kept its own workspace
    # without libcublas the GEMMs go through CuPy's wrapper: no capture, same results
    monkeypatch.setattr(blas, "_load_library", lambda: None)
    blas.get.cache_clear()
    sess = _bert_runs(3)
    graphs = sess._runtime.device.graphs
    assert graphs.replays == 0
    assert "calls cuBLAS through CuPy's wrapper" in graphs.reason


def test_a_capture_on_a_new_thread_creates_its_cublas_handle_first():
    # run 1 on this thread; run 2 (the capture) on another, whose first GEMM is captured:
    # its handle must exist before the capture begins (creating one allocates)
    import threading
    model = zoo.build("bert_encoder")
    sess = autoclust.InferenceSession(model, device="gpu")
    feeds = [zoo.feeds(model, seed=s) for s in range(2)]
    sess.run(None, feeds[0])
    got = []
    worker = threading.Thread(target=lambda: got.append(sess.run(None, feeds[1])))
    worker.start()
    worker.join()
    graphs = sess._runtime.device.graphs
    assert graphs.reason == "" and graphs.replays == 1
    for g, w in zip(got[0], _ort(model, feeds[1])):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


def test_device_arrays_in_and_out():
    cp = device.cupy()
    model = zoo.build("layernorm")
    x = zoo.feeds(model)["x"]
    sess = autoclust.InferenceSession(model, device="gpu")
    y = sess.run(None, {"x": cp.asarray(x)}, output_device="gpu")[0]
    assert isinstance(y, cp.ndarray)
    copied = sess._runtime.device.last_copies
    assert (copied.h2d, copied.d2h) == (0, 0)
    np.testing.assert_allclose(cp.asnumpy(y), _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_device_side_checks_raise_the_cpu_message():
    x = rand((5, 4))
    idx = np.array([[0, 7]], np.int64)
    program = lower_graph(one_node_graph("Gather", [x, idx], {"axis": 0}), FLAGS, cpu)
    exe = gpu.compile(program, FLAGS)
    with pytest.raises(InvalidInputError) as got:
        exe.run([x, idx])
    with pytest.raises(InvalidInputError) as want:
        cpu.compile(program, FLAGS).run([x, idx])
    assert str(got.value) == str(want.value)
    ok = np.array([[0, 4]], np.int64)  # the flags are reset every run
    np.testing.assert_array_equal(device.to_host(exe.run([x, ok])[0]), x[ok])


def test_cache_dir_and_dumps(tmp_path):
    x = rand((6, 7))
    program = lower_graph(one_node_graph("Softplus", [x]), FLAGS, cpu)
    flags = flags_mod.parse("", cache_dir=str(tmp_path / "cache"), dump_to=str(tmp_path))
    exe = gpu.compile(program, flags)
    assert {".cu", ".kernels.txt", ".ptx"} <= set(exe.dumps)
    assert "GPU launches:" in exe.dumps[".kernels.txt"]
    nvrtc._MODULES.clear()
    hits = nvrtc.COUNTS["disk_hits"]
    exe = gpu.compile(program, flags)
    assert nvrtc.COUNTS["disk_hits"] == hits + 1
    entry = next((tmp_path / "cache" / "gpu").iterdir())
    entry.write_bytes(entry.read_bytes()[:-10])  # a truncated entry is rebuilt
    nvrtc._MODULES.clear()
    compiles = nvrtc.COUNTS["compiles"]
    gpu.compile(program, flags)
    assert nvrtc.COUNTS["compiles"] == compiles + 1
    np.testing.assert_allclose(device.to_host(exe.run([x])[0]), np.log1p(np.exp(x)),
                               rtol=1e-5)


def test_bench_kernel_rows(monkeypatch, tmp_path):
    """`autoclust bench --device gpu` end to end on small sizes (timings are meaningless
    here; the rows, the bandwidth arithmetic and the report are what is checked)."""
    from autoclust.tools.bench import gpu as bench_gpu
    small = {k: (m, kw, {d: 64 for d in dims}, ew) for k, (m, kw, dims, ew)
             in bench_gpu.KERNELS.items()}
    small["rmsnorm_gate"] = ("rmsnorm_gate", {"d": 64}, {"n": 32}, False)
    monkeypatch.setattr(bench_gpu, "KERNELS", small)
    monkeypatch.setattr(bench_gpu, "COPY_BYTES", 1 << 16)
    assert bench_gpu.device_of(["--device", "gpu"]) == "gpu"
    assert bench_gpu.device_of(["--cases", "x"]) == "cpu"
    rc = bench_gpu.main(["--device=gpu", "--cases", "kernels", "--repeat", "2", "--out",
                         str(tmp_path)])
    assert rc == 0
    import json
    rows = json.loads((tmp_path / "bench_gpu.json").read_text())["kernels"]
    assert [r["case"] for r in rows] == list(small)
    for r in rows:
        assert "error" not in r, r
        assert r["kernels"] == 1 and r["max_abs_err"] < 1e-4
        assert r["fraction"] == pytest.approx(r["gbps"] / r["copy_gbps"])
    assert "| chain16 | 1 |" in (tmp_path / "bench_gpu.md").read_text()
