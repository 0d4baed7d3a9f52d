"""Fused attention (autoclust/passes/attention.py -> FusedAttention -> backends/gpu/attention.py)
without a GPU: the patterns are recognised (hand-written ONNX in each exporter's shape, the
zoo, real dynamo exports of tiny transformers configs, the torch front end's ATen graph), the
kernel's C rendering runs on the simulated device against onnxruntime for every mask kind
(additive, select, causal from a constant, none; rows fully masked, with and without the
exporters' NaN guard), grouped-query heads, head dims 1..128, two key tiles and more, float32,
float16 and bfloat16; against the unfused plan bit for bit where every operation is exact;
and its CUDA compiles for sm_90 without spills. The CPU backend fuses only long rows of keys
(its own kernel: tests/cpu/test_cpu_attention.py).
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.backends.gpu import attention, source
from autoclust.importers.onnx import import_model
from autoclust.models import zoo
from onnx import helper
from support.attention_models import (
    BF16,
    _const,
    _feeds,
    _info,
    _model,
    bert_like,
    dynamo_like,
    fused_calls,
    select_like,
    torch_like,
)
from support.gpu_render import needs_cc, needs_nvcc, ptxas_report

import autoclust
from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.compile import lower_graph, optimize, specialize
from autoclust.ops import attention as attn

pytestmark = needs_cc  # the stand-in runs the C rendering through the host C compiler



@pytest.fixture(autouse=True)
def sim_device(monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "gpu-sim", "support.gpu_sim_backend")


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _sim(model, feeds, **flags):
    sess = autoclust.InferenceSession(model, device="gpu-sim", must_compile=True,
                                      min_cluster_size=1, **flags)
    return sess, sess.run(None, feeds)


# ---- against onnxruntime -----------------------------------------------------------------

CASES = [  # id, model builder, masked rows, tolerance, expected attributes
    ("bert-d32", lambda: bert_like(2, 19, 3, 32), (), 1e-5, {"mask": "add"}),
    ("bert-d128-f16", lambda: bert_like(1, 40, 2, 128, "float16"), (), 4e-3, {"mask": "add"}),
    ("dynamo-guard-masked-rows", lambda: dynamo_like(2, 4, 4, 13, 45, 16, 16), (3, 12), 1e-5,
     {"mask": "add", "nan_to_zero": 1}),
    ("dynamo-no-guard-masked-rows", lambda: dynamo_like(1, 2, 2, 9, 33, 8, 8, guard=False),
     (0, 5), 1e-5, {"mask": "add", "nan_to_zero": 0}),
    ("dynamo-gqa-cross-dv", lambda: dynamo_like(1, 6, 2, 5, 70, 64, 40, mask=False), (),
     1e-5, {"mask": ""}),
    ("dynamo-d80-sq1", lambda: dynamo_like(2, 2, 1, 1, 37, 80, 80), (), 1e-5, {}),
    ("dynamo-d1", lambda: dynamo_like(1, 1, 1, 4, 3, 1, 1), (), 1e-5, {}),
    ("dynamo-f16", lambda: dynamo_like(1, 4, 2, 21, 50, 64, 64, "float16"), (7,), 4e-3, {}),
    ("select-bool-masked-rows", lambda: select_like(2, 2, 11, 34, 16), (2,), 1e-5,
     {"mask": "select"}),
    ("torch-guard-masked-rows", lambda: torch_like(2, 2, 13, 40, 16), (1, 12), 1e-5,
     {"mask": "add", "nan_to_zero": 2}),
    ("select-finite-fill", lambda: select_like(1, 3, 8, 8, 32, fill=-3.4e38), (4,), 1e-5,
     {"mask": "select"}),
    ("causal-const", lambda: select_like(1, 2, 40, 40, 32, fill=-3.4e38, causal=0), (), 1e-5,
     {"causal": 1, "causal_offset": 0, "mask": ""}),
    ("causal-const-offset", lambda: select_like(1, 1, 6, 70, 16, fill=-np.inf, causal=64), (),
     1e-5, {"causal": 1, "causal_offset": 64}),
]


@pytest.mark.parametrize("case_id,build,masked,tol,want", CASES, ids=[c[0] for c in CASES])
def test_fused_attention_matches_onnxruntime(case_id, build, masked, tol, want):
    model = build()
    feeds = _feeds(model, masked_rows=masked)
    sess, got = _sim(model, feeds)
    (call,) = fused_calls(sess)
    attrs = dict(call.attrs)
    assert {k: attrs.get(k, "" if k == "mask" else 0) for k in want} == want
    (expected,) = _ort(model, feeds)
    np.testing.assert_allclose(got[0].astype(np.float64), expected.astype(np.float64),
                               rtol=tol, atol=tol)  # NaN where onnxruntime has NaN
    if masked and not attrs.get("nan_to_zero") and attrs.get("mask") != "select":
        assert np.isnan(got[0][..., masked[0], :]).all()


def test_bfloat16_storage():
    """bfloat16 Q, K, V and output (no bfloat16 MatMul in onnxruntime's CPU provider: the
    float32 model on the same values, rounded once, is the reference)."""
    model = dynamo_like(1, 4, 2, 17, 40, 64, 64, "bfloat16")
    feeds = _feeds(model, masked_rows=(3,))
    sess, got = _sim(model, feeds)
    assert len(fused_calls(sess)) == 1 and got[0].dtype == BF16
    ref_model = dynamo_like(1, 4, 2, 17, 40, 64, 64, "float32")
    (want,) = _ort(ref_model, {k: v.astype(np.float32) for k, v in feeds.items()})
    np.testing.assert_allclose(got[0].astype(np.float32), want, rtol=2 ** -7, atol=1e-2)


def test_the_reference_is_the_unfused_math():
    """The op's NumPy reference (what the interpreter runs) against onnxruntime."""
    model = dynamo_like(1, 4, 2, 9, 20, 16, 16)
    feeds = _feeds(model, masked_rows=(2,))
    graph = import_model(model)
    flags = flags_mod.parse("")
    spec = optimize(specialize(graph, [(f.dtype, f.shape) for f in feeds.values()], {}), flags)
    from autoclust.passes.attention import fuse_attention
    fused = fuse_attention(spec)
    (node,) = [n for n in fused.nodes if n.op == attn.OP]
    args = [feeds.get(v.name) if v.name in feeds else fused.initializers.get(v.name)
            for v in node.inputs]
    (got,) = attn._ref(args, node.attrs)
    np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-5, atol=1e-6)


