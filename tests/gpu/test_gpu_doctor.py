"""`autoclust doctor`: versions, devices and a compile-and-run on each, one line per problem;
checked on this machine as it is (no CuPy: the GPU is a note, or a problem when asked for)
and on the stand-in CuPy (tests/support/fake_cupy.py: a GPU, NVRTC, cuBLAS found through
cuda-pathfinder, or not)."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from autoclust.backends.gpu import device
from autoclust.tools import cli
from autoclust.tools.debug import doctor
from support import fake_cublas, fake_cupy
from support.gpu_render import needs_cc

pytestmark = needs_cc  # the stand-in runs the C rendering through the host C compiler


def _facts(report: doctor.Report) -> dict[str, dict[str, str]]:
    return report.as_json()["facts"]


def test_host_facts_and_the_cpu_compile_and_run():
    report = doctor.diagnose(["cpu"])
    facts = _facts(report)
    assert facts["host"]["LLVM"].count(".") == 2
    assert "CPU features" in facts["host"] and "enabled" in facts["host"]["CPU features"]
    assert "torch" in facts["host"] and "not imported" in facts["host"]["torch"]
    line = facts["cpu"]["compile-and-run"]
    assert line.startswith("mlp_gelu: 5 kernels/calls") and "max |diff|" in line
    assert report.problems == []
    assert "gpu" not in facts


def test_without_cupy_the_gpu_is_a_note_unless_asked_for(capsys):
    reason = device.available()
    if not reason:
        pytest.skip("this machine has CuPy and a GPU")
    report = doctor.diagnose([])
    assert report.as_json()["facts"]["gpu"]["device"] == f"not available: {reason}"
    assert report.problems == []
    assert cli.main(["doctor", "--device", "gpu"]) == 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"problems (1):\n  gpu: {reason}")


@pytest.fixture
def fake(monkeypatch):
    yield from fake_cupy.installed(monkeypatch)


def test_on_the_stand_in_gpu(fake, capsys):
    assert cli.main(["doctor", "--device", "gpu", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    gpu = got["facts"]["gpu"]
    assert gpu["GPU"] == "FakeGPU, compute capability 9.0, 4 SMs, 80 GiB"
    assert gpu["NVRTC"] == "13.0" and gpu["CUDA runtime"] == "13.0 (13000)"
    assert gpu["cuBLAS"] == "/stand-in/libcublas.so.13 (version 13.1.0)"
    assert gpu["cuBLASLt"] == "/stand-in/libcublasLt.so.13"
    assert gpu["compile-and-run"].startswith("mlp_gelu: 5 kernels/calls")
    assert gpu["CUDA graphs"] == "2 replay(s)"  # runs 2 (the capture) and 3
    assert got["problems"] == []


def test_a_missing_libcublas_is_one_problem_line(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", fake_cublas.pathfinder_module(()))
    report = doctor.diagnose(["gpu"])
    assert report.as_json()["facts"]["gpu"]["cuBLAS"].startswith("not loaded: cuda-pathfinder")
    assert len(report.problems) == 2  # the library, and the graph it keeps from capture
    assert report.problems[0].startswith("gpu: cuda-pathfinder did not find libcublas")
    assert report.problems[0].endswith("not captured as CUDA graphs")
    assert report.problems[1].startswith("gpu: CUDA graph not captured: cluster_0000 calls "
                                         "cuBLAS through CuPy's wrapper")


def test_a_failing_compile_is_a_problem_not_a_crash(fake, monkeypatch):
    from autoclust.backends.gpu import nvrtc

    def broken(*args, **kwargs):
        raise RuntimeError("NVRTC is broken today")

    monkeypatch.setattr(nvrtc, "compile_source", broken)
    report = doctor.diagnose(["gpu"])
    assert report.as_json()["facts"]["gpu"]["compile-and-run"] == "FAILED"
    want = ("gpu: mlp_gelu failed to compile or run on device 'gpu': NotCompilableError: "
            "cluster_0000 failed to compile: RuntimeError: NVRTC is broken today")
    assert report.problems == [want]


STANDIN_PYTHON = [sys.executable, os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                               "support", "standin_python.py")]


def test_first_light_end_to_end_on_the_stand_in(fake, tmp_path, monkeypatch):
    """The GPU session's one script (tools/debug/first_light.py main) runs every step on
    the stand-in: in-process steps here, subprocess steps (doctor, cuBLAS without torch,
    pytest -m gpu, both benchmarks) through a python that installs the stand-in, at smoke
    sizes; every check passes, and what comes back fits the device tool's eight files."""
    from autoclust.tools.debug import first_light
    monkeypatch.setattr(first_light, "ATTENTION_SHAPE", (1, 2, 40, 16))
    monkeypatch.setattr(first_light, "PYTHON", STANDIN_PYTHON)
    monkeypatch.setattr(first_light, "PYTEST_ARGS",
                        ["-m", "gpu", "tests/gpu/test_gpu.py", "-k", "denormals"])
    small = ["--small", "--repeat", "2"]
    monkeypatch.setattr(first_light, "BENCH_KERNEL_ARGS", ["--cases", "gelu", *small])
    monkeypatch.setattr(first_light, "BENCH_MODEL_ARGS", ["--cases", "layernorm", *small])
    assert first_light.main(["--out", str(tmp_path), "--budget", "400"]) == 0
    results = json.loads((tmp_path / "first_light.json").read_text())
    assert list(results) == [name for name, _ in first_light.STEPS]
    assert {k: r["ok"] for k, r in results.items()} == dict.fromkeys(results, True), results
    assert results["doctor"]["report"]["problems"] == []
    assert results["cublas_no_torch"]["tail"] == ["/stand-in/libcublas.so.13",
                                                  "torch imported: False"]
    assert results["split_row_bits"]["identical_bits"]
    assert results["gemm"]["rel_err"]["float32_tf32"] > 10 * results["gemm"]["rel_err"]["float32"]
    checks = results["attention"]["checks"]
    assert {r["fused"] for r in checks.values()} == {1}
    assert {"float16-causal-mma", "bfloat16-causal-mma"} <= set(checks), checks
    for timing in results["attention"]["timing"].values():
        assert timing["kernels"] == 1 and timing["autoclust_ms"] > 0
        assert timing["session_ms"] > 0
    assert set(results["zoo"]["models"]) >= {"bert_encoder", "llama_block", "resnet_block"}
    log = (tmp_path / "pytest_gpu.log").read_text()
    assert re.search(r"\b1 passed\b", log) and " failed" not in log, log[-2000:]
    assert [r["case"] for r in results["bench_kernels"]["rows"]] == ["gelu"]
    assert results["bench_models"]["rows"][0]["max_abs_err"] < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bench_kernels.log", "bench_models.log", "first_light.json", "first_light.md",
        "pytest_gpu.log"]
    assert "| denormals | yes |" in (tmp_path / "first_light.md").read_text()


def test_first_light_skips_what_the_budget_cannot_fit(tmp_path):
    """A step that would start with less than its minimum left is skipped, not begun."""
    from autoclust.tools.debug import first_light
    assert first_light.main(["--out", str(tmp_path), "--budget", "30",
                             "--only", "pytest_gpu"]) == 1
    (row,) = json.loads((tmp_path / "first_light.json").read_text()).values()
    assert row["ok"] is False and row["error"] == "skipped: 30 s of the budget left"
