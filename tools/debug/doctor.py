"""`autoclust doctor [--device gpu] [--json]`: what a user runs when something is off.

Versions (autoclust, Python, NumPy, onnx, onnxruntime, llvmlite and its LLVM, torch; with
the GPU: CuPy, the CUDA runtime and driver, NVRTC, cuda-pathfinder, the libcublas and
libcublasLt it loads), the host CPU and the features LLVM targets, the GPU's name, compute
capability, multiprocessors and memory, nvcc (for `autoclust compile`), and on each device
a tiny compile-and-run: the zoo's mlp_gelu (MatMul, bias, GELU, a Softmax row) under
--must_compile, compared with onnxruntime; on the GPU also whether its third run replays
as a CUDA graph. Every problem is one line at the end, and the exit status is 1 when there
is one (as `cupy.show_config()` and `python -m torch.utils.collect_env` report, plus the
checks):

    $ autoclust doctor --device gpu
    autoclust 0.1.0 (/site-packages/autoclust)
    ...
    gpu: CuPy 14.2.0, CUDA runtime 13.0, driver 13.1, NVRTC 13.0
    ...
    problems (1):
      gpu: cuda-pathfinder did not find libcublas (...): GEMMs run through CuPy's wrapper
      and plans with them are not captured as CUDA graphs

Without --device every available device is checked; a missing CuPy or GPU is then a note,
not a problem. With --device gpu it is a problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

import numpy as np


@dataclasses.dataclass
class Report:
    """Lines of facts by section, and the problems found (one line each)."""

    lines: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def add(self, section: str, key: str, value: str) -> None:
        self.lines.append((section, key, value))

    def problem(self, section: str, text: str) -> None:
        self.problems.append(f"{section}: {text}")

    def text(self) -> str:
        out, last = [], None
        for section, key, value in self.lines:
            if section != last:
                out.append(f"{section}:")
                last = section
            out.append(f"  {key:<18} {value}")
        if self.problems:
            out.append(f"problems ({len(self.problems)}):")
            out += [f"  {p}" for p in self.problems]
        else:
            out.append("no problems found")
        return "\n".join(out)

    def as_json(self) -> dict[str, Any]:
        facts: dict[str, dict[str, str]] = {}
        for section, key, value in self.lines:
            facts.setdefault(section, {})[key] = value
        return {"facts": facts, "problems": self.problems}


def _version(module: str) -> tuple[str, Any]:
    """(version text, module) or ('not installed (why)', None)."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install is a finding, not a crash
        return f"not installed ({type(exc).__name__}: {exc})", None
    return str(getattr(mod, "__version__", "?")), mod


def _dist_version(dist: str) -> str:
    """An installed distribution's version, without importing it (importing torch would
    map its CUDA libraries and hide a libcublas that only loads after torch)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def host(report: Report) -> None:
    """Versions of the host side and the CPU LLVM targets."""
    import autoclust
    s = "host"
    report.add(s, "autoclust", f"{autoclust.__version__} ({os.path.dirname(autoclust.__file__)})")
    report.add(s, "python", f"{platform.python_version()} ({sys.executable})")
    report.add(s, "platform", platform.platform())
    for name in ("numpy", "onnx", "onnxruntime", "ml_dtypes", "llvmlite"):
        text, mod = _version(name)
        if name == "onnxruntime" and mod is not None:
            text += f" (providers: {', '.join(mod.get_available_providers())})"
        report.add(s, name, text)
        if mod is None:
            report.problem(s, f"{name} cannot be imported: {text}")
    report.add(s, "torch", _dist_version("torch") + " (not imported)")
    try:
        from llvmlite import binding as llvm
        features = [f for f in llvm.get_host_cpu_features().flatten().split(",")
                    if f.startswith("+")]
        report.add(s, "LLVM", ".".join(map(str, llvm.llvm_version_info)))
        report.add(s, "CPU", f"{llvm.get_host_cpu_name()} ({os.cpu_count()} logical cores)")
        wanted = [f for f in ("+avx2", "+fma", "+avx512f", "+avx512bw", "+neon", "+sve")
                  if f in features]
        report.add(s, "CPU features", f"{len(features)} enabled, incl. {' '.join(wanted) or '-'}")
    except Exception as exc:  # noqa: BLE001
        report.problem(s, f"llvmlite cannot describe the host CPU ({exc})")


def smoke(device: str, **flags: Any) -> dict[str, Any]:
    """Compile and run the zoo's mlp_gelu on `device` under --must_compile, three times;
    the largest difference from onnxruntime, the kernel count and the first run's time."""
    from autoclust.backends.ort import ORIGINAL_SESSION
    from autoclust.models import zoo

    import autoclust
    model = zoo.build("mlp_gelu")
    feeds = zoo.feeds(model)
    want = ORIGINAL_SESSION(model.SerializeToString(),
                            providers=["CPUExecutionProvider"]).run(None, feeds)
    t0 = time.perf_counter()
    sess = autoclust.InferenceSession(model, device=device, must_compile=True, **flags)
    got = sess.run(None, feeds)
    first_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(2):
        got = sess.run(None, feeds)
    err = max(float(np.max(np.abs(np.asarray(g, np.float64) - w))) for g, w in zip(got, want))
    kernels = sum(sum(c["kernels"]) for c in sess.stats()["clusters"])
    out = {"max_abs_err": err, "kernels": kernels, "first_run_ms": first_ms}
    graphs = getattr(getattr(sess._runtime, "device", None), "graphs", None)
    if graphs is not None:
        out["graph_replays"] = graphs.replays
        out["graph_reason"] = graphs.reason
    return out


