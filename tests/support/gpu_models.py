"""Zoo models for the simulated device: expected kernel counts and float16 variants
(test_gpu_runtime, test_gpu, test_gpu_fake)."""

from __future__ import annotations

import numpy as np
import onnx
from autoclust.models import zoo
from onnx import numpy_helper

# zoo model -> kernels per cluster (the GPU policy: Conv and pooling stay in onnxruntime)
KERNELS = {
    "mlp_gelu": [[5]], "bert_encoder": [[33]], "llama_block": [[16]], "resnet_block": [],
    "diffusion_block": [[1], [3], [1]], "elementwise_chain": [[1]], "gelu": [[1]],
    "layernorm": [[1]], "softmax_mask": [[1]], "rmsnorm_gate": [[1]],
    "mixed_dynamic": [[1], [1], [1], [1]],
}


def to_float16(model):
    """The model with float32 storage turned to float16: initializers, Constant values,
    Casts to float, and input/output/value_info types."""
    def convert(t):
        if t.data_type == onnx.TensorProto.FLOAT:
            with np.errstate(over="ignore"):  # -3.4e38 masks become -inf, in both engines
                half = numpy_helper.to_array(t).astype(np.float16)
            t.CopyFrom(numpy_helper.from_array(half, t.name))
    for t in model.graph.initializer:
        convert(t)
    for n in model.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                convert(a.t)
            if n.op_type == "Cast" and a.name == "to" and a.i == onnx.TensorProto.FLOAT:
                a.i = onnx.TensorProto.FLOAT16
    values = list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
    for v in values:
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    return model


def half_feeds(model):
    return {k: (v.astype(np.float16) if v.dtype == np.float32 else v)
            for k, v in zoo.feeds(model).items()}


HALF_MODELS = ["bert_encoder", "llama_block", "layernorm", "softmax_mask", "mlp_gelu",
               "rmsnorm_gate"]
