"""Symbolic dims: a cluster compiles once per shape class (its open dims symbolic, guarded),
so a new sequence length binds the compiled code instead of lowering or compiling, and a
stream of lengths never turns the cluster megamorphic. Outputs are checked against
onnxruntime at every length; compiles are counted (LLVM compiles, lowerings)."""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.backends.cpu import jit
from autoclust.models import zoo

import autoclust
from autoclust import compile as compile_mod
from autoclust.runtime import runner as runner_mod

# lengths a server might see, in arrival order (large and small mixed, repeats at the end)
STREAM = (16, 9, 33, 5, 64, 17, 2, 48, 31, 12, 7, 100, 3, 25, 40, 11, 57, 20, 8, 77, 9, 16)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(textwrap.dedent(text))
    model.ir_version = 10
    return model


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def serve_lengths(model, feeds_of, lengths, rtol=1e-6, atol=1e-6):
    """One session (one thread, every node clustered, placement off) runs feeds_of(seq)
    for each length, checked against onnxruntime; its cluster's runner, and the LLVM
    compiles after the first length."""
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1, autotune=False)
    ref = ort_session(model)
    llvm = None
    for seq in lengths:
        feeds = feeds_of(seq)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0],
                                   rtol=rtol, atol=atol, err_msg=f"seq {seq}")
        llvm = cpu.COMPILE_COUNT if llvm is None else llvm
    (runner,) = sess._runtime.compiled_clusters()
    return runner, cpu.COMPILE_COUNT - llvm


def run_stream(sess, ref, model, lengths, batch=2, tol=1e-4):
    """Run each length, check it against onnxruntime; (LLVM compiles, lowerings) per length
    and the RuntimeWarnings raised."""
    counts = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for seq in lengths:
            feeds = zoo.feeds(model, dims={"batch": batch, "seq": seq})
            llvm, lowered = cpu.COMPILE_COUNT, compile_mod.COUNTS["lowered"]
            got = sess.run(None, feeds)
            counts.append((cpu.COMPILE_COUNT - llvm, compile_mod.COUNTS["lowered"] - lowered))
            for g, e in zip(got, ref.run(None, feeds)):
                assert g.shape == e.shape, seq
                np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=f"seq {seq}")
    return counts, [str(r.message) for r in record if issubclass(r.category, RuntimeWarning)]


@pytest.fixture(scope="module")
def bert():
    model = zoo.build("bert_encoder")
    return model, ort_session(model)


def test_zoo_bert_length_stream_compiles_once_and_never_turns_megamorphic(bert, monkeypatch):
    model, ref = bert
    # kernel object code compiled by an earlier test in this worker (the same zoo model)
    # would make the first length compile nothing: start from an empty in-memory cache
    monkeypatch.setattr(jit, "_OBJECTS", {})
    sess = autoclust.InferenceSession(model, threads=1, autotune=False)
    counts, warned = run_stream(sess, ref, model, STREAM)
    (runner,) = sess._runtime.compiled_clusters()
    assert warned == [] and runner.fallback is None and runner.fallback_reason == ""
    assert counts[0][0] >= 1  # the first length compiles the class through LLVM
    assert [c[0] for c in counts[1:]] == [0] * (len(STREAM) - 1), counts  # never again
    # small and large rows take different GEMM code (a guard on batch * seq, its threshold
    # by GEMM width: the sibling-fused Q/K/V GEMM is 3x wider than the other projections):
    # at most two more classes, lowered but reusing the LLVM code; other lengths only bind.
    # An AVX2 host adds one: attention's products are generated below 3e5 flops a batch
    # only (gemm.AVX2_MAX_BATCH_FLOPS), a guard on seq of its own
    most = 3 if jit.has_avx512() else 4
    assert runner.compiles == len(runner.classes) <= most, runner.symbolic_note
    assert sum(c[1] for c in counts) == runner.compiles
    assert runner.bindings == len(set(STREAM))  # each length once, repeats run bound code


def test_concrete_shapes_turn_the_same_stream_megamorphic(bert):
    """--symbolic_dims=0 is what the default was before: every length compiles, and the
    cluster falls back to onnxruntime with one warning (the test above would fail so)."""
    model, ref = bert
    sess = autoclust.InferenceSession(model, threads=1, autotune=False, symbolic_dims=False,
                                      megamorphic_compiles=4)
    counts, warned = run_stream(sess, ref, model, STREAM[:6])
    (runner,) = sess._runtime.compiled_clusters()
    assert [c[1] for c in counts[:4]] == [1, 1, 1, 1]
    assert len(warned) == 1 and "megamorphic: compiled 4 times" in warned[0]
    assert "input_ids[1]" in runner.fallback_reason


