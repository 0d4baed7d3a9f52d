"""A compiled cluster: buffers, a memory plan and the calls that run its thunks.

Buffer pointers live in one ctypes array that every kernel receives; a run only writes
the input and output slots, then makes one ctypes call per kernel (CFUNCTYPE releases
the GIL). Temps live in slots allocated once; outputs are fresh arrays every run. Check
thunks (index ranges, integer divisors) run in NumPy before the kernels that rely on them
and raise InvalidInputError naming the node.

Large kernels are split over threads: the outer loop is cut into chunks that the calling
thread and `threads - 1` helper threads claim from a shared counter -- native helpers
(pool.py; the split is then one more step of the native driver) where the platform
allows, else `Splitter`'s Python helpers (`--cpu_helpers=python`). The caller never waits
for a helper to start, only for chunks a helper has already claimed. Measured on the
loaded 2-core build machine, a libgomp region cost 4-8 ms per kernel because its end
barrier waits until the OS schedules the second thread; the claim-based split costs the
caller ~10 us through Python helpers (two wake-ups: their queue, then the GIL) and a few
microseconds through native ones, and degrades to one thread when no core is free.
Consecutive native steps (unsplit kernels and generated GEMMs) run through one call of
a small native driver, so a small cluster costs one ctypes call, not one per kernel.
With `--cpu_allow_spinning` (the default) the native helpers poll for the next split at
SCHED_IDLE while a run is in progress instead of sleeping between splits
(`pool.NativePool.linger`); a plan calling oneDNN runs its splits on the default helpers.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from autoclust.backends.cpu import gemm as gemm_code
from autoclust.backends.cpu import pool
from autoclust.backends.cpu.codegen import GUARD_SIZES

from autoclust.errors import InvalidInputError, OutOfBoundsError
from autoclust.kernel import ir as kir

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
# The native driver: driver(fns, bufs, bounds, count) calls fns[i](bufs[i], bounds[2i],
# bounds[2i + 1]) for i < count, so a run of native steps costs one ctypes call.
DRIVER_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_int64)
# The same driver called without releasing the GIL. Releasing and retaking it costs
# 0.2-1 us per ctypes call on the loaded 2-core machines (measured: three calls of libc
# labs took 0.4-1.3 us through CFUNCTYPE, 0.44 us through PYFUNCTYPE), more than a small
# cluster's kernels take; holding the GIL for a few microseconds costs other threads little.
DRIVER_FN_GIL = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_int64)
# Runs of native steps with less work than this (Thunk.work units: about one element or
# multiply-add each, a few microseconds in all) keep the GIL.
GIL_HELD_WORK = 1 << 16
PARALLEL_FLOPS = 1 << 20  # generated GEMMs split over threads from 4x this many flops


class Native(NamedTuple):
    """A native step: fn(bufs, start, stop), run by the driver with its neighbours."""

    fn: int
    bufs: int
    start: int
    stop: int
    work: int = GIL_HELD_WORK  # unknown work counts as too much to hold the GIL for


def as_call(step: Native | Callable[[], None]) -> Callable[[], None]:
    """A step as a call of its own (a Native one through ctypes, not the driver)."""
    if isinstance(step, Native):
        return functools.partial(KERNEL_FN(step.fn), step.bufs, step.start, step.stop)
    return step


def group_native(steps: list, keep: list) -> list[Callable[[], None]]:
    """Runs of consecutive Native steps become one driver call; other steps stay."""
    from autoclust.backends.cpu import jit
    out: list[Callable[[], None]] = []
    run: list[Native] = []

    def flush() -> None:
        if not run:
            return
        n = len(run)
        fns = (ctypes.c_void_p * n)(*[r.fn for r in run])
        bufs = (ctypes.c_void_p * n)(*[r.bufs for r in run])
        bounds = (ctypes.c_int64 * (2 * n))(*[v for r in run for v in (r.start, r.stop)])
        keep.extend((fns, bufs, bounds))
        small = sum(r.work for r in run) < GIL_HELD_WORK
        driver = (DRIVER_FN_GIL if small else DRIVER_FN)(jit.driver_address(pool.cache_dir()))
        args = (ctypes.addressof(fns), ctypes.addressof(bufs), ctypes.addressof(bounds), n)
        out.append(functools.partial(driver, *args))  # no Python frame per run
        run.clear()

    for step in steps:
        if isinstance(step, Native):
            run.append(step)
        else:
            flush()
            out.append(step)
    flush()
    return out


_refcount = sys.getrefcount


def _nothing(*args: object) -> None:
    """A library module without the run gate (background.gate)."""


_char_at = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def _address(a: np.ndarray) -> int:
    """The address of a's first byte.

    Through the buffer protocol (~0.3 us) where NumPy allows it (writable, C-contiguous,
    not empty); __array_interface__ (~1.5 us: it builds a dict) otherwise.
    """
    try:
        return _addressof(_char_at(a))
    except (TypeError, ValueError, BufferError):
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
_PENDING = object()  # Executable._plan_trial before the whole plan's library trial
PLAN_ELSEWHERE = 64  # runs at other shapes that end a library trial unfinished
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


class Arena:
    """Memory-plan slots shared by the Executables bound from one compiled program with
    symbolic dims (backends/cpu Parametric): each slot is grown to the largest binding's
    need, and `generation` counts the growths (a binding re-points its temps after one).
    Bindings sharing an arena run one at a time (`lock`)."""

    def __init__(self):
        self.slots: dict[int, np.ndarray] = {}
        self.generation = 0
        self.lock = threading.Lock()

    def reserve(self, nbytes: dict[int, int]) -> None:
        """Make every slot s hold at least nbytes[s] bytes."""
        for s, n in nbytes.items():
            have = self.slots.get(s)
            if have is None or have.nbytes < n:
                self.slots[s] = np.empty(max(n, 1), np.uint8)
                self.generation += 1


class Executable:
    """run(inputs in graph.inputs order) -> outputs in graph.outputs order.

    A program with symbolic dims is bound to their values first (Parametric.bind): `dims`
    gives, per kernel, the values its code reads after its buffer pointers; `arena` holds
    the temps shared with the other bindings; `impls` the library implementation to
    use per library thunk (by position), chosen by an earlier binding.
    """

    def __init__(self, program: kir.Program, addrs: dict[str, int], parallel: dict[str, int],
                 threads: int, engine: object, dumps: dict[str, str], library: object = None,
                 min_chunk_work: int = 1 << 16, gemms: dict | None = None,
                 check_bounds: bool = False, dims: dict[str, tuple[int, ...]] | None = None,
                 arena: Arena | None = None, impls: dict[int, str] | None = None,
                 helpers: str = "native", fast_math: bool = False, spinning: bool = False,
                 packed_gemm: str = "epilogues"):
        self.program = program
        # Code's fields: --cpu_helpers, --fast_math, --cpu_allow_spinning, --cpu_packed_gemm
        self._helpers, self._fast_math, self._spinning, self._packed_gemm = \
            helpers, fast_math, spinning, packed_gemm
        self._init_polling()
        constants = program.constants
        self.engine, self.dumps = engine, dumps  # the engine keeps the code alive
        self.buffers = {b.id: b for b in program.buffers}
        self._arena = arena if arena is not None else Arena()
        self._lock, self._dims, self._impls = self._arena.lock, dims or {}, impls or {}
        self.library_fns: dict[int, Callable] = {}  # library thunk index -> its call
        self._ptrs = (ctypes.c_void_p * max(1, len(program.buffers)))()
        self._ptrs_addr = ctypes.addressof(self._ptrs)
        self._arrays: list[np.ndarray | None] = [None] * len(program.buffers)
        # Kernels sharing code (Program.sharing) get their own pointer array: kernel ->
        # (function, buffer ids in the function's slot order). _set keeps them current.
        self._bindings = program.sharing
        self._site_slots: dict[int, list[tuple[ctypes.Array, int]]] = {}
        self._sites: list[ctypes.Array] = []  # keeps the per-kernel arrays alive
        # --check_bounds: kernel name -> (its buffers, its guard array; codegen.GUARD_SIZES)
        self._guards: dict[str, tuple[tuple[int, ...], np.ndarray]] = {}
        self._check_bounds, self._library = check_bounds, library
        self._fresh = True  # the first run holds background work back (background.foreground)
        self._plan_trial, self._trial_lock = _PENDING, threading.Lock()  # inplan.PlanTrial
        self._gate(library)
        self._fixed(constants)
        self._constants, self._min_chunk_work = constants, min_chunk_work
        self.split: set[str] = set()  # kernels split over threads (names)
        self._gemms = dict(gemms or {})  # thunk index -> (function name, spec)
        # (thunk, step) for `profile`: the same steps one by one, without the driver; a
        # library call's epilogue kernel, when run after the call, is a step of its own
        self._ungrouped: list[tuple[kir.Thunk, Native | Callable[[], None]]] = []
        for i, t in enumerate(program.thunks):
            if isinstance(t, kir.LibraryCall) and t.epilogue is not None:
                self._ungrouped += self._with_epilogue(i, t, addrs, parallel, threads)
                continue
            step = self._step(i, t, addrs, parallel, threads)
            if step is not None:
                self._ungrouped.append((t, step))
        self._steps = group_native([s for _, s in self._ungrouped], self._sites)
        # kernels and library calls run (an epilogue inside its call is not one of its own)
        self.num_kernels = sum(1 for t, _ in self._ungrouped if not isinstance(t, kir.Check))
        self._outputs = [b for b in program.buffers if b.role == "output"]
        self._output_specs = [(b.id, tuple(b.shape), np.dtype(b.dtype)) for b in self._outputs]
        self._input_ids = tuple(program.inputs)
        self._last_inputs: dict[int, weakref.ref] = {}
        # per graph output: (buffer, copy?) -- a copy when it is not an output buffer of its
        # own (an input or constant passed through) or an earlier output is the same buffer
        seen: set[int] = set()
        self._handout = []
        for bid in program.outputs:
            self._handout.append((bid, self.buffers[bid].role != "output" or bid in seen))
            seen.add(bid)

    def _gate(self, library: object) -> None:
        """A run waits while a GEMM measurement times on quiet cores: it holds the arena's
        lock, which background.quiet_cores takes."""
        getattr(library, "gate", _nothing)(self._arena)

    def settled(self) -> bool:
        """Whether background work that changes this executable's speed is done (prepacked
        GEMM weights), no call still tries two implementations and the whole plan's
        library trial is over (backends/cpu/inplan.py): autoclust/runtime/autotune.py
        times the executable only then."""
        return self._calls_settled() and self._plan_trial is None

    def _calls_settled(self) -> bool:
        """Weights prepacked, and no call in an in-plan trial of its own."""
        wait = getattr(self._library, "wait_background", None)
        trying = getattr(self._library, "in_trial", None)
        return (wait is None or wait(timeout=0)) and not (
            trying is not None and any(trying(fn) for fn in self.library_fns.values()))

    def _fixed(self, constants: dict[int, np.ndarray]) -> None:
        slot_bytes: dict[int, int] = {}
        for b in self.program.buffers:
            if b.role == "temp":
                nbytes = b.size * np.dtype(b.dtype).itemsize
                slot_bytes[b.slot] = max(slot_bytes.get(b.slot, 0), nbytes)
        self._slot_bytes = slot_bytes
        self._arena.reserve(slot_bytes)
        self._bind_temps()
        for b in self.program.buffers:
            if b.role == "const":
                self._set(b.id, np.ascontiguousarray(constants[b.id]).reshape(b.shape))

    def _bind_temps(self) -> None:
        """Point the temps at their arena slots (again after the arena grew)."""
        slots = self._arena.slots
        for b in self.program.buffers:
            if b.role == "temp":
                nbytes = b.size * np.dtype(b.dtype).itemsize
                self._set(b.id, slots[b.slot][:nbytes].view(b.dtype).reshape(b.shape))
        self._generation = self._arena.generation

    def _set(self, bid: int, arr: np.ndarray) -> None:
        self._arrays[bid] = arr
        addr = _address(arr)
        self._ptrs[bid] = addr
        for site, j in self._site_slots.get(bid, ()):
            site[j] = addr

    def _site(self, ids: tuple[int, ...], guard: np.ndarray | None = None,
              dims: tuple[int, ...] = ()) -> int:
        """Address of a pointer array holding buffers `ids` in order (kept current by _set),
        then `guard`'s address when given (--check_bounds), then the symbolic dims' values
        the kernel's code reads (codegen.KernelEmitter._wrapper)."""
        n = len(ids) + (guard is not None)
        site = (ctypes.c_void_p * max(1, n + len(dims)))()
        for j, bid in enumerate(ids):
            site[j] = self._ptrs[bid]
            self._site_slots.setdefault(bid, []).append((site, j))
        if guard is not None:
            site[len(ids)] = guard.ctypes.data
        for j, value in enumerate(dims):
            site[n + j] = value
        self._sites.append(site)
        return ctypes.addressof(site)

    def _entry(self, name: str) -> tuple[str, int]:
        """(function name, address of its pointer array) for kernel `name`; a kernel
        reading symbolic dims finds their values after its buffer pointers."""
        if name not in self._bindings:
            return name, self._ptrs_addr
        fn_name, ids = self._bindings[name]
        dims = self._dims.get(name, ())
        if not self._check_bounds:
            return fn_name, self._site(ids, None, dims)
        # one more slot: the guard array the checked code reports to (codegen._bounds)
        guard = np.zeros(GUARD_SIZES + len(ids), np.int64)
        guard[GUARD_SIZES:] = [self.buffers[b].size for b in ids]
        self._guards[name] = (ids, guard)
        return fn_name, self._site(ids, guard, dims)

    def _step(self, i: int, t: kir.Thunk, addrs: dict[str, int], parallel: dict[str, int],
              threads: int) -> Native | Callable[[], None] | None:
        if isinstance(t, kir.Kernel):
            if t.empty:
                return None
            fn_name, bufs = self._entry(t.name)
            return self._native(t.name, addrs[fn_name], bufs, t.shape[0],
                                parallel.get(t.name, t.work), t.name in parallel, threads)
        if isinstance(t, kir.Check):
            return self._check_step(t)
        return self._call_step(i, t, addrs, threads)[0]

    def _call_step(self, i: int, t: kir.LibraryCall, addrs: dict[str, int], threads: int,
                   epilogue_run: Callable[[], None] | None = None,
                   epilogue_step: Callable[[], None] | None = None
                   ) -> tuple[Native | Callable[[], None], bool]:
        """(step, whether it runs the call's epilogue too) of a library call."""
        gemm = self._gemms.get(i)
        if gemm is not None:  # generated code (GEMM, depthwise Conv) over rows or planes
            name, spec = gemm
            ids = tuple(b for b in t.inputs if b is not None) + t.outputs
            dense = isinstance(spec, gemm_code.GemmSpec)
            # a depthwise Conv's flops run ~4x slower than a GEMM's (no reuse across
            # channels): split from 1/4 the size (ConvNeXt's 7x7x768 stage: 3.7 Mflop)
            big = threads > 1 and spec.flops >= (4 if dense else 1) * PARALLEL_FLOPS \
                and spec.rows > 1
            desc = gemm_code.descriptor(spec) if dense else ()
            site = self._site(ids, None, desc)
            return self._native(name, addrs[name], site, spec.rows,
                                int(spec.flops // 2), big, threads), False
        fn = self._library.make_call_for(t, self.program.buffers, threads, self._constants,
                                         epilogue_run, impl=self._impls.get(i),
                                         fast_math=self._fast_math,
                                         packed_gemm=bool(self._packed_gemm),
                                         epilogue_step=epilogue_step
                                         if self._packed_gemm == "epilogues" else None)
        self.library_fns[i] = fn
        fused = getattr(fn, "fused", False)
        arrays = self._arrays
        ins = t.inputs + tuple(fn.extra) if fused else t.inputs
        outs = tuple(fn.dest) if fused else t.outputs
        return (lambda: fn([None if b is None else arrays[b] for b in ins],
                           [arrays[b] for b in outs])), fused

    def _with_epilogue(self, i: int, t: kir.LibraryCall, addrs: dict[str, int],
                       parallel: dict[str, int], threads: int) -> list[tuple]:
        """(thunk, step) pairs of a call with an epilogue (the i-th thunk): the call running
        it (packed.py's GEMM or, after the others, the epilogue's step; oneDNN post-ops),
        or the call and then the epilogue kernel."""
        k = t.epilogue
        epi = self._step(i, k, addrs, parallel, threads)
        probe = None
        if epi is not None and i not in self._gemms:
            probe = self._probe(k, addrs, parallel, threads)
        step, fused = self._call_step(i, t, addrs, threads, probe,
                                      None if epi is None else as_call(epi))
        if fused or epi is None:
            return [(t, step)]
        return [(t, step), (k, epi)]

    def _probe(self, k: kir.Kernel, addrs: dict[str, int], parallel: dict[str, int],
               threads: int) -> Callable[[], None]:
        """Kernel k on buffers of its own where the executable has none bound yet (inputs
        and outputs): library.make_call_for times it to choose where an epilogue runs."""
        fn_name, ids = self._bindings.get(k.name, (k.name, tuple(range(len(self._arrays)))))
        # what it stores goes to buffers of its own: the background thread may run it
        # between runs (packed_epilogue.Inline), when a bound buffer may hold what a run
        # handed out
        # and the slots of buffers it never touches point at one dummy (an unbound
        # kernel's site is the whole pointer array: zeros for every input and output of
        # the plan, per epilogue, cost a warm BERT-base process's first run 30 ms)
        stored = {s.buf for s in k.stores}
        used = stored | kir.loaded_buffers(k)
        dummy = np.zeros(16, np.float64)
        arrays = [dummy if b not in used else self._arrays[b]
                  if self._arrays[b] is not None and b not in stored else
                  np.zeros(self.buffers[b].shape, self.buffers[b].dtype) for b in ids]
        # the layout _site gives the kernel: buffers, the guard array (--check_bounds),
        # then the symbolic dims' values its code reads
        slots: list[int] = [_address(a) for a in arrays]
        guard = None
        if k.name in self._bindings:  # as _entry: else the whole pointer array, no more
            if self._check_bounds:
                guard = np.zeros(GUARD_SIZES + len(ids), np.int64)
                guard[GUARD_SIZES:] = [self.buffers[b].size for b in ids]
                slots.append(guard.ctypes.data)
            slots += list(self._dims.get(k.name, ()))
        site = (ctypes.c_void_p * max(1, len(slots)))(*slots)
        addr = ctypes.addressof(site)
        bounds = chunk_bounds(k.shape[0], parallel.get(k.name, k.work), threads,
                              self._min_chunk_work)
        # alive as long as the probe, the kernel's code too (the executable may go first)
        keep: list = [site, arrays, guard, self.engine]
        # split as the executable's own step will be
        step = self._split_step(addrs[fn_name], addr, bounds, 0, threads, keep) \
            if k.name in parallel and len(bounds) > 1 else \
            Native(addrs[fn_name], addr, 0, k.shape[0])
        run = as_call(step)

        def probe() -> None:
            run()

        probe.keep = keep  # type: ignore[attr-defined]
        return probe

    def _native(self, name: str, addr: int, bufs: int, n0: int, work: int, split: bool,
                threads: int) -> Native | Callable[[], None]:
        """A native step over outer rows [0, n0), or its split over threads."""
        bounds = chunk_bounds(n0, work, threads, self._min_chunk_work)
        if split and len(bounds) > 1:
            self.split.add(name)
            return self._split_step(addr, bufs, bounds, work, threads, self._sites)
        return Native(addr, bufs, 0, n0, work)

    def _split_step(self, addr: int, bufs: int, bounds: list[tuple[int, int]], work: int,
                    threads: int, keep: list) -> Native | Callable[[], None]:
        """fn(bufs, start, stop) over `bounds` on all threads: a native-driver step
        (ac_pool_step on pool.py's helpers, its job arrays appended to `keep`), or a
        Splitter call (--cpu_helpers=python, or no native helpers here)."""
        native = pool.get(threads, self._spinning) if self._helpers == "native" else None
        if native is not None:
            job, arr = native.job(addr, bufs, bounds)
            keep.extend((job, arr))
            if self._spinning:
                self._pool, self._quiet, self._jobs_on = native, pool.get(threads), native
                self._jobs.append(job)
            return Native(native.step_address, job.ctypes.data, 0, 0, work)
        fn = KERNEL_FN(addr)
        run = splitter(threads).run
        return lambda: run(fn, bufs, bounds)

    def _init_polling(self) -> None:
        """--cpu_allow_spinning's state: the polling pool once a split takes it, the
        default pool, the split jobs (pool.job arrays) and the pool they use now."""
        self._pool: pool.NativePool | None = None
        self._quiet: pool.NativePool | None = None
        self._jobs: list[np.ndarray] = []
        self._jobs_on: pool.NativePool | None = None
        # library.SWITCHES when _polling_pool last looked, and whether runs poll then
        self._impls_seen, self._polls = -1, True

    def _polling_pool(self) -> pool.NativePool | None:
        """The pool whose helpers poll through this run (--cpu_allow_spinning), or None:
        not in a plan calling oneDNN, whose OpenMP threads lost their cores to the polling
        helpers (ViT through torch.compile: 51 -> 62 ms a run; dropping the polling only
        around each oneDNN call still left 56-59 ms)."""
        if self._pool is None:
            return None  # no split kernel, or the flag off: nothing to look up
        switches = getattr(self._library, "SWITCHES", None)
        if switches is None or switches[0] != self._impls_seen:  # a call changed library
            self._impls_seen = switches[0] if switches is not None else -1
            impl = getattr(self._library, "current_impl", None)
            onednn = impl is not None and any(impl(fn).startswith("onednn")
                                              for fn in self.library_fns.values())
            self._serve_splits(self._quiet if onednn else self._pool)
            self._polls = not onednn
        return self._pool if self._polls else None

    def _serve_splits(self, target: pool.NativePool | None) -> None:
        """Point every split job of this plan at `target`'s helpers (the run's lock held).
        In a plan calling oneDNN the SCHED_IDLE helpers, even not polling, lost their core
        to its OpenMP threads in mid-chunk and held the split up (BEiT 7% slower in some
        processes): its splits go to the default pool's helpers instead."""
        if target is None or target is self._jobs_on:
            return
        for job in self._jobs:
            job[0] = target.address
        self._jobs_on = target

    def _raise_out_of_bounds(self) -> None:
        """--check_bounds: raise OutOfBoundsError for the first kernel whose guard caught an
        access outside its buffer (guards are cleared, so the next run starts clean)."""
        hits = [(name, ids, g.copy()) for name, (ids, g) in self._guards.items() if g[0]]
        if not hits:
            return
        for _, g in self._guards.values():
            g[:GUARD_SIZES] = 0
        name, ids, g = hits[0]
        kernel = next(t for t in self.program.thunks if getattr(t, "name", None) == name)
        buf = self.buffers[ids[int(g[1])]]
        what = "store to" if g[0] == 2 else "load of"
        lanes = f" ({int(g[3])} lanes)" if g[3] > 1 else ""
        raise OutOfBoundsError(
            f"--check_bounds: kernel {name} (nodes: {', '.join(kernel.nodes)}): a {what} "
            f"buffer {buf.name!r} ({buf.dtype}{list(buf.shape)}, {buf.size} elements) at "
            f"element {int(g[2])}{lanes}, outside it; the outputs of this run are garbage")

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

    def _bind_outputs(self) -> None:
        """Point the output buffers at the last run's arrays where the caller has dropped
        them, else at new ones.

        A new 64 MB array page-faults on first touch (~15 ms of a 40 ms GELU run); an array
        the caller has dropped is safe to refill. References when dropped: our slot, `old`
        and getrefcount's argument. A view the caller kept counts too (its .base).
        """
        for bid, shape, dtype in self._output_specs:
            old = self._arrays[bid]
            if old is None or _refcount(old) != 3:
                self._set(bid, np.empty(shape, dtype))

    def _bind_input(self, bid: int, x: np.ndarray) -> None:
        """Bind a caller's array; the address of the array bound last time is reused.

        Reading an array's address costs ~0.9 us (it builds __array_interface__); callers
        feeding the same arrays again (benchmarks, servers with preallocated inputs) skip
        it. A weak reference tells whether it is still the same, live object.
        """
        if type(x) is not np.ndarray or not x.flags.c_contiguous:
            x = np.array(x, order="C")  # not np.ascontiguousarray: it turns 0-d into (1,)
        ref = self._last_inputs.get(bid)
        if ref is not None and ref() is x:
            self._arrays[bid] = x
            return
        self._set(bid, x)
        self._last_inputs[bid] = weakref.ref(x)

    def profile(self, inputs: list[np.ndarray], repeat: int = 5) -> list[tuple[str, float]]:
        """(thunk text, median ms) per thunk over `repeat` runs, each thunk timed alone
        (native steps called one by one, not through the driver): `autoclust bench
        --profile` prints this beside onnxruntime's own profile."""
        times: list[list[float]] = [[] for _ in self._ungrouped]
        with self._lock:
            if self._generation != self._arena.generation:
                self._bind_temps()
            for bid, x in zip(self.program.inputs, inputs):
                self._bind_input(bid, x)
            self._bind_outputs()
            for _ in range(max(repeat, 1)):
                for k, (_, step) in enumerate(self._ungrouped):
                    fn = as_call(step)
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
            for bid in self.program.inputs:
                self._arrays[bid] = None
        names = {b.id: b.name for b in self.program.buffers}
        return [(kir.format_thunk(t, names).splitlines()[0], float(np.median(ts)) * 1e3)
                for (t, _), ts in zip(self._ungrouped, times)]

    def _first_run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """run() with the library's background work (weight prepacking) held back: the first
        run's GEMMs then have both cores (they pack their weights as they go)."""
        hold = getattr(self._library, "foreground", None)
        self._fresh = False
        if hold is None:
            return self.run(inputs)
        with hold():
            return self.run(inputs)

    def _trial_run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """run() while the whole plan's library trial (inplan.PlanTrial) is pending or
        running: it starts once the calls' own trials and the background work are done."""
        if not self._trial_lock.acquire(blocking=False):  # another thread drives it
            return self._run(inputs)
        try:
            return self._trial_step(inputs)
        finally:
            self._trial_lock.release()

    def _trial_step(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        trial = self._plan_trial
        if trial is _PENDING:
            if not self._calls_settled():
                return self._run(inputs)
            make = getattr(self._library, "plan_trial", None)
            trial = self._plan_trial = make(list(self.library_fns.values())) \
                if make is not None else None
            if trial is None:
                return self._run(inputs)
            trial.shapes = [x.shape for x in inputs]
        if [x.shape for x in inputs] != trial.shapes:  # another length of a shape class:
            trial.elsewhere += 1  # its time is not comparable; a stream of other lengths
            if trial.elsewhere > PLAN_ELSEWHERE:  # ends the trial as decided
                trial.abandon()
                self._plan_trial = None
            return self._run(inputs)
        name, timed = trial.variant()
        t0 = time.perf_counter()
        outs = self._run(inputs)
        if timed:
            trial.record(name, time.perf_counter() - t0)
        if trial.done:
            self._plan_trial = None
        return outs

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run the cluster; outputs are arrays the caller owns (reused once it drops them)."""
        if self._fresh:
            return self._first_run(inputs)
        if self._plan_trial is not None:
            return self._trial_run(inputs)
        return self._run(inputs)

    def _run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The hot path of every compiled run: _bind_input and _bind_outputs inlined (the
        same checks), no per-run allocation beyond the returned list and new outputs. The
        arena's lock, held throughout, is also background.quiet_cores' gate.
        """
        with self._lock:
            if self._generation != self._arena.generation:
                self._bind_temps()  # another binding grew the shared temps
            arrays, last = self._arrays, self._last_inputs
            for bid, x in zip(self._input_ids, inputs):
                ref = last.get(bid)
                if ref is not None and ref() is x and x.flags.c_contiguous:
                    arrays[bid] = x  # the array bound last time: its address is in place
                else:
                    self._bind_input(bid, x)
            for bid, shape, dtype in self._output_specs:
                old = arrays[bid]
                # refs when the caller dropped it: our slot, `old` and getrefcount's argument
                if old is None or _refcount(old) != 3:
                    self._set(bid, np.empty(shape, dtype))
            helpers = self._polling_pool()
            if helpers is not None:
                helpers.linger(1)
            try:
                for step in self._steps:
                    step()
            finally:
                if helpers is not None:
                    helpers.linger(-1)
            if self._guards:
                self._raise_out_of_bounds()
            outs = [np.array(arrays[bid], copy=True) if copy else arrays[bid]
                    for bid, copy in self._handout]
            for bid in self._input_ids:
                arrays[bid] = None  # do not keep the caller's arrays alive
            return outs
