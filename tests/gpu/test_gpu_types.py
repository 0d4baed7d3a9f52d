"""bfloat16 and int8/uint8/int16/uint16 in the GPU renderer, without a GPU (issue 9 part 1).

The models of tests/ops/test_bfloat16.py and tests/ops/test_narrow_int.py, a Cast between every pair
of dtypes, and reductions over the narrow types are lowered, rendered as C by backends/gpu,
run under the launch the renderer picks and under forced strategies (one thread / warp /
block per row, 64-bit indices, scalar instead of vector: test_gpu_render.VARIANTS), and
compared with the CPU tests' oracles: onnxruntime's own kernels where it has them, else
onnxruntime on the float32 graph with its Cast pair rounding each bfloat16 result
(test_bfloat16.emulated). Exact cases compare every bit but NaN payloads (-0.0 included);
the CPU backend's result must match the C rendering bit for bit, NaN signs included. nvcc
compiles the CUDA rendering of every case in one call; the simulated-device runtime runs a
bfloat16 and an int8 model end to end.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from autoclust.backends import cpu, gpu
from autoclust.backends.gpu import source
from autoclust.importers.onnx import import_model
from onnx import TensorProto, helper, numpy_helper
from support import fake_cupy, gpu_sim_backend, hostsim
from support.bfloat16 import BF, EDGE, UNARY, model, ort_plain, ort_reference
from support.gpu_render import (
    VARIANTS,
    module_ptx,
    needs_cc,
    needs_nvcc,
)
from support.narrow_int import BINARY, TYPES, chain_nodes, narrow_model, narrow_values
from support.narrow_int import UNARY as INT_UNARY

import autoclust
from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.compile import lower_graph
from autoclust.kernel import ir as kir
from autoclust.passes.optimize import optimize
from autoclust.passes.specialize import specialize

pytestmark = needs_cc  # the C rendering runs through the host C compiler

FLAGS = flags_mod.parse("")
F = TensorProto.FLOAT
BF16 = np.dtype(ml_dtypes.bfloat16)
ALL_TYPES = {"bool": TensorProto.BOOL, "float16": TensorProto.FLOAT16, "float32": F,
             "float64": TensorProto.DOUBLE, "int32": TensorProto.INT32,
             "int64": TensorProto.INT64, "bfloat16": BF, **TYPES}


@dataclasses.dataclass
class Case:
    id: str
    model: object
    feeds: dict
    want: list
    ulps: int = 0                  # bfloat16 steps allowed (float32 math may differ by one)
    program: kir.Program = None
    zero_sign: bool = True         # whether the sign of a zero result is compared


def _bf16_ref(m, feeds, ulps=0, cid=""):
    return Case(cid, m, feeds, ort_reference(m, feeds), ulps)


def _plain(m, feeds, cid=""):
    return Case(cid, m, feeds, [ort_plain(m, feeds)])


# ---- bfloat16: test_bfloat16's models on GPU shapes --------------------------------------

def _bf16_cases() -> list[Case]:
    out = []
    rt = model([helper.make_node("Cast", ["x"], ["a"], to=BF),
                helper.make_node("Identity", ["a"], ["b"]),
                helper.make_node("Cast", ["b"], ["y"], to=F)],
               [("x", F, [None])], [("y", F, [None])])
    neg_nan = np.array([-np.nan, 1 + 2 ** -7 + 2 ** -8, -(1 + 2 ** -7 + 2 ** -8)], np.float32)
    edge = np.concatenate([EDGE, neg_nan])
    for n in (1, 8):  # 23 elements (scalar tail) and 184 (vectors of 8, then a tail)
        out.append(_bf16_ref(rt, {"x": np.tile(edge, n)}, cid=f"round-trip-x{n}"))
    rng = np.random.default_rng(0)
    for op, (attrs, ulps) in UNARY.items():
        m = model([helper.make_node("Cast", ["x"], ["a"], to=BF),
                   helper.make_node(op, ["a"], ["b"], **attrs),
                   helper.make_node("Cast", ["b"], ["y"], to=F)],
                  [("x", F, [5, 24])], [("y", F, [5, 24])])
        x = (rng.standard_normal((5, 24)) * 3).astype(np.float32)
        x.flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-39]
        out.append(_bf16_ref(m, {"x": x}, ulps, f"unary-{op}"))  # Relu(-0.0) is -0.0 too
    for cols in (33, 32):  # rows of 33 run scalar, rows of 32 take the vector path
        out.append(_chain(cols, rng))
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        m = model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)],
                  [("x", BF, [3, 300])], [("y", BF, [3])], [axes])
        x = np.ones((3, 300), np.float32)
        x[0, 0], x[1, 7], x[2] = 256.0, np.nan, np.linspace(-4, 4, 300)
        case = _bf16_ref(m, {"x": x.astype(BF16)}, int(op == "ReduceMean"), op)
        if op in ("ReduceMax", "ReduceMin"):  # the NaN propagates (onnxruntime skips it)
            case.want[0] = np.array(case.want[0])
            case.want[0][1] = np.nan
        out.append(case)
    for op in ("ArgMax", "ArgMin"):
        m = model([helper.make_node(op, ["x"], ["y"], axis=1, select_last_index=1)],
                  [("x", BF, [4, 40])], [("y", TensorProto.INT64, [4, 1])])
        x = np.round(rng.standard_normal((4, 40)) * 2).astype(np.float32)  # many ties
        x[0, 3], x[1, :] = np.nan, -np.inf
        out.append(_bf16_ref(m, {"x": x.astype(BF16)}, cid=f"{op}-bf16"))
    out.append(_norms())
    out.append(_layout())
    return out


def _chain(cols: int, rng) -> Case:
    """test_bfloat16's (a*b + a) / (b - 3), max a: a missed rounding changes many results."""
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]),
             helper.make_node("Add", ["m", "a"], ["s"]),
             helper.make_node("Sub", ["b", "three"], ["d"]),
             helper.make_node("Div", ["s", "d"], ["q"]),
             helper.make_node("Max", ["q", "a"], ["y"])]
    three = numpy_helper.from_array(np.array(3.0, BF16), "three")
    m = model(nodes, [("a", BF, [64, cols]), ("b", BF, [1, cols])], [("y", BF, [64, cols])],
              [three])
    feeds = {"a": rng.standard_normal((64, cols)).astype(BF16),
             "b": (rng.standard_normal((1, cols)) * 5).astype(BF16)}
    return _bf16_ref(m, feeds, cid=f"chain-{cols}")


