"""The KServe v2 / Triton HTTP inference protocol: requests in, responses out, plain Python.

    POST /v2/models/{name}/infer   body: a JSON request, or with the binary tensor data
                                   extension a JSON header of `Inference-Header-Content-Length`
                                   bytes followed by the inputs' raw bytes in input order

Every check here runs before anything the size of a tensor is allocated: the body's size,
each input's name, datatype, rank and fixed dims against the model, and the bytes its shape
needs against the request limit. A bad request raises ProtocolError (status 400 or 413)
whose message names the input and what was expected; the server answers it and serves on.
No Ray here: the deployment (`deployment.py`) and the tests without Ray share this module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from typing import Any

import ml_dtypes
import numpy as np

HEADER_LENGTH = "inference-header-content-length"  # HTTP headers are case-insensitive
# KServe v2 datatype -> NumPy dtype (BYTES, the string type, is not served).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
DATATYPES = {dtype: name for name, dtype in DTYPES.items()}
# onnxruntime's NodeArg.type spelling -> KServe v2 datatype
_ORT_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
}


class ProtocolError(Exception):
    """A request the server refuses: an HTTP status (400, 404, 405, 413, 504) and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for; checked before anything is allocated."""

    max_body_bytes: int = 64 << 20  # the request body as received (and decompressed)
    max_input_bytes: int = 256 << 20  # all input tensors of one request, as arrays
    timeout_s: float = 60.0  # one inference, queueing for a batch included
    # the JSON part of a request: parsed into Python objects of ~30 bytes per number, so it
    # is held well below the body limit (binary tensors cost their own size only)
    max_json_bytes: int = 8 << 20


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, KServe datatype, shape (-1 for a symbolic dim),
    and the symbolic dims' names (None where fixed)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    dim_names: tuple[str | None, ...]

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.datatype]

    def json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclasses.dataclass
class InferRequest:
    """A parsed, checked inference request: arrays by input name, the outputs asked for
    (name -> as binary data), the request id."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool]
    id: str | None = None
    timeout_s: float | None = None  # the request's own `timeout` parameter, if shorter


def tensor_spec(node_arg: Any, kind: str) -> TensorSpec:
    """A TensorSpec from an onnxruntime-style NodeArg; ValueError for what v2 cannot carry."""
    datatype = _ORT_TYPES.get(node_arg.type)
    if datatype is None:
        raise ValueError(f"{kind} {node_arg.name!r} has type {node_arg.type}; autoclust serve "
                         f"carries tensors of {', '.join(DTYPES)}")
    dims = list(node_arg.shape) if node_arg.shape is not None else None
    if dims is None:
        raise ValueError(f"{kind} {node_arg.name!r} has no declared rank; autoclust serve "
                         "needs one to check requests")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in dims)
    names = tuple(d if isinstance(d, str) else None for d in dims)
    return TensorSpec(node_arg.name, datatype, shape, names)


