"""Compile one cluster for one signature: the whole pipeline, in order.

    graph (symbolic shapes)
      specialize(input types, shape values)  concrete dtypes and int shapes everywhere
      optimize: up to MAX_ROUNDS of PASSES    fold_constants, simplify, cse, dce
      fuse                                    kernel IR: Kernels, LibraryCalls, Checks, each
                                              op lowered by its own `lower` in the op table
      attach_epilogues                        a GEMM's elementwise consumer rides its call
      collapse_loops                          merge contiguous loop dims
      prove_in_bounds                         every load and store inside its buffer, or a
                                              CompileError (kernel/bounds.py)
      share_code                              one code per distinct kernel (repeated layers)
      plan_memory                             temps share slots
      backend.compile                         an Executable: the ONLY backend-specific step

With --cache_dir, fuse..plan_memory are skipped when the directory holds the Program
lowered from the same optimized graph (`runtime/program_cache.py`): a warm process neither lowers
nor compiles through LLVM (backend object code has its own entries).

A backend whose POLICY does not lower (the interpreter) compiles the optimized graph.
`--disable_passes=simplify,cse` skips passes by name; `--verify_passes` checks the graph
after every pass and names the pass that broke it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from autoclust import symbolic
from autoclust.flags import Flags
from autoclust.ir import Graph
from autoclust.kernel import inject
from autoclust.kernel import ir as kir
from autoclust.kernel.bounds import check_program as prove_in_bounds
from autoclust.kernel.epilogues import attach_epilogues
from autoclust.kernel.fusion import fuse
from autoclust.kernel.memplan import plan_memory
from autoclust.kernel.passes import collapse_loops, share_code
from autoclust.passes.attention import fuse_attention
from autoclust.passes.edits import copy_graph
from autoclust.passes.optimize import optimize
from autoclust.passes.specialize import check_sizes, specialize
from autoclust.registry import policy
from autoclust.report.lazy_dumps import lazy_dumps
from autoclust.runtime import program_cache

COUNTS = {"lowered": 0}  # lower_graph runs (tests count them)


def compile_cluster(graph: Graph, input_types: list[tuple[np.dtype, tuple[int, ...]]],
                    shape_values: dict[str, np.ndarray], flags: Flags, backend: Any) -> Any:
    """specialize -> optimize -> fuse -> collapse -> share -> plan memory -> backend."""
    with inject.active(flags):  # --inject_bug reaches the lowerings (testing only)
        specialized = specialize(graph, input_types, shape_values)
        check_sizes(specialized, flags.max_buffer_bytes)  # before anything allocates
        optimized = optimize(specialized, flags)
        if not policy(backend).lowers:  # the interpreter runs the optimized graph
            exe = backend.compile(optimized, flags)
            dumps = lazy_dumps(exe)
        else:
            program = program_cache.load_or_lower(optimized, flags, backend, lower_graph)
            if not symbolic.hold_at_hints(program.guards, input_types):
                program = lower_graph(optimized, flags, backend)  # cached for another run
            symbolic.assume(program.guards)
            exe = backend.compile(program, flags)
            dumps = lazy_dumps(exe)
            if ".kernels.txt" not in dumps:
                dumps[".kernels.txt"] = lambda: kir.format_program(program)
    dumps[".before_optimizations.txt"] = lambda: str(specialized)
    dumps[".after_optimizations.txt"] = lambda: str(optimized)
    return exe


def lower_graph(graph: Graph, flags: Flags, backend: Any) -> kir.Program:
    """An optimized graph (concrete or symbolic shapes) -> the kernel IR Program a backend
    compiles (for a backend whose policy asks, with attention fused into FusedAttention
    calls first); the Program carries the guards its lowering decided on symbolic dims."""
    COUNTS["lowered"] += 1
    pol = policy(backend)
    with symbolic.recording() as rec:
        if pol.fused_attention and "fuse_attention" not in flags.disable_passes \
                and any(n.op == "Softmax" for n in graph.nodes):
            graph = fuse_attention(copy_graph(graph), pol.fused_attention,
                                   pol.attention_dtypes, pol.attention_min_keys,
                                   pol.attention_symbolic)
        program = attach_epilogues(fuse(graph, pol.fold_bias, pol.library_views),
                                   pol.library_epilogues)
        program = collapse_loops(program)
        # CompileError where an access may leave its buffer; with symbolic dims each
        # binding proves its concrete program (kernel/bounds.py: interval arithmetic on ints)
        if not symbolic.has_syms(program.buffers):
            prove_in_bounds(program)
        program = plan_memory(share_code(program), pol.writes_over)
    return dataclasses.replace(program, guards=tuple(rec.guards))


def compile_class(graph: Graph, input_types: list[tuple[np.dtype, tuple]],
                  shape_values: dict[str, np.ndarray], flags: Flags, backend: Any
                  ) -> tuple[Any, list[symbolic.Guard]]:
    """compile_cluster for input types with symbolic dims (symbolic.Sym): the backend's
    parametric executable (bind(dims) -> Executable) and the guards every decision of the
    compile recorded, which define the shape class it serves."""
    with symbolic.recording() as rec:
        exe = compile_cluster(graph, input_types, shape_values, flags, backend)
    return exe, list(rec.guards)