def _norms() -> Case:
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 48).astype(BF16), "scale")
    bias = numpy_helper.from_array(np.linspace(-1, 1, 48).astype(BF16), "bias")
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=-1),
             helper.make_node("Softmax", ["n"], ["y"], axis=-1)]
    m = model(nodes, [("x", BF, [2, 8, 48])], [("y", BF, [2, 8, 48])], [scale, bias])
    x = np.random.default_rng(2).standard_normal((2, 8, 48)).astype(BF16)
    return _bf16_ref(m, {"x": x}, 2, "layernorm-softmax")


def _layout() -> Case:
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Concat", ["t", "t"], ["c"], axis=0),
             helper.make_node("Slice", ["c", "starts", "ends"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "starts"),
             numpy_helper.from_array(np.array([7], np.int64), "ends")]
    m = model(nodes, [("x", BF, [3, 4])], [("y", BF, [6, 3])], inits)
    x = EDGE[:12].reshape(3, 4).astype(BF16)
    return Case("layout", m, {"x": x}, [np.concatenate([x.T, x.T])[1:7]])


# ---- narrow ints: test_narrow_int's models, reductions, and every Cast ---------------------

def _narrow_cases() -> list[Case]:
    out = []
    for op, dtypes in BINARY.items():
        for dt in dtypes:  # [8, 16] + [16]: vectors of 8 along rows of 16
            m = narrow_model([helper.make_node(op, ["a", "b"], ["y"])],
                       [("a", TYPES[dt], [8, 16]), ("b", TYPES[dt], [16])],
                       [("y", TYPES[dt], [8, 16])])
            feeds = {"a": narrow_values(dt, 128, 0).reshape(8, 16),
                     "b": narrow_values(dt, 16, 1, nonzero=op in ("Div", "Mod"))}
            out.append(_ort_case(m, feeds, f"{op}-{dt}"))
    for op, dtypes in INT_UNARY.items():
        for dt in dtypes:
            m = narrow_model([helper.make_node(op, ["a"], ["y"])], [("a", TYPES[dt], [64])],
                       [("y", TYPES[dt], [64])])
            out.append(_ort_case(m, {"a": narrow_values(dt, 64, 2)}, f"{op}-{dt}"))
    for dt in ("int8", "uint8"):
        out.append(_int_chain(dt))
    for op in ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin"):
        for dt in ("int8", "uint8"):  # the narrow types onnxruntime reduces
            out.append(_int_reduction(op, dt))
    return out


