"""FusedAttention on the CPU (backends/cpu/attention.py): one generated kernel per attention
with at least attention_min_keys keys, against onnxruntime running the unfused graph.

Every mask kind (additive, select with -inf or a finite fill, causal from a constant, with
an offset, none), rows fully masked with and without the exporters' NaN guard, grouped-query
heads, head dims 1..128 and Dv != D, query blocks and key tiles cut short (Sq, Sk not
multiples of 32 and 64), one and two threads, and NaN, +-inf and 1e20 in the inputs.
The kernel's online softmax rounds differently from onnxruntime's three steps, so answers
are compared to a tolerance (1e-5 relative), NaN positions exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.backends.cpu import attention
from support.attention_models import (
    _feeds,
    bert_like,
    dynamo_like,
    fused_calls,
    projected,
    select_like,
    torch_like,
)

import autoclust
from autoclust.ops import attention as attn


@pytest.fixture
def any_length(monkeypatch):
    """Fuse attention over any number of keys (the policy's threshold is about speed)."""
    monkeypatch.setattr(cpu, "POLICY", dataclasses.replace(cpu.POLICY, attention_min_keys=1))


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _generated(sess) -> list:
    """The AttnSpecs of the session's FusedAttention calls that run generated code."""
    return [spec for r in sess._runtime.compiled_clusters() for exe in r.cache.values()
            for _, spec in exe._gemms.values() if isinstance(spec, attention.AttnSpec)]


def _run(model, feeds, threads=1):
    sess = autoclust.InferenceSession(model, must_compile=True, min_cluster_size=1,
                                      autotune=False, threads=threads)
    return sess, sess.run(None, feeds)[0]


def _close(got, want):
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


CASES = [  # id, model, masked rows, expected attributes
    ("bert-d32", lambda: bert_like(2, 19, 3, 32), (), {"mask": "add"}),
    ("bert-long", lambda: bert_like(1, 200, 2, 64), (), {"mask": "add"}),
    ("dynamo-guard-masked-rows", lambda: dynamo_like(2, 4, 4, 13, 45, 16, 16), (3, 12),
     {"mask": "add", "nan_to_zero": 1}),
    ("dynamo-no-guard-masked-rows", lambda: dynamo_like(1, 2, 2, 9, 33, 8, 8, guard=False),
     (0, 5), {"mask": "add", "nan_to_zero": 0}),
    ("dynamo-gqa-dv", lambda: dynamo_like(1, 6, 2, 37, 70, 64, 40, mask=False), (),
     {"mask": ""}),
    ("dynamo-d80-sq1", lambda: dynamo_like(2, 2, 1, 1, 37, 80, 80), (), {}),
    ("dynamo-d1", lambda: dynamo_like(1, 1, 1, 4, 3, 1, 1), (), {}),
    ("dynamo-d128-tiles", lambda: dynamo_like(1, 2, 2, 70, 130, 128, 128), (69,), {}),
    ("select-bool-masked-rows", lambda: select_like(2, 2, 11, 34, 16), (2,),
     {"mask": "select"}),
    ("select-finite-fill", lambda: select_like(1, 3, 8, 8, 32, fill=-3.4e38), (4,),
     {"mask": "select"}),
    ("causal", lambda: select_like(1, 2, 40, 40, 16, causal=0), (), {"causal": 1}),
    ("causal-offset", lambda: select_like(1, 2, 40, 90, 64, causal=50), (), {"causal": 1}),
    ("torch-guard-masked-rows", lambda: torch_like(2, 3, 21, 70, 32), (0, 20),
     {"mask": "add", "nan_to_zero": 2}),
    ("torch-guard-no-mask", lambda: torch_like(1, 2, 9, 40, 16, mask=False, zeros_op=False),
     (), {"nan_to_zero": 2}),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name,build,masked,attrs", CASES, ids=[c[0] for c in CASES])
def test_fused_attention_matches_onnxruntime(any_length, name, build, masked, attrs, threads):
    model = build()
    feeds = _feeds(model, masked_rows=masked)
    sess, got = _run(model, feeds, threads)
    calls = fused_calls(sess)
    assert len(calls) == 1 and len(_generated(sess)) == 1
    have = dict(calls[0].attrs)
    assert all(have.get(k, 0 if k != "mask" else "") == v for k, v in attrs.items()), have
    _close(got, _ort(model, feeds)[0])


SPECIAL = {"guard": lambda: dynamo_like(1, 2, 2, 20, 70, 16, 16),
           "torch-guard": lambda: torch_like(1, 2, 20, 70, 16),
           "no-guard": lambda: dynamo_like(1, 2, 2, 20, 70, 16, 16, guard=False),
           "causal": lambda: select_like(1, 2, 70, 70, 16, causal=0)}


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e20, -1e20])
@pytest.mark.parametrize("kind", SPECIAL)
def test_special_values_give_onnxruntimes_answer(any_length, value, kind):
    """A NaN, an infinity or 1e20 in Q, K or V: the rows it reaches come out as
    onnxruntime's (NaN, or 0 under the exporters' guard; 1e20 scores saturate the
    softmax), every other row unharmed. A V value that is not finite makes its column NaN
    even in rows that give its key no weight, as 0 * V does in onnxruntime's P.V: rows
    before it under a causal mask (whose key tiles the kernel skips), and the rows the
    guard zeroes."""
    model = SPECIAL[kind]()
    feeds = _feeds(model, seed=3)
    for name, at in (("q", (0, 3, 5)), ("k", (1, 40, 2)), ("v", (0, 67, 1))):
        x = feeds[name]  # [B, H, S, D], or [B * H, S, D] (torch's)
        x[(0,) * (x.ndim - 3) + at] = value
    sess, got = _run(model, feeds)
    assert len(_generated(sess)) == 1
    want = _ort(model, feeds)[0]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-6)


