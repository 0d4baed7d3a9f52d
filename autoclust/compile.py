"""Compile one cluster for one signature: the whole pipeline, in order.

    graph (symbolic shapes)
      specialize(input types, shape values)  concrete dtypes and int shapes everywhere
      optimize: up to MAX_ROUNDS of PASSES    fold_constants, simplify, cse, dce
      fuse                                    kernel IR: Kernels, LibraryCalls, Checks, each
                                              op lowered by its own `lower` in the op table
      collapse_loops                          merge contiguous loop dims
      share_code                              one code per distinct kernel (repeated layers)
      plan_memory                             temps share slots
      backend.compile                         an Executable: the ONLY backend-specific step

A backend whose POLICY does not lower (the interpreter) compiles the optimized graph.
`--disable_passes=simplify,cse` skips passes by name; `--verify_passes` checks the graph
after every pass and names the pass that broke it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from autoclust import inject
from autoclust import kernel_ir as kir
from autoclust.errors import CompileError, FlagError
from autoclust.flags import Flags
from autoclust.fusion import fuse
from autoclust.ir import Graph
from autoclust.kernel_passes import collapse_loops, share_code
from autoclust.memplan import plan_memory
from autoclust.passes import copy_graph, cse, dce, fold_constants, not_concrete, simplify
from autoclust.passes import specialize as _specialize
from autoclust.registry import policy

PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("fold_constants", fold_constants),
    ("simplify", simplify),
    ("cse", cse),
    ("dce", dce),
]
# Each round can expose work for the next (a fold makes x*1 visible, a simplification makes
# two nodes identical); real clusters settle in two rounds.
MAX_ROUNDS = 4


def compile_cluster(graph: Graph, input_types: list[tuple[np.dtype, tuple[int, ...]]],
                    shape_values: dict[str, np.ndarray], flags: Flags, backend: Any) -> Any:
    """specialize -> optimize -> fuse -> collapse -> share -> plan memory -> backend."""
    with inject.active(flags):  # --inject_bug reaches the lowerings (testing only)
        return _compile_cluster(graph, input_types, shape_values, flags, backend)


def _compile_cluster(graph: Graph, input_types: list[tuple[np.dtype, tuple[int, ...]]],
                     shape_values: dict[str, np.ndarray], flags: Flags, backend: Any) -> Any:
    specialized = specialize(graph, input_types, shape_values)
    optimized = optimize(specialized, flags)
    if policy(backend).lowers:
        program = lower_graph(optimized, flags, backend)
        exe = backend.compile(program, flags)
        exe.dumps.setdefault(".kernels.txt", kir.format_program(program))
    else:
        exe = backend.compile(optimized, flags)
    exe.dumps[".before_optimizations.txt"] = str(specialized)
    exe.dumps[".after_optimizations.txt"] = str(optimized)
    return exe


def lower_graph(graph: Graph, flags: Flags, backend: Any) -> kir.Program:
    """An optimized concrete-shape graph -> the kernel IR Program a backend compiles."""
    program = fuse(graph, policy(backend).fold_bias)
    return plan_memory(share_code(collapse_loops(program)))


def specialize(graph: Graph, input_types: list[tuple[np.dtype, tuple[int, ...]]],
               shape_values: dict[str, np.ndarray]) -> Graph:
    """A copy of `graph` with concrete input types; inputs in shape_values become constants."""
    return _specialize(graph, input_types, shape_values)


def _check(graph: Graph, pass_name: str) -> None:
    """graph.verify() plus concrete types everywhere; raise CompileError naming the pass."""
    try:
        graph.verify()
    except ValueError as exc:
        raise CompileError(f"graph {graph.name} is invalid after pass {pass_name}: {exc}"
                           ) from exc
    loose = not_concrete(graph)
    if loose:
        names = ", ".join(repr(v) for v in loose[:5])
        raise CompileError(f"graph {graph.name} after pass {pass_name}: values without a "
                           f"concrete dtype and shape: {names}")


def _fingerprint(graph: Graph) -> tuple:
    """Cheap structural identity: every pass edit changes a node, an edge or a constant."""
    nodes = tuple((n.op, tuple(v.name if v is not None else "" for v in n.inputs),
                   tuple(v.name for v in n.outputs),
                   tuple((k, repr(a)[:200]) for k, a in sorted(n.attrs.items())))
                  for n in graph.nodes)
    return (nodes, tuple(v.name for v in graph.outputs), tuple(graph.initializers))


def optimize(graph: Graph, flags: Flags) -> Graph:
    """Run PASSES in order to a fixed point (at most MAX_ROUNDS), on a copy of `graph`."""
    names = [name for name, _ in PASSES]
    unknown = [p for p in flags.disable_passes if p not in names]
    if unknown:
        raise FlagError(f"--disable_passes names unknown passes {unknown}; passes: "
                        f"{', '.join(names)}")
    enabled = [(name, fn) for name, fn in PASSES if name not in flags.disable_passes]
    graph = copy_graph(graph)
    if flags.verify_passes:
        _check(graph, "specialize")
    for _ in range(MAX_ROUNDS):
        before = _fingerprint(graph)
        for name, fn in enabled:
            graph = fn(graph)
            if flags.verify_passes:
                _check(graph, name)
        if _fingerprint(graph) == before:
            break
    return graph
