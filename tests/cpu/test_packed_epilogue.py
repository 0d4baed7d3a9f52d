"""A GEMM call's epilogue computed in packed.py's store (backends/cpu/packed_epilogue.py):
where each operand of the epilogue is read at (row, column) of the result; whole plans
against onnxruntime with the epilogue inside our GEMM (bias, exact GELU, layer scale and
residual, per-row scales, K blocks, a partial last panel, Gemm's bias, NaN, +-inf, 1e20 and
denormals in the inputs); the libraries running the epilogue kernel after the call on the
plan's buffers; timed alone, buffers of its own."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import library, packed
from autoclust.backends.cpu import packed_epilogue as pe
from onnx import TensorProto, helper, numpy_helper

import autoclust
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(28)
F32 = np.float32


def _load(buf: int, coeffs: tuple[int, ...], const: int = 0) -> kir.Load:
    return kir.Load(buf, kir.Affine(const, coeffs), "float32")


def test_operands_are_read_at_row_offset_plus_column():
    """A [1, 7, 7, 768] epilogue of a [49, 768] result: the bias by column, a residual
    element for element, a per-row scale once a row; a flat [49 * 768] kernel's operand
    through its one dim, which straddles the rows; a transposed read is refused."""
    shape = (1, 7, 7, 768)
    bias = pe._operand(_load(1, (0, 0, 0, 1)), shape, 768)
    assert bias == pe.Operand(1, 0, (), 1)
    residual = pe._operand(_load(2, (37632, 5376, 768, 1)), shape, 768)
    assert residual == pe.Operand(2, 0, ((5376, 7, 5376), (768, 7, 768)), 1)
    per_row = pe._operand(_load(3, (0, 7, 1, 0), const=5), shape, 768)
    assert per_row == pe.Operand(3, 5, ((5376, 7, 7), (768, 7, 1)), 0)
    flat = pe._operand(_load(4, (1,)), (49 * 768,), 768)
    assert flat == pe.Operand(4, 0, ((1, 49 * 768, 1),), 1)
    assert pe._operand(_load(5, (0, 0, 1, 7)), shape, 768) is None  # column stride 7
    # a [2, 3, 256] kernel of a [6, 256] result, the last dim split [2, 128]
    split = pe._operand(_load(6, (0, 0, 128, 1)), (2, 3, 2, 128), 256)
    assert split == pe.Operand(6, 0, (), 1)
    # row offsets as the kernel computes them: row 10 of the flat kernel's operand
    row = 10
    off = sum(c * ((row * 768) // s % d) for s, d, c in flat.rows)
    assert off == row * 768


def test_which_epilogues_it_takes():
    """plan() refuses reductions, reads it cannot place, casts and a stored buffer read
    back; it lists the epilogue's inputs and outputs by buffer id."""
    bufs = {i: kir.Buffer(i, f"b{i}", "float32", (64, 256), "temp") for i in range(5)}
    bufs[4] = kir.Buffer(4, "i", "int32", (64, 256), "temp")
    t = _load(0, (256, 1))
    add = kir.Op("add", (t, _load(1, (0, 1))), "float32")
    k = kir.Kernel("k", (64, 256), 0, (), (kir.Store(2, kir.Affine(0, (256, 1)), add),))
    p = pe.plan(k, 0, bufs, 256, packed.NP)
    assert isinstance(p, pe.Plan) and p.inputs == (1,) and p.outputs == (2,)
    assert p.sizes == (64 * 256, 64 * 256)
    gather = kir.Op("add", (t, _load(1, (0, 3))), "float32")
    k2 = kir.Kernel("k", (64, 256), 0, (), (kir.Store(2, kir.Affine(0, (256, 1)), gather),))
    assert "operand" in pe.plan(k2, 0, bufs, 256, packed.NP)
    back = kir.Op("add", (t, _load(2, (256, 1))), "float32")
    k3 = kir.Kernel("k", (64, 256), 0, (), (kir.Store(2, kir.Affine(0, (256, 1)), back),))
    assert pe.plan(k3, 0, bufs, 256, packed.NP) == "a stored buffer is read"
    cast = kir.Op("add", (t, kir.Op("cast", (kir.Load(4, kir.Affine(0, (256, 1)), "int32"),),
                                    "float32")), "float32")
    k4 = kir.Kernel("k", (64, 256), 0, (), (kir.Store(2, kir.Affine(0, (256, 1)), cast),))
    assert pe.plan(k4, 0, bufs, 256, packed.NP) == "op cast on float32"
    summed = kir.Kernel("k", (64, 256), 0, (kir.Reduction("sum", t, "float32"),), k.stores)
    assert pe.plan(summed, 0, bufs, 256, packed.NP) == "a reduction or symbolic dims"


