"""Library sessions through onnxruntime's C API (backends/ort/capi.py): the same results as
onnxruntime's own session, one shared thread pool, clear errors, and the binding's
sessions where the C API cannot serve (another thread count, a forked child)."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest
from autoclust.backends.cpu import mlas
from autoclust.backends.ort import capi
from support.op_harness import one_node_model, run_ort

pytestmark = pytest.mark.skipif(capi.unavailable() is not None,
                                reason=f"onnxruntime's C API: {capi.unavailable()}")
RNG = np.random.default_rng(11)


def pool_threads() -> int:
    """The shared pool's thread count: the one this process made, else 2 (made now)."""
    made = capi.current()
    return made.threads if made is not None else 2


def types(arrays: list) -> list:
    return [(x.dtype, x.shape) for x in arrays]


def close(got: np.ndarray, want: np.ndarray) -> None:
    """Equal to onnxruntime's, within float32 rounding (a prepacked Conv sums in another
    order than onnxruntime's session given the weights as an input)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


CASES = {
    "matmul, constant weights": ("MatMul", [(3, 40, 64), (64, 96)], {}, (1,)),
    "gemm transB, fed weights": ("Gemm", [(33, 64), (48, 64), (48,)], {"transB": 1}, ()),
    "conv": ("Conv", [(1, 3, 17, 17), (8, 3, 3, 3)], {"pads": [1, 1, 1, 1]}, (1,)),
    "zero-size rows": ("MatMul", [(0, 64), (64, 32)], {}, (1,)),
    "int64 add, 0-d": ("Add", [(5, 4), ()], {}, ()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_capi_session_equals_onnxruntime(case: str) -> None:
    op, shapes, attrs, consts = CASES[case]
    dtype = "int64" if "int64" in case else "float32"
    inputs = [np.asarray(RNG.integers(-9, 9, s) if dtype == "int64" else
                         RNG.standard_normal(s), dtype) for s in shapes]
    expected = run_ort(one_node_model(op, inputs, attrs, 1, 18),
                       {f"in{i}": x for i, x in enumerate(inputs)})[0]
    constants = {i: inputs[i] for i in consts}
    sess = mlas.new_session(op, attrs, types(inputs), [(expected.dtype, expected.shape)],
                            pool_threads(), constants)
    assert isinstance(sess, capi.Session)
    run = mlas.bound_runner(sess, types(inputs), [(expected.dtype, expected.shape)], constants)
    out = np.full(expected.shape, 7, expected.dtype)
    run(inputs, [out])
    close(out, expected)
    # new arrays, new values: rebound, not the arrays of the first call
    again = [x if i in consts else np.asarray(x * 2, x.dtype) for i, x in enumerate(inputs)]
    expected2 = run_ort(one_node_model(op, again, attrs, 1, 18),
                        {f"in{i}": x for i, x in enumerate(again)})[0]
    out2 = np.full(expected.shape, 7, expected.dtype)
    run(again, [out2])
    close(out2, expected2)
    if expected.size:
        close(out, expected)  # the first output left alone
        assert not np.array_equal(out2, out)


def test_library_sessions_share_one_thread_pool() -> None:
    """Eight GEMM sessions with weights of their own add no threads past the shared pool's
    (with a pool each, as the binding makes them, they added one worker each)."""
    threads = pool_threads()
    capi.env(threads)  # the pool's own workers, made before counting
    before = threads_now()
    a = RNG.standard_normal((64, 256), dtype=np.float32)
    held = []
    for _ in range(8):
        w = RNG.standard_normal((256, 256), dtype=np.float32)
        in_types, out_types = types([a, w]), [(np.dtype("float32"), (64, 256))]
        sess = mlas.new_session("MatMul", {}, in_types, out_types, threads, {1: w})
        out = np.empty((64, 256), np.float32)
        mlas.bound_runner(sess, in_types, out_types, {1: w})([a, w], [out])
        np.testing.assert_allclose(out, a @ w, rtol=1e-4, atol=1e-4)
        held.append(sess)
    assert threads_now() - before == 0, f"{threads_now() - before} threads added"


def test_refused_model_raises_onnxruntime_message() -> None:
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(capi.CApiError, match="NoSuchOp"):
        mlas.new_session("NoSuchOp", {}, types([x]), types([x]), pool_threads(), {})


def test_wrong_output_shape_raises_instead_of_writing() -> None:
    a, w = np.ones((4, 8), np.float32), np.ones((8, 3), np.float32)
    in_types, out_types = types([a, w]), [(np.dtype("float32"), (4, 3))]
    sess = mlas.new_session("MatMul", {}, in_types, out_types, pool_threads(), {})
    out = np.full((5, 3), 7, np.float32)  # bound output of the wrong shape
    with pytest.raises(capi.CApiError, match="[Ss]hape"):
        mlas.bound_runner(sess, in_types, out_types, {})([a, w], [out])
    assert (out == 7).all()


def test_another_thread_count_keeps_the_bindings_session() -> None:
    a = np.ones((4, 8), np.float32)
    other = pool_threads() + 1
    sess = mlas.new_session("Relu", {}, types([a]), types([a]), other, {})
    assert not isinstance(sess, capi.Session)
    out = np.empty_like(a)
    mlas.bound_runner(sess, types([a]), types([a]), {})([a], [out])
    np.testing.assert_array_equal(out, a)


def test_bfloat16_keeps_the_bindings_session(monkeypatch) -> None:
    """ml_dtypes arrays have no tensor type in the C API here: such sessions are the
    binding's, as before."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert not capi.supports([np.dtype("float32"), bf16])
    made = []
    monkeypatch.setattr(mlas, "_binding_session", lambda *a: made.append(a) or "binding's")
    assert mlas.new_session("Relu", {}, [(bf16, (4,))], [(bf16, (4,))], pool_threads(),
                            {}) == "binding's"
    assert len(made) == 1