# ---- the tensor-core kernel (attention_mma.py, --gpu_mma_attention) ----------------------

def _mma_bodies(sess) -> list[str]:
    """The rendered attention kernels the session's executables run (C target)."""
    return [body for r in sess._runtime.compiled_clusters() for exe in r.cache.values()
            for sym, body in exe.inner.rendered.bodies.items() if sym.startswith("attn_")]


MMA_CASES = [  # id, model builder, masked rows, tolerance against onnxruntime
    ("bert-d128-two-tiles", lambda: bert_like(1, 70, 2, 128, "float16"), (), 4e-3),
    ("dynamo-gqa-masked-rows", lambda: dynamo_like(1, 4, 2, 21, 150, 64, 64, "float16"),
     (7, 20), 4e-3),
    ("dynamo-gqa-dv40", lambda: dynamo_like(1, 6, 2, 5, 70, 32, 40, "float16", mask=False),
     (), 4e-3),
    ("dynamo-no-guard", lambda: dynamo_like(1, 2, 2, 66, 33, 16, 16, "float16", guard=False),
     (0, 65), 4e-3),
    ("select-bool", lambda: select_like(2, 2, 11, 130, 48, "float16"), (2,), 4e-3),
    ("causal-const", lambda: select_like(1, 2, 140, 140, 80, "float16", fill=-65504.0,
                                         causal=0), (), 4e-3),
    ("causal-offset", lambda: select_like(1, 1, 6, 70, 16, "float16", causal=64), (), 4e-3),
]


