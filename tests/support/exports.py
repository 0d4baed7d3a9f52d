"""Real-export-shaped models for the debugging tests.

- `llama_export(path)`: a 2-layer grouped-query LLaMA (4 query heads, 2 key/value heads,
  RoPE, RMSNorm, SiLU) from transformers with random weights, through
  `torch.onnx.export(..., dynamo=True)`: the exporter's own output, as users bring it
  (initializer scalars such as RMSNorm's Pow exponent, the -FLT_MAX causal mask, repeat_kv's
  Expand/Reshape). Needs torch and transformers; tests skip without them.
- `dynamo_style(model)`: a zoo model (models/, written as the TorchScript exporter wrote
  graphs) with its Constant nodes turned into initializers, as the dynamo exporter writes
  scalars: RMSNorm's exponent then reaches the oracle's jitter, which is what broke bisect.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
         "max_position_embeddings": 64}
LLAMA_SEQ = 16


def llama_export(path: str) -> dict[str, np.ndarray]:
    """Export the tiny grouped-query LLaMA to `path` (ir_version 10); returns its feeds."""
    import torch
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(**LLAMA)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).last_hidden_state

    ids = torch.randint(0, LLAMA["vocab_size"], (1, LLAMA_SEQ), generator=torch.Generator()
                        .manual_seed(0))
    with torch.no_grad():
        program = torch.onnx.export(Hidden().eval(), (ids,), dynamo=True, verbose=False,
                                    input_names=["input_ids"],
                                    output_names=["last_hidden_state"])
    proto = program.model_proto
    proto.ir_version = 10  # onnxruntime 1.31 reads at most 13
    onnx.save(proto, path)
    return {"input_ids": ids.numpy()}


def dynamo_style(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every Constant node's tensor an initializer instead."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = []
    for node in out.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None:
            out.graph.initializer.append(numpy_helper.from_array(
                numpy_helper.to_array(value), node.output[0]))
        else:
            kept.append(node)
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out