def test_an_environment_that_cannot_be_made_keeps_the_bindings_session(monkeypatch) -> None:
    """onnxruntime refusing the environment is answered like an unavailable C API: None,
    the reason in `unavailable()`, and library sessions made by the binding, not an
    exception that would send the call to NumPy."""
    assert capi.unavailable() is None
    loaded = {k: v for k, v in capi._STATE.items() if k != "env"}  # no environment yet

    def refuse(*args):
        raise capi.CApiError("no threads for you")

    monkeypatch.setattr(capi, "_STATE", loaded)
    monkeypatch.setattr(capi, "Env", refuse)
    assert capi.env(pool_threads()) is None
    assert "could not be made: no threads for you" in capi.unavailable()
    a = np.ones((4, 8), np.float32)
    sess = mlas.new_session("Relu", {}, types([a]), types([a]), pool_threads(), {})
    assert not isinstance(sess, capi.Session)
    out = np.empty_like(a)
    mlas.bound_runner(sess, types([a]), types([a]), {})([a], [out])
    np.testing.assert_array_equal(out, a)


def test_another_spin_setting_keeps_the_bindings_session() -> None:
    threads = pool_threads()
    made = capi.env(threads)
    assert made is not None and capi.env(threads, spin=not made.spin) is None


def _env_in_child(threads: int, answer: multiprocessing.Queue) -> None:
    answer.put(capi.env(threads) is None)


def test_forked_child_does_not_use_the_parents_pool() -> None:
    threads = pool_threads()
    assert capi.env(threads) is not None
    ctx = multiprocessing.get_context("fork")
    answer: multiprocessing.Queue = ctx.Queue()
    child = ctx.Process(target=_env_in_child, args=(threads, answer))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert answer.get(timeout=5) is True


_IDLE_AFTER_A_CALL = """
import sys, time
import numpy as np
from autoclust.backends.cpu import mlas
mlas.SPIN = sys.argv[1] == "spin"
a, w = np.ones((128, 768), np.float32), np.ones((768, 2304), np.float32)
types = [(a.dtype, a.shape), (w.dtype, w.shape)]
out_types = [(a.dtype, (128, 2304))]
run = mlas.bound_runner(mlas.new_session("MatMul", {}, types, out_types, 2, {1: w}),
                        types, out_types, {1: w})
y = np.empty((128, 2304), np.float32)
for _ in range(3):
    run([a, w], [y])
cpu = time.process_time()
time.sleep(0.2)
print(time.process_time() - cpu)
"""


def test_shared_pool_sleeps_between_calls() -> None:
    """After a call the process uses no CPU while the caller sleeps: the shared pool's
    worker does not spin (a spinning one, asked for here, burns ~28 ms on this check)."""
    import subprocess
    import sys

    def cpu_while_asleep(mode: str) -> float:
        done = subprocess.run([sys.executable, "-c", _IDLE_AFTER_A_CALL, mode],
                              capture_output=True, text=True, timeout=120, check=True)
        return float(done.stdout.split()[-1])

    assert cpu_while_asleep("sleep") < 0.005
    assert cpu_while_asleep("spin") > 0.010  # the check sees a spinning worker