def _model(nodes: list, inputs: dict, inits: dict, out: str, out_shape: tuple) -> bytes:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                     for n, s in inputs.items()],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model.SerializeToString()


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(F32)


def _gelu_mlp(m: int, k: int, n: int) -> tuple[bytes, dict]:
    """MatMul + bias + exact GELU (BERT's, ViT's first FFN GEMM), then a second GEMM."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Gelu", ["hb"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["y"])]
    inits = {"w": _w(k, n), "b": RNG.standard_normal(n).astype(F32), "w2": _w(n, 64)}
    return _model(nodes, {"x": (1, m, k)}, inits, "y", (1, m, 64)), {"x": (1, m, k)}


def _layer_scale(side: int, k: int, n: int) -> tuple[bytes, dict]:
    """ConvNeXt's second GEMM: (x @ w + b) * gamma + residual, on [1, side, side, C]."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Mul", ["hb", "gamma"], ["s"]),
             helper.make_node("Add", ["s", "r"], ["y"])]
    inits = {"w": _w(k, n), "b": RNG.standard_normal(n).astype(F32),
             "gamma": RNG.standard_normal(n).astype(F32)}
    shapes = {"x": (1, side, side, k), "r": (1, side, side, n)}
    return _model(nodes, shapes, inits, "y", (1, side, side, n)), shapes


def _row_scale(m: int, k: int, n: int) -> tuple[bytes, dict]:
    """K blocks (k > packed.KC) and a per-row operand (a [m, 1] scale), then Relu."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Mul", ["h", "s"], ["hs"]),
             helper.make_node("Relu", ["hs"], ["y"])]
    shapes = {"x": (m, k), "s": (m, 1)}
    return _model(nodes, shapes, {"w": _w(k, n)}, "y", (m, n)), shapes


def _gemm_tanh(m: int, k: int, n: int) -> tuple[bytes, dict]:
    """Gemm with transB, alpha and a bias row, then Tanh and a Sub from a constant."""
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["h"], transB=1, alpha=0.5),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Sub", ["one", "t"], ["y"])]
    inits = {"w": (_w(n, k) * np.sqrt(n / k)).astype(F32), "c": RNG.standard_normal(n).astype(F32),
             "one": np.ones(1, F32)}
    return _model(nodes, {"x": (m, k)}, inits, "y", (m, n)), {"x": (m, k)}


MODELS = {  # name -> (builder, m, k, n)
    "bias_gelu_partial_panel": (_gelu_mlp, 96, 384, 1000),
    "bias_gelu_many_rows": (_gelu_mlp, 1000, 96, 384),  # past packed.MAX_ROWS
    "layer_scale_residual_4d": (_layer_scale, 7, 384, 768),
    "row_scale_k_blocks": (_row_scale, 40, 1600, 256),
    "gemm_trans_b_tanh": (_gemm_tanh, 128, 512, 320),
}


def _feeds(shapes: dict) -> dict:
    feeds = {}
    for name, shape in shapes.items():
        x = RNG.standard_normal(shape).astype(F32)
        flat = x.reshape(-1)
        flat[:6] = [np.inf, -np.inf, np.nan, 1e20, 1e-41, -0.0]  # row 0: NaN, inf throughout
        feeds[name] = x
    return feeds


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """NaN and +-inf at the same places; finite values within 1e-4 of their row's largest
    magnitude (a row scaled by 1e20 carries the dot product's rounding, ~1e-7 of its terms,
    times 1e20: a cancelling element of it reads 3e-4 off relatively)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.where(np.isinf(want), want, 0),
                                  np.where(np.isinf(got), got, 0))
    finite = np.where(np.isfinite(want), want, 0)
    scale = np.abs(finite).max(axis=-1, keepdims=True)
    assert np.all(np.abs(np.where(np.isfinite(want), got, 0) - finite) <= 1e-4 * (1 + scale))


