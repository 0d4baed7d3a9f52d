"""plan_memory: give a Program's temps slots; temps with disjoint lifetimes share a slot.

    k0 writes t0; k1 reads t0, writes t1; k2 reads t1, writes t2   ->  t0, t2 share slot 0

A buffer that views a temp (a Reshape needing no copy, Program.aliases) gets that temp's
slot, and its reads keep the temp alive. Inputs, constants and outputs get no slot: the
caller owns them.

With `writes_over` (the backend's Policy), a kernel's output may also take the slot of an
input whose last reader that kernel is, when the backend says the kernel reads each
element of that input before it writes the same element of its output (a softmax over its
scores, a LayerNorm over its GEMM's product): k1 above then writes t1 over t0, in slot 0,
one buffer instead of two (Whisper's attention scores are [6, 750, 750] floats, 13.5 MB).
A library call's epilogue kernel is part of the call and keeps its own output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from autoclust.kernel import ir as kir


def plan_memory(program: kir.Program,
                writes_over: Callable[[kir.Kernel, Any, Any], bool] | None = None
                ) -> kir.Program:
    """A copy of `program` whose temp buffers carry memory-plan slots."""
    aliases = program.aliases
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, t in enumerate(program.thunks):
        reads, writes = kir.thunk_buffers(t)
        for b in writes:
            first.setdefault(b, i)
            last[b] = max(last.get(b, i), i)
        for b in (aliases.get(b, b) for b in reads):
            last[b] = i
    slot_free_after: list[int] = []  # per slot: the last thunk reading its current tenant
    tenant: list[kir.Buffer] = []    # per slot: its current tenant
    temps = sorted((b for b in program.buffers if b.role == "temp" and b.id not in aliases),
                   key=lambda b: first.get(b.id, 0))
    slots: dict[int, int] = {}
    for buf in temps:
        start = first.get(buf.id, 0)
        s = _written_over(program, buf, start, slot_free_after, tenant, writes_over)
        if s is None:
            s = next((s for s, free_after in enumerate(slot_free_after) if free_after < start),
                     len(slot_free_after))
        if s == len(slot_free_after):
            slot_free_after.append(0)
            tenant.append(buf)
        slots[buf.id] = s
        slot_free_after[s] = last.get(buf.id, start)
        tenant[s] = buf
    buffers = [dataclasses.replace(b, slot=slots.get(aliases.get(b.id, b.id), -1))
               for b in program.buffers]
    return dataclasses.replace(program, buffers=buffers)


def _written_over(program: kir.Program, buf: kir.Buffer, start: int, free_after: list[int],
                  tenant: list[kir.Buffer], writes_over: Callable | None) -> int | None:
    """The slot whose tenant the kernel writing `buf` may write it over, or None."""
    kernel = program.thunks[start] if start < len(program.thunks) else None
    if writes_over is None or not isinstance(kernel, kir.Kernel):
        return None
    loaded = kir.loaded_buffers(kernel)
    for s, (after, old) in enumerate(zip(free_after, tenant)):
        # a view of the tenant (an alias) read by the kernel is not covered by the rule
        if after == start and old.id in loaded and writes_over(kernel, old, buf) and \
                not any(program.aliases.get(b) == old.id for b in loaded):
            return s
    return None
