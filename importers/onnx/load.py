"""ONNX models -> autoclust Graph (import_model), and back (export_model).

import_model loads a model (path, bytes or ModelProto), checks it (SSA, no dangling
reads, no cycles, readable initializers, attribute types), runs ONNX shape inference for
intermediate dtypes and shapes, turns Constant nodes into initializers and rewrites older
opset forms into the newest one (importers/onnx/forms.py). Every node keeps its original
NodeProto, so export_model (importers/onnx/export.py) writes models onnxruntime runs
exactly as the original did.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import onnx
from autoclust.importers.onnx.export import export_model
from autoclust.importers.onnx.forms import LEGACY, normalize_node
from autoclust.importers.onnx.weights import LoadedModel, is_stub, read_model
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
    numpy_helper,
)

from autoclust import ops
from autoclust.errors import AutoclustError, ModelLoadError
from autoclust.ir import Graph, Node, Shape, Value

__all__ = ["LEGACY", "LoadedModel", "export_model", "import_model", "load_model",
           "load_model_proto"]

log = logging.getLogger("autoclust.importers.onnx")

# Shape inference and the checker serialize the whole model; protobuf caps that at 2 GB.
_MAX_INFER_BYTES = 1_500_000_000
_MAX_CHECK_BYTES = 100_000_000
_SMALL_TENSOR = 1024  # elements; larger initializers reach shape inference as stubs

ModelSource = str | os.PathLike | bytes | bytearray | memoryview | ModelProto | LoadedModel


# ---- loading --------------------------------------------------------------------------

def _describe(model: Any) -> str:
    if isinstance(model, LoadedModel):
        return model.where
    if isinstance(model, str | os.PathLike):
        return f"model file {os.fspath(model)!r}"
    if isinstance(model, bytes | bytearray | memoryview):
        return f"model bytes ({len(model)} bytes)"
    return "model"


def load_model(model: ModelSource, *, weights: bool = True) -> LoadedModel:
    """Load a model from a path, bytes or a ModelProto, its large initializers read once
    into arrays (weights.py); `weights=False` skips reading them (the stubs stay, the
    arrays are left out: for callers that only look at the graph). ModelLoadError on
    failure."""
    if isinstance(model, LoadedModel):
        return model
    where = _describe(model)
    loaded = None
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        loaded = _from_file(path, where, lambda: read_model(path, weights))
        if loaded is not None:
            _load_external(loaded, os.path.dirname(os.path.abspath(path)), where)
    elif isinstance(model, bytes | bytearray | memoryview):
        loaded = read_model(bytes(model), weights)
        if loaded is not None:
            _load_external(loaded, None, where)
    if loaded is None:  # a ModelProto, or wire data the reader leaves to the parser
        loaded = LoadedModel(load_model_proto(model), {})
    elif not loaded.proto.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (the ModelProto has no graph)")
    loaded.where = where
    return loaded


def _load_external(loaded: LoadedModel, base_dir: str | None, where: str) -> None:
    """Data in external files (other than our stubs) into the proto, as onnx.load does."""
    from onnx.external_data_helper import (
        _get_all_tensors,
        load_external_data_for_tensor,
        uses_external_data,
    )
    for tensor in _get_all_tensors(loaded.proto):
        if not uses_external_data(tensor) or is_stub(tensor) and tensor.name in loaded.stubs:
            continue
        if base_dir is None:
            raise ModelLoadError(f"{where}: tensor {tensor.name!r} has its data in an external "
                                 "file, but the model was not loaded from a file")
        try:
            load_external_data_for_tensor(tensor, base_dir)
        except Exception as e:
            raise ModelLoadError(f"{where}: cannot load: {type(e).__name__}: {e}") from e
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]


def _from_file(path: str, where: str, read: Callable[[], Any]) -> Any:
    """read() of the model file at `path`; its failures become ModelLoadError."""
    if not os.path.isfile(path):
        raise ModelLoadError(f"{where}: no such file")
    try:
        return read()
    except Exception as e:  # OSError, DecodeError, missing external data file, ...
        raise ModelLoadError(f"{where}: cannot load: {type(e).__name__}: {e}") from e


def load_model_proto(model: ModelSource, *, load_external: bool = True) -> ModelProto:
    """Load a ModelProto from a path, bytes or a ModelProto; raise ModelLoadError on failure."""
    where = _describe(model)
    if isinstance(model, LoadedModel):
        proto = model.full_proto()
    elif isinstance(model, ModelProto):
        proto = model
    elif isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        proto = _from_file(path, where, lambda: onnx.load(path,
                                                          load_external_data=load_external))
    elif isinstance(model, bytes | bytearray | memoryview):
        try:
            proto = onnx.load_model_from_string(bytes(model))
        except Exception as e:
            raise ModelLoadError(f"{where}: cannot parse: {type(e).__name__}: {e}") from e
    else:
        raise ModelLoadError(f"cannot load a model from a {type(model).__name__}; expected a "
                             "path, bytes or onnx.ModelProto")
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{where}: not an ONNX model (the ModelProto has no graph)")
    return proto


# ---- types ------------------------------------------------------------------------------

def np_dtype(elem_type: int) -> np.dtype | None:
    """The numpy dtype of an ONNX tensor element type, None when numpy cannot hold it."""
    if elem_type == TensorProto.UNDEFINED:
        return None
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _shape_of(tensor_type: TypeProto.Tensor) -> Shape:
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _set_type(value: Value, type_proto: TypeProto | None) -> None:
    if type_proto is None:
        return
    if type_proto.WhichOneof("value") == "tensor_type":
        value.dtype = np_dtype(type_proto.tensor_type.elem_type)
        value.shape = _shape_of(type_proto.tensor_type)
    else:  # sequence, optional, map, sparse tensor: opaque to the op table
        value.dtype, value.shape = None, None
        value.type_proto = type_proto


def _value_types(proto: ModelProto) -> dict[str, TypeProto]:
    """Declared types, overridden by ONNX shape inference where it knows more."""
    gp = proto.graph
    types = {vi.name: vi.type for vi in (*gp.value_info, *gp.output) if vi.HasField("type")}
    light = _without_weights(proto)
    size = light.ByteSize()
    if size > _MAX_INFER_BYTES:
        log.warning("model is %d bytes without its weights: skipping shape inference", size)
    else:
        inferred = _infer_shapes(light)
        if inferred is not None:
            for vi in (*inferred.graph.value_info, *inferred.graph.output):
                if vi.HasField("type"):
                    types[vi.name] = vi.type
    for vi in gp.input:  # declared inputs win: they carry the symbolic dims
        if vi.HasField("type"):
            types[vi.name] = vi.type
    return types


def _without_weights(proto: ModelProto, keep_dims: bool = True) -> ModelProto:
    """The model with large initializers replaced by data-less stubs.

    Shape inference serializes the model; it needs the weights' dims, not their bytes
    (small ones stay: Reshape shapes and the like are propagated by value): keep_dims
    stubs point to an external file that is never read. The checker reads every tensor
    (BERT-base: 1.7 s just to measure the proto) but does not compare initializer dims
    with their uses: keep_dims=False stubs are empty."""
    gp = proto.graph
    light = ModelProto(ir_version=proto.ir_version, opset_import=proto.opset_import,
                       functions=proto.functions)
    lg = light.graph
    lg.name = gp.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(lg, field).extend(getattr(gp, field))
    for t in gp.initializer:
        if int(np.prod(t.dims, dtype=np.float64)) <= _SMALL_TENSOR:
            lg.initializer.append(t)
        elif keep_dims:
            stub = lg.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims,
                                      data_location=TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="autoclust-weights-not-read")
        else:
            lg.initializer.add(name=t.name, data_type=t.data_type, dims=[0])
    return light


def _infer_shapes(proto: ModelProto) -> ModelProto | None:
    # Plain inference first: data propagation costs time linear in the size of every 1-D
    # tensor that meets a constant in Add/Mul/... (20 s for a 16M-element chain), and it
    # adds nothing once every value has a full shape.
    plain = _try_infer(proto, data_prop=False)
    if plain is not None and _fully_shaped(plain):
        return plain
    return _try_infer(proto, data_prop=True) or plain


def _try_infer(proto: ModelProto, data_prop: bool) -> ModelProto | None:
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=data_prop)
    except Exception as e:  # noqa: BLE001 - inference is a help, not a check
        log.info("ONNX shape inference failed (data_prop=%s): %s", data_prop, e)
    return None


def _fully_shaped(proto: ModelProto) -> bool:
    """True when every node output of the main graph has a tensor type with known dims."""
    gp = proto.graph
    infos = {vi.name: vi.type for vi in (*gp.value_info, *gp.output)}
    for node in gp.node:
        for name in node.output:
            t = infos.get(name)
            if name and (t is None or not t.HasField("tensor_type")
                         or not t.tensor_type.HasField("shape")
                         or not all(d.HasField("dim_value") or d.HasField("dim_param")
                                    for d in t.tensor_type.shape.dim)):
                return False
    return True


def _run_checker(proto: ModelProto, where: str) -> None:
    # The checker rejects some models onnxruntime runs (IR/opset mismatches, unknown
    # attributes), so its complaints are warnings; our own checks decide.
    light = _without_weights(proto, keep_dims=False)
    if light.ByteSize() > _MAX_CHECK_BYTES:
        return
    try:
        onnx.checker.check_model(light, full_check=False)
    except Exception as e:  # noqa: BLE001 - the checker only warns
        log.warning("%s: onnx.checker: %s", where, str(e).splitlines()[0] if str(e) else e)


# ---- tensors and attributes ---------------------------------------------------------

def _sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(dims, values.dtype)
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        dense[tuple(indices.T)] = values
    else:  # linearized indices
        dense.reshape(-1)[indices] = values
    return dense


def _external_array(tensor: TensorProto, base_dir: str | None) -> np.ndarray:
    # load_external=False: map the bytes instead of reading them.
    info = {e.key: e.value for e in tensor.external_data}
    if base_dir is None:
        raise ValueError(f"data is in external file {info.get('location')!r} but the model "
                         "was not loaded from a file")
    path = os.path.join(base_dir, info["location"])
    dtype = np_dtype(tensor.data_type)
    if dtype is None:
        raise ValueError(f"unsupported element type {tensor.data_type} for external data")
    shape = tuple(int(d) for d in tensor.dims)
    return np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r",
                     offset=int(info.get("offset", 0)), shape=shape)


def tensor_to_array(tensor: TensorProto, what: str, base_dir: str | None = None) -> np.ndarray:
    """numpy_helper.to_array with every failure turned into ModelLoadError."""
    try:
        if tensor.data_location == TensorProto.EXTERNAL:
            return _external_array(tensor, base_dir)
        return numpy_helper.to_array(tensor)
    except Exception as e:
        dims = list(tensor.dims)
        raise ModelLoadError(f"{what}: cannot read tensor (dtype {tensor.data_type}, dims "
                             f"{dims}, {len(tensor.raw_data)} raw bytes): {e}") from e


def _attr_value(attr: AttributeProto, what: str) -> Any:
    kind = attr.type
    if kind == AttributeProto.UNDEFINED:  # old writers omit the type
        kind = _guess_attr_type(attr)
    A = AttributeProto
    if kind == A.FLOAT:
        return float(attr.f)
    if kind == A.INT:
        return int(attr.i)
    if kind == A.STRING:
        return _decode(attr.s)
    if kind == A.TENSOR:
        return tensor_to_array(attr.t, what)
    if kind == A.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor)
    if kind == A.FLOATS:
        return [float(x) for x in attr.floats]
    if kind == A.INTS:
        return [int(x) for x in attr.ints]
    if kind == A.STRINGS:
        return [_decode(s) for s in attr.strings]
    if kind == A.TENSORS:
        return [tensor_to_array(t, what) for t in attr.tensors]
    return attr  # GRAPH(S), TYPE_PROTO(S): kept as the AttributeProto


def _guess_attr_type(attr: AttributeProto) -> int:
    A = AttributeProto
    for field, kind in (("floats", A.FLOATS), ("ints", A.INTS), ("strings", A.STRINGS),
                        ("tensors", A.TENSORS), ("graphs", A.GRAPHS)):
        if len(getattr(attr, field)):
            return kind
    for field, kind in (("f", A.FLOAT), ("i", A.INT), ("s", A.STRING), ("t", A.TENSOR),
                        ("g", A.GRAPH), ("sparse_tensor", A.SPARSE_TENSOR)):
        if attr.HasField(field):
            return kind
    return A.UNDEFINED


def _decode(s: bytes) -> str | bytes:
    try:
        return s.decode("utf-8")
    except UnicodeDecodeError:
        return s


def _check_attr_types(node: NodeProto, name: str, version: int | None) -> None:
    """Reject attributes whose type differs from the op schema's (e.g. a float perm)."""
    if version is None:
        return
    try:
        schema = onnx.defs.get_schema(node.op_type, version, node.domain)
    except onnx.defs.SchemaError:  # unknown op or domain: opaque, nothing to check
        return
    for attr in node.attribute:
        spec = schema.attributes.get(attr.name)
        if spec is None or attr.type == AttributeProto.UNDEFINED:
            continue
        expected = int(spec.type.value)
        if attr.type != expected:
            got = AttributeProto.AttributeType.Name(attr.type)
            want = AttributeProto.AttributeType.Name(expected)
            raise ModelLoadError(f"node {name!r} ({node.op_type}): attribute {attr.name!r} is "
                                 f"{got}, but {node.op_type}-{schema.since_version} expects "
                                 f"{want}")


