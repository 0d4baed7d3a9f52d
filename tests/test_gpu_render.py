"""The GPU renderer without a GPU: its C rendering run on the host against onnxruntime, and
its CUDA rendering compiled by nvcc (--ptx, sm_90).

Every lowered op (tests/test_lowering.py CASES) plus edge cases (0-d, size-1, empty,
NaN/inf, float16, integer corners, long rows, vector tails) is lowered, rendered as C by
backends/gpu (the same expression table, index maps, reduction combines and NaN rules as
the CUDA code; host loops stand in for the launch), compiled with gcc and compared with
onnxruntime -- under the launch the renderer picks and under forced strategies (one
thread / warp / block per row, 64-bit indices, scalar instead of vector), so every code
path of each kernel runs. One gcc call per strategy, one nvcc call per batch.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from autoclust.backends import cpu
from autoclust.backends.gpu import launch, source
from support import hostsim
from test_cpu_backend import one_node_graph, rand, run_onnxruntime, with_specials
from test_lowering import CASES

from autoclust import flags as flags_mod
from autoclust.compile import lower_graph
from autoclust.errors import InvalidInputError
from autoclust.kernel import ir as kir

FLAGS = flags_mod.parse("")
F16, I64 = "float16", "int64"
# the C rendering is compiled by the host C compiler (gcc)
pytestmark = pytest.mark.skipif(shutil.which(hostsim.CC) is None,
                                reason=f"no C compiler ({hostsim.CC}) on PATH")


def _to(dtype: str) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _edge_cases() -> list[tuple]:
    """(id, op, inputs, attrs, const_inputs, n_outputs) beyond test_lowering's CASES."""
    out = []
    for op in ("Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf", "Floor", "Round", "Sign",
               "IsNaN", "Abs", "Neg", "Relu", "Softplus", "Reciprocal"):
        out.append((f"{op}-specials", op, [with_specials(rand((4, 9)))], {}, (), 1))
    for shape in [(), (1,), (0, 3)]:
        out.append((f"Tanh-{shape}", "Tanh", [rand(shape)], {}, (), 1))
        out.append((f"Add-{shape}", "Add", [rand(shape), rand((1,))], {}, (), 1))
    for dtype in ("float64", "int32", "int64", F16):
        for op in ("Add", "Sub", "Mul", "Max", "Min", "Div"):
            a, b = rand((3, 1, 6), dtype), rand((4, 6), dtype)
            if np.dtype(dtype).kind == "i" and op == "Div":
                b[b == 0] = 7
            out.append((f"{op}-{dtype}", op, [a, b], {}, (), 1))
    extreme = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.5, -2.5, 1e20, 65504.0, 70000.0,
                        -0.0, 1e-45], np.float32)
    for dst in ("int32", "int64", F16, "bool", "float64"):
        out.append((f"Cast-extreme-{dst}", "Cast", [extreme.copy()], {"to": _to(dst)}, (), 1))
    out.append(("Cast-f64-f16", "Cast", [rand((5, 7), "float64")], {"to": _to(F16)}, (), 1))
    out.append(("Cast-i64-f16", "Cast", [rand((5, 7), I64) * 997], {"to": _to(F16)}, (), 1))
    out.append(("Cast-i64-i32", "Cast", [np.array([2**40 + 5, -2**35 - 1, 7], np.int64)],
                {"to": _to("int32")}, (), 1))
    # (INT_MIN / -1 traps inside onnxruntime 1.31 itself: test_int_min_by_minus_one)
    ints = np.array([[7, -7, 9, -2**31, 0], [5, -6, -8, 2**31 - 1, 3]], np.int32)
    divs = np.array([2, -3, -1, 5, -1], np.int32)
    out.append(("Div-int-corners", "Div", [ints, divs], {}, (), 1))
    out.append(("Mod-int-corners", "Mod", [ints, divs], {}, (), 1))
    out.append(("Mod-fmod-int", "Mod", [ints, divs], {"fmod": 1}, (), 1))
    out.append(("Mod-float", "Mod", [rand((3, 5)), rand((5,), lo=0.5, hi=2.0)], {"fmod": 1},
                (), 1))
    for op in ("ReduceMax", "ReduceMin", "ReduceSum"):
        x = with_specials(rand((3, 8)))
        x[1, 0] = np.nan
        out.append((f"{op}-nan", op, [x, np.array([1], np.int64)], {}, (1,), 1))
        out.append((f"{op}-empty-axis", op, [rand((2, 0, 3)), np.array([1], np.int64)], {},
                    (1,), 1))
    for dtype in ("int32", I64, F16, "float64"):
        out.append((f"ReduceSum-{dtype}", "ReduceSum", [rand((5, 9), dtype),
                                                        np.array([-1], np.int64)], {}, (1,), 1))
    for op in ("ArgMax", "ArgMin"):
        for attrs in ({"axis": -1}, {"axis": 1, "select_last_index": 1},
                      {"axis": 0, "keepdims": 0}):
            x = np.round(rand((4, 6, 5)))
            x[0, 0, :] = np.nan
            x[1, 2, 3] = np.nan
            x[2, :, 1] = -np.inf
            out.append((f"{op}-{attrs}", op, [x], attrs, (), 1))
        out.append((f"{op}-int", op, [rand((4, 7), I64)], {"axis": 1}, (), 1))
    sm = rand((3, 5, 17))
    sm[0, 0, 0] = -np.inf
    out.append(("Softmax-inf", "Softmax", [sm], {"axis": -1}, (), 1))
    out.append(("Softmax-long", "Softmax", [rand((3, 3000))], {"axis": -1}, (), 1))
    out.append(("Softmax-axis0", "Softmax", [rand((40, 6))], {"axis": 0}, (), 1))
    out.append(("ReduceSum-axis0-long", "ReduceSum", [rand((700, 3)), np.array([0], I64)],
                {}, (1,), 1))
    ln = [rand((2, 4, 24), F16), rand((24,), F16), rand((24,), F16)]
    out.append(("LayerNorm-f16", "LayerNormalization", ln, {"axis": -1}, (1, 2), 3))
    out.append(("Add-tail-1d", "Add", [rand((1003,)), rand((1003,))], {}, (), 1))
    out.append(("Add-rows-vector", "Mul", [rand((4, 1000)), rand((1000,))], {}, (), 1))
    out.append(("Add-f16-vector", "Add", [rand((6, 64), F16), rand((64,), F16)], {}, (), 1))
    out.append(("Where-bool", "Where", [rand((2, 3, 4), "bool"), rand((3, 4)),
                                        rand((2, 1, 1))], {}, (), 1))
    out.append(("CumSum-rev-excl-long", "CumSum", [rand((4, 300)), np.array(1, I64)],
                {"exclusive": 1, "reverse": 1}, (1,), 1))
    return out


