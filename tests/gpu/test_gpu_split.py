"""Split-row reductions (backends/gpu/split.py) without a GPU: the C rendering against
onnxruntime, the launch choice, run-to-run bits, nvcc --ptx, and the stand-in CuPy.

The C rendering runs the CUDA kernel's protocol on the host: emulated blocks one after
another over the same (row, chunk) work loop, the per-row arrival counters, the last
block's combine, the first-NaN rule and the counter reset. Small chunks (1 and 7
elements) force many chunks, chunk tails and late-chunk NaNs onto short rows; one case
runs the chunk size `choose` picks on a row past launch.SPLIT_ROW.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from autoclust.backends import cpu
from autoclust.backends.gpu import launch, source, split
from support import hostsim
from support.compiled import infer, one_node_graph, rand, run_onnxruntime
from support.gpu_render import Case, assert_matches, module_ptx, needs_nvcc

from autoclust import flags as flags_mod
from autoclust.compile import lower_graph
from autoclust.ir import Graph, Node
from autoclust.kernel import ir as kir

FLAGS = flags_mod.parse("")
pytestmark = pytest.mark.skipif(shutil.which(hostsim.CC) is None,
                                reason=f"no C compiler ({hostsim.CC}) on PATH")
DTYPES = ("float32", "float16", "float64", "int32", "int64")
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare", "ReduceLogSum")
I64 = np.array([1], np.int64)


def _values(op: str, shape: tuple, dtype: str) -> np.ndarray:
    """Inputs in each op's domain: products of values near 1 (integers of +-1 and a few
    2s, so nothing overflows), positive values for ReduceLogSum."""
    x = rand(shape, dtype)
    if op == "ReduceProd":
        x = (np.sign(x) + (x == 0)).astype(dtype)
        x.reshape(-1)[::9] *= 2
        if np.dtype(dtype).kind == "f":
            x = (x * rand(shape, dtype, 0.95, 1.05)).astype(dtype)
    elif op == "ReduceLogSum":
        x = (np.abs(x) + 1).astype(dtype)
    return x


def _case(cid: str, op: str, x: np.ndarray, attrs: dict | None = None,
          axes: np.ndarray | None = I64) -> Case:
    if op.startswith("Arg") or axes is None:
        g = one_node_graph(op, [x], attrs or {})
    else:
        g = one_node_graph(op, [x, axes], attrs or {}, const_inputs=(1,))
    return Case(cid, g, [x], rtol=2e-3 if x.dtype == np.float16 else 2e-5)


def _two_phase_case(cid: str, x: np.ndarray, steps: list, outputs: list[str]) -> Case:
    """A graph of `steps` (op, input names, output, attrs) over x; "axes" is [1]."""
    g = Graph(cid)
    vals = {"x": g.add_input("x", x.dtype, x.shape),
            "axes": g.add_initializer("axes", I64)}
    for op, ins, out, attrs in steps:
        vals[out] = g.value(out)
        infer(g, g.add_node(Node(op, [vals[i] for i in ins], [vals[out]], attrs)))
    g.outputs = [vals[o] for o in outputs]
    return Case(cid, g, [x])


def _nan_rows(shape: tuple, dtype: str = "float32") -> np.ndarray:
    """Rows of 50 with ties: a NaN late in row 1 (the last chunk of 7), a NaN first in row
    2, row 0 all -inf."""
    x = np.round(rand(shape)).astype(dtype)
    x[0] = -np.inf
    x[1, 45] = np.nan
    x[2, 0] = np.nan
    return x


def _main_cases() -> list[Case]:
    out = []
    for dtype in DTYPES:
        for op in REDUCE:
            out.append(_case(f"{op}-{dtype}", op, _values(op, (3, 50), dtype)))
        for op in ("ArgMax", "ArgMin"):
            x = np.round(rand((3, 50), dtype) / 2).astype(dtype)  # ties across chunks
            out.append(_case(f"{op}-{dtype}", op, x, {"axis": 1}))
            out.append(_case(f"{op}-last-{dtype}", op, x, {"axis": 1, "select_last_index": 1}))
    for op in ("ReduceMax", "ReduceMin", "ReduceSum", "ArgMax", "ArgMin"):
        attrs = {"axis": 1} if op.startswith("Arg") else None
        out.append(_case(f"{op}-nan", op, _nan_rows((3, 50)), attrs))
        out.append(_case(f"{op}-nan-f16", op, _nan_rows((3, 50), "float16"), attrs))
        out.append(_case(f"{op}-nan-last", op, _nan_rows((3, 50)),
                         {"axis": 1, "select_last_index": 1} if attrs else None))
    # independent phases in one kernel: a per-row epilogue of both, two per-row outputs
    out.append(_two_phase_case("Max+Sum", _nan_rows((3, 50)), [
        ("ReduceMax", ["x", "axes"], "m", {}), ("ReduceSum", ["x", "axes"], "s", {}),
        ("Add", ["m", "s"], "y", {})], ["y"]))
    out.append(_two_phase_case("ArgMin,Sum", _nan_rows((3, 50)), [
        ("ArgMin", ["x"], "a", {"axis": 1}), ("ReduceSum", ["x", "axes"], "s", {})],
        ["a", "s"]))
    out.append(_case("ReduceSum-all-1-row", "ReduceSum", rand((5, 11)), {"keepdims": 0},
                     axes=None))
    out.append(_case("ArgMax-1-row", "ArgMax", rand((1, 61)), {"axis": 1}))
    out.append(_case("ReduceMax-strided-rows", "ReduceMax", rand((2, 40, 3)), None, I64))
    out.append(_case("ReduceMean-multiple-of-chunk", "ReduceMean", rand((3, 49))))
    out.append(_case("ReduceSum-shorter-than-chunk", "ReduceSum", rand((3, 5))))
    for op in ("ReduceSum", "ReduceMax", "ReduceProd"):
        out.append(_case(f"{op}-empty-rows", op, rand((3, 0)), {"keepdims": 0}))
    out.append(_case("ReduceSum-zero-rows", "ReduceSum", rand((0, 50))))
    return out


def _chunk1_cases() -> list[Case]:
    """Chunks of one element: every element is a partial."""
    return [_case("ReduceSum-c1", "ReduceSum", rand((3, 50))),
            _case("ReduceSum-c1-f16", "ReduceSum", rand((3, 50), "float16")),
            _case("ReduceMax-c1-nan", "ReduceMax", _nan_rows((3, 50))),
            _case("ArgMin-c1-nan", "ArgMin", _nan_rows((3, 50)), {"axis": 1}),
            _case("ReduceL2-c1-f64", "ReduceL2", rand((1, 50), "float64"))]


def forced(chunk: int):
    """A choose_launch giving every splittable kernel split-row with chunks of `chunk`."""
    def pick(k: kir.Kernel, n0: int) -> launch.Launch:
        d = launch.choose(k, n0)
        if not launch.splittable(k):
            return d
        inner = launch.prod(k.shape[len(k.shape) - k.n_inner:])
        return launch.split_launch(inner, d.unit, chunk, d.wide)
    return pick


TABLES = {"chunk7": (_main_cases(), forced(7)), "chunk1": (_chunk1_cases(), forced(1)),
          "chosen": ([_case("ReduceSum-chosen", "ReduceSum", rand((2, 70000))),
                      _case("ArgMax-chosen", "ArgMax", _nan_rows((3, 70000)), {"axis": 1})],
                     launch.choose)}
_BUILT: dict[str, list] = {}


def _built(table: str) -> tuple[list[Case], list]:
    cases, pick = TABLES[table]
    if table not in _BUILT:
        for c in cases:
            c.program = lower_graph(c.graph, FLAGS, cpu)
            c.expected = [np.array(e) for e in run_onnxruntime(c.graph, c.feeds)]
            if c.graph.nodes[0].op in ("ReduceMax", "ReduceMin") and \
                    np.isnan(c.feeds[0]).any():
                # a NaN anywhere in a row propagates (onnxruntime skips one that is not first)
                c.expected[0][np.isnan(c.feeds[0]).any(axis=-1)] = np.nan
        _BUILT[table] = hostsim.compile_many([c.program for c in cases], pick)
    return cases, _BUILT[table]


def _ids(table: str) -> list[str]:
    return [c.id for c in TABLES[table][0]]


def _strategies(exe) -> set[str]:
    return {e.launch.strategy for e in exe.rendered.kernels.values()}


@pytest.mark.parametrize("table", list(TABLES))
def test_split_rows_match_onnxruntime_and_repeat_bit_for_bit(table):
    """Every case runs split-row, matches onnxruntime, and a second run of the same
    executable gives the same bits (the last block reset the counters)."""
    cases, exes = _built(table)
    for case, exe in zip(cases, exes):
        want = set() if case.id.endswith("zero-rows") else {"split-row"}  # nothing to launch
        assert _strategies(exe) == want, case.id
        first = exe.run(case.feeds)
        assert_matches(case, first, table)
        second = exe.run(case.feeds)
        for a, b in zip(first, second):
            assert a.tobytes() == b.tobytes(), f"{case.id}: second run differs"


@pytest.mark.parametrize("table", ["chunk1", "chunk7"])
def test_bits_do_not_depend_on_the_order_blocks_finish(monkeypatch, table):
    """Other emulated grids change which block arrives last for each row and in what order
    the partials land; combining them in chunk order gives the same bits regardless."""
    cases, exes = _built(table)
    want = [exe.run(c.feeds) for c, exe in zip(cases, exes)]
    for grid in (1, 2, 5):
        monkeypatch.setattr(hostsim, "GRID", grid)
        for case, exe, w in zip(cases, exes, want):
            for a, b in zip(exe.run(case.feeds), w):
                assert a.tobytes() == b.tobytes(), f"{case.id}: grid {grid} differs"


def test_workspace_layout():
    """Counters (rounded to 8 bytes), then rows * chunks 8-byte slots per accumulator part:
    one for a sum, two (value, position) for an arg reduction."""
    cases, exes = _built("chunk7")
    by_id = {c.id: (c, e) for c, e in zip(cases, exes)}
    c, exe = by_id["ReduceSum-float32"]
    k = c.program.thunks[0]
    lau = exe.rendered.kernels[k.name].launch
    assert (lau.chunk, lau.chunks) == (7, 8)          # 50 = 7 * 7 + 1
    assert split.workspace_bytes(k, lau, 3) == 16 + 8 * 3 * 8
    c, exe = by_id["ArgMax-float32"]
    k = c.program.thunks[0]
    assert split.workspace_bytes(k, exe.rendered.kernels[k.name].launch, 3) == 16 + 2 * 8 * 24


# ---- launch choice ----------------------------------------------------------------------

def _program(op: str, shape: tuple, attrs: dict | None = None, axes=I64) -> kir.Program:
    x = np.broadcast_to(np.float32(0), shape)   # lowering only needs the shape
    inputs, consts = ([x], ()) if axes is None else ([x, axes], (1,))
    return lower_graph(one_node_graph(op, inputs, attrs or {}, const_inputs=consts), FLAGS, cpu)


def _kernel(op: str, shape: tuple, attrs: dict | None = None, axes=I64) -> kir.Kernel:
    return next(t for t in _program(op, shape, attrs, axes).thunks if isinstance(t, kir.Kernel))


@pytest.mark.parametrize("op,shape,attrs,axes,strategy", [
    ("ReduceSum", (1, 1 << 22), None, I64, "split-row"),
    ("ReduceMean", (4, 1 << 21), None, I64, "split-row"),
    ("ReduceMax", (4, 1 << 21), None, I64, "split-row"),
    ("ArgMax", (4, 1 << 21), {"axis": 1}, None, "split-row"),
    ("ReduceSum", (1 << 24,), {"keepdims": 0}, None, "split-row"),   # to a scalar
    ("ReduceL2", (1 << 20, 3), None, np.array([0], np.int64), "split-row"),  # down columns
    ("ReduceSum", (4096, 4096), None, I64, "block-row"),          # rows fill the device
    ("ReduceSum", (300, 1 << 17), None, I64, "block-row"),
    ("ReduceSum", (4, 60000), None, I64, "block-row"),            # short of SPLIT_ROW
    ("Softmax", (4, 1 << 20), {"axis": -1}, None, "block-row"),   # a later phase needs r0
    ("ReduceLogSumExp", (4, 1 << 20), None, I64, "block-row"),    # max, then sum(exp(x - max))
])
def test_launch_choice(op, shape, attrs, axes, strategy):
    k = _kernel(op, shape, attrs, axes)
    got = launch.choose(k, k.shape[0])
    assert got.strategy == strategy
    if strategy == "split-row":
        inner = launch.prod(k.shape[len(k.shape) - k.n_inner:])
        assert got.chunks == -(-inner // launch.SPLIT_CHUNK) and got.chunk == launch.SPLIT_CHUNK
        assert got.grid(k.shape[0], 132) == min(got.items(k.shape[0]), 32 * 132)
        assert "split-row: " in got.describe() and "chunk(s) of 16384" in got.describe()


def test_kernels_txt_names_the_split():
    cases, _ = _built("chosen")
    text = source.render_program(cases[0].program, "cuda").launch_text(cases[0].program)
    assert ("[2] | [70000]: split-row: 5 chunk(s) of 16384 per row, a block of 512 per chunk; "
            "the last block of a row combines the partials in chunk order; block 512; "
            "32-bit indices") in text


def test_wide_indices_for_huge_rows():
    program = _program("ReduceSum", (2, 1 << 31))
    k = program.thunks[0]
    got = launch.choose(k, k.shape[0])
    assert got.strategy == "split-row" and got.wide
    body = next(iter(source.render_program(program, "cuda").bodies.values()))
    assert "unsigned long long ac_w" in body and "long long j = " in body


# ---- CUDA --------------------------------------------------------------------------------

@needs_nvcc
def test_cuda_split_rendering_compiles(tmp_path):
    parts = []
    for table in TABLES:
        cases, _ = _built(table)
        parts += [source.render_program(c.program, "cuda", TABLES[table][1]) for c in cases]
    ptx = module_ptx(parts, tmp_path, "split")
    assert "atom.global.add.u32" in ptx                    # the per-row arrival count
    assert "membar.gl" in ptx or "fence.sc.gpu" in ptx     # __threadfence
    assert "ld.volatile.global" in ptx                     # partials bypass a stale L1
    assert "bar.sync" in ptx and "shfl.sync.bfly" in ptx


# ---- the stand-in CuPy: the real Executable -----------------------------------------------

@pytest.fixture
def fake(monkeypatch):
    from support import fake_cupy
    yield from fake_cupy.installed(monkeypatch)


def test_split_kernels_through_the_gpu_executable(fake):
    """The executable allocates each split kernel's workspace (zeroed) once and passes it
    after n0; two runs give onnxruntime's answer."""
    from autoclust.backends import gpu
    from autoclust.backends.gpu import device
    cases, _ = _built("chosen")
    exes = gpu.compile_many([c.program for c in cases], FLAGS)
    for case, exe in zip(cases, exes):
        k = case.program.thunks[0]
        lau = exe.rendered.kernels[k.name].launch
        assert lau.strategy == "split-row" and lau.chunks == 5
        assert [w.size for w in exe._workspaces] == [split.workspace_bytes(k, lau, k.shape[0])]
        for _ in range(2):
            assert_matches(case, [device.to_host(y) for y in exe.run(case.feeds)], "fake")


