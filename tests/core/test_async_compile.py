"""--async_compile: a new signature compiles in the background while onnxruntime runs the
cluster, so run() never waits for a compile; counts of stand-in runs and compiles."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.models import zoo

import autoclust
from autoclust import compile as compile_mod


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def test_first_run_and_new_shapes_run_in_onnxruntime_while_compiling(monkeypatch):
    model = zoo.build("layernorm")
    gate = threading.Event()
    real = compile_mod.compile_cluster

    def slow_compile(*args, **kw):
        gate.wait(30)  # the compile cannot finish before the test lets it
        return real(*args, **kw)

    monkeypatch.setattr(compile_mod, "compile_cluster", slow_compile)
    sess = autoclust.InferenceSession(model, async_compile=True, min_cluster_size=1)
    runner = sess._runtime.compiled_clusters()[0]
    feeds = zoo.feeds(model)
    for _ in range(3):  # all three while the compile is blocked: onnxruntime answers
        np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds)[0],
                                   rtol=1e-5, atol=1e-5)
    assert runner.stand_in_runs == 3 and runner.compiles == 0 and len(runner.pending) == 1
    gate.set()
    sess._runtime.wait_compiles(60)
    np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
    assert runner.stand_in_runs == 3 and runner.compiles == 1 and runner.runs == 1
    # a new signature the compiled shape class serves (its dims are symbolic): bound at
    # once, no compile and no stand-in
    bigger = zoo.feeds(model, dims={"batch": 3, "seq": 5})
    np.testing.assert_allclose(sess.run(None, bigger)[0], _ort(model, bigger)[0],
                               rtol=1e-5, atol=1e-5)
    assert runner.stand_in_runs == 3 and runner.compiles == 1 and not runner.pending.get(
        runner.signature([bigger[n] for n in runner.input_names]))
    one = zoo.feeds(model, dims={"batch": 1, "seq": 1})  # size-1 dims: another class
    np.testing.assert_allclose(sess.run(None, one)[0], _ort(model, one)[0],
                               rtol=1e-5, atol=1e-5)
    assert runner.stand_in_runs == 4
    sess._runtime.wait_compiles(60)
    sess.run(None, one)
    assert runner.compiles == 2 and runner.stand_in_runs == 4


def _release(gate: threading.Event, job) -> None:
    gate.set()
    job.result(60)


def test_a_failed_background_compile_falls_back_with_one_warning(monkeypatch):
    model = zoo.build("layernorm")
    gate = threading.Event()

    def broken(*args, **kw):
        gate.wait(30)
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(compile_mod, "compile_cluster", broken)
    sess = autoclust.InferenceSession(model, async_compile=True, min_cluster_size=1)
    feeds = zoo.feeds(model)
    sess.run(None, feeds)
    runner = sess._runtime.compiled_clusters()[0]
    job = next(iter(runner.pending.values()))
    with pytest.warns(RuntimeWarning, match="injected compile failure"):
        _release(gate, job)  # the compile fails on the worker thread and warns there
    assert "injected compile failure" in runner.fallback_reason
    np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)
