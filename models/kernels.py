"""Small single-pattern models: an MLP and the elementwise/normalization kernels of big models."""

from __future__ import annotations

import numpy as np
import onnx

from .blocks import gelu_erf, layer_norm, rms_norm, silu
from .writer import FLOAT, GraphWriter, linear

# elementwise_chain cycles through these (op, constant) steps; each keeps any finite input
# finite and the values stay in [-3.5, 3] after the first Tanh.
_CHAIN = [
    ("Mul", 0.5), ("Add", 0.25), ("Tanh", None), ("Mul", 3.0),
    ("Sub", 0.5), ("Max", -2.0), ("Min", 2.0), ("Abs", None),
    ("Neg", None), ("Add", 1.0), ("Relu", None), ("Sqrt", None),
    ("Exp", None), ("Div", 2.0), ("Sigmoid", None), ("Sub", 0.5),
]
# The same chain without transcendentals: every op costs one memory pass in onnxruntime and
# almost nothing fused (the 16-op chain PERFORMANCE.md measured).
_CHAIN_ARITH = [
    ("Mul", 0.5), ("Add", 0.25), ("Max", -2.0), ("Mul", 3.0),
    ("Sub", 0.5), ("Min", 2.0), ("Abs", None), ("Neg", None),
    ("Add", 1.0), ("Relu", None), ("Mul", 1.5), ("Div", 2.0),
    ("Sub", 0.125), ("Max", 0.0), ("Add", 0.5), ("Mul", 0.75),
]


def mlp_gelu(d_in: int = 64, hidden: int = 128, d_out: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A 3-layer MLP head (Linear, erf-GELU, Linear, ReLU, Linear) as torch.onnx exports it.

    Mimics the classifier/FFN heads of BERT-style models: MatMul+Add per Linear with the
    GELU left decomposed (Div, Erf, Add, Mul, Mul). The README's default model.
    """
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["batch", d_in])
    h = gelu_erf(w, linear(w, x, "fc1", d_in, hidden))
    h = w.op("Relu", linear(w, h, "fc2", hidden, hidden))
    y = linear(w, h, "fc3", hidden, d_out)
    w.output(y, FLOAT, ["batch", d_out], "logits")
    return w.model("mlp_gelu", {"batch": 2})


def elementwise_chain(chain_len: int = 16, seed: int = 0, math: bool = True) -> onnx.ModelProto:
    """A long chain of unary/const-binary ops: the activation soup between two real kernels.

    Mimics the scalar glue torch.onnx leaves between MatMuls (scales, clamps, activations);
    one fused loop should replace the whole chain. math=False leaves out the
    transcendentals (Tanh, Sqrt, Exp, Sigmoid), so the chain is bound by memory traffic.
    """
    w = GraphWriter(seed)
    y = w.input("x", FLOAT, ["n"])
    table = _CHAIN if math else _CHAIN_ARITH
    for i in range(chain_len):
        op, c = table[i % len(table)]
        y = w.op(op, y) if c is None else w.op(op, y, w.const(c))
    w.output(y, FLOAT, ["n"], "y")
    return w.model("elementwise_chain", {"n": 4096})


def gelu(seed: int = 0) -> onnx.ModelProto:
    """erf-GELU alone, decomposed as HF `gelu` exports: Div, Erf, Add, Mul, Mul."""
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["n"])
    w.output(gelu_erf(w, x), FLOAT, ["n"], "y")
    return w.model("gelu", {"n": 4096})


def layernorm(d: int = 64, seed: int = 0) -> onnx.ModelProto:
    """nn.LayerNorm(d) with weight/bias, decomposed as exporters emit it before opset 17."""
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["batch", "seq", d])
    w.output(layer_norm(w, x, "ln", d, eps=1e-5), FLOAT, ["batch", "seq", d], "y")
    return w.model("layernorm", {"batch": 2, "seq": 16})


def softmax_mask(heads: int = 4, head_dim: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Attention probabilities: scores * 1/sqrt(d) + additive mask, Softmax over the keys.

    Mimics the middle of an exported attention block; mask is the usual 0 / -10000 tensor.
    """
    w = GraphWriter(seed)
    scores = w.input("scores", FLOAT, ["batch", heads, "seq", "seq"])
    mask = w.input("mask", FLOAT, ["batch", 1, 1, "seq"], feed="addmask")
    scaled = w.op("Mul", scores, w.const(1.0 / np.sqrt(head_dim)))
    probs = w.op("Softmax", w.op("Add", scaled, mask), axis=-1)
    w.output(probs, FLOAT, ["batch", heads, "seq", "seq"], "probs")
    return w.model("softmax_mask", {"batch": 2, "seq": 16})


def rmsnorm_gate(d: int = 64, seed: int = 0) -> onnx.ModelProto:
    """RMSNorm then a SiLU gate, no MatMul: `y = rmsnorm(x); out = silu(y) * (y * 0.5)`.

    Mimics the elementwise + row-reduction part of a Llama/Mamba gated block.
    """
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["n", d])
    y = rms_norm(w, x, "norm", d)
    out = w.op("Mul", silu(w, y), w.op("Mul", y, w.const(0.5)))
    w.output(out, FLOAT, ["n", d], "y")
    return w.model("rmsnorm_gate", {"n": 32})
