"""Transformer models as torch.onnx (TorchScript exporter) emits them: BERT and a Llama block."""

from __future__ import annotations

import math

import numpy as np
import onnx

from .blocks import gelu_erf, layer_norm, rms_norm, silu
from .writer import FLOAT, INT64, GraphWriter, dim_of, linear, shape_of

INT64_MAX = np.iinfo(np.int64).max
F32_MIN = float(np.finfo(np.float32).min)


def split_heads(w: GraphWriter, x: str, heads: int, head_dim: int, perm: list[int]) -> str:
    """`x.view(x.size()[:-1] + (heads, head_dim)).permute(perm)` with the exporter's shape chain.

    Shape -> Gather(0), Shape -> Gather(1), Unsqueeze each, Concat with [heads], [head_dim],
    Reshape, Transpose.
    """
    new_shape = shape_of(w, dim_of(w, x, 0), dim_of(w, x, 1), heads, head_dim)
    return w.op("Transpose", w.op("Reshape", x, new_shape), perm=perm)


def merge_heads(w: GraphWriter, ctx: str, like: str, hidden: int) -> str:
    """`ctx.permute(0, 2, 1, 3).reshape(like.size(0), like.size(1), hidden)`."""
    ctx = w.op("Transpose", ctx, perm=[0, 2, 1, 3])
    return w.op("Reshape", ctx, shape_of(w, dim_of(w, like, 0), dim_of(w, like, 1), hidden))


def _bert_embeddings(w: GraphWriter, ids: str, vocab: int, max_pos: int, hidden: int) -> str:
    with w.scope("embeddings"):
        words = w.op("Gather", w.weight("word_embeddings.weight", (vocab, hidden), 0.02), ids)
        # position_ids buffer [1, max_pos] sliced to [:, :seq]
        all_pos = w.init("position_ids", np.arange(max_pos, dtype=np.int64)[None])
        seq = w.op("Unsqueeze", dim_of(w, ids, 1), w.ints(0))
        pos_ids = w.op("Slice", all_pos, w.ints(0), seq, w.ints(1), w.ints(1))
        pos = w.op("Gather", w.weight("position_embeddings.weight", (max_pos, hidden), 0.02),
                   pos_ids)
        return layer_norm(w, w.op("Add", words, pos), "LayerNorm", hidden)


def _extended_mask(w: GraphWriter, mask: str) -> str:
    """HF get_extended_attention_mask: mask[:, None, None, :], (1 - m) * -10000."""
    with w.scope("mask"):
        m = w.op("Unsqueeze", w.op("Unsqueeze", mask, w.ints(1)), w.ints(2))
        m = w.op("Sub", w.const(1.0), w.op("Cast", m, to=FLOAT))
        return w.op("Mul", m, w.const(-10000.0))


def _bert_attention(w: GraphWriter, h: str, ext_mask: str, hidden: int, heads: int) -> str:
    head_dim = hidden // heads
    with w.scope("attention"):
        with w.scope("self"):
            q = split_heads(w, linear(w, h, "query", hidden, hidden), heads, head_dim,
                            [0, 2, 1, 3])
            # key.permute(0,2,1,3).transpose(-1,-2): the exporter fuses both Transposes
            k = split_heads(w, linear(w, h, "key", hidden, hidden), heads, head_dim,
                            [0, 2, 3, 1])
            v = split_heads(w, linear(w, h, "value", hidden, hidden), heads, head_dim,
                            [0, 2, 1, 3])
            scores = w.op("Div", w.op("MatMul", q, k), w.const(math.sqrt(head_dim)))
            probs = w.op("Softmax", w.op("Add", scores, ext_mask), axis=-1)
            ctx = merge_heads(w, w.op("MatMul", probs, v), h, hidden)
        with w.scope("output"):
            out = w.op("Add", linear(w, ctx, "dense", hidden, hidden), h)
            return layer_norm(w, out, "LayerNorm", hidden)


def _bert_layer(w: GraphWriter, h: str, ext_mask: str, hidden: int, heads: int,
                inter: int) -> str:
    h = _bert_attention(w, h, ext_mask, hidden, heads)
    with w.scope("intermediate"):
        mid = gelu_erf(w, linear(w, h, "dense", hidden, inter))
    with w.scope("output"):
        out = w.op("Add", linear(w, mid, "dense", inter, hidden), h)
        return layer_norm(w, out, "LayerNorm", hidden)


def bert_encoder(layers: int = 2, hidden: int = 64, heads: int = 2, inter: int | None = None,
                 vocab: int = 512, max_pos: int = 128, seed: int = 0) -> onnx.ModelProto:
    """HF BertModel (no pooler) as torch.onnx exported it with opset <= 16.

    Word + position embeddings (Gather), decomposed LayerNorm, attention with the
    Shape/Gather/Unsqueeze/Concat/Reshape head split, Div by sqrt(d), additive mask
    (1 - mask) * -10000, Softmax, erf-GELU FFN. Output last_hidden_state.
    """
    w = GraphWriter(seed)
    ids = w.input("input_ids", INT64, ["batch", "seq"], feed=f"int:0:{vocab}")
    mask = w.input("attention_mask", INT64, ["batch", "seq"], feed="mask")
    ext_mask = _extended_mask(w, mask)
    with w.scope("bert"):
        h = _bert_embeddings(w, ids, vocab, max_pos, hidden)
        with w.scope("encoder"):
            for i in range(layers):
                with w.scope(f"layer.{i}"):
                    h = _bert_layer(w, h, ext_mask, hidden, heads, inter or 4 * hidden)
    w.output(h, FLOAT, ["batch", "seq", hidden], "last_hidden_state")
    return w.model("bert_encoder", {"batch": 2, "seq": 16})


