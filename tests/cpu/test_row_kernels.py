"""Row kernels against onnxruntime: max/min phases emitted as explicit vector code
(backends/cpu/vectorize.py) for every row length, NaN position, inf, -0.0 and dtype, and
the index-range checks of a Gather read by several kernels (run once per run).

Rows of 0, 1, 2, 3 (narrow vectors), 7, 8, 9, 15, 16, 17 (a 16-lane chunk, then the
overlapping last chunk), 63, 64, 65 and 100; row k of each input holds NaN first, in the
middle, last, +-inf, -0.0 beside +0.0, a row of -inf, or nothing special.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.backends import cpu
from autoclust.backends.cpu import codegen
from autoclust.importers.onnx import import_model
from onnx import TensorProto, helper

import autoclust
from autoclust import flags as flags_mod
from autoclust.compile import lower_graph
from autoclust.errors import InvalidInputError
from autoclust.kernel import ir as kir

F32, F16, F64, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, \
    TensorProto.INT64
LENGTHS = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100]


def model(nodes: list, inputs: list, outputs: list, inits: tuple = ()) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def special_rows(n: int, dtype) -> np.ndarray:
    """[9, n]: one row per special case, the others random (distinct values, no ties)."""
    rng = np.random.default_rng(n)
    x = rng.permutation(np.linspace(-8, 8, max(n, 1) * 9)).reshape(9, -1)[:, :n]
    x = x.astype(dtype)
    if n:
        x[1, 0] = np.nan
        x[2, n // 2] = np.nan
        x[3, n - 1] = np.nan
        x[4, n // 3] = np.inf
        x[5, (2 * n) // 3] = -np.inf
        x[6, :] = -np.abs(x[6, :])
        x[6, n - 1], x[6, 0] = 0.0, -0.0  # max is +-0: -0.0 first, +0.0 last
        x[7, :] = -np.inf
        x[8, n // 2:] = np.inf if n > 1 else x[8, n // 2:]
    return x


def run_both(m: onnx.ModelProto, feeds: dict) -> tuple[list, list]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    got = sess.run(None, feeds)
    assert sess.plan.clusters and not sess.plan.reasons, sess.explain()
    return got, want


def nan_rule(x: np.ndarray, kind: str) -> np.ndarray:
    """The reference's max/min per row: NaN wherever it is in the row (NumPy semantics)."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = (np.max if kind == "max" else np.min)(x.astype(np.float64), axis=-1)
    return out.astype(x.dtype)


def assert_same(got: list, want: list, rtol: float, atol: float = 0.0) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("elem", [F32, F16, F64])
def test_max_min_rows_match_onnxruntime(n, elem):
    """ReduceMax, ReduceMin, Softmax, LogSoftmax and ArgMax over rows of every length."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    nodes = [helper.make_node("Softmax", ["x"], ["sm"], axis=-1),
             helper.make_node("LogSoftmax", ["x"], ["ls"], axis=-1)]
    outs = [("sm", elem), ("ls", elem)]
    if n:  # over an empty axis onnxruntime refuses ArgMax and gives ReduceMax shape [9, 0]
        nodes += [helper.make_node("ReduceMax", ["x", "axes"], ["mx"], keepdims=0),
                  helper.make_node("ReduceMin", ["x", "axes"], ["mn"], keepdims=0),
                  helper.make_node("ArgMax", ["x"], ["am"], axis=-1, keepdims=0)]
        outs += [("mx", elem), ("mn", elem), ("am", I64)]
    m = model(nodes, [("x", elem, [9, n])], outs,
              (onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"),))
    x = special_rows(n, dtype)
    got, want = run_both(m, {"x": x})
    tol = 2e-3 if elem == F16 else 1e-5
    if n:
        # onnxruntime's ReduceMax/Min give different answers for a NaN in a row depending
        # on the row count and where the NaN sits (its vectorized loop drops elements
        # beside it): rows 1-3 (NaN first, middle, last) follow the reference: NaN
        for k, kind in ((2, "max"), (3, "min")):
            np.testing.assert_array_equal(got[k], nan_rule(x, kind))
            got[k], want[k] = got[k][4:], want[k][4:]
    if n and elem == F64:
        # onnxruntime's float64 LogSoftmax gives finite values beside a NaN (ln(1e20) +
        # x - max) and -inf beside an inf; its float32/float16 kernels and ours give NaN
        assert np.isnan(got[1][1:4]).all()
        finite = np.isfinite(x).all(axis=1)
        got[1], want[1] = got[1][finite], want[1][finite]
    if elem != F64:
        # onnxruntime rounds LogSoftmax's row sum (1 + s beside the row's maximum) to
        # float32 before its log: up to ~1.2e-7 off near 0, where ours (summed in
        # float64) is exact to an ulp; test_log_softmax_of_a_dominated_row checks ours
        assert_same(got[1:2], want[1:2], rtol=tol, atol=2.4e-7)
        got, want = got[:1] + got[2:], want[:1] + want[2:]
    assert_same(got, want, rtol=tol)


@pytest.mark.parametrize("elem", [F32, F16])
def test_log_softmax_of_a_dominated_row(elem):
    """A row one element dominates: its LogSoftmax there is -log(1 + s), s the others'
    share. Rounding 1 + s to float32 loses s to ~1e-7 / s relative (fuzz 109/750:
    -4.5e-4 off by 2e-4); summed and logged in float64, ours is the float64 value rounded
    (onnxruntime's is not: it is skipped here). Where 1 + s rounds to 1 in float32 (the
    gap of 30), the maximum's value is 0, as onnxruntime's."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    gaps = np.array([2.0, 5.0, 9.4118, 12.0, 16.0, 30.0])
    x = np.zeros((len(gaps), 8))
    x[:, 1:] = -gaps[:, None] - np.linspace(0, 1, 7)
    x = x.astype(dtype)
    m = model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)],
              [("x", elem, list(x.shape))], [("y", elem)])
    got = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1).run(
        None, {"x": x})[0]
    x64 = x.astype(np.float64)  # each row's maximum is x[:, 0] = 0: log1p of the others
    share = np.exp(x64[:, 1:]).sum(axis=1, keepdims=True)
    want = x64 - np.where(share < 2.0 ** -24, 0, np.log1p(share))
    # float32 exps (an ulp each) and one rounding: a few ulps of the result
    np.testing.assert_allclose(got.astype(np.float64), want.astype(dtype).astype(np.float64),
                               rtol=4 * float(np.finfo(dtype).eps), atol=0)


