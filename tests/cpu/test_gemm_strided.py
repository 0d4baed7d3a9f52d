"""Generated GEMMs over strided operands (gemm.Strided): batched products read and written
in place through views, as window attention's Q.K^T and P.V are. Numbers against NumPy
(every element outside C's view left untouched, row ranges split inside batches) and
onnxruntime, which calls take the path, and that one object serves every batch shape."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import executable, gemm, jit
from llvmlite import ir
from onnx import TensorProto, helper

import autoclust
from autoclust.compile import COUNTS as compile_counts
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(23)


def _view(flat: np.ndarray, op: gemm.Operand, batch: tuple, rows: int, cols: int):
    """The [*batch, rows, cols] array op describes inside flat."""
    size = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[op.offset:], batch + (rows, cols),
        tuple(s * size for s in op.batch + (op.row, op.col)))


def _run(spec: gemm.GemmSpec, a: np.ndarray, b: np.ndarray, c: np.ndarray, splits) -> None:
    module = ir.Module("t")
    gemm.emit(module, "g", spec)
    obj, _, _ = jit.compile_object(str(module), "", False)
    engine, addrs = jit.load_object(obj, ["g"])
    fn = executable.KERNEL_FN(addrs["g"])
    desc = gemm.descriptor(spec)
    arr = (ctypes.c_void_p * (3 + len(desc)))(a.ctypes.data, b.ctypes.data, c.ctypes.data,
                                               *desc)
    edges = [0] + list(splits) + [spec.rows]
    for lo, hi in itertools.pairwise(edges):
        fn(ctypes.addressof(arr), lo, hi)
    del engine


def _qkv(batch: int, heads: int, s: int, d: int) -> dict[str, gemm.Operand]:
    """Window attention's operands over a fused [batch, s, 3 * heads * d] projection (Q,
    K, V as [batch, heads, s, d] at offsets 0, h*d, 2*h*d) and a merged [batch, s, h*d]
    output."""
    w = 3 * heads * d
    return {"q": gemm.Operand(0, (s * w, d), w, 1),
            "kt": gemm.Operand(heads * d, (s * w, d), 1, w),  # K^T: columns w apart
            "v": gemm.Operand(2 * heads * d, (s * w, d), w, 1),
            "o": gemm.Operand(0, (s * heads * d, d), heads * d, 1)}


CASES = {  # name -> (m, n, k, batch, A, B, C, buffer sizes of A, B, C)
    "qk^T packed": (7, 7, 4, (3, 2), _qkv(3, 2, 7, 4)["q"], _qkv(3, 2, 7, 4)["kt"],
                    gemm.Operand(0, (98, 49), 7, 1), (3 * 7 * 24, 3 * 7 * 24, 3 * 2 * 49)),
    "p.v into merged heads": (7, 4, 7, (3, 2), gemm.Operand(0, (98, 49), 7, 1),
                              _qkv(3, 2, 7, 4)["v"], _qkv(3, 2, 7, 4)["o"],
                              (3 * 2 * 49, 3 * 7 * 24, 3 * 7 * 8)),
    "broadcast B, transposed A": (5, 37, 9, (4,), gemm.Operand(3, (45,), 1, 5),
                                  gemm.Operand(0, (0,), 37, 1),
                                  gemm.Operand(0, (5 * 37,), 37, 1), (3 + 4 * 45, 9 * 37,
                                                                      4 * 5 * 37)),
    "three batch dims, wide": (6, 70, 5, (2, 1, 3), gemm.Operand(0, (90, 0, 30), 5, 1),
                               gemm.Operand(1, (0, 0, 5 * 71), 71, 1),
                               gemm.Operand(2, (6 * 70 * 3, 0, 6 * 70), 70, 1),
                               (180, 3 * 5 * 71 + 1, 2 + 2 * 3 * 6 * 70)),
    "row blocks, B^T": (19, 23, 6, (2,), gemm.Operand(0, (114,), 6, 1),
                        gemm.Operand(0, (138,), 1, 6), gemm.Operand(0, (437,), 23, 1),
                        (228, 276, 874)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_strided_generated_gemm_matches_numpy(case, dtype, dynamic):
    m, n, k, batch, a_op, b_op, c_op, sizes = CASES[case]
    spec = gemm.GemmSpec(m, n, k, int(np.prod(batch)), True, "", 0.5, 1.0, dtype,
                         gemm.Strided(batch, a_op, b_op, c_op, dynamic))
    a, b = (RNG.standard_normal(sz).astype(dtype) for sz in sizes[:2])
    c = np.full(sizes[2], np.nan, dtype)
    splits = sorted({1, m // 2, m + 1, spec.rows // 2, spec.rows - 1} - {0, spec.rows})
    _run(spec, a, b, c, splits)
    got = _view(c, c_op, batch, m, n).copy()
    want = 0.5 * np.matmul(_view(a, a_op, batch, m, k), _view(b, b_op, batch, k, n))
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * k)
    _view(c, c_op, batch, m, n)[...] = np.nan  # nothing outside C's view was written
    assert np.isnan(c).all()


def _window_attention(windows: tuple[int, ...], s: int = 49, heads: int = 3,
                      d: int = 32) -> helper.ModelProto:
    """Swin's window attention, one block per entry of `windows` (its window count, heads
    growing as the windows shrink): a fused [w, s, 3*h*d] projection split into heads by
    Reshape + Transpose, softmax(Q K^T * c) V, heads merged back, each block's result an
    output."""
    n = helper.make_node
    nodes, inputs, outputs, inits = [], [], [], []
    for j, w in enumerate(windows):
        h = heads * windows[0] // w
        inputs.append(helper.make_tensor_value_info(f"x{j}", TensorProto.FLOAT,
                                                    [w, s, 3 * h * d]))
        outputs.append(helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT,
                                                     [w, s, h * d]))
        inits += [helper.make_tensor(f"split{j}", TensorProto.INT64, [5], [w, s, 3, h, d]),
                  helper.make_tensor(f"merge{j}", TensorProto.INT64, [3], [w, s, h * d])]
        nodes += [n("Reshape", [f"x{j}", f"split{j}"], [f"r{j}"]),
                  n("Transpose", [f"r{j}"], [f"t{j}"], perm=[2, 0, 3, 1, 4]),
                  n("Split", [f"t{j}"], [f"q{j}", f"k{j}", f"v{j}"], axis=0, num_outputs=3),
                  n("Squeeze", [f"q{j}", "zero"], [f"q{j}s"]),
                  n("Squeeze", [f"k{j}", "zero"], [f"k{j}s"]),
                  n("Squeeze", [f"v{j}", "zero"], [f"v{j}s"]),
                  n("Transpose", [f"k{j}s"], [f"kt{j}"], perm=[0, 1, 3, 2]),
                  n("MatMul", [f"q{j}s", f"kt{j}"], [f"s{j}"]),
                  n("Mul", [f"s{j}", "scale"], [f"ss{j}"]),
                  n("Softmax", [f"ss{j}"], [f"p{j}"], axis=-1),
                  n("MatMul", [f"p{j}", f"v{j}s"], [f"o{j}"]),
                  n("Transpose", [f"o{j}"], [f"ot{j}"], perm=[0, 2, 1, 3]),
                  n("Reshape", [f"ot{j}", f"merge{j}"], [f"y{j}"])]
    inits += [helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
              helper.make_tensor("scale", TensorProto.FLOAT, [], [d ** -0.5])]
    g = helper.make_graph(nodes, "windows", inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_window_attention_products_run_generated_code():
    """Two stages of Swin-tiny's window attention: Q.K^T (K^T read in place, packed per
    window) and P.V (written into the merged heads) of both run generated code, equal to
    onnxruntime; the two stages' products share two objects (their code keys)."""
    model = _window_attention((8, 2))
    feeds = {f"x{j}": RNG.standard_normal((w, 49, 3 * 3 * 32 * 8 // w)).astype(np.float32)
             for j, w in enumerate((8, 2))}
    sess = autoclust.InferenceSession(model, must_compile=True)
    got = sess.run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    specs = []
    for cluster in sess._runtime.compiled_clusters():  # a cluster per (independent) block
        exe = next(iter(cluster.cache.values()))
        calls = [i for i, t in enumerate(exe.program.thunks) if isinstance(t, kir.LibraryCall)]
        assert set(exe._gemms) == set(calls) and exe.library_fns == {}, \
            kir.format_program(exe.program)
        specs += [spec for _, spec in exe._gemms.values()]
    assert len(specs) == 4 and all(spec.strided is not None for spec in specs)
    assert sorted(spec.strided.pack for spec in specs) == [False, False, True, True]
    assert len({gemm.code_key(spec) for spec in specs}) == 2


def _call(shapes: dict[int, tuple], views: tuple, op: str = "MatMul", attrs: tuple = ()):
    buffers = {i: kir.Buffer(i, f"b{i}", "float32", s, "temp") for i, s in shapes.items()}
    return kir.LibraryCall(op, (0, 1), (2,), attrs, views=views), buffers


def test_strided_spec_takes_small_batched_products_only(monkeypatch):
    monkeypatch.setattr(gemm, "AVX2_MAX_BATCH_FLOPS", gemm.MAX_BATCH_FLOPS)  # any host
    q = kir.View((64, 3, 49, 32), (14112, 32, 288, 1), 0)
    kt = kir.View((64, 3, 32, 49), (14112, 32, 1, 288), 96)
    qkv = (64, 49, 288)
    call, bufs = _call({0: qkv, 1: qkv, 2: (64, 3, 49, 49)}, (q, kt, None))
    spec = gemm.spec_for(call, bufs)
    assert spec is not None and spec.strided.pack and spec.strided.c.row == 49
    assert gemm.descriptor(spec)[3:12] == (0, 288, 1, 96, 1, 288, 0, 49, 1)
    # FusedMatMul transB over K itself reads the same K^T
    k = kir.View((64, 3, 49, 32), (14112, 32, 288, 1), 96)
    call_t, _ = _call({0: qkv, 1: qkv, 2: (64, 3, 49, 49)}, (q, k, None), "FusedMatMul",
                      (("alpha", 0.125), ("transB", 1)))
    spec_t = gemm.spec_for(call_t, bufs)
    assert spec_t.strided == spec.strided and spec_t.alpha == 0.125
    # a product too big per batch, one big product, a packed B over PACK_MAX, an output
    # whose columns are apart: library calls
    big = kir.View((1, 8, 256, 64), (0, 64, 512, 1), 0)
    big_t = kir.View((1, 8, 64, 256), (0, 64, 1, 512), 0)
    call, bufs = _call({0: (256, 512), 1: (256, 512), 2: (1, 8, 256, 256)},
                       (big, big_t, None))
    gemm_max = gemm.MAX_BATCH_FLOPS
    assert gemm.spec_for(call, bufs) is not None
    try:
        gemm.MAX_BATCH_FLOPS = 2 * 256 * 256 * 64 - 1
        assert gemm.spec_for(call, bufs) is None
    finally:
        gemm.MAX_BATCH_FLOPS = gemm_max
    one = kir.View((512, 64), (128, 1), 0)  # 64 x 512 x 64: 4.2 MFLOP in one product
    call, bufs = _call({0: (64, 512), 1: (512, 128), 2: (64, 64)}, (None, one, None))
    assert gemm.spec_for(call, bufs) is None
    wide = kir.View((4, 2048, 16), (0, 1, 2048), 0)  # k * n = 32768 > PACK_MAX
    call, bufs = _call({0: (4, 8, 2048), 1: (2048, 16), 2: (4, 8, 16)}, (None, wide, None))
    assert gemm.spec_for(call, bufs) is None
    out_t = kir.View((2, 8, 8), (64, 1, 8), 0)
    call, bufs = _call({0: (2, 8, 8), 1: (2, 8, 8), 2: (2, 8, 8)}, (None, None, out_t))
    assert gemm.spec_for(call, bufs) is None
    # one B (weights) for every window: one big GEMM over the windows' rows, a library's
    call, bufs = _call({0: (64, 49, 96), 1: (96, 288), 2: (64, 49, 288)}, ())
    assert gemm.spec_for(call, bufs) is None
    # many dense small products above MAX_FLOPS: the strided path over dense layouts
    call, bufs = _call({0: (192, 49, 49), 1: (192, 49, 32), 2: (192, 49, 32)}, ())
    spec = gemm.spec_for(call, bufs)
    assert spec.strided == gemm.Strided((192,), gemm.Operand(0, (2401,), 49, 1),
                                        gemm.Operand(0, (1568,), 32, 1),
                                        gemm.Operand(0, (1568,), 32, 1))


def _token_attention(heads: int = 4, d: int = 16) -> helper.ModelProto:
    """BERT's attention over a fused [1, seq, 3*h*d] projection, seq symbolic."""
    n = helper.make_node
    nodes = [n("Reshape", ["x", "split"], ["r"]),
             n("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
             n("Split", ["t"], ["q", "k", "v"], axis=0, num_outputs=3),
             n("Squeeze", ["q", "zero"], ["qs"]), n("Squeeze", ["k", "zero"], ["ks"]),
             n("Squeeze", ["v", "zero"], ["vs"]),
             n("Transpose", ["ks"], ["kt"], perm=[0, 1, 3, 2]),
             n("MatMul", ["qs", "kt"], ["s"]), n("Mul", ["s", "scale"], ["ss"]),
             n("Softmax", ["ss"], ["p"], axis=-1), n("MatMul", ["p", "vs"], ["o"]),
             n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             n("Reshape", ["ot", "merge"], ["y"])]
    inits = [helper.make_tensor("split", TensorProto.INT64, [5], [1, -1, 3, heads, d]),
             helper.make_tensor("merge", TensorProto.INT64, [3], [1, -1, heads * d]),
             helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
             helper.make_tensor("scale", TensorProto.FLOAT, [], [d ** -0.5])]
    g = helper.make_graph(nodes, "tokens", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, "seq", 3 * heads * d])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, "seq", heads * d])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_a_host_without_avx512_takes_fewer_batched_products(monkeypatch):
    """On an AVX2 host the generated blocks lose to the library above ~3e5 flops a batch
    (attention's [128,64]x[64,128]: 1.35x the library's time on Zen 3), and still win
    on Swin's 49-token windows; on an AVX-512 host both are generated."""
    q = kir.View((64, 3, 49, 32), (14112, 32, 288, 1), 0)
    kt = kir.View((64, 3, 32, 49), (14112, 32, 1, 288), 96)
    window = _call({0: (64, 49, 288), 1: (64, 49, 288), 2: (64, 3, 49, 49)}, (q, kt, None))
    q = kir.View((1, 8, 128, 64), (0, 64, 1536, 1), 0)
    kt = kir.View((1, 8, 64, 128), (0, 64, 1, 1536), 512)
    heads = _call({0: (128, 1536), 1: (128, 1536), 2: (1, 8, 128, 128)}, (q, kt, None))
    for wide, heads_generated in ((True, True), (False, False)):
        monkeypatch.setitem(jit._state, "avx512", wide)  # rules only: nothing compiled
        assert gemm.spec_for(*window) is not None
        assert (gemm.spec_for(*heads) is not None) == heads_generated, wide