@pytest.mark.parametrize("case_id,build,masked,tol", MMA_CASES, ids=[c[0] for c in MMA_CASES])
def test_tensor_core_attention_matches_onnxruntime(case_id, build, masked, tol):
    """The mma kernel's C rendering, whose mma assembles each matrix from the 32 lanes'
    registers by the PTX ISA's fragment layouts: onnxruntime's float16 answer, NaN and 0
    for rows without a visible key as the CUDA-core kernel gives them."""
    model = build()
    feeds = _feeds(model, masked_rows=masked)
    sess, got = _sim(model, feeds, gpu_mma_attention=True)
    bodies = _mma_bodies(sess)
    assert len(bodies) == 1 and "ac_mma_warp(" in bodies[0]
    (expected,) = _ort(model, feeds)
    np.testing.assert_allclose(got[0].astype(np.float64), expected.astype(np.float64),
                               rtol=tol, atol=tol)
    simt_sess, simt = _sim(model, feeds)
    assert "ac_mma_warp(" not in _mma_bodies(simt_sess)[0]
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(simt[0]))


def test_tensor_core_attention_element_loads():
    """K given transposed ([b, h, d, sk], its d stride not 1) and a head dim of 40 for V:
    the tile loads go element by element (no 16-byte loads), against onnxruntime."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "c"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    ins = [_info("q", "float16", [1, 3, 70, 32]), _info("kt", "float16", [1, 3, 32, 90]),
           _info("v", "float16", [1, 3, 90, 40])]
    model = _model(nodes, ins, [_info("y", "float16", [1, 3, 70, 40])],
                   [_const("c", 32 ** -0.5, "float16")])
    feeds = _feeds(model)
    sess, got = _sim(model, feeds, gpu_mma_attention=True)
    (body,) = _mma_bodies(sess)
    assert "ac_mma_warp(" in body and "AC_LD16(&sk" not in body
    np.testing.assert_allclose(got[0].astype(np.float64), _ort(model, feeds)[0],
                               rtol=4e-3, atol=4e-3)


def test_tensor_core_attention_bfloat16():
    model = dynamo_like(1, 4, 2, 17, 100, 64, 64, "bfloat16")
    feeds = _feeds(model, masked_rows=(3,))
    sess, got = _sim(model, feeds, gpu_mma_attention=True)
    assert "ac_mma_warp(dq, aq, bq, 1)" in _mma_bodies(sess)[0] and got[0].dtype == BF16
    ref_model = dynamo_like(1, 4, 2, 17, 100, 64, 64, "float32")
    (want,) = _ort(ref_model, {k: v.astype(np.float32) for k, v in feeds.items()})
    np.testing.assert_allclose(got[0].astype(np.float32), want, rtol=2 ** -6, atol=2e-2)


def test_tensor_core_attention_only_where_it_applies():
    """float32, and head dims that are not multiples of 16, keep the CUDA-core kernel."""
    for model in (dynamo_like(1, 2, 2, 9, 20, 64, 64), dynamo_like(1, 2, 2, 9, 20, 24, 24,
                                                                      "float16")):
        feeds = _feeds(model)
        sess, got = _sim(model, feeds, gpu_mma_attention=True)
        assert "ac_mma_warp(" not in _mma_bodies(sess)[0]
        np.testing.assert_allclose(got[0].astype(np.float64), _ort(model, feeds)[0],
                                   rtol=4e-3, atol=4e-3)


def _exact_feeds(model, dtype, powers):
    """q = 0, integer v, row r of the mask showing 2^(r % powers) keys and row 5 none: every
    probability 1/2^n, every product and sum exact."""
    feeds = _feeds(model)
    feeds["q"][:] = 0
    rng = np.random.default_rng(5)
    feeds["v"] = rng.integers(-8, 8, feeds["v"].shape).astype(dtype)
    mask = np.full(feeds["mask"].shape, -np.inf, dtype)
    for r in range(mask.shape[2]):
        mask[..., r, : 1 << (r % powers)] = 0.0
    mask[..., 5, :] = -np.inf
    feeds["mask"] = mask
    return feeds


def test_tensor_core_attention_bit_for_bit_where_the_math_is_exact():
    """q = 0, integer values and 2^-n probabilities: every mma product and sum is exact in
    float32 and every p exact in float16, so the tensor-core kernel and the CUDA-core one
    agree to the bit over two key tiles."""
    model = dynamo_like(2, 4, 2, 12, 128, 16, 16, "float16", guard=True)
    feeds = _exact_feeds(model, np.float16, 8)
    _, mma = _sim(model, feeds, gpu_mma_attention=True)
    _, simt = _sim(model, feeds)
    np.testing.assert_array_equal(mma[0], simt[0])
    assert (mma[0][:, :, 5] == 0).all()


# ---- against the unfused plan, bit for bit -------------------------------------------------

def test_bit_for_bit_with_the_unfused_plan_where_the_math_is_exact():
    """Scores all 0 (q = 0) and integer values: every probability is 1/2^n, every product
    and sum exact, so the fused kernel (online softmax) and the unfused kernels agree to the
    bit; rows fully masked give the same 0 (guard) or NaN."""
    model = dynamo_like(2, 4, 2, 12, 64, 16, 8, guard=True)
    feeds = _exact_feeds(model, np.float32, 6)
    sess, fused = _sim(model, feeds)
    assert len(fused_calls(sess)) == 1
    plain, unfused = _sim(model, feeds, disable_passes=["fuse_attention"])
    assert fused_calls(plain) == []
    np.testing.assert_array_equal(fused[0], unfused[0])
    assert (fused[0][:, :, 5] == 0).all()


def test_a_causal_first_row_is_its_value_row_exactly():
    model = select_like(1, 2, 9, 9, 16, fill=-3.4e38, causal=0)
    feeds = _feeds(model)
    _, got = _sim(model, feeds)
    np.testing.assert_array_equal(got[0][:, :, 0], feeds["v"][:, :, 0])


# ---- recognition -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,calls,kernels", [("bert_encoder", 2, [[22]]),
                                                 ("llama_block", 1, [[12]])])
def test_zoo_attention_is_fused_on_the_gpu_only(name, calls, kernels):
    model = zoo.build(name)
    feeds = zoo.feeds(model)
    sess, got = _sim(model, feeds)
    assert len(fused_calls(sess)) == calls
    assert [c["kernels"] for c in sess.stats()["clusters"]] == kernels
    for g, w in zip(got, _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    # the CPU fuses attention over at least attention_min_keys keys: not the zoo's short rows
    assert cpu.POLICY.attention_min_keys > max(x.shape[-2] for x in feeds.values()
                                               if x.ndim >= 2)
    cpu_sess = autoclust.InferenceSession(model, must_compile=True)
    cpu_sess.run(None, feeds)
    assert fused_calls(cpu_sess) == []


def test_tiny_transformers_exports_arefused_calls(tmp_path):
    """BERT (padding mask), GPT-2 (causal), LLaMA (grouped-query heads, causal) and ViT (no
    mask) through torch.onnx.export(dynamo=True): one FusedAttention each, onnxruntime's
    answer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    small = {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
             "intermediate_size": 128}
    tf = transformers
    cases = {
        "bert": (tf.BertModel(tf.BertConfig(vocab_size=100, **small),
                              add_pooling_layer=False), "ids+mask", {"mask": "add"}),
        "gpt2": (tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_layer=1, n_embd=64, n_head=4)),
                 "ids", {"causal": 1}),
        "llama": (tf.LlamaModel(tf.LlamaConfig(vocab_size=100, num_key_value_heads=2,
                                               **small)), "ids", {"causal": 1}),
        "vit": (tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **small),
                            add_pooling_layer=False), "pixels", {"mask": ""}),
    }
    torch.manual_seed(0)
    for name, (module, inputs, want) in cases.items():
        if inputs == "pixels":
            args, names = (torch.randn(1, 3, 32, 32),), ["pixel_values"]
        else:
            args = (torch.randint(0, 100, (1, 12)), torch.ones(1, 12, dtype=torch.long))
            names = ["input_ids", "attention_mask"]
            if inputs == "ids":
                args, names = args[:1], names[:1]
        extra = {"use_cache": False} if name in ("gpt2", "llama") else {}
        path = tmp_path / f"{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(_wrapped(torch, module.eval(), names, extra), args,
                              dynamo=True, input_names=names, output_names=["y"]
                              ).save(str(path))
        model = onnx.load(str(path))
        feeds = {n: a.numpy() for n, a in zip(names, args)}
        if "attention_mask" in feeds:
            feeds["attention_mask"][0, -4:] = 0  # padding
        sess = autoclust.InferenceSession(model, device="gpu-sim", min_cluster_size=1)
        got = sess.run(None, feeds)
        (call,) = fused_calls(sess)
        attrs = dict(call.attrs)
        assert {k: attrs.get(k, "" if k == "mask" else 0) for k in want} == want, name
        np.testing.assert_allclose(got[0], _ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


def _wrapped(torch, model, names, extra):
    """A module taking the inputs positionally, returning last_hidden_state."""
    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args)), **extra).last_hidden_state

    return Wrapped().eval()


