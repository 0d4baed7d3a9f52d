"""Check one op of the table against onnxruntime: reference values and inferred types.

`check_op("Add", [a, b])` builds a one-node ONNX model, runs it with onnxruntime, runs
the op's NumPy reference and its infer rule, and asserts that values, dtypes and shapes
agree. Failure messages name the op, attributes, input shapes and dtypes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from autoclust import ops
from autoclust.ops import InferContext

DEFAULT_OPSET = 18


def _describe(op: str, inputs: list, attrs: dict) -> str:
    parts = []
    for x in inputs:
        parts.append("None" if x is None else f"{x.dtype}{list(x.shape)}")
    return f"{op}({', '.join(parts)}) attrs={attrs}"


def one_node_model(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any],
                   n_outputs: int, opset: int, const_inputs: tuple[int, ...] = (),
                   domain: str = "") -> onnx.ModelProto:
    names, graph_inputs, inits = [], [], []
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if i in const_inputs:
            inits.append(onnx.numpy_helper.from_array(np.asarray(x), name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(x.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(x.shape)))
    while names and names[-1] == "":
        names.pop()
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_op(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any] | None = None,
             n_outputs: int = 1, opset: int = DEFAULT_OPSET, rtol: float = 1e-5,
             atol: float = 1e-6, const_inputs: tuple[int, ...] | None = None,
             symbolic: bool = True) -> list[np.ndarray]:
    """Assert ref == onnxruntime and infer == actual types; returns the reference outputs."""
    attrs = dict(attrs or {})
    d = ops.get(op)
    assert d is not None, f"{op} is not in the op table"
    if const_inputs is None:
        const_inputs = d.shape_inputs
    where = _describe(op, inputs, attrs)
    model = one_node_model(op, inputs, attrs, n_outputs, opset, const_inputs)
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None and i not in const_inputs}
    expected = run_ort(model, feeds)
    got = d.ref([None if x is None else np.asarray(x) for x in inputs], attrs)
    assert len(got) >= n_outputs, f"{where}: ref returned {len(got)} outputs"
    for k, (e, g) in enumerate(zip(expected, got)):
        g = np.asarray(g)
        assert g.dtype == e.dtype, f"{where} output {k}: ref dtype {g.dtype}, onnxruntime {e.dtype}"
        assert g.shape == e.shape, f"{where} output {k}: ref shape {g.shape}, onnxruntime {e.shape}"
        if e.dtype.kind in "fc":
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{where} output {k}")
        else:
            np.testing.assert_array_equal(g, e, err_msg=f"{where} output {k}")
    _check_infer(d, op, inputs, attrs, const_inputs, expected, where)
    if symbolic:
        _check_symbolic_infer(d, op, inputs, attrs, const_inputs, expected, where)
    return got


def _context(op: str, inputs: list, attrs: dict, const_inputs: tuple[int, ...],
             shapes: list | None = None) -> InferContext:
    present = [x is not None for x in inputs]
    dtypes = [None if x is None else np.asarray(x).dtype for x in inputs]
    if shapes is None:
        shapes = [None if x is None else tuple(np.shape(x)) for x in inputs]
    values = [np.asarray(x) if (x is not None and i in const_inputs) else None
              for i, x in enumerate(inputs)]
    return InferContext(op, dtypes, shapes, values, attrs, present, "n0")


def _check_infer(d, op, inputs, attrs, const_inputs, expected, where) -> None:
    types = d.infer(_context(op, inputs, attrs, const_inputs))
    for k, e in enumerate(expected):
        dt, shape = types[k]
        assert np.dtype(dt) == e.dtype, f"{where} output {k}: infer dtype {dt}, actual {e.dtype}"
        assert shape is not None and len(shape) == e.ndim, \
            f"{where} output {k}: infer shape {shape}, actual {e.shape}"
        for a, b in zip(shape, e.shape):
            assert a is None or a == b, f"{where} output {k}: infer shape {shape}, actual {e.shape}"
        if not d.data_dependent:
            assert all(isinstance(a, int) for a in shape), \
                f"{where} output {k}: concrete inputs gave non-concrete shape {shape}"


def _check_symbolic_infer(d, op, inputs, attrs, const_inputs, expected, where) -> None:
    """Replace the first dim of every non-constant input by a symbol: infer must still
    give the right rank and any dim it claims as an int must be right."""
    shapes = []
    for i, x in enumerate(inputs):
        if x is None:
            shapes.append(None)
        elif i in const_inputs or np.ndim(x) == 0:
            shapes.append(tuple(np.shape(x)))
        else:
            s = list(np.shape(x))
            s[0] = "N"
            shapes.append(tuple(s))
    try:
        types = d.infer(_context(op, inputs, attrs, const_inputs, shapes))
    except Exception as exc:  # noqa: BLE001 - symbolic dims must never crash a rule
        raise AssertionError(f"{where}: infer with symbolic dims {shapes} raised {exc!r}")
    for k, e in enumerate(expected):
        dt, shape = types[k]
        assert np.dtype(dt) == e.dtype, f"{where} symbolic output {k}: dtype {dt} vs {e.dtype}"
        if shape is None:
            continue
        assert len(shape) == e.ndim, f"{where} symbolic output {k}: {shape} vs {e.shape}"
        for a, b in zip(shape, e.shape):
            assert not isinstance(a, int) or a == b, \
                f"{where} symbolic output {k}: infer {shape} vs actual {e.shape}"