def test_sequence_lengths_share_one_dynamic_product_code(monkeypatch):
    """A symbolic sequence length: Q.K^T and P.V run dynamic code (sizes in the
    descriptor), compiled once for every length of the shape class; a length past the
    packing limit (head dim x seq > PACK_MAX) is another class, a library's."""
    monkeypatch.setattr(gemm, "AVX2_MAX_BATCH_FLOPS", gemm.MAX_BATCH_FLOPS)  # any host
    model = _token_attention()
    sess = autoclust.InferenceSession(model, must_compile=True)
    ref = ort.InferenceSession(model.SerializeToString())
    lowered = []  # shape classes lowered (compile.COUNTS) by each length's first run
    for seq in (20, 33, 7, 400, gemm.PACK_MAX // 16 + 1):
        x = RNG.standard_normal((1, seq, 192)).astype(np.float32)
        before = compile_counts["lowered"]
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)
        lowered.append(compile_counts["lowered"] - before)
    cache = sess._runtime.compiled_clusters()[0].cache  # input types -> Executable
    specs = {key[0][1][1]: [s for _, s in exe._gemms.values()] for key, exe in cache.items()}
    # 400: a product per batch above MAX_FLOPS, in the class still (no guard on that rule
    # where there are several batches)
    assert lowered == [1, 0, 0, 0, 1], lowered
    for seq in (20, 33, 7, 400):
        assert [(s.m, s.n, s.k, s.strided.dynamic) for s in specs[seq]] == [
            (seq, seq, 16, True), (seq, 16, seq, True)], specs
    assert len({gemm.code_key(s) for seq in (20, 33, 7) for s in specs[seq]}) == 2
    assert specs[gemm.PACK_MAX // 16 + 1] == []  # Q.K^T packs too much, P.V too big


@pytest.mark.parametrize("side", ["transB", "transA"])
def test_dense_transposed_operands_run_generated_code(side):
    """A batched product reading a dense buffer through FusedMatMul's transA/transB (LLaMA's
    rotated K, since simplify makes K^T the GEMM's flag) is a strided product: generated
    code, equal to onnxruntime, not a library call."""
    n = helper.make_node
    shapes = {"transB": ([1, 8, 32, 16], [1, 8, 32, 16]), "transA": ([1, 8, 16, 32], [1, 8, 16, 8])}
    (sa, sb), swap = shapes[side], n("Transpose", ["t"], ["tt"], perm=[0, 1, 3, 2])
    nodes = [n("Sin", ["b" if side == "transB" else "a"], ["t"]), swap,
             n("MatMul", ["a", "tt"] if side == "transB" else ["tt", "b"], ["y"])]
    out = [1, 8, 32, 32] if side == "transB" else [1, 8, 32, 8]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(x, TensorProto.FLOAT, s)
                                       for x, s in (("a", sa), ("b", sb))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    feeds = {"a": RNG.standard_normal(sa).astype(np.float32),
             "b": RNG.standard_normal(sb).astype(np.float32)}
    sess = autoclust.InferenceSession(model, must_compile=True)
    np.testing.assert_allclose(sess.run(None, feeds)[0],
                               ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-5)
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    (call,) = [t for t in exe.program.thunks if isinstance(t, kir.LibraryCall)]
    assert call.op == "FusedMatMul" and dict(call.attrs)[side] == 1
    assert len(exe._gemms) == 1 and exe.library_fns == {}, kir.format_program(exe.program)