def model_metadata(name: str, version: str, inputs: list[TensorSpec],
                   outputs: list[TensorSpec]) -> dict[str, Any]:
    """The body of GET /v2/models/{name}."""
    return {"name": name, "versions": [version], "platform": "autoclust_onnx",
            "inputs": [s.json() for s in inputs], "outputs": [s.json() for s in outputs]}


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The request body without its Content-Encoding (gzip, deflate), at most `limit`
    bytes: a small compressed body never inflates past the limit in memory."""
    if not encoding or encoding == "identity":
        return body
    wbits = {"gzip": 31, "deflate": 15}.get(encoding)
    if wbits is None:
        raise ProtocolError(400, f"Content-Encoding {encoding!r} is not supported; "
                                 "expected gzip or deflate")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(400, f"the {encoding} request body does not decompress: "
                                 f"{exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise ProtocolError(413, f"the request body decompresses to over {limit} bytes, "
                                 "the limit (--max_request_mb)")
    return out


def split_body(body: bytes, header_length: str | None,
               max_json_bytes: int = Limits.max_json_bytes) -> tuple[Any, bytes]:
    """(the parsed JSON header, the binary tensor data after it)."""
    if header_length is None:
        header, binary = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError(400, f"Inference-Header-Content-Length is {header_length!r}; "
                                     "expected a byte count") from None
        if not 0 <= n <= len(body):
            raise ProtocolError(400, f"Inference-Header-Content-Length is {n} but the body "
                                     f"has {len(body)} bytes")
        header, binary = body[:n], body[n:]
    if len(header) > max_json_bytes:
        raise ProtocolError(413, f"the JSON part of the request is {len(header)} bytes, over "
                                 f"the limit of {max_json_bytes} (--max_json_mb); send large "
                                 "tensors as binary data")
    try:
        request = json.loads(header)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(400, f"malformed JSON in the inference request: {exc}") from None
    if not isinstance(request, dict):
        raise ProtocolError(400, "the inference request must be a JSON object, got "
                                 f"{type(request).__name__}")
    return request, binary


def parse_infer(body: bytes, header_length: str | None, inputs: list[TensorSpec],
                outputs: list[TensorSpec], limits: Limits) -> InferRequest:
    """Check an inference request against the model and the limits; its arrays."""
    request, binary = split_body(body, header_length, limits.max_json_bytes)
    rid = request.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(400, f"request id must be a string, got {rid!r}")
    entries = _field_list(request, "inputs", required=True)
    specs = {s.name: s for s in inputs}
    claims = [_claim(entry, specs) for entry in entries]
    _check_complete(claims, inputs)
    _check_named_dims(claims)
    total = sum(nbytes for _, _, nbytes, _ in claims)
    if total > limits.max_input_bytes:
        biggest = max(claims, key=lambda c: c[2])
        raise ProtocolError(413, f"the inputs need {total} bytes (input {biggest[0].name!r}: "
                                 f"{biggest[0].datatype} {list(biggest[1])}), over the limit "
                                 f"of {limits.max_input_bytes} (--max_input_mb)")
    arrays = _arrays(claims, entries, binary)
    params = _params(request)
    wanted = _requested_outputs(request, outputs, bool(params.get("binary_data_output")))
    return InferRequest(arrays, wanted, rid, _timeout(params))


def _field_list(obj: dict, field: str, required: bool = False) -> list:
    value = obj.get(field)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ProtocolError(400, f"the request's {field!r} must be a list of objects")
    return value


def _params(obj: dict) -> dict:
    params = obj.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError(400, "'parameters' must be a JSON object")
    return params


def _claim(entry: dict, specs: dict[str, TensorSpec]
           ) -> tuple[TensorSpec, tuple[int, ...], int, int | None]:
    """(spec, shape, bytes the array needs, binary_data_size or None) of one input entry,
    checked against the model before anything is allocated."""
    name = entry.get("name")
    spec = specs.get(name) if isinstance(name, str) else None
    if spec is None:
        known = ", ".join(specs)
        raise ProtocolError(400, f"unknown input {name!r}; the model's inputs are: {known}")
    datatype = entry.get("datatype")
    if datatype != spec.datatype:
        raise ProtocolError(400, f"input {name!r}: datatype {datatype!r}, expected "
                                 f"{spec.datatype}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ProtocolError(400, f"input {name!r}: shape {shape!r} must be a list of "
                                 f"non-negative integers, expected {list(spec.shape)}")
    if len(shape) != len(spec.shape):
        raise ProtocolError(400, f"input {name!r}: shape {shape} has rank {len(shape)}, "
                                 f"expected rank {len(spec.shape)} {list(spec.shape)}")
    for axis, (got, want) in enumerate(zip(shape, spec.shape)):
        if want >= 0 and got != want:
            raise ProtocolError(400, f"input {name!r}: dim {axis} is {got}, expected {want} "
                                     f"(shape {list(spec.shape)})")
    nbytes = math.prod(shape) * spec.dtype.itemsize  # Python ints: no overflow
    size = _params(entry).get("binary_data_size")
    if size is not None:
        if type(size) is not int or size != nbytes:
            raise ProtocolError(400, f"input {name!r}: binary_data_size is {size!r}, expected "
                                     f"{nbytes} for {datatype} {shape}")
        if "data" in entry:
            raise ProtocolError(400, f"input {name!r} has both 'data' and binary_data_size")
    elif "data" not in entry:
        raise ProtocolError(400, f"input {name!r} has neither 'data' nor binary_data_size")
    return spec, tuple(shape), nbytes, size


def _check_complete(claims: list, inputs: list[TensorSpec]) -> None:
    seen: set[str] = set()
    for spec, *_ in claims:
        if spec.name in seen:
            raise ProtocolError(400, f"input {spec.name!r} is given twice")
        seen.add(spec.name)
    missing = [s.name for s in inputs if s.name not in seen]
    if missing:
        raise ProtocolError(400, f"missing input(s) {', '.join(missing)}; the model's inputs "
                                 f"are: {', '.join(s.name for s in inputs)}")


def _check_named_dims(claims: list) -> None:
    """A symbolic dim has one value in a run (ONNX: one name, one size), whichever inputs
    carry it: a request that disagrees is the client's mistake, told as such."""
    seen: dict[str, tuple[str, int]] = {}
    for spec, shape, _, _ in claims:
        for axis, (name, size) in enumerate(zip(spec.dim_names, shape)):
            if name is None:
                continue
            first = seen.setdefault(name, (spec.name, size))
            if first[1] != size:
                raise ProtocolError(400, f"input {spec.name!r}: dim {axis} ({name}) is {size}, "
                                         f"but input {first[0]!r} has {name} = {first[1]}")