def test_torch_front_end_aten_attention_isfused_calls():
    """The torch front end's ATen graph of attention (bmm over [B * H, S, D] views, the
    scale, an additive mask) is recognised through its cluster's Reshapes, and its kernel
    gives torch's answer."""
    torch = pytest.importorskip("torch")
    from autoclust.importers.torch import fx
    from support import gpu_sim_backend

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, m):
            return torch.softmax(q @ k.transpose(-1, -2) / 4.0 + m, -1) @ v

    args = [torch.randn(2, 3, 10, 16), torch.randn(2, 3, 12, 16), torch.randn(2, 3, 12, 8),
            torch.zeros(2, 1, 10, 12)]
    args[3][..., 9:] = float("-inf")
    fx.reset()
    compiled = torch.compile(Attn(), backend=fx.backend(min_cluster_size=1))
    with torch.no_grad():
        want = compiled(*args).numpy()
    (report,) = fx.reports()
    (cluster,) = report.clusters
    graph = cluster.runner.graph
    by_shape = {tuple(a.shape): a.numpy() for a in args}  # (Dynamo orders inputs its way)
    feeds = {v.name: by_shape[tuple(v.shape)] for v in graph.inputs}
    flags = flags_mod.parse("")
    types = [(feeds[v.name].dtype, feeds[v.name].shape) for v in graph.inputs]
    program = lower_graph(optimize(specialize(graph, types, {}), flags), flags,
                          gpu_sim_backend)
    assert [t.op for t in program.thunks if hasattr(t, "op")] == [attn.OP]
    exe = gpu_sim_backend.compile(program, flags)
    (got,) = exe.inner.run([feeds[v.name] for v in graph.inputs])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