@pytest.fixture
def forced(monkeypatch):
    """Large MatMul/Gemm calls take the implementation `forced[0]` without measuring or
    trials, built at once (no background packing)."""
    chosen = ["packed"]
    real = library._decide

    def decide(op, attrs, in_types, out_types, builders):
        if op in ("MatMul", "Gemm") and chosen[0] in builders:
            return chosen[0], "large: forced by the test"
        return real(op, attrs, in_types, out_types, builders)

    monkeypatch.setattr(library, "_decide", decide)
    monkeypatch.setattr(library, "RIVALS", ())  # no background measurement
    monkeypatch.setattr(library, "BACKGROUND_PREPACK", False)
    library._DECISIONS.clear()
    yield chosen
    library._DECISIONS.clear()


def _compiled(model: bytes, feeds: dict, **flags) -> tuple[np.ndarray, list]:
    sess = autoclust.InferenceSession(model, min_cluster_size=1, autotune=False, **flags)
    got = sess.run(None, feeds)[0]
    (exe,) = sess._runtime.compiled_clusters()[0].cache.values()
    gemms = [fn for fn in exe.library_fns.values() if fn.op in ("MatMul", "Gemm")]
    return got, gemms


@pytest.mark.parametrize("name", sorted(MODELS))
def test_epilogue_in_our_gemm_matches_onnxruntime(name, forced):
    build, m, k, n = MODELS[name]
    model, shapes = build(m, k, n)
    feeds = _feeds(shapes)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, gemms = _compiled(model, feeds)
    _close(got, want)
    inline = [fn for fn in gemms if fn.fused]
    assert inline and all(fn.impl == "packed" for fn in inline), gemms
    off, gemms_off = _compiled(model, feeds, cpu_gemm_epilogues=False)
    _close(off, want)
    # the epilogue a kernel after the call, or oneDNN post-ops where measured faster
    assert not any(fn.fused and fn.impl == "packed" for fn in gemms_off), gemms_off


def test_the_libraries_run_the_epilogue_kernel_after_the_call(forced):
    """Where MLAS serves a call that packed.py could fuse, its run is followed by the
    epilogue kernel's step on the plan's buffers (so the trials time the same work)."""
    forced[0] = "mlas"
    model, shapes = _layer_scale(7, 384, 768)
    feeds = _feeds(shapes)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, gemms = _compiled(model, feeds)
    assert [(fn.impl, fn.fused) for fn in gemms] == [("mlas", True)]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_onednn_unpacked_stays_visible_through_the_epilogue(monkeypatch):
    """library._packing_later packs oneDNN's weights in the background when its first
    run function says `packed` False; the wrapper running the epilogue after it says the
    same (it said nothing: oneDNN then read its weights unpacked for good)."""
    import concurrent.futures

    from autoclust.backends.cpu import background

    def onednn_build(pack: bool = True):
        def run(inputs, outputs):
            pass
        run.packed = pack
        return run

    submitted = []

    def submit(fn, *args):
        submitted.append(fn)
        return concurrent.futures.Future()

    monkeypatch.setattr(background, "submit", submit)
    monkeypatch.setattr(library, "BACKGROUND_PREPACK", True)
    inline = pe.Inline(None, lambda: None, lambda: None, 2)  # type: ignore[arg-type]
    library._packing_later(inline.then_kernel(onednn_build))
    assert len(submitted) == 1  # the packing queued, the unpacked run serving meanwhile


def test_timed_alone_the_epilogue_writes_buffers_of_its_own():
    """With the call's own inputs and outputs (choice.measure) the libraries' runs call
    the probe, packed.py's writes scratch buffers; in a plan, the plan's buffers."""
    calls = []
    bufs = {i: kir.Buffer(i, f"b{i}", "float32", (32, 256), "temp") for i in range(3)}
    t = _load(0, (256, 1))
    add = kir.Op("add", (t, _load(1, (256, 1))), "float32")
    k = kir.Kernel("k", (32, 256), 0, (), (kir.Store(2, kir.Affine(0, (256, 1)), add),))
    plan = pe.plan(k, 0, bufs, 256, packed.NP)
    assert isinstance(plan, pe.Plan)
    inline = pe.Inline(plan, lambda: calls.append("after"), lambda: calls.append("probe"), 2)
    run = inline.then_kernel(lambda: lambda ins, outs: calls.append(len(ins)))()
    a, r, y = (RNG.standard_normal((32, 256)).astype(F32) for _ in range(3))
    run([a, None], [y])
    run([a, None, r], [y, y])
    assert calls == [2, "probe", 2, "after"]
    w = _w(512, 256)
    a = RNG.standard_normal((32, 512)).astype(F32)
    ours = packed.runner(packed.PackedSpec(32, 512, 256), w, False, 2, epilogue=plan)
    c, out = np.zeros((32, 256), F32), np.zeros((32, 256), F32)
    ours([a, None], [c])                  # alone: the scratch buffers
    assert not out.any()
    ours([a, None, r], [c, out])          # in a plan: r + A @ W into out
    np.testing.assert_allclose(out, a @ w + r, rtol=1e-5, atol=1e-5)


