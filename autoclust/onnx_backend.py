"""autoclust as an ONNX backend (onnx.backend.base.Backend), for onnx's backend test suite.

    from autoclust import backend
    rep = backend.prepare(model, "CPU", must_compile=True)   # keyword args are flag overrides
    outputs = rep.run([x, y])                                 # graph-input order, or a dict

prepare() builds an autoclust.InferenceSession; run() takes the inputs the ONNX runner
passes (NumPy arrays, NumPy scalars, lists, sequences) and returns the outputs in graph
order with the session's exact dtypes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from autoclust.errors import FlagError
from autoclust.registry import BACKENDS

# Keyword arguments the ONNX test runner forwards to prepare() that are not flags.
_RUNNER_KWARGS = ("rtol", "atol")

# Domains whose ops autoclust or its onnxruntime fallback can run.
_KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def _is_tensor(type_proto: onnx.TypeProto) -> bool:
    return type_proto.HasField("tensor_type")


def _output_tuple(names: Sequence[str], values: Sequence[Any]) -> tuple:
    # namedtupledict needs identifiers; ONNX output names may be anything.
    if all(n.isidentifier() and not n.startswith("_") for n in names) \
            and len(set(names)) == len(names):
        return namedtupledict("Outputs", list(names))(*values)
    return tuple(values)


class AutoclustRep(BackendRep):
    """A prepared model: an autoclust.InferenceSession plus the graph's input types."""

    def __init__(self, session: Any, model: onnx.ModelProto):
        self.session = session
        inits = {t.name for t in model.graph.initializer}
        self._inputs = [(vi.name, _is_tensor(vi.type)) for vi in model.graph.input
                        if vi.name not in inits]
        self._outputs = [vi.name for vi in model.graph.output]

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, dict):
            kinds = dict(self._inputs)
            return {k: _convert(v, kinds.get(k, True)) for k, v in inputs.items()}
        if isinstance(inputs, np.ndarray) or np.isscalar(inputs):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) > len(self._inputs):
            raise ValueError(f"got {len(inputs)} inputs; the model has {len(self._inputs)}: "
                             f"{', '.join(n for n, _ in self._inputs)}")
        # Fewer inputs than declared: the rest are optional inputs left out.
        return {name: _convert(v, is_tensor)
                for (name, is_tensor), v in zip(self._inputs, inputs)}

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        """Run on `inputs` (a list in graph-input order, or a dict); outputs in graph order."""
        outs = self.session.run(None, self._feeds(inputs))
        return _output_tuple(self._outputs, outs)


def _device_flag(device: str) -> str | None:
    """The --device flag a device string asks for: None for ONNX's "CPU" (the flags decide,
    so AUTOCLUST_FLAGS=--device=interpreter still applies), "gpu" for "CUDA[:n]", and
    autoclust's own lower-case names ("cpu", "gpu", "interpreter") as they are."""
    if device in BACKENDS:
        return device
    kind = Device(device).type  # AttributeError for an unknown name
    return "gpu" if kind == DeviceType.CUDA else None


def _convert(value: Any, is_tensor: bool) -> Any:
    # Tensors: NumPy scalars and nested lists become arrays (np.asarray keeps the dtype of
    # a NumPy scalar). Sequences and optionals pass through as the runner built them.
    if is_tensor and value is not None and not isinstance(value, np.ndarray):
        return np.asarray(value)
    return value


class AutoclustBackend(Backend):
    """onnx.backend.base.Backend over autoclust.InferenceSession (flags as keyword args)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """True when the device is supported and every op's domain is one we can run."""
        if not cls.supports_device(device):
            return False
        return all(n.domain in _KNOWN_DOMAINS for n in model.graph.node)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> AutoclustRep:
        """An AutoclustRep for `model`; keyword arguments override AUTOCLUST_FLAGS."""
        from autoclust.session import InferenceSession
        flags = {k: v for k, v in kwargs.items() if k not in _RUNNER_KWARGS}
        flag_device = _device_flag(device)
        if flag_device is not None:
            flags.setdefault("device", flag_device)
        session = InferenceSession(model, **flags)
        return AutoclustRep(session, model)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple:
        """prepare() then run() once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple]] | None = None,
                 **kwargs: Any) -> tuple:
        """Run one node on `inputs` (in node-input order) through a one-node model.

        The model's opset is the version that introduced the op's newest definition
        (override with opset_version=N), so onnxruntime can run it when it falls back.
        """
        opset = kwargs.pop("opset_version", None)
        model = node_model(node, inputs, outputs_info, opset)
        given = [x for name, x in zip(node.input, inputs) if name and x is not None]
        return cls.run_model(model, given, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU always; CUDA (or an autoclust device name) when that backend is usable here."""
        from autoclust.registry import get_backend
        try:
            flag_device = _device_flag(device)
        except AttributeError:
            return False
        if flag_device is None:
            return True
        try:
            get_backend(flag_device)
        except FlagError:
            return False
        return True


def node_model(node: onnx.NodeProto, inputs: Sequence[Any],
               outputs_info: Sequence[tuple[Any, tuple]] | None = None,
               opset: int | None = None) -> onnx.ModelProto:
    """A one-node model computing `node` on inputs like `inputs` (None: omitted input)."""
    from onnx import helper
    graph_inputs = []
    for name, x in zip(node.input, inputs):
        if not name or x is None:
            continue
        arr = np.asarray(x)
        elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
        graph_inputs.append(helper.make_tensor_value_info(name, elem, arr.shape))
    if outputs_info is not None:
        outputs = [helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
            for name, (dtype, shape) in zip(node.output, outputs_info)]
    else:
        outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
    if opset is None:
        opset = onnx.defs.get_schema(node.op_type, node.domain).since_version
    graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
    model.ir_version = 10  # onnxruntime reads IR <= 13; onnx writes 14 by default
    if outputs_info is None:
        model = _typed_outputs(model)
    return model


def _typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    # Graph outputs need types: take them from ONNX shape inference.
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {vi.name: vi for vi in inferred.graph.value_info}
    known.update({vi.name: vi for vi in inferred.graph.output if vi.type.HasField("tensor_type")})
    for out in model.graph.output:
        if out.name in known:
            out.CopyFrom(known[out.name])
    return model


# The module-level functions onnx's docs show: backend.prepare(model), backend.run_model(...).
prepare = AutoclustBackend.prepare
run_model = AutoclustBackend.run_model
run_node = AutoclustBackend.run_node
supports_device = AutoclustBackend.supports_device
is_compatible = AutoclustBackend.is_compatible

__all__ = ["AutoclustBackend", "AutoclustRep", "is_compatible", "node_model", "prepare",
           "run_model", "run_node", "supports_device"]
