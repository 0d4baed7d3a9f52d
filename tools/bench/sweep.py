"""The architecture sweep: 28 more transformers models nobody tuned for, at small sizes.

    autoclust bench --exports --models sweep --torch none --no-openvino --no-floor
    autoclust bench --exports --models sweep:bloom,segformer ...

A wide net for "never slower than onnxruntime, never wrong": encoders, decoders (ALiBi,
multi-query, sliding-window, parallel-attention and partial-rotary ones), an
encoder-decoder, vision transformers, CNNs of 1x1 and depthwise convolutions, and an audio
model, each built from a transformers config written here (2 layers where a stack is
configurable, random weights, seed 0, nothing downloaded) and exported at fixed shapes
(`torch.onnx.export(..., dynamo=True)`, batch 1, sequence 64 or 224x224 images). The ten
models of the exports table are the default list; these run only when asked for
(exports.py turns each entry into its Spec, with `sweep=True`, reported in a table of
their own). Measured 2026-12-06: docs/performance.md, "Seventeenth session".
"""

from __future__ import annotations

from typing import Any

SEQ = 64
_NO_POOLER = {"add_pooling_layer": False}
_TWO = {"num_hidden_layers": 2}
_H384 = {"hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 1536}
_DEC = {"num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8}  # decoders

# name -> (title, inputs, config class, its arguments, model class, its arguments); inputs:
# ("ids", with attention mask?) | ("ids+decoder",) | ("pixels", size) | ("audio", samples)
ARCHS: dict[str, tuple[str, tuple, str, dict[str, Any], str, dict[str, Any]]] = {
    "distilbert": ("DistilBERT (2 layers)", ("ids", True),
                   "DistilBertConfig", {"n_layers": 2}, "DistilBertModel", {}),
    "roberta": ("RoBERTa (2 layers)", ("ids", True),
                "RobertaConfig", _TWO, "RobertaModel", _NO_POOLER),
    "deberta": ("DeBERTa-v2 (2 layers, hidden 384, disentangled attention)", ("ids", True),
                "DebertaV2Config", {**_TWO, **_H384}, "DebertaV2Model", {}),
    "albert": ("ALBERT (2 layers, shared weights)", ("ids", True),
               "AlbertConfig", _TWO, "AlbertModel", _NO_POOLER),
    "mpnet": ("MPNet (2 layers, relative position buckets)", ("ids", True),
              "MPNetConfig", _TWO, "MPNetModel", _NO_POOLER),
    "electra": ("ELECTRA-small-like (2 layers)", ("ids", True),
                "ElectraConfig", _TWO, "ElectraModel", {}),
    "convbert": ("ConvBERT (2 layers, span-based dynamic convolution)", ("ids", True),
                 "ConvBertConfig", _TWO, "ConvBertModel", {}),
    "squeezebert": ("SqueezeBERT (2 layers, grouped 1-D convolutions)", ("ids", True),
                    "SqueezeBertConfig", _TWO, "SqueezeBertModel", {}),
    "cliptext": ("CLIP text encoder (2 layers, causal mask)", ("ids", True),
                 "CLIPTextConfig", _TWO, "CLIPTextModel", {}),
    "bloom": ("BLOOM-like (2 layers, ALiBi)", ("ids", True),
              "BloomConfig", {"n_layer": 2, "hidden_size": 512, "n_head": 8}, "BloomModel", {}),
    "falcon": ("Falcon-like (2 layers, multi-query, parallel attention)", ("ids", False),
               "FalconConfig", {**_DEC, "new_decoder_architecture": False,
                                "multi_query": True}, "FalconModel", {}),
    "phi": ("Phi-like (2 layers, partial rotary, parallel MLP)", ("ids", False),
            "PhiConfig", {**_DEC, "intermediate_size": 2048}, "PhiModel", {}),
    "mistral": ("Mistral-like (2 layers, GQA 8/2, sliding window 32)", ("ids", False),
                "MistralConfig", {**_DEC, "intermediate_size": 1408, "num_key_value_heads": 2,
                                  "sliding_window": 32}, "MistralModel", {}),
    "gemma": ("Gemma-like (2 layers, multi-query, GELU-tanh gate)", ("ids", False),
              "GemmaConfig", {**_DEC, "intermediate_size": 1408, "num_key_value_heads": 1,
                              "head_dim": 64}, "GemmaModel", {}),
    "gptneox": ("GPT-NeoX-like (2 layers, parallel residual)", ("ids", False),
                "GPTNeoXConfig", {**_DEC, "intermediate_size": 2048}, "GPTNeoXModel", {}),
    "opt": ("OPT-like (2 layers, learned positions)", ("ids", True),
            "OPTConfig", {**_DEC, "ffn_dim": 2048, "word_embed_proj_dim": 512}, "OPTModel", {}),
    "bart": ("BART encoder-decoder (2 + 2 layers, d_model 256)", ("ids+decoder",),
             "BartConfig", {"encoder_layers": 2, "decoder_layers": 2, "d_model": 256,
                            "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024,
                            "encoder_attention_heads": 4, "decoder_attention_heads": 4},
             "BartModel", {}),
    "clipvision": ("CLIP vision encoder (2 layers, 224x224)", ("pixels", 224),
                   "CLIPVisionConfig", _TWO, "CLIPVisionModel", {}),
    "deit": ("DeiT (2 layers, distillation token)", ("pixels", 224),
             "DeiTConfig", _TWO, "DeiTModel", _NO_POOLER),
    "beit": ("BEiT (2 layers, relative position bias)", ("pixels", 224),
             "BeitConfig", _TWO, "BeitModel", _NO_POOLER),
    "levit": ("LeViT (attention with BatchNorm, 224x224)", ("pixels", 224),
              "LevitConfig", {}, "LevitModel", {}),
    "mobilevit": ("MobileViT-small (256x256)", ("pixels", 256),
                  "MobileViTConfig", {}, "MobileViTModel", {}),
    "segformer": ("SegFormer-b0 encoder (224x224)", ("pixels", 224),
                  "SegformerConfig", {}, "SegformerModel", {}),
    "poolformer": ("PoolFormer-s12 (224x224)", ("pixels", 224),
                   "PoolFormerConfig", {}, "PoolFormerModel", {}),
    "mobilenetv2": ("MobileNetV2 (224x224)", ("pixels", 224),
                    "MobileNetV2Config", {}, "MobileNetV2Model", {}),
    "efficientnet": ("EfficientNet, the default (B7) config (224x224)", ("pixels", 224),
                     "EfficientNetConfig", {}, "EfficientNetModel", {}),
    "regnet": ("RegNet (224x224)", ("pixels", 224),
               "RegNetConfig", {}, "RegNetModel", {}),
    "wav2vec2": ("Wav2Vec2 (2 layers, hidden 384, 1 s of audio)", ("audio", 16000),
                 "Wav2Vec2Config", {**_TWO, **_H384}, "Wav2Vec2Model", {}),
}


def build(name: str) -> tuple[Any, Any]:
    """(config, model) of sweep entry `name`, random weights (the caller seeds torch)."""
    import transformers
    _, _, config, config_args, model, model_args = ARCHS[name]
    cfg = getattr(transformers, config)(**config_args)
    return cfg, getattr(transformers, model)(cfg, **model_args)
