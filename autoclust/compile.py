"""Compile one cluster for one signature: the whole pipeline, in order.

    graph (symbolic shapes)
      specialize(input types, shape values)  concrete dtypes and int shapes everywhere
      optimize: up to MAX_ROUNDS of PASSES    fold_constants, simplify, cse, dce
      fuse                                    kernel IR: Kernels, LibraryCalls, Checks, each
                                              op lowered by its own `lower` in the op table
      collapse_loops                          merge contiguous loop dims
      prove_in_bounds                         every load and store inside its buffer, or a
                                              CompileError (kernel/bounds.py)
      share_code                              one code per distinct kernel (repeated layers)
      plan_memory                             temps share slots
      backend.compile                         an Executable: the ONLY backend-specific step

With --cache_dir, fuse..plan_memory are skipped when the directory holds the Program
lowered from the same optimized graph (see `lower_cached`): a warm process neither lowers
nor compiles through LLVM (backend object code has its own entries).

A backend whose POLICY does not lower (the interpreter) compiles the optimized graph.
`--disable_passes=simplify,cse` skips passes by name; `--verify_passes` checks the graph
after every pass and names the pass that broke it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

import autoclust
from autoclust.errors import CompileError, FlagError
from autoclust.flags import Flags
from autoclust.ir import Graph
from autoclust.kernel import inject
from autoclust.kernel.bounds import check_program as prove_in_bounds
from autoclust.kernel import ir as kir
from autoclust.kernel.fusion import fuse
from autoclust.kernel.memplan import plan_memory
from autoclust.kernel.passes import collapse_loops, share_code
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
        program = lower_cached(optimized, flags, backend)
        exe = backend.compile(program, flags)
        dumps = lazy_dumps(exe)
        if ".kernels.txt" not in dumps:
            dumps[".kernels.txt"] = lambda: kir.format_program(program)
    else:
        exe = backend.compile(optimized, flags)
        dumps = lazy_dumps(exe)
    dumps[".before_optimizations.txt"] = lambda: str(specialized)
    dumps[".after_optimizations.txt"] = lambda: str(optimized)
    return exe


class LazyDumps(collections.abc.MutableMapping):
    """An executable's dump texts by suffix; a value set as a zero-argument callable is
    made when first read. Only --dump_to and tests read them, and printing BERT's graphs
    and kernel IR took 30-50 ms of each compile (most of a warm --cache_dir compile)."""

    def __init__(self, texts: Mapping[str, Any] | None = None):
        self._texts: dict[str, Any] = dict(texts or {})

    def __getitem__(self, key: str) -> str:
        value = self._texts[key]
        if callable(value):
            value = self._texts[key] = value()
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self._texts[key] = value

    def __delitem__(self, key: str) -> None:
        del self._texts[key]

    def __contains__(self, key: object) -> bool:
        return key in self._texts  # Mapping's own would make the text

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return f"LazyDumps({sorted(self._texts)})"


def lazy_dumps(exe: Any) -> LazyDumps:
    """exe.dumps as a LazyDumps (made one if it is a plain dict)."""
    if not isinstance(exe.dumps, LazyDumps):
        exe.dumps = LazyDumps(exe.dumps)
    return exe.dumps


def lower_graph(graph: Graph, flags: Flags, backend: Any) -> kir.Program:
    """An optimized concrete-shape graph -> the kernel IR Program a backend compiles."""
    COUNTS["lowered"] += 1
    program = collapse_loops(fuse(graph, policy(backend).fold_bias))
    prove_in_bounds(program)  # CompileError where an access may leave its buffer
    return plan_memory(share_code(program))


# ---- the --cache_dir cache of lowered Programs ---------------------------------------------

COUNTS = {"lowered": 0, "program_hits": 0}  # lower_graph runs / Programs read from --cache_dir
PROGRAM_FORMAT = 1  # bump when kernel IR or this entry's layout changes
# Constants whose values key a cached Program: every integer or bool constant (indices,
# divisors and shapes whose values lowering reads: range checks, refusals) and every
# constant up to this size (scalars inline into kernel code). Larger float constants are
# weights: lowering only loads them from their buffers, so they key by name, dtype and
# shape, and a loaded Program takes their values from the graph at hand.
KEY_VALUE_BYTES = 1 << 16
_SOURCES: dict[str, str] = {}


def lower_cached(graph: Graph, flags: Flags, backend: Any) -> kir.Program:
    """lower_graph, through --cache_dir when set: the Program lowered from an identical
    optimized graph (same structure, attributes, small and integer constant values,
    weights' names and types), its constants taken from `graph`."""
    if not flags.cache_dir:
        return lower_graph(graph, flags, backend)
    from autoclust.backends.cpu import cache as disk  # the checksummed entry format
    key = program_key(graph, flags, backend)
    blob = disk.load(flags.cache_dir, key, ".prog")
    program = None if blob is None else _unpack(blob, graph)
    if program is not None:
        COUNTS["program_hits"] += 1
        return program
    program = lower_graph(graph, flags, backend)
    blob = _pack(program, graph)
    if blob is not None:
        disk.store(flags.cache_dir, key, blob, ".prog")
    return program


def program_key(graph: Graph, flags: Flags, backend: Any) -> str:
    """sha256 of everything lowering reads: the graph, the code flags, the backend's
    policy and the lowering code itself."""
    h = hashlib.sha256(f"{PROGRAM_FORMAT}|{autoclust.__version__}|{_source_digest()}|"
                       f"{getattr(backend, 'NAME', backend)}|{_policy_key(backend)}|"
                       f"{flags.code_key()!r}\n".encode())
    for v in graph.inputs:
        h.update(f"in {v.name} {v.type_str()}\n".encode())
    for name, arr in graph.initializers.items():
        h.update(f"const {name} {arr.dtype} {arr.shape}".encode())
        if arr.dtype.kind not in "fc" or arr.nbytes <= KEY_VALUE_BYTES:
            h.update(b" = " + np.ascontiguousarray(arr).tobytes())
        h.update(b"\n")
    for n in graph.nodes:
        ins = ",".join("_" if v is None else v.name for v in n.inputs)
        outs = ",".join(f"{v.name}:{v.type_str()}" for v in n.outputs)
        h.update(f"{n.domain}::{n.op}({ins})->{outs} #{n.name}\n".encode())
        for k in sorted(n.attrs):
            h.update(f"  {k}=".encode() + _attr_key(n.attrs[k]) + b"\n")
    h.update(("return " + ",".join(v.name for v in graph.outputs)).encode())
    return h.hexdigest()


def _policy_key(backend: Any) -> str:
    """The backend's Policy, sets sorted (a frozenset's repr order changes per process)."""
    pol = policy(backend)
    fields = {f.name: getattr(pol, f.name) for f in dataclasses.fields(pol)}
    return repr({k: sorted(v) if isinstance(v, (set, frozenset)) else v
                 for k, v in sorted(fields.items())})


def _attr_key(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes()
    if hasattr(value, "SerializeToString"):
        return value.SerializeToString()
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(_attr_key(x) for x in value) + b"]"
    return repr(value).encode()  # repr: full float precision (str(graph) rounds to %g)


def _source_digest() -> str:
    """sha1 of autoclust's Python sources (~1 MB, read once per process): a Program cached
    by one version of the lowering code is never read by another."""
    if not _SOURCES:
        import pathlib
        h = hashlib.sha1()
        root = pathlib.Path(autoclust.__file__).parent
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        _SOURCES["digest"] = h.hexdigest()
    return _SOURCES["digest"]


def _pack(program: kir.Program, graph: Graph) -> bytes | None:
    """The Program without its constant values (each is a graph initializer of the same
    name); None when one is not (then the Program is not cached)."""
    names = {b.id: b.name for b in program.buffers}
    for bid, value in program.constants.items():
        if graph.initializers.get(names.get(bid, "")) is not value:
            return None
    bare = dataclasses.replace(program, constants={})
    return pickle.dumps((sorted(program.constants), bare), protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(blob: bytes, graph: Graph) -> kir.Program | None:
    """The cached Program with constants from `graph`, or None when it does not fit."""
    try:
        const_ids, bare = pickle.loads(blob)  # our own entry, checksummed (see cache.py)
        names = {b.id: b.name for b in bare.buffers}
        constants = {bid: graph.initializers[names[bid]] for bid in const_ids}
    except Exception:  # noqa: BLE001 - a stale or foreign entry is relowered, never fatal
        return None
    return dataclasses.replace(bare, constants=constants)


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
