"""Whole-model speed machinery of the CPU backend: the thread splitter, code sharing between
repeated layers, constant folding of library ops, the library choice rule, and Concat
into its buffer. Every compiled result is checked against onnxruntime."""

from __future__ import annotations

import textwrap
import threading
import time

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.backends.cpu import executable, library
from autoclust.importers.onnx import import_model
from autoclust.models import zoo

import autoclust
from autoclust import flags as flags_mod
from autoclust.compile import compile_cluster

RNG = np.random.default_rng(7)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(textwrap.dedent(text))
    model.ir_version = 10
    return model


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compile_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **overrides):
    graph = import_model(model)
    types = [(feeds[v.name].dtype, feeds[v.name].shape) for v in graph.inputs]
    exe = compile_cluster(graph, types, {}, flags_mod.parse("", **overrides), cpu)
    return exe, [feeds[v.name] for v in graph.inputs]


def assert_matches_ort(model, feeds, got, rtol=1e-5, atol=1e-5):
    for e, o in zip(ort_run(model, feeds), got):
        assert o.shape == e.shape and o.dtype == e.dtype
        np.testing.assert_allclose(o, e, rtol=rtol, atol=atol)


# ---- splitter ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n0,work,threads,min_chunk", [
    (1, 10**9, 2, 1), (8, 1 << 20, 2, 1 << 16), (1000, 1 << 20, 2, 1 << 16),
    (1000, 1 << 17, 2, 1 << 16), (7, 1 << 30, 4, 1), (5, 10, 2, 1 << 16)])
