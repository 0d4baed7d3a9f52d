"""A compiled cluster on the GPU: device buffers, a memory plan and the launches of its thunks.

    outs = exe.run([x, y])      # NumPy or device arrays in, CuPy arrays out

Temps live in one CuPy allocation per memory-plan slot (Buffer.slot); with the split-row
workspaces and the check flags they form a stream's Scratch, made at the stream's first
run and reused by every later run on it: runs on two streams at once never share memory
(a run on one stream is ordered by the stream). Constants are uploaded once; outputs are
fresh arrays from CuPy's memory pool each run (the pool recycles them once the caller
drops them). Kernels are launched on the current stream with their buffers' addresses and
the outer extent n0. Check thunks run a device-side check that sets a flag; `finish()`
reads the flags when the run synchronizes and raises InvalidInputError with the check's
message (a failed check never lets a kernel read out of bounds: gather indices are
clamped in the kernel).

`launch(inputs, outs)` enqueues everything without synchronizing, into preallocated
outputs when given: the CUDA graph capture of a whole run (graphs.py) uses it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.backends.gpu import conv, device, library, source, split

from autoclust.errors import InvalidInputError
from autoclust.kernel import ir as kir

CHECK_BLOCK = 128


class Scratch:
    """One stream's memory of an executable: the memory-plan slots holding its temps, the
    split-row kernels' workspaces (counters zeroed once) and the check flags. Two streams
    running the same executable at once must not share them."""

    def __init__(self, exe: Executable):
        cp = exe.cp
        slot_bytes: dict[int, int] = {}
        temps = [b for b in exe.program.buffers if b.role == "temp"]
        for b in temps:
            n = b.size * np.dtype(b.dtype).itemsize
            slot_bytes[b.slot] = max(slot_bytes.get(b.slot, 0), n)
        # 256-byte aligned allocations: every view starts at offset 0, so vector loads apply
        self.slots = {s: cp.empty(max(n, 1), dtype=cp.uint8) for s, n in slot_bytes.items()}
        self.arrays = list(exe.consts)
        for b in temps:
            n = b.size * np.dtype(b.dtype).itemsize
            self.arrays[b.id] = device.view(self.slots[b.slot][:n], b.dtype, b.shape)
        self.workspaces = {i: cp.zeros(n, dtype=cp.uint8) for i, n in exe.workspace_bytes.items()}
        self.flags = cp.zeros(max(1, len(exe.messages)), dtype=cp.int32)


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
        self.consts: list[Any] = [None] * (max(self.buffers, default=-1) + 1)
        for b in program.buffers:
            if b.role == "const":
                host = np.ascontiguousarray(program.constants[b.id], dtype=b.dtype)
                self.consts[b.id] = device.to_device(host.reshape(b.shape), count=False)
        self.messages = [t.message for t in program.thunks if isinstance(t, kir.Check)]
        self._sm = self.sm_count = device.info().sm_count
        self.choices: list[conv.Choice] = []  # steps choosing their implementation by timing
        self.workspace_bytes: dict[int, int] = {}  # thunk index -> split-row workspace bytes
        self.uncapturable = ""  # why a CUDA graph cannot capture a run ('' when it can)
        self._steps: list[Callable[[list, Scratch], None]] = []
        slot = 0
        for i, t in enumerate(program.thunks):
            if isinstance(t, kir.Kernel):
                if not t.empty:
                    self._steps.append(self._kernel_step(i, t))
            elif isinstance(t, kir.Check):
                self._steps.append(self._check_step(i, t, slot))
                slot += 1
            elif isinstance(t, kir.LibraryCall) and t.op == "Conv":
                choice = conv.make_step(self, i, t, allow_tf32)
                self.choices.append(choice)
                self._steps.append(choice)
            elif i in rendered.calls:  # a library call rendered as a kernel (attention)
                self._steps.append(self._call_step(rendered.calls[i]))
            else:
                step, why = library.make_step(t, self.buffers, allow_tf32)
                self._steps.append(lambda arrays, scratch, step=step: step(arrays))
                self.uncapturable = self.uncapturable or why
        self._handout = []
        seen: set[int] = set()
        for bid in program.outputs:
            self._handout.append((bid, self.buffers[bid].role != "output" or bid in seen))
            seen.add(bid)
        self._scratch: dict[int, Scratch] = {}
        self._scratch_lock = threading.Lock()
        self._lock = threading.Lock()

    @property
    def capturable(self) -> bool:
        """Whether a CUDA graph can capture a run now (a Conv still timing its choices, or
        run in onnxruntime, cannot be)."""
        return not self.uncapturable and all(c.chosen == "gpu" for c in self.choices)

    @property
    def pending(self) -> bool:
        """Whether a step is still choosing its implementation (capture may come later)."""
        return any(not c.chosen for c in self.choices)

    @property
    def notes(self) -> list[str]:
        """What the timed choices decided (or that they are still timing)."""
        return [c.reason for c in self.choices]

    def scratch(self, stream: int) -> Scratch:
        """The scratch memory of `stream` (allocated at its first use: a capture makes its
        stream's before it begins)."""
        s = self._scratch.get(stream)
        if s is None:
            with self._scratch_lock:
                s = self._scratch.get(stream)
                if s is None:
                    s = self._scratch[stream] = Scratch(self)
        return s

    # ---- steps ---------------------------------------------------------------------------
    def _kernel_step(self, i: int, t: kir.Kernel) -> Callable[[list, Scratch], None]:
        e = self.rendered.kernels[t.name]
        fn = self.module.get_function(e.symbol)
        n0 = int(t.shape[0])
        grid, block = (e.launch.grid(n0, self._sm),), (e.launch.block,)
        ids = e.args
        if e.launch.strategy == "split-row":  # counters zeroed once; each launch resets them
            self.workspace_bytes[i] = split.workspace_bytes(t, e.launch, n0)

            def split_step(arrays: list, scratch: Scratch) -> None:
                fn(grid, block, [arrays[b].data.ptr for b in ids]
                   + [n0, scratch.workspaces[i].data.ptr])

            return split_step

        def step(arrays: list, scratch: Scratch) -> None:
            fn(grid, block, [arrays[b].data.ptr for b in ids] + [n0])

        return step

    def _call_step(self, entry: source.CallEntry) -> Callable[[list, Scratch], None]:
        fn = self.module.get_function(entry.symbol)
        grid, block = (entry.grid(self._sm),), (entry.block,)
        ids = entry.args

        def step(arrays: list, scratch: Scratch) -> None:
            fn(grid, block, [arrays[b].data.ptr for b in ids])

        return step

    def _check_step(self, i: int, t: kir.Check, slot: int) -> Callable[[list, Scratch], None]:
        fn = self.module.get_function(self.rendered.checks[i])
        count, start, stride = source.check_args(t, self.buffers[t.buf].size)
        grid = (max(1, min(-(-count // CHECK_BLOCK), 8 * self._sm)),)

        def step(arrays: list, scratch: Scratch) -> None:
            if count:
                fn(grid, (CHECK_BLOCK,), [arrays[t.buf].data.ptr, count, start, stride, t.lo,
                                          t.hi, scratch.flags.data.ptr, np.int32(slot)])

        return step

    # ---- running -------------------------------------------------------------------------
    def prepare(self) -> list[Any]:
        """Fresh device arrays for this run's outputs (graph.outputs order)."""
        return [device.empty(self.buffers[bid].shape, self.buffers[bid].dtype)
                for bid in self.program.outputs]

    def _bound(self, bid: int, x: Any) -> Any:
        x = device.to_device(x)
        b = self.buffers[bid]
        if x.dtype != np.dtype(device.host_dtype(b.dtype)):
            x = device.astype(x, b.dtype)
        if not x.flags.c_contiguous:
            x = x.copy()
        return x.reshape(b.shape)

    def launch(self, inputs: list[Any], outs: list[Any] | None = None) -> list[Any]:
        """Enqueue one run on the current stream, with that stream's scratch memory (no
        synchronization); outputs go into `outs` when given."""
        scratch = self.scratch(self.cp.cuda.get_current_stream().ptr)
        arrays = list(scratch.arrays)  # this run's binding: constants, temps, then ...
        outs = self.prepare() if outs is None else outs
        for bid, x in zip(self.program.inputs, inputs):
            arrays[bid] = self._bound(bid, x)
        for (bid, copy), y in zip(self._handout, outs):
            if not copy:
                arrays[bid] = y
        if self.messages:
            scratch.flags.fill(0)
        for step in self._steps:
            step(arrays, scratch)
        for (bid, copy), y in zip(self._handout, outs):
            if copy:
                device.copyto(y, arrays[bid])
        return outs

    def finish(self, stream: int | None = None) -> None:
        """Synchronize on the check flags of the run on `stream` (the current stream);
        InvalidInputError naming the first failed check."""
        if not self.messages:
            return
        if stream is None:
            stream = self.cp.cuda.get_current_stream().ptr
        flags = self.scratch(stream).flags.get()
        for message, bad in zip(self.messages, flags):
            if bad:
                raise InvalidInputError(message)

    def run(self, inputs: list[Any]) -> list[Any]:
        """Run the cluster: device arrays out (CuPy), in graph.outputs order."""
        with self._lock:  # a second thread on this stream would reset the flags before
            outs = self.launch(inputs)  # this run reads them
            self.finish()
            return outs