@dataclasses.dataclass
class Case:
    id: str
    graph: object
    feeds: list
    expected: list = None
    program: kir.Program = None
    rtol: float = 2e-5


def _cases() -> list[Case]:
    out = []
    rows = [(f"{op}-{k}", op, *case) for op, cases in sorted(CASES.items())
            for k, case in enumerate(cases)] + _edge_cases()
    for cid, op, inputs, attrs, consts, n_out in rows:
        g = one_node_graph(op, inputs, attrs, const_inputs=consts, n_outputs=n_out)
        feeds = [v for i, v in enumerate(inputs) if v is not None and i not in consts]
        half = any(getattr(v, "dtype", None) == np.float16 for v in inputs)
        out.append(Case(cid, g, feeds, rtol=2e-3 if half else 2e-5))
    return out


CASE_LIST = _cases()


def _forced(strategy: str, wide: bool):
    """A choose_launch giving row kernels `strategy`, elementwise ones no vectors when
    strategy is "scalar", and 64-bit indices when `wide`."""
    def pick(k: kir.Kernel, n0: int) -> launch.Launch:
        d = launch.choose(k, n0)
        d = dataclasses.replace(d, wide=wide or d.wide)
        rows = ("thread-row", "warp-row", "block-row")
        if d.strategy in rows and strategy in rows:
            lanes = {"thread-row": 1, "warp-row": 32, "block-row": 256}[strategy]
            per_block = {"thread-row": 256, "warp-row": 8, "block-row": 1}[strategy]
            return dataclasses.replace(d, strategy=strategy, block=256, lanes=lanes,
                                       per_block=per_block)
        if d.strategy == "vector" and strategy == "scalar":
            return dataclasses.replace(d, strategy="elementwise", vector=1)
        return d
    return pick


VARIANTS = {"chosen": launch.choose, "thread-wide": _forced("thread-row", True),
            "warp": _forced("warp-row", False), "block": _forced("block-row", False),
            "scalar-wide": _forced("scalar", True)}


@pytest.fixture(scope="module")
def prepared() -> list[Case]:
    for c in CASE_LIST:
        if c.program is None:
            c.program = lower_graph(c.graph, FLAGS, cpu)
            c.expected = [np.asarray(e) for e in run_onnxruntime(c.graph, c.feeds)]
    return CASE_LIST


_BUILT: dict[str, list] = {}


def _executables(variant: str, cases: list[Case]) -> list:
    if variant not in _BUILT:
        _BUILT[variant] = hostsim.compile_many([c.program for c in cases], VARIANTS[variant])
    return _BUILT[variant]


