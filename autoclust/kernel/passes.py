"""Passes over kernel IR Programs, run by autoclust.compile between fusion and the backend.

- collapse_loops: merge loop dims every index map walks contiguously, drop size-1 dims
  ([64, 1024] with maps 1024*i0 + i1 -> [65536]).
- share_code: one function per distinct kernel code (a model's repeated layers): kernels
  (library calls' epilogues included) that differ only in buffer ids, or in their outer
  loop extent, share it. Backends compile
  each distinct kernel once and bind each kernel's buffers in the shared code's order.
"""

from __future__ import annotations

import dataclasses

from autoclust.kernel import ir as kir


def collapse_loops(program: kir.Program) -> kir.Program:
    """Every kernel (library calls' epilogues too) with its loop nest collapsed
    (kernel_ir.collapse)."""
    def one(t: kir.Thunk) -> kir.Thunk:
        if isinstance(t, kir.Kernel):
            return kir.collapse(t)
        if isinstance(t, kir.LibraryCall) and t.epilogue is not None:
            return dataclasses.replace(t, epilogue=kir.collapse(t.epilogue))
        return t
    return dataclasses.replace(program, thunks=[one(t) for t in program.thunks])


def code_key(k: kir.Kernel) -> str:
    """Text that determines k's generated code: its IR with the outer loop extent abstracted.

    Backends run loop index i0 over a [start, stop) range the caller gives and read only
    shape[1:], so a kernel's code does not depend on shape[0]. Anything else that varies
    with it (a stride, a reduction extent, a constant computed from it) stays in the text,
    so such kernels get distinct keys. Buffer ids are part of the text: pass a renumbered
    kernel (see renumber).
    """
    k = dataclasses.replace(k, name="", nodes=())
    if len(k.shape) > k.n_inner:  # collapse() guarantees an outer dim; be safe otherwise
        # a placeholder name for the outer extent, only ever repr'd
        k = dataclasses.replace(k, shape=("n0",) + k.shape[1:])  # type: ignore[arg-type]
    return repr(k)


def renumber(k: kir.Kernel) -> tuple[kir.Kernel, tuple[int, ...]]:
    """k with buffers numbered 0..n-1 in order of first use, and the original ids."""
    order: dict[int, int] = {}
    memo: dict[int, kir.Expr] = {}

    def expr(e: kir.Expr) -> kir.Expr:
        key = id(e)
        if key not in memo:
            if isinstance(e, kir.Load):
                dyn = tuple((expr(x), s) for x, s in e.dyn)
                memo[key] = dataclasses.replace(e, buf=order.setdefault(e.buf, len(order)),
                                                dyn=dyn)
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


def share_code(program: kir.Program) -> kir.Program:
    """Record, per kernel, which kernel's code it runs and its buffers in that code's order
    (Program.sharing); the first kernel of each code carries the renumbered body."""
    unique: dict[str, str] = {}
    sharing: dict[str, tuple[str, tuple[int, ...]]] = {}
    for t in kir.kernels(program.thunks):
        canon, ids = renumber(t)
        key = code_key(canon)
        unique.setdefault(key, t.name)
        sharing[t.name] = (unique[key], ids)
    return dataclasses.replace(program, sharing=sharing)


def distinct_kernels(program: kir.Program) -> list[kir.Kernel]:
    """One renumbered kernel per distinct code, named after its first user (see share_code)."""
    by_name = {t.name: t for t in kir.kernels(program.thunks)}
    out = []
    for name, (owner, _) in program.sharing.items():
        if name == owner:
            canon, _ = renumber(by_name[name])
            out.append(dataclasses.replace(canon, name=name, nodes=by_name[name].nodes))
    return out