@pytest.mark.parametrize("elem", [F32, F16, F64])
def test_log_softmax_max_is_zero_where_the_others_vanish(elem):
    """The others' share below half an ulp of 1: the maximum's LogSoftmax is 0, as
    onnxruntime's (fuzz 114/232: -1.76e-18, the exact -log(1 + e^-40.88), against its 0),
    and the rest as onnxruntime gives them; NaN rows stay NaN."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    x = np.array([[0.0, -40.88142], [np.nan, np.nan], [3.0, -14.0], [-1.0, -100.0],
                  [5.0, 5.0 - 2e-4]]).astype(dtype)
    if dtype == np.float64:
        x[2, 1] = -40.0  # e^-43 is below float64's half ulp of 1; e^-17 is not
    m = model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)],
              [("x", elem, list(x.shape))], [("y", elem)])
    (got,), (want,) = run_both(m, {"x": x})
    np.testing.assert_array_equal(got[:, 0][:4], want[:, 0][:4])
    np.testing.assert_allclose(got, want, rtol=2 * float(np.finfo(dtype).eps), atol=0)


def masked_softmax(n: int, elem: int = F32) -> onnx.ModelProto:
    """GPT-2's causal softmax: scores + where(pos_k <= pos_q, 0, lowest), int64 positions
    compared inside the max phase (int64 vector loads, compares, bool logic, select)."""
    lowest = np.finfo(helper.tensor_dtype_to_np_dtype(elem)).min
    nodes = [helper.make_node("LessOrEqual", ["k", "q"], ["keep"]),
             helper.make_node("Equal", ["qb", "kb"], ["same"]),
             helper.make_node("And", ["keep", "same"], ["ok"]),
             helper.make_node("Where", ["ok", "zero", "low"], ["bias"]),
             helper.make_node("Add", ["s", "bias"], ["t"]),
             helper.make_node("Softmax", ["t"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["bad"]),
             helper.make_node("Where", ["bad", "zero", "p"], ["y"])]
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    inits = (onnx.numpy_helper.from_array(np.arange(n, dtype=np.int64).reshape(1, n), "k"),
             onnx.numpy_helper.from_array(np.arange(n, dtype=np.int64).reshape(n, 1), "q"),
             onnx.numpy_helper.from_array(np.zeros((n, 1), np.int64), "qb"),
             onnx.numpy_helper.from_array(np.zeros((1, n), np.int64), "kb"),
             onnx.numpy_helper.from_array(np.array(0, dtype), "zero"),
             onnx.numpy_helper.from_array(np.array(lowest, dtype), "low"))
    return model(nodes, [("s", elem, [2, 3, n, n])], [("y", elem)], inits)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 15, 16, 17, 64, 65])
def test_causal_masked_softmax_matches_onnxruntime(n):
    s = np.random.default_rng(n).standard_normal((2, 3, n, n)).astype(np.float32)
    s[0, 1, n // 2, 0] = np.nan
    s[1, 2, n - 1, n // 2] = np.inf
    got, want = run_both(masked_softmax(n), {"s": s})
    assert_same(got, want, rtol=1e-5)


def llvm_ir(m: onnx.ModelProto) -> str:
    graph = import_model(m)
    flags = flags_mod.parse("")
    program = lower_graph(graph, flags, cpu)
    kernels = [t for t in program.thunks if isinstance(t, kir.Kernel)]
    return str(codegen.build_module(kernels, fast_math=False))


@pytest.mark.parametrize("n,lanes", [(64, 16), (17, 16), (15, 8), (3, 2)])
def test_masked_softmax_max_phase_is_vector_code(n, lanes):
    """The max phase of GPT-2's softmax (an int64 position mask in it) is one vector
    reduction of the widest power-of-two lanes, no scalar tail, and no scalar maxnum
    left for the loop vectorizer."""
    text = llvm_ir(masked_softmax(n))
    assert re.search(rf"llvm\.vector\.reduce\.fmax\.v{lanes}f32", text), text[:3000]
    assert f"<{lanes} x i64>" in text
    assert "llvm.maxnum.f32" not in text


SUM_LENGTHS = [15, 16, 17, 31, 32, 33, 75, 100, 750]


@pytest.mark.parametrize("n", SUM_LENGTHS)
@pytest.mark.parametrize("elem", [F32, F64])
def test_softmax_sum_phase_matches_onnxruntime(n, elem):
    """Softmax's sum phase (exp stashed in the output row) as full-width vector chunks and
    a scalar tail: every special row (NaN anywhere, +-inf, -0.0, all -inf, half +inf),
    huge, tiny and denormal values, against onnxruntime."""
    dtype = np.float32 if elem == F32 else np.float64
    x = np.concatenate([special_rows(n, dtype),
                        np.full((1, n), 1e20, dtype), np.full((1, n), 1e-40, dtype),
                        np.random.default_rng(n).standard_normal((5, n)).astype(dtype) * 30])
    got, want = run_both(model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                               [("x", elem, list(x.shape))], [("y", elem)]), {"x": x})
    assert_same(got, want, rtol=1e-5 if elem == F32 else 1e-12, atol=1e-7)


@pytest.mark.parametrize("n,vector", [(750, True), (16, True), (15, False)])
def test_softmax_sum_phase_is_vector_code(n, vector):
    """Rows of at least one full 512-bit vector sum in 16-lane chunks (the exp stored as
    vectors); shorter rows stay with the loop vectorizer."""
    text = llvm_ir(model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                         [("x", F32, [8, n])], [("y", F32)]))
    assert bool(re.search(r"llvm\.vector\.reduce\.fadd\.v16f32", text)) == vector


@pytest.mark.parametrize("elem", [F32, F64])
def test_softmax_sum_phase_over_a_symbolic_row_length(elem, tmp_path):
    """A row of symbolic length (the parametric kernel of an export with a dynamic sequence)
    sums in vector chunks too, chosen per run: rows of at least one vector take the chunks
    and, where the lanes do not divide the row, the overlapping last chunk (its skipped
    lanes a run-time mask); shorter rows the scalar loop. One compile serves every length;
    the special rows, huge, tiny and denormal values against onnxruntime."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
              [("x", elem, ["rows", "n"])], [("y", elem)])
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1,
                                      autotune=False, dump_to=str(tmp_path))
    compiles = None  # a row of 1 is a shape class of its own; from 750 on, one code
    for n in [1, 750, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100]:
        x = np.concatenate([special_rows(n, dtype), np.full((1, n), 1e20, dtype),
                            np.full((1, n), 1e-40, dtype),
                            np.random.default_rng(n).standard_normal((5, n)).astype(dtype) * 30])
        assert_same(sess.run(None, {"x": x}), ref.run(None, {"x": x}),
                    rtol=1e-5 if elem == F32 else 1e-12, atol=1e-7)
        compiles = cpu.COMPILE_COUNT if n == 750 else compiles
    assert cpu.COMPILE_COUNT == compiles
    text = "".join(p.read_text() for p in tmp_path.glob("*.ll"))  # both classes' code
    lanes = 16 if elem == F32 else 8
    assert re.search(rf"llvm\.vector\.reduce\.fadd\.v{lanes}f(32|64)", text), text[:3000]


