"""autoclust Graph -> ONNX ModelProto (export_model).

Nodes that came from a model write their original NodeProto (renamed only where a pass
rewired a value), so fallback segments and cluster dumps run in onnxruntime exactly as the
original model did; other nodes are written in the newest form (importers/onnx/forms.py),
and the default-domain opset is raised for them when no original node changes meaning.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from autoclust.importers.onnx.forms import FORM_VERSION, LEGACY
from onnx import AttributeProto, ModelProto, NodeProto, ValueInfoProto, helper, numpy_helper

from autoclust.errors import AutoclustError
from autoclust.ir import Graph, Node, Value

MAX_IR_VERSION = 10  # onnxruntime 1.31 reads IR <= 13, but 10 keeps older runtimes working


class ExportError(AutoclustError):
    """The graph cannot be written as an ONNX model (a value without a type, ...)."""


# ---- types -----------------------------------------------------------------------------

def _elem_type(dtype: np.dtype | None) -> int:
    if dtype is None:
        return onnx.TensorProto.UNDEFINED
    if dtype == np.dtype(object):
        return onnx.TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dtype)


def value_info(v: Value) -> ValueInfoProto:
    """The ValueInfoProto of a value: its TypeProto, or tensor type from dtype and shape."""
    if v.type_proto is not None:
        vi = ValueInfoProto(name=v.name)
        vi.type.CopyFrom(v.type_proto)
        return vi
    if v.dtype is None:  # unknown: onnxruntime infers it (graph inputs never get here)
        return ValueInfoProto(name=v.name)
    if v.shape is None:
        return helper.make_tensor_value_info(v.name, _elem_type(v.dtype), None)
    vi = helper.make_tensor_value_info(v.name, _elem_type(v.dtype), [])
    dims = vi.type.tensor_type.shape.dim
    for d in v.shape:
        dim = dims.add()
        if isinstance(d, int):
            dim.dim_value = d
        elif isinstance(d, str):
            dim.dim_param = d
    return vi


# ---- attributes ------------------------------------------------------------------------

def _attr_type_from_schema(node: Node, key: str, version: int) -> int:
    try:
        schema = onnx.defs.get_schema(node.op, version, node.domain)
        return int(schema.attributes[key].type.value)
    except (onnx.defs.SchemaError, KeyError):
        return AttributeProto.INTS


def _plain(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, bool):
        return int(x)
    return x


def make_attribute(node: Node, key: str, value: Any, version: int) -> AttributeProto:
    """An AttributeProto from a plain Python attribute value of `node`."""
    if isinstance(value, AttributeProto):
        attr = AttributeProto()
        attr.CopyFrom(value)
        attr.name = key
        return attr
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, list | tuple):
        if not value:
            return helper.make_attribute(key, [], attr_type=_attr_type_from_schema(
                node, key, version))
        if isinstance(value[0], np.ndarray):
            return helper.make_attribute(key, [numpy_helper.from_array(a) for a in value])
        return helper.make_attribute(key, [_plain(x) for x in value])
    return helper.make_attribute(key, _plain(value))


# ---- nodes -----------------------------------------------------------------------------

def _proto_node(node: Node, synthetic: set[str]) -> NodeProto:
    """The node's original proto, with inputs/outputs renamed where a pass rewired them."""
    proto = node.proto
    ins = list(proto.input)
    outs = list(proto.output)
    for i, name in enumerate(ins):
        v = node.inputs[i] if i < len(node.inputs) else None
        # Synthetic inputs (e.g. GroupNormalization's per-channel scale) replace the
        # original ones only in the normalized form; the proto keeps its own.
        if name and v is not None and v.name not in synthetic:
            ins[i] = v.name
    for i, name in enumerate(outs):
        if name and i < len(node.outputs):
            outs[i] = node.outputs[i].name
    if ins == list(proto.input) and outs == list(proto.output):
        return proto
    copy = NodeProto()
    copy.CopyFrom(proto)
    del copy.input[:]
    del copy.output[:]
    copy.input.extend(ins)
    copy.output.extend(outs)
    return copy


def _built_node(node: Node, version: int) -> NodeProto:
    """A NodeProto in the newest form, from op, inputs, outputs and attrs."""
    ins = ["" if v is None else v.name for v in node.inputs]
    while ins and not ins[-1]:
        ins.pop()
    proto = helper.make_node(node.op, ins, [v.name for v in node.outputs], name=node.name,
                             domain=node.domain)
    attrs = dict(node.attrs)
    if node.op == "Split" and version < 18:
        attrs.pop("num_outputs", None)  # the outputs say it; the attribute needs opset 18
    for key, value in attrs.items():
        try:
            proto.attribute.append(make_attribute(node, key, value, version))
        except Exception as e:
            raise ExportError(f"node {node.name!r} ({node.op}): cannot write attribute "
                              f"{key!r} = {value!r}: {e}") from e
    return proto


