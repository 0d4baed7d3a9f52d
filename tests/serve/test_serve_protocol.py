"""The KServe v2 protocol layer without Ray: every kind of bad request gets its status and a
message naming the input and what was expected, and good ones (JSON, binary, compressed,
tritonclient's own encoding) get onnxruntime's answers."""

import gzip
import json
import os
import time

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.serve import batching, protocol
from autoclust.serve.endpoint import Endpoint, ServeConfig
from support import paths

MODELS = paths.MODELS
MLP = os.path.join(MODELS, "mlp_gelu.onnx")  # x f32[batch, 64] -> logits f32[batch, 16]
BERT = os.path.join(MODELS, "bert_encoder.onnx")  # input_ids, attention_mask i64[batch, seq]
INFER = "/v2/models/mlp_gelu/infer"
TYPES_TEXT = """
<ir_version: 10, opset_import: ["" : 17]>
types (uint8[n] a, bool[n] flag, float16[n] h) => (float16[n] y, int64[n] wide) {
    af = Cast<to = 10>(a)
    off = Not(flag)
    y = Where(off, h, af)
    wide = Cast<to = 7>(a)
}
"""


@pytest.fixture(scope="module")
def mlp():
    return Endpoint(ServeConfig(MLP, limits=protocol.Limits(
        max_body_bytes=1 << 20, max_input_bytes=1 << 20, max_json_bytes=1 << 19)))


@pytest.fixture(scope="module")
def types_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("types") / "types.onnx"
    onnx.save(onnx.parser.parse_model(TYPES_TEXT), str(path))
    return str(path)


def post(endpoint, request, binary=b"", headers=None, path=None):
    body = json.dumps(request).encode() if not isinstance(request, bytes) else request
    head = dict(headers or {})
    if binary:
        head.setdefault(protocol.HEADER_LENGTH, str(len(body)))
    return endpoint.handle("POST", path or f"/v2/models/{endpoint.name}/infer", head,
                           body + binary)