@pytest.mark.parametrize("check_bounds", [False, True])
def test_symbolic_softmax_written_over_its_scores(check_bounds):
    """The same over scores the softmax overwrites (a MatMul's result read by another
    MatMul, as attention's, inplace.py): the overlapping last chunk of a row whose length
    is known only at run time reads back its first lanes already stashed and must keep
    them (as fuzz 159/2416 for a fixed length), with and without --check_bounds."""
    m = model([helper.make_node("MatMul", ["a", "b"], ["s"]),
               helper.make_node("Softmax", ["s"], ["p"], axis=-1),
               helper.make_node("MatMul", ["p", "v"], ["y"])],
              [("a", F32, [3, "rows", 4]), ("b", F32, [4, "n"]), ("v", F32, ["n", 4])],
              [("y", F32)])
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1,
                                      autotune=False, check_bounds=check_bounds)
    rng = np.random.default_rng(0)
    for n in [18, 33, 750, 16, 5]:
        feeds = {"a": rng.standard_normal((3, 7, 4)).astype(np.float32) * 4,
                 "b": rng.standard_normal((4, n)).astype(np.float32),
                 "v": rng.standard_normal((n, 4)).astype(np.float32)}
        assert_same(sess.run(None, feeds), ref.run(None, feeds), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("gemm_reader", [True, False])
def test_softmax_exp_is_one_masked_step(gemm_reader):
    """The sum phase's exp of x - max(x) compares each chunk once: against log(2^-126)
    where the softmax flushes (read only by a GEMM: ops/normalization.py), else against
    exp's own underflow bound; no overflow clamp (x - max(x) is never above 0) and no
    separate flush select (vectorize.VectorExprs._exp). Two chunks over a row of 750:
    the 16-lane ones, then the overlapping last one."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1)]
    inputs = [("x", F32, [8, 750])]
    if gemm_reader:
        nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
        inputs.append(("v", F32, [750, 4]))
    text = llvm_ir(model(nodes, inputs, [("y" if gemm_reader else "p", F32)]))
    compares = re.findall(r"fcmp (\w+) <16 x float> %\S+, <float (\w+),", text)
    bound = np.float32(np.log(np.finfo(np.float32).tiny)) if gemm_reader else -104.0
    want = "0x" + np.float64(bound).tobytes()[::-1].hex().upper()
    assert [(kind, c.upper().replace("0X", "0x")) for kind, c in compares] == \
        [("olt", want)] * 2, compares


def gather_model(n_uses: int) -> onnx.ModelProto:
    """One embedding Gather whose result feeds n_uses LayerNorm-like row kernels, each also
    reading the running sum: the gather is recomputed in each of them."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"])]
    prev = "e"
    outs = []
    for k in range(n_uses):
        nodes += [helper.make_node("ReduceMean", [prev, "axes"], [f"m{k}"]),
                  helper.make_node("Sub", [prev, f"m{k}"], [f"y{k}"]),
                  helper.make_node("MatMul", [f"y{k}", "w"], [f"h{k}"]),
                  helper.make_node("Add", [prev, f"h{k}"], [f"r{k}"])]
        prev = f"r{k}"
        outs.append((f"y{k}", F32))
    rng = np.random.default_rng(0)
    inits = (onnx.numpy_helper.from_array(rng.standard_normal((50, 32)).astype(np.float32),
                                          "table"),
             onnx.numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32),
                                          "w"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    return model(nodes, [("ids", I64, [1, 8])], outs, inits)


