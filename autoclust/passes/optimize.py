"""`optimize`: the graph passes in order, to a fixed point, on a concrete-shape graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from autoclust.errors import CompileError, FlagError
from autoclust.ir import Graph
from autoclust.passes.batchnorm import fold_batchnorm
from autoclust.passes.cse import cse
from autoclust.passes.dce import dce
from autoclust.passes.edits import copy_graph
from autoclust.passes.fold_constants import fold_constants
from autoclust.passes.patchify import patchify
from autoclust.passes.siblings import fuse_siblings
from autoclust.passes.simplify import simplify
from autoclust.passes.specialize import not_concrete

if TYPE_CHECKING:  # flags.py reads PASSES to check --disable_passes
    from autoclust.flags import Flags

PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("fold_constants", fold_constants),
    ("fold_batchnorm", fold_batchnorm),  # BatchNormalization after a GEMM: into its weights
    ("simplify", simplify),
    ("cse", cse),
    ("patchify", patchify),  # a Conv tiling its input: a MatMul over its patches
    ("siblings", fuse_siblings),  # after simplify: scale Muls are alphas by then
    ("dce", dce),
]
# Graph passes lower_graph runs for some backends only (after the rounds, before fusion)
LOWERING_PASSES = ("fuse_attention",)
# Each round can expose work for the next (a fold makes x*1 visible, a simplification makes
# two nodes identical); real clusters settle in two rounds.
MAX_ROUNDS = 4


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
    names = [name for name, _ in PASSES] + list(LOWERING_PASSES)
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
