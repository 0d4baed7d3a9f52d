"""A compiled cluster: buffers, a memory plan and the calls that run its thunks.

Buffer pointers live in one ctypes array that every kernel receives; a run only writes
the input and output slots, then makes one ctypes call per kernel (CFUNCTYPE releases
the GIL). Temps live in slots allocated once; outputs are fresh arrays every run. Check
thunks (index ranges, integer divisors) run in NumPy before the kernels that rely on them
and raise InvalidInputError naming the node.

Large kernels are split over threads by `Splitter`: the outer loop is cut into chunks that
the calling thread and `threads - 1` helper threads claim from a shared counter. The
caller never waits for a helper to start, only for chunks a helper has already claimed.
Measured on the loaded 2-core build machine, a libgomp region (`k.par`) cost 4-8 ms per
kernel because its end barrier waits until the OS schedules the second thread; the
claim-based split costs the caller ~10 us and degrades to one thread when no core is free.
"""

from __future__ import annotations

import ctypes
import itertools
import queue
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from autoclust import kernel_ir as kir
from autoclust.errors import InvalidInputError

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class _Job:
    """One split kernel call: chunks claimed from a counter, finished ones counted down."""

    __slots__ = ("bounds", "bufs", "claim", "done", "error", "fn", "left", "lock")

    def __init__(self, fn: Callable, bufs: int, bounds: Sequence[tuple[int, int]]):
        self.fn, self.bufs, self.bounds = fn, bufs, bounds
        self.claim = itertools.count().__next__  # atomic under the GIL
        self.left = len(bounds)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        ran = 0  # chunks claimed here; a failed one counts as finished so nobody waits forever
        try:
            while True:
                i = self.claim()
                if i >= len(self.bounds):
                    break
                ran += 1
                self.fn(self.bufs, *self.bounds[i])
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by Splitter.run
            self.error = exc
        finally:
            if ran:
                with self.lock:
                    self.left -= ran
                    if self.left == 0:
                        self.done.set()


