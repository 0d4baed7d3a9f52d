"""Reading a model once (importers/onnx/weights.py): the light proto and the weights.

A session reads a model file's large initializers straight into arrays that the importer
and onnxruntime share, and parses only the rest. Checked against onnx.load: the same
initializers (dtype, shape, every byte), the same graph, the same outputs in onnxruntime;
unusual wire data falls back to the parser (with its errors), and nothing parses the
whole protobuf on the way.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.importers.onnx import import_model, load_model
from autoclust.importers.onnx import weights as reader
from onnx import TensorProto, helper, numpy_helper

import autoclust
from autoclust.errors import ModelLoadError

RNG = np.random.default_rng(3)


def mixed_model() -> onnx.ModelProto:
    """y = (x @ w + b) * scale, plus initializers of every kind a reader meets: large ones
    of several dtypes (stubs), small ones (kept in the proto), 4-bit and string tensors
    (packed: kept) and a large one stored as float_data instead of raw bytes (kept)."""
    w = RNG.standard_normal((64, 48)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(RNG.standard_normal(48).astype(np.float32), "b"),
             numpy_helper.from_array(np.float32(0.5), "scale"),
             numpy_helper.from_array(np.arange(2000, dtype=np.int64), "idx"),
             numpy_helper.from_array(RNG.standard_normal(3000).astype(np.float16), "half"),
             numpy_helper.from_array(RNG.integers(0, 2, 1500).astype(bool), "mask"),
             helper.make_tensor("unpacked", TensorProto.FLOAT, [1100],
                                RNG.standard_normal(1100).astype(np.float32).tolist()),
             helper.make_tensor("nibbles", TensorProto.INT4, [2050], [1, -2] * 1025),
             helper.make_tensor("words", TensorProto.STRING, [2], [b"a", b"bc"])]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Mul", ["a", "scale"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 48])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (strings: same values)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tolist() == b.tolist() if a.dtype == object else a.tobytes() == b.tobytes()


@pytest.mark.parametrize("as_bytes", [False, True])
def test_read_model_matches_onnx_load(tmp_path, as_bytes):
    model = mixed_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    source = path.read_bytes() if as_bytes else str(path)
    loaded = reader.read_model(source)
    assert loaded.stubs == {"w", "idx", "half", "mask"} == set(loaded.weights)
    want = initializers(onnx.load(path))
    for name, arr in loaded.weights.items():
        assert same(arr, want[name]), name
        assert arr.ctypes.data % arr.dtype.alignment == 0 and not arr.flags.writeable, name
    for t in loaded.proto.graph.initializer:  # stubs name their data; the rest is whole
        assert reader.is_stub(t) == (t.name in loaded.stubs), t.name
        assert not t.raw_data if t.name in loaded.stubs else t.name != "w", t.name
    assert loaded.proto.ByteSize() < 8000 and model.ByteSize() > 40_000
    assert loaded.proto.graph.node == model.graph.node
    assert initializers(loaded.full_proto()).keys() == want.keys()
    for name, arr in initializers(loaded.full_proto()).items():
        assert same(arr, want[name]), name


def test_bytes_weights_are_views_where_aligned():
    data = mixed_model().SerializeToString()
    loaded = reader.read_model(data)
    base = np.frombuffer(data, np.uint8)
    shared = {n for n, a in loaded.weights.items() if np.shares_memory(a, base)}
    for name, arr in loaded.weights.items():
        offset = data.find(arr.tobytes())
        aligned = (base.ctypes.data + offset) % arr.dtype.alignment == 0
        assert (name in shared) == aligned, name
    assert "mask" in shared  # bool: every offset is aligned


def test_import_and_session_read_no_whole_protobuf(tmp_path, monkeypatch):
    model = mixed_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None,
                                                                                {"x": x})
    graph = import_model(str(path))
    np.testing.assert_array_equal(graph.initializers["w"], initializers(model)["w"])

    def refuse(*args, **kwargs):
        raise AssertionError("the whole protobuf was parsed")

    monkeypatch.setattr(onnx, "load", refuse)
    monkeypatch.setattr(onnx, "load_model_from_string", refuse)
    monkeypatch.setattr(numpy_helper, "to_array", lambda t, *a: refuse() if t.name == "w"
                        else TO_ARRAY(t, *a))
    for source in (str(path), path.read_bytes()):
        sess = autoclust.InferenceSession(source, min_cluster_size=1, autotune=False)
        assert sess.plan.clusters
        (got,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)


TO_ARRAY = numpy_helper.to_array


def test_pass_through_session_does_not_read_weights(tmp_path, monkeypatch):
    model = mixed_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    monkeypatch.setattr(reader._FileSource, "array", lambda *a: pytest.fail("weights read"))
    sess = autoclust.InferenceSession(str(path), auto_jit=0)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None,
                                                                                {"x": x})
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want[0])
    assert load_model(str(path), weights=False).weights == {}


def test_unusual_wire_data_falls_back_to_the_parser(tmp_path):
    model = mixed_model()
    data = model.SerializeToString()
    # two graph fields merge in protobuf: the reader leaves that to the parser
    extra = onnx.ModelProto(graph=helper.make_graph([], "", [], [], [
        numpy_helper.from_array(np.ones(2000, np.float32), "more")])).SerializeToString()
    assert reader.read_model(data + extra) is None
    merged = load_model(data + extra)
    assert {t.name for t in merged.proto.graph.initializer} >= {"w", "more"}
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])  # truncated inside a tensor
    assert reader.read_model(str(path)) is None
    with pytest.raises(ModelLoadError, match="cannot load: DecodeError"):
        load_model(str(path))
    with pytest.raises(ModelLoadError, match="cannot load: DecodeError"):
        autoclust.InferenceSession(str(path))


def test_external_data_still_loads(tmp_path):
    model = mixed_model()
    want = initializers(model)
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.bin",
              size_threshold=1024)
    loaded = load_model(str(path))
    assert loaded.stubs == set()  # external data: onnx's loader reads it into the proto
    got = import_model(str(path)).initializers
    for name in ("w", "idx", "half"):
        assert same(got[name], want[name]), name


@pytest.mark.speed
def test_reading_weights_costs_less_than_parsing_them(tmp_path):
    # 28 MB of weights: read_model (tags, then one read per tensor) against onnx.load plus
    # numpy_helper's copies, the way a session read a model before; medians of 3, and a
    # generous bound (the reader measured 3.5x faster on the loaded build machine)
    tensors = [numpy_helper.from_array(RNG.standard_normal((768, 768)).astype(np.float32),
                                       f"w{i}") for i in range(12)]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              tensors)
    path = str(tmp_path / "big.onnx")
    onnx.save(helper.make_model(graph), path)

    def median(fn) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return sorted(times)[1]

    parse = median(lambda: initializers(onnx.load(path)))
    read = median(lambda: reader.read_model(path))
    assert read < 0.8 * parse, (read, parse)