def test_chunk_bounds_cover_the_range_once(n0, work, threads, min_chunk):
    bounds = executable.chunk_bounds(n0, work, threads, min_chunk)
    covered = [i for a, b in bounds for i in range(a, b)]
    assert covered == list(range(n0))
    assert len(bounds) <= 4 * threads
    assert len(bounds) <= max(1, work // min_chunk)


def test_splitter_runs_every_chunk_once_and_uses_the_helper():
    splitter = executable.Splitter(1)
    seen: list[tuple[int, int, str]] = []

    def fn(bufs, start, stop):
        time.sleep(0.004)  # releases the GIL, as a ctypes kernel call does
        seen.append((start, stop, threading.current_thread().name))

    bounds = [(i, i + 1) for i in range(12)]
    splitter.run(fn, 0, bounds)
    assert sorted((a, b) for a, b, _ in seen) == bounds
    assert {name for *_, name in seen} == {"MainThread", "autoclust-cpu-0"}


def test_splitter_stale_jobs_claim_nothing():
    """Jobs the caller finishes alone stay queued for the helper; they must run nothing."""
    splitter = executable.Splitter(1)
    counts = np.zeros(64, np.int64)

    def fn(bufs, start, stop):
        counts[start:stop] += 1

    for _ in range(200):
        splitter.run(fn, 0, [(0, 32), (32, 64)])
    time.sleep(0.05)  # let the helper drain the queue
    assert (counts == 200).all()


def test_split_kernel_equals_single_thread():
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[N] x) => (float[N] y) {
            a = Mul(x, x)
            b = Tanh(a)
            c = Sigmoid(x)
            y = Add(b, c)
        }
    """)
    x = RNG.standard_normal(1 << 19).astype(np.float32)
    exe2, args = compile_model(model, {"x": x}, threads=2)
    exe1, _ = compile_model(model, {"x": x}, threads=1)
    assert exe2.split and not exe1.split, exe2.dumps[".kernels.txt"]
    y2 = exe2.run(args)[0]
    np.testing.assert_array_equal(y2, exe1.run(args)[0])
    assert_matches_ort(model, {"x": x}, [y2])


# ---- code sharing ----------------------------------------------------------------------------

def layered_model(layers: int, d: int = 32) -> onnx.ModelProto:
    """h = tanh(h @ W_i + b_i) per layer: one elementwise kernel between library calls."""
    from onnx import helper, numpy_helper
    nodes, inits, h = [], [], "x"
    for i in range(layers):
        w = (RNG.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(RNG.standard_normal(d).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Tanh", [f"a{i}"], [f"h{i}"])]
        h = f"h{i}"
    graph = helper.make_graph(nodes, "layers",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                             [16, d])],
                              [helper.make_tensor_value_info(h, onnx.TensorProto.FLOAT,
                                                             [16, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_identical_kernels_share_one_function():
    model = layered_model(3)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    exe, args = compile_model(model, {"x": x})
    assert_matches_ort(model, {"x": x}, exe.run(args))
    kernels = exe.dumps[".kernels.txt"]
    # each layer's bias+tanh kernel rides its GEMM as an epilogue (kernel/epilogues.py)
    assert kernels.count("kernel k") == 3, kernels
    assert kernels.count("runs k") == 2, kernels  # "k3 runs k1's code", ...
    assert exe.dumps[".ll"].count("define void @k") == 2, kernels  # one k and its k.body
    # Inputs bind per run into every sharing kernel's pointer array.
    x2 = RNG.standard_normal((16, 32)).astype(np.float32)
    assert_matches_ort(model, {"x": x2}, exe.run([x2]))


def test_zoo_bert_layers_share_code_and_match_onnxruntime():
    model = zoo.build("bert_encoder", hidden=32, heads=2, layers=3)
    feeds = zoo.feeds(model, dims={"batch": 2, "seq": 8})
    sess = autoclust.InferenceSession(model, threads=2)
    got = sess.run(None, feeds)
    assert_matches_ort(model, feeds, got, rtol=1e-4, atol=1e-4)
    exes = [e for r in sess._runtime.compiled_clusters() for e in r.cache.values()]
    assert any("code sharing" in e.dumps[".kernels.txt"] for e in exes)


# ---- folding library ops ----------------------------------------------------------------------

def test_rotary_tables_fold_to_constants():
    """llama's cos/sin tables come from MatMul(inv_freq, positions): at concrete shapes
    (symbolic dims off) they fold to constants, no cos/sin per run."""
    model = zoo.build("llama_block", hidden=64, heads=2)
    feeds = zoo.feeds(model, dims={"batch": 2, "seq": 16})
    sess = autoclust.InferenceSession(model, threads=1, symbolic_dims=False)
    got = sess.run(None, feeds)
    assert_matches_ort(model, feeds, got, rtol=1e-4, atol=1e-4)
    text = "".join(e.dumps[".kernels.txt"] for r in sess._runtime.compiled_clusters()
                   for e in r.cache.values())
    assert "cos(" not in text and "sin(" not in text, text


def test_rotary_tables_are_computed_once_per_run_over_their_own_shape():
    """With symbolic dims the positions are a run-time range, so the tables are computed
    per run: once, in a kernel over [seq, head_dim], not inlined into the rotary kernel over
    [batch, heads, seq, head_dim], which computed cos and sin for every head (fusion's
    BROADCAST_RECOMPUTE rule)."""
    model = zoo.build("llama_block", hidden=64, heads=2)
    feeds = zoo.feeds(model, dims={"batch": 2, "seq": 16})
    sess = autoclust.InferenceSession(model, threads=1)
    got = sess.run(None, feeds)
    assert_matches_ort(model, feeds, got, rtol=1e-4, atol=1e-4)
    (runner,) = sess._runtime.compiled_clusters()
    assert runner.symbolic, runner.symbolic_note
    text = "".join(e.dumps[".kernels.txt"] for e in runner.cache.values())
    header, table_kernels = "", set()
    for line in text.splitlines():
        if line.lstrip().startswith(("kernel k", "epilogue kernel k")):
            header = line.split("#")[0].strip()
        if "cos(" in line or "sin(" in line:
            table_kernels.add(header)
    assert table_kernels and all(h.endswith("[seq, 32]") for h in table_kernels), text
    assert "Cos_output_0 materialized: recomputed" in text


# ---- library choice and Concat ---------------------------------------------------------------

@pytest.mark.parametrize("m,k,n,impl", [(32, 64, 64, "numpy"), (128, 128, 128, "mlas"),
                                        (512, 256, 688, "mlas")])
def test_library_choice_is_a_size_rule(m, k, n, impl, monkeypatch):
    # the size rule's own answer: no decision measured by an earlier test in this worker,
    # and no background measurement switching the call before the assert reads it
    monkeypatch.setattr(library, "_DECISIONS", {})
    monkeypatch.setattr(library, "_measure_later", lambda *a, **k: None)
    f32 = np.dtype("float32")
    ins, outs = [(f32, (m, k)), (f32, (k, n))], [(f32, (m, n))]
    t0 = time.perf_counter()
    fn = library.make_call("MatMul", {}, ins, outs, threads=2)
    assert fn.impl == impl and "probed" not in fn.note
    assert time.perf_counter() - t0 < 2.0  # no probing runs at compile time
    a, b = RNG.standard_normal((m, k)).astype(f32), RNG.standard_normal((k, n)).astype(f32)
    y = np.empty((m, n), f32)
    fn([a, b], [y])
    np.testing.assert_allclose(y, a @ b, rtol=1e-4, atol=1e-3)


def test_concat_writes_into_its_buffer():
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[4, 3, 5] x, float[4, 2, 5] z) => (float[4, 5, 5] y, float[4, 5, 5] w) {
            n = Neg(z)
            c = Concat <axis = -2> (x, n)
            y = Relu(c)
            w = Concat <axis = 1> (n, x)
        }
    """)
    feeds = {"x": RNG.standard_normal((4, 3, 5)).astype(np.float32),
             "z": RNG.standard_normal((4, 2, 5)).astype(np.float32)}
    exe, args = compile_model(model, feeds)
    for _ in range(2):  # buffers are reused across runs
        assert_matches_ort(model, feeds, exe.run(args))


def test_splitter_hands_errors_to_the_caller():
    splitter = executable.Splitter(1)

    def fn(bufs, start, stop):
        time.sleep(0.002)
        if start == 3:
            raise ValueError("chunk 3 failed")

    with pytest.raises(ValueError, match="chunk 3"):
        splitter.run(fn, 0, [(i, i + 1) for i in range(6)])
    done = []
    splitter.run(lambda b, s, e: done.append(s), 0, [(0, 1), (1, 2)])  # still serving
    assert sorted(done) == [0, 1]
