"""Native helper threads for kernels split over threads: no GIL, no Python in the loop.

`Splitter` (executable.py) hands chunks to Python helper threads. Each chunk then costs
two wake-ups on the helper's side -- its queue, then the GIL, which the caller holds
between ctypes calls -- about 50 us on the 2-core machines: a 150K-element GELU took
139 us on two threads against 164 us on one. This pool does the same claim-based split in
native code compiled once per process by LLVM: helpers are pthreads running
`ac_pool_worker`, and the caller runs `ac_pool_run` from inside a ctypes call (or from the
native driver, through `ac_pool_step`), so a split kernel costs a few atomics and, when a
helper sleeps, one futex wake.

The state is one int64 array per pool (thread count, polling or not); its words, each on
its own cache line:

    ctrl   [0]   gen << 32 | n << 16 | next chunk   (claims: fetch-add; the chunk count
                                                   travels with the index, so a helper
                                                   never compares an index of one run with
                                                   the chunk count of the next)
    done   [8]   chunks finished in this run
    job    [16]  fn, bufs, bounds of this run (written before ctrl publishes the run)
    wake   [24]  the run counter helpers wait on (futex word)
    wait   [32]  1 while the caller sleeps for chunks helpers still run (futex word)
    busy   [40]  1 while a caller owns the pool: a second caller runs its chunks alone
    sleep  [48]  helpers asleep in the futex (the caller wakes them only then)
    linger [56]  plan runs in progress (`linger`): helpers poll instead of sleeping
    idle   [57]  1: the helpers take SCHED_IDLE at start and poll while linger > 0

As with Splitter, the caller never waits for a helper to start: it claims chunks too, and
waits only for chunks a helper has claimed (spinning briefly, then a futex wait of at most
1 ms at a time, re-checking). A helper spins SPIN pauses for the next run (split kernels
often follow each other within microseconds), then sleeps. Linux on x86-64 only (the futex
is a raw syscall); elsewhere `get()` returns None and Splitter serves.

With --cpu_allow_spinning (the default; `get(threads, polling=True)`: a pool of its own)
the helpers run at SCHED_IDLE, and while a plan run is in progress (executable.py counts it
in `linger`) they keep polling instead of sleeping. In a plan, split kernels alternate with
library GEMMs whose onnxruntime worker takes the helper's core; a sleeping helper then
costs the next split a futex wake-up, tens of microseconds on the 2-core VMs (profiled,
BERT's generated Q.K^T took 300 us after a GEMM, 160 alone). At SCHED_IDLE the polling
helper gives way at once to any other thread and is back the moment that core idles: ONNX
exports 0-3% faster (docs/performance.md). oneDNN's OpenMP threads, though, spin after
their GEMMs and starve a SCHED_IDLE helper in mid-chunk (torch's ViT 10-20% slower, BEiT's
export 5-7%), so a plan calling oneDNN neither polls nor uses this pool: its split jobs
are pointed at the default pool's helpers (executable.py). A helper preempted inside a chunk holds up its caller only until
the caller sleeps on it, which frees the caller's core. An unprivileged thread cannot
leave SCHED_IDLE (RLIMIT_NICE), so the policy is for the helper's life; a helper that
could not take it never polls. The pool uses no CPU once no run is in progress.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
import threading

import numpy as np

MAX_CHUNKS = 1 << 15      # the chunk count and index fields are 16 bits: room for the
                           # failed claims (one per thread and run) past the last chunk
SPIN = 32                  # helper: pauses before sleeping (~1-5 us)
CALLER_SPIN = 2048         # caller: pauses before sleeping on helpers' chunks
STATE_WORDS = 64
LINGER = 56                # the state word counting runs in progress (helpers keep polling)
IDLE = 57                  # set before the helpers start: they take SCHED_IDLE and may poll
RUN_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_void_p, ctypes.c_int64)
JOB_WORDS = 5              # ac_pool_step's job: state, fn, bufs, bounds, n

_IR = """
declare void @llvm.x86.sse2.pause()

define internal i64 @ac_futex(ptr %addr, i64 %op, i64 %val, ptr %ts) {
  %r = call i64 asm sideeffect "syscall", "={rax},{rax},{rdi},{rsi},{rdx},{r10},~{rcx},~{r11},~{memory},~{dirflag},~{fpsr},~{flags}"(i64 202, ptr %addr, i64 %op, i64 %val, ptr %ts)
  ret i64 %r
}

define internal i64 @ac_syscall3(i64 %nr, i64 %a, i64 %b, ptr %c) {
  %r = call i64 asm sideeffect "syscall", "={rax},{rax},{rdi},{rsi},{rdx},~{rcx},~{r11},~{memory},~{dirflag},~{fpsr},~{flags}"(i64 %nr, i64 %a, i64 %b, ptr %c)
  ret i64 %r
}