def _constant_array(node: NodeProto, name: str) -> np.ndarray:
    """The value of a Constant node, whichever attribute holds it."""
    what = f"Constant node {name!r}"
    if len(node.attribute) != 1:
        raise ModelLoadError(f"{what} needs exactly one value attribute, has "
                             f"{[a.name for a in node.attribute]}")
    attr = node.attribute[0]
    value = _attr_value(attr, what)
    if attr.name in ("value", "sparse_value"):
        return np.asarray(value)
    if attr.name in ("value_float", "value_int"):
        return np.asarray(value, np.float32 if attr.name == "value_float" else np.int64)
    if attr.name in ("value_floats", "value_ints"):
        return np.asarray(value, np.float32 if attr.name == "value_floats" else np.int64)
    if attr.name in ("value_string", "value_strings"):
        return np.asarray(value, dtype=object)
    raise ModelLoadError(f"{what}: unknown value attribute {attr.name!r}")


# ---- subgraph scopes -----------------------------------------------------------------

def _subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH or attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _outer_reads(body: GraphProto, seen: set[str]) -> list[str]:
    """Names a subgraph body (and its nested bodies) reads from enclosing scopes.

    Adds every name the body defines to `seen` (fresh names must not shadow them)."""
    local = {vi.name for vi in body.input}
    local.update(t.name for t in body.initializer)
    local.update(t.values.name for t in body.sparse_initializer)
    for node in body.node:
        local.update(node.output)
    seen.update(local)
    reads: dict[str, None] = {}
    for node in body.node:
        names: Iterable[str] = node.input
        for sub in _subgraphs(node):
            names = [*names, *_outer_reads(sub, seen)]
        for n in names:
            if n and n not in local:
                reads.setdefault(n)
    for vi in body.output:  # a body may return an outer value directly
        if vi.name and vi.name not in local:
            reads.setdefault(vi.name)
    return list(reads)


