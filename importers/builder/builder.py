"""autoclust.Builder: build a computation op by op, like XLA's XlaBuilder.

    b = autoclust.Builder("newton_sqrt")
    a = b.parameter("a", np.float32, ["N"])
    x, i = b.while_loop(lambda s, x, i: i < 20,                     # cond_fn(sub-builder, *carried)
                        lambda s, x, i: (0.5 * (x + a / x), i + 1),  # body_fn -> new carried
                        [a, 0])
    run = b.compile(outputs=[x])                                     # or b.to_onnx(outputs=[x])
    run(np.array([4.0, 9.0], np.float32))                            # -> [2., 3.]

Every op of the op table is a method spelled as in ONNX (importers/builder/ops.py):
positional arguments are inputs, keyword arguments ONNX attributes or inputs by their ONNX
name. Types are inferred as you build (the op table's rules): a rejected op raises at once,
naming the op and its operands. Operands support + - * / @ ** and < <= > >=.
Control flow (importers/builder/control.py) becomes ONNX Loop and If whose bodies are
Python callables receiving a sub-builder; a body may read operands of enclosing builders.
Such nodes run in onnxruntime (clustering leaves nodes with subgraphs to it); the rest of
the graph clusters and compiles as any model does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from autoclust.importers.builder import control as builder_control
from autoclust.importers.builder import ops as builder_ops
from autoclust.importers.builder.operand import Operand
from autoclust.importers.builder.ops import OPSET
from autoclust.importers.onnx.export import export_model
from onnx import helper

from autoclust import ops, registry
from autoclust.errors import (
    BuildError,
    InvalidInputError,
    ShapeInferenceError,
    UnsupportedOpError,
)
from autoclust.ir import Graph, Node, Value

_TENSOR_KINDS = "biuf"


def _describe(values: Sequence[Value | None]) -> str:
    return ", ".join("_" if v is None else f"%{v.name}: {v.type_str()}" for v in values)


def _check_dtype(dtype: Any, what: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise BuildError(f"{what}: {dtype!r} is not a dtype: {exc}") from None
    if dt.kind not in _TENSOR_KINDS or dt.itemsize > 8:
        raise BuildError(f"{what}: dtype {dt} has no ONNX tensor type here (use bool, "
                         "int8-64, uint8-64, float16/32/64)")
    return dt


class Builder:
    """Builds an autoclust Graph op by op; see the module docstring."""

    def __init__(self, name: str = "graph", *, parent: Builder | None = None):
        self.name = name
        self.parent = parent
        self.graph = Graph(name)
        self.graph.opset = {"": OPSET}
        self.graph.doc = {"producer_name": "autoclust.Builder"}
        self.outer_reads: dict[str, Operand] = {}  # enclosing builders' operands read here
        self._proxies: dict[str, Value] = {}  # their stand-ins in this graph
        self._output_nodes: list[Node] = []
        self._single_output = False
        self._bodies: dict[str, dict[str, Builder]] = {}  # node name -> {attr: body}

    def __repr__(self) -> str:
        return f"Builder({self.name!r}, {len(self.graph.nodes)} nodes)"

    # ---- values ---------------------------------------------------------------------
    def parameter(self, name: str, dtype: Any, shape: Sequence[int | str | None] | None
                  ) -> Operand:
        """A graph input: dims are ints, names of symbolic dims ("N") or None (unknown)."""
        if self.parent is not None:
            raise BuildError(f"parameter({name!r}): bodies take their inputs as arguments of "
                             "the body function, not as parameters")
        if not isinstance(name, str) or not name or name in self.graph.values:
            raise BuildError(f"parameter name {name!r} must be a new, non-empty string")
        dt = _check_dtype(dtype, f"parameter {name!r}")
        if shape is not None:
            shape = tuple(shape)
            for d in shape:
                if not (d is None or isinstance(d, str) or (isinstance(d, int) and d >= 0)):
                    raise BuildError(f"parameter {name!r}: dim {d!r} must be an int >= 0, a "
                                     "symbol name or None")
        return Operand(self, self.graph.add_input(name, dt, shape))

    def constant(self, value: Any, dtype: Any = None, name: str = "") -> Operand:
        """A constant (an initializer) holding `value`, as `dtype` when given."""
        if isinstance(value, Operand):
            raise BuildError(f"constant() takes a Python or NumPy value, got {value!r}")
        try:
            array = np.array(value, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise BuildError(f"constant {value!r} as {dtype}: {exc}") from None
        _check_dtype(array.dtype, f"constant {name or value!r}")
        if name and name in self.graph.values:
            raise BuildError(f"constant name {name!r} is already used")
        name = name or self.graph.unique_name("const_")
        return Operand(self, self.graph.add_initializer(name, array))

    def _as_operand(self, x: Any, what: str) -> Operand:
        """An Operand for `x`: itself, or a constant of a Python/NumPy value."""
        if isinstance(x, Operand):
            return x
        array = np.asarray(x)
        if array.dtype == np.float64 and not isinstance(x, np.ndarray | np.generic):
            array = array.astype(np.float32)  # Python floats build float32, as in ONNX
        try:
            return self.constant(array)
        except BuildError as exc:
            raise BuildError(f"{what}: {exc}") from None

    def encloses(self, other: Builder) -> bool:
        """True when `other` is this builder or a body nested (at any depth) inside it."""
        while other is not None and other is not self:
            other = other.parent
        return other is self

    def _local(self, x: Operand) -> Value:
        """The Value standing for operand `x` in this graph (a proxy for outer operands)."""
        if not isinstance(x, Operand):
            raise BuildError(f"expected an Operand, got {type(x).__name__}")
        if x.builder is self:
            return x.value
        if not x.builder.encloses(self):
            raise BuildError(f"{x!r} belongs to another builder ({x.builder.name!r}), not to "
                             f"{self.name!r} or a builder enclosing it")
        proxy = self._proxies.get(x.name)
        if proxy is None:
            proxy = Value(x.name, x.dtype, x.shape)
            self.graph.values[x.name] = proxy
            self._proxies[x.name] = proxy
            self.outer_reads[x.name] = x
        return proxy

    def _known_constants(self, values: Sequence[Value | None]) -> dict[str, np.ndarray]:
        """Constant values of the outer operands among `values` (for shape inference)."""
        known = {}
        for v in values:
            if v is not None and v.name in self.outer_reads:
                outer = self.outer_reads[v.name]
                array = outer.builder._constant_value(outer)
                if array is not None:
                    known[v.name] = array
        return known

    def _constant_value(self, x: Operand) -> np.ndarray | None:
        if x.builder is not self:
            return x.builder._constant_value(x)
        if x.name in self.outer_reads:
            return self._known_constants([x.value]).get(x.name)
        return self.graph.constant_value(x.value)

    # ---- ops ------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: Any, n_outputs: int | None = None, name: str = "",
           domain: str = "", **kwargs: Any) -> Any:
        """Emit one `op_type` node (an op of the op table); see the generated methods."""
        if ops.get(op_type, domain) is None:
            raise UnsupportedOpError(f"{op_type} is not in autoclust's op table (the Builder "
                                     "emits table ops, plus Loop/If through while_loop, "
                                     "fori_loop and if_)")
        s = builder_ops.schema(op_type, domain)
        args, attrs = builder_ops.bind(op_type, s, inputs, kwargs)
        count = builder_ops.output_count(op_type, s, attrs, args, n_outputs)
        values = self._input_values(op_type, domain, args)
        outs = self._emit(op_type, values, attrs, count, name, domain)
        return outs if builder_ops.returns_tuple(s, count) else outs[0]

    def _input_values(self, op: str, domain: str, args: list[Any]) -> list[Value | None]:
        s = builder_ops.schema(op, domain)
        peers = {}
        for i, a in enumerate(args):
            if isinstance(a, Operand) and a.dtype is not None:
                peers.setdefault(builder_ops.formal_input(s, i).type_str, a.dtype)
        values: list[Value | None] = []
        for i, a in enumerate(args):
            if a is None:
                values.append(None)
                continue
            if not isinstance(a, Operand):
                dt = builder_ops.constant_dtype(op, domain, i, a, peers)
                a = self.constant(a, dtype=dt)
            values.append(self._local(a))
        return values

    def _emit(self, op: str, values: list[Value | None], attrs: dict[str, Any], count: int,
              name: str, domain: str) -> tuple[Operand, ...]:
        base = op.lower()
        outs = [Value(self.graph.unique_name(f"{base}_")) for _ in range(count)]
        node = Node(op, values, outs, attrs, name or self.graph.unique_name(f"{op}_"), domain)
        try:
            types = ops.infer_node(node, self.graph, self._known_constants(values))
        except ShapeInferenceError as exc:
            raise ShapeInferenceError(f"builder {self.name!r}: {op}({_describe(values)}): "
                                      f"{exc}") from None
        if len(types) < count:
            raise BuildError(f"{op}: the op table infers {len(types)} outputs, {count} asked")
        for v, (dt, shape) in zip(outs, types):
            v.dtype = None if dt is None else np.dtype(dt)
            v.shape = None if shape is None else tuple(shape)
        self.graph.add_node(node)
        return tuple(Operand(self, v) for v in outs)

    def _emit_control(self, op: str, inputs: list[Operand | None],
                      bodies: dict[str, Builder], types: list[tuple[np.dtype, tuple | None]]
                      ) -> tuple[Operand, ...]:
        """Emit a Loop or If node: `bodies` are its finished sub-builders (attribute ->
        builder), `types` its outputs'; what the bodies read outside becomes implicit
        inputs."""
        attrs = {k: helper.make_attribute(k, builder_control.finish(sb))
                 for k, sb in bodies.items()}
        reads: dict[str, Operand] = {}
        for sb in bodies.values():
            reads.update(sb.outer_reads)
        values = [None if x is None else self._local(x) for x in inputs]
        outs = [Value(self.graph.unique_name(f"{op.lower()}_"), dt, shape)
                for dt, shape in types]
        node = Node(op, values, outs, attrs, self.graph.unique_name(f"{op}_"))
        node.implicit_inputs = [self._local(x) for x in reads.values()]
        self.graph.add_node(node)
        self._bodies[node.name] = dict(bodies)
        return tuple(Operand(self, v) for v in outs)

    # ---- control flow (importers/builder/control.py) ---------------------------------
    def while_loop(self, cond_fn: Callable[..., Operand], body_fn: Callable[..., Any],
                   init_values: Any, *, max_trip_count: int | Operand | None = None) -> Any:
        """Loop while cond_fn(sub, *values) holds: values = body_fn(sub, *values)."""
        return builder_control.while_loop(self, cond_fn, body_fn, init_values,
                                          max_trip_count)

    def fori_loop(self, n: int | Operand, body_fn: Callable[..., Any], init_values: Any
                  ) -> Any:
        """values = body_fn(sub, i, *values) for i = 0 .. n-1 (i is an int64 scalar)."""
        return builder_control.fori_loop(self, n, body_fn, init_values)

    def if_(self, cond: Operand, then_fn: Callable[..., Any], else_fn: Callable[..., Any]
            ) -> Any:
        """then_fn(sub) if cond else else_fn(sub); both return the same number and dtypes."""
        return builder_control.if_(self, cond, then_fn, else_fn)

    # ---- results --------------------------------------------------------------------
    def _sub(self, name: str) -> Builder:
        return Builder(self.graph.unique_name(f"{self.name}_{name}_"), parent=self)

    def _set_outputs(self, outputs: Sequence[tuple[str, Operand]]) -> list[Value]:
        for node in reversed(self._output_nodes):  # Identities from an earlier build()
            if not any(v.uses for v in node.outputs):
                self.graph.outputs = [v for v in self.graph.outputs if v not in node.outputs]
                self.graph.remove_node(node)
                for v in node.outputs:
                    del self.graph.values[v.name]
        self._output_nodes = []
        result: list[Value] = []
        for name, x in outputs:
            v = self._local(x)
            if name or v.producer is None or v in result or v.name in self._proxies:
                # graph inputs, constants, proxies and repeats get their own output value
                node = Node("Identity", [v], [Value(name or self.graph.unique_name("out_"),
                                                    v.dtype, v.shape)],
                            name=self.graph.unique_name("Identity_"))
                if name and name in self.graph.values:
                    raise BuildError(f"output name {name!r} is already used in the graph")
                self.graph.add_node(node)
                self._output_nodes.append(node)
                v = node.outputs[0]
            result.append(v)
        self.graph.outputs = result
        return result

    def as_text(self) -> str:
        """The graph, one node per line, followed by the bodies of its Loop/If nodes."""
        parts = [str(self.graph)]
        for node_name, bodies in self._bodies.items():
            for attr, body in bodies.items():
                text = body.as_text().replace("\n", "\n  ")
                parts.append(f"{node_name}.{attr}:\n  {text}")
        return "\n".join(parts)

    def build(self, outputs: Any) -> Graph:
        """Set the graph's outputs (an Operand, a list, or a dict name -> Operand) and
        return the graph (verified). Ops added later extend the same graph."""
        if self.parent is not None:
            raise BuildError("build() is for the top-level builder; a body returns its "
                             "outputs from its function")
        self._single_output = isinstance(outputs, Operand)
        if isinstance(outputs, dict):
            named = [(str(k), v) for k, v in outputs.items()]
        elif isinstance(outputs, Operand):
            named = [("", outputs)]
        else:
            named = [("", v) for v in outputs]
        if not named:
            raise BuildError("build() needs at least one output")
        self._set_outputs(named)
        self.graph.verify()
        return self.graph

    def to_onnx(self, outputs: Any = None) -> onnx.ModelProto:
        """The graph as an ONNX model (checked), built with `outputs` when given."""
        if outputs is not None:
            self.build(outputs)
        elif not self.graph.outputs:
            raise BuildError("to_onnx(): call build(outputs=...) first or pass outputs=")
        model = export_model(self.graph, ir_version=10)
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise BuildError(f"builder {self.name!r} made an invalid ONNX model: {exc}"
                             ) from None
        return model

    def compile(self, outputs: Any = None, **flags: Any) -> Compiled:
        """A callable running the graph through autoclust.InferenceSession (flags as
        keywords: device="interpreter", threads=2, ...)."""
        model = self.to_onnx(outputs)
        return Compiled(model, single=self._single_output, **flags)


builder_ops.install_methods(Builder)


class Compiled:
    """A built graph ready to run: call it with arrays (positional or by input name)."""

    def __init__(self, model: onnx.ModelProto, *, single: bool = False, **flags: Any):
        self.model = model
        self.session = registry.session_class()(model, **flags)
        self.inputs = self.session.get_inputs()
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.single = single and len(self.output_names) == 1
        self._dtypes = {v.name: _input_dtype(v) for v in model.graph.input}

    def feeds(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The input feed of a call: positional arguments in input order, then by name."""
        if len(args) > len(self.input_names):
            raise InvalidInputError(f"{len(args)} arguments given; the graph takes "
                                    f"{len(self.input_names)} ({', '.join(self.input_names)})")
        feeds = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k in feeds:
                raise InvalidInputError(f"input {k!r} given twice")
            feeds[k] = v
        for k, v in feeds.items():
            if not isinstance(v, np.ndarray) and self._dtypes.get(k) is not None:
                feeds[k] = np.asarray(v, dtype=self._dtypes[k])  # Python values: as declared
        return feeds

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outs = self.session.run(None, self.feeds(args, kwargs))
        return outs[0] if self.single else outs

    def explain(self) -> str:
        """What clustered and why the rest did not (as `autoclust explain`)."""
        return self.session.explain()


def _input_dtype(vi: onnx.ValueInfoProto) -> np.dtype | None:
    elem = vi.type.tensor_type.elem_type
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else None
    except (KeyError, TypeError, ValueError):
        return None