; claim chunks of the current run and run them; the last chunk wakes a sleeping caller
define internal void @ac_claim(ptr %st) {
entry:
  %donep = getelementptr i64, ptr %st, i64 8
  %fnp = getelementptr i64, ptr %st, i64 16
  %bufsp = getelementptr i64, ptr %st, i64 17
  %boundsp = getelementptr i64, ptr %st, i64 18
  %waitp = getelementptr i64, ptr %st, i64 32
  br label %loop
loop:
  %old = atomicrmw add ptr %st, i64 1 seq_cst, align 8
  %idx = and i64 %old, 65535
  %nsh = lshr i64 %old, 16
  %n = and i64 %nsh, 65535
  %ok = icmp ult i64 %idx, %n
  br i1 %ok, label %run, label %out
run:
  %fn = load ptr, ptr %fnp, align 8
  %bufs = load ptr, ptr %bufsp, align 8
  %bounds = load ptr, ptr %boundsp, align 8
  %j = shl i64 %idx, 1
  %sp = getelementptr i64, ptr %bounds, i64 %j
  %start = load i64, ptr %sp, align 8
  %ep = getelementptr i64, ptr %sp, i64 1
  %stop = load i64, ptr %ep, align 8
  call void %fn(ptr %bufs, i64 %start, i64 %stop)
  %d = atomicrmw add ptr %donep, i64 1 seq_cst, align 8
  %d1 = add i64 %d, 1
  %last = icmp eq i64 %d1, %n
  br i1 %last, label %check, label %loop
check:
  %w = load atomic i32, ptr %waitp seq_cst, align 8
  %sleeping = icmp ne i32 %w, 0
  br i1 %sleeping, label %wake, label %loop
wake:
  store atomic i32 0, ptr %waitp seq_cst, align 8
  %r = call i64 @ac_futex(ptr %waitp, i64 129, i64 1, ptr null)
  br label %loop
out:
  ret void
}

define ptr @ac_pool_worker(ptr %st) {
entry:
  %wakep = getelementptr i64, ptr %st, i64 24
  %sleepp = getelementptr i64, ptr %st, i64 48
  %lingerp = getelementptr i64, ptr %st, i64 56
  %wantp = getelementptr i64, ptr %st, i64 57
  %want = load atomic i64, ptr %wantp seq_cst, align 8
  %asked = icmp ne i64 %want, 0
  br i1 %asked, label %setidle, label %start
setidle:
  %param = alloca i32, align 4
  store i32 0, ptr %param, align 4
  %policy = call i64 @ac_syscall3(i64 144, i64 0, i64 5, ptr %param)  ; SCHED_IDLE
  %took = icmp eq i64 %policy, 0
  br label %start
start:
  %idle = phi i1 [ false, %entry ], [ %took, %setidle ]
  %first = load atomic i32, ptr %wakep seq_cst, align 8
  br label %spin
spin:
  %seen = phi i32 [ %first, %start ], [ %seen, %slept ], [ %now, %work ]
  br label %poll
poll:
  %i = phi i32 [ 0, %spin ], [ %i2, %pause ]
  %now = load atomic i32, ptr %wakep seq_cst, align 8
  %new = icmp ne i32 %now, %seen
  br i1 %new, label %work, label %pause
pause:
  call void @llvm.x86.sse2.pause()
  %lingering = load atomic i64, ptr %lingerp seq_cst, align 8
  %during = icmp ne i64 %lingering, 0
  %stay = and i1 %during, %idle
  %i1 = add i32 %i, 1
  %i2 = select i1 %stay, i32 0, i32 %i1
  %more = icmp ult i32 %i2, SPIN
  br i1 %more, label %poll, label %sleep
sleep:
  %s0 = atomicrmw add ptr %sleepp, i64 1 seq_cst, align 8
  %again = load atomic i32, ptr %wakep seq_cst, align 8
  %same = icmp eq i32 %again, %seen
  br i1 %same, label %block, label %slept
block:
  %seen64 = zext i32 %seen to i64
  %r = call i64 @ac_futex(ptr %wakep, i64 128, i64 %seen64, ptr null)
  br label %slept
slept:
  %s1 = atomicrmw sub ptr %sleepp, i64 1 seq_cst, align 8
  br label %spin
work:
  call void @ac_claim(ptr %st)
  br label %spin
}

