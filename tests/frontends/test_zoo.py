"""The model zoo: deterministic, valid, runnable in onnxruntime, and computing what it says."""

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from support import paths

from autoclust.errors import InvalidInputError, ModelLoadError
from models import zoo
from models.build import write_all

REPO = paths.REPO
NAMES = list(zoo.BUILDERS)
DATA_DEPENDENT = {"nnz", "n_unique"}


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def _weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _declared_shape(value, dims):
    out = []
    for d in value.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, d.dim_param))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_builds_deterministically_and_checks(name):
    a = zoo.build(name).SerializeToString()
    b = zoo.build(name).SerializeToString()
    assert a == b
    model = zoo.build(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10
    assert model.opset_import[0].version in (17, 18)
    assert zoo.zoo_name(model) == name
    node_names = [n.name for n in model.graph.node]
    assert len(set(node_names)) == len(node_names)
    assert all(n.startswith("/") for n in node_names)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dims", [None, {"batch": 3, "seq": 5, "n": 37, "height": 8,
                                         "width": 12}])
def test_runs_in_onnxruntime_with_expected_shapes(name, dims):
    model = zoo.build(name)
    sizes = zoo.default_dims(model)
    sizes.update(dims or {})
    feeds = zoo.feeds(model, dims=dims, seed=1)
    outs = _run(model, feeds)
    feeds_k = int(feeds["k"][0]) if "k" in feeds else None
    for value in model.graph.output:
        got = outs[value.name]
        assert np.isfinite(got).all(), value.name
        want = _declared_shape(value, {**sizes, "k": feeds_k})
        assert got.ndim == len(want)
        for g, w in zip(got.shape, want):
            assert w in DATA_DEPENDENT or g == w, (value.name, got.shape, want)


