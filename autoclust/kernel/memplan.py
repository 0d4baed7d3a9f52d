"""plan_memory: give a Program's temps slots; temps with disjoint lifetimes share a slot.

    k0 writes t0; k1 reads t0, writes t1; k2 reads t1, writes t2   ->  t0, t2 share slot 0

A buffer that views a temp (a Reshape needing no copy, Program.aliases) gets that temp's
slot, and its reads keep the temp alive. Inputs, constants and outputs get no slot: the
caller owns them.
"""

from __future__ import annotations

import dataclasses

from autoclust.kernel import ir as kir


def plan_memory(program: kir.Program) -> kir.Program:
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
    temps = sorted((b for b in program.buffers if b.role == "temp" and b.id not in aliases),
                   key=lambda b: first.get(b.id, 0))
    slots: dict[int, int] = {}
    for buf in temps:
        start = first.get(buf.id, 0)
        for s, free_after in enumerate(slot_free_after):
            if free_after < start:
                slot_free_after[s] = last.get(buf.id, start)
                slots[buf.id] = s
                break
        else:
            slots[buf.id] = len(slot_free_after)
            slot_free_after.append(last.get(buf.id, start))
    buffers = [dataclasses.replace(b, slot=slots.get(aliases.get(b.id, b.id), -1))
               for b in program.buffers]
    return dataclasses.replace(program, buffers=buffers)