def test_measured_placement_and_check_bounds_serve_new_lengths_without_compiling(bert):
    """The default flags (measured placement on) and --check_bounds (a guard pointer
    before the dims' values in each kernel's argument array) over bound shape classes."""
    model, ref = bert
    for flags in ({}, {"check_bounds": True, "autotune": False}):
        sess = autoclust.InferenceSession(model, threads=1, **flags)
        counts, warned = run_stream(sess, ref, model, (16, 9, 33, 5, 2))
        assert [c for c in counts[1:]] == [(0, 0)] * 4, (flags, counts)
        assert warned == [], flags


def test_bindings_are_bounded_and_an_evicted_length_binds_again(monkeypatch):
    monkeypatch.setattr(runner_mod, "MAX_BINDINGS", 4)
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, seq] x) => (float[batch, seq] y) {
            t = Mul(x, x)
            y = Sigmoid(t)
        }""")
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1, autotune=False)
    ref = ort_session(model)
    rng = np.random.default_rng(3)
    lowered = compile_mod.COUNTS["lowered"]
    for seq in (5, 6, 7, 8, 9, 10, 11, 5):
        x = rng.standard_normal((3, seq)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-6, atol=1e-6)
    (runner,) = sess._runtime.compiled_clusters()
    assert compile_mod.COUNTS["lowered"] - lowered == 1 and runner.compiles == 1
    assert len(runner.cache) <= 4 and len(runner.route) <= 4
    assert runner.bindings == 8  # 7 lengths; seq 5 was evicted (by 9) and bound again


@pytest.mark.parametrize("seq", [3, 9, 20, 33])
def test_max_rows_of_a_symbolic_length_propagate_nan(seq):
    """Max/min rows of symbolic length: vector chunks (length >= the vector width) or the
    scalar loop (shorter), chosen at run time; a NaN anywhere gives NaN (NumPy)."""
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, seq] x) => (float[batch, seq] y) {
            m = ReduceMax <keepdims = 1> (x, axes)
            y = Sub(x, m)
        }""")
    axes = onnx.helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [1])
    model.graph.initializer.append(axes)
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1, autotune=False)
    rng = np.random.default_rng(seq)
    sess.run(None, {"x": rng.standard_normal((4, 12)).astype(np.float32)})  # the class
    x = rng.standard_normal((4, seq)).astype(np.float32)
    x[1, 0], x[2, seq - 1], x[3, seq // 2] = np.nan, np.nan, np.nan
    llvm = cpu.COMPILE_COUNT
    got = sess.run(None, {"x": x})[0]
    assert cpu.COMPILE_COUNT == llvm
    expect = x - np.max(x, axis=1, keepdims=True)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expect))
    np.testing.assert_allclose(got[0], expect[0], rtol=1e-6)


def test_bench_lengths_reports_no_compile_and_no_warning(tmp_path, capsys, bert):
    """`python -m autoclust.tools.bench.lengths` (the figures in docs/performance.md)."""
    from autoclust.tools.bench import lengths
    model, _ = bert
    path = tmp_path / "bert.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "feeds.npz", **zoo.feeds(model, dims={"batch": 1, "seq": 24}))
    assert lengths.main([str(path), str(tmp_path / "feeds.npz"), "--lengths", "4",
                         "--threads", "1", "--rounds", "1", "--block", "1"]) == 0
    out = capsys.readouterr().out
    assert "LLVM compiles after the first length: 0" in out and "RuntimeWarnings: 0" in out
    assert "fallback none" in out and len(out.splitlines()) > 10


def test_gather_along_a_symbolic_dim_binds_new_lengths():
    """Gather's index clamp is a constant in the symbolic dim (seq - 1): the bounds proof
    runs per binding on concrete sizes, so it pins nothing (it pinned seq to one value on
    a real BERT-base export: every length compiled)."""
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, seq] x, int64[3] i) => (float[batch, 3] y) {
            t = Gather <axis = 1> (x, i)
            y = Sigmoid(t)
        }""")
    rng = np.random.default_rng(5)
    runner, llvm = serve_lengths(model, lambda seq: {
        "x": rng.standard_normal((2, seq)).astype(np.float32),
        "i": np.array([0, seq - 1, -2], np.int64)}, (10, 13, 7, 40))
    assert runner.compiles == 1 and len(runner.classes) == 1 and llvm == 0


def test_a_shape_chain_with_the_symbol_second_stays_symbolic():
    """GPT-2's dynamo export slices its position ids with ends = Reshape(1 + seq): Add(1,
    seq) with the symbolic dim as its *second* operand cast the Sym to int64 (pinning
    nothing, failing the symbolic compile: every length compiled through LLVM, ~0.5 s a
    new length on GPT-2). It stays symbolic now, and new lengths only bind."""
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, seq] x) => (float[batch, seq] y) {
            shape = Shape <start = 1, end = 2> (x)
            n = Squeeze(shape)
            one = Constant <value = int64 {1}> ()
            zero = Constant <value = int64 {0}> ()
            n1 = Add(one, n)
            minus1 = Constant <value = int64[1] {-1}> ()
            end = Reshape(n1, minus1)
            r = Range(zero, n1, one)
            rf = Cast <to = 1> (r)
            zero1 = Constant <value = int64[1] {0}> ()
            row = Unsqueeze(rf, zero1)
            start = Constant <value = int64[1] {1}> ()
            axis = Constant <value = int64[1] {-1}> ()
            pos = Slice(row, start, end, axis)
            y = Add(x, pos)
        }""")
    rng = np.random.default_rng(6)
    runner, llvm = serve_lengths(model, lambda seq: {
        "x": rng.standard_normal((2, seq)).astype(np.float32)}, (12, 5, 30, 7))
    assert runner.symbolic, runner.symbolic_note
    assert runner.compiles == 1 and len(runner.classes) == 1 and llvm == 0


