"""Read an ONNX model once: its structure as a small ModelProto, its weights as arrays.

onnx.load parses the whole protobuf (BERT-base: 436 MB, 0.25-0.6 s) and numpy_helper then
copies every weight out of it (0.23 s). `read_model` instead walks the protobuf wire format
of the file (or bytes) to the main graph's initializers, reading only tags and lengths:
each large tensor's raw bytes go once, straight from the file into an aligned array (from
bytes: a view where the offset is aligned for the dtype), and the rest (nodes, types, small
tensors) is parsed as a light ModelProto in which those initializers are stubs, written as
export_model writes them: external data whose location is the tensor's own name. The
importer takes the arrays as they are and onnxruntime takes them as OrtValues
(`SessionOptions.add_external_initializers`), so nobody parses or copies them again.

Anything unusual (groups, a repeated graph field, a truncated file) makes `read_model`
return None: the caller loads the model the ordinary way and reports its errors.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import sys
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

SMALL_TENSOR = 1024  # elements: smaller initializers stay in the proto (shape inference
                     # propagates their values; Reshape shapes and the like)
# element types numpy_helper.to_array does not read as np.frombuffer(raw, dtype)
_PACKED = {TensorProto.STRING, TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1,
           getattr(TensorProto, "INT2", -1), getattr(TensorProto, "UINT2", -1),
           getattr(TensorProto, "FLOAT6E2M3", -1), getattr(TensorProto, "FLOAT6E3M2", -1)}
_GRAPH, _INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
# TensorProto fields
_DIMS, _DATA_TYPE, _SEGMENT, _RAW, _EXTERNAL_DATA, _LOCATION, _NAME = 1, 2, 3, 9, 13, 14, 8


@dataclasses.dataclass
class LoadedModel:
    """A model read by read_model: `proto`, in which the initializers named in `stubs` are
    stubs whose arrays are `weights` (empty when read without them)."""

    proto: ModelProto
    weights: dict[str, np.ndarray]
    stubs: set[str] = dataclasses.field(default_factory=set)
    where: str = "model"

    def full_proto(self) -> ModelProto:
        """A ModelProto with the weights written back in (a copy: dumps, tools)."""
        full = ModelProto()
        full.CopyFrom(self.proto)
        for t in full.graph.initializer:
            arr = self.weights.get(t.name)
            if arr is not None and is_stub(t):
                del t.external_data[:]
                t.ClearField("data_location")
                t.raw_data = np.ascontiguousarray(arr).tobytes()
        return full


class _Unusual(Exception):
    """Wire data this reader leaves to the protobuf parser."""


def is_stub(tensor: TensorProto) -> bool:
    """Whether `tensor` is a stub whose data lives in memory under its own name."""
    return (tensor.data_location == TensorProto.EXTERNAL and len(tensor.external_data) == 1
            and tensor.external_data[0].key == "location"
            and tensor.external_data[0].value == tensor.name)


def read_model(source: str | bytes, weights: bool = True) -> LoadedModel | None:
    """The model at path `source` (or in bytes `source`) as a LoadedModel, its weights
    read unless `weights` is False; None when its wire data is unusual (the caller then
    parses it whole). Raises OSError for files."""
    if sys.byteorder != "little":
        return None
    if isinstance(source, bytes):
        return _read(_BytesSource(source, weights))
    with open(source, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _read(_FileSource(mm, f.fileno(), size, weights))


class _BytesSource:
    """Model bytes: weights are views of them where aligned, else copies."""

    def __init__(self, data: bytes, read_weights: bool):
        self.read_weights = read_weights
        self.buf = data
        self.size = len(data)
        self.base = np.frombuffer(data, np.uint8) if data else None

    def array(self, start: int, dtype: np.dtype, count: int) -> np.ndarray:
        view = self.base[start:start + count * dtype.itemsize].view(dtype)
        if view.ctypes.data % dtype.alignment:
            view = view.copy()
            view.flags.writeable = False  # as the views over the (immutable) bytes
        return view


class _FileSource:
    """A model file mapped for reading its tags; weights are read into fresh arrays."""

    def __init__(self, mm: mmap.mmap, fd: int, size: int, read_weights: bool):
        self.read_weights = read_weights
        self.buf = mm
        self.fd = fd
        self.size = size

    def array(self, start: int, dtype: np.dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype)
        raw = memoryview(out.view(np.uint8))
        done = 0
        while done < len(raw):  # one read per tensor, straight into the array
            n = os.preadv(self.fd, [raw[done:]], start + done)
            if n <= 0:
                raise _Unusual("the file ended inside a tensor")
            done += n
        out.flags.writeable = False  # as numpy_helper's arrays over the proto's bytes
        return out


# ---- the wire format ------------------------------------------------------------------

def _varint(buf: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Unusual("varint longer than 10 bytes")


def _fields(buf: Any, start: int, end: int):
    """(number, wire type, start of the key, start of the value, end) of each field."""
    pos = start
    while pos < end:
        key_at = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, stop = _varint(buf, pos)
        elif wire == 1:
            stop = pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            stop = pos + n
        elif wire == 5:
            stop = pos + 4
        else:  # groups (3, 4) and invalid wire types
            raise _Unusual(f"wire type {wire}")
        if stop > end:
            raise _Unusual("a field runs past its message")
        yield number, wire, key_at, pos, stop
        pos = stop


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# ---- reading --------------------------------------------------------------------------

def _read(src: Any) -> LoadedModel | None:
    model = LoadedModel(ModelProto(), {})
    try:
        fields = list(_fields(src.buf, 0, src.size))
        graphs = [f for f in fields if f[0] == _GRAPH and f[1] == 2]
        if len(graphs) != 1:  # none: not a model (the parser says so); several merge
            return None
        light = bytearray()
        for number, wire, key_at, at, stop in fields:
            if number == _GRAPH and wire == 2:
                light += _delimited(_GRAPH, _light_graph(src, at, stop, model))
            else:
                light += src.buf[key_at:stop]
    except (_Unusual, IndexError):
        return None
    try:
        model.proto.ParseFromString(bytes(light))
    except Exception:  # noqa: BLE001 - the ordinary parser reports the error
        return None
    return model


def _light_graph(src: Any, start: int, end: int, model: LoadedModel) -> bytes:
    out = bytearray()
    for number, wire, key_at, at, stop in _fields(src.buf, start, end):
        light = None
        if number == _INITIALIZER and wire == 2:
            light = _light_tensor(src, at, stop, model)
        out += src.buf[key_at:stop] if light is None else _delimited(_INITIALIZER, light)
    return bytes(out)


def _light_tensor(src: Any, start: int, end: int, model: LoadedModel) -> bytes | None:
    """The stub of a large tensor with raw data (its array into model.weights); None:
    keep the tensor as it is."""
    dims: list[int] = []
    data_type, name, raw, kept = 0, None, None, []
    for number, wire, key_at, at, stop in _fields(src.buf, start, end):
        if number == _DIMS:
            if wire == 2:  # packed
                pos = at
                while pos < stop:
                    d, pos = _varint(src.buf, pos)
                    dims.append(_signed(d))
            else:
                dims.append(_signed(_varint(src.buf, at)[0]))
        elif number == _DATA_TYPE and wire == 0:
            data_type = _varint(src.buf, at)[0]
        elif number == _NAME and wire == 2:
            name = bytes(src.buf[at:stop]).decode("utf-8", "replace")
        elif number == _RAW and wire == 2:
            raw = (at, stop)
            continue
        elif number in (_SEGMENT, _EXTERNAL_DATA, _LOCATION):
            return None  # segments, external data: the ordinary loader's business
        kept.append((key_at, stop))
    dtype = _plain_dtype(data_type)
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if (raw is None or not name or name in model.stubs or dtype is None
            or count <= SMALL_TENSOR or min(dims, default=0) < 0
            or count * dtype.itemsize != raw[1] - raw[0]):
        return None  # small, odd or broken: numpy_helper reads it (and reports errors)
    model.stubs.add(name)
    if src.read_weights:
        model.weights[name] = src.array(raw[0], dtype, count).reshape(dims)
    out = bytearray()
    for a, b in kept:
        out += src.buf[a:b]
    out += _encode_varint(_LOCATION << 3) + _encode_varint(TensorProto.EXTERNAL)
    entry = _delimited(1, b"location") + _delimited(2, name.encode("utf-8"))
    out += _delimited(_EXTERNAL_DATA, entry)
    return bytes(out)


def _plain_dtype(data_type: int) -> np.dtype | None:
    """The numpy dtype whose bytes are the tensor's raw bytes (None: packed or unknown)."""
    if data_type in _PACKED or data_type == TensorProto.UNDEFINED:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, TypeError, ValueError):
        return None
