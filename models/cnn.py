"""Convolutional models as torch.onnx emits them: a ResNet basic block and a UNet resnet block."""

from __future__ import annotations

import numpy as np
import onnx

from .blocks import group_norm, silu
from .writer import FLOAT, GraphWriter


def _conv3x3(w: GraphWriter, x: str, name: str, c_in: int, c_out: int, bias: bool) -> str:
    """nn.Conv2d(c_in, c_out, 3, padding=1)."""
    with w.scope(name):
        inputs = [x, w.weight("weight", (c_out, c_in, 3, 3), scale=1.0 / np.sqrt(9 * c_in))]
        if bias:
            inputs.append(w.weight("bias", (c_out,), scale=0.02))
        return w.op("Conv", *inputs, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1],
                    dilations=[1, 1], group=1)


def _batch_norm(w: GraphWriter, x: str, name: str, c: int) -> str:
    """nn.BatchNorm2d in eval mode (exported unfolded, as with do_constant_folding=False)."""
    with w.scope(name):
        scale = w.init("weight", (1.0 + 0.1 * w.rng.standard_normal(c)).astype(np.float32))
        bias = w.weight("bias", (c,), scale=0.05)
        mean = w.weight("running_mean", (c,), scale=0.1)
        var = w.init("running_var", (0.5 + w.rng.random(c)).astype(np.float32))
        return w.op("BatchNormalization", x, scale, bias, mean, var, epsilon=1e-5,
                    momentum=0.9)


def resnet_block(channels: int = 16, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """torchvision BasicBlock plus a classifier head: the CNN inference staple.

    Conv+BatchNormalization+Relu, Conv+BatchNormalization, residual Add, Relu, MaxPool 2x2,
    GlobalAveragePool, Flatten, Gemm(transB=1) as nn.Linear on 2-d input exports.
    """
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["batch", channels, "height", "width"])
    with w.scope("layer1.0"):
        h = w.op("Relu", _batch_norm(w, _conv3x3(w, x, "conv1", channels, channels, False),
                                     "bn1", channels))
        h = _batch_norm(w, _conv3x3(w, h, "conv2", channels, channels, False), "bn2", channels)
        h = w.op("Relu", w.op("Add", h, x))
    h = w.op("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    h = w.op("Flatten", w.op("GlobalAveragePool", h), axis=1)
    with w.scope("fc"):
        fc_w = w.weight("weight", (classes, channels), scale=1.0 / np.sqrt(channels))
        y = w.op("Gemm", h, fc_w, w.weight("bias", (classes,), scale=0.02), alpha=1.0,
                 beta=1.0, transB=1)
    w.output(y, FLOAT, ["batch", classes], "logits")
    return w.model("resnet_block", {"batch": 2, "height": 32, "width": 32})


def diffusion_block(channels: int = 32, groups: int = 8, temb_dim: int = 64,
                    seed: int = 0) -> onnx.ModelProto:
    """diffusers ResnetBlock2D (UNet down/up block body) as torch.onnx exports it.

    GroupNorm (InstanceNormalization form) + SiLU + Conv, time embedding SiLU + Gemm +
    Unsqueeze added, GroupNorm (ReduceMean form) + SiLU + Conv, residual Add, Div by
    output_scale_factor 1.0 (exporters keep it).
    """
    w = GraphWriter(seed)
    x = w.input("x", FLOAT, ["batch", channels, "height", "width"])
    temb = w.input("temb", FLOAT, ["batch", temb_dim])
    h = silu(w, group_norm(w, x, "norm1", channels, groups, instance_norm=True))
    h = _conv3x3(w, h, "conv1", channels, channels, True)
    with w.scope("time_emb_proj"):
        t = w.op("Gemm", silu(w, temb), w.weight("weight", (channels, temb_dim)),
                 w.weight("bias", (channels,), scale=0.02), alpha=1.0, beta=1.0, transB=1)
        t = w.op("Unsqueeze", t, w.ints(2, 3))
    h = w.op("Add", h, t)
    h = silu(w, group_norm(w, h, "norm2", channels, groups, instance_norm=False))
    h = _conv3x3(w, h, "conv2", channels, channels, True)
    out = w.op("Div", w.op("Add", x, h), w.const(1.0))
    w.output(out, FLOAT, ["batch", channels, "height", "width"], "sample")
    return w.model("diffusion_block", {"batch": 2, "height": 32, "width": 32})
