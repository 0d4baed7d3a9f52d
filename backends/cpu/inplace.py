"""Which kernels may write their output over an input (the CPU Policy's `writes_over`).

kernel/memplan.py gives a kernel's output the memory slot of an input the kernel reads
last when this says yes. A softmax then writes its probabilities over its scores, a
LayerNorm its rows over its GEMM's product: the stores go to lines the kernel has just
read, and the plan holds one buffer instead of two (Whisper's [6, 750, 750] attention
scores: 13.5 MB). Whisper's attention block alone ran 1.09x faster; whole exports moved
less than this host's noise (docs/performance.md, thirteenth session).

Yes only when every element of the input is read in the loop iteration that stores the
same element of the output, before that store, and by nothing after it:

- one store, not per row and not a scan, moving along every loop dim (each element once);
  input and output of one dtype and element count;
- every load of the input at exactly the store's index (no clamps, no gathers);
- every reduction phase that loads the input feeds the store through its result, so the
  phase's reads come before the store by data (the kernel's pointers are noalias: LLVM
  may reorder what nothing orders);
- where codegen stashes part of the store's expression in a reduction phase (softmax's
  exp, written into the output row as the phase goes: codegen.plan_stash), no later phase
  and no other part of the store reads the input.

Vector code, index-set pieces and the thread split all keep an element's load and store
in one iteration of one thread, so these rules hold for all of them.
"""

from __future__ import annotations

from autoclust.backends.cpu import codegen

from autoclust import symbolic
from autoclust.kernel import ir as kir


def writes_over(k: kir.Kernel, src: kir.Buffer, dst: kir.Buffer) -> bool:
    """Whether kernel k may store buffer dst in the memory of buffer src (a temp whose
    last reader k is)."""
    if k.scan or len(k.stores) != 1:
        return False
    st = k.stores[0]
    if st.buf != dst.id or st.per_row or src.dtype != dst.dtype or \
            not symbolic.same(symbolic.product(src.shape), symbolic.product(dst.shape)):
        return False
    if any(symbolic.same(c, 0) and not symbolic.same(n, 1)
           for c, n in zip(st.index.coeffs, k.shape)):
        return False  # the same element stored more than once
    loads = [e for e in kir.kernel_exprs(k) if isinstance(e, kir.Load) and e.buf == src.id]
    if any(e.index != st.index or e.clamps or e.dyn for e in loads):
        return False
    reading = [p for p, r in enumerate(k.reductions) if _loads(r.expr, src.id)]
    if not set(reading) <= _phases_feeding(k, st.expr):
        return False
    for (phase, _), (sub, _) in codegen.plan_stash(k, codegen.buffer_dtypes(k)).items():
        if any(p > phase for p in reading) or _loads(st.expr, src.id, skip=sub):
            return False
    return True


def _loads(e: kir.Expr, buf: int, skip: kir.Expr | None = None) -> bool:
    """Whether e loads buf outside its subexpression `skip`."""
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if x is skip or x == skip or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, kir.Load) and x.buf == buf:
            return True
        stack.extend(kir.children(x))
    return False


def _phases_feeding(k: kir.Kernel, e: kir.Expr) -> set[int]:
    """The reduction phases whose results e uses, directly or through other phases."""
    found: set[int] = set()
    todo = [e]
    while todo:
        for x in kir.walk([todo.pop()]):
            if isinstance(x, kir.Reduced) and x.phase not in found:
                found.add(x.phase)
                todo.append(k.reductions[x.phase].expr)
    return found