define void @ac_pool_run(ptr %st, ptr %fn, ptr %bufs, ptr %bounds, i64 %n) {
entry:
  %ts = alloca { i64, i64 }, align 8
  %busyp = getelementptr i64, ptr %st, i64 40
  %pair = cmpxchg ptr %busyp, i64 0, i64 1 seq_cst seq_cst, align 8
  %got = extractvalue { i64, i1 } %pair, 1
  br i1 %got, label %pooled, label %serial
serial:
  %si = phi i64 [ 0, %entry ], [ %si1, %serial_body ]
  %smore = icmp slt i64 %si, %n
  br i1 %smore, label %serial_body, label %serial_done
serial_body:
  %sj = shl i64 %si, 1
  %ssp = getelementptr i64, ptr %bounds, i64 %sj
  %sstart = load i64, ptr %ssp, align 8
  %sep = getelementptr i64, ptr %ssp, i64 1
  %sstop = load i64, ptr %sep, align 8
  call void %fn(ptr %bufs, i64 %sstart, i64 %sstop)
  %si1 = add i64 %si, 1
  br label %serial
serial_done:
  ret void
pooled:
  %fnp = getelementptr i64, ptr %st, i64 16
  store ptr %fn, ptr %fnp, align 8
  %bufsp = getelementptr i64, ptr %st, i64 17
  store ptr %bufs, ptr %bufsp, align 8
  %boundsp = getelementptr i64, ptr %st, i64 18
  store ptr %bounds, ptr %boundsp, align 8
  %donep = getelementptr i64, ptr %st, i64 8
  store atomic i64 0, ptr %donep seq_cst, align 8
  %oldc = load atomic i64, ptr %st seq_cst, align 8
  %gen = lshr i64 %oldc, 32
  %gen1 = add i64 %gen, 1
  %genm = and i64 %gen1, 4294967295
  %genh = shl i64 %genm, 32
  %nh = shl i64 %n, 16
  %ctrl = or i64 %genh, %nh
  store atomic i64 %ctrl, ptr %st seq_cst, align 8
  %wakep = getelementptr i64, ptr %st, i64 24
  %g32 = trunc i64 %genm to i32
  store atomic i32 %g32, ptr %wakep seq_cst, align 8
  %sleepp = getelementptr i64, ptr %st, i64 48
  %sleepers = load atomic i64, ptr %sleepp seq_cst, align 8
  %anyone = icmp ne i64 %sleepers, 0
  br i1 %anyone, label %wake, label %claim
wake:
  %r0 = call i64 @ac_futex(ptr %wakep, i64 129, i64 2147483647, ptr null)
  br label %claim
claim:
  call void @ac_claim(ptr %st)
  %waitp = getelementptr i64, ptr %st, i64 32
  %tsec = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 0
  store i64 0, ptr %tsec, align 8
  %tnsec = getelementptr { i64, i64 }, ptr %ts, i32 0, i32 1
  store i64 1000000, ptr %tnsec, align 8
  br label %poll
poll:
  %i = phi i32 [ 0, %claim ], [ %i1, %pause ], [ 0, %slept ]
  %d = load atomic i64, ptr %donep seq_cst, align 8
  %all = icmp eq i64 %d, %n
  br i1 %all, label %finish, label %pause
pause:
  call void @llvm.x86.sse2.pause()
  %i1 = add i32 %i, 1
  %more = icmp ult i32 %i1, CALLER_SPIN
  br i1 %more, label %poll, label %sleep
sleep:
  store atomic i32 1, ptr %waitp seq_cst, align 8
  %d2 = load atomic i64, ptr %donep seq_cst, align 8
  %all2 = icmp eq i64 %d2, %n
  br i1 %all2, label %finish, label %block
block:
  %r1 = call i64 @ac_futex(ptr %waitp, i64 128, i64 1, ptr %ts)
  br label %slept
slept:
  br label %poll
finish:
  store atomic i32 0, ptr %waitp seq_cst, align 8
  store atomic i64 0, ptr %busyp seq_cst, align 8
  ret void
}

; the native driver's step form: job = {state, fn, bufs, bounds, n}
define void @ac_pool_step(ptr %job, i64 %unused0, i64 %unused1) {
entry:
  %st = load ptr, ptr %job, align 8
  %fnp = getelementptr i64, ptr %job, i64 1
  %fn = load ptr, ptr %fnp, align 8
  %bufsp = getelementptr i64, ptr %job, i64 2
  %bufs = load ptr, ptr %bufsp, align 8
  %boundsp = getelementptr i64, ptr %job, i64 3
  %bounds = load ptr, ptr %boundsp, align 8
  %np = getelementptr i64, ptr %job, i64 4
  %n = load i64, ptr %np, align 8
  call void @ac_pool_run(ptr %st, ptr %fn, ptr %bufs, ptr %bounds, i64 %n)
  ret void
}
""".replace("CALLER_SPIN", str(CALLER_SPIN)).replace("SPIN", str(SPIN))

ENABLED = True             # False: Splitter's Python helpers serve every split (A/B runs)
_POOLS: dict[tuple[int, bool], NativePool | None] = {}
_LOCK = threading.Lock()
_CODE: dict[str, int] = {}
_CACHE_DIR = [""]  # --cache_dir of the sessions (use_cache_dir): the driver's object code


def use_cache_dir(path: str | None) -> None:
    """Keep the driver's object code in `path` (--cache_dir) too: compiling it through LLVM
    took 0.05-0.1 s of every warm process's first run."""
    _CACHE_DIR[0] = path or ""


