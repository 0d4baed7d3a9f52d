"""The GPU rendering's test cases and checks: every lowered op (lowering_cases.CASES) plus
edge cases, the launch variants, nvcc helpers (test_gpu_render, test_gpu*, test_aot)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from autoclust.backends.gpu import launch, source

from autoclust.kernel import ir as kir
from support import hostsim
from support.compiled import one_node_graph, rand, with_specials
from support.lowering_cases import CASES

# the C rendering is compiled by the host C compiler (gcc)
needs_cc = pytest.mark.skipif(shutil.which(hostsim.CC) is None,
                              reason=f"no C compiler ({hostsim.CC}) on PATH")
F16, I64 = "float16", "int64"


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


NVCC = shutil.which("nvcc")


needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def nvcc_ptx(paths: list[str], out_dir: str) -> None:
    """One nvcc --ptx call (sm_90, the backend's NVRTC options) over several .cu files."""
    from autoclust.tools.aot import NVCC_OPTIONS
    cmd = [NVCC, "--ptx", "-arch=sm_90", *NVCC_OPTIONS, *paths, "--output-directory", out_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]


def ptxas_report(text: str, tmp_path, name: str) -> str:
    """ptxas's -v report (registers, spills, stack frame, shared memory per kernel) of
    CUDA source `text` compiled to an sm_90 cubin with the backend's NVRTC options."""
    from autoclust.tools.aot import NVCC_OPTIONS
    path = tmp_path / f"{name}.cu"
    path.write_text(text)
    proc = subprocess.run([NVCC, "-cubin", "-arch=sm_90", *NVCC_OPTIONS, "-Xptxas", "-v",
                           str(path), "-o", str(tmp_path / f"{name}.cubin")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


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