# ---- CUDA ------------------------------------------------------------------------------------

def _spec(dtype, d, mask, causal=0, nb=8, sq=100, sk=300, mma=0):
    q = ((( nb, sq * d),), (sq, d), (d, 1))
    k = (((nb, sk * d),), (sk, d), (d, 1))
    v = (((nb, sk * d),), (sk, d), (d, 1))
    views = (q, k, v) + ((((nb, 0),), (sq, sk), (sk, 1)),) if mask else (q, k, v)
    return attention.Spec(nb, sq, sk, d, d, dtype, views, mask,
                          {"add": dtype, "select": "bool", "": ""}[mask], d ** -0.5,
                          -np.inf, causal, 0, 1, mma)


@needs_nvcc
def test_cuda_of_the_attention_kernel_compiles_without_spills(tmp_path):
    specs = [_spec(dt, d, mask, causal) for dt in ("float32", "float16", "bfloat16")
             for d, mask, causal in ((128, "add", 0), (64, "select", 0), (80, "", 1))]
    from autoclust.backends.gpu import prelude
    text = prelude.prelude("cuda") + "".join(
        attention.render(s, "cuda", attention.symbol(s)) for s in specs)
    info = ptxas_report(text, tmp_path, "attn")
    assert info.count("0 bytes spill stores, 0 bytes spill loads") == len(specs), info
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", info)]
    assert smem and max(smem) <= 48 * 1024  # static shared memory, no opt-in needed
    assert source.module_source  # (the module path is exercised by the simulated runs)


@needs_nvcc
def test_cuda_of_the_tensor_core_kernel_compiles_without_spills(tmp_path):
    """Every head dim the mma kernel takes up to 128, both storage types, with and without
    masks: ptxas for sm_90, no spills, static shared memory only."""
    specs = [_spec(dt, d, mask, causal, mma=1) for dt in ("float16", "bfloat16")
             for d, mask, causal in ((128, "add", 0), (64, "select", 0), (80, "", 1),
                                     (16, "add", 1))]
    from autoclust.backends.gpu import prelude
    text = prelude.prelude("cuda") + "".join(
        attention.render(s, "cuda", attention.symbol(s)) for s in specs)
    info = ptxas_report(text, tmp_path, "attn_mma")
    assert info.count("0 bytes spill stores, 0 bytes spill loads") == len(specs), info
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", info)]
    assert len(smem) == len(specs) and max(smem) <= 48 * 1024
