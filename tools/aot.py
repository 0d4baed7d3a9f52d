"""`autoclust compile MODEL --device gpu --dim seq=128 --dump_to DIR`: ahead-of-time code.

Clusters the model as a session would, gives every cluster concrete input shapes (the
model's symbolic dims from --dim, else the zoo metadata or generic defaults), runs the
whole pipeline (specialize, optimize, fuse, collapse, share, plan memory) and writes what
the backend renders, without compiling or running anything on a device:

    --device gpu   cluster_NNNN.cu and .kernels.txt (launch choices), and cluster_NNNN.ptx
                   from one `nvcc --ptx -arch=sm_90` call when nvcc is on PATH (--arch)
    --device cpu   cluster_NNNN.ll (LLVM IR of the loop kernels) and .kernels.txt

plus .before_optimizations.txt / .after_optimizations.txt, and summary.txt. Neither CuPy
nor a GPU is needed. Clusters whose shapes are not known ahead of time (data-dependent
dims, shape-deciding inputs) are listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
from typing import Any

import numpy as np

from autoclust.errors import CompileError, FlagError

NVCC_OPTIONS = ("--std=c++17", "--ftz=false", "--prec-div=true", "--prec-sqrt=true",
                "--fmad=true")


@dataclasses.dataclass
class Result:
    cluster: str
    files: list[str]
    kernels: int = 0
    skipped: str = ""


def parse_dims(items: list[str]) -> dict[str, int]:
    """NAME=VALUE pairs -> {name: int}; FlagError on a malformed one."""
    dims = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value.strip().lstrip("-").isdigit() or int(value) < 0:
            raise FlagError(f"--dim takes NAME=VALUE with VALUE >= 0, got {item!r}")
        dims[name.strip()] = int(value)
    return dims


def propagate(graph: Any, dims: dict[str, int]) -> tuple[Any, dict[str, np.ndarray]]:
    """A copy of `graph` with concrete shapes wherever they follow from the input shapes
    (symbolic dims from `dims`), and the small values known ahead of time (shape chains).
    Values that depend on data (NonZero's output, ...) keep shape None."""
    from autoclust import ops
    from autoclust.errors import AutoclustError
    from autoclust.passes import copy_graph
    from autoclust.passes.fold_constants import SMALL_ELEMENTS, evaluate
    g = copy_graph(graph)
    for v in g.inputs:
        if v.shape is not None:
            shape = tuple(d if isinstance(d, int) else dims.get(d) for d in v.shape)
            v.shape = shape if all(isinstance(d, int) for d in shape) else None
    known: dict[str, np.ndarray] = {}
    for node in g.nodes:
        loose = [v for v in node.all_inputs() if v.shape is None or not v.is_static()]
        types = None
        if not loose:
            try:
                outs = evaluate(g, node, known, max_elements=SMALL_ELEMENTS)
                types = ops.infer_node(node, g, known)
            except AutoclustError:
                types = None
        for i, v in enumerate(node.outputs):
            if types is None or i >= len(types):
                v.shape = None
                continue
            dtype, shape = types[i]
            if outs is not None:
                known[v.name] = outs[i]
                dtype, shape = outs[i].dtype, outs[i].shape
            ok = shape is not None and all(isinstance(d, int) for d in shape)
            v.dtype, v.shape = (np.dtype(dtype) if dtype is not None else v.dtype,
                                tuple(shape) if ok else None)
    return g, known


def input_types(sub: Any, typed: Any, known: dict[str, np.ndarray], missing: list[str]
                ) -> tuple[list, dict[str, np.ndarray], str]:
    """(concrete (dtype, shape) per input of a cluster graph, its shape-deciding input
    values, '' or why they are unknown ahead of time)."""
    types = []
    for v in sub.inputs:
        t = typed.values.get(v.name)
        if t is None or t.shape is None or t.dtype is None:
            hint = f" (pass --dim for {', '.join(missing)})" if missing else ""
            return [], {}, (f"input {v.name!r} has a shape that is unknown ahead of time"
                            f"{hint}")
        types.append((np.dtype(t.dtype), tuple(t.shape)))
    return types, {}, ""


def cluster_files(sub: Any, types: list, values: dict[str, np.ndarray], flags: Any,
                  backend: Any, device: str) -> tuple[dict[str, str], int]:
    """({suffix: text}, kernel count) for one cluster graph with concrete input types."""
    from autoclust.compile import lower_graph
    from autoclust.kernel import ir as kir
    from autoclust.passes.optimize import optimize
    from autoclust.passes.specialize import specialize
    specialized = specialize(sub, types, values)
    optimized = optimize(specialized, flags)
    program = lower_graph(optimized, flags, backend)
    if device == "cpu":
        from autoclust.backends.cpu import codegen

        from autoclust.kernel.passes import distinct_kernels
        files = {".ll": str(codegen.build_module(distinct_kernels(program), flags.fast_math)),
                 ".kernels.txt": kir.format_program(program)}
    elif hasattr(backend, "render"):
        files = dict(backend.render(program, flags))
    else:
        raise CompileError(f"device {device!r} cannot render code ahead of time")
    files[".before_optimizations.txt"] = str(specialized)
    files[".after_optimizations.txt"] = str(optimized)
    # a GEMM's epilogue kernel counts as a run of its own, as it does at run time unless
    # oneDNN measures it faster inside the call (backends/cpu/library.py)
    count = sum(1 + (getattr(t, "epilogue", None) is not None) for t in program.thunks
                if not isinstance(t, kir.Check))
    return files, count


def run_nvcc(paths: list[str], out_dir: str, arch: str) -> str:
    """One nvcc call writing a .ptx beside each .cu; '' or the reason it did not run."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "nvcc not found on PATH: no .ptx written"
    if not paths:
        return ""
    cmd = [nvcc, "--ptx", f"-arch={arch}", *NVCC_OPTIONS, *paths, "--output-directory",
           out_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CompileError(f"nvcc failed:\n{proc.stderr[-4000:]}")
    return ""


def compile_model(model: Any, device: str, dims: dict[str, int], out_dir: str,
                  flags: Any, arch: str = "sm_90", ptx: bool = True
                  ) -> tuple[list[Result], str]:
    """Render every cluster of `model` into out_dir; (per-cluster results, nvcc note).
    ptx=False skips nvcc (tests batch several models into one nvcc call)."""
    from autoclust.importers.onnx import import_model

    from autoclust import registry
    from autoclust.clustering.partition import cluster
    backend = registry.get_backend(device)
    graph = import_model(model)
    plan = cluster(graph, flags, backend.why_not)
    os.makedirs(out_dir, exist_ok=True)
    results, cu_paths = [], []
    typed, known = propagate(graph, dims)
    missing = sorted({str(d) for v in graph.inputs for d in (v.shape or ())
                      if not isinstance(d, int) and d not in dims})
    for c in plan.clusters:
        sub = graph.extract(c.nodes, name=c.name)
        types, _, why = input_types(sub, typed, known, missing)
        values = {v.name: known[v.name] for v in c.shape_value_inputs if v.name in known}
        if not why and len(values) < len(c.shape_value_inputs):
            why = "its shape-deciding inputs are only known at run time"
        if why:
            results.append(Result(c.name, [], skipped=why))
            continue
        files, count = cluster_files(sub, types, values, flags, backend, device)
        written = []
        for suffix, text in files.items():
            path = os.path.join(out_dir, f"{c.name}{suffix}")
            with open(path, "w") as f:
                f.write(text)
            written.append(os.path.basename(path))
            if suffix == ".cu":
                cu_paths.append(path)
        results.append(Result(c.name, written, count))
    gpu = device == "gpu" and ptx
    note = run_nvcc(cu_paths, out_dir, arch) if gpu else ""
    if gpu and not note:
        for r in results:
            if any(f.endswith(".cu") for f in r.files):
                r.files.append(f"{r.cluster}.ptx")
    return results, note


def summary(results: list[Result], dims: dict[str, int], note: str) -> str:
    lines = ["dims: " + (", ".join(f"{k}={v}" for k, v in sorted(dims.items())) or "-")]
    for r in results:
        if r.skipped:
            lines.append(f"{r.cluster}: skipped: {r.skipped}")
        else:
            lines.append(f"{r.cluster}: {r.kernels} kernels/calls -> {', '.join(r.files)}")
    if note:
        lines.append(note)
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    """autoclust compile MODEL --device D [--dim N=V ...] --dump_to DIR [--arch sm_90]"""
    from autoclust.models import zoo
    from autoclust.tools.run import load_model

    from autoclust import flags as flags_mod
    model = load_model(args.model)
    overrides = flags_mod.parse_string(args.flags or "")
    overrides["device"] = args.device
    flags = flags_mod.parse(**overrides)
    dims = zoo.default_dims(model)
    dims.update(parse_dims(args.dim))
    results, note = compile_model(model, args.device, dims, args.dump_to, flags, args.arch)
    text = summary(results, dims, note)
    with open(os.path.join(args.dump_to, "summary.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0


def add_parser(sub: Any) -> None:
    """Register `autoclust compile` on the CLI's subparsers."""
    from autoclust import registry
    p = sub.add_parser("compile", help="render every cluster's kernels ahead of time "
                       "(.cu/.ptx for gpu, .ll for cpu) without a device",
                       description="Cluster MODEL at the given sizes and write each "
                       "cluster's kernels (.cu and, where nvcc exists, .ptx for gpu; .ll for "
                       "cpu) without running anything.")
    p.add_argument("model", help="the .onnx model file")
    p.add_argument("--device", default="gpu", choices=registry.device_names(),
                   help="backend whose kernels to render (default gpu)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="size of the model's symbolic dim NAME (repeatable), e.g. --dim seq=128")
    p.add_argument("--dump_to", "--dump-to", required=True, metavar="DIR",
                   help="folder the kernel files are written to")
    p.add_argument("--arch", default="sm_90", help="nvcc -arch for the .ptx (default sm_90)")
    p.add_argument("--flags", default=None, help="AUTOCLUST_FLAGS for clustering and fusion")
    p.set_defaults(fn=main)