def test_short_rows_stay_unfused_long_rows_fuse():
    """The policy's threshold (attention.MIN_KEYS): 128 keys keep the three steps, 256
    keys take one generated kernel; both give onnxruntime's answer."""
    assert attention.MIN_KEYS == cpu.POLICY.attention_min_keys == 192
    for keys, fused in ((128, 0), (256, 1)):
        model = dynamo_like(1, 2, 2, 33, keys, 32, 32)
        feeds = _feeds(model, masked_rows=(4,))
        sess, got = _run(model, feeds, threads=2)
        assert len(fused_calls(sess)) == len(_generated(sess)) == fused
        _close(got, _ort(model, feeds)[0])


def test_head_dims_past_the_kernels_stay_unfused(any_length):
    """Head dims above MAX_HEAD_DIM (the stack holds a block's Q and output) keep the
    three steps; float16 attention too (the policy fuses float32 only)."""
    model = dynamo_like(1, 2, 2, 20, 40, attention.MAX_HEAD_DIM + 32, 16)
    feeds = _feeds(model)
    sess, got = _run(model, feeds)
    assert fused_calls(sess) == []
    _close(got, _ort(model, feeds)[0])
    assert cpu.POLICY.attention_dtypes == ("float32",)
    model = dynamo_like(1, 2, 2, 20, 40, 16, 16, "float16")
    sess, _ = _run(model, _feeds(model))
    assert fused_calls(sess) == []


@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_match_onnxruntime(any_length, seed):
    """Random batch, heads (grouped or not), lengths, head dims, mask kind and masked rows:
    the shapes nobody picked by hand."""
    rng = np.random.default_rng(100 + seed)
    sq, sk = int(rng.integers(1, 90)), int(rng.integers(1, 200))
    d, dv = int(rng.integers(1, 129)), int(rng.integers(1, 129))
    kind = ["add", "none", "select", "causal"][seed % 4]
    if kind in ("add", "none"):
        hkv = int(rng.integers(1, 4))
        model = dynamo_like(int(rng.integers(1, 3)), hkv * int(rng.integers(1, 3)), hkv, sq,
                            sk, d, dv, mask=kind == "add", guard=bool(seed % 3))
    else:
        causal = int(rng.integers(0, 3)) if kind == "causal" else None
        model = select_like(1, int(rng.integers(1, 4)), sq, max(sk, sq + 2), d, causal=causal)
    masked = tuple(int(r) for r in rng.integers(0, sq, 2)) if kind in ("add", "select") else ()
    feeds = _feeds(model, seed=seed, masked_rows=masked)
    sess, got = _run(model, feeds, threads=1 + seed % 2)
    assert len(_generated(sess)) == 1
    _close(got, _ort(model, feeds)[0])


def test_a_view_past_its_buffer_is_not_generated():
    """spec_for checks each view's last element against its buffer: a view that would
    read outside it gets no generated code (the call would run the NumPy reference)."""
    from autoclust.kernel import ir as kir
    q = (((2, 64),), (10, 128), (64, 1))  # two heads of [10, 64] rows 128 apart
    attrs = (("batch", [2]), ("k_view", attn.view_ints(q)), ("q_view", attn.view_ints(q)),
             ("v_view", attn.view_ints(q)))
    call = kir.LibraryCall(attn.OP, (0, 1, 2), (3,), attrs, ("n",))

    def buffers(size):
        return {i: kir.Buffer(i, f"b{i}", "float32", (size,), "temp") for i in range(3)} | \
            {3: kir.Buffer(3, "out", "float32", (2 * 10 * 64,), "temp")}
    assert attention.spec_for(call, buffers(10 * 128)) is not None
    assert attention.spec_for(call, buffers(10 * 128 - 1)) is None