LIFETIME = """
import gc, sys
import numpy as np
sys.path.insert(0, {tests!r})
from cpu.test_packed_epilogue import _feeds, _layer_scale
import autoclust
from autoclust.backends.cpu import library
model, shapes = _layer_scale(8, 384, 768)
sess = autoclust.InferenceSession(model, min_cluster_size=1, autotune=False)
sess.run(None, _feeds(shapes))
del sess
gc.collect()
assert library.wait_background(120)  # measurements queued for the dropped plan
model, shapes = _layer_scale(7, 384, 768)
sess = autoclust.InferenceSession(model, min_cluster_size=1, autotune=False)
got = sess.run(None, _feeds(shapes))[0]
kept = got.copy()
assert library.wait_background(120)
np.testing.assert_array_equal(got, kept)  # the timing wrote no result handed out
print("ok")
"""


def test_a_background_measurement_outlives_its_plan():
    """The libraries' side of a call with a fusable epilogue is timed in the background
    thread with the epilogue kernel run on probe buffers: the probe keeps the kernel's code
    alive after its session is dropped (it ran freed code: a segfault), and writes buffers
    of its own, not a result the caller holds."""
    import pathlib
    import subprocess
    import sys
    tests = str(pathlib.Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                           LIFETIME.format(tests=tests)], check=False, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_pair_order_puts_gate_and_up_of_the_same_columns_in_one_panel():
    order = pe.pair_order(64, 32)
    assert order.tolist() == list(range(16)) + list(range(32, 48)) + \
        list(range(16, 32)) + list(range(48, 64))


def _swiglu(m: int, k: int, f: int) -> tuple[bytes, dict]:
    """LLaMA's MLP: silu(x @ wg) * (x @ wu) @ wd; the gate and up projections become one
    GEMM (passes/siblings.py) whose halves the SwiGLU kernel reads."""
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]),
             helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["sg"]),
             helper.make_node("Mul", ["g", "sg"], ["silu"]),
             helper.make_node("Mul", ["silu", "u"], ["h"]),
             helper.make_node("MatMul", ["h", "wd"], ["y"])]
    inits = {"wg": _w(k, f), "wu": _w(k, f), "wd": _w(f, 64)}
    return _model(nodes, {"x": (1, m, k)}, inits, "y", (1, m, 64)), {"x": (1, m, k)}


@pytest.mark.parametrize("impl", ["packed", "mlas"])
def test_a_swiglu_is_computed_in_the_store_of_its_fused_projection(impl, forced):
    """The SwiGLU over the fused gate/up GEMM's two halves is that GEMM's epilogue: in our
    GEMM each panel holds 16 gate and 16 up columns of the same outputs
    (packed_epilogue.pair_order), and the [M, F] product is stored, never the [M, 2F]
    result; with MLAS the kernel runs after the call. Against onnxruntime."""
    forced[0] = impl
    model, shapes = _swiglu(64, 512, 1024)
    feeds = _feeds(shapes)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, gemms = _compiled(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    fused = [fn for fn in gemms if fn.fused]
    assert [(fn.impl, len(fn.dest)) for fn in fused] == [(impl, 2)], gemms


def test_halves_are_not_onednn_post_ops():
    """oneDNN's post-ops apply to the result element for element: a kernel reading its
    halves is not one (epilogue.post_ops would have read both halves as one)."""
    from autoclust.backends.cpu import epilogue
    bufs = {0: kir.Buffer(0, "t", "float32", (64, 512), "temp"),
            1: kir.Buffer(1, "y", "float32", (64, 256), "temp")}
    gate, up = _load(0, (512, 1)), _load(0, (512, 1), const=256)
    prod = kir.Op("mul", (kir.Op("sigmoid", (gate,), "float32"), up), "float32")
    k = kir.Kernel("k", (64, 256), 0, (), (kir.Store(1, kir.Affine(0, (256, 1)), prod),))
    call = kir.LibraryCall("MatMul", (2, 3), (0,), (), epilogue=k)
    assert epilogue.post_ops(call, bufs) is None
    p = pe.plan(k, 0, bufs, 512, packed.NP)
    assert isinstance(p, pe.Plan) and p.pairs and p.outputs == (1,)
