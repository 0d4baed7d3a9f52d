"""Compiled kernel code is reused across batch sizes: a kernel's code key abstracts its outer
loop extent (backends.cpu.code_key), so a new batch size compiles nothing through LLVM, even
with --symbolic_dims=0 (symbolic dims go further: tests/core/test_symbolic_dims.py).
Every result is checked against onnxruntime."""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.backends.cpu import codegen
from autoclust.models import zoo

import autoclust
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(11)
BATCHES = (2, 3, 5)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(textwrap.dedent(text))
    model.ir_version = 10
    return model


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def compiles_per_batch(model: onnx.ModelProto, make_feeds, batches=BATCHES,
                       tol: float = 1e-5, **flags) -> list[int]:
    """LLVM compiles caused by each batch size's first run (outputs checked each time)."""
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1, **flags)
    counts = []
    for b in batches:
        feeds = make_feeds(b)
        before = cpu.COMPILE_COUNT
        got = sess.run(None, feeds)
        counts.append(cpu.COMPILE_COUNT - before)
        for g, e in zip(got, ort_run(model, feeds)):
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
    exes = [e for r in sess._runtime.compiled_clusters() for e in r.cache.values()
            if any(isinstance(t, kir.Kernel) for t in e.program.thunks)]
    assert len(exes) >= len(batches)  # one executable per cluster and batch size, compiled
    return counts


def chain_model() -> onnx.ModelProto:
    return parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, 53] x, float[53] b) => (float[batch, 53] y) {
            a = Add(x, b)
            t = Tanh(a)
            m = Mul(t, x)
            e = Exp(m)
            y = Sub(e, b)
        }""")


def layernorm_model() -> onnx.ModelProto:
    return parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, 7, 41] x, float[41] w, float[41] c) => (float[batch, 7, 41] y) {
            axes = Constant <value = int64[1] {-1}> ()
            mean = ReduceMean(x, axes)
            d = Sub(x, mean)
            two = Constant <value = float {2.0}> ()
            sq = Pow(d, two)
            var = ReduceMean(sq, axes)
            eps = Constant <value = float {1e-5}> ()
            ve = Add(var, eps)
            sd = Sqrt(ve)
            n = Div(d, sd)
            s = Mul(n, w)
            y = Add(s, c)
        }""")


def softmax_model() -> onnx.ModelProto:
    return parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, 3, 19, 19] x, float[batch, 1, 1, 19] mask) => (float[batch, 3, 19, 19] y) {
            scale = Constant <value = float {0.125}> ()
            s = Mul(x, scale)
            a = Add(s, mask)
            y = Softmax <axis = -1> (a)
        }""")


def _normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", ["chain", "layernorm", "softmax"])
def test_new_batch_size_compiles_nothing(name):
    model, make = {
        "chain": (chain_model(), lambda b: {"x": _normal(b, 53), "b": _normal(53)}),
        "layernorm": (layernorm_model(),
                      lambda b: {"x": _normal(b, 7, 41), "w": _normal(41), "c": _normal(41)}),
        "softmax": (softmax_model(),
                    lambda b: {"x": _normal(b, 3, 19, 19), "mask": _normal(b, 1, 1, 19)}),
    }[name]
    counts = compiles_per_batch(model, make)
    assert counts[1:] == [0, 0], counts


def test_zoo_bert_encoder_new_batch_sizes_compile_nothing():
    model = zoo.build("bert_encoder", hidden=32, heads=2, layers=2)
    counts = compiles_per_batch(model, lambda b: zoo.feeds(model, dims={"batch": b, "seq": 8}),
                                tol=1e-4)
    assert counts[1:] == [0, 0], counts


@pytest.mark.parametrize("symbolic", [False, True])
def test_stride_depending_on_batch(symbolic):
    """Transpose [batch, 29] -> [29, batch]: the store's stride is the batch. Concrete
    shapes (--symbolic_dims=0) keep it in the code key: a new batch recompiles; with
    symbolic dims the code reads it at run time: nothing compiles."""
    model = parse("""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[batch, 29] x) => (float[29, batch] y) {
            t = Transpose <perm = [1, 0]> (x)
            y = Sigmoid(t)
        }""")
    counts = compiles_per_batch(model, lambda b: {"x": _normal(b, 29)}, batches=(31, 37),
                                symbolic_dims=symbolic)
    assert counts[1] == (0 if symbolic else 1), counts


def _kernels(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[kir.Kernel]:
    """The (collapsed) kernels the CPU backend compiled for `model` at these feeds."""
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1)
    sess.run(None, feeds)
    return [t for r in sess._runtime.compiled_clusters() for e in r.cache.values()
            for t in e.program.thunks if isinstance(t, kir.Kernel)]


def test_codegen_never_reads_the_outer_extent():
    """The key's premise: the same kernel at another outer extent gives the same LLVM IR."""
    kernels = _kernels(softmax_model(), {"x": _normal(2, 3, 19, 19),
                                         "mask": _normal(2, 1, 1, 19)})
    assert kernels
    for k in kernels:
        other = dataclasses.replace(k, shape=(k.shape[0] * 7 + 1,) + k.shape[1:])
        assert cpu.code_key(k) == cpu.code_key(other)
        texts = [str(codegen.build_module([x], False)) for x in (k, other)]
        assert texts[0] == texts[1]
        inner = dataclasses.replace(k, shape=k.shape[:-1] + (k.shape[-1] + 1,))
        assert cpu.code_key(k) != cpu.code_key(inner)


def test_zoo_llama_concat_fuses_and_new_batch_compiles_nothing():
    """rotate_half's Concat lowers to a select chain (no reference thunk); the clamps in its
    loads do not mention the batch, so a new batch size reuses the code."""
    model = zoo.build("llama_block", hidden=64, heads=2)
    counts = compiles_per_batch(model, lambda b: zoo.feeds(model, dims={"batch": b, "seq": 16}),
                                batches=(2, 3), tol=1e-4)
    assert counts[1] == 0, counts
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1)
    sess.run(None, zoo.feeds(model, dims={"batch": 2, "seq": 16}))
    thunks = [t for r in sess._runtime.compiled_clusters() for e in r.cache.values()
              for t in e.program.thunks]
    assert all(isinstance(t, (kir.Kernel, kir.LibraryCall)) for t in thunks), thunks
    assert any("select(" in kir.format_thunk(t) for t in thunks if isinstance(t, kir.Kernel))