def form_version(node: Node, current: int) -> int:
    """The default-domain opset a node without proto needs, given the graph's opset."""
    op = node.op
    if op == "Split":
        # num_outputs (18) is written only when it says more than the outputs do
        return 18 if node.attrs.get("num_outputs", len(node.outputs)) != len(node.outputs) \
            else 13
    if op == "Pad":
        if node.attrs.get("mode") == "wrap":
            return 19
        return 18 if len(node.inputs) > 3 and node.inputs[3] is not None else 11
    if op in FORM_VERSION:
        return FORM_VERSION[op]
    if _schema(op, current) is not None:
        return current
    newest = _schema(op, onnx.defs.onnx_opset_version())  # an op newer than the graph
    return current if newest is None else newest.since_version


def _schema(op: str, version: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, version, "")
    except onnx.defs.SchemaError:
        return None


# Same inputs and attributes, different meaning (Softmax-13 stopped flattening to 2-D).
_MEANING_CHANGED = {"Softmax": 13, "LogSoftmax": 13, "Hardmax": 13,
                    "GroupNormalization": 21}  # scale and bias per group -> per channel


def _still_valid(op: str, old: int, new: int) -> bool:
    """True when a node written for opset `old` means the same at opset `new`: no
    attribute or input was removed or retyped, and everything added is optional."""
    a, b = _schema(op, old), _schema(op, new)
    if a is None or b is None or b.deprecated:
        return False
    if a.since_version == b.since_version:
        return True
    if old < _MEANING_CHANGED.get(op, 0) <= new:
        return False
    for name, attr in a.attributes.items():
        if name not in b.attributes or b.attributes[name].type != attr.type:
            return False
    if any(attr.required for name, attr in b.attributes.items() if name not in a.attributes):
        return False
    optional = onnx.defs.OpSchema.FormalParameterOption
    ins_a, ins_b = a.inputs, b.inputs
    if len(ins_b) < len(ins_a) or any(p.option != q.option for p, q in zip(ins_a, ins_b)):
        return False
    if any(p.option == optional.Single for p in ins_b[len(ins_a):]):
        return False
    return len(b.outputs) >= len(a.outputs)


def _plan_opset(graph: Graph, current: int) -> tuple[int, set[int]]:
    """Pick the default-domain opset and the proto nodes to rewrite in the newest form.

    Nodes without proto may need a newer opset. Raise it only when every original node
    still means the same there, or was normalized (so its newest form can be written
    instead); otherwise keep the graph's opset.
    """
    default = [n for n in graph.nodes if n.domain == ""]
    target = max((form_version(n, current) for n in default if n.proto is None),
                 default=current)
    if target <= current:
        return current, set()
    if any(not _still_valid(n.op, current, target) for n in graph.nodes
           if n.domain == LEGACY):
        return current, set()
    while True:  # rewritten nodes may themselves need a newer opset
        rewrite = set()
        for n in default:
            if n.proto is None:
                continue
            if n.op in FORM_VERSION:  # normalized: its newest form can always be written
                if _since(n.op, current) != _since(n.op, target):
                    rewrite.add(id(n))
            elif not _still_valid(n.op, current, target):
                return current, set()
        need = max((form_version(n, current) for n in default if id(n) in rewrite),
                   default=target)
        if need <= target:
            return target, rewrite
        target = need


def _since(op: str, version: int) -> int | None:
    schema = _schema(op, version)
    return None if schema is None else schema.since_version


# ---- the model -------------------------------------------------------------------------

def _graph_values(graph: Graph, written: list[NodeProto], node_reads: list[str]):
    """(initializer names to write, outputs that are plain constants, value_info names)."""
    read = set(node_reads)
    for p in written:
        read.update(n for n in p.input if n)
    produced = {n for p in written for n in p.output if n}
    input_names = {v.name for v in graph.inputs}
    constant_outputs = [v.name for v in graph.outputs if v.name in graph.initializers
                        and v.name not in input_names and v.name not in produced]
    inits = [name for name in graph.initializers
             if (name in read or name in input_names) and name not in produced
             and name not in constant_outputs]
    return inits, constant_outputs, produced


def _proto_is_current(node: Node) -> bool:
    # A pass that turned the node into another op but left `proto` set: write the node.
    domain = "" if node.proto.domain == "ai.onnx" else node.proto.domain
    return node.proto.op_type == node.op and domain == node.domain