def assert_matches(case: Case, got: list, variant: str = "") -> None:
    assert len(got) == len(case.expected)
    for k, (o, e) in enumerate(zip(got, case.expected)):
        where = f"{case.id} [{variant}] output {k}"
        assert o.dtype == e.dtype, f"{where}: dtype {o.dtype} vs {e.dtype}"
        assert o.shape == e.shape, f"{where}: shape {o.shape} vs {e.shape}"
        if e.dtype.kind == "f":
            np.testing.assert_allclose(o.astype(np.float64), e.astype(np.float64),
                                       rtol=case.rtol, atol=case.rtol / 10, equal_nan=True,
                                       err_msg=where)
        else:
            np.testing.assert_array_equal(o, e, err_msg=where)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("index", range(len(CASE_LIST)), ids=[c.id for c in CASE_LIST])
def test_c_rendering_matches_onnxruntime(prepared, variant, index):
    case = prepared[index]
    exe = _executables(variant, prepared)[index]
    assert_matches(case, exe.run(case.feeds), variant)


def test_every_strategy_is_exercised(prepared):
    """The case table reaches every launch strategy the renderer picks by itself."""
    seen = set()
    for c in prepared:
        rendered = source.render_program(c.program, "c")
        seen |= {e.launch.strategy for e in rendered.kernels.values()}
    assert seen == {"elementwise", "vector", "thread-row", "warp-row", "block-row", "scan"}


# ---- launch choices ---------------------------------------------------------------------

def _kernel(op: str, inputs: list, attrs: dict | None = None, consts=()) -> kir.Kernel:
    g = one_node_graph(op, inputs, attrs or {}, const_inputs=consts)
    return next(t for t in lower_graph(g, FLAGS, cpu).thunks if isinstance(t, kir.Kernel))


@pytest.mark.parametrize("op,shape,attrs,strategy", [
    ("Softmax", (64, 128), {"axis": -1}, "warp-row"),
    ("Softmax", (8, 4096), {"axis": -1}, "block-row"),
    ("Softmax", (4, 768), {"axis": -1}, "block-row"),     # few rows: a block each
    ("Softmax", (4096, 768), {"axis": -1}, "warp-row"),
    ("Softmax", (20000, 3), {"axis": -1}, "thread-row"),   # rows of 3
    ("Softmax", (64, 20000), {"axis": 0}, "thread-row"),   # strided rows, contiguous across
    ("Tanh", (1003,), {}, "vector"),
    ("Tanh", (7, 9), {}, "vector"),                        # collapsed to 1-D, with a tail
])
def test_launch_choice(op, shape, attrs, strategy):
    k = _kernel(op, [rand(shape)], attrs)
    assert launch.choose(k, k.shape[0]).strategy == strategy


def test_odd_rows_run_scalar():
    k = _kernel("Expand", [rand((3, 1)), np.array([3, 5])], consts=(1,))  # rows of 5
    assert launch.choose(k, 3).strategy == "elementwise"


def test_grid_sizes():
    """Enough blocks for the work, capped at BLOCKS_PER_SM per multiprocessor (then every
    loop strides): elements / 256, vectors / 256, rows / 8 warps, a block per row."""
    ew = launch.Launch("elementwise", 256, 1, 256)
    assert ew.grid(1000, 132) == 4 and ew.grid(1 << 26, 132) == 32 * 132
    vec = launch.Launch("vector", 256, 1, 256, vector=4)
    assert vec.items(1003) == 251 and vec.grid(1003, 132) == 1
    warp = launch.Launch("warp-row", 256, 12, 8, lanes=32)
    assert warp.grid(10, 132) == 15  # 120 rows, 8 per block
    block = launch.Launch("block-row", 512, 1, 1, lanes=512)
    assert block.grid(7, 132) == 7 and block.grid(0, 132) == 1


def test_index_width():
    k = _kernel("Tanh", [rand((4, 8))])
    assert not launch.needs_wide(k, 4)
    assert not launch.needs_wide(k, (1 << 31) - 1)    # collapsed to 1-D: i0 < 2^31
    assert launch.needs_wide(k, 1 << 31)
    t = _kernel("Transpose", [rand((4, 8))], {"perm": [1, 0]})
    assert not launch.needs_wide(t, 4)
    assert not launch.needs_wide(t, 1 << 28)
    assert launch.needs_wide(t, 1 << 29)              # the offset 4*i0 + i1 reaches 2^31
    sl = _kernel("Slice", [rand((6, 8)), np.array([1]), np.array([5]), np.array([0])],
                 consts=(1, 2, 3))
    assert not launch.needs_wide(sl, 4)


