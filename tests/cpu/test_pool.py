"""The native helper-thread pool (backends/cpu/pool.py): every chunk runs exactly once per
run, whoever claims it; the caller never waits for a helper that has not started; callers
in several threads at once; the native driver's step form; and split kernels of a compiled
cluster going through it, against onnxruntime."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import executable, jit, pool

from autoclust.runtime import disk_cache as cache

pytestmark = pytest.mark.skipif(not pool.supported(), reason="native pool: Linux x86-64 only")

# a[i] += i + 1 for i in [start, stop): after R runs a[i] == R * (i + 1) exactly when every
# chunk ran once per run (a chunk run twice or never shows)
FILL = """
define void @fill(ptr noalias %a, i64 %start, i64 %stop) {
entry:
  br label %head
head:
  %i = phi i64 [ %start, %entry ], [ %i1, %body ]
  %more = icmp slt i64 %i, %stop
  br i1 %more, label %body, label %done
body:
  %p = getelementptr i64, ptr %a, i64 %i
  %v = load i64, ptr %p
  %w = add i64 %i, 1
  %v1 = add i64 %v, %w
  store i64 %v1, ptr %p
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}
"""


@pytest.fixture(scope="module")
def fill() -> int:
    jit.target_machine()
    obj, _, _ = jit.kernel_object(cache.make_key(FILL, jit.version_key()), lambda: FILL, "",
                                  False)
    engine, addrs = jit.load_object(obj, ["fill"])
    fill.engine = engine  # type: ignore[attr-defined]  # the code lives with its engine
    return addrs["fill"]


def _bounds(n: int, chunks: int) -> np.ndarray:
    edges = [n * i // chunks for i in range(chunks + 1)]
    return np.array([(edges[i], edges[i + 1]) for i in range(chunks)], np.int64)


@pytest.fixture(scope="module")
def pools() -> dict[int, pool.NativePool]:
    """Pools by helper count; 0: nobody else claims, the caller runs every chunk (a
    helper that never starts costs nothing but its share)."""
    return {0: pool.NativePool(0), 1: pool.get(2), 3: pool.NativePool(3)}


@pytest.mark.parametrize("helpers", [0, 1, 3])
@pytest.mark.parametrize("chunks", [1, 2, 3, 8, 64, 1000])
def test_every_chunk_runs_once_per_run(fill, pools, helpers, chunks):
    p = pools[helpers]
    n, runs = 20_000, 300
    a = np.zeros(n, np.int64)
    bounds = _bounds(n, chunks)
    for _ in range(runs):
        p.run(fill, a.ctypes.data, bounds)
    np.testing.assert_array_equal(a, runs * (np.arange(n) + 1))


@pytest.mark.parametrize("helpers", [1, 3])
def test_the_caller_returns_after_every_chunk(fill, pools, helpers):
    """What the helpers claimed is done when run() returns, every time."""
    p = pools[helpers]
    n = 200_000
    a = np.zeros(n, np.int64)
    want = np.arange(n) + 1
    bounds = _bounds(n, 2 * (helpers + 1))
    late = 0
    for r in range(1, 201):
        p.run(fill, a.ctypes.data, bounds)
        late += not np.array_equal(a, r * want)
    assert late == 0


def test_callers_in_several_threads(fill):
    """A caller that finds the pool busy runs its chunks alone; nobody's chunks are lost or
    run twice, and nothing hangs."""
    p = pool.get(2)
    n, runs = 5_000, 400
    arrays = [np.zeros(n, np.int64) for _ in range(4)]
    bounds = _bounds(n, 8)
    errors: list[BaseException] = []

    def caller(a):
        try:
            for _ in range(runs):
                p.run(fill, a.ctypes.data, bounds)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(a,)) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors
    for a in arrays:
        np.testing.assert_array_equal(a, runs * (np.arange(n) + 1))


def test_the_driver_runs_pool_steps_between_plain_ones(fill):
    """ac_pool_step(job, 0, 0) is a native step: one driver call runs a plain kernel, a
    split one and another plain one in order."""
    p = pool.get(2)
    n = 10_000
    a = np.zeros(n, np.int64)
    job, arr = p.job(fill, a.ctypes.data, [tuple(b) for b in _bounds(n, 8)])
    plain = executable.Native(fill, a.ctypes.data, 0, n, 1 << 20)
    split = executable.Native(p.step_address, job.ctypes.data, 0, 0, 1 << 20)
    keep: list = []
    steps = executable.group_native([plain, split, plain], keep)
    assert len(steps) == 1
    for _ in range(50):
        steps[0]()
    np.testing.assert_array_equal(a, 150 * (np.arange(n) + 1))
    assert arr.size == 16


def test_job_refuses_chunk_counts_it_cannot_encode(fill):
    p = pool.get(2)
    with pytest.raises(ValueError, match="chunks"):
        p.job(fill, 0, [])
    with pytest.raises(ValueError, match="chunks"):
        p.run(fill, 0, np.zeros((pool.MAX_CHUNKS, 2), np.int64))


SPLIT_MODEL = """
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[N] x) => (float[N] y) {
            a = Mul(x, x)
            b = Erf(a)
            y = Sub(b, x)
        }
    """


@pytest.mark.parametrize("helpers", ["native", "python"])
def test_compiled_split_kernels_take_the_chosen_helpers(helpers):
    """--cpu_helpers=native: each split kernel is a pool step of the driver; python: a
    Splitter call. Both give onnxruntime's answers."""
    from support.chains import compile_model, model_from_text
    model = model_from_text(SPLIT_MODEL)
    x = np.random.default_rng(3).standard_normal(1 << 19).astype(np.float32)
    exe, args = compile_model(model, {"x": x}, threads=2, cpu_helpers=helpers)
    assert exe.split
    steps = [s for _, s in exe._ungrouped if isinstance(s, executable.Native)]
    pooled = any(s.fn == pool.get(2).step_address for s in steps)
    assert pooled == (helpers == "native")
    for _ in range(20):
        y = exe.run(args)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                                ).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_a_warm_process_loads_the_driver_from_the_cache_dir(tmp_path):
    """The drivers' object code goes to --cache_dir: a second process pointed at it starts
    its pool, and groups native steps (jit.driver_address), without an LLVM compile (the
    compiles cost every warm first run 0.05-0.1 s and ~15 ms)."""
    import subprocess
    import sys
    prog = ("from autoclust.backends.cpu import jit, pool\n"
            f"pool.use_cache_dir({str(tmp_path)!r})\n"
            "assert pool.get(2) is not None\n"
            "assert jit.driver_address(pool.cache_dir())\n"
            "print(jit.COUNTS['compiles'])\n")
    counts = [int(subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                                 check=True).stdout.split()[-1]) for _ in range(2)]
    assert counts == [2, 0]