def test_gather_index_checked_once_per_run():
    m = gather_model(4)
    graph = import_model(m)
    program = lower_graph(graph, flags_mod.parse(""), cpu)
    checks = [t for t in program.thunks if isinstance(t, kir.Check)]
    readers = [k for k in kir.kernels(program.thunks) if any(  # GEMM epilogues too
        isinstance(e, kir.Load) and e.dyn for e in kir.kernel_exprs(k))]
    assert len(readers) >= 2, program  # several kernels recompute the gather ...
    assert len(checks) == 1, checks    # ... and its index is checked once
    sess = autoclust.InferenceSession(m, must_compile=True, min_cluster_size=1)
    ids = np.array([[0, 3, 49, -1, -50, 7, 7, 2]], np.int64)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"ids": ids})
    assert_same(sess.run(None, {"ids": ids}), want, rtol=1e-5, atol=1e-5)
    assert sess.stats()["clusters"][0]["fallback"] is None
    for bad in (50, -51):
        ids[0, 5] = bad
        with pytest.raises(InvalidInputError, match=r"Gather.*out of range \[-50, 49\]"):
            sess.run(None, {"ids": ids})


def test_residual_stream_is_not_recomputed_in_every_layer():
    """A residual chain (Gather, then one Add per layer) read by each layer's row kernel
    is stored once it reads several tensors (recompute.LOAD_COST), not rebuilt from the
    embedding in every layer: no kernel reads more than 4 tensors."""
    m = gather_model(6)
    program = lower_graph(import_model(m), flags_mod.parse(""), cpu)
    kernels = [t for t in program.thunks if isinstance(t, kir.Kernel)]
    widest = max(len(kir.loaded_buffers(k)) for k in kernels)
    assert widest <= 4, program
    ids = np.array([[0, 3, 49, -1, -50, 7, 7, 2]], np.int64)
    got, want = run_both(m, {"ids": ids})
    assert_same(got, want, rtol=1e-4, atol=1e-4)


