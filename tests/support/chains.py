"""Shared test helpers (moved from test_fusion.py, which imports them)."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import onnx.parser
from autoclust.backends import cpu
from autoclust.importers.onnx import import_model

from autoclust import flags as flags_mod
from autoclust.compile import compile_cluster


def model_from_text(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(textwrap.dedent(text))
    model.ir_version = 10
    return model


def compile_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **flag_overrides):
    graph = import_model(model)
    types = [(feeds[v.name].dtype, feeds[v.name].shape) for v in graph.inputs]
    flags = flags_mod.parse("", **flag_overrides)
    return compile_cluster(graph, types, {}, flags, cpu), [feeds[v.name] for v in graph.inputs]


CHAIN_OPS = ["Add", "Mul", "Sub", "Tanh", "Mul", "Add", "Abs", "Sqrt", "Mul", "Sub", "Neg",
             "Exp", "Add", "Div", "Sigmoid", "Mul"]


def chain_model(n: int) -> onnx.ModelProto:
    lines, prev = [], "x"
    for i, op in enumerate(CHAIN_OPS):
        out = f"t{i}" if i < len(CHAIN_OPS) - 1 else "y"
        if op in ("Tanh", "Abs", "Sqrt", "Neg", "Exp", "Sigmoid"):
            lines.append(f"{out} = {op}({prev})")
        else:
            lines.append(f"{out} = {op}({prev}, c{i % 3})")
        prev = out
    body = "\n            ".join(lines)
    return model_from_text(f"""
        <ir_version: 10, opset_import: ["" : 18]>
        chain (float[{n}] x) => (float[{n}] y)
        <float c0 = {{1.5}}, float c1 = {{0.75}}, float c2 = {{0.25}}>
        {{
            {body}
        }}""")