def _rotary(w: GraphWriter, x: str, head_dim: int, theta: float) -> tuple[str, str]:
    """LlamaRotaryEmbedding: inv_freq @ positions, cat(freqs, freqs), cos/sin [1,1,S,D]."""
    with w.scope("rotary_emb"):
        pos = w.op("Range", w.const(0, np.int64), dim_of(w, x, 1), w.const(1, np.int64))
        pos = w.op("Unsqueeze", w.op("Cast", pos, to=FLOAT), w.ints(0, 1))  # [1, 1, S]
        inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
        freqs = w.op("MatMul", w.init("inv_freq", inv.reshape(1, -1, 1)), pos)
        freqs = w.op("Transpose", freqs, perm=[0, 2, 1])  # [1, S, D/2]
        emb = w.op("Concat", freqs, freqs, axis=-1)
        cos = w.op("Unsqueeze", w.op("Cos", emb), w.ints(1))
        sin = w.op("Unsqueeze", w.op("Sin", emb), w.ints(1))
        return cos, sin


def _apply_rotary(w: GraphWriter, x: str, cos: str, sin: str, head_dim: int) -> str:
    """`x * cos + rotate_half(x) * sin`, rotate_half = cat(-x2, x1) via Slice/Neg/Concat."""
    half = head_dim // 2
    x1 = w.op("Slice", x, w.ints(0), w.ints(half), w.ints(-1), w.ints(1))
    x2 = w.op("Slice", x, w.ints(half), w.ints(INT64_MAX), w.ints(-1), w.ints(1))
    rotated = w.op("Concat", w.op("Neg", x2), x1, axis=-1)
    return w.op("Add", w.op("Mul", x, cos), w.op("Mul", rotated, sin))


def _causal_where(w: GraphWriter, scores: str, x: str) -> str:
    """Causal mask from Range/Less: keep key j <= query i, else float32 min, via Where."""
    with w.scope("causal_mask"):
        idx = w.op("Range", w.const(0, np.int64), dim_of(w, x, 1), w.const(1, np.int64))
        cols = w.op("Unsqueeze", idx, w.ints(0))
        rows = w.op("Unsqueeze", w.op("Add", idx, w.const(1, np.int64)), w.ints(1))
        allowed = w.op("Less", cols, rows)  # [S, S]
        return w.op("Where", allowed, scores, w.const(F32_MIN))


def _llama_attention(w: GraphWriter, h: str, rope: tuple[str, str], hidden: int,
                     heads: int) -> str:
    head_dim = hidden // heads
    with w.scope("self_attn"):
        perm = [0, 2, 1, 3]
        q = split_heads(w, linear(w, h, "q_proj", hidden, hidden, bias=False), heads, head_dim,
                        perm)
        k = split_heads(w, linear(w, h, "k_proj", hidden, hidden, bias=False), heads, head_dim,
                        perm)
        v = split_heads(w, linear(w, h, "v_proj", hidden, hidden, bias=False), heads, head_dim,
                        perm)
        q = _apply_rotary(w, q, *rope, head_dim)
        k = _apply_rotary(w, k, *rope, head_dim)
        scores = w.op("MatMul", q, w.op("Transpose", k, perm=[0, 1, 3, 2]))
        scores = _causal_where(w, w.op("Mul", scores, w.const(head_dim ** -0.5)), h)
        probs = w.op("Softmax", scores, axis=-1)
        ctx = merge_heads(w, w.op("MatMul", probs, v), h, hidden)
        return linear(w, ctx, "o_proj", hidden, hidden, bias=False)


def llama_block(hidden: int = 64, heads: int = 4, inter: int | None = None,
                theta: float = 10000.0, seed: int = 0) -> onnx.ModelProto:
    """One HF LlamaDecoderLayer plus its rotary embedding, as torch.onnx exports it.

    RMSNorm (Cast, Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul w), bias-free q/k/v,
    rotary cos/sin computed in-graph (Range, MatMul, Concat, Cos, Sin) and applied with
    Slice/Neg/Concat rotate_half, causal mask from Range/Less + Where, Softmax, o_proj,
    residual, RMSNorm, SwiGLU MLP (x*Sigmoid(x) * up), residual.
    """
    inter = inter or 16 * math.ceil(8 * hidden / 3 / 16)
    w = GraphWriter(seed)
    x = w.input("hidden_states", FLOAT, ["batch", "seq", hidden])
    with w.scope("model"):
        rope = _rotary(w, x, hidden // heads, theta)
        with w.scope("layers.0"):
            h = rms_norm(w, x, "input_layernorm", hidden)
            h = w.op("Add", x, _llama_attention(w, h, rope, hidden, heads))
            m = rms_norm(w, h, "post_attention_layernorm", hidden)
            with w.scope("mlp"):
                gate = silu(w, linear(w, m, "gate_proj", hidden, inter, bias=False))
                up = linear(w, m, "up_proj", hidden, inter, bias=False)
                down = linear(w, w.op("Mul", gate, up), "down_proj", inter, hidden, bias=False)
            out = w.op("Add", h, down)
    w.output(out, FLOAT, ["batch", "seq", hidden], "output")
    return w.model("llama_block", {"batch": 2, "seq": 16})
