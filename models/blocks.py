"""Decomposed layers exactly as exporters emit them: LayerNorm, RMSNorm, GroupNorm, GELU, SiLU."""

from __future__ import annotations

import math

import numpy as np

from .writer import GraphWriter


def gelu_erf(w: GraphWriter, x: str) -> str:
    """`x * 0.5 * (1 + erf(x / sqrt(2)))`: Div, Erf, Add, Mul, Mul (HF `gelu` export)."""
    with w.scope("act"):
        e = w.op("Erf", w.op("Div", x, w.const(math.sqrt(2.0))))
        return w.op("Mul", w.op("Mul", x, w.op("Add", e, w.const(1.0))), w.const(0.5))


def silu(w: GraphWriter, x: str) -> str:
    """`x * sigmoid(x)`: what torch.onnx emits for nn.SiLU below opset 20."""
    return w.op("Mul", x, w.op("Sigmoid", x))


def layer_norm(w: GraphWriter, x: str, name: str, d: int, eps: float = 1e-12) -> str:
    """nn.LayerNorm over the last axis as older exporters emit it (opset < 17 decomposition).

    ReduceMean, Sub, Pow(2), ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta.
    """
    with w.scope(name):
        mean = w.op("ReduceMean", x, axes=[-1])
        centered = w.op("Sub", x, mean)
        var = w.op("ReduceMean", w.op("Pow", centered, w.const(2.0)), axes=[-1])
        std = w.op("Sqrt", w.op("Add", var, w.const(eps)))
        normed = w.op("Div", centered, std)
        gamma = w.init("weight", 1.0 + 0.1 * w.rng.standard_normal(d).astype(np.float32))
        scaled = w.op("Mul", normed, gamma)
        return w.op("Add", scaled, w.weight("bias", (d,), scale=0.02))


def rms_norm(w: GraphWriter, x: str, name: str, d: int, eps: float = 1e-6,
             reciprocal: bool = True) -> str:
    """LlamaRMSNorm: Cast f32, Pow 2, ReduceMean, Add eps, Sqrt, Reciprocal (or Div), Mul, Mul w."""
    with w.scope(name):
        x = w.op("Cast", x, to=1)  # hidden_states.to(torch.float32): a no-op cast in f32 models
        var = w.op("ReduceMean", w.op("Pow", x, w.const(2.0)), axes=[-1])
        root = w.op("Sqrt", w.op("Add", var, w.const(eps)))
        if reciprocal:
            normed = w.op("Mul", x, w.op("Reciprocal", root))
        else:
            normed = w.op("Div", x, root)
        gamma = w.init("weight", 1.0 + 0.1 * w.rng.standard_normal(d).astype(np.float32))
        return w.op("Mul", gamma, normed)


def group_norm(w: GraphWriter, x: str, name: str, channels: int, groups: int,
               eps: float = 1e-5, instance_norm: bool = True) -> str:
    """nn.GroupNorm on NCHW as torch.onnx emits it below opset 18.

    Reshape to [N, G, -1], normalize each group (InstanceNormalization with unit scale, or
    the explicit ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div chain), Reshape back to
    Shape(x), then Mul per-channel scale [C,1,1] and Add bias [C,1,1].
    """
    with w.scope(name):
        grouped = w.op("Reshape", x, w.ints(0, groups, -1))
        if instance_norm:
            ones = w.const(np.ones(groups))
            zeros = w.const(np.zeros(groups))
            normed = w.op("InstanceNormalization", grouped, ones, zeros, epsilon=eps)
        else:
            mean = w.op("ReduceMean", grouped, axes=[-1])
            centered = w.op("Sub", grouped, mean)
            var = w.op("ReduceMean", w.op("Pow", centered, w.const(2.0)), axes=[-1])
            normed = w.op("Div", centered, w.op("Sqrt", w.op("Add", var, w.const(eps))))
        back = w.op("Reshape", normed, w.op("Shape", x))
        gamma = 1.0 + 0.1 * w.rng.standard_normal((channels, 1, 1)).astype(np.float32)
        scaled = w.op("Mul", back, w.init("weight", gamma))
        return w.op("Add", scaled, w.weight("bias", (channels, 1, 1), scale=0.02))