def test_feeds_follow_specs():
    f = zoo.feeds("bert_encoder", dims={"batch": 4, "seq": 9}, seed=3)
    assert f["input_ids"].dtype == np.int64 and f["input_ids"].shape == (4, 9)
    assert f["input_ids"].min() >= 0 and f["input_ids"].max() < 512
    mask = f["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1} and (mask[:, 0] == 1).all()
    assert (np.diff(mask, axis=1) <= 0).all()  # padding style: ones then zeros
    k = zoo.feeds("mixed_dynamic", seed=5)["k"]
    assert k.shape == (1,) and 1 <= k[0] <= 8
    add = zoo.feeds("softmax_mask")["mask"]
    assert set(np.unique(add)) <= {0.0, -10000.0}
    a, b = zoo.feeds("llama_block", seed=7), zoo.feeds("llama_block", seed=7)
    np.testing.assert_array_equal(a["hidden_states"], b["hidden_states"])


def _gelu(x):
    from math import erf
    return x * 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def test_gelu_matches_numpy():
    model = zoo.build("gelu")
    x = zoo.feeds(model)["x"]
    np.testing.assert_allclose(_run(model, {"x": x})["y"], _gelu(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)


def test_mlp_gelu_matches_numpy():
    model = zoo.build("mlp_gelu")
    p = _weights(model)
    x = zoo.feeds(model)["x"].astype(np.float64)
    h = _gelu(x @ p["fc1.weight_t"] + p["fc1.bias"])
    h = np.maximum(h @ p["fc2.weight_t"] + p["fc2.bias"], 0)
    want = h @ p["fc3.weight_t"] + p["fc3.bias"]
    np.testing.assert_allclose(_run(model, {"x": x.astype(np.float32)})["logits"], want,
                               rtol=1e-4, atol=1e-5)


def test_layernorm_matches_numpy():
    model = zoo.build("layernorm")
    p = _weights(model)
    x = zoo.feeds(model)["x"].astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    want = want * p["ln.weight"] + p["ln.bias"]
    np.testing.assert_allclose(_run(model, {"x": x.astype(np.float32)})["y"], want,
                               rtol=1e-4, atol=1e-5)


def test_softmax_mask_matches_numpy():
    model = zoo.build("softmax_mask")
    f = zoo.feeds(model)
    z = f["scores"].astype(np.float64) / 4.0 + f["mask"]
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(_run(model, f)["probs"], e / e.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_rmsnorm_gate_matches_numpy():
    model = zoo.build("rmsnorm_gate")
    p = _weights(model)
    x = zoo.feeds(model)["x"].astype(np.float64)
    y = p["norm.weight"] * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)
    want = y / (1 + np.exp(-y)) * (y * 0.5)
    np.testing.assert_allclose(_run(model, {"x": x.astype(np.float32)})["y"], want,
                               rtol=1e-4, atol=1e-5)


CHAIN = [
    lambda v: v * 0.5, lambda v: v + 0.25, np.tanh, lambda v: v * 3.0,
    lambda v: v - 0.5, lambda v: np.maximum(v, -2.0), lambda v: np.minimum(v, 2.0), np.abs,
    np.negative, lambda v: v + 1.0, lambda v: np.maximum(v, 0.0), np.sqrt,
    np.exp, lambda v: v / 2.0, lambda v: 1 / (1 + np.exp(-v)), lambda v: v - 0.5,
]


@pytest.mark.parametrize("chain_len", [1, 16, 40])
def test_elementwise_chain_matches_numpy(chain_len):
    model = zoo.build("elementwise_chain", chain_len=chain_len)
    assert len(model.graph.node) == chain_len + sum(
        1 for i in range(chain_len) if i % 16 not in (2, 7, 8, 10, 11, 12, 14))  # + Constants
    x = zoo.feeds(model, dims={"n": 1000})["x"] * 50
    want = x.astype(np.float64)
    for i in range(chain_len):
        want = CHAIN[i % len(CHAIN)](want)
    got = _run(model, {"x": x})["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mixed_dynamic_matches_numpy():
    model = zoo.build("mixed_dynamic")
    f = zoo.feeds(model, dims={"batch": 5}, seed=2)
    f["k"] = np.array([3], np.int64)
    out = _run(model, f)
    act = np.maximum(f["x"].astype(np.float64) * 1.5 + 0.5, 0)
    score = np.exp(-act)
    np.testing.assert_allclose(out["dense"], score * act + 1, rtol=1e-5)
    coords = np.argwhere(score > 0.5) * 0.5 + 1.0
    np.testing.assert_array_equal(out["nonzero_coords"], coords)
    uniq, counts = np.unique(np.round(act * 2).astype(np.int64), return_counts=True)
    np.testing.assert_allclose(out["unique_scaled"], uniq * counts + 0.25)
    idx = np.argsort(-score, axis=-1, kind="stable")[:, :3]
    vals = np.take_along_axis(score, idx, -1)
    np.testing.assert_allclose(out["topk_scaled"], np.tanh(vals) * 2 + idx * 0.1, rtol=1e-5)


def test_llama_block_is_causal():
    model = zoo.build("llama_block")
    x = zoo.feeds(model, dims={"batch": 1, "seq": 8})["hidden_states"]
    y = x.copy()
    y[:, 5:] += 1.0
    a, b = _run(model, {"hidden_states": x})["output"], _run(model, {"hidden_states": y})["output"]
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_bert_encoder_ignores_padded_tokens():
    model = zoo.build("bert_encoder")
    ids = np.arange(12, dtype=np.int64).reshape(2, 6) + 3
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int64)
    other = ids.copy()
    other[0, 4:] = [100, 200]
    a = _run(model, {"input_ids": ids, "attention_mask": mask})["last_hidden_state"]
    b = _run(model, {"input_ids": other, "attention_mask": mask})["last_hidden_state"]
    np.testing.assert_allclose(a[0, :4], b[0, :4], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[0, 4:], b[0, 4:])


EXPORTER_OPS = {
    "bert_encoder": {"Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Transpose", "Erf",
                     "Pow", "ReduceMean", "Sqrt", "Div", "Softmax", "Cast", "Slice"},
    "llama_block": {"Range", "Less", "Where", "Neg", "Slice", "Sigmoid", "Reciprocal", "Cos",
                    "Sin", "Reshape", "Softmax"},
    "diffusion_block": {"InstanceNormalization", "ReduceMean", "Sigmoid", "Conv", "Gemm"},
    "resnet_block": {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool", "Flatten",
                     "Gemm"},
    "mixed_dynamic": {"NonZero", "Unique", "TopK", "Exp", "Relu"},
}


@pytest.mark.parametrize("name", sorted(EXPORTER_OPS))
def test_exporter_patterns_present(name):
    ops = {n.op_type for n in zoo.build(name).graph.node}
    assert EXPORTER_OPS[name] <= ops, EXPORTER_OPS[name] - ops


def test_size_parameters_and_bench_preset():
    small = zoo.build("bert_encoder", layers=1, hidden=32, heads=2)
    assert sum(n.op_type == "Softmax" for n in small.graph.node) == 1
    bench = zoo.build("bert_encoder", preset="bench")
    assert sum(n.op_type == "Softmax" for n in bench.graph.node) == 4
    assert 10e6 < bench.ByteSize() < 20e6
    assert zoo.default_dims(bench)["seq"] == 128
    out = _run(bench, zoo.feeds(bench, dims={"batch": 1, "seq": 8}))
    assert out["last_hidden_state"].shape == (1, 8, 256)
    llama = zoo.build("llama_block", preset="bench")
    out = _run(llama, zoo.feeds(llama, dims={"batch": 1, "seq": 4}))
    assert out["output"].shape == (1, 4, 256)


def test_errors_name_the_problem():
    with pytest.raises(ModelLoadError, match="no_such_model"):
        zoo.build("no_such_model")
    with pytest.raises(ModelLoadError, match="huge"):
        zoo.build("gelu", preset="huge")
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["mystery", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    outside = helper.make_model(graph)
    with pytest.raises(InvalidInputError, match="mystery"):
        zoo.feeds(outside)
    assert zoo.feeds(outside, dims={"mystery": 4})["x"].shape == (4, 3)


def test_written_files_are_small_and_match_committed(tmp_path):
    paths = write_all(str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == sorted(f"{n}.onnx" for n in NAMES)
    assert sum(os.path.getsize(p) for p in paths) < 2 * 1024 * 1024
    for path in paths:
        committed = os.path.join(REPO, "models", os.path.basename(path))
        if os.path.exists(committed):  # stale committed files would mislead the README command
            with open(path, "rb") as fresh, open(committed, "rb") as old:
                assert fresh.read() == old.read(), f"{committed} is stale: run python -m models.build"


def test_build_module_command_line(tmp_path):
    out = tmp_path / "zoo_out"
    proc = subprocess.run([sys.executable, "-m", "models.build", "--out", str(out)], cwd=REPO,
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == sorted(f"{n}.onnx" for n in NAMES)
    model = onnx.load(str(out / "mlp_gelu.onnx"))
    assert zoo.feeds(model)["x"].shape == (2, 64)
