"""Wall-clock budgets that survive a busy hypervisor.

The machines that run CI are virtual, 2 vCPUs on a shared host. When the host is
overcommitted, the hypervisor runs other guests on our vCPUs while our threads are
runnable; Linux counts that time in the `steal` column of /proc/stat. On 2026-11-27 it
read 60-73% while a NumPy GEMM ran, the GEMM took 2-3x its usual time, and two speed tests
with absolute budgets failed in CI although nothing in autoclust had slowed down.

A speed test with an absolute budget (seconds, microseconds) measures inside `Meter` and
compares with `meter.budget(b)`: b stretched by the share of the busy time that was stolen
(`slowdown` = busy / (busy - stolen)), capped at `MAX_SLOWDOWN` so a starved machine still
fails a test whose code really got slower. Ratio tests (ours against onnxruntime in the
same process, alternating) need none of this: both sides lose the same share.
"""
from __future__ import annotations

import os

MAX_SLOWDOWN = 4.0
_STAT = "/proc/stat"


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy ticks, stolen ticks) over all CPUs since boot, or None off Linux."""
    try:
        with open(_STAT) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    # cpu user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is
    # already inside user/nice.
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return user + nice + system + irq + softirq + steal, steal


class Meter:
    """Measures how much of the CPU time wanted inside a `with` block the host took away."""

    def __init__(self) -> None:
        self.busy = self.stolen = 0
        self._start: tuple[int, int] | None = None

    def __enter__(self) -> Meter:  # noqa: PYI034 - Meter has no subclasses
        self._start = _cpu_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        end = _cpu_ticks()
        if self._start is not None and end is not None:
            self.busy = end[0] - self._start[0]
            self.stolen = end[1] - self._start[1]

    @property
    def slowdown(self) -> float:
        """How many times longer CPU-bound work took than on an unshared host (>= 1)."""
        own = self.busy - self.stolen
        if self.stolen <= 0 or own <= 0:
            return 1.0
        return min(MAX_SLOWDOWN, self.busy / own)

    def budget(self, limit: float) -> float:
        return limit * self.slowdown

    def __str__(self) -> str:
        share = self.stolen / self.busy if self.busy else 0.0
        return (f"{share:.0%} of the busy CPU time stolen by the host "
                f"(budgets x{self.slowdown:.2f}, pid {os.getpid()})")
