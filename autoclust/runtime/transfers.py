"""Copies between host and device memory: counted per run, and predicted from a plan.

A backend whose Policy has `device_memory` (the GPU) keeps cluster values in its own
memory; onnxruntime segments run on the host. The runtime moves a value only where a step
on the other side reads it, once per run, and counts the bytes here:

    with transfers.measure() as copied:      # the runtime, around one run
        ...                                   # backends call transfers.count("h2d", n)
    copied.h2d, copied.d2h                    # bytes each way

`plan_copies(plan)` predicts the same copies from a Plan without running it (shapes may
be symbolic), for `autoclust explain`:

    Host <-> device copies per run (device clusters, onnxruntime segments on the host):
      x                  float32[batch, 64]   host -> device   256*batch bytes   (cluster_0000)
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np


@dataclasses.dataclass
class Counter:
    h2d: int = 0
    d2h: int = 0
    copies: int = 0


_CURRENT: contextvars.ContextVar[Counter | None] = contextvars.ContextVar(
    "autoclust_transfers", default=None)


def count(direction: str, nbytes: int) -> None:
    """Record one copy ("h2d" or "d2h") in the counter of the run in progress, if any."""
    c = _CURRENT.get()
    if c is not None:
        setattr(c, direction, getattr(c, direction) + int(nbytes))
        c.copies += 1


@contextlib.contextmanager
def measure() -> Iterator[Counter]:
    """Count the copies made inside the block (this thread/context only)."""
    c = Counter()
    token = _CURRENT.set(c)
    try:
        yield c
    finally:
        _CURRENT.reset(token)


# ---- what a plan will copy --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Copy:
    value: str
    dtype: str
    shape: tuple
    direction: str    # "host -> device" or "device -> host"
    reader: str       # the step (or "graph output") that needs it there

    def term(self) -> tuple[int, tuple[str, ...]]:
        """(constant factor, symbolic dims) of the byte count: 256*batch -> (256, ('batch',))."""
        size = np.dtype(self.dtype).itemsize
        names = []
        for d in self.shape:
            if isinstance(d, int):
                size *= d
            else:
                names.append(str(d))
        return size, tuple(names)

    def nbytes(self) -> str:
        """Bytes as a number, or a product with the symbolic dims ('256*batch')."""
        return _format_term(*self.term())


def _format_term(size: int, names: tuple[str, ...]) -> str:
    return "*".join([str(size)] + list(names))


def total_bytes(copies: list[Copy]) -> str:
    """The sum of the copies' byte counts, like terms combined ('416*batch + 8*nnz')."""
    sums: dict[tuple[str, ...], int] = {}
    for c in copies:
        size, names = c.term()
        key = tuple(sorted(names))
        sums[key] = sums.get(key, 0) + size
    return " + ".join(_format_term(v, k) for k, v in sums.items() if v) or "0"


def plan_copies(plan: Any, device_outputs: bool = False) -> list[Copy]:
    """The copies a run of `plan` makes when its clusters run in device memory and its
    onnxruntime segments on the host; graph inputs arrive on the host and outputs go back
    there unless device_outputs. A value copied once is then present on both sides."""
    from autoclust.clustering.partition import Cluster
    graph = plan.graph
    where: dict[str, set[str]] = {}
    for v in graph.inputs:
        where[v.name] = {"host"}
    for name in graph.initializers:
        where.setdefault(name, {"host", "device"})  # constants: uploaded once, not per run
    out: list[Copy] = []

    def need(name: str, side: str, reader: str) -> None:
        have = where.setdefault(name, {"host"})
        if side in have:
            return
        v = graph.values.get(name)
        dtype = str(v.dtype) if v is not None and v.dtype is not None else "float32"
        shape = tuple(v.shape) if v is not None and v.shape is not None else ()
        out.append(Copy(name, dtype, shape, "host -> device" if side == "device"
                        else "device -> host", reader))
        have.add(side)

    for step in plan.steps:
        side = "device" if isinstance(step, Cluster) else "host"
        for v in step.inputs:
            if v.name not in graph.initializers or v.name in {x.name for x in graph.inputs}:
                need(v.name, side, step.name)
        for v in step.outputs:
            where[v.name] = {side}
    final = "device" if device_outputs else "host"
    for v in graph.outputs:
        need(v.name, final, "graph output")
    return out


def copies_text(copies: list[Copy]) -> str:
    """The `explain` section: one line per copy, then the total."""
    head = ("Host <-> device copies per run (clusters on the device, onnxruntime segments "
            "on the host):")
    lines = [head]
    if not copies:
        lines.append("  none beyond the inputs and outputs already on the device")
    for c in copies:
        dims = ", ".join(str(d) for d in c.shape)
        lines.append(f"  {c.value}: {c.dtype}[{dims}] {c.direction}, {c.nbytes()} bytes "
                     f"(for {c.reader})")
    if copies:
        lines.append(f"  total: {total_bytes(copies)} bytes")
    return "\n".join(lines)
