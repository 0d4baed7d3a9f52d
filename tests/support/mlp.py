"""Shared test helpers (moved from test_latency.py, which imports them)."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(textwrap.dedent(text))
    model.ir_version = 10
    return model


def mlp(w: np.ndarray, scale: float = 0.5) -> onnx.ModelProto:
    """x[1, seq, K] @ w[K, N] (a library call) then a fused elementwise tail whose scalar
    constant is inlined into kernel code."""
    model = parse(f"""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[1, seq, {w.shape[0]}] x) => (float[1, seq, {w.shape[1]}] y) {{
            m = MatMul(x, w)
            s = Constant <value = float {{{scale}}}> ()
            a = Mul(m, s)
            t = Tanh(a)
            y = Add(t, m)
        }}
    """)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    return model