def _write_nodes(graph: Graph, version: int, rewrite: set[int]) -> tuple[list, list[str]]:
    synthetic = set(graph.doc.get("synthetic_initializers", ()))
    written, reads = [], []
    for node in graph.nodes:
        use_proto = (node.proto is not None and id(node) not in rewrite
                     and (node.domain == LEGACY or _proto_is_current(node)))
        if node.domain == LEGACY and node.proto is None:
            raise ExportError(f"node {node.name!r} ({node.op}) is in domain {LEGACY} but has "
                              "no original NodeProto to write")
        written.append(_proto_node(node, synthetic) if use_proto else _built_node(node, version))
        reads += [v.name for v in node.implicit_inputs]
    return written, reads


def _opset_imports(graph: Graph, written: list[NodeProto], default: int) -> list:
    opset = {d: v for d, v in graph.opset.items() if d != LEGACY}
    opset[""] = default
    for p in written:
        domain = "" if p.domain == "ai.onnx" else p.domain
        opset.setdefault(domain, 1)
    for f in graph.doc.get("functions", ()):
        opset.setdefault(f.domain, 1)
    return [helper.make_opsetid(d, v) for d, v in sorted(opset.items())]


def export_model(graph: Graph, *, ir_version: int | None = None,
                 external_min_bytes: int = 0) -> ModelProto:
    """Write `graph` as an ONNX ModelProto that onnxruntime loads and runs.

    With `external_min_bytes`, initializers of at least that size are written as external
    stubs (`external_stubs` names them) that the caller hands to onnxruntime as in-memory
    OrtValues: copying BERT-base's weights into a model and serializing it took ~3 s of a
    5 s session, handing them over takes nothing.
    """
    for v in graph.inputs:
        if v.dtype is None and v.type_proto is None:
            raise ExportError(f"graph {graph.name!r}: input {v.name!r} has no known type")
    current = graph.opset.get("", graph.opset.get("ai.onnx", 17))
    version, rewrite = _plan_opset(graph, current)
    written, implicit_reads = _write_nodes(graph, version, rewrite)
    inits, constant_outputs, produced = _graph_values(graph, written, implicit_reads)
    constants = [helper.make_node("Constant", [], [name], name=f"{name}_constant",
                                  value=numpy_helper.from_array(
                                      np.asarray(graph.initializers[name]), name))
                 for name in constant_outputs]
    boundary = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    infos = [value_info(graph.values[n]) for n in sorted(produced - boundary)
             if n in graph.values and (graph.values[n].dtype is not None
                                       or graph.values[n].type_proto is not None)]
    gp = helper.make_graph(
        constants + written, graph.name,
        [value_info(v) for v in graph.inputs], [value_info(v) for v in graph.outputs],
        [_initializer(np.asarray(graph.initializers[n]), n, external_min_bytes)
         for n in inits],
        value_info=infos)
    model = helper.make_model(gp, opset_imports=_opset_imports(graph, written, version))
    _set_metadata(model, graph, ir_version)
    return model


def _initializer(arr: np.ndarray, name: str, external_min_bytes: int) -> onnx.TensorProto:
    """The TensorProto of an initializer, or its external stub (plain NumPy dtypes only:
    onnxruntime makes OrtValues of those)."""
    if not external_min_bytes or arr.nbytes < external_min_bytes or arr.dtype.kind not in "fiub":
        return numpy_helper.from_array(arr, name)
    stub = onnx.TensorProto(name=name, data_type=_elem_type(arr.dtype), dims=list(arr.shape),
                            data_location=onnx.TensorProto.EXTERNAL)
    stub.external_data.add(key="location", value=name)
    return stub


def external_stubs(model: ModelProto) -> list[str]:
    """Names of the initializers export_model wrote as external stubs."""
    return [t.name for t in model.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            and [(e.key, e.value) for e in t.external_data] == [("location", t.name)]]


def _set_metadata(model: ModelProto, graph: Graph, ir_version: int | None) -> None:
    doc = graph.doc
    if ir_version is None:
        # IR < 4 requires every initializer to be listed as an input; we never do that.
        ir_version = max(4, doc.get("ir_version") or MAX_IR_VERSION)
        if doc.get("functions"):
            ir_version = max(ir_version, 8)
    model.ir_version = min(int(ir_version), MAX_IR_VERSION)
    model.producer_name = doc.get("producer_name") or "autoclust"
    model.producer_version = doc.get("producer_version", "")
    model.domain = doc.get("domain", "")
    model.model_version = int(doc.get("model_version", 0))
    model.doc_string = doc.get("doc_string", "")
    if doc.get("metadata_props"):
        helper.set_model_props(model, dict(doc["metadata_props"]))
    model.functions.extend(doc.get("functions", ()))