# pools made by a test live as long as the process: their helpers keep their state array's
# address (production pools live in pool._POOLS), and a freed array's memory would be
# reused by the next pool's state under the old helpers
_KEEP: list[pool.NativePool] = []


def _policies() -> dict[int, int]:
    """Scheduling policy of each thread of this process, by thread id."""
    import os
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except OSError:
            pass  # the thread ended meanwhile
    return out


def _until(condition, seconds: float = 10.0) -> bool:
    import time
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_helpers_take_only_idle_cpu():
    """Helpers run at SCHED_IDLE: a helper polling between splits gives way at once to any
    other thread (onnxruntime's GEMM workers in the plan, the user's threads)."""
    import os
    before = set(_policies())
    p = pool.NativePool(2, polling=True)
    _KEEP.append(p)

    def new() -> list[int]:  # the policies of the pool's threads (each sets its own first)
        return sorted(pol for tid, pol in _policies().items() if tid not in before)

    assert _until(lambda: new() == [os.SCHED_IDLE] * 2), new()
    assert p.helpers == 2


def test_helpers_poll_while_a_run_is_in_progress_and_sleep_after(fill):
    """Between the splits of one plan run the helper keeps polling (no futex wake-up for
    the next split: BERT-base 3-4% faster); once no run is in progress it sleeps."""
    import os
    import time
    p = pool.NativePool(1, polling=True)
    _KEEP.append(p)
    if os.SCHED_IDLE not in _policies().values():
        pytest.skip("helpers could not take SCHED_IDLE here: they never linger")
    a = np.zeros(1000, np.int64)

    def asleep() -> bool:
        return p.state[48] == 1  # the helpers-asleep word

    p.run(fill, a.ctypes.data, _bounds(1000, 4))
    assert _until(asleep)  # no run in progress: it sleeps after a few pauses
    p.linger(1)
    p.run(fill, a.ctypes.data, _bounds(1000, 4))  # wakes it
    assert _until(lambda: p.state[48] == 0)
    time.sleep(0.05)
    assert p.state[48] == 0 and p.state[pool.LINGER] == 1  # still polling, 50 ms on
    p.linger(-1)
    assert _until(asleep)
    np.testing.assert_array_equal(a, 2 * (np.arange(1000) + 1))