def test_the_reference_refuses_a_view_past_its_input():
    """The NumPy reference (the call's fallback) gathers through as_strided, which would
    read past the buffer: it raises OutOfBoundsError naming the element instead."""
    from autoclust.errors import OutOfBoundsError
    base = np.zeros((10, 128), np.float32)
    assert attn.gather(base, (((2, 64),), (10, 128), (64, 1))).shape == (2, 10, 64)
    with pytest.raises(OutOfBoundsError, match="element 1280 of an input of 1280"):
        attn.gather(base, (((2, 64),), (10, 128), (65, 1)))


@pytest.mark.parametrize("name,build,masked,attrs", [c for c in CASES if c[0] in (
    "dynamo-guard-masked-rows", "dynamo-gqa-dv", "dynamo-d128-tiles", "causal-offset",
    "torch-guard-masked-rows")], ids=lambda c: c if isinstance(c, str) else "")
def test_the_avx2_blocking_matches_onnxruntime(any_length, monkeypatch, name, build, masked,
                                                attrs):
    """The blocks an AVX2 host gets (16 query rows, 4 keys and 4 output dims a block, 8-lane
    vectors), run here on AVX-512 hardware: its code differs in every trip count."""
    monkeypatch.setattr(attention, "has_avx512", lambda: False)
    assert attention.block_rows() == 16
    model = build()
    feeds = _feeds(model, masked_rows=masked)
    sess, got = _run(model, feeds, threads=2)
    (spec,) = _generated(sess)
    assert spec.rows == spec.nb * -(-spec.sq // 16)
    _close(got, _ort(model, feeds)[0])


@pytest.mark.parametrize("views", [True, False])
def test_projections_are_read_where_the_fused_gemm_wrote_them(any_length, monkeypatch, views):
    """ViT's Q, K and V are Slices of one sibling-fused GEMM's result: with FusedAttention
    among the policy's library_views the kernel reads them there (bases 0, E, 2E, rows 3E
    apart) instead of a kernel copying each out first (ViT-base: 175 us a layer)."""
    if not views:
        monkeypatch.setattr(cpu, "POLICY", dataclasses.replace(
            cpu.POLICY, library_views=cpu.POLICY.library_views - {"FusedAttention"}))
    model = projected(2, 37, 3, 16)
    feeds = _feeds(model)
    feeds["x"][1, 3, :4] = [np.inf, -np.inf, np.nan, 1e20]  # batch 1, row 3: NaN throughout
    sess, got = _run(model, feeds, threads=2)
    (call,) = fused_calls(sess)
    (spec,) = _generated(sess)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    kernels = sum(1 for t in exe.program.thunks if not hasattr(t, "op"))
    if views:
        assert len({b for b in call.inputs[:3]}) == 1 and all(call.views[:3])
        assert spec.bases[:3] == (0, 48, 96) and spec.views[0][1] == (37, 144)
    else:
        assert not call.views and spec.bases == ()
    _close(got, _ort(model, feeds)[0])
    # the Q/K/V copy goes (the heads' merge stays: a transpose, then the graph output)
    assert kernels == (2 if views else 3), exe.program.thunks


def test_compose_refuses_a_walk_across_axes():
    """attention._compose maps the op's view of an operand through the call's view of it:
    a sub-dim stepping across the operand's rows has no single stride in the buffer."""
    from autoclust.kernel import ir as kir
    call = kir.View((4, 6), (10, 1), 3)  # a [4, 6] operand, rows 10 apart, from element 3
    assert attention._compose(((), (4, 6), (6, 1)), call) == (((), (4, 10), (6, 1)), 3)
    assert attention._compose((((2, 3),), (4, 6), (3, 1)), call) == \
        ((((2, 3),), (4, 10), (3, 1)), 3)
    assert attention._compose(((), (8, 3), (3, 1)), call) is None  # 3-wide rows of 6


def test_operands_in_place_that_the_kernel_refuses_fall_back(any_length, monkeypatch):
    """A FusedAttention reading views that attention.spec_for cannot compose must not run
    the NumPy reference (it would read the views' buffer as dense): the compile fails,
    --must_compile says why, and by default onnxruntime serves with one warning."""
    monkeypatch.setattr(attention, "_compose", lambda view, call: None)
    model = projected(1, 20, 2, 8)
    feeds = _feeds(model)
    with pytest.raises(autoclust.errors.NotCompilableError, match="reads operands in place"):
        _run(model, feeds)
    sess = autoclust.InferenceSession(model, min_cluster_size=1, autotune=False)
    with pytest.warns(RuntimeWarning, match="reads operands in place"):
        got = sess.run(None, feeds)[0]
    _close(got, _ort(model, feeds)[0])