def _ort_case(m, feeds, cid):
    import onnxruntime as ort
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return Case(cid, m, feeds, sess.run(None, feeds))


def _int_chain(dt: str) -> Case:
    """test_narrow_int's chain: an int32 intermediate kept unwrapped flips the Less."""
    code = TYPES[dt]
    m = narrow_model(chain_nodes(), [("a", code, [4, 64]), ("b", code, [4, 64])],
               [("y", code, [4, 64])])
    feeds = {"a": narrow_values(dt, 256, 3).reshape(4, 64), "b": narrow_values(dt, 256, 4).reshape(4, 64)}
    return _ort_case(m, feeds, f"chain-{dt}")


def _int_reduction(op: str, dt: str) -> Case:
    code = TYPES[dt]
    if op.startswith("Arg"):
        node = helper.make_node(op, ["a"], ["y"], axis=1, select_last_index=1)
        out, inits = ("y", TensorProto.INT64, [6, 1]), []
    else:
        node = helper.make_node(op, ["a", "axes"], ["y"])
        out, inits = ("y", code, [6, 1]), [helper.make_tensor("axes", TensorProto.INT64, [1],
                                                             [1])]
    g = helper.make_graph([node], "r", [helper.make_tensor_value_info("a", code, [6, 300])],
                          [helper.make_tensor_value_info(*out)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return _ort_case(m, {"a": narrow_values(dt, 1800, 5).reshape(6, 300)}, f"{op}-{dt}")


def _int_sum(dt: str) -> Case:
    """ReduceSum of int8/int16 (onnxruntime has no such kernel; the CPU backend and this
    renderer accumulate in float64 and wrap once): NumPy's wrapping int sum is the oracle."""
    code = TYPES[dt]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    m = model([helper.make_node("ReduceSum", ["a", "axes"], ["y"], keepdims=0)],
              [("a", code, [5, 600])], [("y", code, [5])], [axes])
    a = narrow_values(dt, 3000, 6).reshape(5, 600)
    return Case(f"ReduceSum-{dt}", m, {"a": a}, [a.sum(axis=1, dtype=dt)])


CAST_RAW = np.array([1.5, -2.75, 0.0, -0.0, 2.5, -2.5, 127.0, 128.0, 255.0, 256.0, 300.0,
                     -129.0, 32767.0, 32768.0, 65535.0, 70000.0, 1e20, -1e20, np.nan, np.inf,
                     -np.inf, 16777217.0, 1 + 2 ** -8, 1e-39])
CAST_INTS = np.array([0, 1, -1, 127, 128, 255, 256, 300, -129, 32767, 32768, 65535, 65536,
                      -32769, 2 ** 31 - 1, -2 ** 31, 2 ** 40 + 5, 7, 16777217, -3, 44, 99,
                      -128, 1000000])


def _cast_input(src: str) -> np.ndarray:
    if src == "bool":
        return np.arange(24) % 3 == 0
    if src == "bfloat16":
        return CAST_RAW.astype(np.float32).astype(BF16)
    if np.dtype(src).kind == "f":
        with np.errstate(over="ignore"):
            return CAST_RAW.astype(src)
    return CAST_INTS.astype(src)  # NumPy wraps, as a narrow store does


def _cast_cases() -> list[Case]:
    out = []
    for src, s_code in ALL_TYPES.items():
        for dst, d_code in ALL_TYPES.items():
            if src != dst:
                m = model([helper.make_node("Cast", ["x"], ["y"], to=d_code)],
                          [("x", s_code, [24])], [("y", d_code, [24])])
                out.append(_plain(m, {"x": _cast_input(src)}, f"Cast-{src}-{dst}"))
    return out


CASES = _bf16_cases() + _narrow_cases() + [_int_sum("int8"), _int_sum("int16")] \
    + _cast_cases()


def _program(m, feeds: dict) -> kir.Program:
    """The kernel IR of the whole model, as a cluster of it is compiled for the GPU."""
    graph = import_model(m)
    types = [(feeds[v.name].dtype, feeds[v.name].shape) for v in graph.inputs]
    return lower_graph(optimize(specialize(graph, types, {}), FLAGS), FLAGS, gpu)


@pytest.fixture(scope="module")
def prepared() -> list[Case]:
    for c in CASES:
        if c.program is None:
            c.program = _program(c.model, c.feeds)
    return CASES


_BUILT: dict[str, list] = {}


def _executables(variant: str, cases: list[Case]) -> list:
    if variant not in _BUILT:  # one gcc call per variant
        _BUILT[variant] = hostsim.compile_many([c.program for c in cases], VARIANTS[variant])
    return _BUILT[variant]


def _inputs(case: Case) -> list[np.ndarray]:
    return [case.feeds[v.name] for v in import_model(case.model).inputs]


def assert_same(got: np.ndarray, want: np.ndarray, ulps: int, where: str,
                zero_sign: bool = True) -> None:
    """Equal bits but NaN payloads (ulps == 0); bfloat16 is compared as its float32 value."""
    want_dtype = BF16 if want.dtype == np.float32 and got.dtype == BF16 else want.dtype
    assert got.dtype == want_dtype, f"{where}: dtype {got.dtype} vs {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape} vs {want.shape}"
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=where)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    if ulps:
        np.testing.assert_allclose(g, w, rtol=ulps * 2.0 ** -7, atol=1e-30, err_msg=where)
        return
    np.testing.assert_array_equal(g, w, err_msg=where)
    if zero_sign:
        assert (np.signbit(g) == np.signbit(w))[w == 0].all(), f"{where}: sign of a zero"


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.id for c in CASES])
def test_c_rendering_matches_the_oracle(prepared, variant, index):
    case = prepared[index]
    got = _executables(variant, prepared)[index].run(_inputs(case))
    assert len(got) == len(case.want)
    for k, (g, w) in enumerate(zip(got, case.want)):
        assert_same(g, np.asarray(w), case.ulps, f"{case.id} [{variant}] output {k}",
                    case.zero_sign)


