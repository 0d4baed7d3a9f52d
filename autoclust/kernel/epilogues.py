"""GEMM epilogues: the elementwise kernel right after a library call joins the call.

Fusion gives a GEMM's consumers kernels of their own: BERT's GELU, GPT-2's residual Add
(and its tanh-GELU), a bias Add that a loop kernel also reads. When such a kernel is the
only reader of the call's result and reads it element for element, `attach_epilogues`
makes it the call's `epilogue` (kernel IR LibraryCall.epilogue):

    library MatMul(h, w1) -> t                    library MatMul(h, w1) -> t
    kernel k4 [393216]                    ->        epilogue kernel k4 [393216]
      gelu[i0] = f(t[i0])                             gelu[i0] = f(t[i0])

It also takes a kernel reading the result's two halves at the same row, [..., j] and
[..., F + j] of a [..., 2F] result: the SwiGLU silu(gate) * up after the gate and up
projections fused into one GEMM (passes/siblings.py).

The backend then runs the epilogue while the result is in cache: inside the library call
where the library takes it (oneDNN post-ops: backends/cpu/epilogue.py), else as the same
kernel right after the call. Memory planning sees one thunk reading the call's inputs and
the epilogue's, writing the call's result and the epilogue's stores, so no epilogue
result shares memory with a GEMM operand.

A backend asks for this with Policy.library_epilogues (the ops whose calls take one).
"""

from __future__ import annotations

import dataclasses

from autoclust import symbolic
from autoclust.kernel import ir as kir
from autoclust.kernel.indexing import contiguous_strides


def is_flat(index: kir.Affine, k: kir.Kernel) -> bool:
    """Whether `index` is the flat row-major position of k's loop point (element i of a
    buffer of k's size; a size-1 dim's coefficient does not matter)."""
    strides = contiguous_strides(k.shape)
    return index.const == 0 and all(c == s for c, s, d in zip(index.coeffs, strides, k.shape)
                                    if d > 1)


def reads_elementwise(k: kir.Kernel, buf: int) -> bool:
    """Whether every load of `buf` in k reads the element at k's own flat index."""
    return all(is_flat(e.index, k) and not e.clamps and not e.dyn
               for e in kir.kernel_exprs(k) if isinstance(e, kir.Load) and e.buf == buf)


def reads_halves(k: kir.Kernel, buf: int, shape: tuple) -> bool:
    """Whether k (shape [..., F]) reads `buf` (shape [..., 2F]) at the same row and column
    j or F + j only: a SwiGLU's silu(gate) * up over the fused gate/up projection
    (passes/siblings.py), each element of the result once."""
    f = shape[-1] // 2 if isinstance(shape[-1], int) else None
    if f is None or shape[-1] != 2 * f or k.shape[-1] != f or \
            not symbolic.same(symbolic.product(shape), 2 * symbolic.product(k.shape)):
        return False
    twice = tuple(2 * s for s in contiguous_strides(k.shape)[:-1])
    loads = [e for e in kir.kernel_exprs(k) if isinstance(e, kir.Load) and e.buf == buf]
    return bool(loads) and all(
        not e.clamps and not e.dyn and e.index.const in (0, f) and e.index.coeffs[-1] == 1
        and all(d == 1 or c == t for c, t, d in zip(e.index.coeffs, twice, k.shape))
        for e in loads)


def _fits(call: kir.Thunk, k: kir.Thunk, buffers: dict[int, kir.Buffer],
          readers: dict[int, int], aliased: set[int], ops: frozenset) -> bool:
    if not isinstance(call, kir.LibraryCall) or not isinstance(k, kir.Kernel):
        return False
    if call.op not in ops or call.epilogue is not None or len(call.outputs) != 1 or \
            call.view(len(call.inputs)) is not None:
        return False
    out = buffers[call.outputs[0]]
    size = symbolic.product(k.shape)
    if out.role != "temp" or out.id in aliased or readers.get(out.id, 0) != 1 or \
            not out.dtype.startswith("float") or k.n_inner or k.reductions or k.empty or \
            out.id not in kir.loaded_buffers(k):
        return False
    if not (size == out.size and reads_elementwise(k, out.id) or
            reads_halves(k, out.id, out.shape)):
        return False
    return all(
        is_flat(s.index, k) and not s.per_row and s.buf != out.id and
        buffers[s.buf].size == size for s in k.stores)


def attach_epilogues(program: kir.Program, ops: frozenset) -> kir.Program:
    """`program` with each elementwise kernel that alone reads the result of the library
    call before it (an op in `ops`) moved into that call as its epilogue."""
    if not ops:
        return program
    buffers = {b.id: b for b in program.buffers}
    aliased = set(program.aliases) | set(program.aliases.values())
    readers: dict[int, int] = {}
    for t in program.thunks:
        for b in kir.thunk_buffers(t)[0]:
            b = program.aliases.get(b, b)
            readers[b] = readers.get(b, 0) + 1
    thunks: list[kir.Thunk] = []
    i = 0
    while i < len(program.thunks):
        t = program.thunks[i]
        k = program.thunks[i + 1] if i + 1 < len(program.thunks) else None
        if k is not None and _fits(t, k, buffers, readers, aliased, ops):
            assert isinstance(t, kir.LibraryCall) and isinstance(k, kir.Kernel)  # _fits
            thunks.append(dataclasses.replace(t, epilogue=k))
            i += 2
            continue
        thunks.append(t)
        i += 1
    if len(thunks) == len(program.thunks):
        return program
    notes = program.notes + [f"{t.epilogue.name} is the epilogue of {t.op} ({', '.join(t.nodes)})"
                             for t in thunks if isinstance(t, kir.LibraryCall) and
                             t.epilogue is not None]
    return dataclasses.replace(program, thunks=thunks, notes=notes)