def answer(reply):
    """The outputs of a 200 reply by name (binary ones decoded as tritonclient does)."""
    assert reply.status == 200, reply.body
    n = int(reply.headers.get(protocol.HEADER_LENGTH, len(reply.body)))
    head, offset, out = json.loads(reply.body[:n]), n, {}
    for o in head["outputs"]:
        dtype = protocol.DTYPES[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[o["name"]] = np.array(o["data"], dtype).reshape(o["shape"])
        else:
            raw = reply.body[offset:offset + size]
            out[o["name"]] = np.frombuffer(raw, dtype).reshape(o["shape"])
            offset += size
    return head, out


def x_input(x, binary=False):
    entry = {"name": "x", "shape": list(x.shape), "datatype": "FP32"}
    if binary:
        entry["parameters"] = {"binary_data_size": x.nbytes}
    else:
        entry["data"] = x.ravel().tolist()
    return entry


def reference(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("binary", [False, True])
def test_infer_json_and_binary_match_onnxruntime(mlp, binary):
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    req = {"id": "req-7", "inputs": [x_input(x, binary)],
           "outputs": [{"name": "logits", "parameters": {"binary_data": binary}}]}
    head, out = answer(post(mlp, req, x.tobytes() if binary else b""))
    assert head["id"] == "req-7" and head["model_name"] == "mlp_gelu"
    np.testing.assert_allclose(out["logits"], reference(MLP, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_nested_json_data_gzip_body_and_binary_data_output(mlp):
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    req = {"inputs": [{"name": "x", "shape": [2, 64], "datatype": "FP32",
                       "data": x.tolist()}], "parameters": {"binary_data_output": True}}
    reply = post(mlp, gzip.compress(json.dumps(req).encode()),
                 headers={"content-encoding": "gzip"})
    assert protocol.HEADER_LENGTH in reply.headers  # binary_data_output: outputs in binary
    np.testing.assert_allclose(answer(reply)[1]["logits"], reference(MLP, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_narrow_types_bool_uint8_float16(types_model):
    ep = Endpoint(ServeConfig(types_model))
    a = np.array([0, 7, 255, 3], np.uint8)
    flag = np.array([True, False, True, False])
    h = np.array([0.5, -np.inf, np.nan, 65504], np.float16)
    inputs = [{"name": "a", "shape": [4], "datatype": "UINT8", "data": a.tolist()},
              {"name": "flag", "shape": [4], "datatype": "BOOL",
               "parameters": {"binary_data_size": 4}},
              {"name": "h", "shape": [4], "datatype": "FP16", "data": h.tolist()}]
    out = answer(post(ep, {"inputs": inputs}, flag.tobytes()))[1]
    want = reference(types_model, {"a": a, "flag": flag, "h": h})
    np.testing.assert_array_equal(out["y"], want[0])  # NaN and inf travel through JSON too
    assert out["wide"].dtype == np.int64 and out["wide"].tolist() == want[1].tolist()


def test_binary_bool_bytes_other_than_0_and_1_are_true(types_model):
    ep = Endpoint(ServeConfig(types_model))
    a, h = np.array([1, 2, 3, 4], np.uint8), np.zeros(4, np.float16)
    inputs = [{"name": "a", "shape": [4], "datatype": "UINT8", "data": a.tolist()},
              {"name": "flag", "shape": [4], "datatype": "BOOL",
               "parameters": {"binary_data_size": 4}},
              {"name": "h", "shape": [4], "datatype": "FP16", "data": h.tolist()}]
    out = answer(post(ep, {"inputs": inputs}, bytes([2, 0, 255, 1])))[1]
    flag = np.array([True, False, True, True])
    np.testing.assert_array_equal(out["y"], reference(types_model, {"a": a, "flag": flag,
                                                                    "h": h})[0])


def test_tritonclient_encoding_round_trip(mlp):
    http = pytest.importorskip("tritonclient.http", reason="tritonclient not installed "
                               '(pip install "autoclust[serve]")')
    from tritonclient.http import _utils
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    inp = http.InferInput("x", [4, 64], "FP32")
    inp.set_data_from_numpy(x)
    body, json_size = _utils._get_inference_request(
        [inp], "7", None, 0, False, False, 0, None, None)
    reply = mlp.handle("POST", INFER, {protocol.HEADER_LENGTH: str(json_size)}, body)
    result = http.InferResult.from_response_body(
        reply.body, header_length=int(reply.headers[protocol.HEADER_LENGTH]))
    np.testing.assert_allclose(result.as_numpy("logits"), reference(MLP, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_metadata_health_and_explain(mlp):
    meta = json.loads(mlp.handle("GET", "/v2/models/mlp_gelu", {}, b"").body)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 16]}]
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp_gelu/ready",
                 "/v2/models/mlp_gelu/versions/1"):
        assert mlp.handle("GET", path, {}, b"").status == 200, path
    text = mlp.handle("GET", "/v2/models/mlp_gelu/explain", {}, b"").body.decode()
    assert "Built 1 cluster covering 12/12 nodes" in text and "signatures compiled" in text


X2 = {"name": "x", "shape": [2, 64], "datatype": "FP32", "data": [0.5] * 128}
BIN = {"name": "x", "shape": [2, 64], "datatype": "FP32", "parameters": {"binary_data_size": 512}}
# (request, binary tail, extra headers, status, words the message must hold)
BAD = [
    (b"{not json", b"", {}, 400, ["malformed JSON"]),
    (b"[1, 2]", b"", {}, 400, ["must be a JSON object"]),
    ({}, b"", {}, 400, ["'inputs' must be a list"]),
    ({"inputs": [{**X2, "name": "z"}]}, b"", {}, 400, ["unknown input 'z'", "inputs are: x"]),
    ({"inputs": [X2, X2]}, b"", {}, 400, ["input 'x' is given twice"]),
    ({"inputs": [{**X2, "datatype": "FP64"}]}, b"", {}, 400,
     ["input 'x'", "datatype 'FP64', expected FP32"]),
    ({"inputs": [{**X2, "shape": [128]}]}, b"", {}, 400,
     ["input 'x'", "rank 1, expected rank 2 [-1, 64]"]),
    ({"inputs": [{**X2, "shape": [4, 32]}]}, b"", {}, 400, ["input 'x'", "dim 1 is 32, expected 64"]),
    ({"inputs": [{**X2, "shape": [2, -64]}]}, b"", {}, 400, ["input 'x'", "non-negative integers"]),
    ({"inputs": [{**X2, "data": [0.5] * 10}]}, b"", {}, 400,
     ["input 'x'", "10 values, expected 128 for shape [2, 64]"]),
    ({"inputs": [{**X2, "data": [[0.5] * 64, [0.5] * 63]}]}, b"", {}, 400,
     ["input 'x'", "not a regular array"]),
    ({"inputs": [{**X2, "data": ["a"] * 128}]}, b"", {}, 400, ["input 'x'", "FP32 takes numbers"]),
    ({"inputs": [{**X2, "data": 0.5}]}, b"", {}, 400, ["input 'x'", "must be a list"]),
    ({"inputs": [{k: v for k, v in X2.items() if k != "data"}]}, b"", {}, 400,
     ["input 'x' has neither 'data' nor binary_data_size"]),
    ({"inputs": [{**BIN, "data": [0.5] * 128}]}, bytes(512), {}, 400,
     ["input 'x' has both"]),
    ({"inputs": [{**BIN, "parameters": {"binary_data_size": 100}}]}, bytes(100), {}, 400,
     ["input 'x'", "binary_data_size is 100, expected 512 for FP32 [2, 64]"]),
    ({"inputs": [BIN]}, bytes(300), {}, 400, ["300 bytes of binary tensor data", "add up to 512"]),
    (json.dumps({"inputs": [BIN]}).encode(), bytes(512), {protocol.HEADER_LENGTH: "9999"}, 400,
     ["Inference-Header-Content-Length is 9999 but the body has"]),
    (json.dumps({"inputs": [BIN]}).encode(), bytes(512), {protocol.HEADER_LENGTH: "ten"}, 400,
     ["Inference-Header-Content-Length is 'ten'; expected a byte count"]),
    ({"inputs": [X2], "outputs": [{"name": "probs"}]}, b"", {}, 400,
     ["unknown output 'probs'", "outputs are: logits"]),
    ({"inputs": [X2], "outputs": [{"name": "logits", "parameters": {"classification": 3}}]},
     b"", {}, 400, ["output 'logits'", "classification extension is not supported"]),
    ({"inputs": [X2], "id": 7}, b"", {}, 400, ["request id must be a string"]),
    ({"inputs": [X2], "parameters": {"timeout": "soon"}}, b"", {}, 400,
     ["parameter 'timeout'", "microseconds"]),
    ({"inputs": [{**X2, "shape": [10**9, 64], "data": []}]}, b"", {}, 413,
     ["256000000000 bytes", "input 'x': FP32 [1000000000, 64]", "--max_input_mb"]),
    ({"inputs": [{**X2, "shape": [4000, 64], "data": [0.5] * 256000}]}, b"", {}, 413,
     ["body is", "over the limit", "--max_request_mb"]),
    ({"inputs": [{**X2, "shape": [2000, 64], "data": [0.5] * 128000}]}, b"", {}, 413,
     ["JSON part of the request is", "--max_json_mb", "binary data"]),
    (b"[" * 100000 + b"]" * 100000, b"", {}, 400, ["malformed JSON"]),
    (b"plain", b"", {"content-encoding": "br"}, 400, ["Content-Encoding 'br' is not supported"]),
    (b"not gzip at all", b"", {"content-encoding": "gzip"}, 400, ["does not decompress"]),
    (gzip.compress(bytes(4 << 20)), b"", {"content-encoding": "gzip"}, 413,
     ["decompresses to over 1048576 bytes"]),
]


@pytest.mark.parametrize("request_, binary, headers, status, words", BAD,
                         ids=[b[4][-1][:40] for b in BAD])
def test_bad_request_status_and_message(mlp, request_, binary, headers, status, words):
    reply = post(mlp, request_, binary, headers)
    message = json.loads(reply.body)["error"]
    assert reply.status == status, message
    for w in words:
        assert w in message, (w, message)


def test_server_serves_on_after_every_bad_request_and_counts_them(mlp):
    before = dict(mlp.metrics.requests)
    for request_, binary, headers, _, _ in BAD:
        post(mlp, request_, binary, headers)
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(answer(post(mlp, {"inputs": [x_input(x)]}))[1]["logits"],
                               reference(MLP, {"x": x})[0], rtol=1e-5, atol=1e-6)
    counts = {s: mlp.metrics.requests[s] - before.get(s, 0) for s in (200, 400, 413)}
    assert counts == {200: 1, 400: sum(b[3] == 400 for b in BAD),
                      413: sum(b[3] == 413 for b in BAD)}


def test_huge_shape_is_refused_before_allocating(mlp):
    big = {"inputs": [{"name": "x", "shape": [2**40, 64], "datatype": "FP32",
                       "parameters": {"binary_data_size": 2**48}}]}
    start = time.perf_counter()
    reply = post(mlp, big)
    assert reply.status == 413 and time.perf_counter() - start < 1.0


def types_request(a=(1, 2), flag=(True, False), h=(0.5, 1.5), drop=()):
    entries = [{"name": "a", "shape": [len(a)], "datatype": "UINT8", "data": list(a)},
               {"name": "flag", "shape": [len(flag)], "datatype": "BOOL", "data": list(flag)},
               {"name": "h", "shape": [len(h)], "datatype": "FP16", "data": list(h)}]
    return {"inputs": [e for e in entries if e["name"] not in drop]}


@pytest.mark.parametrize("request_, status, words", [
    (types_request(a=(1, 300)), 400, ["input 'a'", "value 300 is out of range for UINT8"]),
    (types_request(a=(1, -1)), 400, ["input 'a'", "value -1 is out of range for UINT8"]),
    (types_request(a=(1, 1.5)), 400, ["input 'a'", "UINT8 takes integers, got"]),
    (types_request(flag=(1, 0)), 400, ["input 'flag'", "BOOL takes true or false"]),
    (types_request(h=(0.5, "x")), 400, ["input 'h'", "FP16 takes numbers"]),
    (types_request(h=(0.5, 1, 2)), 400, ["input 'h': dim 0 (n) is 3, but input 'a' has n = 2"]),
    (types_request(drop=("h",)), 400, ["missing input(s) h", "inputs are: a, flag, h"]),
])
def test_bad_values_for_narrow_types(types_model, request_, status, words):
    reply = post(Endpoint(ServeConfig(types_model)), request_)
    message = json.loads(reply.body)["error"]
    assert reply.status == status, message
    assert all(w in message for w in words), message


def test_symbolic_dims_shared_by_inputs_must_agree():
    """One name, one size: checked before the session sees the inputs (where disagreeing
    dims would fail a compile and send the cluster to onnxruntime)."""
    ep = Endpoint(ServeConfig(BERT))
    ids = {"name": "input_ids", "shape": [1, 8], "datatype": "INT64", "data": [1] * 8}
    mask = {"name": "attention_mask", "shape": [1, 9], "datatype": "INT64", "data": [1] * 9}
    reply = post(ep, {"inputs": [ids, mask]})
    assert reply.status == 400
    assert json.loads(reply.body)["error"] == ("input 'attention_mask': dim 1 (seq) is 9, but "
                                               "input 'input_ids' has seq = 8")
    good = post(ep, {"inputs": [ids, {**mask, "shape": [1, 8], "data": [1] * 8}]})
    feeds = {n: np.ones((1, 8), np.int64) for n in ("input_ids", "attention_mask")}
    np.testing.assert_allclose(answer(good)[1]["last_hidden_state"], reference(BERT, feeds)[0],
                               rtol=1e-4, atol=1e-5)
    assert all(c["fallback"] is None for c in ep.session.stats()["clusters"])


@pytest.mark.parametrize("method, path, status, words", [
    ("GET", "/v2/models/resnet", 404, ["unknown model 'resnet'", "serves 'mlp_gelu'"]),
    ("GET", "/v2/models/mlp_gelu/versions/2", 404, ["no version '2'"]),
    ("GET", "/v2/models/mlp_gelu/stats", 404, ["no route"]),
    ("GET", INFER, 405, ["takes POST, got GET"]),
])
def test_routes(mlp, method, path, status, words):
    reply = mlp.handle(method, path, {}, b"")
    assert reply.status == status and all(w in json.loads(reply.body)["error"] for w in words)


def test_batch_dim_and_its_refusal():
    inputs = [protocol.TensorSpec("x", "FP32", (-1, 64), ("batch", None))]
    outputs = [protocol.TensorSpec("y", "FP32", (-1,), ("batch",))]
    assert batching.batch_dim(inputs, outputs) == "batch"
    with pytest.raises(Exception, match="input 'k' has dim 0 1 where input 'x' has 'batch'"):
        Endpoint(ServeConfig(os.path.join(MODELS, "mixed_dynamic.onnx"), max_batch_size=4))


def test_run_batch_groups_pads_splits_and_isolates_errors(mlp):
    rng = np.random.default_rng(3)
    parse = mlp.parse
    reqs = [parse({}, json.dumps({"inputs": [x_input(x)]}).encode())
            for x in (rng.standard_normal((n, 64)).astype(np.float32) for n in (1, 2, 2))]
    calls = []

    def run(feeds, names):
        calls.append(len(feeds["x"]))
        return mlp.run_feeds(feeds, names)

    answers = batching.run_batch(run, reqs)
    assert calls[0] == 8  # 5 rows padded to a power of two, one run
    for r, a in zip(reqs, answers):
        want = reference(MLP, r.inputs)[0]
        np.testing.assert_allclose(a["logits"], want, rtol=1e-5, atol=1e-6)
    calls.clear()

    def failing(feeds, names):
        calls.append(len(feeds["x"]))
        if len(feeds["x"]) != 1:
            raise ValueError("boom")
        return mlp.run_feeds(feeds, names)

    answers = batching.run_batch(failing, reqs)
    assert calls == [8, 1, 2, 2]  # the batch failed: each request ran alone
    assert isinstance(answers[1], ValueError) and isinstance(answers[2], ValueError)
    np.testing.assert_allclose(answers[0]["logits"], reference(MLP, reqs[0].inputs)[0],
                               rtol=1e-5, atol=1e-6)


def serve_args(*argv):
    from autoclust.tools import cli
    return cli.parser().parse_args(["serve", *argv])


def test_serve_command_checks_before_ray_starts(tmp_path):
    from autoclust.serve import command

    from autoclust.errors import AutoclustError
    config, scale = command.build(serve_args(MLP, "--replicas", "2", "--replica_cpus", "1"))
    assert config.model_name() == "mlp_gelu" and "--threads=1" in config.flags
    assert scale.replicas == 2 and scale.replica_cpus == 1
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(AutoclustError, match="refusing --cache_dir .* writable by other users"):
        command.build(serve_args(MLP, "--cache_dir", str(loose)))
    config, _ = command.build(serve_args(MLP, "--cache_dir", str(loose), "--cache_trusted"))
    assert "--cache_trusted" in config.flags
    for argv, words in ((["nope.onnx"], "nope.onnx"), ([MLP, "--flags=--bogus"], "--bogus"),
                        ([MLP, "--replicas", "0"], "--replicas must be at least 1"),
                        ([os.path.join(MODELS, "mixed_dynamic.onnx"), "--max_batch_size", "4"],
                         "needs a batch dim")):
        with pytest.raises(AutoclustError, match=words):
            command.build(serve_args(*argv))


def test_predictor_without_ray():
    from autoclust.serve import Predictor

    from autoclust import errors
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    actor = Predictor(MLP)()  # what each Ray Data actor does
    out = actor({"x": x, "id": np.arange(5)})
    assert sorted(out) == ["id", "logits", "x"]
    np.testing.assert_allclose(out["logits"], reference(MLP, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert sorted(Predictor(MLP, keep_columns=False)()({"x": x})) == ["logits"]
    with pytest.raises(errors.InvalidInputError, match="no column for model input.* x; its "
                                                      "columns are: features"):
        actor({"features": x})
    with pytest.raises(errors.InvalidInputError, match="NumPy batches"):
        actor([x])
    with pytest.raises(errors.FlagError, match="--bogus"):
        Predictor(MLP, flags="--bogus")