def _arrays(claims: list, entries: list[dict], binary: bytes) -> dict[str, np.ndarray]:
    declared = sum(size for *_, size in claims if size is not None)
    if declared != len(binary):
        raise ProtocolError(400, f"the request carries {len(binary)} bytes of binary tensor "
                                 f"data; its inputs' binary_data_size add up to {declared}")
    arrays, offset = {}, 0
    for (spec, shape, _, size), entry in zip(claims, entries):
        if size is None:
            arrays[spec.name] = _from_json(spec, shape, entry["data"])
        else:
            count = math.prod(shape)
            if spec.datatype == "BOOL":  # any non-zero byte is true; never a bool byte of 2
                raw = np.frombuffer(binary, np.uint8, count, offset) != 0
            else:
                raw = np.frombuffer(binary, spec.dtype.newbyteorder("<"), count, offset)
            arrays[spec.name] = raw.astype(spec.dtype).reshape(shape)  # a copy: owns its data
            offset += size
    return arrays


def _from_json(spec: TensorSpec, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """The array of an input's JSON `data` (flat in row-major order, or nested)."""
    name, want = spec.name, math.prod(shape)
    if not isinstance(data, list):
        raise ProtocolError(400, f"input {name!r}: 'data' must be a list of "
                                 f"{spec.datatype} values")
    try:
        values = np.array(data)
    except (ValueError, TypeError, OverflowError):
        raise ProtocolError(400, f"input {name!r}: 'data' is not a regular array of "
                                 f"{spec.datatype} values") from None
    if values.size != want:
        raise ProtocolError(400, f"input {name!r}: 'data' has {values.size} values, expected "
                                 f"{want} for shape {list(shape)}")
    if want == 0:
        return np.zeros(shape, spec.dtype)
    target = spec.dtype
    if target == np.bool_:
        kinds, what = "b", "true or false"
    elif target.kind in "iu":
        kinds, what = "iu", "integers"
    else:  # the float types, bfloat16 included
        kinds, what = "iuf", "numbers"
    if values.dtype.kind not in kinds:
        raise ProtocolError(400, f"input {name!r}: {spec.datatype} takes {what}, got "
                                 f"{values.ravel()[0]!r} ({values.dtype})")
    if target.kind in "iu":
        info = np.iinfo(target)
        low, high = values.min(), values.max()
        if low < info.min or high > info.max:
            raise ProtocolError(400, f"input {name!r}: value {low if low < info.min else high}"
                                     f" is out of range for {spec.datatype}")
    return values.astype(target).reshape(shape)


def _requested_outputs(request: dict, outputs: list[TensorSpec],
                       binary_default: bool) -> dict[str, bool]:
    entries = _field_list(request, "outputs")
    if not entries:
        return {s.name: binary_default for s in outputs}
    known = {s.name for s in outputs}
    wanted: dict[str, bool] = {}
    for entry in entries:
        name = entry.get("name")
        if name not in known:
            raise ProtocolError(400, f"unknown output {name!r}; the model's outputs are: "
                                     f"{', '.join(s.name for s in outputs)}")
        if name in wanted:
            raise ProtocolError(400, f"output {name!r} is requested twice")
        params = _params(entry)
        if params.get("classification"):
            raise ProtocolError(400, f"output {name!r}: the classification extension is not "
                                     "supported")
        wanted[name] = bool(params.get("binary_data", binary_default))
    return wanted


def _timeout(params: dict) -> float | None:
    micros = params.get("timeout")  # Triton's request timeout, in microseconds
    if micros is None:
        return None
    if type(micros) is not int or micros < 0:
        raise ProtocolError(400, f"parameter 'timeout' is {micros!r}; expected microseconds")
    return micros / 1e6 if micros else None


def encode_infer(model: str, version: str, request: InferRequest,
                 results: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """(response body, headers): outputs in the requested order, binary ones after the JSON
    header (little-endian, row-major), the others as JSON lists."""
    outs, chunks = [], []
    for name, as_binary in request.outputs.items():
        arr = np.asarray(results[name])
        datatype = DATATYPES.get(arr.dtype)
        if datatype is None:
            raise ProtocolError(500, f"output {name!r} has dtype {arr.dtype}, which the v2 "
                                     "protocol cannot carry")
        out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if as_binary:
            raw = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<")).tobytes()
            out["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            wide = arr.astype(np.float64) if datatype == "BF16" else arr  # JSON has no bf16
            out["data"] = wide.ravel().tolist()
        outs.append(out)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outs}
    if request.id is not None:
        body["id"] = request.id
    header = json.dumps(body).encode()
    if not chunks:
        return header, {"content-type": "application/json"}
    return b"".join([header, *chunks]), {"content-type": "application/octet-stream",
                                         HEADER_LENGTH: str(len(header))}


def error_body(message: str) -> bytes:
    """The JSON body of an error response, as Triton writes it (tritonclient reads it)."""
    return json.dumps({"error": message}).encode()