class Splitter:
    """Runs kernels split along their outer loop on the caller plus helper threads."""

    def __init__(self, helpers: int):
        self.helpers = helpers
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        for i in range(helpers):
            threading.Thread(target=self._serve, name=f"autoclust-cpu-{i}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get().work()  # a job finished before this thread woke claims nothing

    def run(self, fn: Callable, bufs: int, bounds: Sequence[tuple[int, int]]) -> None:
        """fn(bufs, start, stop) for every (start, stop) in bounds, on all threads."""
        job = _Job(fn, bufs, bounds)
        for _ in range(min(self.helpers, len(bounds) - 1)):
            self._jobs.put(job)
        job.work()
        if job.left:
            job.done.wait()
        if job.error is not None:
            raise job.error


_SPLITTERS: dict[int, Splitter] = {}
_SPLITTERS_LOCK = threading.Lock()


def splitter(threads: int) -> Splitter:
    """The process-wide Splitter with threads - 1 helpers (created on first use)."""
    with _SPLITTERS_LOCK:
        if threads not in _SPLITTERS:
            _SPLITTERS[threads] = Splitter(max(threads - 1, 0))
        return _SPLITTERS[threads]


def chunk_bounds(n0: int, work: int, threads: int, min_chunk_work: int) -> list[tuple[int, int]]:
    """Split range(n0) into up to 4 chunks per thread, each of at least min_chunk_work."""
    count = max(1, min(n0, 4 * threads, work // max(min_chunk_work, 1)))
    edges = [n0 * i // count for i in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


class Executable:
    """run(inputs in graph.inputs order) -> outputs in graph.outputs order."""

    def __init__(self, program: kir.Program, addrs: dict[str, int], parallel: set[str],
                 threads: int, engine: object, dumps: dict[str, str], library: object = None,
                 min_chunk_work: int = 1 << 16, use_gomp: bool = False):
        self.program = program
        constants = program.constants
        self.engine = engine  # keeps the code alive
        self.dumps = dumps
        self.num_kernels = sum(1 for t in program.thunks if not isinstance(t, kir.Check))
        self.buffers = {b.id: b for b in program.buffers}
        self._lock = threading.Lock()
        self._ptrs = (ctypes.c_void_p * max(1, len(program.buffers)))()
        self._ptrs_addr = ctypes.addressof(self._ptrs)
        self._arrays: list[np.ndarray | None] = [None] * len(program.buffers)
        # Kernels sharing code (Program.sharing) get their own pointer array: kernel ->
        # (function, buffer ids in the function's slot order). _set keeps them current.
        self._bindings = program.sharing
        self._site_slots: dict[int, list[tuple[ctypes.Array, int]]] = {}
        self._sites: list[ctypes.Array] = []  # keeps the per-kernel arrays alive
        self._library = library
        self._fixed(constants)
        self._constants = constants
        self._min_chunk_work = min_chunk_work
        self._use_gomp = use_gomp
        self.split: set[str] = set()  # kernels split over threads (names)
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
        addr = _address(arr)
        self._ptrs[bid] = addr
        for site, j in self._site_slots.get(bid, ()):
            site[j] = addr

    def _entry(self, name: str) -> tuple[str, int]:
        """(function name, address of its pointer array) for kernel `name`."""
        if name not in self._bindings:
            return name, self._ptrs_addr
        fn_name, ids = self._bindings[name]
        site = (ctypes.c_void_p * max(1, len(ids)))()
        for j, bid in enumerate(ids):
            site[j] = self._ptrs[bid]
            self._site_slots.setdefault(bid, []).append((site, j))
        self._sites.append(site)
        return fn_name, ctypes.addressof(site)

    def _step(self, t: kir.Thunk, addrs: dict[str, int], parallel: set[str],
              threads: int) -> Callable[[], None] | None:
        if isinstance(t, kir.Kernel):
            if t.empty:
                return None
            n0 = t.shape[0]
            fn_name, bufs = self._entry(t.name)
            if t.name in parallel and self._use_gomp:
                self.split.add(t.name)
                fn = KERNEL_FN(addrs[f"{fn_name}.par"])
                return lambda: fn(bufs, n0, threads)
            fn = KERNEL_FN(addrs[fn_name])
            bounds = chunk_bounds(n0, t.work, threads, self._min_chunk_work)
            if t.name in parallel and len(bounds) > 1:
                self.split.add(t.name)
                run = splitter(threads).run
                return lambda: run(fn, bufs, bounds)
            return lambda: fn(bufs, 0, n0)
        if isinstance(t, kir.Check):
            return self._check_step(t)
        return self._library_step(t, threads, self._constants)

    def _check_step(self, t: kir.Check) -> Callable[[], None]:
        arrays = self._arrays

        def check() -> None:
            x = arrays[t.buf]
            if t.column is not None:
                x = x.reshape(-1)[t.column[0]::t.column[1]]
            if not x.size:
                return
            if t.kind == "nonzero":
                bad = not x.all()
            else:
                bad = x.min() < t.lo or x.max() > t.hi
            if bad:
                raise InvalidInputError(t.message)

        return check

    def _library_step(self, t: kir.LibraryCall, threads: int,
                      constants: dict[int, np.ndarray]) -> Callable[[], None]:
        fn = self._library.make_call_for(t, self.program.buffers, threads, constants)
        arrays = self._arrays
        ins, outs = t.inputs, t.outputs
        return lambda: fn([None if b is None else arrays[b] for b in ins],
                          [arrays[b] for b in outs])

    def _output_array(self, b: kir.Buffer) -> np.ndarray:
        """The last run's output array when nobody else holds it any more, else a new one.

        A new 64 MB array page-faults on first touch (~15 ms of a 40 ms GELU run); an array
        the caller has dropped is safe to refill. References when dropped: our slot, `old`
        and getrefcount's argument. A view the caller kept counts too (its .base).
        """
        old = self._arrays[b.id]
        if old is not None and sys.getrefcount(old) == 3 and old.shape == tuple(b.shape):
            return old
        return np.empty(b.shape, b.dtype)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run the cluster; outputs are arrays the caller owns (reused once it drops them)."""
        with self._lock:
            for bid, x in zip(self.program.inputs, inputs):
                # not np.ascontiguousarray: it turns 0-d arrays into shape (1,)
                self._set(bid, x if x.flags.c_contiguous else np.ascontiguousarray(x))
            for b in self._outputs:
                self._set(b.id, self._output_array(b))
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