def outer_reads(body: GraphProto) -> list[str]:
    """Names a subgraph body (and its nested bodies) reads from enclosing scopes."""
    return _outer_reads(body, set())


# ---- the import ---------------------------------------------------------------------

def _opset_dict(proto: ModelProto) -> dict[str, int]:
    opset = {}
    for imp in proto.opset_import:
        domain = "" if imp.domain == "ai.onnx" else imp.domain
        opset[domain] = int(imp.version)
    return opset


def _model_doc(proto: ModelProto) -> dict[str, Any]:
    return {
        "ir_version": int(proto.ir_version),
        "producer_name": proto.producer_name,
        "producer_version": proto.producer_version,
        "domain": proto.domain,
        "model_version": int(proto.model_version),
        "doc_string": proto.doc_string,
        "metadata_props": {p.key: p.value for p in proto.metadata_props},
        "functions": list(proto.functions),
        "constant_nodes": [],
        "synthetic_initializers": [],
    }


def _node_names(nodes: Iterable[NodeProto]) -> list[str]:
    """Unique, non-empty node names: `{op}_{i}` for empty ones, suffixes for duplicates."""
    taken: set[str] = set()
    names = []
    for i, node in enumerate(nodes):
        base = node.name or f"{node.op_type}_{i}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        names.append(name)
    return names