# float32 transcendentals aside: libm and LLVM may differ by an ulp there
EXACT = [i for i, c in enumerate(CASES) if not c.ulps]


@pytest.mark.parametrize("index", EXACT, ids=[CASES[i].id for i in EXACT])
def test_c_rendering_matches_the_cpu_backend_bit_for_bit(prepared, index):
    """The same kernel IR through LLVM (backends/cpu) and through C: every bit equal where
    the math is exact, NaN signs and payloads included (the oracles cannot see those)."""
    case = prepared[index]
    got = _executables("chosen", prepared)[index].run(_inputs(case))
    want = cpu.compile(case.program, FLAGS).run(_inputs(case))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=case.id)


def test_bfloat16_rounding_bits(prepared):
    """Ties to even, overflow to inf, NaN stays a quiet NaN of its sign: ml_dtypes' bits."""
    case = next(c for c in prepared if c.id == "round-trip-x8")
    x = case.feeds["x"]
    program = _program(model([helper.make_node("Cast", ["x"], ["y"], to=BF)],
                             [("x", F, [None])], [("y", BF, [None])]), {"x": x})
    got = hostsim.compile(program, FLAGS).run([x])[0]
    bits, want = got.view(np.uint16), x.astype(BF16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(bits[~nan], want[~nan])
    assert ((bits[nan] & 0x7fc0) == 0x7fc0).all()                 # quiet NaN
    np.testing.assert_array_equal(bits[nan] >> 15, np.signbit(x[nan]))


def test_vector_path_and_every_row_strategy_are_exercised(prepared):
    """The cases reach the vector path with 1- and 2-byte structs and the row strategies the
    renderer picks by itself (the forced VARIANTS cover the others)."""
    strategies, structs = set(), set()
    for c in prepared:
        rendered = source.render_program(c.program, "c")
        strategies |= {e.launch.strategy for e in rendered.kernels.values()}
        structs |= rendered.vector_types
    assert {"vector", "elementwise", "warp-row", "block-row"} <= strategies
    assert {("unsigned short", 8), ("signed char", 8), ("unsigned char", 8)} <= structs
    chain = next(c for c in prepared if c.id == "chain-32")
    assert {e.launch.strategy for e in source.render_program(chain.program, "c")
            .kernels.values()} == {"vector"}


# ---- CUDA: nvcc ------------------------------------------------------------------------

@needs_nvcc
def test_cuda_rendering_compiles(prepared, tmp_path):
    parts = [source.render_program(c.program, "cuda", VARIANTS[v]) for c in prepared
             for v in ("chosen", "block", "thread-wide", "warp")]
    ptx = module_ptx(parts, tmp_path, "types")
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx
    assert "ld.global.nc.v4.u32" in ptx or "ld.global.nc.v4.b32" in ptx  # 8 bfloat16s
    assert "ld.global.nc.v2.u32" in ptx or "ld.global.nc.v2.b32" in ptx  # 8 int8s


# ---- the simulated-device runtime: clustering and end to end ---------------------------

@pytest.fixture
def sim_device(monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "gpu-sim", "support.gpu_sim_backend")


def _session(m) -> autoclust.InferenceSession:
    return autoclust.InferenceSession(m.SerializeToString(), device="gpu-sim")


def test_bfloat16_model_runs_on_the_simulated_device(sim_device):
    case = next(c for c in CASES if c.id == "layernorm-softmax")
    before = len(gpu_sim_backend.COMPILES)
    sess = _session(case.model)
    (got,) = sess.run(None, case.feeds)
    assert type(got) is np.ndarray and got.dtype == BF16
    assert_same(got, case.want[0], case.ulps, case.id)
    assert len(sess.plan.clusters) == 1 and not sess.plan.reasons  # why_not accepts it
    assert [c["kernels"] for c in sess.stats()["clusters"]] == [[1]]
    assert len(gpu_sim_backend.COMPILES) == before + 1


def test_int8_model_runs_on_the_simulated_device(sim_device):
    case = next(c for c in CASES if c.id == "chain-int8")
    sess = _session(case.model)
    (got,) = sess.run(None, case.feeds)
    assert_same(got, case.want[0], 0, case.id)
    assert len(sess.plan.clusters) == 1 and not sess.plan.reasons
    assert [c["kernels"] for c in sess.stats()["clusters"]] == [[1]]


def test_why_not_accepts_narrow_values_but_not_library_calls(sim_device):
    m = model([helper.make_node("MatMul", ["a", "b"], ["m"]),
               helper.make_node("Relu", ["m"], ["y"])],
              [("a", TensorProto.INT8, [2, 3]), ("b", TensorProto.INT8, [3, 2])],
              [("y", TensorProto.INT8, [2, 2])])
    graph = import_model(m)
    reasons = {n.op: gpu.why_not(n, graph) for n in graph.nodes}
    assert reasons == {"MatMul": None, "Relu": None}  # dtypes are the op table's business
    with pytest.raises(autoclust.errors.NotCompilableError,
                       match="MatMul.*dtype int8 of input 'a' not supported"):
        autoclust.InferenceSession(m.SerializeToString(), device="gpu-sim",
                                   must_compile=True)


@pytest.fixture
def fake(monkeypatch):
    yield from fake_cupy.installed(monkeypatch)


def test_bfloat16_and_narrow_ints_through_the_gpu_executable(fake):
    """bfloat16 buffers live in device memory as their 16 bits (device.BF16Array, no CuPy
    dtype for them) and come back as ml_dtypes arrays with the CPU oracle's bits; narrow
    ints compile and run through the executable too (the stand-in runs the C rendering)."""
    from autoclust.backends.gpu import device
    for case_id in ("chain-32", "chain-int8"):
        case = next(c for c in CASES if c.id == case_id)
        exe = gpu.compile(_program(case.model, case.feeds), FLAGS)
        (got,) = exe.run(_inputs(case))
        if case_id == "chain-32":
            assert isinstance(got, device.BF16Array) and got.dtype == BF16
        host = device.to_host(got)
        assert_same(host, case.want[0], case.ulps, case.id)
