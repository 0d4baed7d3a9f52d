"""One-node graphs compiled on the CPU backend and checked against onnxruntime, random
inputs with special values (test_cpu_backend, test_lowering, the GPU tests)."""

from __future__ import annotations

import numpy as np
from autoclust.backends import cpu
from autoclust.importers.onnx import export_model

from autoclust import flags as flags_mod
from autoclust import ops
from autoclust.compile import lower_graph
from autoclust.ir import Graph, Node
from autoclust.kernel import ir as kir


def one_node_graph(op: str, inputs: list, attrs: dict | None = None,
                   const_inputs: tuple[int, ...] = (), n_outputs: int = 1) -> Graph:
    """A graph of one node; inputs listed in const_inputs become initializers."""
    g = Graph(op)
    vals = []
    for i, x in enumerate(inputs):
        if x is None:
            vals.append(None)
        elif i in const_inputs:
            vals.append(g.add_initializer(f"c{i}", np.asarray(x)))
        else:
            vals.append(g.add_input(f"in{i}", x.dtype, x.shape))
    outs = [g.value(f"out{k}") for k in range(n_outputs)]
    node = g.add_node(Node(op, vals, outs, attrs or {}))
    infer(g, node)
    g.outputs = outs
    return g


def infer(g: Graph, node: Node) -> None:
    for v, (dt, shape) in zip(node.outputs, ops.infer_node(node, g)):
        v.dtype, v.shape = np.dtype(dt), tuple(shape)


def run_onnxruntime(g: Graph, feeds: list[np.ndarray]) -> list[np.ndarray]:
    """The graph exported to ONNX and run by onnxruntime (optimizations off)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(export_model(g).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {v.name: x for v, x in zip(g.inputs, feeds)})


def check_compiled(g: Graph, feeds: list[np.ndarray], rtol: float = 1e-5,
                   atol: float = 1e-6, **flag_overrides) -> cpu.Executable:
    """Lower g (no graph optimizations, so each op's own lowering runs), compile it, run
    it, and assert the outputs equal onnxruntime's."""
    flags = flags_mod.parse("", **flag_overrides)
    exe = cpu.compile(lower_graph(g, flags, cpu), flags)
    expected = run_onnxruntime(g, [np.asarray(x) for x in feeds])
    got = exe.run(feeds)
    assert len(got) == len(expected)
    text = kir.format_program(exe.program)
    for k, (e, o) in enumerate(zip(expected, got)):
        e = np.asarray(e)
        where = f"{g.name} output {k} {text}"
        assert o.dtype == e.dtype, f"{where}: dtype {o.dtype} vs {e.dtype}"
        assert o.shape == e.shape, f"{where}: shape {o.shape} vs {e.shape}"
        if e.dtype.kind == "f":
            np.testing.assert_allclose(o.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                       atol=atol, equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(o, e, err_msg=where)
    return exe


RNG = np.random.default_rng(0)


def rand(shape, dtype="float32", lo=-3.0, hi=3.0):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) > 0.5
    if dtype.kind in "iu":
        return RNG.integers(-20, 20, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def with_specials(x):
    x = x.copy()
    flat = x.reshape(-1)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    flat[:len(specials)] = specials[:flat.size]
    return x