def cache_dir() -> str:
    """The sessions' --cache_dir ("" without one): packed.py keeps its kernels there too."""
    return _CACHE_DIR[0]


def supported() -> bool:
    """The raw futex syscall and pthreads: Linux on x86-64."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def _code() -> dict[str, int]:
    """Addresses of the pool's functions, compiled once per process."""
    if not _CODE:
        from autoclust.backends.cpu import jit

        from autoclust.runtime import disk_cache as cache
        obj, _, _ = jit.kernel_object(cache.make_key(_IR, jit.version_key()), lambda: _IR,
                                      _CACHE_DIR[0], False)
        names = ["ac_pool_worker", "ac_pool_run", "ac_pool_step"]
        engine, addrs = jit.load_object(obj, names)
        _CODE.update(addrs)
        _CODE["_engine"] = engine  # type: ignore[assignment]  # MCJIT code lives with it
    return _CODE


class NativePool:
    """One state array and `helpers` native threads serving it."""

    def __init__(self, helpers: int, polling: bool = False):
        code = _code()
        self.helpers, self.polling = helpers, polling
        self.state = np.zeros(STATE_WORDS, np.int64)
        self.state[IDLE] = int(polling)
        self.address = self.state.ctypes.data
        self._lingering, self._linger_lock = 0, threading.Lock()
        self.step_address = code["ac_pool_step"]
        self._run = RUN_FN(code["ac_pool_run"])
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create = libc.pthread_create
        create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p]
        self._threads = []
        for _ in range(helpers):
            tid = ctypes.c_ulong()
            err = create(ctypes.byref(tid), None, code["ac_pool_worker"], self.address)
            if err:
                raise OSError(err, f"pthread_create failed ({err})")
            libc.pthread_detach(tid)
            self._threads.append(tid.value)

    def linger(self, delta: int) -> None:
        """+1 when a run of a plan using this pool starts, -1 when it ends: while any run
        is in progress, a polling pool's helpers keep polling for the next split instead of
        sleeping (the others sleep as ever)."""
        with self._linger_lock:
            self._lingering += delta
            self.state[LINGER] = self._lingering

    def job(self, fn: int, bufs: int, bounds: list[tuple[int, int]]
            ) -> tuple[np.ndarray, np.ndarray]:
        """(job, bounds array) for `ac_pool_step(job, 0, 0)`: the native driver's form of
        fn(bufs, start, stop) over `bounds` on this pool. Keep both arrays alive."""
        if not 0 < len(bounds) < MAX_CHUNKS:
            raise ValueError(f"{len(bounds)} chunks: the pool takes 1..{MAX_CHUNKS - 1}")
        arr = np.array(bounds, np.int64).reshape(-1)
        job = np.array([self.address, fn, bufs, arr.ctypes.data, len(bounds)], np.int64)
        return job, arr

    def run(self, fn: int, bufs: int, bounds: np.ndarray) -> None:
        """fn(bufs, start, stop) for every (start, stop) row of int64 `bounds` ([n, 2] or
        flat), on the caller and the helpers; returns when every chunk has run."""
        n = bounds.size // 2
        if not 0 < n < MAX_CHUNKS:
            raise ValueError(f"{n} chunks: the pool takes 1..{MAX_CHUNKS - 1}")
        self._run(self.address, fn, bufs, bounds.ctypes.data, n)


def get(threads: int, polling: bool = False) -> NativePool | None:
    """The process-wide pool with threads - 1 native helpers (made on first use), or None
    where native helpers are not supported or could not start. `polling`
    (--cpu_allow_spinning, the default): the pool whose SCHED_IDLE helpers poll while a run lingers;
    sessions with and without it in one process get a pool each."""
    if not ENABLED:
        return None
    key = (threads, polling)
    with _LOCK:
        if key not in _POOLS:
            pool = None
            if supported() and threads > 1:
                try:
                    pool = NativePool(threads - 1, polling)
                except OSError:
                    pool = None
            _POOLS[key] = pool
        return _POOLS[key]
