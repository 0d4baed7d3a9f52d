"""A compiled cluster: buffers, a memory plan and the calls that run its thunks.

Buffer pointers live in one ctypes array that every kernel receives; a run only writes
the input and output slots, then makes one ctypes call per kernel (CFUNCTYPE releases
the GIL). Temps live in slots allocated once; outputs are fresh arrays every run.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np

from autoclust import kernel_ir as kir
from autoclust import ops

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Executable:
    """run(inputs in graph.inputs order) -> outputs in graph.outputs order."""

    def __init__(self, program: kir.Program, addrs: dict[str, int], parallel: set[str],
                 threads: int, engine: object, dumps: dict[str, str],
                 constants: dict[int, np.ndarray], library: object = None):
        self.program = program
        self.engine = engine  # keeps the code alive
        self.dumps = dumps
        self.num_kernels = len(program.thunks)
        self.buffers = {b.id: b for b in program.buffers}
        self._lock = threading.Lock()
        self._ptrs = (ctypes.c_void_p * max(1, len(program.buffers)))()
        self._ptrs_addr = ctypes.addressof(self._ptrs)
        self._arrays: list[np.ndarray | None] = [None] * len(program.buffers)
        self._library = library
        self._fixed(constants)
        self._constants = constants
        self._steps = [self._step(t, addrs, parallel, threads) for t in program.thunks]
        self._steps = [s for s in self._steps if s is not None]
        self._outputs = [b for b in program.buffers if b.role == "output"]

    def _fixed(self, constants: dict[int, np.ndarray]) -> None:
        slot_bytes: dict[int, int] = {}
        for b in self.program.buffers:
            if b.role == "temp":
                nbytes = b.size * np.dtype(b.dtype).itemsize
                slot_bytes[b.slot] = max(slot_bytes.get(b.slot, 0), nbytes)
        self._slots = {s: np.empty(max(n, 1), np.uint8) for s, n in slot_bytes.items()}
        for b in self.program.buffers:
            if b.role == "temp":
                nbytes = b.size * np.dtype(b.dtype).itemsize
                arr = self._slots[b.slot][:nbytes].view(b.dtype).reshape(b.shape)
                self._set(b.id, arr)
            elif b.role == "const":
                self._set(b.id, np.ascontiguousarray(constants[b.id]).reshape(b.shape))

    def _set(self, bid: int, arr: np.ndarray) -> None:
        self._arrays[bid] = arr
        self._ptrs[bid] = _address(arr)

    def _step(self, t: kir.Thunk, addrs: dict[str, int], parallel: set[str],
              threads: int) -> Callable[[], None] | None:
        if isinstance(t, kir.Kernel):
            if any(d == 0 for d in t.shape):
                return None
            n0, bufs = t.shape[0], self._ptrs_addr
            if t.name in parallel:
                fn = KERNEL_FN(addrs[f"{t.name}.par"])
                return lambda: fn(bufs, n0, threads)
            fn = KERNEL_FN(addrs[t.name])
            return lambda: fn(bufs, 0, n0)
        if isinstance(t, kir.LibraryCall) and self._library is not None:
            return self._library_step(t, threads, self._constants)
        return lambda: self._reference(t)

    def _library_step(self, t: kir.LibraryCall, threads: int,
                      constants: dict[int, np.ndarray]) -> Callable[[], None]:
        fn = self._library.make_call_for(t, self.program.buffers, threads, constants)
        arrays = self._arrays
        ins, outs = t.inputs, t.outputs
        return lambda: fn([None if b is None else arrays[b] for b in ins],
                          [arrays[b] for b in outs])

    def _reference(self, t: kir.LibraryCall | kir.RefCall) -> None:
        args = [None if b is None else self._arrays[b] for b in t.inputs]
        domain = getattr(t, "domain", "")
        with np.errstate(all="ignore"):
            results = ops.get(t.op, domain).ref(args, dict(t.attrs))
        for b, r in zip(t.outputs, results):
            np.copyto(self._arrays[b], np.asarray(r).reshape(self.buffers[b].shape),
                      casting="unsafe")

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run the cluster; outputs are fresh arrays."""
        with self._lock:
            for bid, x in zip(self.program.inputs, inputs):
                # not np.ascontiguousarray: it turns 0-d arrays into shape (1,)
                self._set(bid, x if x.flags.c_contiguous else np.ascontiguousarray(x))
            for b in self._outputs:
                self._set(b.id, np.empty(b.shape, b.dtype))
            for step in self._steps:
                step()
            outs, handed = [], set()
            for bid in self.program.outputs:
                arr = self._arrays[bid]
                if self.buffers[bid].role != "output" or bid in handed:
                    arr = np.array(arr, copy=True)
                handed.add(bid)
                outs.append(arr)
            for bid in self.program.inputs:
                self._arrays[bid] = None  # do not keep the caller's arrays alive
            return outs