def _model(x_shape: tuple) -> onnx.ModelProto:
    """y = ReduceSum(x, axis 1) * 2 and a = ArgMax(x, axis 1)."""
    h = onnx.helper
    nodes = [h.make_node("ReduceSum", ["x", "axes"], ["s"]),
             h.make_node("Mul", ["s", "two"], ["y"]),
             h.make_node("ArgMax", ["x"], ["a"], axis=1)]
    graph = h.make_graph(
        nodes, "split", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [x_shape[0], 1]),
         h.make_tensor_value_info("a", onnx.TensorProto.INT64, [x_shape[0], 1])],
        [h.make_tensor("axes", onnx.TensorProto.INT64, [1], [1]),
         h.make_tensor("two", onnx.TensorProto.FLOAT, [], [2.0])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_split_kernels_replay_in_a_cuda_graph(fake, monkeypatch):
    """Run 1 eager, runs 2-4 launch the captured graph: each launch starts from the counters
    the previous launch reset, and reads the new feeds."""
    import onnxruntime as ort
    from autoclust.backends.gpu import executable

    import autoclust
    sized = []
    real = executable.split.workspace_bytes
    monkeypatch.setattr(executable.split, "workspace_bytes",
                        lambda *a: sized.append(a[1].chunks) or real(*a))
    model = _model((2, 70000))
    sess = autoclust.InferenceSession(model, device="gpu", min_cluster_size=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(4):
        x = rand((2, 70000))
        x[1, 65536 + seed] = 10.0  # the argmax moves into the last chunk's tail
        got, want = sess.run(None, {"x": x}), ref.run(None, {"x": x})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-3)
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1][1] == 65536 + seed
    assert sess._runtime.device.graphs.replays == 3  # the capture run launches the graph too
    assert sized and set(sized) == {5}