def test_shared_gathered_mask_is_stored_once():
    """BERT's padding mask (a Gather of the attention mask, And-ed with a bool tensor, then
    Where) feeds every layer's softmax: it is computed once into a float mask, so each
    softmax row kernel reads it with plain loads and its max phase is vector code (a
    gather kept it scalar: 3 of BERT's 5 ms of softmax per run)."""
    n, layers = 16, 3
    nodes = [helper.make_node("Gather", ["keep", "pos"], ["g"]),
             helper.make_node("And", ["g", "valid"], ["ok"]),
             helper.make_node("Where", ["ok", "zero", "low"], ["bias"])]
    prev = "s"
    for k in range(layers):  # each layer's scores come from the previous probabilities
        nodes += [helper.make_node("MatMul", [prev, "w"], [f"s{k}"]),
                  helper.make_node("Add", [f"s{k}", "bias"], [f"t{k}"]),
                  helper.make_node("Softmax", [f"t{k}"], [f"p{k}"], axis=-1)]
        prev = f"p{k}"
    rng = np.random.default_rng(1)
    inits = (onnx.numpy_helper.from_array(np.arange(n, dtype=np.int64)[::-1].copy(), "pos"),
             onnx.numpy_helper.from_array(np.array(0, np.float32), "zero"),
             onnx.numpy_helper.from_array(np.array(-3e38, np.float32), "low"),
             onnx.numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "w"))
    m = model(nodes, [("keep", TensorProto.BOOL, [n]), ("valid", TensorProto.BOOL, [n, n]),
                      ("s", F32, [2, n, n])], [(prev, F32)], inits)
    program = lower_graph(import_model(m), flags_mod.parse(""), cpu)
    rows = [t for t in program.thunks if isinstance(t, kir.Kernel) and t.reductions]
    assert len(rows) == layers
    assert not any(isinstance(e, kir.Load) and e.dyn for k in rows for e in kir.kernel_exprs(k))
    feeds = {"keep": rng.random(n) > 0.3, "valid": rng.random((n, n)) > 0.2,
             "s": rng.standard_normal((2, n, n)).astype(np.float32)}
    got, want = run_both(m, feeds)
    assert_same(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n", [2, 7, 16, 33])
@pytest.mark.parametrize("mask_type", [I64, TensorProto.UINT8, TensorProto.INT32])
def test_max_phase_with_integer_casts_matches_onnxruntime(n, mask_type):
    """A max phase over x + (1 - cast(mask)) * -1e4 (BERT's additive padding mask, from an
    int64/uint8/int32 mask): integer loads widened, int -> float casts, all in vector code
    (the IR is asserted), against onnxruntime."""
    nodes = [helper.make_node("Cast", ["m"], ["mf"], to=F32),
             helper.make_node("Sub", ["one", "mf"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["bias"]),
             helper.make_node("Add", ["x", "bias"], ["t"]),
             helper.make_node("ReduceMax", ["t", "axes"], ["y"], keepdims=0),
             helper.make_node("Softmax", ["t"], ["p"], axis=-1)]
    inits = (onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             onnx.numpy_helper.from_array(np.array(-1e4, np.float32), "big"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    m = model(nodes, [("x", F32, [5, n]), ("m", mask_type, [5, n])], [("y", F32), ("p", F32)],
              inits)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((5, n)).astype(np.float32)
    x[1, n - 1] = np.nan
    mask = (rng.random((5, n)) > 0.3).astype(helper.tensor_dtype_to_np_dtype(mask_type))
    mask[2] = 0  # a row masked out entirely
    got, want = run_both(m, {"x": x, "m": mask})
    want[0][1] = np.nan  # onnxruntime's ReduceMax skips a NaN that is not first; NumPy's not
    assert_same(got, want, rtol=1e-6)
    text = llvm_ir(m)
    assert "llvm.vector.reduce.fmax" in text and "llvm.maxnum.f32" not in text
