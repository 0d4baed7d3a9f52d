"""The runtime and session with a device-memory backend, without a GPU.

Device "gpu-sim" (tests/support/gpu_sim_backend.py) has the GPU backend's policy and C-rendered
kernels, and values in simulated device memory (SimArray: not array-like, so any value
reaching onnxruntime or NumPy without the runtime's explicit copy fails). Checked here:
every zoo model against onnxruntime with pinned kernel counts, the copies a run makes
(counted, and predicted by `explain`), device arrays in and out, fallbacks, and the
errors for a GPU this machine lacks.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.backends.gpu import device
from autoclust.models import zoo
from support import gpu_sim_backend
from support.gpu_models import (
    HALF_MODELS,
    KERNELS,
    half_feeds,
    to_float16,
)
from support.gpu_render import needs_cc
from support.gpu_sim_backend import SimArray

import autoclust
from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.errors import DeviceUnavailableError, InvalidInputError
from autoclust.runtime import transfers

pytestmark = needs_cc  # the C rendering runs through the host C compiler


@pytest.fixture(autouse=True)
def sim_device(monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "gpu-sim", "support.gpu_sim_backend")


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)




@pytest.mark.parametrize("name", sorted(KERNELS))
def test_zoo_model_on_the_simulated_device(name):
    model = zoo.build(name)
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, device="gpu-sim")
    got = sess.run(None, feeds)
    for g, w in zip(got, _ort(model, feeds)):
        assert type(g) is np.ndarray
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert [c["kernels"] for c in sess.stats()["clusters"]] == KERNELS[name]
    if sess._runtime is not None:  # every predicted copy happened, once
        copied = sess._runtime.device.last_copies
        assert copied.copies == len(transfers.plan_copies(sess.plan))








@pytest.mark.parametrize("name", HALF_MODELS)
def test_float16_zoo_model_on_the_simulated_device(name):
    """float16 storage with float32 math, rounded after every op (as the kernel IR says):
    within float16 rounding of onnxruntime's float16 kernels."""
    model = to_float16(zoo.build(name))
    feeds = half_feeds(model)
    got = autoclust.InferenceSession(model, device="gpu-sim").run(None, feeds)
    for g, w in zip(got, _ort(model, feeds)):
        assert g.dtype == w.dtype == np.float16
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=1e-2,
                                   atol=1e-2)


def test_copies_are_the_inputs_and_outputs_only_when_all_runs_on_the_device():
    model = zoo.build("softmax_mask")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, device="gpu-sim")
    out = sess.run(None, feeds)
    copied = sess._runtime.device.last_copies
    assert copied.h2d == sum(x.nbytes for x in feeds.values())
    assert copied.d2h == sum(y.nbytes for y in out)
    text = sess.explain()
    assert "Host <-> device copies per run" in text
    assert f"Measured in the last run: {copied.h2d} bytes host -> device" in text
    assert "Host <-> device" not in autoclust.InferenceSession(model).explain()


@pytest.mark.parametrize("name", ["softmax_mask", "llama_block", "mlp_gelu"])
def test_explained_bytes_are_the_measured_bytes(name):
    model = zoo.build(name)
    sess = autoclust.InferenceSession(model, device="gpu-sim")
    sess.run(None, zoo.feeds(model))
    dims = zoo.default_dims(model)
    predicted = 0
    for c in transfers.plan_copies(sess.plan):
        size, names = c.term()
        predicted += size * int(np.prod([dims[n] for n in names]))
    copied = sess._runtime.device.last_copies
    assert predicted == copied.h2d + copied.d2h


def test_device_arrays_in_and_out():
    model = zoo.build("gelu")
    x = zoo.feeds(model)["x"]
    sess = autoclust.InferenceSession(model, device="gpu-sim")
    y = sess.run(None, {"x": SimArray(x)}, output_device="gpu-sim")[0]
    assert isinstance(y, SimArray)
    copied = sess._runtime.device.last_copies
    assert (copied.h2d, copied.d2h) == (0, 0)  # nothing crossed
    np.testing.assert_allclose(y.data, _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_segments_get_host_values_and_clusters_device_values():
    """mixed_dynamic alternates clusters and onnxruntime segments (NonZero, Unique, TopK):
    a SimArray reaching onnxruntime would raise, so passing means every move happened."""
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model, seed=3)
    sess = autoclust.InferenceSession(model, device="gpu-sim")
    for g, w in zip(sess.run(None, feeds), _ort(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_failed_compile_falls_back_with_host_values(monkeypatch):
    def broken(program, flags):
        raise RuntimeError("no kernels today")
    monkeypatch.setattr(gpu_sim_backend, "compile", broken)
    model = zoo.build("layernorm")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, device="gpu-sim")
    with pytest.warns(RuntimeWarning, match="no kernels today"):
        got = sess.run(None, {"x": SimArray(feeds["x"])})
    np.testing.assert_allclose(got[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_device_array_on_a_host_session_is_refused():
    model = zoo.build("gelu")
    x = zoo.feeds(model)["x"]
    sess = autoclust.InferenceSession(model)
    with pytest.raises(InvalidInputError, match="'x' is a device array .*device='gpu'"):
        sess.run(None, {"x": SimArray(x)})
    with pytest.raises(InvalidInputError, match="no memory of its own"):
        sess.run(None, {"x": x}, output_device="interpreter")


def test_missing_gpu_is_one_clear_error():
    reason = device.available()
    if not reason:
        pytest.skip("this machine has CuPy and a GPU")
    model = zoo.build("gelu")
    with pytest.raises(DeviceUnavailableError, match="CuPy|GPU") as err:
        autoclust.InferenceSession(model, device="gpu")
    assert str(err.value) == reason
    sess = autoclust.InferenceSession(model)
    with pytest.raises(DeviceUnavailableError):
        sess.run(None, zoo.feeds(model), output_device="gpu")
    with pytest.raises(DeviceUnavailableError):
        from autoclust.backends import gpu
        gpu.compile(None, flags_mod.parse(""))


def test_replay_on_a_device(tmp_path, capsys):
    from autoclust.tools import cli
    model = zoo.build("layernorm")
    sess = autoclust.InferenceSession(model, dump_to=str(tmp_path), dump_inputs=True)
    sess.run(None, zoo.feeds(model))
    rc = cli.main(["replay", str(tmp_path / "cluster_0000"), "--device", "gpu-sim"])
    assert rc == 0, capsys.readouterr().out
    assert "ok" in capsys.readouterr().out
