"""The GPU renderer without a GPU: its C rendering run on the host against onnxruntime, and
its CUDA rendering compiled by nvcc (--ptx, sm_90).

Every lowered op (tests/core/test_lowering.py CASES) plus edge cases (0-d, size-1, empty,
NaN/inf, float16, integer corners, long rows, vector tails) is lowered, rendered as C by
backends/gpu (the same expression table, index maps, reduction combines and NaN rules as
the CUDA code; host loops stand in for the launch), compiled with gcc and compared with
onnxruntime -- under the launch the renderer picks and under forced strategies (one
thread / warp / block per row, 64-bit indices, scalar instead of vector), so every code
path of each kernel runs. One gcc call per strategy, one nvcc call per batch.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from autoclust.backends import cpu
from autoclust.backends.gpu import launch, source
from support import hostsim, paths
from support.compiled import one_node_graph, rand, run_onnxruntime
from support.gpu_render import (
    CASE_LIST,
    F16,
    VARIANTS,
    Case,
    assert_matches,
    module_ptx,
    needs_cc,
    needs_nvcc,
    ptxas_report,
)

from autoclust import flags as flags_mod
from autoclust.compile import lower_graph
from autoclust.errors import InvalidInputError
from autoclust.kernel import ir as kir

FLAGS = flags_mod.parse("")
pytestmark = needs_cc
















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
                          cwd=paths.REPO, check=False)
    assert proc.returncode == 0, proc.stderr


# ---- row kernels keep what several phases read in registers -----------------------------

STASH_CASES = [  # (op, shape, attrs, strategy, elements per lane)
    ("LayerNormalization", (64, 1000), {"axis": -1}, "block-row", 4),
    ("LayerNormalization", (4096, 1024), {"axis": -1}, "warp-row", 32),
    ("Softmax", (4096, 512), {"axis": -1}, "warp-row", 16),
]


def _row_kernel(op, shape):
    inputs = [rand(shape)] + ([rand(shape[-1:]), rand(shape[-1:])]
                              if op == "LayerNormalization" else [])
    return _kernel(op, inputs, {"axis": -1})


@pytest.mark.parametrize("op,shape,attrs,strategy,per_lane", STASH_CASES)
def test_row_kernels_read_the_row_once(op, shape, attrs, strategy, per_lane, monkeypatch):
    """x is read by every phase and the store: with the stash the CUDA kernel has one
    global read of x (the prologue), the phases read registers indexed by the unrolled
    loop's constant t; without it, one read per phase. (The C rendering of the same stash
    runs under every strategy in test_c_rendering_matches_onnxruntime.)"""
    from autoclust.backends.gpu import kernels
    k = _row_kernel(op, shape)
    chosen = launch.choose(k, shape[0])
    assert chosen.strategy == strategy
    text = kernels.render_kernel(k, chosen, "cuda", "k")[0]
    assert text.count("b0[") == 1, text
    assert f"float st0[{per_lane}];" in text and text.count("st0[t]") >= 3
    assert "#pragma unroll" in text
    monkeypatch.setattr(kernels, "STASH_LIMIT", 0)
    plain = kernels.render_kernel(k, chosen, "cuda", "k")[0]
    assert "st0" not in plain and plain.count("b0[") >= 3


@needs_nvcc
def test_stashed_row_kernels_compile_without_spills(tmp_path):
    from autoclust.backends.gpu import kernels, prelude
    texts = []
    for n, (op, shape, _, _, _) in enumerate(STASH_CASES):
        k = _row_kernel(op, shape)
        texts.append(kernels.render_kernel(k, launch.choose(k, shape[0]), "cuda", f"k{n}")[0])
    info = ptxas_report(prelude.prelude("cuda") + "".join(texts), tmp_path, "rows")
    assert info.count("0 bytes spill stores, 0 bytes spill loads") == len(texts), info
    # the stash is in registers, not local memory
    assert info.count("0 bytes stack frame") == len(texts), info
