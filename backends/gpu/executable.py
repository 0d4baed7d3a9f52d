"""A compiled cluster on the GPU: device buffers, a memory plan and the launches of its thunks.

    outs = exe.run([x, y])      # NumPy or device arrays in, CuPy arrays out

Temps live in one CuPy allocation per memory-plan slot (Buffer.slot), made once and
reused by every run; constants are uploaded once; outputs are fresh arrays from CuPy's
memory pool each run (the pool recycles them once the caller drops them). Kernels are
launched on the current stream with their buffers' addresses and the outer extent n0.
Check thunks run a device-side check that sets a flag; `finish()` reads the flags when
the run synchronizes and raises InvalidInputError with the check's message (a failed
check never lets a kernel read out of bounds: gather indices are clamped in the kernel).

`launch(inputs, outs)` enqueues everything without synchronizing, into preallocated
outputs when given: the CUDA graph capture of a whole run (graphs.py) uses it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.backends.gpu import device, library, source, split

from autoclust.errors import InvalidInputError
from autoclust.kernel import ir as kir

CHECK_BLOCK = 128


class Executable:
    """run(inputs in graph.inputs order) -> device outputs in graph.outputs order."""

    def __init__(self, program: kir.Program, rendered: source.Rendered, module: Any,
                 allow_tf32: bool = False):
        cp = device.cupy()
        self.cp = cp
        self.program = program
        self.rendered = rendered
        self.module = module
        self.dumps: dict[str, str] = {}
        self.num_kernels = sum(1 for t in program.thunks if not isinstance(t, kir.Check))
        self.buffers = {b.id: b for b in program.buffers}
        self._arrays: list[Any] = [None] * (max(self.buffers, default=-1) + 1)
        self._allocate_fixed()
        self._messages = [t.message for t in program.thunks if isinstance(t, kir.Check)]
        self._flags = cp.zeros(max(1, len(self._messages)), dtype=cp.int32)
        self._sm = device.info().sm_count
        self._workspaces: list[Any] = []  # split-row kernels' counters and partials
        self.capturable = True
        self._steps: list[Callable[[list], None]] = []
        slot = 0
        for i, t in enumerate(program.thunks):
            if isinstance(t, kir.Kernel):
                if not t.empty:
                    self._steps.append(self._kernel_step(t))
            elif isinstance(t, kir.Check):
                self._steps.append(self._check_step(i, t, slot))
                slot += 1
            else:
                step, capturable = library.make_step(t, self.buffers, allow_tf32)
                self._steps.append(step)
                self.capturable = self.capturable and capturable
        self._handout = []
        seen: set[int] = set()
        for bid in program.outputs:
            self._handout.append((bid, self.buffers[bid].role != "output" or bid in seen))
            seen.add(bid)
        self._lock = threading.Lock()

    def _allocate_fixed(self) -> None:
        cp = self.cp
        slot_bytes: dict[int, int] = {}
        for b in self.program.buffers:
            if b.role == "temp":
                n = b.size * np.dtype(b.dtype).itemsize
                slot_bytes[b.slot] = max(slot_bytes.get(b.slot, 0), n)
        # 256-byte aligned allocations: every view starts at offset 0, so vector loads apply
        slots = {s: cp.empty(max(n, 1), dtype=cp.uint8) for s, n in slot_bytes.items()}
        for b in self.program.buffers:
            if b.role == "temp":
                n = b.size * np.dtype(b.dtype).itemsize
                self._arrays[b.id] = slots[b.slot][:n].view(b.dtype).reshape(b.shape)
            elif b.role == "const":
                host = np.ascontiguousarray(self.program.constants[b.id], dtype=b.dtype)
                self._arrays[b.id] = cp.asarray(host.reshape(b.shape))
        self._slots = slots

    # ---- steps ---------------------------------------------------------------------------
    def _kernel_step(self, t: kir.Kernel) -> Callable[[list], None]:
        e = self.rendered.kernels[t.name]
        fn = self.module.get_function(e.symbol)
        n0 = int(t.shape[0])
        grid, block = (e.launch.grid(n0, self._sm),), (e.launch.block,)
        ids = e.args
        extra = []
        if e.launch.strategy == "split-row":  # counters zeroed once; each launch resets them
            ws = self.cp.zeros(split.workspace_bytes(t, e.launch, n0), dtype=self.cp.uint8)
            self._workspaces.append(ws)
            extra.append(ws.data.ptr)

        def step(arrays: list) -> None:
            fn(grid, block, [arrays[b].data.ptr for b in ids] + [n0] + extra)

        return step

    def _check_step(self, i: int, t: kir.Check, slot: int) -> Callable[[list], None]:
        fn = self.module.get_function(self.rendered.checks[i])
        count, start, stride = source.check_args(t, self.buffers[t.buf].size)
        grid = (max(1, min(-(-count // CHECK_BLOCK), 8 * self._sm)),)
        flags = self._flags

        def step(arrays: list) -> None:
            if count:
                fn(grid, (CHECK_BLOCK,), [arrays[t.buf].data.ptr, count, start, stride, t.lo,
                                          t.hi, flags.data.ptr, np.int32(slot)])

        return step

    # ---- running -------------------------------------------------------------------------
    def prepare(self) -> list[Any]:
        """Fresh device arrays for this run's outputs (graph.outputs order)."""
        cp = self.cp
        return [cp.empty(self.buffers[bid].shape, dtype=self.buffers[bid].dtype)
                for bid in self.program.outputs]

    def _bind_input(self, bid: int, x: Any) -> None:
        cp = self.cp
        x = device.to_device(x)
        b = self.buffers[bid]
        if x.dtype != np.dtype(b.dtype):
            x = x.astype(b.dtype)
        if not x.flags.c_contiguous:
            x = cp.ascontiguousarray(x)
        self._arrays[bid] = x.reshape(b.shape)

    def launch(self, inputs: list[Any], outs: list[Any] | None = None) -> list[Any]:
        """Enqueue one run (no synchronization); outputs go into `outs` when given."""
        arrays = self._arrays
        outs = self.prepare() if outs is None else outs
        for bid, x in zip(self.program.inputs, inputs):
            self._bind_input(bid, x)
        for (bid, copy), y in zip(self._handout, outs):
            if not copy:
                arrays[bid] = y
        if self._messages:
            self._flags.fill(0)
        for step in self._steps:
            step(arrays)
        for (bid, copy), y in zip(self._handout, outs):
            if copy:
                self.cp.copyto(y, arrays[bid])
        for bid in self.program.inputs:
            arrays[bid] = None  # do not keep the caller's arrays alive
        for b in self.program.buffers:
            if b.role == "output":
                arrays[b.id] = None
        return outs

    def finish(self) -> None:
        """Synchronize on the check flags; InvalidInputError naming the first failed check."""
        if not self._messages:
            return
        flags = self._flags.get()
        for message, bad in zip(self._messages, flags):
            if bad:
                raise InvalidInputError(message)

    def run(self, inputs: list[Any]) -> list[Any]:
        """Run the cluster: device arrays out (CuPy), in graph.outputs order."""
        with self._lock:
            outs = self.launch(inputs)
            self.finish()
            return outs