def test_vector_width_by_dtype():
    assert launch.vector_width(_kernel("Neg", [rand((64,), F16)])) == 8
    assert launch.vector_width(_kernel("Neg", [rand((64,), "float64")])) == 2
    assert launch.vector_width(_kernel("Mul", [rand((5, 6)), rand((6,))])) == 2  # rows of 6
    assert launch.vector_width(_kernel("Transpose", [rand((8, 8))], {"perm": [1, 0]})) == 4


def test_misaligned_inputs_take_the_scalar_path(prepared):
    """The vector path checks alignment at run time: a view one element into a buffer
    (4-byte aligned, not 16) runs the scalar loop and gives the same answer."""
    idx = next(i for i, c in enumerate(prepared) if c.id == "Add-tail-1d")
    case, exe = prepared[idx], _executables("chosen", prepared)[idx]
    assert exe.rendered.kernels["k0"].launch.strategy == "vector"
    views = []
    for x in case.feeds:
        buf = np.empty(x.size + 1, x.dtype)[1:]
        buf[...] = x
        views.append(buf)
    assert views[0].ctypes.data % 16
    assert_matches(case, exe.run(views), "misaligned")


@pytest.mark.parametrize("op,attrs", [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
def test_int_min_by_minus_one(op, attrs):
    """The one integer division that overflows: it must not trap, and gives what the CPU
    backend gives (INT_MIN wraps, the remainder is 0); onnxruntime itself dies of SIGFPE."""
    for dtype in ("int32", "int64"):
        low = np.iinfo(dtype).min
        a, b = np.array([low, low, 7], dtype), np.array([-1, 1, -1], dtype)
        program = lower_graph(one_node_graph(op, [a, b], attrs), FLAGS, cpu)
        got = hostsim.compile(program, FLAGS).run([a, b])[0]
        np.testing.assert_array_equal(got, cpu.compile(program, FLAGS).run([a, b])[0])
        np.testing.assert_array_equal(got, [low, low, -7] if op == "Div" else [0, 0, 0])


def test_checks_raise_the_same_message_as_the_cpu():
    x = rand((5, 4))
    idx = np.array([[0, 7]], np.int64)
    g = one_node_graph("Gather", [x, idx], {"axis": 0})
    program = lower_graph(g, FLAGS, cpu)
    gpu_exe = hostsim.compile(program, FLAGS)
    with pytest.raises(InvalidInputError) as got:
        gpu_exe.run([x, idx])
    with pytest.raises(InvalidInputError) as want:
        cpu.compile(program, FLAGS).run([x, idx])
    assert str(got.value) == str(want.value)
    a, b = np.array([4, 5], np.int64), np.array([2, 0], np.int64)
    div = hostsim.compile(lower_graph(one_node_graph("Div", [a, b]), FLAGS, cpu), FLAGS)
    with pytest.raises(InvalidInputError, match="zero"):
        div.run([a, b])


# ---- CUDA: nvcc ------------------------------------------------------------------------

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def nvcc_ptx(paths: list[str], out_dir: str) -> None:
    """One nvcc --ptx call (sm_90, the backend's NVRTC options) over several .cu files."""
    from autoclust.tools.aot import NVCC_OPTIONS
    cmd = [NVCC, "--ptx", "-arch=sm_90", *NVCC_OPTIONS, *paths, "--output-directory", out_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]


def module_ptx(parts: list, tmp_path, name: str) -> str:
    """The PTX of rendered programs `parts` as one module (one nvcc call); every kernel
    must be an entry of it."""
    path = tmp_path / f"{name}.cu"
    path.write_text(source.module_source(parts))
    nvcc_ptx([str(path)], str(tmp_path))
    ptx = (tmp_path / f"{name}.ptx").read_text()
    symbols = {e.symbol for r in parts for e in r.kernels.values()}
    assert all(f".entry {s}(" in ptx for s in symbols)
    return ptx


@needs_nvcc
def test_cuda_of_every_lowered_op_compiles(prepared, tmp_path):
    parts = [source.render_program(c.program, "cuda", VARIANTS[v]) for c in prepared
             for v in ("chosen", "block", "thread-wide")]
    ptx = module_ptx(parts, tmp_path, "ops")
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx       # warp and block reductions
    assert "ld.global.nc.v4.f32" in ptx and "st.global.v4.f32" in ptx   # 128-bit vectors
    assert "cvt.rn.f16.f32" in ptx                              # float16 rounding


def test_rendering_imports_no_cupy():
    code = ("import sys\n"
            "from autoclust.backends import gpu\n"
            "from autoclust.tools import aot\n"
            "assert 'cupy' not in sys.modules, 'cupy imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(__file__)), check=False)
    assert proc.returncode == 0, proc.stderr
