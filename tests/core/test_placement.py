"""Copy-aware placement (autoclust/clustering/placement.py) on a device-memory backend, without a GPU.

Device "gpu-sim" (tests/support/gpu_sim_backend.py) has the GPU's policy, with Conv left
to onnxruntime on the host (as on a GPU where onnxruntime's Conv wins its timing:
backends/gpu/conv.py), and clusters in (simulated) device memory, with every copy
counted. A cluster between two Convs costs two copies per run; it goes back to
onnxruntime when its host kernels would touch fewer than HOST_TRAFFIC_PER_COPY tensors per
copy, and stays on the device otherwise. Outputs are checked against onnxruntime and the
copies a run makes are counted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import gpu_sim_backend  # registered below as device "gpu-sim"
from support.gpu_render import needs_cc

import autoclust
from autoclust import ops, registry
from autoclust.clustering import placement
from autoclust.runtime import transfers

pytestmark = needs_cc  # the C rendering runs through the host C compiler

RNG = np.random.default_rng(7)
X = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)


@pytest.fixture(autouse=True)
def sim_device(monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "gpu-sim", "support.gpu_sim_backend")
    host_conv = dataclasses.replace(gpu_sim_backend.POLICY,
                                    leave_to_onnxruntime=ops.in_group("WINDOW"))
    monkeypatch.setattr(gpu_sim_backend, "POLICY", host_conv)


def _const(name: str, shape: tuple) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def conv_sandwich(chain: list[str], mid_input: bool = False, mid_output: bool = False
                  ) -> onnx.ModelProto:
    """x -> Conv -> chain of elementwise ops (each with a constant where binary) -> Conv.
    mid_input: the chain's first op also reads graph input z; mid_output: the chain's
    result is also a graph output."""
    inits = [_const("w1", (4, 4, 3, 3)), _const("w2", (4, 4, 3, 3))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1")]
    prev = "c1"
    for k, op in enumerate(chain):
        out = f"t{k}"
        if op in ("Mul", "Add", "Sub", "Div"):
            other = "z" if (mid_input and k == 0) else f"k{k}"
            if other != "z":
                inits.append(_const(other, (4, 1, 1)))
            nodes.append(helper.make_node(op, [prev, other], [out], name=f"{op.lower()}{k}"))
        else:
            nodes.append(helper.make_node(op, [prev], [out], name=f"{op.lower()}{k}"))
        prev = out
    nodes.append(helper.make_node("Conv", [prev, "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2"))
    shape = [1, 4, 6, 6]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if mid_input:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, shape))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    if mid_output:
        outputs.append(helper.make_tensor_value_info(prev, TensorProto.FLOAT, shape))
    graph = helper.make_graph(nodes, "sandwich", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: (X if i.name == "x" else X[:, ::-1].copy()) for i in model.graph.input}


def _check(model: onnx.ModelProto, device: str = "gpu-sim",
           **flags: bool) -> autoclust.InferenceSession:
    """Run on `device` (every cluster kept however small) against onnxruntime."""
    sess = autoclust.InferenceSession(model, device=device, min_cluster_size=1, **flags)
    feeds = _feeds(model)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, ref in zip(sess.run(None, feeds), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    return sess


def _sizes(sess: autoclust.InferenceSession) -> list[int]:
    return [len(c.nodes) for c in sess.plan.clusters]


def _copies_made(sess: autoclust.InferenceSession) -> int:
    return 0 if sess._runtime is None else sess._runtime.device.last_copies.copies


def test_a_small_cluster_between_convs_goes_back_to_onnxruntime():
    sess = _check(conv_sandwich(["Mul", "Add", "Relu"]))  # 6 tensors on the host, 2 copies
    assert _sizes(sess) == []
    assert transfers.plan_copies(sess.plan) == []
    assert _copies_made(sess) == 0
    text = sess.explain()
    assert ("mul0 (Mul): kept in onnxruntime: on the device this cluster would copy 2 values "
            "between host and device per run, while onnxruntime reads and writes 6 tensors"
            ) in text


def test_a_cluster_worth_its_copies_stays_on_the_device():
    sess = _check(conv_sandwich(["Mul", "Add", "Relu", "Sigmoid"]))  # 8 >= 4 * 2
    assert _sizes(sess) == [4]
    assert [c.direction for c in transfers.plan_copies(sess.plan)] == ["host -> device",
                                                                        "device -> host"]
    assert _copies_made(sess) == 2


def test_graph_inputs_and_outputs_do_not_count_as_copies():
    # z (a graph input) and t2 (also a graph output) live where the user puts them: the
    # cluster still crosses for c1 (from conv1) and t2 (read by conv2): 2 values, 7 tensors
    sess = _check(conv_sandwich(["Mul", "Add", "Relu"], mid_input=True, mid_output=True))
    assert _sizes(sess) == []
    # the same ops on graph inputs only, next to a Conv that shares nothing with them
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 6, 6])
    model = conv_sandwich([])
    model.graph.input.append(z)
    model.graph.initializer.extend([_const("k0", (4, 1, 1)), _const("k1", (4, 1, 1))])
    model.graph.node.extend([helper.make_node("Mul", ["z", "k0"], ["m"], name="mul"),
                             helper.make_node("Add", ["m", "k1"], ["a"], name="add"),
                             helper.make_node("Relu", ["a"], ["r"], name="relu")])
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT,
                                                            [1, 4, 6, 6]))
    sess = _check(model)
    assert _sizes(sess) == [3]
    assert [(c.value, c.reader) for c in transfers.plan_copies(sess.plan)] == [
        ("z", "cluster_0000"), ("r", "graph output")]


def test_the_threshold_decides(monkeypatch):
    monkeypatch.setattr(placement, "HOST_TRAFFIC_PER_COPY", 3)  # 6 >= 3 * 2: worth it now
    sess = _check(conv_sandwich(["Mul", "Add", "Relu"]))
    assert _sizes(sess) == [3]
    assert _copies_made(sess) == 2


def test_host_backends_and_must_compile_ignore_copies():
    model = conv_sandwich(["Mul", "Add", "Relu"])
    cpu = _check(model, device="cpu")  # no device memory: nothing to copy
    assert _sizes(cpu) == [3]
    # must_compile compiles everything the device can (its Conv too: the preference for
    # onnxruntime is a placement choice), whatever the copies
    dev = _check(model, device="gpu-sim", must_compile=True)
    assert _sizes(dev) == [5]
    assert [c.value for c in transfers.plan_copies(dev.plan)] == ["x", "y"]  # in and out


def test_a_refused_conv_keeps_its_epilogues_in_onnxruntime():
    # Relu right after a Conv is fused into it by onnxruntime: it stays there, so the
    # cluster is Mul+Add+Sigmoid+Tanh (8 tensors, 2 copies)
    sess = _check(conv_sandwich(["Relu", "Mul", "Add", "Sigmoid", "Tanh"]))
    assert _sizes(sess) == [4]
    assert "relu0 (Relu): kept in onnxruntime with conv1" in sess.explain()