def test_a_plan_run_that_raises_ends_its_linger():
    from support.chains import compile_model, model_from_text
    model = model_from_text(SPLIT_MODEL)
    x = np.random.default_rng(3).standard_normal(1 << 19).astype(np.float32)
    exe, args = compile_model(model, {"x": x}, threads=2, cpu_helpers="native",
                              cpu_allow_spinning=True)
    exe.run(args)
    helpers = pool.get(2, polling=True)
    assert exe._pool is helpers and helpers.state[pool.LINGER] == 0

    def fail() -> None:
        assert helpers.state[pool.LINGER] == 1  # the run is in progress
        raise RuntimeError("a step failed")

    exe._steps = [fail]
    with pytest.raises(RuntimeError, match="a step failed"):
        exe.run(args)
    assert helpers.state[pool.LINGER] == 0


def test_without_spinning_a_plan_run_leaves_the_helpers_to_sleep(fill):
    """--cpu_allow_spinning=false: split kernels go to helpers of normal priority, which
    sleep between splits as onnxruntime's workers with allow_spinning 0, and never poll,
    even with a run counted in their state."""
    import os
    import time

    from support.chains import compile_model, model_from_text
    model = model_from_text(SPLIT_MODEL)
    x = np.random.default_rng(3).standard_normal(1 << 19).astype(np.float32)
    exe, args = compile_model(model, {"x": x}, threads=2, cpu_helpers="native",
                              cpu_allow_spinning=False)
    assert exe.split and exe._pool is None
    exe.run(args)
    assert pool.get(2).state[pool.LINGER] == 0
    before = set(_policies())
    p = pool.NativePool(1)
    _KEEP.append(p)
    a = np.zeros(1000, np.int64)
    p.linger(1)
    p.run(fill, a.ctypes.data, _bounds(1000, 4))
    assert _until(lambda: p.state[48] == 1)  # asleep although a run is counted
    time.sleep(0.02)
    assert p.state[48] == 1
    p.linger(-1)
    mine = [pol for tid, pol in _policies().items() if tid not in before]
    assert mine == [os.SCHED_OTHER]


GEMM_MODEL = """
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[1024, 512] x) => (float[1024, 512] y) {
            w = Constant <value_float = 0.01> ()
            s = Constant <value_ints = [512, 512]> ()
            ws = Expand(w, s)
            m = MatMul(x, ws)
            y = Erf(m)
        }
    """


@pytest.mark.parametrize("impl,polls", [("mlas", True), ("onednn", False),
                                        ("onednn+post-ops", False)])
def test_a_plan_calling_onednn_does_not_poll(monkeypatch, impl, polls):
    """--cpu_allow_spinning: a run polls only while none of its library calls is on
    oneDNN (its OpenMP threads lost their cores to the SCHED_IDLE helpers), and then its
    split kernels go to the default pool's helpers (BEiT, whose GEMMs with post-ops are
    "onednn+post-ops", ran 5-7% slower while they stayed on the polling pool)."""
    from autoclust.backends.cpu import library
    from support.chains import compile_model, model_from_text
    model = model_from_text(GEMM_MODEL)
    x = np.random.default_rng(4).standard_normal((1024, 512)).astype(np.float32)
    exe, args = compile_model(model, {"x": x}, threads=2, cpu_allow_spinning=True)
    exe.run(args)
    assert exe.library_fns and exe._pool is not None and exe.split and exe._jobs
    monkeypatch.setattr(library, "current_impl", lambda fn: impl)
    library.SWITCHES[0] += 1  # as LibraryFn.switch does: the plan looks again
    counted = []
    steps, exe._steps = exe._steps, [lambda: counted.append(int(exe._pool.state[pool.LINGER]))]
    exe.run(args)
    assert counted == [1 if polls else 0]
    serving = pool.get(2, polls)
    assert {int(job[0]) for job in exe._jobs} == {serving.address}
    exe._steps = steps  # and the retargeted plan still computes the model
    want = np.asarray(exe.run(args)[0]).copy()
    monkeypatch.setattr(library, "current_impl", lambda fn: "mlas")
    library.SWITCHES[0] += 1
    # (its GEMM may still alternate between libraries: their roundings differ)
    np.testing.assert_allclose(exe.run(args)[0], want, rtol=1e-5, atol=1e-6)
    assert {int(job[0]) for job in exe._jobs} == {exe._pool.address}
