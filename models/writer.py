"""GraphWriter: emits ONNX graphs with the node and value names torch.onnx gives them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL

# Keys of the model metadata that feeds() reads back (so saved .onnx files keep them).
META_NAME = "autoclust.zoo.name"
META_DIMS = "autoclust.zoo.dims"
META_FEED = "autoclust.zoo.feed."

Dim = int | str | None


class GraphWriter:
    """Collects nodes, initializers and graph inputs/outputs for one model.

    Names follow the TorchScript exporter: nodes are `/encoder/layer.0/attention/MatMul`,
    their outputs `/encoder/layer.0/attention/MatMul_output_0`, scalars come from
    `Constant` nodes and weights are initializers named like module parameters.
    """

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.feed_specs: dict[str, str] = {}
        self._scope: list[str] = []
        self._used: set[str] = set()

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Name the nodes emitted inside after a module path component, like `layer.0`."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def _node_name(self, op_type: str) -> str:
        base = "/" + "/".join([*self._scope, op_type])
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def op(self, op_type: str, *inputs: str, n_out: int = 1, out: str | None = None,
           **attrs: object) -> str | list[str]:
        """Emit one node; returns its output name (a list when n_out > 1)."""
        name = self._node_name(op_type)
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        if out is not None:
            outs[0] = out
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value: object, dtype: type = np.float32) -> str:
        """Emit a Constant node holding `value` (a scalar stays 0-d, like torch exports)."""
        arr = np.asarray(value, dtype=dtype)
        name = self._node_name("Constant")
        out = f"{name}_output_0"
        tensor = numpy_helper.from_array(arr, name=out)
        self.nodes.append(helper.make_node("Constant", [], [out], name=name, value=tensor))
        return out

    def ints(self, *values: int) -> str:
        """Emit a 1-d int64 Constant (axes, shapes, slice bounds)."""
        return self.const(list(values), np.int64)

    def init(self, name: str, array: np.ndarray) -> str:
        """Add an initializer named like a module parameter: `<scope path>.<name>`."""
        full = ".".join([*self._scope, name])
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name=full))
        return full

    def weight(self, name: str, shape: Sequence[int], scale: float | None = None) -> str:
        """Add a float32 N(0, scale) initializer; scale defaults to 1/sqrt(fan_in)."""
        if scale is None:
            fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else int(shape[0])
            scale = 1.0 / np.sqrt(max(fan_in, 1))
        arr = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.init(name, arr)

    def filled(self, name: str, shape: Sequence[int], value: float) -> str:
        """Add a float32 initializer filled with `value` (LayerNorm gamma/beta, BN stats)."""
        return self.init(name, np.full(shape, value, dtype=np.float32))

    def input(self, name: str, elem_type: int, shape: Sequence[Dim], feed: str = "randn") -> str:
        """Declare a graph input; `feed` says how feeds() fills it (see zoo.feeds)."""
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        self.feed_specs[name] = feed
        return name

    def output(self, value: str, elem_type: int, shape: Sequence[Dim], name: str) -> str:
        """Declare `value` a graph output, renaming it to `name` as exporters do."""
        for node in self.nodes:
            node.output[:] = [name if o == value else o for o in node.output]
            node.input[:] = [name if i == value else i for i in node.input]
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def model(self, name: str, dims: dict[str, int], opset: int = 17) -> onnx.ModelProto:
        """Assemble the ModelProto (ir_version 10) with the zoo metadata feeds() reads."""
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="autoclust.models")
        model.ir_version = 10
        meta = {META_NAME: name, META_DIMS: ",".join(f"{k}={v}" for k, v in dims.items())}
        meta.update({META_FEED + k: v for k, v in self.feed_specs.items()})
        helper.set_model_props(model, meta)
        return model


def linear(w: GraphWriter, x: str, name: str, d_in: int, d_out: int, bias: bool = True) -> str:
    """nn.Linear as torch.onnx emits it for 3-d input: MatMul by W^T initializer, then Add."""
    with w.scope(name):
        y = w.op("MatMul", x, w.weight("weight_t", (d_in, d_out)))
        if bias:
            y = w.op("Add", w.weight("bias", (d_out,), scale=0.02), y)
    return y


def dim_of(w: GraphWriter, x: str, axis: int) -> str:
    """`x.size(axis)` as exported: Shape -> Gather(Constant axis) -> 0-d int64."""
    return w.op("Gather", w.op("Shape", x), w.const(axis, np.int64), axis=0)


def shape_of(w: GraphWriter, *parts: str | int) -> str:
    """Build a 1-d shape from 0-d dims and ints: Unsqueeze each dim, Concat (exporter style)."""
    pieces = []
    for p in parts:
        if isinstance(p, str):
            pieces.append(w.op("Unsqueeze", p, w.ints(0)))
        else:
            pieces.append(w.ints(p))
    return w.op("Concat", *pieces, axis=0)
