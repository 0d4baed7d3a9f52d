"""The CPU backend: kernel IR -> LLVM (llvmlite) -> an Executable.

    exe = backends.cpu.compile(graph, flags)   # graph with concrete shapes
    outs = exe.run([x, y])

Pipeline: fusion.fuse (graph -> kernel IR program) -> kernel_ir.collapse (merge loop
dims) -> share_code (one function per distinct kernel: repeated layers compile once) ->
codegen.build_module (one LLVM module per cluster) -> jit (optimize, object code,
persistent cache) -> Executable (large kernels split over threads by its Splitter).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from autoclust.backends.cpu import cache, codegen, jit, library
from autoclust.backends.cpu.executable import Executable

from autoclust import fusion, ops
from autoclust import kernel_ir as kir
from autoclust.flags import Flags
from autoclust.fusion_rows import SUPPORTED_DTYPES, why_not_lower
from autoclust.ir import Graph, Node

NAME = "cpu"
# Kernels with at least this many loop iterations are split over `--threads` threads
# (executable.Splitter: chunks of the outer loop claimed by the caller and helper threads),
# in chunks of at least MIN_CHUNK_WORK iterations. A split costs the caller ~10 us, so the
# break-even is low: GELU on 256K floats takes ~0.35 ms on one thread.
PARALLEL_MIN_WORK = 1 << 18
MIN_CHUNK_WORK = 1 << 16
# libgomp regions (the kernels' `.par` entry points) instead of the Splitter. Off: on the
# shared 2-core build machine a region cost 4-8 ms (its end barrier waits until the OS
# schedules the second thread), e.g. BERT's 8 large kernels took 60 ms instead of 15.
USE_GOMP = False
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
    split = set()
    if threads > 1:
        split = {k.name for k in kernels if k.work >= PARALLEL_MIN_WORK and k.shape[0] > 1}
    unique, bindings = share_code(kernels)
    gomp = {bindings[n][0] for n in split} if USE_GOMP and jit.has_openmp() else set()
    dumps = {".kernels.txt": kir.format_program(program) + _format_sharing(bindings)}
    engine, addrs = None, {}
    if kernels:
        before = jit.COUNTS["compiles"]
        engine, addrs, dumps[".ll"], dumps[".s"] = _build(unique, flags, gomp)
        COMPILE_COUNT += jit.COUNTS["compiles"] - before
    consts = {b.id: graph.initializers[b.name] for b in program.buffers if b.role == "const"}
    return Executable(program, addrs, split, threads, engine, dumps, consts, library,
                      MIN_CHUNK_WORK, bool(gomp), bindings)


def _build(unique: list[kir.Kernel], flags: Flags, gomp: set[str]
           ) -> tuple[object, dict[str, int], str, str]:
    """(engine, {function name: address}, .ll, .s): one object per distinct kernel code.

    Each kernel compiles as its own module under a symbol named after its code key, so its
    object code is reusable by any cluster and any batch size (jit.kernel_object caches it
    in memory and in --cache_dir); a cluster's objects are loaded into one engine.
    """
    objs, lls, asms, symbols = [], [], [], {}
    for k in unique:
        par = k.name in gomp
        key = cache.make_key(f"{code_key(k)}|fast_math={flags.fast_math}|par={par}",
                             jit.version_key())
        sym = f"k_{key[:20]}"
        symbols[k.name] = sym
        if par:
            symbols[f"{k.name}.par"] = f"{sym}.par"

        def build(k: kir.Kernel = k, sym: str = sym, par: bool = par) -> str:
            renamed = dataclasses.replace(k, name=sym)
            return str(codegen.build_module([renamed], flags.fast_math, {sym} if par else set()))

        obj, ll, asm = jit.kernel_object(key, build, flags.cache_dir, bool(flags.dump_to))
        objs.append(obj)
        lls.append(f"; kernel {k.name}\n{ll}")
        asms.append(f"# kernel {k.name}\n{asm}")
    engine, found = jit.load_object(objs, list(symbols.values()))
    addrs = {name: found[sym] for name, sym in symbols.items()}
    return engine, addrs, "\n".join(lls), "\n".join(asms)


def code_key(k: kir.Kernel) -> str:
    """Text that determines k's generated code: its IR with the outer loop extent abstracted.

    codegen runs loop index i0 over [start, stop) given by the caller and reads only
    shape[1:] (see KernelEmitter.emit), so a kernel's code does not depend on shape[0].
    Anything else that varies with it (a stride, a reduction extent, a constant computed
    from it) stays in the text, so such kernels get distinct keys and compile separately.
    Buffer ids are part of the text: pass a renumbered kernel (_renumber).
    """
    k = dataclasses.replace(k, name="", nodes=())
    if len(k.shape) > k.n_inner:  # collapse() guarantees an outer dim; be safe otherwise
        k = dataclasses.replace(k, shape=("n0",) + k.shape[1:])
    return repr(k)


def _renumber(k: kir.Kernel) -> tuple[kir.Kernel, tuple[int, ...]]:
    """k with buffers numbered 0..n-1 in order of first use, and the original ids."""
    order: dict[int, int] = {}
    memo: dict[int, kir.Expr] = {}

    def expr(e: kir.Expr) -> kir.Expr:
        key = id(e)
        if key not in memo:
            if isinstance(e, kir.Load):
                memo[key] = dataclasses.replace(e, buf=order.setdefault(e.buf, len(order)))
            elif isinstance(e, kir.Op):
                memo[key] = dataclasses.replace(e, args=tuple(expr(a) for a in e.args))
            else:
                memo[key] = e
        return memo[key]

    reds = tuple(dataclasses.replace(r, expr=expr(r.expr)) for r in k.reductions)
    stores = []
    for st in k.stores:
        value = expr(st.expr)
        stores.append(dataclasses.replace(st, expr=value,
                                          buf=order.setdefault(st.buf, len(order))))
    canon = dataclasses.replace(k, name="", nodes=(), reductions=reds, stores=tuple(stores))
    return canon, tuple(order)


def share_code(kernels: list[kir.Kernel]
               ) -> tuple[list[kir.Kernel], dict[str, tuple[str, tuple[int, ...]]]]:
    """One function per distinct kernel code up to buffer ids (a model's repeated layers).

    Kernels that differ only in their outer extent (code_key) share a function too.

    Returns the kernels to compile (renumbered, named after their first user) and, per
    kernel name, (function name, buffer ids in the function's slot order). LLVM's code
    generation dominates compile time (BERT: ~60 ms per kernel), and 4-layer BERT has 4
    copies of each layer's kernels.
    """
    unique: dict[str, kir.Kernel] = {}
    bindings: dict[str, tuple[str, tuple[int, ...]]] = {}
    for k in kernels:
        canon, ids = _renumber(k)
        key = code_key(canon)
        if key not in unique:
            unique[key] = dataclasses.replace(canon, name=k.name, nodes=k.nodes)
        bindings[k.name] = (unique[key].name, ids)
    return list(unique.values()), bindings


def _format_sharing(bindings: dict[str, tuple[str, tuple[int, ...]]]) -> str:
    shared = [f"  {name} runs {fn}'s code" for name, (fn, _) in bindings.items() if fn != name]
    return "code sharing:\n" + "\n".join(shared) + "\n" if shared else ""


def reference_outputs(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `graph` with the op references (what compiled code must match)."""
    from autoclust.interpreter import evaluate
    with np.errstate(all="ignore"):
        return evaluate(graph, inputs)