def test_a_batched_small_gemm_with_symbolic_rows_takes_a_library_call():
    """A small batched MatMul whose B differs per batch (Qwen2's RoPE/attention shapes)
    generated code that divides the row index by the rows per batch: with a symbolic row
    count the symbol went into the LLVM IR as a literal ("LLVM IR parsing error"), the
    symbolic compile failed and every length compiled. Such a GEMM is a library call now,
    and the class serves every length."""
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[2, seq, 8] x, float[2, 8, 4] w) => (float[2, seq, 4] y) {
            m = MatMul(x, w)
            y = Tanh(m)
        }""")
    rng = np.random.default_rng(7)
    w = rng.standard_normal((2, 8, 4)).astype(np.float32)
    runner, _ = serve_lengths(model, lambda seq: {
        "x": rng.standard_normal((2, seq, 8)).astype(np.float32), "w": w}, (9, 20, 5, 33),
        rtol=1e-5)
    assert runner.symbolic, runner.symbolic_note
    assert runner.compiles == 1 and len(runner.classes) == 1


def test_a_small_int_over_a_symbolic_stride_decides_nothing():
    """0 % (512*seq), 5 % (64*seq) and 5 // (64*seq) hold for every seq (the divisor is at
    least 128): no guard. delinearize computes them for every read of a reshaped tensor;
    0 % (512*seq) pinned seq to its value in the run being compiled."""
    from autoclust import symbolic
    with symbolic.recording() as guards:
        seq = symbolic.dim("seq", 128)
        assert (0 % (seq * 512), 5 % (seq * 64), 5 // (seq * 64), 0 // (seq * 512)) == \
            (0, 5, 0, 0)
        assert 200 % (seq * 2) == 200  # true at seq = 128: a guard (seq > 100), no pin
    assert [str(g) for g in guards.guards] == ["-2*seq + 200 < 0"]


def test_grouped_query_heads_repeated_by_expand_and_reshape_bind_new_lengths():
    """LLaMA/Qwen2's repeat_kv: K [1, 2, seq, 16] expanded to [1, 2, 4, seq, 16] and read
    as [1, 8, seq, 16] (a merge delinearize cannot express). The symbolic compile pinned
    seq through 0 % (512*seq), so every length of a Qwen2-like export compiled through
    LLVM (0.5 s each); now the first compile is symbolic and new lengths bind."""
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[1, 8, seq, 16] q, float[1, 2, seq, 16] k) => (float[1, 8, seq, seq] y) {
            k5 = Unsqueeze(k, axes)
            k4 = Expand(k5, shape5)
            kr = Reshape(k4, shape4)
            kt = Transpose <perm = [0, 1, 3, 2]> (kr)
            s = MatMul(q, kt)
            y = Softmax <axis = -1> (s)
        }""")
    axes = onnx.helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [2])
    model.graph.initializer.extend([axes])
    model.graph.node.insert(1, onnx.helper.make_node(
        "Concat", ["head5", "seqv", "d1"], ["shape5"], axis=0))
    model.graph.node.insert(2, onnx.helper.make_node(
        "Concat", ["head4", "seqv", "d1"], ["shape4"], axis=0))
    model.graph.node.insert(0, onnx.helper.make_node(
        "Shape", ["k"], ["seqv"], start=2, end=3))
    for name, vals in (("head5", [1, 2, 4]), ("head4", [1, 8]), ("d1", [16])):
        model.graph.initializer.append(
            onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [len(vals)], vals))
    rng = np.random.default_rng(8)
    runner, llvm = serve_lengths(model, lambda seq: {
        "q": rng.standard_normal((1, 8, seq, 16)).astype(np.float32),
        "k": rng.standard_normal((1, 2, seq, 16)).astype(np.float32)}, (12, 5, 30, 7),
        rtol=1e-5)
    assert runner.symbolic, runner.symbolic_note
    assert runner.compiles == 1 and len(runner.classes) == 1 and llvm == 0
