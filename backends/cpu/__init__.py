"""The CPU backend: kernel IR -> LLVM (llvmlite) -> an Executable.

    exe = backends.cpu.compile(graph, flags)   # graph with concrete shapes
    outs = exe.run([x, y])

Pipeline: fusion.fuse (graph -> kernel IR program) -> kernel_ir.collapse (merge loop
dims) -> codegen.build_module (one LLVM module per cluster) -> jit (optimize, object
code, persistent cache) -> Executable.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from autoclust.backends.cpu import codegen, jit
from autoclust.backends.cpu.executable import Executable

from autoclust import fusion, ops
from autoclust import kernel_ir as kir
from autoclust.flags import Flags
from autoclust.fusion_rows import SUPPORTED_DTYPES, why_not_lower
from autoclust.ir import Graph, Node

try:
    from autoclust.backends.cpu import library
except ImportError:  # written by another engineer; library ops are refused meanwhile
    library = None

NAME = "cpu"
# Kernels with fewer loop iterations than this run on one thread. Measured on the shared
# 2-core machine (load average ~5): a 16-op chain on 256K floats took 1.3 ms on one thread
# but up to 16 ms on two, because a GOMP region waits until the OS schedules its second
# thread; from 1M floats two threads won (14.6 -> 9.0 ms). On a quiet machine the region
# costs ~20-40 us and the break-even is lower.
PARALLEL_MIN_WORK = 1 << 20
REFERENCE_KINDS = (ops.LAYOUT, ops.SHAPE, ops.REDUCTION, ops.NORMALIZATION,
                   ops.ELEMENTWISE)
COMPILE_COUNT = 0  # LLVM compiles in this process (a warm --cache_dir keeps it 0)

__all__ = ["COMPILE_COUNT", "NAME", "Executable", "compile", "why_not"]


def why_not(node: Node, graph: Graph) -> str | None:
    """None when this backend can run `node`, else the reason it cannot."""
    reason = why_not_lower(node, graph)
    if reason is None:
        return None
    d = ops.get(node.op, node.domain)
    if d is None:
        return f"op {node.qualified_op} is not in the op table"
    for v in node.inputs + node.outputs:
        if v is not None and (v.dtype is None or v.dtype.name not in SUPPORTED_DTYPES):
            return f"{node.op} ({node.name}): dtype {v.dtype} of {v.name} is not supported"
    if d.kind == ops.LIBRARY:
        if library is None:
            return f"{node.op}: library calls need backends/cpu/library.py (not present)"
        types = [None if v is None else (v.dtype, v.shape) for v in node.inputs]
        return library.supported(node.op, node.attrs, types)
    if d.kind in REFERENCE_KINDS and not d.data_dependent:
        return None  # runs as a reference thunk
    return reason


def _threads(flags: Flags) -> int:
    return flags.threads if flags.threads > 0 else (os.cpu_count() or 1)


def compile(graph: Graph, flags: Flags) -> Executable:
    """Compile a concrete-shape cluster graph into an Executable."""
    global COMPILE_COUNT
    program = fusion.fuse(graph)
    thunks = [kir.collapse(t) if isinstance(t, kir.Kernel) else t for t in program.thunks]
    program = dataclasses.replace(program, thunks=thunks)
    kernels = [t for t in thunks if isinstance(t, kir.Kernel) and all(d > 0 for d in t.shape)]
    threads = _threads(flags)
    parallel = set()
    if threads > 1 and jit.has_openmp():
        parallel = {k.name for k in kernels if k.work >= PARALLEL_MIN_WORK and k.shape[0] > 1}
    dumps = {".kernels.txt": kir.format_program(program)}
    engine, addrs = None, {}
    if kernels:
        module = codegen.build_module(kernels, flags.fast_math, parallel)
        before = jit.COUNTS["compiles"]
        obj, ll, asm = jit.compile_object(str(module), flags.cache_dir, bool(flags.dump_to))
        COMPILE_COUNT += jit.COUNTS["compiles"] - before
        dumps[".ll"] = ll
        dumps[".s"] = asm
        names = [k.name for k in kernels] + [f"{n}.par" for n in parallel]
        engine, addrs = jit.load_object(obj, names)
    consts = {b.id: graph.initializers[b.name] for b in program.buffers if b.role == "const"}
    return Executable(program, addrs, parallel, threads, engine, dumps, consts, library)


def reference_outputs(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `graph` with the op references (what compiled code must match)."""
    from autoclust.interpreter import evaluate
    with np.errstate(all="ignore"):
        return evaluate(graph, inputs)
