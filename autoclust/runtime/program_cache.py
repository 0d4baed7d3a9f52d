"""The --cache_dir cache of lowered kernel IR Programs (`.prog` entries).

A warm process reads the Program an earlier one lowered from the same optimized graph,
so it neither lowers nor (with the backend's object-code entries) compiles. Entries use
the format of `disk_cache.py` (checksummed, or authenticated under a key): a Program is a
pickle, unpickled only from a trusted directory and an entry that verified. Programs are
target-neutral kernel IR: a process on another CPU or GPU reuses them and builds its own
object code (keyed by CPU name and features, or GPU architecture).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from autoclust.flags import Flags
from autoclust.ir import Graph
from autoclust.kernel import ir as kir
from autoclust.registry import policy
from autoclust.runtime import disk_cache
from autoclust.version import __version__, source_digest

COUNTS = {"program_hits": 0}  # Programs read from --cache_dir
PROGRAM_FORMAT = 3  # bump when kernel IR or this entry's layout changes
# Constants whose values key a cached Program: every integer or bool constant (indices,
# divisors and shapes whose values lowering reads: range checks, refusals) and every
# constant up to this size (scalars inline into kernel code). Larger float constants are
# weights: lowering only loads them from their buffers, so they key by name, dtype and
# shape, and a loaded Program takes their values from the graph at hand.
KEY_VALUE_BYTES = 1 << 16


def load_or_lower(graph: Graph, flags: Flags, backend: Any,
                  lower: Callable[[Graph, Flags, Any], kir.Program]) -> kir.Program:
    """The Program of an identical optimized graph (same structure, attributes, small and
    integer constant values, weights' names and types) from --cache_dir, its constants taken
    from `graph`; else `lower(graph, flags, backend)`, kept there for this and later
    processes. Of several processes meeting the graph at once, one lowers; the others wait
    for its entry (disk_cache.locked)."""
    cache_dir = flags.cache_dir
    if not cache_dir or not disk_cache.trust(cache_dir, flags.cache_trusted):
        return lower(graph, flags, backend)
    key = program_key(graph, flags, backend)
    program = _load(cache_dir, key, graph)
    if program is not None:
        return program
    with disk_cache.locked(cache_dir, key):
        program = _load(cache_dir, key, graph)  # lowered by another process while we waited
        if program is None:
            program = lower(graph, flags, backend)
            blob = _pack(program, graph)
            if blob is not None:
                disk_cache.store(cache_dir, key, blob, ".prog")
    return program


def _load(cache_dir: str, key: str, graph: Graph) -> kir.Program | None:
    blob = disk_cache.load(cache_dir, key, ".prog")
    program = None if blob is None else _unpack(blob, graph)
    if program is not None:
        COUNTS["program_hits"] += 1
    return program


def program_key(graph: Graph, flags: Flags, backend: Any) -> str:
    """sha256 of everything lowering reads: the graph, the code flags, the backend's
    policy and the lowering code itself."""
    h = hashlib.sha256(f"{PROGRAM_FORMAT}|{__version__}|{source_digest()}|"
                       f"{getattr(backend, 'NAME', backend)}|{_policy_key(backend)}|"
                       f"{flags.code_key()!r}\n".encode())
    for v in graph.inputs:
        h.update(f"in {v.name} {v.type_str()}\n".encode())
    for name, arr in graph.initializers.items():
        h.update(f"const {name} {arr.dtype} {arr.shape}".encode())
        if arr.dtype == object:  # an int64 tensor of symbolic dims
            h.update(f" = {arr.tolist()!r}".encode())
        elif arr.dtype.kind not in "fc" or arr.nbytes <= KEY_VALUE_BYTES:
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
    """The backend's Policy, sets sorted (a frozenset's repr order changes per process),
    functions by qualified name (their repr holds an address)."""
    pol = policy(backend)
    fields = {f.name: getattr(pol, f.name) for f in dataclasses.fields(pol)}
    return repr({k: sorted(v) if isinstance(v, (set, frozenset)) else
                 f"{v.__module__}.{v.__qualname__}" if callable(v) else v
                 for k, v in sorted(fields.items())})


def _attr_key(value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes()
    if hasattr(value, "SerializeToString"):
        return value.SerializeToString()
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(_attr_key(x) for x in value) + b"]"
    return repr(value).encode()  # repr: full float precision (str(graph) rounds to %g)


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
        # our own entry: checksummed, or authenticated when a key is set (disk_cache.py)
        const_ids, bare = pickle.loads(blob)
        names = {b.id: b.name for b in bare.buffers}
        constants = {bid: graph.initializers[names[bid]] for bid in const_ids}
    except Exception:  # noqa: BLE001 - a stale or foreign entry is relowered, never fatal
        return None
    return dataclasses.replace(bare, constants=constants)