class _Importer:
    """State of one import: the graph being built and every name in the model."""

    def __init__(self, proto: ModelProto, where: str, base_dir: str | None,
                 loaded: LoadedModel | None = None):
        self.proto = proto
        self.where = where
        self.base_dir = base_dir
        self.loaded = loaded  # read_model's arrays for its stubs
        self.graph = Graph(proto.graph.name or "graph")
        self.graph.opset = _opset_dict(proto)
        self.graph.doc = _model_doc(proto)
        self.names: set[str] = set()  # every name defined or read, for fresh names
        self.definer: dict[str, str] = {}  # value name -> what defines it

    def fail(self, message: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: {message}")

    def version(self, domain: str) -> int | None:
        return self.graph.opset.get("" if domain == "ai.onnx" else domain)

    def define(self, name: str, what: str) -> None:
        if not name:
            raise self.fail(f"{what} has an empty name")
        if name in self.definer:
            raise self.fail(f"value {name!r} is defined twice (not SSA): by {what} and by "
                            f"{self.definer[name]}")
        self.definer[name] = what
        self.names.add(name)

    def fresh_name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names or name in self.graph.values:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    # ---- steps, in the order run() calls them ----------------------------------------
    def value(self, name: str) -> Value:
        v = self.graph.values.get(name)
        if v is None:
            v = self.graph.value(name)
            _set_type(v, self.types.get(name))
        return v

    def add_inputs(self, gp: GraphProto) -> None:
        # Before IR 4 every initializer was also listed as an input; those are constants.
        old_ir = self.proto.ir_version < 4
        init_names = {t.name for t in gp.initializer}
        for vi in gp.input:
            if old_ir and vi.name in init_names:
                continue
            self.define(vi.name, f"graph input {vi.name!r}")
            self.graph.inputs.append(self.value(vi.name))

    def add_initializers(self, gp: GraphProto) -> None:
        inputs = {v.name for v in self.graph.inputs}
        tensors = [(t.name, t, False) for t in gp.initializer]
        tensors += [(s.values.name, s, True) for s in gp.sparse_initializer]
        for name, tensor, sparse in tensors:
            what = f"initializer {name!r}"
            if name not in inputs:  # an initializer may give a graph input its default
                self.define(name, what)
            if name in self.graph.initializers:
                raise self.fail(f"{what} is given twice")
            if sparse:
                try:
                    array = _sparse_to_dense(tensor)
                except Exception as e:
                    raise self.fail(f"{what}: bad sparse tensor: {e}") from e
            else:
                array = self.weight(tensor, what)
            self.graph.add_initializer(name, array)

    def weight(self, tensor: TensorProto, what: str) -> np.ndarray:
        """An initializer's array: read_model's for its stubs (no copy), else from the proto."""
        loaded = self.loaded
        if loaded is not None and tensor.name in loaded.stubs and is_stub(tensor):
            array = loaded.weights.get(tensor.name)
            if array is None:
                raise self.fail(f"{what}: the model was loaded without its weights")
            return array
        return tensor_to_array(tensor, f"{self.where}: {what}", self.base_dir)

    def check_nodes(self, gp: GraphProto, names: list[str]) -> list[list[str]]:
        """Define node outputs, reject dangling reads and bad attributes; return each
        node's outer-scope reads (from If/Loop/Scan bodies)."""
        for node, name in zip(gp.node, names):
            for out in node.output:
                if out:
                    self.define(out, f"node {name!r} ({node.op_type})")
        outer_reads = []
        for node, name in zip(gp.node, names):
            for i, inp in enumerate(node.input):
                if inp and inp not in self.definer:
                    raise self.fail(f"node {name!r} ({node.op_type}) input {i} {inp!r} is not "
                                    "defined by any node, initializer or graph input")
            reads = []
            for sub in _subgraphs(node):
                reads += [n for n in _outer_reads(sub, self.names) if n not in reads]
            for n in reads:
                if n not in self.definer:
                    raise self.fail(f"node {name!r} ({node.op_type}): a subgraph reads {n!r}, "
                                    "which the enclosing graph does not define")
            _check_attr_types(node, name, self.version(node.domain))
            outer_reads.append(reads)
        return outer_reads

    def add_constant(self, node: NodeProto, name: str) -> None:
        array = _constant_array(node, name)
        if len(node.output) != 1 or not node.output[0]:
            raise self.fail(f"Constant node {name!r} needs exactly one output")
        self.graph.add_initializer(node.output[0], array)
        self.graph.doc["constant_nodes"].append(node.output[0])

    def add_const(self, node: Node, hint: str, array: np.ndarray) -> Value:
        name = self.fresh_name(f"{node.name}_{hint}")
        self.graph.doc["synthetic_initializers"].append(name)
        return self.graph.add_initializer(name, array)

    def add_node(self, proto: NodeProto, name: str, reads: list[str]) -> None:
        attrs = {a.name: _attr_value(a, f"node {name!r} ({proto.op_type}) attribute "
                                        f"{a.name!r}") for a in proto.attribute}
        inputs = [self.value(n) if n else None for n in proto.input]
        out_names = list(proto.output)
        while out_names and not out_names[-1]:  # omitted trailing optional outputs
            out_names.pop()
        outputs = [self.value(n or self.fresh_name(f"{name}_unused_output{i}"))
                   for i, n in enumerate(out_names)]
        domain = "" if proto.domain == "ai.onnx" else proto.domain
        node = Node(proto.op_type, inputs, outputs, attrs, name, domain)
        node.proto = proto
        node.implicit_inputs = [self.value(n) for n in reads]
        if domain == "":
            normalize_node(node, self.version("") or 1, self.add_const,
                           self.graph.constant_value)
        self.graph.add_node(node)

    def add_outputs(self, gp: GraphProto) -> None:
        for vi in gp.output:
            if not vi.name or vi.name not in self.definer:
                raise self.fail(f"graph output {vi.name!r} is never defined")
            v = self.value(vi.name)
            if v.dtype is None and v.type_proto is None:
                _set_type(v, vi.type if vi.HasField("type") else None)
            self.graph.outputs.append(v)

    def run(self) -> Graph:
        gp = self.proto.graph
        self.types = _value_types(self.proto)
        self.add_inputs(gp)
        self.add_initializers(gp)
        names = _node_names(gp.node)
        outer_reads = self.check_nodes(gp, names)
        for proto, name, reads in zip(gp.node, names, outer_reads):
            if proto.op_type == "Constant" and proto.domain in ("", "ai.onnx"):
                self.add_constant(proto, name)
            else:
                self.add_node(proto, name, reads)
        self.add_outputs(gp)
        try:
            self.graph.topo_sort()
        except ValueError as e:
            raise self.fail(str(e)) from e
        fill_types(self.graph)
        _pools_by_onnxruntime(self.graph, gp)
        return self.graph


_POOLS = ("MaxPool", "AveragePool", "LpPool")


def _pools_by_onnxruntime(graph: Graph, gp: GraphProto) -> None:
    """Shapes after a ceil_mode pool from the op table's rules, not ONNX shape inference.

    A ceil_mode pool whose last window would start in the right padding: onnxruntime (and
    PyTorch) drop that window, ONNX shape inference keeps it (a [1, 2, 4, 4] input, kernel
    and strides 2, pads 1 at the end: [.., 2, 2] against [.., 3, 3]). Our rule follows
    onnxruntime (3,024 1-D ceil_mode and floor pools agree); with the inferred shape kept,
    such a pool failed its cluster's shape check (the model ran in onnxruntime with a
    warning; --must_compile raised; 20 of 241 random pools). Every value downstream that
    the model does not declare with a whole shape of its own is typed again by our rules.
    Without ceil_mode, a window longer than the padded input by less than a stride is one
    output in onnxruntime and ONNX inference, none by the spec's formula and ours: such a
    pool keeps the inferred shape, fails the check and runs in onnxruntime."""
    if not any(n.domain == "" and n.op in _POOLS and n.attrs.get("ceil_mode")
               for n in graph.nodes):
        return  # the usual case: no value_info to read
    declared = {vi.name for vi in (*gp.value_info, *gp.output)
                if vi.type.tensor_type.HasField("shape") and all(
                    d.HasField("dim_value") or d.HasField("dim_param")
                    for d in vi.type.tensor_type.shape.dim)}
    stale: set = set()
    for node in graph.nodes:
        if node.domain == "" and node.op in _POOLS and node.attrs.get("ceil_mode") or \
                any(v in stale for v in node.inputs if v is not None):
            stale.update(v for v in node.outputs if v.name not in declared)
    if stale:
        for v in stale:
            v.shape = None
        fill_types(graph)


def fill_types(graph: Graph) -> None:
    """Types ONNX shape inference left unknown, from the op table's rules, in graph order.

    ONNX inference knows no contrib or custom ops (com.microsoft Gelu, ops registered with
    autoclust.register_op), so everything downstream of one had no dtype and could not
    cluster. Only unknowns are filled; a rule that fails leaves them unknown, except a
    custom op's: its error (naming the op and node) stops the import.
    """
    for node in graph.nodes:
        if all(v.dtype is not None and v.shape is not None for v in node.outputs):
            continue
        try:
            types = ops.infer_node(node, graph)
        except (AutoclustError, ValueError, TypeError, IndexError, KeyError):
            if ops.is_external(node.op, node.domain):
                raise  # a custom op's own rule failed: nothing else could type its outputs
            continue
        for v, (dtype, shape) in zip(node.outputs, types):
            if v.dtype is None and v.type_proto is None and dtype is not None:
                v.dtype = np.dtype(dtype)
            if v.shape is None and shape is not None:
                v.shape = tuple(shape)


def import_model(model: ModelSource, *, load_external: bool = True) -> Graph:
    """Load an ONNX model (path, bytes, ModelProto or LoadedModel) into an autoclust Graph."""
    loaded = None
    if isinstance(model, LoadedModel) or load_external and not isinstance(model, ModelProto):
        loaded = load_model(model)  # weights read once, straight into arrays
        proto = loaded.proto
    else:
        proto = load_model_proto(model, load_external=load_external)
    where = _describe(model)
    base_dir = None
    if isinstance(model, str | os.PathLike):
        base_dir = os.path.dirname(os.path.abspath(os.fspath(model)))
    try:
        _run_checker(proto, where)
        return _Importer(proto, where, base_dir, loaded).run()
    except ModelLoadError:
        raise
    except Exception as e:  # a malformed proto must not crash callers with KeyError & co.
        raise ModelLoadError(f"{where}: cannot import: {type(e).__name__}: {e}") from e