def _run_smoke(report: Report, section: str, device: str) -> None:
    try:
        r = smoke(device)
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not crash
        report.add(section, "compile-and-run", "FAILED")
        report.problem(section, f"mlp_gelu failed to compile or run on device {device!r}: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return
    text = (f"mlp_gelu: {r['kernels']} kernels/calls, first run {r['first_run_ms']:.0f} ms, "
            f"max |diff| vs onnxruntime {r['max_abs_err']:.2g}")
    report.add(section, "compile-and-run", text)
    if not r["max_abs_err"] <= 1e-3:
        report.problem(section, f"mlp_gelu differs from onnxruntime by {r['max_abs_err']:.3g}")
    if "graph_replays" in r:
        replayed = f"{r['graph_replays']} replay(s)" if r["graph_replays"] else \
            f"not captured ({r['graph_reason']})"
        report.add(section, "CUDA graphs", replayed)
        if not r["graph_replays"]:
            report.problem(section, f"CUDA graph not captured: {r['graph_reason']}")


def gpu(report: Report, asked: bool) -> None:
    """CuPy, CUDA, NVRTC, cuBLAS, the GPU, nvcc and a compile-and-run on the GPU."""
    from autoclust.backends.gpu import blas, device
    s = "gpu"
    _nvcc(report, s)
    reason = device.available()
    if reason:
        report.add(s, "device", f"not available: {reason}")
        if asked:
            report.problem(s, reason)
        return
    cp = device.cupy()
    info = device.info()
    runtime = cp.cuda.runtime
    report.add(s, "CuPy", f"{cp.__version__} ({os.path.dirname(cp.__file__)})")
    report.add(s, "CUDA runtime", _cuda_version(runtime.runtimeGetVersion()))
    try:
        report.add(s, "CUDA driver", _cuda_version(runtime.driverGetVersion()))
    except Exception as exc:  # noqa: BLE001
        report.problem(s, f"the CUDA driver version cannot be read ({exc})")
    report.add(s, "NVRTC", ".".join(map(str, info.nvrtc)))
    props = runtime.getDeviceProperties(cp.cuda.Device().id)
    mem = props.get("totalGlobalMem", 0) / 2**30
    report.add(s, "GPU", f"{info.name}, compute capability {info.arch[:-1]}.{info.arch[-1]}, "
               f"{info.sm_count} SMs, {mem:.0f} GiB")
    report.add(s, "cuda-pathfinder", _dist_version("cuda-pathfinder"))
    lib = blas.get()
    if lib is None:
        report.add(s, "cuBLAS", f"not loaded: {blas.reason()}")
        report.problem(s, f"{blas.reason()}: GEMMs run through CuPy's wrapper and plans with "
                       "them are not captured as CUDA graphs")
    else:
        report.add(s, "cuBLAS", f"{lib.path} (version {_blas_version(lib)})")
    lt, why = blas.locate("cublasLt")
    report.add(s, "cuBLASLt", lt or f"not found ({why})")
    _run_smoke(report, s, "gpu")


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10} ({v})"


def _blas_version(lib: Any) -> str:
    try:
        v = lib.version()
    except Exception as exc:  # noqa: BLE001
        return f"unknown: {exc}"
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def _nvcc(report: Report, section: str) -> None:
    path = shutil.which("nvcc")
    if path is None:
        report.add(section, "nvcc", "not on PATH (`autoclust compile` writes .cu without .ptx)")
        return
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
        release = next((line.split("release", 1)[1].split(",")[0].strip()
                        for line in out.splitlines() if "release" in line), "?")
    except (OSError, subprocess.SubprocessError) as exc:
        release = f"? ({exc})"
    report.add(section, "nvcc", f"{path} (release {release})")


def diagnose(devices: list[str]) -> Report:
    """The report for `devices` ([] = every available one)."""
    report = Report()
    host(report)
    if not devices or "cpu" in devices:
        _run_smoke(report, "cpu", "cpu")
    if not devices or "gpu" in devices:
        gpu(report, asked="gpu" in devices)
    return report


def add_parser(sub: Any) -> None:
    """Register `autoclust doctor` on the CLI's subparsers."""
    p = sub.add_parser("doctor", help="versions, devices and a compile-and-run on each: "
                       "what to attach to a bug report",
                       description="Print versions (autoclust, onnxruntime, llvmlite/LLVM, "
                       "CuPy, CUDA, NVRTC, cuBLAS), the CPU features LLVM targets, the GPU, "
                       "and compile and run a tiny model on each device; one line per "
                       "problem; exit 1 when there is one.")
    p.add_argument("--device", action="append", default=[], choices=["cpu", "gpu"],
                   help="check only this device (repeatable; default: every available one, "
                        "and a missing GPU is then no problem)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    """`autoclust doctor`: print the report; 1 when it found a problem."""
    report = diagnose(list(args.device))
    print(json.dumps(report.as_json(), indent=2) if args.json else report.text())
    return 1 if report.problems else 0
